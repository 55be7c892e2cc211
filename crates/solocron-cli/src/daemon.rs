//! `solocron run`: the daemon.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use solocron::JobChanges;
use solocron_http::DeclaredJobs;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::wiring::{self, init_logging, jobs, load, scheduler, Asked, LogFormat, Signals, Target};
use crate::{bad_input, Failure};
use solocron::follow::Sources;

/// `solocron run`'s arguments.
#[derive(Args)]
pub struct RunArgs {
    /// The configuration file.
    #[arg(long, short, default_value = "solocron.toml")]
    config: PathBuf,
    /// This node's id (default: [node].id, else hostname-pid).
    #[arg(long)]
    node_id: Option<String>,
    /// The store URL (overrides [store].url; the prefix is then `solocron` unless --prefix).
    #[arg(long)]
    store: Option<String>,
    /// The namespace of solocron's tables or keys in the store (overrides [store].prefix).
    #[arg(long, value_name = "NAME")]
    prefix: Option<solocron_core::Prefix>,
    /// Exit (code 2) when the store cannot be reached at start, instead of waiting for it.
    #[arg(long)]
    fail_fast: bool,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Serve the HTTP API, metrics and console on this address and port (default: [http]
    /// listen; none: no HTTP). A non-loopback address needs [[http.tokens]].
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// Write this process's pid here while it runs, for `solocron reload` (default: [node]
    /// pid_file; none: no file).
    #[arg(long, value_name = "PATH")]
    pid_file: Option<PathBuf>,
}

/// `solocron run`: the daemon, until SIGTERM or SIGINT; SIGHUP reloads its `[[jobs]]`.
pub async fn run(a: RunArgs) -> Result<(), Failure> {
    init_logging(a.log_format);
    // Signals first: a SIGTERM while the store is awaited ends the wait, not the process; a
    // SIGHUP before the scheduler runs is kept and applied once it does.
    let shutdown = CancellationToken::new();
    let reload = Arc::new(Notify::new());
    tokio::spawn(on_signal(shutdown.clone(), reload.clone()));
    let (cfg, give_back) = load_apart(&a.config)?;
    let target = Target { config: a.config.clone(), store: a.store.clone(), prefix: a.prefix.clone() };
    // `open`, not `connect`: with `store.migrate = false` the schema is someone else's job.
    let Some(store) = open_when_reachable(&target, &cfg, a.fail_fast, &shutdown).await? else { return Ok(()) };
    let (_, key) = target.store_config(Some(&cfg));
    if cfg.store.migrate {
        store.migrate().await.map_err(|e| bad_input(format!("{key}: {e}")))?;
    } else {
        wiring::require_current_schema(store.as_ref(), &key).await?;
    }
    // The managed jobs at start are on the first list, so they catch up like declared ones;
    // unreadable now (a store without the tables yet), they are read again as they change.
    let (version, managed) = match solocron::follow::read_if_changed(store.as_ref(), 0).await {
        Ok(found) => found.unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the managed jobs; starting with the configuration's");
            (0, Vec::new())
        }
    };
    let declared_jobs = jobs(&cfg)?;
    let mut scheduler = scheduler(&cfg, store.clone(), a.node_id, declared_jobs.clone())?;
    scheduler.claim_node_id().await.map_err(|e| bad_input(format!("{e} (--node-id or [node] id)")))?;
    let _pid_file =
        a.pid_file.as_ref().or(cfg.pid_file.as_ref()).map(|p| crate::reload::PidFile::write(p)).transpose()?;
    // Without a server, nobody reads the list of declared jobs: it is not kept.
    let listen = crate::http::listen(a.http, Some(&cfg));
    let shown = listen.map(|_| DeclaredJobs::new(wiring::declared_jobs(&cfg.file, &declared_jobs)));
    let sources = Arc::new(Sources::new(
        scheduler.jobs(),
        declared_jobs,
        cfg.http.allow_command_jobs,
        solocron::spec::read_secret,
    ));
    sources.set_managed(&managed);
    tokio::spawn(solocron::follow::follow(store.clone(), sources.clone(), version, managed, shutdown.clone()));
    // The server outlives the drain, so operators watch it; it stops once the node has.
    let http_stop = CancellationToken::new();
    let server = match (listen, &shown) {
        (Some(addr), Some(declared)) => {
            Some(crate::http::start(addr, Some(&cfg), declared.clone(), store, http_stop.clone()).await?)
        }
        _ => None,
    };
    let reloads = Reloads { path: a.config.clone(), sources, declared: shown };
    tokio::spawn(reloads.serve(reload, shutdown.clone()));
    // Everything the node keeps of its configuration is taken: its parsed job list is not
    // kept for the node's life beside the scheduler's (a reload reads the file again).
    let _ = give_back.send(cfg);
    scheduler.run(shutdown).await;
    http_stop.cancel();
    if let Some(s) = server {
        let _ = s.await;
    }
    Ok(())
}

