//! What the service does for heartbeats: it starts the scheduler, and it is the runs' [`Host`],
//! through the owners' handles: their lanes (held through the conversations' owner), their
//! check's machine, the spend cap, posts through the deliveries, steers, owner alerts, metrics
//! and the shutdown drain. The run itself is the heartbeat module's.

use super::Common;
use super::conversations::Conversations;
use super::deliveries::Deliveries;
use crate::agent::AgentDir;
use crate::channel::BoxFuture;
use crate::heartbeat::{self, Heartbeats, Host, HostLane, Ledger, SchedulerSetup, Steer};
use crate::host::clock::Clock;
use crate::lane::Runtime;
use crate::lane::{Input, Steered};
use crate::sandbox::{Command, Output, SandboxError};
use crate::store::outbox::DeliveryLane;
use perch_core::alert::AlertKind;
use perch_core::heartbeat::{SlotOutcome, Target};
use perch_core::log::Trigger;
use perch_core::name::{LaneName, ModelRef, TaskName};
use perch_core::prompt::Origin;
use perch_core::spend::RunKind;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// The heartbeat runs' host: handles, never the owners' state.
pub(super) struct HeartbeatHost {
    pub(super) conversations: Conversations,
    pub(super) deliveries: Deliveries,
    pub(super) runtime: Arc<Runtime>,
    /// A run holds a place among its tasks, so shutdown drains it.
    pub(super) common: Common,
}

/// Starts the heartbeat scheduler of `dir` over the ledger in `.perch/heartbeats/`, hosted by
/// `host`; `scheduled` unless only one run is served.
pub(super) fn start(
    host: HeartbeatHost,
    dir: &AgentDir,
    clock: Clock,
    reload_every: Duration,
    scheduled: bool,
) -> Result<Heartbeats, String> {
    let agent = host.runtime.agent();
    let env = heartbeat::heartbeat_env(agent, heartbeat::host_tz());
    let (ledger, records) = Ledger::open(dir, clock.clone()).map_err(|error| error.to_string())?;
    let shutdown = host.common.shutdown.clone();
    let setup = SchedulerSetup::hosted(
        Arc::new(host),
        dir.clone(),
        env,
        clock,
        reload_every,
        scheduled,
    );
    Ok(heartbeat::start(setup, ledger, records, shutdown))
}

impl HeartbeatHost {
    /// Adds a heartbeat's steer to its lane: to the lane's active run at the next tool
    /// boundary, or, when the lane is idle, as a run of its own. That run's reply stays in the
    /// lane: a heartbeat reaches a chat only through `Message:`.
    async fn steer_from_heartbeat(&self, steer: Steer) -> Result<(), String> {
        let Steer {
            into,
            origin,
            relay,
            text,
        } = steer;
        let lane = self.conversations.hold(into.clone(), origin, None).await?;
        match lane.steer_relayed(relay.clone(), text.clone()).await {
            Ok(Steered::Delivered) => Ok(()),
            Ok(Steered::Idle) => {
                let (shutdown, drain) = (self.common.shutdown.clone(), self.common.drain);
                // Among the service's tasks, so shutdown drains it like a conversation's run.
                self.common.tasks.spawn(async move {
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
                            let abort = || {
                                let _ = lane.abort();
                            };
                            match drain.finish(&mut run, abort).await {
                                Some(finished) => finished,
                                None => return,
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

/// Each method is one request to a handle: the conversations' `hold`, the machine's `run`, the
/// spend guard's `check`, the deliveries' `post_to`, `steer_from_heartbeat`, `alerts.alert`,
/// `metrics.heartbeat_outcome` and `tasks.token`.
impl Host for HeartbeatHost {
    fn open_lane<'a>(
        &'a self,
        name: &'a LaneName,
        origin: Origin,
        model: Option<&'a ModelRef>,
    ) -> BoxFuture<'a, Result<Box<dyn HostLane>, String>> {
        Box::pin(async move {
            let lane = self
                .conversations
                .hold(name.clone(), origin, model.cloned())
                .await?;
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
        Box::pin(self.deliveries.post_to(target, text, Some(lane)))
    }

    fn steer(&self, steer: Steer) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(self.steer_from_heartbeat(steer))
    }

    fn alert(&self, kind: AlertKind, text: String) {
        self.common.alerts.alert(kind, text);
    }

    fn count_outcome(&self, task: &TaskName, outcome: &SlotOutcome) {
        self.common
            .metrics
            .heartbeat_outcome(task.as_str(), outcome);
    }

    fn track_run(&self) -> TaskTrackerToken {
        self.common.tasks.token()
    }
}
