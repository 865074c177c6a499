//! Heartbeats: tasks in `workspace/HEARTBEAT.yml` that wake the agent on a schedule.
//!
//! [`file`] checks the file into [`HeartbeatTask`]s, [`schedule`] computes their slots,
//! [`verdict`] judges the model's reply to a heartbeat, [`stop`] decides which failures stop a
//! task, [`ledger`] folds the slot ledger (`.perch/heartbeats/`) into per-task state and plans
//! what to do next, and [`supersede`] says which of its records a new one makes irrelevant. All
//! of it takes the time as an argument.

pub mod file;
pub mod ledger;
pub mod schedule;
pub mod stop;
pub mod supersede;
pub mod verdict;

pub use file::{
    FILE, HeartbeatEnv, HeartbeatFile, HeartbeatTask, MAX_TASKS, Missed, Target, TargetSpec,
    parse_heartbeat_file,
};
pub use ledger::{
    BACKOFF, Finished, LedgerRecord, LedgerState, ON_TIME, OpenRun, PendingRetry, Plan,
    SlotOutcome, Stop, TaskState, plan, reduce,
};
pub use schedule::{
    ActiveHours, MAX_INTERVAL, MIN_INTERVAL, SLOT_LIMIT, Schedule, format_duration,
    in_active_hours, next_slot, parse_every, slots_between,
};
pub use stop::{ModelFailure, stops_task};
pub use supersede::superseded;
pub use verdict::{InvalidVerdict, VERDICT_RULE, Verdict, correction, judge};
