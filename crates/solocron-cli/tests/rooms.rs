//! The arrows between the CLI's modules (ARCHITECTURE.md's map): the shared modules are
//! leaves that name no command module, and no two modules import each other, directly or
//! round a circle. Read from the sources, as `rooms.py` reads them: an arrow A -> B is a
//! `crate::B` path written in A's files before their tests.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What each shared module may name besides the crate root (`main.rs`: `Failure`,
/// `bad_input`, `Format`).
const LEAVES: [(&str, &[&str]); 4] =
    [("config", &[]), ("output", &[]), ("stores", &["config"]), ("wiring", &["config", "stores"])];

/// Each top-level module (`foo.rs` and `foo/`) and the modules its code names.
fn arrows() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    collect(&src, &src, &mut texts);
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    texts
        .iter()
        .map(|(module, text)| {
            let named = modules.iter().filter(|m| *m != module && names(text, m)).cloned().collect();
            (module.clone(), named)
        })
        .collect()
}

/// The code of every file under `dir`, before its tests and without comments, by top-level
/// module; `main.rs` (the crate root) is left out.
fn collect(src: &Path, dir: &Path, texts: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(src, &path, texts);
            continue;
        }
        let rel = path.strip_prefix(src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs").to_owned();
        if top == "main" || path.extension().is_none_or(|e| e != "rs") || path.ends_with("config/tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        let code: Vec<&str> = code.lines().map(|l| l.split("//").next().unwrap_or_default()).collect();
        texts.entry(top).or_default().push_str(&code.join("\n"));
    }
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
fn the_shared_modules_are_leaves_and_no_modules_import_each_other_round_a_circle() {
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
