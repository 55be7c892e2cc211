//! The CLI's configuration parser, `Config::parse` (what `solocron check` runs), compiled
//! in from crates/solocron-cli/src/config.rs as it is: the CLI is a binary crate, and a
//! library target made only for fuzzing is not wanted.
//!
//! What must hold: no panic; a refusal names the file; an accepted configuration holds
//! only valid, unique job names, valid policies and a known prefix, and each job's
//! schedule yields a next tick after now.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../crates/solocron-cli/src/config.rs"]
mod config;

use chrono::DateTime;
use libfuzzer_sys::fuzz_target;
use solocron_core::{validate_job_name, Prefix};

/// The file name errors must carry.
const FILE: &str = "fuzz.toml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match config::Config::parse(FILE, text) {
        Ok(cfg) => {
            assert_eq!(cfg.file, FILE);
            assert!(Prefix::parse(cfg.store.prefix.as_str()).is_ok());
            let mut names = std::collections::HashSet::new();
            let now = DateTime::from_timestamp_millis(1_767_225_600_000).expect("in range");
            for job in &cfg.jobs {
                assert!(validate_job_name(&job.name).is_ok(), "{:?} accepted", job.name);
                assert!(names.insert(job.name.as_str()), "{:?} twice", job.name);
                assert!(job.policy.validate().is_ok(), "{:?}", job.policy);
                if let config::Work::Command(argv) = &job.work {
                    assert!(!argv.is_empty() && !argv[0].is_empty());
                }
                if let Some(next) = job.schedule.next_after(now) {
                    assert!(next > now);
                }
            }
        }
        Err(e) => assert!(e.to_string().starts_with(&format!("{FILE}: ")), "{e}"),
    }
});
