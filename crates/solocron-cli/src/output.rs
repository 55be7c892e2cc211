//! Output for humans (aligned tables and labelled details, times in one zone, humane
//! durations, colour on a terminal only) and for machines (JSON), and the one way to write
//! to stdout: a reader that went away ends the command quietly, never with a panic.

use std::io::{IsTerminal as _, Write as _};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use solocron_core::{format_duration, RunState};
use solocron_fleet::RunView;

use crate::Failure;

/// Writes `text` to stdout. When the reader has gone (`solocron history | head -1`), the
/// command stops at once with [`Failure::closed_pipe`]: what it had to say was not wanted.
pub fn emit(text: impl AsRef<[u8]>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_ref()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::closed_pipe()),
        Err(e) => Err(Failure(1, format!("stdout: {e}"))),
    }
}

/// [`emit`] of one line.
pub fn line(text: impl std::fmt::Display) -> Result<(), Failure> {
    emit(format!("{text}\n"))
}

/// Pretty JSON on stdout: the fleet's views (`solocron_fleet::views`) as they are, so the
/// CLI prints the very objects the HTTP API serves, one wire type per concept.
pub fn print_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<(), Failure> {
    line(serde_json::to_string_pretty(v).expect("the fleet's views serialize: plain data, string keys"))
}

/// True when stdout is a terminal and `NO_COLOR` is not set.
pub fn colour_enabled() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// A table cell: its text, and an optional ANSI colour applied after alignment.
pub struct Cell {
    /// What it shows.
    pub text: String,
    /// An ANSI colour code (`31`: red), used on a terminal only.
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
/// by someone else, dim for skipped, cyan while running, blue while a retry waits.
pub fn state_cell(state: &str) -> Cell {
    let colour = match state.parse::<RunState>() {
        Ok(RunState::Succeeded) => Some("32"),
        Ok(RunState::Failed | RunState::TimedOut | RunState::Lost) => Some("31"),
        Ok(RunState::Abandoned | RunState::Interrupted) => Some("33"),
        Ok(RunState::Skipped) => Some("2"),
        Ok(RunState::Running) => Some("36"),
        Ok(RunState::Waiting) => Some("34"),
        Err(_) => None,
    };
    Cell { text: state.to_owned(), colour }
}

/// Renders rows under `header`, columns aligned on the visible text.
pub fn table<H: AsRef<str>>(header: &[H], rows: Vec<Vec<Cell>>, colour: bool) -> String {
    let header: Vec<Cell> = header.iter().map(|h| Cell::from(h.as_ref())).collect();
    columns(std::iter::once(header).chain(rows).collect(), colour).into_iter().map(|l| l + "\n").collect()
}

/// Rows of cells as lines, each column as wide as its widest cell, two spaces apart, with
/// no trailing spaces.
pub fn columns(rows: Vec<Vec<Cell>>, colour: bool) -> Vec<String> {
    let mut widths: Vec<usize> = Vec::new();
    for r in &rows {
        widths.resize(widths.len().max(r.len()), 0);
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
        parts.join("  ").trim_end().to_owned()
    };
    rows.into_iter().map(render).collect()
}

/// Labelled lines: the labels in one column, the values in the next, all starting at the
/// same place. A value of several lines continues under the first, with an empty label.
pub fn labelled(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (label, value) in rows {
        for (i, part) in value.lines().enumerate() {
            let label = if i == 0 { *label } else { "" };
            out += format!("{label:<width$}  {part}").trim_end();
            out.push('\n');
        }
    }
    out
}

/// An instant in `zone`, with the UTC offset: `2026-11-22 21:00:05 +08:00`.
pub fn local_time(t: DateTime<Utc>, zone: Tz) -> String {
    t.with_timezone(&zone).format("%Y-%m-%d %H:%M:%S %:z").to_string()
}

/// When a run started, in `zone`, to the millisecond: the time of day alone when it started
/// on the day it was scheduled (the SCHEDULED column says which), else the date too.
pub fn start_time(scheduled: DateTime<Utc>, started: DateTime<Utc>, zone: Tz) -> String {
    let (s, t) = (scheduled.with_timezone(&zone), started.with_timezone(&zone));
    if s.date_naive() == t.date_naive() {
        t.format("%H:%M:%S%.3f").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
    }
}

/// A signed lateness: `+12ms`, `+1.2s`, `+3m 05s`, `-4ms`.
pub fn lateness(ms: i64) -> String {
    let sign = if ms < 0 { '-' } else { '+' };
    format!("{sign}{}", format_duration(std::time::Duration::from_millis(ms.unsigned_abs())))
}

/// How long ago (or from now) `t` is, humanely: `3m 05s ago`, `in 12.0s`.
pub fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    match (now - t).to_std() {
        Ok(ago) => format!("{} ago", format_duration(ago)),
        Err(_) => format!("in {}", format_duration((t - now).to_std().unwrap_or_default())),
    }
}

