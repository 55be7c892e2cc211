//! The fleet reads and acts over the operator's steps only: no file of its source takes the
//! whole store (claims, leases, schema), so a view or an action cannot claim a tick or
//! migrate a schema.

use std::path::Path;

#[test]
fn the_fleet_asks_only_for_the_operators_steps() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen = 0;
    for entry in std::fs::read_dir(&src).expect("src/ reads") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("UTF-8 source");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let whole: Vec<&str> = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(|l| takes_whole_store(l) || l.contains("NodeStore") || l.contains("SchemaStore"))
            .collect();
        assert!(whole.is_empty(), "{} asks for more than OperatorStore: {whole:?}", path.display());
        seen += 1;
    }
    assert!(seen >= 5, "the fleet's sources were not found under {}", src.display());
}

/// Whether `line` names a `dyn Store` (by any path: `dyn solocron_core::Store` too).
fn takes_whole_store(line: &str) -> bool {
    line.split("dyn ").skip(1).any(|rest| {
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        path.rsplit("::").next() == Some("Store")
    })
}
