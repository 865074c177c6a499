//! `perch status --json` read into perch's own [`StatusReport`], through its own reader, so a
//! test names the fields it checks and a change of the format breaks the build, not the test.

use super::{perch, stderr, stdout};
pub use perch_core::control::{ChannelHealth, Heartbeats, StatusReport};
use perch_core::spend::SpendToday;
use std::path::Path;

/// `perch status DIR --json`, which must succeed and read as a report.
pub fn status(dir: &Path) -> StatusReport {
    let output = perch(&["status", dir.to_str().unwrap(), "--json"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    read(&stdout(&output))
}

/// Reads what `perch status --json` printed.
pub fn read(printed: &str) -> StatusReport {
    StatusReport::read(printed).unwrap_or_else(|error| panic!("{error}:\n{printed}"))
}

/// `perch status DIR`, the text, which must succeed.
pub fn status_text(dir: &Path) -> String {
    let output = perch(&["status", dir.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
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
