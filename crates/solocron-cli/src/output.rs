//! Output for humans (aligned tables, times in the job's zone, humane durations, colour on a
//! terminal only) and for machines (JSON).

use std::io::IsTerminal as _;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use serde_json::json;
use solocron_core::{format_duration, RunRecord, RunState};

/// True when stdout is a terminal and `NO_COLOR` is not set.
pub fn colour_enabled() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// A table cell: its text, and an optional ANSI colour applied after alignment.
pub struct Cell {
    pub text: String,
    pub colour: Option<&'static str>,
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell { text, colour: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell { text: text.to_owned(), colour: None }
    }
}

/// The colour of a run state: green for success, red for failures, yellow for runs ended
/// by someone else, dim for skipped, cyan while running.
pub fn state_cell(state: RunState) -> Cell {
    let colour = match state {
        RunState::Succeeded => "32",
        RunState::Failed | RunState::TimedOut | RunState::Lost => "31",
        RunState::Abandoned | RunState::Interrupted => "33",
        RunState::Skipped => "2",
        RunState::Running => "36",
    };
    Cell { text: state.as_str().to_owned(), colour: Some(colour) }
}

/// Renders rows under `header`, columns aligned on the visible text.
pub fn table(header: &[&str], rows: Vec<Vec<Cell>>, colour: bool) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.text.chars().count());
        }
    }
    let render = |cells: Vec<Cell>| {
        let parts: Vec<String> = cells
            .into_iter()
            .zip(&widths)
            .map(|(c, w)| {
                let padded = format!("{:<w$}", c.text);
                match c.colour {
                    Some(code) if colour => format!("\x1b[{code}m{padded}\x1b[0m"),
                    _ => padded,
                }
            })
            .collect();
        parts.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = render(header.iter().map(|h| Cell::from(*h)).collect());
    for r in rows {
        out += &render(r);
    }
    out
}

/// An instant in `zone`, with the UTC offset: `2026-11-22 21:00:05 +08:00`.
pub fn local_time(t: DateTime<Utc>, zone: Tz) -> String {
    t.with_timezone(&zone).format("%Y-%m-%d %H:%M:%S %:z").to_string()
}

/// How long ago (or from now) `t` is, humanely: `3m 05s ago`, `in 12.0s`.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    match (now - t).to_std() {
        Ok(ago) => format!("{} ago", format_duration(ago)),
        Err(_) => format!("in {}", format_duration((t - now).to_std().unwrap_or_default())),
    }
}

fn rfc(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// A run record as JSON.
pub fn run_json(r: &RunRecord) -> serde_json::Value {
    json!({
        "run_id": r.id.to_string(),
        "job": r.id.tick.job,
        "scheduled_at": rfc(Some(r.id.tick.scheduled_at)),
        "attempt": r.id.attempt,
        "trigger": r.trigger.as_str(),
        "node": r.node,
        "fencing_token": r.fencing_token,
        "state": r.state.as_str(),
        "reason": r.reason,
        "claimed_at": rfc(Some(r.claimed_at)),
        "started_at": rfc(r.started_at),
        "finished_at": rfc(r.finished_at),
        "lease_until": rfc(r.lease_until),
        "duration_ms": r.duration().map(|d| d.as_millis() as u64),
        "exit_code": r.exit_code,
        "output": r.output,
    })
}

/// Columns of [`run_row`].
pub const RUN_HEADER: [&str; 10] =
    ["JOB", "SCHEDULED", "ATTEMPT", "TRIGGER", "STATE", "NODE", "TOKEN", "DURATION", "EXIT", "REASON"];

/// A run record as a table row; the instant in `zone`.
pub fn run_row(r: &RunRecord, zone: Tz) -> Vec<Cell> {
    vec![
        r.id.tick.job.clone().into(),
        local_time(r.id.tick.scheduled_at, zone).into(),
        r.id.attempt.to_string().into(),
        r.trigger.as_str().into(),
        state_cell(r.state),
        r.node.clone().into(),
        r.fencing_token.map_or("-".into(), |t| t.to_string()).into(),
        r.duration().map_or("-".into(), format_duration).into(),
        r.exit_code.map_or("-".into(), |c| c.to_string()).into(),
        r.reason.clone().unwrap_or_default().into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_visible_text_and_colour_only_when_asked() {
        let rows = vec![vec![state_cell(RunState::Succeeded), "x".into()], vec!["running-long".into(), "y".into()]];
        let plain = table(&["STATE", "N"], rows, false);
        assert!(!plain.contains('\x1b'));
        let lines: Vec<&str> = plain.lines().collect();
        assert_eq!(lines[1].find('x'), lines[2].find('y'));
        let coloured = table(&["STATE", "N"], vec![vec![state_cell(RunState::Failed), "x".into()]], true);
        assert!(coloured.contains("\x1b[31mfailed"));
    }

    #[test]
    fn times_show_the_zone_offset() {
        let t: DateTime<Utc> = "2026-06-01T12:00:00Z".parse().unwrap();
        assert_eq!(local_time(t, "Asia/Shanghai".parse().unwrap()), "2026-06-01 20:00:00 +08:00");
        let now = t + chrono::Duration::seconds(123);
        assert_eq!(relative(t, now), "2m 03s ago");
    }
}
