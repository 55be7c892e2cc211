//! What ARCHITECTURE.md promises of this crate, read from its manifest and sources: it
//! depends on the core and on serde's, utoipa's and url's crates alone (no TOML, no engine,
//! no runtime), and reads nothing (no file, no environment, no network): secrets and CA
//! files are read by whoever runs the job.
#![forbid(unsafe_code)]

#[test]
fn the_spec_knows_no_format_but_json_no_engine_and_does_no_io() {
    let manifest = include_str!("../Cargo.toml");
    let deps = manifest.split("\n[dependencies]\n").nth(1).and_then(|d| d.split("\n[").next()).unwrap();
    let names: Vec<&str> = deps
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .collect();
    assert_eq!(names, ["solocron-core", "serde", "serde_json", "utoipa", "url"]);
    let sources = [
        include_str!("../src/lib.rs"),
        include_str!("../src/spec.rs"),
        include_str!("../src/check.rs"),
        include_str!("../src/http.rs"),
        include_str!("../src/json.rs"),
        include_str!("../src/words.rs"),
    ];
    for io in ["std::fs", "std::env", "std::net", "std::process", "toml"] {
        assert!(sources.iter().all(|s| !s.contains(&format!("{io}::"))), "`{io}` is used");
    }
}
