//! What `perch heartbeat list` and `perch heartbeat run` show: every task's state, next firing
//! and last outcome, and a run's end.

use super::JobEnd;
use perch_core::Timestamp;
use perch_core::control::{HeartbeatList, LastRun, RunEnd, TaskRow};
use perch_core::heartbeat::{HeartbeatTask, LedgerState, Plan, SlotOutcome, next_slot, plan};
use perch_core::name::TaskName;
use std::collections::HashMap;

/// The tasks as `perch heartbeat list` shows them.
pub fn listing(
    tasks: &[HeartbeatTask],
    state: &LedgerState,
    first_seen: &HashMap<TaskName, Timestamp>,
    now: Timestamp,
    reload_error: Option<&str>,
) -> HeartbeatList {
    let rows = tasks
        .iter()
        .map(|task| {
            let task_state = state.task(&task.name);
            let first_seen = first_seen.get(&task.name).copied().unwrap_or(now);
            let (status, next) = match plan(task, task_state, first_seen, now) {
                Plan::Wait { until } => ("scheduled".to_owned(), Some(until)),
                Plan::Run { slot, .. } => ("due".to_owned(), Some(slot)),
                Plan::Skip { .. } => ("due".to_owned(), next_slot(&task.schedule, now)),
                Plan::Running { .. } => ("running".to_owned(), None),
                Plan::Stopped { reason, .. } => (format!("stopped: {reason}"), None),
                Plan::Disabled => ("disabled".to_owned(), None),
                Plan::Exhausted => ("never fires again".to_owned(), None),
            };
            let last = task_state.and_then(|state| state.last_outcome.as_ref());
            TaskRow {
                name: task.name.to_string(),
                schedule: schedule_text(task),
                status,
                next: next.map(|at| at.to_rfc3339()),
                last: last.map(|finished| LastRun {
                    slot: finished.slot.to_rfc3339(),
                    at: finished.at.to_rfc3339(),
                    manual: finished.manual,
                    outcome: describe(&finished.outcome),
                }),
                delivery: task.delivery.as_ref().map(ToString::to_string),
            }
        })
        .collect();
    HeartbeatList {
        tasks: rows,
        reload_error: reload_error.map(str::to_owned),
    }
}

fn schedule_text(task: &HeartbeatTask) -> String {
    match &task.schedule {
        perch_core::heartbeat::Schedule::Every(every) => format!("every {} s", every.as_secs()),
        perch_core::heartbeat::Schedule::Cron { expr, .. } => {
            format!("cron {expr} ({})", task.tz.name())
        }
    }
}

/// One line for an outcome.
pub fn describe(outcome: &SlotOutcome) -> String {
    match outcome {
        SlotOutcome::Silent => "silent".into(),
        SlotOutcome::Message { target, .. } if target.is_empty() => {
            "message (no delivery target)".into()
        }
        SlotOutcome::Message { target, .. } => format!("message to {target}"),
        SlotOutcome::Steer { lane, .. } => format!("steer into {lane}"),
        SlotOutcome::Invalid { reason } => format!("invalid verdict: {reason}"),
        SlotOutcome::Failed { reason } => format!("failed: {reason}"),
        SlotOutcome::Skipped { reason } => format!("skipped: {reason}"),
        SlotOutcome::Interrupted { reason } => format!("interrupted: {reason}"),
    }
}

/// `perch heartbeat run`'s one line: the task, what its run came to, and for a message or a
/// steer its text on the same line, escaped for a terminal.
pub fn run_line(task: &str, end: &RunEnd, dry_run: bool) -> String {
    let text = match &end.detail {
        SlotOutcome::Message { text, .. } | SlotOutcome::Steer { text, .. } => {
            format!(
                ": {}",
                perch_core::terminal::escaped(&text.replace('\n', " ⏎ "))
            )
        }
        _ => String::new(),
    };
    let dry = if dry_run {
        " (dry run: nothing posted)"
    } else {
        ""
    };
    let line = format!("{task}: {}{dry}{text}", end.outcome);
    perch_core::terminal::escaped(&line)
}

/// A run's end as `perch heartbeat run` prints it.
pub fn run_end(end: &JobEnd) -> RunEnd {
    RunEnd {
        outcome: describe(&end.outcome),
        valid: !matches!(end.outcome, SlotOutcome::Invalid { .. }),
        detail: end.outcome.clone(),
        reply: end.reply.clone(),
        stopped: end.stop.clone(),
    }
}

/// First-seen instants for a list made outside the service: now, for every task.
pub fn first_seen_now(tasks: &[HeartbeatTask], now: Timestamp) -> HashMap<TaskName, Timestamp> {
    tasks.iter().map(|task| (task.name.clone(), now)).collect()
}
