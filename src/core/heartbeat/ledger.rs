//! The slot ledger, `.perch/heartbeats/`: what happened to each task's slots, folded into
//! per-task state, and the plan for a task's next step.
//!
//! The rules [`plan`] follows:
//!
//! - Slots come strictly after the task's latest done scheduled slot (finished, skipped, or
//!   given up), or after `first_seen` when it has none, so a new task never fires for the past.
//! - `missed: run_once`: every due slot folds into one run of the latest; `coalesced` counts the
//!   earlier ones inside active hours. If the latest is outside active hours, all are skipped.
//! - `missed: skip`: earlier due slots are skipped; the latest runs if it is inside active hours
//!   and at most [`ON_TIME`] late, and is skipped otherwise.
//! - A slot outside active hours is skipped, never deferred; the plan waits for the next slot
//!   inside them and skips the ones before it when it comes.
//! - A scheduled run that ends `Failed` is retried after each wait in [`BACKOFF`], unless the
//!   next slot comes first or the retry falls outside active hours; after the last retry fails,
//!   the slot is given up. `Invalid`, `Skipped` and `Interrupted` runs are not retried.
//! - When more than [`SLOT_LIMIT`] slots are due, the oldest are skipped in batches first.
//! - Any open run plans [`Plan::Running`]; a stopped task plans [`Plan::Stopped`].

use super::file::{HeartbeatTask, Missed};
use super::schedule::{
    MIN_INTERVAL, SLOT_LIMIT, format_duration, in_active_hours, next_slot, slots_between,
};
use crate::Timestamp;
use crate::name::{LaneName, TaskName};
use chrono::TimeDelta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// One line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LedgerRecord {
    /// A run began. `coalesced` counts the missed slots folded into it.
    SlotStarted {
        task: TaskName,
        slot: Timestamp,
        run: String,
        manual: bool,
        coalesced: u32,
        at: Timestamp,
    },
    /// A run ended.
    SlotFinished {
        task: TaskName,
        slot: Timestamp,
        run: String,
        outcome: SlotOutcome,
        at: Timestamp,
    },
    /// `count` slots from `from` to `to` (both included) were passed over.
    SlotsSkipped {
        task: TaskName,
        from: Timestamp,
        to: Timestamp,
        count: u32,
        reason: String,
        at: Timestamp,
    },
    /// The task stops until its entry changes (`fingerprint` is the entry's when it stopped) or
    /// it is resumed.
    TaskStopped {
        task: TaskName,
        reason: String,
        fingerprint: String,
        at: Timestamp,
    },
    /// A stopped task runs again.
    TaskResumed { task: TaskName, at: Timestamp },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SlotOutcome {
    /// The verdict was `SILENCE`.
    Silent,
    /// The verdict was a message, handed to the outbox as `delivery` for `target`.
    Message {
        text: String,
        target: String,
        delivery: String,
    },
    /// The verdict was a steer, appended to `lane`.
    Steer { text: String, lane: LaneName },
    /// The reply was not a verdict, even after the correction.
    Invalid { reason: String },
    /// The run failed (model, sandbox, or tool error).
    Failed { reason: String },
    /// The task's check exited non-zero.
    Skipped { reason: String },
    /// perch stopped while the run was open.
    Interrupted { reason: String },
}

