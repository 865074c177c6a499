//! Owner alerts in the shell: the handle every part of the service raises alerts through, and
//! the one task that owns the rate limit and posts what it lets through to the owner's room.
//! The rate limit is the core's ([`perch_core::alert::AlertLimiter`]).

use crate::channel::BoxFuture;
use crate::host::clock::Clock;
use perch_core::alert::{AlertKind, AlertLimiter};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One alert, as raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub kind: AlertKind,
    pub text: String,
}

/// Where alerts are raised. Clones raise into the same task.
#[derive(Debug, Clone)]
pub struct Alerts {
    sender: mpsc::UnboundedSender<Alert>,
}

impl Alerts {
    /// A handle, and the receiver its alerts arrive on, for [`deliver`].
    pub fn new() -> (Alerts, mpsc::UnboundedReceiver<Alert>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Alerts { sender }, receiver)
    }

    /// A handle whose alerts go to the log only.
    pub fn log_only() -> Alerts {
        Alerts::new().0
    }

    /// Raises an alert: logged at once, and handed to the alert task, which posts
    /// it to the owner's room if the rate limit lets it through. Never waits and never fails.
    pub fn alert(&self, kind: AlertKind, text: impl Into<String>) {
        let text = text.into();
        tracing::warn!(kind = kind.as_str(), "alert ({kind}): {text}");
        let _ = self.sender.send(Alert { kind, text });
    }
}

/// Posts one alert message to the owner's room, through the outbox.
pub type PostAlert = Arc<dyn Fn(String) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The alert task: owns the rate limit, takes alerts until `shutdown`, and posts with `post`
/// each one the limit lets through, and each summary of held-back alerts when its window ends.
pub async fn deliver(
    mut alerts: mpsc::UnboundedReceiver<Alert>,
    post: PostAlert,
    clock: Clock,
    shutdown: CancellationToken,
) {
    let mut limiter = AlertLimiter::new();
    loop {
        let now = clock.now();
        for message in limiter.due(now) {
            send(&post, message).await;
        }
        let wait = limiter
            .next_due()
            .map(|at| (at - now).to_std().unwrap_or(Duration::ZERO));
        let summary = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = summary => {}
            alert = alerts.recv() => match alert {
                None => return,
                Some(alert) => {
                    if let Some(message) = limiter.offer(alert.kind, &alert.text, clock.now()) {
                        send(&post, message).await;
                    }
                }
            },
        }
    }
}

async fn send(post: &PostAlert, message: String) {
    if let Err(error) = post(message).await {
        tracing::warn!("an alert was not delivered to the owner: {error}");
    }
}
