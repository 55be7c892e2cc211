//! `src/config.rs` compiled in by `#[path]`, as the fuzz target (fuzz/fuzz_targets/config.rs)
//! compiles it: a child module it could not find that way fails here, in the ordinary test
//! run, rather than in the fuzz build. Each input of the committed corpus then keeps the
//! fuzz target's properties.
#![forbid(unsafe_code)]

#[allow(dead_code, unused_imports)]
#[path = "../src/config.rs"]
mod config;

use chrono::DateTime;
use solocron_core::{validate_job_name, Prefix};

/// The file name errors must carry.
const FILE: &str = "fuzz.toml";

/// What the fuzz target asserts of one input: a refusal names the file; an accepted
/// configuration holds only valid, unique job names, valid policies and a known prefix.
fn holds(text: &str) {
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
}

#[test]
fn the_fuzz_corpus_keeps_the_fuzz_targets_properties_through_the_file_compiled_in_by_path() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config");
    let mut tried = 0;
    for entry in std::fs::read_dir(&corpus).unwrap_or_else(|e| panic!("{}: {e}", corpus.display())) {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            holds(text);
            tried += 1;
        }
    }
    assert!(tried > 0, "no input in {}", corpus.display());
}
