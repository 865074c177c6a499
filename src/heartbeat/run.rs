//! One heartbeat run, carried out through its [`Host`]: the task's lane, the spend cap, the
//! check and the judged turn, then the verdict's effect (a `Message:` posted to the task's
//! target, a `Steer:` into its steer lane, nothing for a dry run), the outcome noted in the lane
//! and counted. [`SchedulerSetup::hosted`] gives the scheduler runs like this.

use super::host::{Host, HostLane, Steer};
use super::scheduler::{OnStop, RunJob, SchedulerSetup};
use super::turn::{Turned, take_turn};
use super::{Job, JobEnd, Mode};
use crate::agent::AgentDir;
use crate::host::clock::Clock;
use crate::store::outbox::DeliveryLane;
use perch_core::alert::AlertKind;
use perch_core::heartbeat::{HeartbeatEnv, SlotOutcome, Verdict};
use perch_core::id::OperationId;
use perch_core::log::{HeartbeatNote, Note, RunMode};
use perch_core::name::TaskName;
use perch_core::origin::Relay;
use std::sync::Arc;
use std::time::Duration;

/// Runs `job` through `host`. The outcome is left in the task's lane as a note and, unless the
/// run is a dry run, counted.
async fn run(host: &dyn Host, job: &Job) -> JobEnd {
    let name = job.lane();
    let lane = host
        .open_lane(&name, job.origin(), job.task.model.as_ref())
        .await;
    let end = match &lane {
        Ok(lane) => turn_and_verdict(host, lane.as_ref(), job).await,
        Err(reason) => JobEnd::early(SlotOutcome::Failed {
            reason: reason.clone(),
        }),
    };
    if let Ok(lane) = &lane
        && let Err(error) = lane.note(outcome_note(job, &end)).await
    {
        tracing::warn!(
            task = %job.task.name,
            "heartbeat {}: the outcome was not noted in its lane: {error}",
            job.task.name
        );
    }
    if job.mode != Mode::DryRun {
        host.count_outcome(&job.task.name, &end.outcome);
    }
    end
}

/// The spend cap, the check and the judged turn, then what the verdict does.
async fn turn_and_verdict(host: &dyn Host, lane: &dyn HostLane, job: &Job) -> JobEnd {
    if let Err(reason) = host.may_spend().await {
        return JobEnd::early(SlotOutcome::Skipped { reason });
    }
    let (verdict, reply, op) = match take_turn(host, lane, job).await {
        Turned::Ended(end) => return end,
        Turned::Verdict { verdict, reply, op } => (verdict, reply, op),
    };
    let outcome = match job.mode {
        Mode::DryRun => dry_outcome(job, verdict),
        Mode::Scheduled | Mode::Manual => carry_out(host, job, verdict, op).await,
    };
    JobEnd {
        outcome,
        reply,
        stop: None,
    }
}

/// A verdict's effect: a message posted to the task's target (kept in the outcome only, when the
/// task has none; its settlement goes to the task's lane as the reply of `op`, the run that gave
/// the verdict), a steer into its steer lane.
async fn carry_out(host: &dyn Host, job: &Job, verdict: Verdict, op: OperationId) -> SlotOutcome {
    match verdict {
        Verdict::Silence => SlotOutcome::Silent,
        Verdict::Message(text) => match &job.task.delivery {
            None => SlotOutcome::Message {
                text,
                target: String::new(),
                delivery: String::new(),
            },
            Some(target) => match host
                .post(target, &text, DeliveryLane::new(job.lane(), Some(op)))
                .await
            {
                Ok(delivery) => SlotOutcome::Message {
                    text,
                    target: target.to_string(),
                    delivery,
                },
                Err(reason) => SlotOutcome::Failed {
                    reason: format!("the message to {target} was not delivered: {reason}"),
                },
            },
        },
        Verdict::Steer(text) => {
            let into = job.task.steer_lane();
            let relay = Relay::HeartbeatSteer {
                task: job.task.name.clone(),
                slot: job.slot,
            };
            let steer = Steer {
                into: into.clone(),
                origin: job.origin(),
                relay,
                text: text.clone(),
            };
            match host.steer(steer).await {
                Ok(()) => SlotOutcome::Steer { text, lane: into },
                Err(reason) => SlotOutcome::Failed { reason },
            }
        }
    }
}

