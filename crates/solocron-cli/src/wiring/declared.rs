//! The jobs a configuration declares, as the fleet and the API show them (where each is
//! declared): read by the admin commands, `serve` and the daemon's server alike.

use solocron_fleet::Declared;

use crate::config::Config;

/// The jobs a configuration declares, for the API to show where each is declared.
pub fn declared(cfg: Option<&Config>) -> Vec<Declared> {
    let Some(cfg) = cfg else { return Vec::new() };
    listed(&cfg.file, cfg.jobs.iter().map(|j| (j.name.as_str(), &j.schedule)))
}

/// The jobs a daemon built from its configuration file `file`, for the API to show where
/// each is declared: they share each job's schedule (a configuration's own copy may be
/// freed once the daemon has built its jobs).
pub fn declared_jobs(file: &str, jobs: &[solocron::Job]) -> Vec<Declared> {
    listed(file, jobs.iter().map(|j| (j.name(), j.schedule())))
}

/// Each (name, schedule) as declared in `file`.
fn listed<'a>(file: &str, jobs: impl Iterator<Item = (&'a str, &'a solocron_core::Schedule)>) -> Vec<Declared> {
    let source: std::sync::Arc<str> = file.into();
    jobs.map(|(name, schedule)| Declared { name: name.to_owned(), schedule: schedule.clone(), source: source.clone() })
        .collect()
}