impl SlotOutcome {
    /// The outcome's name, as the ledger writes it: `silent`, `message`, `steer`, `invalid`,
    /// `failed`, `skipped` or `interrupted`.
    pub fn name(&self) -> &'static str {
        match self {
            SlotOutcome::Silent => "silent",
            SlotOutcome::Message { .. } => "message",
            SlotOutcome::Steer { .. } => "steer",
            SlotOutcome::Invalid { .. } => "invalid",
            SlotOutcome::Failed { .. } => "failed",
            SlotOutcome::Skipped { .. } => "skipped",
            SlotOutcome::Interrupted { .. } => "interrupted",
        }
    }

    /// Whether a run that ended so went wrong, so that `perch heartbeat run` exits non-zero:
    /// a reply that was no verdict, a failed run, or one perch stopped. A skip is the task's
    /// check saying there is nothing to do, and is not an error.
    pub fn went_wrong(&self) -> bool {
        match self {
            SlotOutcome::Silent
            | SlotOutcome::Message { .. }
            | SlotOutcome::Steer { .. }
            | SlotOutcome::Skipped { .. } => false,
            SlotOutcome::Invalid { .. }
            | SlotOutcome::Failed { .. }
            | SlotOutcome::Interrupted { .. } => true,
        }
    }

    /// Why the run carried out no verdict: an invalid, failed, skipped or interrupted run's
    /// reason.
    pub fn reason(&self) -> Option<&str> {
        match self {
            SlotOutcome::Silent | SlotOutcome::Message { .. } | SlotOutcome::Steer { .. } => None,
            SlotOutcome::Invalid { reason }
            | SlotOutcome::Failed { reason }
            | SlotOutcome::Skipped { reason }
            | SlotOutcome::Interrupted { reason } => Some(reason),
        }
    }
}

impl LedgerRecord {
    /// The task the record is about.
    pub fn task(&self) -> &TaskName {
        match self {
            LedgerRecord::SlotStarted { task, .. }
            | LedgerRecord::SlotFinished { task, .. }
            | LedgerRecord::SlotsSkipped { task, .. }
            | LedgerRecord::TaskStopped { task, .. }
            | LedgerRecord::TaskResumed { task, .. } => task,
        }
    }
}

/// Every task's state after the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerState {
    pub tasks: BTreeMap<TaskName, TaskState>,
}

impl LedgerState {
    /// One task's state; `None` when the ledger never mentions it.
    pub fn task(&self, name: &TaskName) -> Option<&TaskState> {
        self.tasks.get(name)
    }
}

/// One task's state after the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskState {
    /// The latest scheduled slot that is done: finished, skipped, or given up after retries.
    /// Slots at or before it never run.
    pub done_through: Option<Timestamp>,
    /// The latest finished run, manual or scheduled.
    pub last_outcome: Option<Finished>,
    /// Runs started and not finished, in start order.
    pub open: Vec<OpenRun>,
    /// A scheduled slot whose run failed and will be retried.
    pub retry: Option<PendingRetry>,
    pub stopped: Option<Stop>,
}

/// A finished run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub slot: Timestamp,
    pub run: String,
    pub manual: bool,
    pub outcome: SlotOutcome,
    pub at: Timestamp,
}

/// A run started and not finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRun {
    pub slot: Timestamp,
    pub run: String,
    pub manual: bool,
    pub coalesced: u32,
    pub at: Timestamp,
}

/// A failed scheduled slot: how many of its runs failed, and when the last one ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRetry {
    pub slot: Timestamp,
    pub failures: u32,
    pub last_failed_at: Timestamp,
}

/// Why and in which state of its entry a task stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub reason: String,
    pub fingerprint: String,
    pub at: Timestamp,
}

/// The waits before the retries of a failed slot; after the last, the slot is given up.
pub const BACKOFF: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(5 * 60),
    Duration::from_secs(15 * 60),
];

/// What to do next for one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing until `until` (the next slot, or the end of a retry's backoff); plan again then.
    Wait { until: Timestamp },
    /// Run `slot` now; `coalesced` missed slots fold into it.
    Run { slot: Timestamp, coalesced: u32 },
    /// Record these due slots as skipped, then plan again.
    Skip {
        from: Timestamp,
        to: Timestamp,
        count: u32,
        reason: String,
    },
    /// A run is open: still running, or left open by a perch that stopped (finish it as
    /// `Interrupted`).
    Running { run: String, slot: Timestamp },
    /// The task is stopped. `entry_changed`: its entry differs from when it stopped, so it may
    /// be resumed.
    Stopped { reason: String, entry_changed: bool },
    /// `enabled: false`.
    Disabled,
    /// The schedule never fires again.
    Exhausted,
}