/// The outcome a verdict would have, carried out nowhere: a dry run's.
fn dry_outcome(job: &Job, verdict: Verdict) -> SlotOutcome {
    match verdict {
        Verdict::Silence => SlotOutcome::Silent,
        Verdict::Message(text) => SlotOutcome::Message {
            text,
            target: job
                .task
                .delivery
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            delivery: String::new(),
        },
        Verdict::Steer(text) => SlotOutcome::Steer {
            text,
            lane: job.task.steer_lane(),
        },
    }
}

/// The note a run's outcome leaves in the task's lane.
fn outcome_note(job: &Job, end: &JobEnd) -> Note {
    Note::HeartbeatOutcome(HeartbeatNote {
        task: job.task.name.clone(),
        slot: job.slot,
        run: job.run.clone(),
        mode: Some(match job.mode {
            Mode::Scheduled => RunMode::Scheduled,
            Mode::Manual => RunMode::Manual,
            Mode::DryRun => RunMode::DryRun,
        }),
        outcome: end.outcome.clone(),
    })
}

/// The owner's alert when a task stops until it is resumed.
fn stopped_alert(task: &TaskName, reason: &str) -> String {
    format!(
        "heartbeat {task} stopped: {reason}. It stays stopped until its entry in HEARTBEAT.yml \
         changes or `perch heartbeat resume {task}`."
    )
}

