//! `Prefix::parse`, against the rule written out again here, and the names it derives.
//!
//! What must hold: accepted exactly when 1 to 40 of `a-z 0-9 _` starting with a letter; an
//! accepted prefix round-trips and derives each store's spelling from the same name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use solocron_core::{Prefix, PREFIX_LEN_MAX};

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else { return };
    let allowed = (1..=PREFIX_LEN_MAX).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    match Prefix::parse(name) {
        Ok(p) => {
            assert!(allowed, "{name:?} accepted");
            assert_eq!(p.as_str(), name);
            assert_eq!(Prefix::parse(p.as_str()).as_ref(), Ok(&p));
            assert_eq!(p.table_prefix(), format!("{name}_"));
            assert_eq!(p.redis_key_prefix(), format!("{{{name}}}:"));
            assert_eq!(p.etcd_key_prefix(), format!("/{name}/"));
        }
        Err(e) => {
            assert!(!allowed, "{name:?} refused");
            assert_eq!(e.given, name);
        }
    }
});
