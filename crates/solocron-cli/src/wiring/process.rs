//! The process's edges every long-running command shares: the signals it answers, its log,
//! and who an operator's action is recorded as.

use clap::ValueEnum;

/// Who an operator action is recorded as: `user@host`.
pub fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    format!("{user}@{host}")
}

/// How the log is written (`run --log-format`).
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// What a signal asks of the process.
pub enum Asked {
    /// SIGTERM or SIGINT: drain and stop.
    Stop,
    /// SIGHUP: read the configuration again.
    Reload,
}

/// The signals the daemon and the server answer.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Handles SIGTERM, SIGINT and SIGHUP from now on (SIGHUP's default would kill the
    /// process without recording its runs' ends).
    pub fn new() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
            hup: signal(SignalKind::hangup()).expect("SIGHUP handler"),
        }
    }

    /// The next signal, saying which in the log when it stops the process.
    pub async fn next(&mut self) -> Asked {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: draining"),
            _ = self.int.recv() => tracing::info!("SIGINT: draining"),
            _ = self.hup.recv() => return Asked::Reload,
        }
        Asked::Stop
    }
}

/// Logs to stderr at `RUST_LOG`'s levels (default info), coloured on a terminal unless
/// `NO_COLOR` is set.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