impl SchedulerSetup {
    /// A scheduler whose runs go through `host`: each is tracked by the host's shutdown drain
    /// while it runs, and a task that stops is reported to the owner.
    pub fn hosted(
        host: Arc<dyn Host>,
        dir: AgentDir,
        env: HeartbeatEnv,
        clock: Clock,
        reload_every: Duration,
        scheduled: bool,
    ) -> SchedulerSetup {
        let runs = Arc::clone(&host);
        let run_job: RunJob = Arc::new(move |job: Job| {
            let host = Arc::clone(&runs);
            let running = host.track_run();
            Box::pin(async move {
                let end = run(host.as_ref(), &job).await;
                drop(running);
                end
            })
        });
        let on_stop: OnStop = Arc::new(move |task, reason| {
            host.alert(AlertKind::HeartbeatStopped, stopped_alert(task, reason));
        });
        SchedulerSetup {
            dir,
            env,
            clock,
            reload_every,
            run_job,
            on_stop: Some(on_stop),
            scheduled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::BoxFuture;
    use crate::heartbeat::{Heartbeats, ledger, scheduler};
    use crate::lane::{Finished, Input, LaneError};
    use crate::sandbox::{Captured, Command, End, Output, SandboxError};
    use perch_core::heartbeat::{
        ModelFailure, Target, TargetSpec, VERDICT_RULE, parse_heartbeat_file,
    };
    use perch_core::id::OperationId;
    use perch_core::log::{Outcome, Trigger};
    use perch_core::name::{ChannelName, LaneName, ModelRef, RoomAlias};
    use perch_core::prompt::Origin;
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;
    use tokio_util::task::task_tracker::TaskTrackerToken;

    /// Everything the fake host was asked, and what it answers.
    #[derive(Default)]
    struct Recorded {
        /// How the lane's runs end, in order; a run past the last fails.
        replies: VecDeque<Finished>,
        /// Why a lane does not open, when set.
        lane_refused: Option<String>,
        /// Why the spend cap refuses, when set.
        spend_refused: Option<String>,
        /// How the check command exits, when the task has one.
        check_exit: i32,
        /// Why a post fails, when set.
        post_refused: Option<String>,
        opened: Vec<(LaneName, Origin, Option<ModelRef>)>,
        sent: Vec<(LaneName, Input)>,
        notes: Vec<(LaneName, Note)>,
        commands: usize,
        posts: Vec<(String, String)>,
        steers: Vec<Steer>,
        alerts: Vec<(AlertKind, String)>,
        counted: Vec<(String, SlotOutcome)>,
    }

    /// A host with no service behind it.
    #[derive(Clone, Default)]
    struct FakeHost {
        /// A std lock: held only to read or record, never across an await.
        recorded: Arc<Mutex<Recorded>>,
        tracker: TaskTracker,
    }

    impl FakeHost {
        fn answering(replies: impl IntoIterator<Item = Finished>) -> FakeHost {
            let host = FakeHost::default();
            host.with(|recorded| recorded.replies = replies.into_iter().collect());
            host
        }

        fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
            f(&mut self.recorded.lock().unwrap())
        }
    }

    struct FakeLane {
        name: LaneName,
        /// A std lock: held only to read or record, never across an await.
        recorded: Arc<Mutex<Recorded>>,
    }

    impl HostLane for FakeLane {
        fn send(&self, input: Input) -> BoxFuture<'_, Result<Finished, LaneError>> {
            let mut recorded = self.recorded.lock().unwrap();
            recorded.sent.push((self.name.clone(), input));
            let reply = recorded.replies.pop_front().ok_or(LaneError::Closed);
            Box::pin(async move { reply })
        }

        fn note(&self, note: Note) -> BoxFuture<'_, Result<(), LaneError>> {
            self.recorded
                .lock()
                .unwrap()
                .notes
                .push((self.name.clone(), note));
            Box::pin(async { Ok(()) })
        }
    }

    impl Host for FakeHost {
        fn open_lane<'a>(
            &'a self,
            name: &'a LaneName,
            origin: Origin,
            model: Option<&'a ModelRef>,
        ) -> BoxFuture<'a, Result<Box<dyn HostLane>, String>> {
            let opened = self.with(|recorded| {
                recorded.opened.push((name.clone(), origin, model.cloned()));
                match &recorded.lane_refused {
                    Some(reason) => Err(reason.clone()),
                    None => Ok(Box::new(FakeLane {
                        name: name.clone(),
                        recorded: Arc::clone(&self.recorded),
                    }) as Box<dyn HostLane>),
                }
            });
            Box::pin(async move { opened })
        }

        fn run_command(&self, _command: Command) -> BoxFuture<'_, Result<Output, SandboxError>> {
            let code = self.with(|recorded| {
                recorded.commands += 1;
                recorded.check_exit
            });
            Box::pin(async move {
                Ok(Output {
                    stdout: Captured::complete(""),
                    stderr: Captured::complete(""),
                    end: End::Exited(code),
                })
            })
        }

        fn may_spend(&self) -> BoxFuture<'_, Result<(), String>> {
            let verdict = self.with(|recorded| match &recorded.spend_refused {
                Some(reason) => Err(reason.clone()),
                None => Ok(()),
            });
            Box::pin(async move { verdict })
        }

        fn post<'a>(
            &'a self,
            target: &'a Target,
            text: &'a str,
            _lane: DeliveryLane,
        ) -> BoxFuture<'a, Result<String, String>> {
            let posted = self.with(|recorded| {
                recorded.posts.push((target.to_string(), text.to_owned()));
                match &recorded.post_refused {
                    Some(reason) => Err(reason.clone()),
                    None => Ok(format!("delivery-{}", recorded.posts.len())),
                }
            });
            Box::pin(async move { posted })
        }

        fn steer(&self, steer: Steer) -> BoxFuture<'_, Result<(), String>> {
            self.with(|recorded| recorded.steers.push(steer));
            Box::pin(async { Ok(()) })
        }

        fn alert(&self, kind: AlertKind, text: String) {
            self.with(|recorded| recorded.alerts.push((kind, text)));
        }

        fn count_outcome(&self, task: &TaskName, outcome: &SlotOutcome) {
            self.with(|recorded| recorded.counted.push((task.to_string(), outcome.clone())));
        }

        fn track_run(&self) -> TaskTrackerToken {
            self.tracker.token()
        }
    }

    fn env() -> HeartbeatEnv {
        HeartbeatEnv {
            host_tz: chrono_tz::Tz::UTC,
            targets: vec![TargetSpec {
                channel: ChannelName::try_from("ops").unwrap(),
                room: RoomAlias::try_from("standup").unwrap(),
            }],
            models: Vec::new(),
            channels_on_disk: None,
        }
    }

    const FILE: &str = r#"tasks:
  - name: digest
    prompt: Post the stand-up digest.
    every: 1h
    delivery: ops:standup
  - name: watch
    prompt: Watch the pull requests.
    every: 1h
    lane: ops-room
  - name: gate
    prompt: Only when there is mail.
    every: 1h
    check: test -n "$(ls /workspace/mail)"
