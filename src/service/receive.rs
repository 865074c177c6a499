//! Receiving: one task per channel keeps it connected and forwards what arrives. The task only
//! waits, steps [`Link`] (perch-core's connection machine, which decides every state, backoff
//! and wait) and carries out what it says.

use crate::channel::{Arrival, AttemptUp, Connector, ConnectorError, ReceiveAttempt};
use perch_core::connection::{AttemptEnd, Begin, Connection, Link, LinkAction, LinkEvent};
use perch_core::narration::Event;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Where a channel's receiving resumes: the cursor perch journaled last (Telegram's update id,
/// Matrix's sync token) and, per room, the last journaled event to back-fill from.
pub(super) struct ReceiveFrom {
    pub(super) cursor: Option<String>,
    pub(super) since: Vec<(String, String)>,
}

/// One channel's receiving: what it receives from and where its state and events go.
pub(super) struct Receiver<S> {
    pub(super) name: String,
    pub(super) connector: Arc<dyn Connector>,
    /// Told every new state (`perch status` shows it; a refusal alerts the owner).
    pub(super) show: S,
    pub(super) arrivals: mpsc::Sender<(String, Arrival)>,
    /// The first wait before reconnecting; the machine doubles it.
    pub(super) first_wait: Duration,
    /// Told when the first attempt is over (up or failed), or that none starts now.
    pub(super) first_attempt: Option<oneshot::Sender<()>>,
    pub(super) shutdown: CancellationToken,
    /// What the operator is told to check when the platform refuses the credentials: the
    /// variables and the file that names them.
    pub(super) credentials_fix: Option<String>,
    /// Where the channel connects, named when a connection fails and the reason does not.
    pub(super) endpoint: Option<String>,
}

impl<S: Fn(Connection) + Send> Receiver<S> {
    /// Keeps the channel connected from `begin` until shutdown, as [`Link::step`] says.
    pub(super) async fn receive_forever(mut self, from: ReceiveFrom, begin: Begin) {
        let ReceiveFrom {
            cursor: mut resume,
            since,
        } = from;
        let mut link = Link::new();
        let mut action = self.step(&mut link, LinkEvent::Begin(begin));
        loop {
            let event = match action {
                LinkAction::Stop => {
                    self.first_attempt_over();
                    return;
                }
                LinkAction::Wait(wait) => {
                    self.first_attempt_over();
                    tokio::select! {
                        () = tokio::time::sleep(wait) => LinkEvent::WaitOver,
                        () = self.shutdown.cancelled() => LinkEvent::Shutdown,
                    }
                }
                LinkAction::Attempt | LinkAction::KeepReceiving => {
                    let (ended, cursor) = self.attempt(&mut link, resume.clone(), &since).await;
                    resume = cursor.or(resume);
                    if self.shutdown.is_cancelled() {
                        LinkEvent::Shutdown
                    } else {
                        LinkEvent::Ended(ended)
                    }
                }
            };
            action = self.step(&mut link, event);
        }
    }

