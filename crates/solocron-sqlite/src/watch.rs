//! The SQLite [`RequestWatch`]: inotify on the database's directory. Every commit by any
//! process on this host writes the WAL file (or, at a checkpoint, the database file); only
//! then does the node read the requests table, at most twice a second. An idle node
//! sleeps. Where inotify is unavailable (its limits reached), the watch wakes every half
//! second, which is polling.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};
use solocron_core::RequestWatch;
use tokio::time::Instant;

/// Least time between two wakes: while jobs run, the files change all the time, and the
/// requests are then read no more often than a poll would.
const WAKE_GAP_MIN: Duration = Duration::from_millis(500);
/// How long after a write the watch wakes: a commit writes its WAL frames, then marks them
/// committed in shared memory (no event); a read in between would not see the request.
const COMMIT_SETTLE: Duration = Duration::from_millis(20);
/// Bytes read from inotify at once (an event is at most 16 + 256 bytes).
const EVENT_BUFFER: usize = 4096;

/// Watches the database file and its WAL.
pub(crate) struct FileWatch {
    dir: PathBuf,
    names: [OsString; 2],
    events: Option<EventStream<[u8; EVENT_BUFFER]>>,
    /// inotify could not be set up: poll.
    unavailable: bool,
    woke: Option<Instant>,
}

impl FileWatch {
    pub(crate) fn new(db: &Path) -> FileWatch {
        // SQLite writes the WAL beside the file a symbolic link points to.
        let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_owned());
        let dir = db.parent().unwrap_or(Path::new("/")).to_owned();
        let name = db.file_name().unwrap_or_default().to_owned();
        let mut wal = name.clone();
        wal.push("-wal");
        FileWatch { dir, names: [name, wal], events: None, unavailable: false, woke: None }
    }

    fn make(&self) -> std::io::Result<EventStream<[u8; EVENT_BUFFER]>> {
        let inotify = Inotify::init()?;
        inotify.watches().add(&self.dir, WatchMask::MODIFY | WatchMask::CREATE | WatchMask::MOVED_TO)?;
        inotify.into_event_stream([0; EVENT_BUFFER])
    }

    async fn wait_for_change(&mut self) {
        let Some(events) = self.events.as_mut() else { return };
        loop {
            match events.next().await {
                Some(Ok(e)) if relevant(&self.names, &e) => break,
                Some(Ok(_)) => {}
                Some(Err(err)) => {
                    tracing::debug!(error = %err, "the request watch (inotify) failed; setting it up again");
                    self.events = None;
                    return;
                }
                None => {
                    self.events = None;
                    return;
                }
            }
        }
        tokio::time::sleep(COMMIT_SETTLE).await;
        // Whatever else is already queued belongs to this wake.
        while let Some(Some(Ok(_))) = self.events.as_mut().and_then(|e| e.next().now_or_never()) {}
    }
}

/// Whether an event says one of the database's files changed (or events were lost).
fn relevant(names: &[OsString; 2], e: &inotify::EventOwned) -> bool {
    e.mask.contains(EventMask::Q_OVERFLOW) || e.name.as_ref().is_some_and(|n| names.contains(n))
}

#[async_trait]
impl RequestWatch for FileWatch {
    async fn changed(&mut self) {
        if let Some(woke) = self.woke {
            tokio::time::sleep_until(woke + WAKE_GAP_MIN).await;
        }
        if self.events.is_none() && !self.unavailable {
            match self.make() {
                Ok(events) => self.events = Some(events),
                Err(err) => {
                    tracing::warn!(error = %err, dir = %self.dir.display(),
                        "cannot watch the SQLite database for run requests (inotify); reading them every half second");
                    self.unavailable = true;
                }
            }
            // Set up (changes before went unseen): read the requests.
        } else if !self.unavailable {
            self.wait_for_change().await;
        }
        self.woke = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the watch wakes within 800 ms.
    async fn wakes(w: &mut FileWatch) -> bool {
        tokio::time::timeout(Duration::from_millis(800), w.changed()).await.is_ok()
    }

    /// A write to either file wakes the watch, also a rewrite of the same size, and a
    /// burst of writes wakes it once; nothing else does, neither time nor other files.
    #[tokio::test]
    async fn wakes_on_writes_to_the_database_files_only() {
        let dir = std::env::temp_dir().join(format!("solocron-filewatch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("x.db");
        std::fs::write(&db, b"a").unwrap();
        let mut w = FileWatch::new(&db);
        assert!(wakes(&mut w).await, "the first call returns at once");
        assert!(!wakes(&mut w).await, "no write, no wake");
        std::fs::write(dir.join("other.db-wal"), b"x").unwrap();
        assert!(!wakes(&mut w).await, "another file's write does not wake it");
        for (file, bytes) in [(db.clone(), b"b"), (dir.join("x.db-wal"), b"c"), (dir.join("x.db-wal"), b"d")] {
            for _ in 0..20 {
                std::fs::write(&file, bytes).unwrap();
            }
            assert!(wakes(&mut w).await, "a write to {} wakes the watch", file.display());
            assert!(!wakes(&mut w).await, "a burst of writes wakes it once");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