"#;

    fn job(task: &str, mode: Mode) -> Job {
        let file = parse_heartbeat_file(FILE, &env()).unwrap();
        let task = file
            .tasks
            .into_iter()
            .find(|t| t.name.as_str() == task)
            .unwrap();
        Job {
            task,
            slot: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            run: "run-1".into(),
            coalesced: 0,
            last: None,
            mode,
        }
    }

    fn completed(text: &str) -> Finished {
        Finished {
            op: OperationId::from_bytes([1; 16]),
            outcome: Outcome::Completed,
            text: text.into(),
            model_failure: None,
        }
    }

    fn failed(reason: &str, model_failure: Option<ModelFailure>) -> Finished {
        Finished {
            op: OperationId::from_bytes([2; 16]),
            outcome: Outcome::Failed {
                reason: reason.into(),
            },
            text: String::new(),
            model_failure,
        }
    }

    fn lane(name: &str) -> LaneName {
        LaneName::try_from(name).unwrap()
    }

    /// The heartbeat note `note` is.
    fn noted(note: &Note) -> &HeartbeatNote {
        match note {
            Note::HeartbeatOutcome(note) => note,
            other => panic!("not a heartbeat outcome: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_message_verdict_is_posted_to_the_target_noted_and_counted() {
        let host = FakeHost::answering([completed("Message: Stand-up at ten.")]);
        let end = run(&host, &job("digest", Mode::Scheduled)).await;

        let message = SlotOutcome::Message {
            text: "Stand-up at ten.".into(),
            target: "ops:standup".into(),
            delivery: "delivery-1".into(),
        };
        assert_eq!(
            end,
            JobEnd {
                outcome: message.clone(),
                reply: "Message: Stand-up at ten.".into(),
                stop: None,
            }
        );
        host.with(|recorded| {
            assert_eq!(
                recorded.posts,
                vec![("ops:standup".to_owned(), "Stand-up at ten.".to_owned())]
            );
            let (opened, origin, model) = &recorded.opened[0];
            assert_eq!(opened, &lane("heartbeat-digest"));
            assert_eq!(origin.channel, "heartbeat");
            assert_eq!(origin.room.as_deref(), Some("digest"));
            assert_eq!(model, &None);
            let (_, input) = &recorded.sent[0];
            assert!(input.fresh, "a run without continue: starts fresh");
            assert!(input.text.starts_with("[heartbeat digest for "));
            assert!(input.text.ends_with(VERDICT_RULE));
            assert_eq!(
                input.trigger,
                Trigger::Heartbeat {
                    task: TaskName::try_from("digest").unwrap(),
                    slot: job("digest", Mode::Scheduled).slot,
                    coalesced: 0,
                }
            );
            let (noted_in, note) = &recorded.notes[0];
            assert_eq!(noted_in, &lane("heartbeat-digest"));
            assert_eq!(
                note,
                &Note::HeartbeatOutcome(HeartbeatNote {
                    task: TaskName::try_from("digest").unwrap(),
                    slot: job("digest", Mode::Scheduled).slot,
                    run: "run-1".into(),
                    mode: Some(RunMode::Scheduled),
                    outcome: message.clone(),
                })
            );
            assert_eq!(recorded.counted, vec![("digest".to_owned(), message)]);
            assert!(recorded.steers.is_empty());
        });
    }

    #[tokio::test]
    async fn a_steer_verdict_steers_the_named_lane_and_posts_nothing() {
        let host = FakeHost::answering([completed("Steer: Review PR 7 before noon.")]);
        let end = run(&host, &job("watch", Mode::Manual)).await;

        assert_eq!(
            end.outcome,
            SlotOutcome::Steer {
                text: "Review PR 7 before noon.".into(),
                lane: lane("ops-room"),
            }
        );
        host.with(|recorded| {
            let steer = &recorded.steers[0];
            assert_eq!(recorded.steers.len(), 1);
            assert_eq!(steer.into, lane("ops-room"));
            assert_eq!(steer.origin.room.as_deref(), Some("watch"));
            assert_eq!(
                steer.relay,
                Relay::HeartbeatSteer {
                    task: TaskName::try_from("watch").unwrap(),
                    slot: job("watch", Mode::Manual).slot,
                }
            );
            assert_eq!(
                steer.text, "Review PR 7 before noon.",
                "the text is the verdict's; where it comes from is the relay's to say"
            );
            assert!(recorded.posts.is_empty());
            // The turn itself ran in the task's own lane, not the one it steered.
            assert_eq!(recorded.sent[0].0, lane("heartbeat-watch"));
        });
    }

    #[tokio::test]
    async fn a_post_that_fails_fails_the_run_with_the_reason_and_does_not_stop_the_task() {
        let host = FakeHost::answering([completed("Message: Stand-up at ten.")]);
        host.with(|recorded| {
            recorded.post_refused = Some("telegram refused it: chat not found".into());
        });
        let end = run(&host, &job("digest", Mode::Scheduled)).await;

        let failed = SlotOutcome::Failed {
            reason: "the message to ops:standup was not delivered: telegram refused it: chat \
                     not found"
                .into(),
        };
        assert_eq!(end.outcome, failed);
        assert_eq!(end.stop, None);
        host.with(|recorded| {
            assert_eq!(recorded.posts.len(), 1, "one post, not retried by the run");
            assert_eq!(
                recorded.counted,
                vec![("digest".to_owned(), failed.clone())]
            );
            assert_eq!(noted(&recorded.notes[0].1).outcome, failed);
        });
    }

    #[tokio::test]
    async fn only_a_spent_quota_or_a_refused_key_stops_the_task() {
        let table = [
            (Some(ModelFailure::QuotaExhausted), true),
            (Some(ModelFailure::AuthRejected), true),
            (Some(ModelFailure::Transient), false),
            (Some(ModelFailure::RequestRejected), false),
            (None, false),
        ];
        for (failure, stops) in table {
            let reason = "the provider said: insufficient credit (402)";
            let host = FakeHost::answering([failed(reason, failure)]);
            let end = run(&host, &job("digest", Mode::Scheduled)).await;
            assert_eq!(
                end.outcome,
                SlotOutcome::Failed {
                    reason: reason.into()
                },
                "{failure:?}"
            );
            assert_eq!(end.stop.is_some(), stops, "{failure:?}");
            host.with(|recorded| {
                assert!(recorded.posts.is_empty(), "{failure:?}");
                assert_eq!(
                    recorded.sent.len(),
                    1,
                    "no corrective retry after a failure"
                );
            });
        }
    }

    /// A scheduler over an agent whose `digest` runs every hour, answered by `host`, on
    /// `clock`; `scheduled` says whether its slots fire.
    fn out_of_credit_scheduler(
        host: &FakeHost,
        clock: crate::host::clock::Clock,
        scheduled: bool,
    ) -> (tempfile::TempDir, AgentDir, Heartbeats, CancellationToken) {
        let agent = tempfile::tempdir().unwrap();
        std::fs::write(agent.path().join("agent.lua"), "").unwrap();
        std::fs::write(agent.path().join("instructions.md"), "Be brief.").unwrap();
        std::fs::create_dir(agent.path().join("workspace")).unwrap();
        std::fs::write(agent.path().join("workspace/HEARTBEAT.yml"), FILE).unwrap();
        let dir = AgentDir::open(agent.path()).unwrap();
        let (opened, records) = ledger::Ledger::open(&dir, clock.clone()).unwrap();
        let setup = SchedulerSetup::hosted(
            Arc::new(host.clone()),
            dir.clone(),
            env(),
            clock,
            Duration::from_secs(60),
            scheduled,
        );
        let shutdown = CancellationToken::new();
        let heartbeats = scheduler::start(setup, opened, records, shutdown.clone());
        (agent, dir, heartbeats, shutdown)
    }

    const OUT_OF_CREDIT: &str = "the account is out of credit (402)";

    #[tokio::test(start_paused = true)]
    async fn an_out_of_credit_scheduled_run_stops_the_task_in_the_ledger_and_alerts_the_owner() {
        let reason = OUT_OF_CREDIT;
        let host = FakeHost::answering([failed(reason, Some(ModelFailure::QuotaExhausted))]);
        let start = tokio::time::Instant::now();
        let base = chrono::Utc::now();
        let clock = crate::host::clock::Clock::new(move || {
            base + chrono::TimeDelta::from_std(start.elapsed()).unwrap_or_default()
        });
        let (_agent, dir, heartbeats, shutdown) = out_of_credit_scheduler(&host, clock, true);
        let status = loop {
            let list = heartbeats.list().await.unwrap();
            let digest = list.tasks.iter().find(|row| row.name == "digest").unwrap();
            if digest.status.starts_with("stopped") {
                break digest.status.clone();
            }
            assert!(
                start.elapsed() < Duration::from_secs(3 * 3600),
                "the hourly slot fired and stopped the task: {}",
                digest.status
            );
            tokio::time::sleep(Duration::from_secs(60)).await;
        };
        assert_eq!(status, format!("stopped: {reason}"));
        host.with(|recorded| {
            assert_eq!(
                recorded.alerts,
                vec![(
                    AlertKind::HeartbeatStopped,
                    format!(
                        "heartbeat digest stopped: {reason}. It stays stopped until its entry \
                         in HEARTBEAT.yml changes or `perch heartbeat resume digest`."
                    )
                )]
            );
        });
        shutdown.cancel();
        let state = ledger::peek_ledger(&dir).unwrap();
        let stopped = state.task(&TaskName::try_from("digest").unwrap()).unwrap();
        assert!(stopped.stopped.is_some(), "the stop is in the ledger");
    }

    #[tokio::test]
    async fn an_out_of_credit_run_by_hand_leaves_the_task_scheduled_and_alerts_nobody() {
        let reason = OUT_OF_CREDIT;
        let host = FakeHost::answering([failed(reason, Some(ModelFailure::QuotaExhausted))]);
        let clock = crate::host::clock::system_clock();
        let (_agent, dir, heartbeats, shutdown) = out_of_credit_scheduler(&host, clock, false);
        let end = heartbeats.run_now("digest", false).await.unwrap();
        assert_eq!(
            end.outcome,
            SlotOutcome::Failed {
                reason: reason.into()
            }
        );
        assert_eq!(end.stop, None, "a run by hand stops nothing");
        let list = heartbeats.list().await.unwrap();
        let digest = list.tasks.iter().find(|row| row.name == "digest").unwrap();
        assert_eq!(digest.status, "scheduled");
        host.with(|recorded| assert!(recorded.alerts.is_empty()));
        assert!(host.tracker.is_empty(), "the run let go of the drain");
        shutdown.cancel();
        let state = ledger::peek_ledger(&dir).unwrap();
        let task = state.task(&TaskName::try_from("digest").unwrap()).unwrap();
        assert!(task.stopped.is_none(), "no stop in the ledger");
    }

    #[tokio::test]
    async fn a_dry_run_delivers_nothing_counts_nothing_and_notes_in_its_own_lane() {
        let host = FakeHost::answering([completed("Message: Stand-up at ten.")]);
        let end = run(&host, &job("digest", Mode::DryRun)).await;

        assert_eq!(
            end.outcome,
            SlotOutcome::Message {
                text: "Stand-up at ten.".into(),
                target: "ops:standup".into(),
                delivery: String::new(),
            }
        );
        host.with(|recorded| {
            assert!(recorded.posts.is_empty());
            assert!(recorded.counted.is_empty());
            assert_eq!(recorded.opened[0].0, lane("heartbeat-digest-dry-run"));
            assert_eq!(recorded.notes[0].0, lane("heartbeat-digest-dry-run"));
            assert_eq!(noted(&recorded.notes[0].1).mode, Some(RunMode::DryRun));
        });
    }

    #[tokio::test]
    async fn the_spend_cap_and_a_failing_check_skip_the_slot_before_any_turn() {
        let capped = FakeHost::answering([completed("SILENCE")]);
        capped.with(|recorded| recorded.spend_refused = Some("the daily cap is spent".into()));
        let end = run(&capped, &job("gate", Mode::Scheduled)).await;
        assert_eq!(
            end.outcome,
            SlotOutcome::Skipped {
                reason: "the daily cap is spent".into()
            }
        );
        capped.with(|recorded| {
            assert_eq!(recorded.commands, 0, "the check does not run past the cap");
            assert!(recorded.sent.is_empty());
        });

        let gated = FakeHost::answering([completed("SILENCE")]);
        gated.with(|recorded| recorded.check_exit = 1);
        let end = run(&gated, &job("gate", Mode::Scheduled)).await;
        assert_eq!(
            end.outcome,
            SlotOutcome::Skipped {
                reason: "the check exited 1".into()
            }
        );
        gated.with(|recorded| {
            assert_eq!(recorded.commands, 1);
            assert!(recorded.sent.is_empty(), "no turn after a failing check");
        });

        let open = FakeHost::answering([completed("SILENCE")]);
        let end = run(&open, &job("gate", Mode::Scheduled)).await;
        assert_eq!(end.outcome, SlotOutcome::Silent);
        open.with(|recorded| assert_eq!(recorded.sent.len(), 1));
    }

    #[tokio::test]
    async fn a_lane_that_does_not_open_fails_the_run_with_the_reason() {
        let host = FakeHost::answering([]);
        host.with(|recorded| recorded.lane_refused = Some("too many open files".into()));
        let end = run(&host, &job("digest", Mode::Scheduled)).await;
        let failed = SlotOutcome::Failed {
            reason: "too many open files".into(),
        };
        assert_eq!(end, JobEnd::early(failed.clone()));
        host.with(|recorded| {
            assert!(recorded.notes.is_empty());
            assert_eq!(recorded.counted, vec![("digest".to_owned(), failed)]);
        });
    }

    #[tokio::test]
    async fn an_invalid_reply_gets_one_correction_then_ends_invalid_and_posts_nothing() {
        let host = FakeHost::answering([completed("Sure, here it is."), completed("ok")]);
        let end = run(&host, &job("digest", Mode::Scheduled)).await;
        assert!(
            matches!(end.outcome, SlotOutcome::Invalid { .. }),
            "{:?}",
            end.outcome
        );
        assert_eq!(end.reply, "ok");
        host.with(|recorded| {
            assert_eq!(recorded.sent.len(), 2);
            assert!(
                !recorded.sent[1].1.fresh,
                "the correction continues the run"
            );
            assert_eq!(
                recorded.sent[1].1.trigger,
                Trigger::Correction {
                    task: TaskName::try_from("digest").unwrap(),
                    slot: job("digest", Mode::Scheduled).slot,
                    reason: perch_core::heartbeat::judge("Sure, here it is.")
                        .unwrap_err()
                        .reason,
                }
            );
            assert!(recorded.posts.is_empty());
        });
    }
}