    /// One receive attempt, to its end; with the cursor of the last event it forwarded.
    async fn attempt(
        &mut self,
        link: &mut Link,
        resume: Option<String>,
        since: &[(String, String)],
    ) -> (AttemptEnd, Option<String>) {
        let (events, mut received) = mpsc::channel::<Arrival>(64);
        let forward = {
            let arrivals = self.arrivals.clone();
            let name = self.name.clone();
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
        let (up, mut came_up) = AttemptUp::pair();
        let connector = Arc::clone(&self.connector);
        let receiving = connector.receive(ReceiveAttempt {
            resume,
            since: since.to_vec(),
            inbound: events,
            up,
            cancel: self.shutdown.clone(),
        });
        tokio::pin!(receiving);
        let result = tokio::select! {
            result = &mut receiving => result,
            account = came_up.wait() => {
                crate::host::narrate::tell(&Event::Connected {
                    channel: self.name.clone(),
                    account,
                });
                self.step(link, LinkEvent::Up);
                self.first_attempt_over();
                receiving.await
            }
        };
        self.first_attempt_over();
        let cursor = forward.await.ok().flatten();
        let ended = match result {
            Ok(()) => AttemptEnd::Clean,
            Err(ConnectorError::Unauthorized { message }) => AttemptEnd::Refused {
                reason: match &self.credentials_fix {
                    Some(fix) => format!("{message}; {fix}"),
                    None => message,
                },
            },
            Err(error @ ConnectorError::Disconnected { .. }) => {
                let reason = error.to_string();
                AttemptEnd::Dropped {
                    reason: match &self.endpoint {
                        Some(endpoint) if !reason.contains(endpoint.as_str()) => {
                            format!("{reason} (at {endpoint})")
                        }
                        _ => reason,
                    },
                }
            }
        };
        (ended, cursor)
    }

    /// Steps the machine, shows its new state when it changed, and logs why it waits.
    fn step(&self, link: &mut Link, event: LinkEvent) -> LinkAction {
        let before = link.connection.clone();
        let action = link.step(event, self.first_wait);
        let name = &self.name;
        if let (Connection::Refused { reason }, LinkAction::Wait(wait)) = (&link.connection, action)
            && before != link.connection
        {
            tracing::error!(
                channel = %name,
                "channel {name}: {reason}; trying again in {} minutes",
                wait.as_secs() / 60
            );
        }
        if let (Connection::Reconnecting { reason, .. }, LinkAction::Wait(_)) =
            (&link.connection, action)
            && before != link.connection
        {
            tracing::warn!(channel = %name, "channel {name}: {reason}; reconnecting");
        }
        if before != link.connection {
            (self.show)(link.connection.clone());
        }
        action
    }

    fn first_attempt_over(&mut self) {
        if let Some(over) = self.first_attempt.take() {
            let _ = over.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{
        Attachment, BoxFuture, Delivery, DeliveryError, FetchError, InboundEvent, PlatformLimits,
        Receipt, Upload,
    };
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// What happened, in order, with the (paused) time since the test started.
    type History = Arc<Mutex<Vec<(u64, String)>>>;

    fn note(history: &History, started: Instant, what: String) {
        let millis = u64::try_from(started.elapsed().as_millis()).unwrap();
        history.lock().unwrap().push((millis, what));
    }

    /// One scripted receive attempt: whether the platform answers, how long it lasts (or until
    /// cancelled, with `None`), and how it ends.
    struct Scripted {
        up: bool,
        lasts: Option<Duration>,
        end: Result<(), ConnectorError>,
    }

    #[derive(Debug)]
    struct FakeConnector {
        attempts: Mutex<VecDeque<Scripted>>,
        history: History,
        started: Instant,
    }

    impl std::fmt::Debug for Scripted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Scripted")
        }
    }

    impl Connector for FakeConnector {
        fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>> {
            let ReceiveAttempt {
                resume, up, cancel, ..
            } = attempt;
            Box::pin(async move {
                note(
                    &self.history,
                    self.started,
                    format!("receive from {resume:?}"),
                );
                let next = self.attempts.lock().unwrap().pop_front();
                let Some(next) = next else {
                    cancel.cancelled().await;
                    return Ok(());
                };
                if next.up {
                    up.mark();
                }
                match next.lasts {
                    Some(lasts) => tokio::select! {
                        () = tokio::time::sleep(lasts) => next.end,
                        () = cancel.cancelled() => Ok(()),
                    },
                    None => {
                        cancel.cancelled().await;
                        Ok(())
                    }
                }
            })
        }

        fn post<'a>(
            &'a self,
            _delivery: &'a Delivery,
            _files: &'a [Upload],
        ) -> BoxFuture<'a, Result<Receipt, DeliveryError>> {
            unreachable!("receiving never posts")
        }

