//! What the service does for heartbeats: it starts the scheduler, and it is the runs' [`Host`]:
//! their lanes, their check's machine, the spend cap, posts through the outbox, steers, owner
//! alerts, metrics and the shutdown drain. The run itself is the heartbeat module's.

use super::Service;
use crate::channel::BoxFuture;
use crate::heartbeat::{self, Host, HostLane, Ledger, SchedulerSetup};
use crate::lane::{Input, Steered};
use crate::sandbox::{Command, Output, SandboxError};
use crate::store::outbox::DeliveryLane;
use perch_core::alert::AlertKind;
use perch_core::heartbeat::{SlotOutcome, Target};
use perch_core::log::Trigger;
use perch_core::name::{LaneName, ModelRef, TaskName};
use perch_core::origin::Relay;
use perch_core::prompt::Origin;
use perch_core::spend::RunKind;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

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
        let host: Arc<dyn Host> = Arc::clone(self) as Arc<dyn Host>;
        let setup = SchedulerSetup::hosted(
            host,
            agent.dir.clone(),
            env,
            self.clock.clone(),
            reload_every,
            scheduled,
        );
        let heartbeats = heartbeat::start(setup, ledger, records, self.shutdown.clone());
        let _ = self.heartbeats.set(heartbeats);
        Ok(())
    }

    /// Delivers a heartbeat's message to its target room, through the outbox, and waits until
    /// it is settled; how it settled is appended to `lane` when there is one.
    pub(super) async fn post_to(
        &self,
        target: &Target,
        text: &str,
        lane: Option<DeliveryLane>,
    ) -> Result<String, String> {
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
                lane,
            )
            .await?
            .settled()
            .await?;
        Ok(ids.join(","))
    }

    /// Adds a heartbeat's steer, relayed from `relay`, to `into`: to its active run at the next
    /// tool boundary, or, when the lane is idle, as a run of its own. That run's reply stays in
    /// the lane: a heartbeat reaches a chat only through `Message:`.
    async fn steer_from_heartbeat(
        &self,
        into: &LaneName,
        origin: Origin,
        relay: Relay,
        text: String,
    ) -> Result<(), String> {
        let lane = self.lane(into, origin, None).await?;
        match lane.steer_relayed(relay.clone(), text.clone()).await {
            Ok(Steered::Delivered) => Ok(()),
            Ok(Steered::Idle) => {
                let into = into.clone();
                let (shutdown, drain) = (self.shutdown.clone(), self.drain);
                // Among the service's tasks, so shutdown drains it like a conversation's run.
                self.tasks.spawn(async move {
                    let input = Input {
                        text,
                        consumes: Vec::new(),
                        fresh: false,
                        said: Vec::new(),
                        trigger: Trigger::relayed(&relay),
                    };
                    let run = crate::lane::Lane::send(&lane, input, None);
                    tokio::pin!(run);
                    let finished = tokio::select! {
                        finished = &mut run => finished,
                        () = shutdown.cancelled() => {
                            match tokio::time::timeout(drain, &mut run).await {
                                Ok(finished) => finished,
                                Err(_) => {
                                    tracing::warn!(lane = %into, "a steered run did not finish within the drain; aborting it");
                                    let _ = lane.abort();
                                    match tokio::time::timeout(super::DRAIN_MARGIN, &mut run).await {
                                        Ok(finished) => finished,
                                        Err(_) => return,
                                    }
                                }
                            }
                        }
                    };
                    if let Err(error) = finished {
                        tracing::warn!(
                            lane = %into,
                            "heartbeat steer into {into}: the steered run failed: {error}"
                        );
                    }
                });
                Ok(())
            }
            Err(error) => Err(error.to_string()),
        }
    }
}

/// Each method is one call into the service: `lane`, the machine's `run`, the spend guard's
/// `check`, `post_to`, `steer_from_heartbeat`, `alerts.alert`, `metrics.heartbeat_outcome` and
/// `tasks.token`.
impl Host for Service {
    fn open_lane<'a>(
        &'a self,
        name: &'a LaneName,
        origin: Origin,
        model: Option<&'a ModelRef>,
    ) -> BoxFuture<'a, Result<Box<dyn HostLane>, String>> {
        Box::pin(async move {
            let lane = self.lane(name, origin, model).await?;
            Ok(Box::new(lane) as Box<dyn HostLane>)
        })
    }

    fn run_command(&self, command: Command) -> BoxFuture<'_, Result<Output, SandboxError>> {
        Box::pin(
            self.runtime
                .machine()
                .run(command, CancellationToken::new()),
        )
    }

    fn may_spend(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(self.runtime.spend().check(RunKind::Heartbeat))
    }

    fn post<'a>(
        &'a self,
        target: &'a Target,
        text: &'a str,
        lane: DeliveryLane,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(self.post_to(target, text, Some(lane)))
    }

    fn steer<'a>(
        &'a self,
        into: &'a LaneName,
        origin: Origin,
        relay: Relay,
        text: String,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.steer_from_heartbeat(into, origin, relay, text))
    }

    fn alert(&self, kind: AlertKind, text: String) {
        self.alerts.alert(kind, text);
    }

    fn count_outcome(&self, task: &TaskName, outcome: &SlotOutcome) {
        self.metrics.heartbeat_outcome(task.as_str(), outcome);
    }

    fn track_run(&self) -> TaskTrackerToken {
        self.tasks.token()
    }
}