/// [`load`] on a thread of its own, which stays until the configuration comes back to it
/// through the returned sender (or the sender is dropped). The parser's garbage and the
/// parsed configuration are allocated in that thread's malloc arena, and no other thread
/// takes that arena while the thread lives: once the node has copied what it keeps, freeing
/// the configuration empties the arena whole, instead of leaving holes between the jobs'
/// long-lived allocations in the main one (issue 23: an idle node's resident heap).
fn load_apart(path: &std::path::Path) -> Result<(Config, std::sync::mpsc::Sender<Config>), Failure> {
    let (parsed_tx, parsed) = std::sync::mpsc::sync_channel(1);
    let (back, returned) = std::sync::mpsc::channel::<Config>();
    let path = path.to_owned();
    std::thread::Builder::new()
        .name("config".into())
        .spawn(move || {
            let _ = parsed_tx.send(load(&path));
            drop(returned.recv());
        })
        .map_err(|e| Failure(1, format!("cannot start a thread to read the configuration: {e}")))?;
    let cfg = parsed.recv().map_err(|_| Failure(1, "the configuration's reader thread stopped".into()))??;
    Ok((cfg, back))
}

/// Longest wait between two tries to reach a store that was unreachable at start.
const START_RETRY_MAX: Duration = Duration::from_secs(5);

/// The store, once it answers: a store that is only unreachable (down, restarting, not yet
/// started beside this node) is tried again with a bounded backoff, and the wait said in
/// the log, unless `fail_fast`; a misconfigured one fails at once. `None`: shutdown came
/// first.
async fn open_when_reachable(
    target: &Target,
    cfg: &Config,
    fail_fast: bool,
    shutdown: &CancellationToken,
) -> Result<Option<std::sync::Arc<dyn solocron_core::Store>>, Failure> {
    let mut wait = Duration::from_millis(100);
    loop {
        match target.try_open(Some(cfg)).await {
            Ok(store) => return Ok(Some(store)),
            Err((failure, true)) if !fail_fast => tracing::warn!(
                error = %failure.1, retry_in = ?wait,
                "the store cannot be reached; waiting for it (--fail-fast exits instead)"
            ),
            Err((failure, _)) => return Err(failure),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
        wait = (wait * 2).min(START_RETRY_MAX);
    }
}

/// What a SIGHUP reloads: the configuration file's `[[jobs]]`, into the running scheduler
/// (beside the managed jobs) and the HTTP server's view of the declared jobs.
struct Reloads {
    path: PathBuf,
    sources: Arc<Sources>,
    /// The HTTP server's list of declared jobs, if this node serves one.
    declared: Option<DeclaredJobs>,
}

impl Reloads {
    /// Reloads at each request until shutdown.
    async fn serve(self, asked: Arc<Notify>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = asked.notified() => {}
                _ = shutdown.cancelled() => return,
            }
            match self.reload() {
                Ok(changes) => tracing::info!(
                    file = %self.path.display(), added = changes.added.len(), changed = changes.changed.len(),
                    removed = changes.removed.len(), "configuration reloaded: its [[jobs]] apply from their next tick \
                    (changes to [store], [node], [http] and [[alerts]] apply at the next start)"
                ),
                Err(Failure(_, why)) => tracing::error!(
                    file = %self.path.display(), error = %why,
                    "configuration not reloaded: it has an error; the running jobs stay as they were"
                ),
            }
        }
    }

    /// Reads the file and replaces the job list whole, or changes nothing.
    fn reload(&self) -> Result<JobChanges, Failure> {
        let (cfg, give_back) = load_apart(&self.path)?;
        let list = jobs(&cfg)?;
        let shown = self.declared.as_ref().map(|d| (d, wiring::declared_jobs(&cfg.file, &list)));
        let changes = self.sources.set_declared(list).map_err(|e| bad_input(format!("{}: {e}", cfg.file)))?;
        if let Some((declared, list)) = shown {
            declared.set(list);
        }
        let _ = give_back.send(cfg);
        Ok(changes)
    }
}

/// Cancels `shutdown` at the first SIGTERM or SIGINT; each SIGHUP asks for a reload.
async fn on_signal(shutdown: CancellationToken, reload: Arc<Notify>) {
    let mut signals = Signals::new();
    while let Asked::Reload = signals.next().await {
        tracing::info!("SIGHUP: reloading the configuration");
        reload.notify_one();
    }
    shutdown.cancel();
}
