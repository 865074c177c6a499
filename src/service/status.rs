//! The service seen from outside: the control socket's requests, `perch status`, `GET /metrics`,
//! systemd's status line, owner alerts, and the watch on the files loaded at start. It talks to
//! the owners through their handles.

use super::Common;
use super::channel::Channels;
use super::deliveries::Deliveries;
use super::intake::Intake;
use crate::agent::AgentDir;
use crate::heartbeat::{self, Heartbeats};
use crate::host::notify::status_line;
use crate::lane::Runtime;
use crate::store::control::ControlRequest;
use crate::store::inbox::Inbox;
use crate::store::outbox::Outbox;
use crate::store::starts;
use perch_core::control::{HeartbeatListed, HeartbeatRan, LiveStatus, Resumed, encode_reply};
use perch_core::heartbeat::Target;
use perch_core::narration::Event;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// What answers from outside: handles, and what was fixed at start.
pub(super) struct Outside {
    pub(super) channels: Channels,
    pub(super) inbox: Inbox,
    pub(super) outbox: Outbox,
    pub(super) runtime: Arc<Runtime>,
    pub(super) intake: Intake,
    pub(super) deliveries: Deliveries,
    /// The heartbeat scheduler, set once when it starts (a std `OnceLock`: written once, then
    /// only read, never waited on).
    pub(super) heartbeats: OnceLock<Heartbeats>,
    /// Set when this start keeps its channels paused (the crash-loop breaker).
    pub(super) channels_paused: Option<String>,
    /// The files loaded at start that changed since: a restart applies them.
    pub(super) restart_needed: watch::Receiver<Vec<String>>,
    /// When this service started.
    pub(super) started: perch_core::Timestamp,
    pub(super) common: Common,
}

impl Outside {
    /// `GET /metrics`: the counters, with the inbox's depth and the machine's boots read now.
    pub(super) async fn metrics_text(&self) -> String {
        let depth = self.inbox.depth().await;
        self.common
            .metrics
            .set_inbox_depth(u64::try_from(depth).unwrap_or(u64::MAX));
        self.common
            .metrics
            .set_vm_boots(self.runtime.machine().boots());
        self.common.metrics.render()
    }

    /// Starts the alert task: it takes what is raised (the crash-loop breaker, a stopped or
    /// unhealthy channel, an unknown delivery, a stopped heartbeat task, the spend guard) and
    /// posts what the rate limit lets through (at most one message per kind an hour, then a
    /// count of the rest) to `owner`, through the outbox like any reply. Without an owner,
    /// alerts are only logged.
    pub(super) fn start_alerts(&self, raised: mpsc::UnboundedReceiver<crate::host::alert::Alert>) {
        let owner: Option<Target> = self.runtime.agent().definition.agent.owner.clone();
        let Some(owner) = owner else {
            return;
        };
        let deliveries = self.deliveries.clone();
        let post: crate::host::alert::PostAlert = Arc::new(move |text: String| {
            let deliveries = deliveries.clone();
            let owner = owner.clone();
            Box::pin(async move { deliveries.post_to(&owner, &text, None).await.map(drop) })
        });
        tokio::spawn(crate::host::alert::deliver(
            raised,
            post,
            self.common.clock.clone(),
            self.common.shutdown.clone(),
        ));
    }

    /// Tells the operator the service is ready: its channels, heartbeat tasks and model; and
    /// warns when nothing can reach the agent.
    pub(super) async fn narrate_ready(&self) {
        let mut channels: Vec<String> = self.channels.keys().cloned().collect();
        channels.sort();
        let heartbeats = match self.heartbeats.get() {
            Some(heartbeats) => heartbeats.list().await.map_or(0, |list| list.tasks.len()),
            None => 0,
        };
        let unreachable = channels.is_empty() && heartbeats == 0;
        crate::host::narrate::tell(&Event::Ready {
            channels,
            heartbeats,
            model: self.runtime.agent().definition.agent.model.to_string(),
        });
        if unreachable {
            crate::host::narrate::tell(&Event::Unreachable);
        }
    }

