//! Heartbeats in the shell: the heartbeat file read from the workspace (`file`), the slot ledger
//! on disk (`ledger`), the scheduler task that owns it (`scheduler`), the judged turn every run
//! takes (`turn`), the whole run carried out through the service's narrow interface (`host`,
//! `run`), and what `perch heartbeat list` shows (`listing`).
//!
//! The rules (the file, the slots, the verdict, the plan, which failures stop a task) are the
//! core's ([`perch_core::heartbeat`]); this module reads the file, keeps the ledger, sleeps until
//! the next plan and runs what is due. One task owns the schedule and the ledger; each run is its
//! own task and reports back to it. A run reaches the rest of perch only through [`Host`].

mod file;
mod host;
mod ledger;
mod listing;
mod run;
mod scheduler;
mod turn;

pub use file::{file_path, heartbeat_env, host_tz, read_file};
pub use host::{Host, HostLane, Steer};
pub use ledger::{Ledger, peek_ledger, resume_here};
pub use listing::{first_seen_now, listing, run_end, run_line};
pub use scheduler::{Heartbeats, OnStop, RunJob, SchedulerSetup, start};

use perch_core::Timestamp;
use perch_core::heartbeat::{Finished, HeartbeatTask, SlotOutcome};
use perch_core::name::LaneName;
use perch_core::prompt::Origin;
use std::time::Duration;

/// How often the scheduler looks at `HEARTBEAT.yml` for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// One heartbeat run to perform.
#[derive(Debug, Clone)]
pub struct Job {
    pub task: HeartbeatTask,
    /// The scheduled instant, or when a manual run was asked for.
    pub slot: Timestamp,
    pub run: String,
    /// Missed slots folded into this run.
    pub coalesced: u32,
    /// The task's last outcome, offered to a fresh run.
    pub last: Option<Finished>,
    pub mode: Mode,
}

impl Job {
    /// The lane the run takes its turn in: the task's own, or its dry-run lane.
    pub fn lane(&self) -> LaneName {
        match self.mode {
            Mode::DryRun => self.task.name.dry_run_lane(),
            Mode::Scheduled | Mode::Manual => self.task.name.own_lane(),
        }
    }

    /// Where the run's turns and steers say they come from: the `heartbeat` channel, the task as
    /// the room.
    pub fn origin(&self) -> Origin {
        Origin {
            channel: "heartbeat".into(),
            room: Some(self.task.name.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Scheduled,
    /// `perch heartbeat run`: recorded, but no slot is consumed.
    Manual,
    /// `perch heartbeat run --dry-run`: its own lane, nothing delivered, nothing recorded.
    DryRun,
}

/// How a run ended, and whether the task must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    pub outcome: SlotOutcome,
    /// The model's last reply, as judged.
    pub reply: String,
    /// Set when the failure will not go away by itself (the key was refused, the quota is
    /// spent): the task stops until its entry changes or it is resumed.
    pub stop: Option<String>,
}

impl JobEnd {
    /// A run that ended with `outcome` before any reply, and does not stop its task.
    pub fn early(outcome: SlotOutcome) -> JobEnd {
        JobEnd {
            outcome,
            reply: String::new(),
            stop: None,
        }
    }
}