/// How late the one due slot of a `missed: skip` task may be and still run.
pub const ON_TIME: Duration = MIN_INTERVAL;

/// Folds ledger records, in file order, into every task's state.
pub fn reduce(records: impl IntoIterator<Item = LedgerRecord>) -> LedgerState {
    let mut state = LedgerState::default();
    for record in records {
        state.apply(record);
    }
    state
}

impl LedgerState {
    /// Folds one more record in.
    pub fn apply(&mut self, record: LedgerRecord) {
        self.tasks
            .entry(record.task().clone())
            .or_default()
            .apply(record);
    }
}

impl TaskState {
    fn apply(&mut self, record: LedgerRecord) {
        match record {
            LedgerRecord::SlotStarted {
                slot,
                run,
                manual,
                coalesced,
                at,
                ..
            } => self.open.push(OpenRun {
                slot,
                run,
                manual,
                coalesced,
                at,
            }),
            LedgerRecord::SlotFinished {
                slot,
                run,
                outcome,
                at,
                ..
            } => {
                let manual = match self.open.iter().position(|open| open.run == run) {
                    Some(index) => self.open.remove(index).manual,
                    None => false,
                };
                if !manual {
                    self.finish_scheduled(slot, &outcome, at);
                }
                let finished = Finished {
                    slot,
                    run,
                    manual,
                    outcome,
                    at,
                };
                self.last_outcome = Some(finished);
            }
            LedgerRecord::SlotsSkipped { to, .. } => self.mark_done(to),
            LedgerRecord::TaskStopped {
                reason,
                fingerprint,
                at,
                ..
            } => {
                self.stopped = Some(Stop {
                    reason,
                    fingerprint,
                    at,
                });
            }
            LedgerRecord::TaskResumed { .. } => {
                self.stopped = None;
            }
        }
    }

    fn finish_scheduled(&mut self, slot: Timestamp, outcome: &SlotOutcome, at: Timestamp) {
        match outcome {
            SlotOutcome::Failed { .. } => {
                if self.done_through.is_some_and(|done| done >= slot) {
                    return;
                }
                let failures = match &self.retry {
                    Some(retry) if retry.slot == slot => retry.failures.saturating_add(1),
                    _ => 1,
                };
                if failures as usize > BACKOFF.len() {
                    self.mark_done(slot);
                } else {
                    self.retry = Some(PendingRetry {
                        slot,
                        failures,
                        last_failed_at: at,
                    });
                }
            }
            SlotOutcome::Invalid { .. }
            | SlotOutcome::Silent
            | SlotOutcome::Message { .. }
            | SlotOutcome::Steer { .. }
            | SlotOutcome::Skipped { .. }
            | SlotOutcome::Interrupted { .. } => self.mark_done(slot),
        }
    }

    fn mark_done(&mut self, slot: Timestamp) {
        if self.done_through.is_none_or(|done| done < slot) {
            self.done_through = Some(slot);
        }
        if self.retry.as_ref().is_some_and(|retry| retry.slot <= slot) {
            self.retry = None;
        }
    }
}

