//! The engine's rooms import one way (see the layers in `src/lib.rs` and ARCHITECTURE.md).
//! This reads the crate's source files and fails on an arrow that goes the wrong way, so a
//! wrong import fails the tests instead of drifting until someone notices.
//!
//! An arrow A → B is any `crate::B` path written in module A (`a.rs` or anything under
//! `a/`), including the names inside a `use crate::{..}` group, outside comments; as in
//! `shared/tools/rooms.py`, lib.rs (the hall, which declares every module) is left out,
//! and the layers and circles are read from the code before a file's `#[cfg(test)]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top first: a module imports only from its own layer or those below it, and
/// never in a circle. Every module of `src/` is in one; a new module must be placed here.
const LAYERS: [(&str, &[&str]); 6] = [
    ("the scheduler", &["scheduler"]),
    ("the node's loops", &["timer", "backups", "catchup", "recovery", "housekeeping", "alerts", "follow"]),
    ("claiming and starting", &["engine"]),
    ("one run's life", &["runner"]),
    ("batched store calls", &["batches"]),
    (
        "leaves",
        &[
            "backoff",
            "command",
            "ends",
            "http_job",
            "job",
            "jobset",
            "lead",
            "metrics",
            "retry",
            "spec",
            "spread",
            "store_call",
            "store_clock",
            "unanswered",
        ],
    ),
];

/// One source file of the crate: its module, its path, and its text without comments.
struct Source {
    module: String,
    path: PathBuf,
    code: String,
}

#[test]
fn the_runner_and_the_batches_never_import_the_engine() {
    let mut wrong = Vec::new();
    for source in sources().iter().filter(|s| s.module == "runner" || s.module == "batches") {
        wrong.extend(lines_naming(source, "engine"));
    }
    assert!(
        wrong.is_empty(),
        "runner and batches never name the engine (a run gets what it needs through `runner::Env`):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_below_the_scheduler_imports_it() {
    let mut wrong = Vec::new();
    for source in sources().iter().filter(|s| s.module != "scheduler") {
        wrong.extend(lines_naming(source, "scheduler"));
    }
    assert!(wrong.is_empty(), "only lib.rs and scheduler.rs may name the scheduler:\n{}", wrong.join("\n"));
}

#[test]
fn every_module_imports_only_from_its_layer_or_below() {
    let arrows = arrows(&sources());
    let layer = |m: &str| LAYERS.iter().position(|(_, modules)| modules.contains(&m));
    let mut wrong = Vec::new();
    for (from, tos) in &arrows {
        let Some(from_layer) = layer(from) else {
            wrong.push(format!("{from} is in no layer: place it in LAYERS (tests/arrows.rs) and in lib.rs's map"));
            continue;
        };
        for to in tos.iter().filter(|to| layer(to).is_some_and(|l| l < from_layer)) {
            wrong.push(format!(
                "{from} ({}) imports {to} ({}), a layer above it",
                LAYERS[from_layer].0,
                name(layer(to))
            ));
        }
    }
    assert!(wrong.is_empty(), "arrows against the layers:\n{}", wrong.join("\n"));
}

#[test]
fn no_import_circle_between_the_crates_modules() {
    let arrows = arrows(&sources());
    let circle = find_circle(&arrows);
    assert!(circle.is_none(), "import circle: {}", circle.unwrap_or_default().join(" -> "));
}

/// The engine asks the store only for the node's steps (`NodeStore`, or less): the whole
/// `Store` (schema and operator steps too) is taken by the scheduler's public builder
/// alone, which hands the engine its `NodeStore` and keeps `SchemaStore` for `migrate`.
#[test]
fn only_the_scheduler_takes_the_whole_store() {
    for source in sources() {
        let whole: Vec<&str> = before_tests(&source.code).lines().filter(|l| takes_whole_store(l)).collect();
        if source.module == "scheduler" {
            assert!(whole.iter().all(|l| l.contains("store: Arc<dyn Store>")), "{}: {whole:?}", source.path.display());
        } else {
            assert!(whole.is_empty(), "{} takes the whole store: {whole:?}", source.path.display());
        }
    }
}

/// Whether `line` names a `dyn Store` (by any path: `dyn solocron_core::Store` too).
fn takes_whole_store(line: &str) -> bool {
    line.split("dyn ").skip(1).any(|rest| {
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        path.rsplit("::").next() == Some("Store")
    })
}

/// A layer's name, for messages.
fn name(layer: Option<usize>) -> &'static str {
    layer.map_or("no layer", |l| LAYERS[l].0)
}

/// Every `.rs` file under `src/` but lib.rs, with its comments removed.
fn sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    let mut sources = Vec::new();
    for path in files {
        let relative = path.strip_prefix(&src).expect("under src");
        let top = relative.components().next().expect("a file has a name").as_os_str().to_string_lossy();
        let module = top.strip_suffix(".rs").unwrap_or(&top).to_owned();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file reads as UTF-8");
        sources.push(Source { module, path: relative.to_owned(), code: without_comments(&text) });
    }
    assert!(sources.len() > 10, "the crate's sources were not found under {}", src.display());
    sources
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src reads") {
        let path = entry.expect("an entry reads").path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// `text` with its block comments blanked (line breaks kept, so line numbers hold) and its
