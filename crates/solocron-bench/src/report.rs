//! Where a run's results go: a new file per run, `<UTC date>-<store>-<commit or time>.md`,
//! under `benchmarks/` of the workspace the benchmark was built in. A run never overwrites
//! or appends to an earlier run's file: BENCHMARKS.md summarizes them by hand.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use chrono::{DateTime, Utc};

/// How many names a run tries before giving up (the first, then with the time, then
/// numbered): more runs of one store, commit and second than this are a bug, not a need.
const RUN_FILE_NAMES_MAX: usize = 100;

/// `benchmarks/` of the workspace this binary was built in.
pub fn default_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // crates/solocron-bench → the workspace root.
    manifest.ancestors().nth(2).unwrap_or(manifest).join("benchmarks")
}

/// What the run measured, and on what.
pub struct Run<'a> {
    /// The store URL as given (its password is masked before it is written).
    pub store: &'a str,
    /// The command line (the store's password in it is masked before it is written).
    pub command: &'a str,
    /// When the run began.
    pub began: DateTime<Utc>,
    /// One markdown section per scenario.
    pub sections: &'a [String],
}

/// Writes `run` to a new file in `dir` (created if missing) and returns its path.
pub fn write(dir: &Path, run: &Run) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let checkout = checkout(dir);
    let mut text = format!(
        "# {} — {}\n\nMachine: {}. Checkout: {}. Build: {}. Command: `{}`\n",
        run.began.format("%Y-%m-%d %H:%M UTC"),
        solocron_core::redact_url(run.store),
        machine(),
        checkout.as_ref().map_or("not a git checkout".to_owned(), Checkout::describe),
        // A debug build's figures are several times a release build's: say which it was.
        if cfg!(debug_assertions) { "debug (not comparable with release runs)" } else { "release" },
        solocron_core::redact_in(run.command, run.store),
    );
    for s in run.sections {
        text += &format!("\n{}\n", s.trim_end());
    }
    let commit = checkout.map(|c| c.commit);
    for name in names(&run.began, &store_kind(run.store), commit.as_deref()).take(RUN_FILE_NAMES_MAX) {
        let path = dir.join(name);
        // `create_new`: an existing file is never touched, even by two runs racing.
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(text.as_bytes())?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(anyhow::anyhow!("cannot write {}: {e}", path.display())),
        }
    }
    anyhow::bail!("{RUN_FILE_NAMES_MAX} run files of this store and time already exist in {}", dir.display())
}

/// The file names a run tries, in order: `<date>-<store>-<commit>.md` (or `-<HHMM>` out of a
/// git checkout), then with the time of day added, then numbered.
fn names(began: &DateTime<Utc>, store: &str, commit: Option<&str>) -> impl Iterator<Item = String> {
    let date = began.format("%Y-%m-%d").to_string();
    let first = format!("{date}-{store}-{}", commit.map_or(began.format("%H%M").to_string(), str::to_owned));
    let timed = format!("{first}-{}", began.format("%H%M%S"));
    [format!("{first}.md"), format!("{timed}.md")].into_iter().chain((2..).map(move |n| format!("{timed}-{n}.md")))
}

/// The store's kind, from the URL's scheme, for the file name.
fn store_kind(url: &str) -> String {
    match url.split_once(':').map_or("", |(scheme, _)| scheme) {
        "postgresql" => "postgres".to_owned(),
        "rediss" => "redis".to_owned(),
        s if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric()) => s.to_owned(),
        _ => "store".to_owned(),
    }
}

/// The git commit checked out where the run is written, and whether files differ from it
/// (then the commit alone does not say what was measured).
struct Checkout {
    commit: String,
    changed: bool,
}

impl Checkout {
    fn describe(&self) -> String {
        if self.changed {
            format!("{} with uncommitted changes", self.commit)
        } else {
            self.commit.clone()
        }
    }
}

fn checkout(dir: &Path) -> Option<Checkout> {
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).filter(|c| !c.is_empty())?;
    let changed = git(&["status", "--porcelain", "--untracked-files=no"]).is_none_or(|s| !s.is_empty());
    Some(Checkout { commit, changed })
}

/// The machine, in one line: cores, CPU model, memory, and where the store runs.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024 / 1024)
        })
        .unwrap_or(0);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{cores} cores ({cpu}), {mem} GiB, store on the same host (loopback)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_file_is_named_by_date_store_and_commit_then_by_time() {
        let began = DateTime::parse_from_rfc3339("2026-11-26T09:05:07Z").unwrap().with_timezone(&Utc);
        let tried: Vec<String> = names(&began, "postgres", Some("ab12cd3")).take(4).collect();
        assert_eq!(
            tried,
            [
                "2026-11-26-postgres-ab12cd3.md",
                "2026-11-26-postgres-ab12cd3-090507.md",
                "2026-11-26-postgres-ab12cd3-090507-2.md",
                "2026-11-26-postgres-ab12cd3-090507-3.md",
            ]
        );
        assert_eq!(names(&began, "sqlite", None).next().unwrap(), "2026-11-26-sqlite-0905.md");
    }

    #[test]
    fn store_kinds_come_from_the_scheme() {
        assert_eq!(store_kind("postgresql://u:secret@h/db"), "postgres");
        assert_eq!(store_kind("rediss://h:6380"), "redis");
        assert_eq!(store_kind("mariadb://root@h/test"), "mariadb");
        assert_eq!(store_kind("sqlite:///tmp/b.db"), "sqlite");
        assert_eq!(store_kind("../x"), "store");
    }

    #[test]
    fn a_run_never_overwrites_an_earlier_file_nor_shows_a_password() {
        let dir = std::env::temp_dir().join(format!("solocron-bench-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sections = ["## 1. A table\n\n| a |\n|---|\n| 1 |\n".to_owned()];
        let store = "postgres://app:s3cret@db/test";
        let command = format!("solocron-bench --store {store} claim");
        let run = Run { store, command: &command, began: Utc::now(), sections: &sections };
        let first = write(&dir, &run).unwrap();
        let second = write(&dir, &run).unwrap();
        assert_ne!(first, second);
        let text = std::fs::read_to_string(&first).unwrap();
        assert!(text.contains("| 1 |") && text.contains("--store postgres://app:***@db/test claim`"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert_eq!(std::fs::read_to_string(&second).unwrap(), text);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
