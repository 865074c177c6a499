//! Receiving: one task per channel keeps it connected and forwards what arrives.

use super::Channel;
use crate::channel::{Arrival, AttemptUp};
use perch_core::connection::Connection;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where a channel's receiving resumes: the cursor perch journaled last (Telegram's update id,
/// Matrix's sync token) and, per room, the last journaled event to back-fill from.
pub(super) struct ReceiveFrom {
    pub(super) cursor: Option<String>,
    pub(super) since: Vec<(String, String)>,
}

/// Keeps one channel connected: reconnects with backoff after a drop (1 s doubling to a
/// minute), and only every [`REFUSED_RETRY`] after its credentials were refused, until shutdown.
pub(super) async fn receive_forever(
    name: String,
    channel: Arc<Channel>,
    from: ReceiveFrom,
    arrivals: mpsc::Sender<(String, Arrival)>,
    first_wait: Duration,
    mut first_attempt: Option<tokio::sync::oneshot::Sender<()>>,
    shutdown: CancellationToken,
) {
    let ReceiveFrom {
        cursor: mut resume,
        since,
    } = from;
    let mut wait = first_wait;
    let mut failed_in_a_row: u32 = 0;
    loop {
        let (events, mut received) = mpsc::channel::<Arrival>(64);
        let forward = {
            let arrivals = arrivals.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let mut last_cursor = None;
                while let Some(arrival) = received.recv().await {
                    last_cursor = arrival.event.cursor.clone().or(last_cursor);
                    if arrivals.send((name.clone(), arrival)).await.is_err() {
                        break;
                    }
                }
                last_cursor
            })
        };
        channel.set_connection(Connection::Connecting);
        let (up, mut came_up) = AttemptUp::pair();
        let receiving =
            channel
                .connector
                .receive(resume.clone(), since.clone(), events, up, shutdown.clone());
        tokio::pin!(receiving);
        // The first attempt is over when the connection is up or the attempt has failed.
        let result = tokio::select! {
            result = &mut receiving => result,
            () = came_up.wait() => {
                channel.set_connection(Connection::Receiving);
                if let Some(over) = first_attempt.take() {
                    let _ = over.send(());
                }
                receiving.await
            }
        };
        if let Some(over) = first_attempt.take() {
            let _ = over.send(());
        }
        if let Ok(Some(cursor)) = forward.await {
            resume = Some(cursor);
        }
        if shutdown.is_cancelled() {
            return;
        }
        match result {
            Err(crate::channel::ConnectorError::Unauthorized { message }) => {
                tracing::error!(
                    channel = %name,
                    "channel {name}: {message}; trying again in {} minutes",
                    REFUSED_RETRY.as_secs() / 60
                );
                channel.set_connection(Connection::Refused { reason: message });
                tokio::select! {
                    () = tokio::time::sleep(REFUSED_RETRY) => {}
                    () = shutdown.cancelled() => return,
                }
                wait = first_wait;
                failed_in_a_row = 0;
                continue;
            }
            Err(error) => {
                tracing::warn!(channel = %name, "channel {name}: {error}; reconnecting");
                failed_in_a_row = failed_in_a_row.saturating_add(1);
                channel.set_connection(Connection::Reconnecting {
                    reason: error.to_string(),
                    attempt: failed_in_a_row,
                });
            }
            Ok(()) => {
                wait = first_wait;
                failed_in_a_row = 0;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
}

/// How long a channel whose credentials were refused waits before it tries again: long enough
/// not to hammer the platform, short enough to recover from the platform's own mistake.
const REFUSED_RETRY: Duration = Duration::from_secs(600);
