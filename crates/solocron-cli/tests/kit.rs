//! The newcomer's kit: shell completions, the man page, README's configuration and the
//! files under `packaging/` agree with the binary they describe.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_solocron");

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// (exit code, stdout, stderr) of `solocron ARGS`.
fn solocron(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// The subcommands `solocron help` lists, read from its "Commands:" section.
fn subcommands() -> Vec<String> {
    let (code, help, _) = solocron(&["help"]);
    assert_eq!(code, 0);
    let listed = help.split("Commands:\n").nth(1).expect("a Commands: section").split("\n\n").next().unwrap();
    let names: Vec<String> = listed.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    for expected in ["run", "check", "migrate", "status", "history", "prune", "completions", "man"] {
        assert!(names.iter().any(|n| n == expected), "`{expected}` not in {names:?}");
    }
    names.into_iter().filter(|n| n != "help").collect()
}

#[test]
fn completions_exist_for_every_shell_and_bash_knows_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, script, err) = solocron(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(script.contains("solocron"), "{shell}: {script}");
    }
    let (_, bash, _) = solocron(&["completions", "bash"]);
    for cmd in subcommands() {
        assert!(bash.contains(&format!("solocron,{cmd})")), "bash completion: no `{cmd}`");
    }
    assert!(bash.contains("--prefix") && bash.contains("--drop"), "flags are completed too");
    let (code, _, err) = solocron(&["completions", "tcsh"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn the_man_page_names_every_subcommand() {
    let (code, page, err) = solocron(&["man"]);
    assert_eq!(code, 0, "{err}");
    assert!(page.starts_with(".ie") || page.contains(".TH solocron 1"), "not roff: {}", &page[..200.min(page.len())]);
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = solocron(&["man", "--dir", &dir.path().display().to_string()]);
    assert_eq!(code, 0, "{err}");
    for cmd in subcommands() {
        assert!(page.contains(&format!("solocron\\-{cmd}(1)")), "man page: no `{cmd}`");
        let own = std::fs::read_to_string(dir.path().join(format!("solocron-{cmd}.1")));
        let own = own.unwrap_or_else(|e| panic!("man --dir: no solocron-{cmd}.1: {e}"));
        assert!(own.contains(&format!(".TH solocron-{cmd} 1")), "solocron-{cmd}.1: {own}");
    }
    let migrate = std::fs::read_to_string(dir.path().join("solocron-migrate.1")).unwrap();
    assert!(migrate.contains("\\-\\-drop") && migrate.contains("\\-\\-prefix"), "a command's page has its options");
}

/// Every ```toml block of `text`: (line of its opening fence, its body).
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match open.take() {
            None if line.trim_start().starts_with("```toml") => open = Some((i + 1, String::new())),
            None => {}
            Some(block) if line.trim_start().starts_with("```") => blocks.push(block),
            Some((at, mut body)) => {
                body.push_str(line);
                body.push('\n');
                open = Some((at, body));
            }
        }
    }
    assert!(open.is_none(), "a ```toml block is never closed");
    blocks
}

/// `text` with each commented-out assignment (`# key = value`) switched on, so a key shown
/// only as a comment is checked as well: a renamed key must not live on in an example.
fn uncommented(text: &str) -> String {
    let is_assignment = |l: &str| {
        let l = l.trim_start_matches('#').trim_start();
        l.split_once(" = ").is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    };
    text.lines()
        .map(|l| if l.starts_with("# ") && is_assignment(l) { &l[2..] } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Fails naming `what` unless `solocron check` (the configuration parser every command
/// uses) accepts `toml`.
fn assert_checks(what: &str, toml: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("solocron.toml");
    std::fs::write(&file, toml).unwrap();
    let out = Command::new(BIN).args(["check", "--config"]).arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} is not a valid configuration: {err}\n{toml}");
}

#[test]
fn every_toml_block_of_the_readme_is_a_valid_configuration() {
    let blocks = toml_blocks(&read("README.md"));
    assert!(!blocks.is_empty(), "README.md has no ```toml block");
    for (line, body) in blocks {
        assert_checks(&format!("README.md's ```toml block at line {line}"), &body);
        let switched_on = uncommented(&body);
        assert_checks(
            &format!("README.md's ```toml block at line {line}, its commented keys switched on"),
            &switched_on,
        );
    }
}

#[test]
fn the_packaged_example_configuration_is_valid() {
    let example = read("packaging/solocron.toml");
    assert_checks("packaging/solocron.toml", &example);
    assert_checks("packaging/solocron.toml, its commented keys switched on", &uncommented(&example));
    assert!(
        example.contains("url = \"sqlite:///var/lib/solocron/solocron.db\""),
        "the example keeps its SQLite file where the unit's StateDirectory and the container's volume are"
    );
}

/// `key=value` lines of a systemd unit (comments and sections left out).
fn unit_settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn setting<'a>(settings: &'a [(String, String)], key: &str) -> &'a str {
    settings.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {key}="))
}

/// The container file cannot be built here (no container engine): this checks what can be
/// checked without one, that it follows the unit's conventions.
#[test]
fn the_container_file_and_the_unit_share_paths_user_and_stop_signal() {
    let unit = unit_settings(&read("packaging/solocron.service"));
    let containerfile = read("packaging/Containerfile");
    let exec_start = setting(&unit, "ExecStart");
    assert_eq!(exec_start, "/usr/local/bin/solocron run --config /etc/solocron/solocron.toml");
    assert_eq!(setting(&unit, "KillSignal"), "SIGTERM");
    assert_eq!(setting(&unit, "StateDirectory"), "solocron");
    let stop =
        setting(&unit, "TimeoutStopSec").trim_end_matches('s').parse::<u64>().expect("TimeoutStopSec in seconds");
    assert!(stop > 30, "TimeoutStopSec ({stop} s) must exceed the default shutdown_grace (30 s)");

    let lines: Vec<&str> = containerfile.lines().map(str::trim).collect();
    let has = |want: &str| lines.contains(&want);
    assert!(lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2, "multi-stage");
    assert!(lines.iter().any(|l| l.starts_with("FROM docker.io/library/rust:")), "builds with the Rust image");
    assert!(
        lines.iter().any(|l| l.starts_with("FROM docker.io/library/debian:") && l.contains("-slim")),
        "runs on slim"
    );
    assert!(has("STOPSIGNAL SIGTERM"));
    assert!(has("COPY --from=build /src/target/release/solocron /usr/local/bin/solocron"), "the unit's binary path");
    assert!(has("COPY packaging/solocron.toml /etc/solocron/solocron.toml"), "the unit's configuration path");
    assert!(has("COPY crates crates"), "the workspace's members");
    assert!(has(r#"ENTRYPOINT ["/usr/local/bin/solocron"]"#));
    assert!(has(r#"CMD ["run", "--config", "/etc/solocron/solocron.toml"]"#), "the unit's ExecStart arguments");
    assert!(has("VOLUME /var/lib/solocron"), "the unit's StateDirectory");
    let cargo = read("Cargo.toml");
    let members = cargo.split("members = [").nth(1).and_then(|m| m.split(']').next()).expect("workspace members");
    for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
        assert!(member.starts_with("crates/"), "the build stage copies crates/ only, not {member}");
    }
    let user = lines.iter().find_map(|l| l.strip_prefix("USER ")).expect("a USER line");
    assert!(user != "root" && user != "0" && !user.starts_with("0:"), "runs as a non-root user, not {user}");
    let last_user = lines.iter().rposition(|l| l.starts_with("USER ")).unwrap();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    assert!(last_user > last_from, "the USER line belongs to the run stage");
}
