//! The arrows between this crate's modules: no two import each other, directly or round a
//! circle, and the shared helpers below are leaves. Read from the sources, as
//! `rooms.py` reads them: an arrow A -> B is a `crate::B` path written in A's code before
//! its tests (`lib.rs`, the crate root, is left out).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The shared helpers, and the only modules each may name. `cas.rs` (the compare-and-swap plumbing of
/// every writing step), `memory.rs` (what an instance remembers) and `prune.rs` (what a
/// prune deletes) name none of the steps, so that `runs.rs` -> `retry.rs` stays one way.
const LEAVES: [(&str, &[&str]); 3] =
    [("cas", &["codec", "etcd"]), ("memory", &["codec"]), ("prune", &["etcd", "keys"])];

/// Each top-level module and the modules its code names.
fn arrows() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "lib") else { continue };
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        let code: Vec<&str> = code.lines().map(|l| l.split("//").next().unwrap_or_default()).collect();
        texts.insert(module.to_owned(), code.join("\n"));
    }
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, code)| {
            let named = modules.iter().filter(|m| *m != module && names(code, m)).cloned().collect();
            (module.clone(), named)
        })
        .collect()
}

/// Whether `code` names module `m`: `crate::m::`, `crate::m;` or `m` in a `use crate::{...}`.
fn names(code: &str, m: &str) -> bool {
    let direct = [format!("crate::{m}::"), format!("crate::{m};"), format!("crate::{m}}}")];
    if direct.iter().any(|p| code.contains(p.as_str())) {
        return true;
    }
    code.split("use crate::{").skip(1).any(|group| {
        let group = group.split('}').next().unwrap_or_default();
        group.split(',').any(|part| part.trim() == m || part.trim().starts_with(&format!("{m}::")))
    })
}

#[test]
fn the_shared_helpers_are_leaves_and_no_modules_import_each_other_round_a_circle() {
    let arrows = arrows();
    for (leaf, allowed) in LEAVES {
        let named = arrows.get(leaf).unwrap_or_else(|| panic!("no module `{leaf}`: {arrows:?}"));
        let extra: Vec<&String> = named.iter().filter(|m| !allowed.contains(&m.as_str())).collect();
        assert!(extra.is_empty(), "`{leaf}` is a leaf, yet names {extra:?}");
    }
    // Depth-first from each module: reaching it again is a circle.
    for start in arrows.keys() {
        let mut stack: Vec<Vec<&String>> = vec![vec![start]];
        while let Some(path) = stack.pop() {
            for next in &arrows[*path.last().unwrap()] {
                assert!(next != start, "a circle: {path:?} -> {next}");
                if !path.contains(&next) {
                    stack.push([path.clone(), vec![next]].concat());
                }
            }
        }
    }
}