        fn fetch<'a>(
            &'a self,
            _event: &'a InboundEvent,
            _attachment: &'a Attachment,
            _limit: u64,
        ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
            unreachable!("receiving never fetches")
        }

        fn typing<'a>(&'a self, _room: &'a str, _thread: Option<&'a str>) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }

        fn limits(&self) -> PlatformLimits {
            PlatformLimits {
                max_chars: 4096,
                resend_window: None,
            }
        }
    }

    fn dropped(after: u64) -> Scripted {
        Scripted {
            up: false,
            lasts: Some(Duration::from_secs(after)),
            end: Err(ConnectorError::Disconnected {
                message: "the server went away".into(),
            }),
        }
    }

    /// Runs a receiver over `attempts` from `begin` until `stop_at` milliseconds, then shuts it
    /// down; returns the history and whether the first attempt was reported over.
    async fn receive(
        attempts: Vec<Scripted>,
        begin: Begin,
        stop_at: u64,
    ) -> (Vec<(u64, String)>, bool) {
        let started = Instant::now();
        let history: History = Arc::default();
        let connector = Arc::new(FakeConnector {
            attempts: Mutex::new(attempts.into()),
            history: Arc::clone(&history),
            started,
        });
        let (arrivals, _incoming) = mpsc::channel(1);
        let (over, first_attempt) = oneshot::channel();
        let shutdown = CancellationToken::new();
        let shown = Arc::clone(&history);
        let receiver = Receiver {
            name: "tg".to_owned(),
            connector,
            show: move |connection: Connection| note(&shown, started, connection.to_string()),
            arrivals,
            first_wait: Duration::from_secs(1),
            first_attempt: Some(over),
            shutdown: shutdown.clone(),
            credentials_fix: None,
            endpoint: None,
        };
        let from = ReceiveFrom {
            cursor: Some("7".into()),
            since: Vec::new(),
        };
        let task = tokio::spawn(receiver.receive_forever(from, begin));
        tokio::time::sleep(Duration::from_millis(stop_at)).await;
        shutdown.cancel();
        task.await.unwrap();
        note(&history, started, "ended".into());
        let history = history.lock().unwrap().clone();
        (history, first_attempt.await.is_ok())
    }

    fn strings(history: &[(u64, &str)]) -> Vec<(u64, String)> {
        history
            .iter()
            .map(|(at, what)| (*at, (*what).to_owned()))
            .collect()
    }

    const RECEIVE: &str = "receive from Some(\"7\")";
    const RECONNECTING: &str = "reconnecting: disconnected: the server went away";

    /// An attempt at `at` that drops at once, and the connecting again at `next`.
    fn drops(at: u64, next: u64) -> [(u64, &'static str); 3] {
        [(at, RECEIVE), (at, RECONNECTING), (next, "connecting")]
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_that_keeps_dropping_reconnects_after_doubling_waits() {
        let (history, over) = receive(
            vec![dropped(0), dropped(0), dropped(0), dropped(0)],
            Begin::Now,
            20_000,
        )
        .await;
        assert!(over);
        let expected = [
            &drops(0, 1000) as &[_],
            &drops(1000, 3000),
            &drops(3000, 7000),
            &drops(7000, 15000),
            &[(15000, RECEIVE), (20000, "ended")],
        ];
        assert_eq!(history, strings(&expected.concat()));
    }

    #[tokio::test(start_paused = true)]
    async fn refused_credentials_wait_ten_minutes_before_the_next_try() {
        let refused = Scripted {
            up: false,
            lasts: Some(Duration::ZERO),
            end: Err(ConnectorError::Unauthorized {
                message: "Telegram refused the bot token (401 Unauthorized)".into(),
            }),
        };
        let (history, _) = receive(vec![dropped(0), refused], Begin::Now, 700_000).await;
        let expected = [
            &drops(0, 1000) as &[_],
            &[
                (1000, RECEIVE),
                (
                    1000,
                    "stopped: Telegram refused the bot token (401 Unauthorized)",
                ),
                (601_000, "connecting"),
                (601_000, RECEIVE),
                (700_000, "ended"),
            ],
        ];
        assert_eq!(history, strings(&expected.concat()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_end_starts_the_backoff_again() {
        let clean = Scripted {
            up: true,
            lasts: Some(Duration::from_secs(5)),
            end: Ok(()),
        };
        let (history, _) = receive(
            vec![dropped(0), dropped(0), clean, dropped(0)],
            Begin::Now,
            30_000,
        )
        .await;
        let expected = [
            &drops(0, 1000) as &[_],
            &drops(1000, 3000),
            &[(3000, RECEIVE), (3000, "receiving"), (9000, "connecting")],
            &drops(9000, 10000),
            &[(10000, RECEIVE), (30000, "ended")],
        ];
        assert_eq!(history, strings(&expected.concat()));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_during_a_wait_ends_the_loop_at_once() {
        let (history, _) = receive(vec![dropped(0)], Begin::Now, 500).await;
        assert_eq!(
            history,
            strings(&[(0, RECEIVE), (0, RECONNECTING), (500, "ended")]),
            "no attempt after the shutdown"
        );
        let started = Instant::now();
        let (history, over) = receive(Vec::new(), Begin::Now, 3_000).await;
        assert!(over);
        assert_eq!(history, strings(&[(0, RECEIVE), (3000, "ended")]));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_paused_by_the_breaker_connects_when_the_pause_is_over() {
        let now = chrono::Utc::now();
        let begin = Begin::Paused {
            until: now + chrono::Duration::seconds(90),
            now,
        };
        let (history, over) = receive(Vec::new(), begin, 100_000).await;
        assert!(over, "readiness does not wait for a paused channel");
        assert_eq!(history.len(), 4, "{history:?}");
        assert!(history[0].1.starts_with("paused until "), "{history:?}");
        assert_eq!(
            history[1..],
            strings(&[(90000, "connecting"), (90000, RECEIVE), (100_000, "ended"),])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_heartbeat_run_never_receives() {
        let (history, over) = receive(Vec::new(), Begin::OneHeartbeatRun, 5_000).await;
        assert!(over);
        assert_eq!(
            history,
            strings(&[
                (0, "not receiving: this process serves one heartbeat run"),
                (5000, "ended"),
            ])
        );
    }
}
