//! The turn a heartbeat run takes: the task's check in the machine, then the prompt in the
//! task's lane, its final reply judged as a verdict with one corrective retry, and whether a
//! failure stops the task.

use super::host::{Host, HostLane};
use super::listing::describe;
use super::{Job, JobEnd};
use crate::lane::Input;
use crate::sandbox::{Command, End};
use perch_core::heartbeat::{ModelFailure, SlotOutcome, Verdict, correction, judge, stops_task};
use perch_core::id::OperationId;
use perch_core::log::{Outcome, Trigger};
use std::time::Duration;

/// How long a task's check may run before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// What the model is told for one run: the task, when, the task's last outcome (a fresh run
/// has no other memory of it), and the verdict rule.
fn turn_prompt(job: &Job) -> String {
    let mut text = format!(
        "[heartbeat {} for {}{}]\n\n{}\n\n",
        job.task.name,
        job.slot.to_rfc3339(),
        if job.coalesced > 0 {
            format!(", standing in for {} missed runs", job.coalesced)
        } else {
            String::new()
        },
        job.task.prompt.trim()
    );
    if let Some(last) = &job.last {
        text.push_str(&format!(
            "Your last run of this task ({}) ended: {}.\n\n",
            last.at.to_rfc3339(),
            describe_for_model(&last.outcome)
        ));
    }
    text.push_str(perch_core::heartbeat::VERDICT_RULE);
    text
}

fn describe_for_model(outcome: &SlotOutcome) -> String {
    match outcome {
        SlotOutcome::Message { text, .. } => format!("you sent \"Message: {text}\""),
        SlotOutcome::Steer { text, .. } => format!("you steered: \"{text}\""),
        other => describe(other),
    }
}

/// The verdict of a turn, judged, with one corrective retry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Valid {
        verdict: Verdict,
        reply: String,
        op: OperationId,
    },
    Invalid {
        reason: String,
        reply: String,
    },
    /// The run failed; `model_failure` is the kind of the model's error when one failed it.
    Failed {
        reason: String,
        model_failure: Option<ModelFailure>,
    },
}

/// Sends the job's prompt to `lane` and judges the final reply; an invalid one gets one
/// corrective message naming the rule, and is judged again.
async fn judged_turn(lane: &dyn HostLane, job: &Job) -> Judged {
    let fresh = !job.task.continue_history;
    let mut input = Input {
        text: turn_prompt(job),
        consumes: Vec::new(),
        fresh,
        said: Vec::new(),
        trigger: Trigger::Heartbeat {
            task: job.task.name.clone(),
            slot: job.slot,
            coalesced: job.coalesced,
        },
    };
    let mut corrected = false;
    loop {
        let finished = match lane.send(input).await {
            Ok(finished) => finished,
            Err(error) => {
                return Judged::Failed {
                    reason: error.to_string(),
                    model_failure: None,
                };
            }
        };
        match finished.outcome {
            Outcome::Completed => {}
            Outcome::Cancelled => {
                return Judged::Failed {
                    reason: "the run was cancelled".into(),
                    model_failure: None,
                };
            }
            Outcome::Failed { reason } | Outcome::Interrupted { reason } => {
                return Judged::Failed {
                    reason,
                    model_failure: finished.model_failure,
                };
            }
        }
        match judge(&finished.text) {
            Ok(verdict) => {
                return Judged::Valid {
                    verdict,
                    reply: finished.text,
                    op: finished.op,
                };
            }
            Err(invalid) if corrected => {
                return Judged::Invalid {
                    reason: invalid.reason,
                    reply: finished.text,
                };
            }
            Err(invalid) => {
                corrected = true;
                input = Input {
                    text: correction(&invalid),
                    consumes: Vec::new(),
                    fresh: false,
                    said: Vec::new(),
                    trigger: Trigger::Correction {
                        task: job.task.name.clone(),
                        slot: job.slot,
                        reason: invalid.reason,
                    },
                };
            }
        }
    }
}

/// What a turn came to before its verdict takes effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Turned {
    /// Nothing to deliver or steer: skipped by its check, failed, or invalid.
    Ended(JobEnd),
    /// A valid verdict, for the caller to carry out.
    /// `op` is the run that gave the verdict.
    Verdict {
        verdict: Verdict,
        reply: String,
        op: OperationId,
    },
}

/// The task's check, then the judged turn in `lane`. A failure stops the task when the kind of
/// the model's error says it will not go away by itself.
pub(super) async fn take_turn(host: &dyn Host, lane: &dyn HostLane, job: &Job) -> Turned {
    if let Some(check) = &job.task.check {
        match run_check(host, check).await {
            Ok(None) => {}
            Ok(Some(reason)) => {
                return Turned::Ended(JobEnd::early(SlotOutcome::Skipped { reason }));
            }
            Err(reason) => return Turned::Ended(JobEnd::early(SlotOutcome::Failed { reason })),
        }
    }
    match judged_turn(lane, job).await {
        Judged::Failed {
            reason,
            model_failure,
        } => Turned::Ended(JobEnd {
            stop: stops_task(model_failure).then(|| reason.clone()),
            outcome: SlotOutcome::Failed { reason },
            reply: String::new(),
        }),
        Judged::Invalid { reason, reply } => Turned::Ended(JobEnd {
            outcome: SlotOutcome::Invalid { reason },
            reply,
            stop: None,
        }),
        Judged::Valid { verdict, reply, op } => Turned::Verdict { verdict, reply, op },
    }
}

/// Runs a task's check in the host's machine: `Ok(None)` when it passed (exit 0),
/// `Ok(Some(why))` when the slot is to be skipped.
async fn run_check(host: &dyn Host, check: &str) -> Result<Option<String>, String> {
    let mut command = Command::shell(check);
    command.timeout = CHECK_TIMEOUT;
    let output = host
        .run_command(command)
        .await
        .map_err(|error| format!("the check could not run: {error}"))?;
    match output.end {
        End::Exited(0) => Ok(None),
        End::Exited(code) => Ok(Some(format!("the check exited {code}"))),
        End::TimedOut(after) => Err(format!(
            "the check did not finish within {} s",
            after.as_secs()
        )),
        end => Err(format!("the check ended: {end:?}")),
    }
}