/// line comments cut, on lines without a string quote (as rooms.py does: a `//` in a string
/// is not a comment).
fn without_comments(text: &str) -> String {
    let mut blanked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        let Some(length) = rest[start + 2..].find("*/") else { break };
        let end = start + 2 + length + 2;
        blanked.push_str(&rest[..start]);
        blanked.extend(rest[start..end].chars().filter(|c| *c == '\n'));
        rest = &rest[end..];
    }
    blanked.push_str(rest);
    let cut = |line: &str| if line.contains('"') { line } else { line.split("//").next().unwrap_or("") }.to_owned();
    blanked.lines().map(cut).collect::<Vec<_>>().join("\n")
}

/// The code before the file's tests (a `#[cfg(test)]` at the start of a line).
fn before_tests(code: &str) -> &str {
    code.split("\n#[cfg(test)]").next().unwrap_or(code)
}

/// The modules `code` names with a `crate::` path.
fn named(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "crate::".len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            match after.strip_prefix('{') {
                Some(group) => names.extend(group_names(group)),
                None => names.extend(lower_ident(after)),
            }
        }
        rest = after;
    }
    names
}

/// The names at the head of each item of a `use crate::{..}` group (and, as rooms.py reads
/// them, of its nested groups), up to the group's end.
fn group_names(group: &str) -> Vec<String> {
    let end = group.find(';').unwrap_or(group.len());
    let group = &group[..end];
    let mut names = Vec::new();
    for (i, c) in group.char_indices() {
        let starts = i == 0 || group[..i].ends_with([',', '{', ' ', '\n', '\t']);
        if !starts || !(c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let ident = lower_ident(&group[i..]).expect("starts with a lowercase letter");
        let next = group[i + ident.len()..].trim_start();
        if next.is_empty() || next.starts_with("::") || next.starts_with([',', '}']) {
            names.push(ident);
        }
    }
    names
}

/// The identifier `text` starts with, if it starts lowercase (a module's name, not a type's).
fn lower_ident(text: &str) -> Option<String> {
    let first = text.chars().next().filter(|c| c.is_ascii_lowercase() || *c == '_')?;
    let rest =
        text[first.len_utf8()..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_');
    Some(std::iter::once(first).chain(rest).collect())
}

/// The lines of `source` (tests included) that name module `target` with a `crate::` path.
fn lines_naming(source: &Source, target: &str) -> Vec<String> {
    let lines = source.code.lines().enumerate();
    let mut found = Vec::new();
    for (n, line) in lines.filter(|(_, line)| named(line).contains(target)) {
        found.push(format!("  {}:{}: {}", source.path.display(), n + 1, line.trim()));
    }
    // A `use crate::{..}` group spread over several lines names it on none of them alone.
    if found.is_empty() && named(&source.code).contains(target) {
        found.push(format!("  {}: names crate::{target} in a `use crate::{{..}}` group", source.path.display()));
    }
    found
}

/// Every module's arrows to the crate's other modules, from the code before its tests.
fn arrows(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module.as_str()).collect();
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in sources {
        let to = named(before_tests(&source.code));
        let to = to.into_iter().filter(|m| *m != source.module && modules.contains(m.as_str()));
        arrows.entry(source.module.clone()).or_default().extend(to);
    }
    arrows
}

/// A circle of arrows, as the modules along it (the first one again at the end), if any.
fn find_circle(arrows: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    let mut done = BTreeSet::new();
    for start in arrows.keys() {
        let mut path = Vec::new();
        if let Some(circle) = circle_from(start, arrows, &mut path, &mut done) {
            return Some(circle);
        }
    }
    None
}

/// Depth first from `module`, along `path` (the modules being visited): a circle closes when
/// an arrow leads back onto the path. `done` holds the modules from which no circle leads.
fn circle_from(
    module: &str,
    arrows: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|m| m == module) {
        let mut circle = path[at..].to_vec();
        circle.push(module.to_owned());
        return Some(circle);
    }
    if done.contains(module) {
        return None;
    }
    path.push(module.to_owned());
    for next in arrows.get(module).into_iter().flatten() {
        if let Some(circle) = circle_from(next, arrows, path, done) {
            return Some(circle);
        }
    }
    path.pop();
    done.insert(module.to_owned());
    None
}

#[test]
fn the_reader_finds_arrows_as_rooms_py_does() {
    let code = "use crate::engine::{counted, Engine};\nuse crate::{alerts, job::Job};\nlet x = crate::metrics::tick();";
    let names: Vec<String> = named(code).into_iter().collect();
    assert_eq!(names, ["alerts", "engine", "job", "metrics"]);
    assert!(named(&without_comments("// crate::engine\n/* crate::runner */ x")).is_empty(), "comments say nothing");
    assert!(named("crate::Job::new").is_empty(), "a type through the crate's root is no module");
    assert!(named("subcrate::engine").is_empty());
    let arrows: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(f, t)| (f.to_string(), BTreeSet::from([t.to_string()])))
        .collect();
    assert_eq!(find_circle(&arrows), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}