/// Columns of [`run_row`], the instants in `zone`.
pub fn run_header(zone: Tz) -> Vec<String> {
    let scheduled = format!("SCHEDULED ({})", zone.name());
    ["RUN ID", &scheduled, "STARTED", "LATE", "TRIGGER", "STATE", "NODE", "TOKEN", "DURATION", "EXIT", "REASON"]
        .map(str::to_owned)
        .to_vec()
}

/// A run as a table row, its instants in `zone`.
pub fn run_row(r: &RunView, zone: Tz) -> Vec<Cell> {
    let dash = || Cell::from("-");
    vec![
        r.id.as_str().into(),
        local_time(r.scheduled_at, zone).into(),
        r.started_at.map_or_else(dash, |t| start_time(r.scheduled_at, t, zone).into()),
        r.lateness_ms.map_or_else(dash, |ms| lateness(ms).into()),
        r.trigger.as_str().into(),
        state_cell(&r.state),
        r.node.as_str().into(),
        r.fencing_token.map_or_else(dash, |t| t.to_string().into()),
        r.duration_ms
            .map_or_else(dash, |ms| format_duration(std::time::Duration::from_millis(ms.unsigned_abs())).into()),
        r.exit_code.map_or_else(dash, |c| c.to_string().into()),
        r.reason.as_deref().unwrap_or_default().into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_visible_text_and_colour_only_when_asked() {
        let rows = vec![vec![state_cell("succeeded"), "x".into()], vec!["running-long".into(), "y".into()]];
        let plain = table(&["STATE", "N"], rows, false);
        assert!(!plain.contains('\x1b'));
        let lines: Vec<&str> = plain.lines().collect();
        assert_eq!(lines[1].find('x'), lines[2].find('y'));
        let coloured = table(&["STATE", "N"], vec![vec![state_cell("failed"), "x".into()]], true);
        assert!(coloured.contains("\x1b[31mfailed"));
    }

    #[test]
    fn labelled_values_start_in_one_column_and_continue_under_themselves() {
        let text = labelled(&[("job", "backup".into()), ("next fire", "soon".into()), ("nodes", "n1\nn2".into())]);
        assert_eq!(text, "job        backup\nnext fire  soon\nnodes      n1\n           n2\n");
    }

    #[test]
    fn times_show_the_zone_offset_and_lateness_its_sign() {
        let t: DateTime<Utc> = "2026-06-01T12:00:00Z".parse().unwrap();
        let shanghai: Tz = "Asia/Shanghai".parse().unwrap();
        assert_eq!(local_time(t, shanghai), "2026-06-01 20:00:00 +08:00");
        let now = t + chrono::Duration::seconds(123);
        assert_eq!(relative(t, now), "2m 03s ago");
        assert_eq!(start_time(t, t + chrono::Duration::milliseconds(12), shanghai), "20:00:00.012");
        assert_eq!(start_time(t, t + chrono::Duration::hours(4), shanghai), "2026-06-02 00:00:00.000");
        assert_eq!((lateness(12), lateness(1_200), lateness(-4)), ("+12ms".into(), "+1.2s".into(), "-4ms".into()));
    }
}