    /// The service's `STATUS=` line for systemd.
    pub(super) async fn status_line(&self) -> String {
        status_line(&format!(
            "{} channel(s), inbox {} waiting",
            self.channels.len(),
            self.inbox.depth().await
        ))
    }

    /// Answers a request that came in on the control socket.
    pub(super) async fn control(
        &self,
        request: Result<ControlRequest, String>,
    ) -> serde_json::Value {
        const NOT_YET: &str = "heartbeats are not running yet";
        let request = match request {
            Ok(request) => request,
            Err(error) => return encode_reply::<Resumed>(&Err(error)),
        };
        match request {
            ControlRequest::PairApprove { who } => encode_reply(&self.intake.approve(who).await),
            ControlRequest::PairDeny { who } => encode_reply(&self.intake.deny(who).await),
            ControlRequest::PairRevoke { channel, sender } => {
                encode_reply(&self.intake.revoke(channel, sender).await)
            }
            ControlRequest::PairList => encode_reply(&self.intake.pair_list().await),
            ControlRequest::HeartbeatRun { task, dry_run } => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => {
                        heartbeats
                            .run_now(&task, dry_run)
                            .await
                            .map(|end| HeartbeatRan {
                                end: heartbeat::run_end(&end),
                            })
                    }
                };
                encode_reply(&reply)
            }
            ControlRequest::HeartbeatResume { task } => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => heartbeats.resume(&task).await.map(|()| Resumed {}),
                };
                encode_reply(&reply)
            }
            ControlRequest::HeartbeatList => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => {
                        heartbeats.list().await.map(|list| HeartbeatListed { list })
                    }
                };
                encode_reply(&reply)
            }
            ControlRequest::Status => encode_reply(&Ok(self.live_status().await)),
        }
    }

    /// What `perch status` learns from the running service.
    async fn live_status(&self) -> LiveStatus {
        let channels = self
            .channels
            .values()
            .map(|channel| channel.status())
            .collect();
        let vm = match self.runtime.machine().state().await {
            Ok((crate::sandbox::State::Running { commands }, last)) => {
                format!("running ({commands} command(s) now; {})", last.words())
            }
            Ok((crate::sandbox::State::Stopped, last)) => {
                format!("stopped (boots on the next command; {})", last.words())
            }
            Err(error) => format!("unknown: {error}"),
        };
        LiveStatus {
            running: true,
            pid: Some(std::process::id()),
            started: Some(self.started),
            channels,
            inbox_pending: self.inbox.depth().await,
            outbox_pending: self.outbox.depth().await,
            pairings_pending: self.intake.pairings_pending().await,
            vm,
            channels_paused: self.channels_paused.clone(),
            restart_needed: self.restart_needed.borrow().clone(),
        }
    }
}

/// Notices edits to the files of `dir` loaded at start, says once per change that a restart
/// applies them, and keeps `restart_needed` on what changed, until `shutdown`.
pub(super) async fn watch_config(
    dir: AgentDir,
    at_start: std::collections::BTreeMap<String, String>,
    restart_needed: watch::Sender<Vec<String>>,
    shutdown: CancellationToken,
) {
    let mut said: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(CONFIG_WATCH_EVERY) => {}
        }
        let changed = starts::changed_files(&at_start, &starts::config_digests(&dir));
        if changed != said {
            if !changed.is_empty() {
                tracing::info!(
                    "{} changed since perch run started; restart it to apply (HEARTBEAT.yml and the workspace apply live)",
                    changed.join(", ")
                );
            }
            said.clone_from(&changed);
            restart_needed.send_replace(changed);
        }
    }
}

/// How often the files loaded at start are compared with what they were.
const CONFIG_WATCH_EVERY: Duration = Duration::from_secs(5);
