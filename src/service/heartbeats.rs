//! What the service does for heartbeats: starts the scheduler, runs a job in its lane, and carries
//! out the verdict (a message through the outbox, a steer into a lane).

use super::Service;
use crate::heartbeat::{self, Job, JobEnd, Ledger, Mode, SchedulerSetup, Turned};
use crate::lane::{Input, Lane, Steered};
use perch_core::alert::AlertKind;
use perch_core::heartbeat::{SlotOutcome, Target, Verdict as HeartbeatVerdict};
use perch_core::name::LaneName;
use perch_core::prompt::Origin;
use perch_core::spend::RunKind;
use std::sync::Arc;
use std::time::Duration;

impl Service {
    /// Starts the heartbeat scheduler over the ledger in `.perch/heartbeats/`.
    pub(super) fn start_heartbeats(
        self: &Arc<Self>,
        reload_every: Duration,
        scheduled: bool,
    ) -> Result<(), String> {
        let agent = self.runtime.agent();
        let env = heartbeat::heartbeat_env(agent, heartbeat::host_tz());
        let (ledger, records) =
            Ledger::open(&agent.dir, self.clock.clone()).map_err(|error| error.to_string())?;
        let service = Arc::clone(self);
        let setup = SchedulerSetup {
            dir: agent.dir.clone(),
            env,
            clock: self.clock.clone(),
            reload_every,
            run_job: Arc::new(move |job: Job| {
                let service = Arc::clone(&service);
                // Counted with the conversations, so a shutdown lets it finish (bounded by the
                // drain) before the machine stops.
                let running = service.tasks.token();
                Box::pin(async move {
                    let end = service.heartbeat(job).await;
                    drop(running);
                    end
                })
            }),
            on_stop: Some({
                let alerts = self.alerts.clone();
                Arc::new(move |task, reason| {
                    alerts.alert(
                        AlertKind::HeartbeatStopped,
                        format!(
                            "heartbeat {task} stopped: {reason}. It stays stopped until its entry \
                             in HEARTBEAT.yml changes or `perch heartbeat resume {task}`."
                        ),
                    );
                })
            }),
            scheduled,
        };
        let heartbeats = heartbeat::start(setup, ledger, records, self.shutdown.clone());
        let _ = self.heartbeats.set(heartbeats);
        Ok(())
    }

    /// One heartbeat run: the check, the judged turn in the task's lane, then the verdict's
    /// effect — a `Message:` through the outbox, a `Steer:` into its lane. The outcome is left in
    /// the lane as a note.
    async fn heartbeat(self: &Arc<Self>, job: Job) -> JobEnd {
        let lane_name = match job.mode {
            Mode::DryRun => job.task.name.dry_run_lane(),
            Mode::Scheduled | Mode::Manual => job.task.name.own_lane(),
        };
        let origin = Origin {
            channel: "heartbeat".into(),
            room: Some(job.task.name.to_string()),
            sender: None,
        };
        let lane = self.lane(&lane_name, origin, job.task.model.as_ref()).await;
        let end = match &lane {
            Ok(lane) => self.heartbeat_turn(lane, &job).await,
            Err(reason) => JobEnd {
                outcome: SlotOutcome::Failed {
                    reason: reason.clone(),
                },
                reply: String::new(),
                stop: None,
            },
        };
        if let Ok(lane) = lane
            && let Err(error) = lane
                .note("heartbeat_outcome", heartbeat::outcome_note(&job, &end))
                .await
        {
            tracing::warn!(
                task = %job.task.name,
                "heartbeat {}: the outcome was not noted in its lane: {error}",
                job.task.name
            );
        }
        if job.mode != Mode::DryRun {
            self.metrics
                .heartbeat_outcome(job.task.name.as_str(), &end.outcome);
        }
        end
    }

    async fn heartbeat_turn(self: &Arc<Self>, lane: &Lane, job: &Job) -> JobEnd {
        if let Err(reason) = self.runtime.spend().check(RunKind::Heartbeat).await {
            return JobEnd {
                outcome: SlotOutcome::Skipped { reason },
                reply: String::new(),
                stop: None,
            };
        }
        let (verdict, reply) = match heartbeat::take_turn(lane, self.runtime.machine(), job).await {
            Turned::Ended(end) => return end,
            Turned::Verdict { verdict, reply } => (verdict, reply),
        };
        let outcome = match verdict {
            _ if job.mode == Mode::DryRun => heartbeat::dry_outcome(job, verdict),
            HeartbeatVerdict::Silence => SlotOutcome::Silent,
            HeartbeatVerdict::Message(text) => match &job.task.delivery {
                None => SlotOutcome::Message {
                    text,
                    target: String::new(),
                    delivery: String::new(),
                },
                Some(target) => match self.post_to(target, &text).await {
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
            HeartbeatVerdict::Steer(text) => {
                let into = job.task.steer_lane();
                match self.steer_from_heartbeat(job, &into, &text).await {
                    Ok(()) => SlotOutcome::Steer { text, lane: into },
                    Err(reason) => SlotOutcome::Failed { reason },
                }
            }
        };
        JobEnd {
            outcome,
            reply,
            stop: None,
        }
    }

    /// Delivers a heartbeat's message to its target room, through the outbox, and waits until
    /// it is settled.
    pub(super) async fn post_to(&self, target: &Target, text: &str) -> Result<String, String> {
        let channel = self
            .channels
            .get(target.channel.as_str())
            .ok_or_else(|| format!("the channel {} is not connected", target.channel))?;
        let room = channel
            .loaded
            .config
            .rooms
            .get(&target.room)
            .ok_or_else(|| format!("{} declares no room {}", target.channel, target.room))?
            .clone();
        let ids = self
            .post(
                channel,
                &room,
                target.thread.as_deref(),
                None,
                text.to_owned(),
            )
            .await?
            .settled()
            .await?;
        Ok(ids.join(","))
    }

    /// Adds a heartbeat's steer to `into`: to its active run at the next tool boundary, or, when
    /// the lane is idle, as a run of its own. That run's reply stays in the lane: a heartbeat
    /// reaches a chat only through `Message:`.
    async fn steer_from_heartbeat(
        self: &Arc<Self>,
        job: &Job,
        into: &LaneName,
        text: &str,
    ) -> Result<(), String> {
        let origin = Origin {
            channel: "heartbeat".into(),
            room: Some(job.task.name.to_string()),
            sender: None,
        };
        let lane = self.lane(into, origin, None).await?;
        let text = format!("[steer from heartbeat {}]\n\n{text}", job.task.name);
        match lane.steer(text.clone()).await {
            Ok(Steered::Delivered) => Ok(()),
            Ok(Steered::Idle) => {
                let task = job.task.name.clone();
                tokio::spawn(async move {
                    let input = Input {
                        text,
                        consumes: Vec::new(),
                        fresh: false,
                    };
                    if let Err(error) = lane.send(input, None).await {
                        tracing::warn!(
                            task = %task,
                            "heartbeat {task}: the steered run failed: {error}"
                        );
                    }
                });
                Ok(())
            }
            Err(error) => Err(error.to_string()),
        }
    }
}
