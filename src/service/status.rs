//! The service seen from outside: the control socket's requests, `perch status`, `GET /metrics`,
//! systemd's status line, owner alerts, and the watch on the files loaded at start.

use super::{Service, locked, tracing_note};
use crate::heartbeat::{self};
use crate::host::notify::status_line;
use crate::store::control::ControlRequest;
use crate::store::pairing::{no_pending_pairing, write_pairing};
use crate::store::starts;
use perch_core::alert::AlertKind;
use perch_core::control::{HeartbeatListed, HeartbeatRan, LiveStatus, Resumed, encode_reply};
use perch_core::pairing::Approval;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

impl Service {
    /// `GET /metrics`: the counters, with the inbox's depth and the machine's boots read now.
    pub(super) async fn metrics_text(&self) -> String {
        let depth = self.inbox.depth().await;
        self.metrics
            .set_inbox_depth(u64::try_from(depth).unwrap_or(u64::MAX));
        self.metrics.set_vm_boots(self.runtime.machine().boots());
        self.metrics.render()
    }

    /// Raises an owner alert: logged, and posted to `owner` (rate-limited: at most one message
    /// per kind an hour, then a count of the rest) when agent.lua names one. The crash-loop
    /// breaker, a stopped or unhealthy channel, an unknown delivery, a stopped heartbeat task and
    /// the spend guard come through here.
    pub fn alert(&self, kind: AlertKind, text: impl Into<String>) {
        self.alerts.alert(kind, text);
    }

    /// Starts the alert task: it takes what is raised and posts what the rate limit lets
    /// through to `owner`, through the outbox like any reply. Without an owner, alerts are only
    /// logged.
    pub(super) fn start_alerts(
        self: &Arc<Self>,
        raised: mpsc::UnboundedReceiver<crate::host::alert::Alert>,
    ) {
        let Some(owner) = self.runtime.agent().definition.agent.owner.clone() else {
            return;
        };
        let service = Arc::clone(self);
        let post: crate::host::alert::PostAlert = Arc::new(move |text: String| {
            let service = Arc::clone(&service);
            let owner = owner.clone();
            Box::pin(async move { service.post_to(&owner, &text, None).await.map(drop) })
        });
        tokio::spawn(crate::host::alert::deliver(
            raised,
            post,
            self.clock.clone(),
            self.shutdown.clone(),
        ));
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
            ControlRequest::PairApprove { code } => {
                let reply = {
                    let mut pairing = locked(&self.state.pairing);
                    match pairing.approve(&code, self.clock.now()) {
                        Approval::Approved(approved) => {
                            write_pairing(&self.pairing_path, &pairing).map(|()| approved)
                        }
                        Approval::Unknown => Err(no_pending_pairing(&code)),
                    }
                };
                self.update_gates();
                encode_reply(&reply)
            }
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
                format!("running ({commands} command(s) now; last boot: {last:?})")
            }
            Ok((crate::sandbox::State::Stopped, last)) => {
                format!("stopped (boots on the next command; last boot: {last:?})")
            }
            Err(error) => format!("unknown: {error}"),
        };
        LiveStatus {
            running: true,
            channels,
            inbox_pending: self.inbox.depth().await,
            outbox_pending: self.outbox.depth().await,
            pairings_pending: locked(&self.state.pairing).pending.len(),
            vm,
            channels_paused: self.breaker.as_ref().map(|tripped| tripped.reason.clone()),
            restart_needed: locked(&self.state.restart_needed).clone(),
        }
    }

    /// Notices edits to the files loaded at start, and says once per change that a restart
    /// applies them.
    pub(super) async fn watch_config(
        self: Arc<Self>,
        at_start: std::collections::BTreeMap<String, String>,
    ) {
        let dir = self.runtime.agent().dir.clone();
        let mut said: Vec<String> = Vec::new();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(CONFIG_WATCH_EVERY) => {}
            }
            let changed = starts::changed_files(&at_start, &starts::config_digests(&dir));
            if changed != said {
                if !changed.is_empty() {
                    tracing_note(&format!(
                        "{} changed since perch run started; restart it to apply (HEARTBEAT.yml and the workspace apply live)",
                        changed.join(", ")
                    ));
                }
                said.clone_from(&changed);
                *locked(&self.state.restart_needed) = changed;
            }
        }
    }
}

/// How often the files loaded at start are compared with what they were.
const CONFIG_WATCH_EVERY: Duration = Duration::from_secs(5);