/// The next step for `task`: `state` is its ledger state, `first_seen` when the shell first
/// loaded it (a task without history never fires for slots before that). The module
/// documentation lists the rules.
pub fn plan(
    task: &HeartbeatTask,
    state: Option<&TaskState>,
    first_seen: Timestamp,
    now: Timestamp,
) -> Plan {
    if !task.enabled {
        return Plan::Disabled;
    }
    let fresh = TaskState::default();
    let state = state.unwrap_or(&fresh);
    if let Some(stop) = &state.stopped {
        return Plan::Stopped {
            reason: stop.reason.clone(),
            entry_changed: stop.fingerprint != task.fingerprint(),
        };
    }
    if let Some(open) = state.open.first() {
        return Plan::Running {
            run: open.run.clone(),
            slot: open.slot,
        };
    }
    let mut after = state.done_through.unwrap_or(first_seen);
    if let Some(retry) = state.retry.as_ref().filter(|retry| retry.slot > after) {
        let wait = BACKOFF
            .get(retry.failures.saturating_sub(1) as usize)
            .copied()
            .unwrap_or(Duration::ZERO);
        let retry_at = later_by(retry.last_failed_at, wait);
        let newer_first =
            next_slot(&task.schedule, retry.slot).is_some_and(|next| next <= retry_at.max(now));
        if !newer_first {
            if retry_at > now {
                return Plan::Wait { until: retry_at };
            }
            if in_hours(task, now) {
                return Plan::Run {
                    slot: retry.slot,
                    coalesced: 0,
                };
            }
        }
        after = retry.slot;
    }
    let due = slots_between(&task.schedule, after, now);
    let (Some(&first), Some(&latest)) = (due.first(), due.last()) else {
        return wait_for_next_slot(task, after);
    };
    let count = |slots: &[Timestamp]| u32::try_from(slots.len()).unwrap_or(u32::MAX);
    let outside_hours = || match &task.active_hours {
        Some(hours) => format!("outside active hours {hours} ({})", task.tz),
        None => String::new(),
    };
    if due.len() >= SLOT_LIMIT {
        return Plan::Skip {
            from: first,
            to: latest,
            count: count(&due),
            reason: format!("missed: more than {SLOT_LIMIT} slots came due"),
        };
    }
    let earlier = &due[..due.len() - 1];
    match task.missed {
        Missed::RunOnce if in_hours(task, latest) => Plan::Run {
            slot: latest,
            coalesced: inside_count(task, earlier),
        },
        Missed::RunOnce => Plan::Skip {
            from: first,
            to: latest,
            count: count(&due),
            reason: outside_hours(),
        },
        Missed::Skip if !earlier.is_empty() => {
            let missed = inside_count(task, earlier);
            Plan::Skip {
                from: first,
                to: earlier[earlier.len() - 1],
                count: count(earlier),
                reason: if missed == 0 {
                    outside_hours()
                } else {
                    format!("missed: {missed} slots came due while the task could not run")
                },
            }
        }
        Missed::Skip if !in_hours(task, latest) => Plan::Skip {
            from: latest,
            to: latest,
            count: 1,
            reason: outside_hours(),
        },
        Missed::Skip => {
            let late = (now - latest).to_std().unwrap_or_default();
            if late > ON_TIME {
                Plan::Skip {
                    from: latest,
                    to: latest,
                    count: 1,
                    reason: format!("missed: {} late", format_duration(late)),
                }
            } else {
                Plan::Run {
                    slot: latest,
                    coalesced: 0,
                }
            }
        }
    }
}

fn in_hours(task: &HeartbeatTask, at: Timestamp) -> bool {
    task.active_hours
        .as_ref()
        .is_none_or(|hours| in_active_hours(hours, task.tz, at))
}

fn inside_count(task: &HeartbeatTask, slots: &[Timestamp]) -> u32 {
    let inside = slots.iter().filter(|slot| in_hours(task, **slot)).count();
    u32::try_from(inside).unwrap_or(u32::MAX)
}

/// Waits for the next slot inside active hours, looking at most [`SLOT_LIMIT`] slots ahead.
fn wait_for_next_slot(task: &HeartbeatTask, after: Timestamp) -> Plan {
    let Some(mut slot) = next_slot(&task.schedule, after) else {
        return Plan::Exhausted;
    };
    for _ in 1..SLOT_LIMIT {
        if in_hours(task, slot) {
            break;
        }
        match next_slot(&task.schedule, slot) {
            Some(next) => slot = next,
            None => break,
        }
    }
    Plan::Wait { until: slot }
}

fn later_by(at: Timestamp, wait: Duration) -> Timestamp {
    TimeDelta::from_std(wait)
        .ok()
        .and_then(|delta| at.checked_add_signed(delta))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests;
