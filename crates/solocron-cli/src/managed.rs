//! `solocron jobs apply|rm|export|log`: managed jobs, kept in the store. A job's two
//! spellings (its TOML table, the JSON definition the store keeps) are `wiring::spec`'s.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Map, Value};
use solocron_core::{JobWrite, Store};
use solocron_fleet::RevisionView;

use crate::config::{Config, Work};
use crate::output::{self, Cell};
use crate::wiring::{declared, operator, specs_of_document, Spec, Target};
use crate::{bad_input, store_failed, Failure, Format};

/// `solocron jobs`'s arguments.
#[derive(Args)]
pub struct JobsArgs {
    #[command(subcommand)]
    command: JobsCmd,
    #[command(flatten)]
    target: Target,
}

#[derive(Subcommand)]
enum JobsCmd {
    /// Create or replace managed jobs from a file of [[jobs]] tables (idempotent).
    Apply {
        /// The file: [[jobs]] tables (and [defaults]), as in a configuration.
        #[arg(long, short)]
        file: PathBuf,
        /// Check and show what would change, writing nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a managed job; a run in progress finishes.
    Rm {
        /// The job.
        name: String,
    },
    /// Print the managed jobs (or one) as [[jobs]] tables, ready for `jobs apply`.
    Export {
        /// Only this job.
        name: Option<String>,
    },
    /// Show the revisions of the managed jobs (or of one), newest first.
    Log {
        /// Only this job.
        name: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
}

/// `solocron jobs ...`.
pub async fn jobs(a: JobsArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    match a.command {
        JobsCmd::Apply { file, dry_run } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| bad_input(format!("{}: cannot read: {e}", file.display())))?;
            let specs = specs_of_document(&file.display().to_string(), &text)?;
            let store = a.target.connect(cfg.as_ref()).await?;
            apply(store.as_ref(), cfg.as_ref(), &specs, dry_run).await
        }
        JobsCmd::Rm { name } => {
            let store = a.target.connect(cfg.as_ref()).await?;
            remove(store.as_ref(), &name).await
        }
        JobsCmd::Export { name } => {
            let store = a.target.connect(cfg.as_ref()).await?;
            export(store.as_ref(), name.as_deref()).await
        }
        JobsCmd::Log { name, limit, format } => {
            let store = a.target.connect(cfg.as_ref()).await?;
            log(store.as_ref(), name.as_deref(), limit, format).await
        }
    }
}

async fn apply(store: &dyn Store, cfg: Option<&Config>, specs: &[Spec], dry_run: bool) -> Result<(), Failure> {
    let declared = declared(cfg);
    for s in specs {
        solocron_fleet::check_writable(store, &declared, &s.job.name).await?;
    }
    let current = store.managed_jobs().await.map_err(store_failed)?;
    let by = operator();
    for s in specs {
        let now = current.iter().find(|m| m.job == s.job.name);
        let what = match now {
            None => "created",
            Some(m) if m.spec == s.json => "unchanged",
            Some(_) => "changed",
        };
        if matches!(s.job.work, Work::Command(_)) {
            output::line(format_args!(
                "note: `{}` runs a command: only nodes with [http] allow_command_jobs = true run it",
                s.job.name
            ))?;
        }
        if dry_run {
            output::line(format_args!("{} {what} (dry run: nothing written)", s.job.name))?;
            continue;
        }
        let written = store.put_job(&s.job.name, &s.json, &by, None).await.map_err(store_failed)?;
        match written {
            JobWrite::Written(r) => output::line(format_args!("{} {what}: revision {r}", s.job.name))?,
            JobWrite::Unchanged(r) => {
                output::line(format_args!("{} unchanged: revision {}", s.job.name, r.unwrap_or(0)))?
            }
            JobWrite::Conflict(_) => unreachable!("no revision was expected"),
            JobWrite::Full => {
                return Err(bad_input(format!(
                    "{}: the store holds {} managed jobs already",
                    s.job.name,
                    solocron_core::MANAGED_JOBS_MAX
                )))
            }
        }
    }
    Ok(())
}

async fn remove(store: &dyn Store, name: &str) -> Result<(), Failure> {
    match store.delete_job(name, &operator(), None).await.map_err(store_failed)? {
        JobWrite::Written(r) => output::line(format_args!("{name} deleted: revision {r}")),
        _ => Err(Failure(1, format!("no managed job `{name}`"))),
    }
}

async fn export(store: &dyn Store, name: Option<&str>) -> Result<(), Failure> {
    let all = store.managed_jobs().await.map_err(store_failed)?;
    let mut doc = String::new();
    for m in all.iter().filter(|m| name.is_none_or(|n| n == m.job)) {
        let fields: Map<String, Value> =
            serde_json::from_str(&m.spec).map_err(|e| bad_input(format!("{}: stored definition: {e}", m.job)))?;
        let mut entry = toml::Table::new();
        entry.insert("name".into(), toml::Value::String(m.job.clone()));
        let rest: toml::Table = toml::Table::try_from(&fields).map_err(|e| bad_input(format!("{}: {e}", m.job)))?;
        entry.extend(rest);
        let mut one = toml::Table::new();
        one.insert("jobs".into(), toml::Value::Array(vec![toml::Value::Table(entry)]));
        doc.push_str(&format!("# revision {} by {} at {}\n", m.revision, m.changed_by, m.changed_at.to_rfc3339()));
        doc.push_str(&toml::to_string(&one).map_err(|e| bad_input(format!("{}: {e}", m.job)))?);
        doc.push('\n');
    }
    if let (Some(n), true) = (name, doc.is_empty()) {
        return Err(Failure(1, format!("no managed job `{n}`")));
    }
    output::emit(doc)
}

async fn log(store: &dyn Store, name: Option<&str>, limit: usize, format: Format) -> Result<(), Failure> {
    let revisions = store.job_revisions(name, limit).await.map_err(store_failed)?;
    match format {
        // The API's objects (`GET /api/v1/jobs/{job}/revisions`).
        Format::Json => output::print_json(&revisions.iter().map(RevisionView::from).collect::<Vec<_>>()),
        Format::Table => {
            let rows = revisions
                .iter()
                .map(|r| {
                    let what = r.spec.as_deref().map_or("deleted".to_owned(), str::to_owned);
                    vec![
                        Cell::from(r.revision.to_string()),
                        Cell::from(r.job.clone()),
                        Cell::from(r.changed_at.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
                        Cell::from(r.changed_by.clone()),
                        Cell::from(what),
                    ]
                })
                .collect();
            let header = ["REVISION", "JOB", "AT", "BY", "DEFINITION"];
            output::emit(output::table(&header, rows, output::colour_enabled()))
        }
    }
}
