//! `perch status --json` read into perch's own [`StatusReport`], through its own reader, so a
//! test names the fields it checks and a change of the format breaks the build, not the test.

use super::{perch, stderr, stdout};
pub use perch_core::control::{ChannelHealth, Heartbeats, StatusReport};
use perch_core::spend::SpendToday;
use std::path::Path;

/// `perch status DIR --json`, which must read as a report and exit as its state says.
pub fn status(dir: &Path) -> StatusReport {
    let output = perch(&["status", dir.to_str().unwrap(), "--json"], &[]);
    let report = read(&stdout(&output));
    assert_eq!(
        output.status.code(),
        Some(exit_code(&report.state)),
        "{}",
        stderr(&output)
    );
    report
}

/// `perch status`'s exit status for `state`, as `systemctl status` has it: 0 running, 3 not
/// running, 4 unknown.
pub fn exit_code(state: &str) -> i32 {
    match state {
        "running" => 0,
        "stopped" => 3,
        "unknown" => 4,
        other => panic!("no such state: {other}"),
    }
}

/// Reads what `perch status --json` printed.
pub fn read(printed: &str) -> StatusReport {
    StatusReport::read(printed).unwrap_or_else(|error| panic!("{error}:\n{printed}"))
}

/// `perch status DIR`, the text, which must exit 0 (running) or 3 (stopped).
pub fn status_text(dir: &Path) -> String {
    let output = perch(&["status", dir.to_str().unwrap()], &[]);
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "{:?}: {}",
        output.status,
        stderr(&output)
    );
    stdout(&output)
}

/// What the tests read of a report beside its fields.
pub trait Report {
    /// The `n`th channel as the running service reports it; `None` while no service answers.
    fn channel(&self, n: usize) -> Option<&ChannelHealth>;
    /// The first channel's connection line; empty while no service answers.
    fn connection(&self) -> String;
    /// Whether the first channel is `receiving` and healthy.
    fn receiving(&self) -> bool;
    /// The heartbeat tasks; the test fails when they could not be listed.
    fn heartbeat_tasks(&self) -> &[perch_core::control::TaskRow];
    /// The day's spend; the test fails when it could not be read.
    fn spend(&self) -> &SpendToday;
}

impl Report for StatusReport {
    fn channel(&self, n: usize) -> Option<&ChannelHealth> {
        self.channel_health.as_ref()?.get(n)
    }

    fn connection(&self) -> String {
        self.channel(0)
            .map(|channel| channel.connection.clone())
            .unwrap_or_default()
    }

    fn receiving(&self) -> bool {
        self.channel(0)
            .is_some_and(|channel| channel.connection == "receiving" && channel.healthy)
    }

    fn heartbeat_tasks(&self) -> &[perch_core::control::TaskRow] {
        match &self.heartbeats {
            Heartbeats::Listed(list) => &list.tasks,
            Heartbeats::Unlisted { error } => panic!("the heartbeats are not listed: {error}"),
        }
    }

    fn spend(&self) -> &SpendToday {
        match &self.spend_today {
            perch_core::control::SpendStatus::Known(today) => today,
            perch_core::control::SpendStatus::Unknown { error } => {
                panic!("the spend is not known: {error}")
            }
        }
    }
}

/// `perch status`'s text with how long ago (or until when) each time was left out: `(5 min
/// ago)`, `(in 2h 5min)` and `(just now)` become `(AGO)`; the local times stay.
pub fn without_ages(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let close = after.find(')').map_or(after.len(), |close| close + 1);
        let inside = &after[1..close.saturating_sub(1).max(1)];
        let is_age = !inside.contains('\n')
            && (inside.ends_with(" ago") || inside.starts_with("in ") || inside == "just now");
        out.push_str(if is_age { "(AGO)" } else { &after[..close] });
        rest = &after[close..];
    }
    out.push_str(rest);
    out
}
