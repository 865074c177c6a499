//! The service run in this process, behind a connector fed from a channel and a model that
//! answers at once: for tests and benchmarks that need the service's own knobs (`LaneLimits`,
//! `Metrics`) rather than `perch run`'s defaults. Shared with the benchmarks through `#[path]`.

use perch::agent::{self, AgentDir, LoadedChannel};
use perch::channel::{
    Arrival, Attachment, BoxFuture as ChannelFuture, Connector, ConnectorError, Delivery,
    DeliveryError, FetchError, InboundEvent, PlatformLimits, Receipt, ReceiveAttempt, Sender,
    Upload,
};
use perch::host::Places;
use perch::host::clock::system_clock;
use perch::host::metrics::Metrics;
use perch::lane::RunLimits;
use perch::model::{
    BoxFuture, Model, ModelError, ModelReply, ModelRequest, StopReason, StreamEvent, Usage,
};
use perch::sandbox::{Backend, MachineSetup};
use perch::service::{LaneLimits, ServiceSetup, run};
use perch_core::conversation::text_of;
use perch_core::log::{Part, Role};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What arrived at the connector, what reached the model and what was posted, with when.
#[derive(Debug, Default)]
pub struct Seen {
    /// Each event's text, when the connector handed it to perch.
    pub arrived: Vec<(String, Instant)>,
    /// Each model request: the text of its last user message (without its origin header) and how many user messages it
    /// carried (the lane's history), when it was made.
    pub requests: Vec<(String, usize, Instant)>,
    /// Each delivery posted: its room and text.
    pub posted: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Seen>>;

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running service with one Telegram-shaped channel, `tg`, fed by [`InProcess::send`].
pub struct InProcess {
    pub dir: tempfile::TempDir,
    pub metrics: Arc<Metrics>,
    seen: Shared,
    push: mpsc::UnboundedSender<InboundEvent>,
    shutdown: CancellationToken,
    service: tokio::task::JoinHandle<Result<(), String>>,
    next_id: u64,
}

impl InProcess {
    /// A new agent (`perch init`) with a channel `tg` that allows direct messages, served with
    /// `lanes`. `prepare` may change the agent directory before the service starts.
    pub fn start(lanes: LaneLimits, prepare: impl FnOnce(&Path)) -> InProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        agent::init(dir.path()).expect("perch init");
        std::fs::write(
            dir.path().join("channels/tg.lua"),
            "channel { kind = \"telegram\", token = env \"IN_PROCESS_TOKEN\", dm = \"allow\" }\n",
        )
        .expect("the channel file");
        prepare(dir.path());
        let loaded =
            agent::load(&AgentDir::open(dir.path()).expect("an agent")).expect("the agent loads");
        let seen: Shared = Arc::default();
        let (push, received) = mpsc::unbounded_channel();
        let connector: Arc<dyn Connector> = Arc::new(FedConnector {
            events: tokio::sync::Mutex::new(Some(received)),
            seen: Arc::clone(&seen),
        });
        let metrics: Arc<Metrics> = Arc::default();
        let setup = ServiceSetup {
            machine: MachineSetup {
                backend: Backend::NamespaceDouble,
                places: Places::from_environment(),
                idle: Duration::from_secs(600),
            },
            model: Arc::new(AnsweringModel {
                seen: Arc::clone(&seen),
            }),
            connectors: Arc::new(move |_: &LoadedChannel| Ok(Arc::clone(&connector))),
            clock: system_clock(),
            limits: RunLimits::default(),
            lanes,
            reconnect: Duration::from_millis(10),
            heartbeat_reload: perch::heartbeat::RELOAD_EVERY,
            notifier: perch::host::notify::Notifier::disabled(),
            drain: Duration::from_secs(30),
            metrics: Arc::clone(&metrics),
            metrics_listener: None,
            once: None,
        };
        let shutdown = CancellationToken::new();
        let service = tokio::spawn(run(loaded, setup, shutdown.clone()));
        InProcess {
            dir,
            metrics,
            seen,
            push,
            shutdown,
            service,
            next_id: 0,
        }
    }

    /// Sends `text` from user `user` in their private chat (room `user`).
    pub fn send(&mut self, user: u64, text: &str) {
        self.next_id += 1;
        let event = InboundEvent {
            platform_id: format!("{user}:{}", self.next_id),
            cursor: Some(self.next_id.to_string()),
            room: user.to_string(),
            thread: None,
            sender: Sender {
                id: user.to_string(),
                name: format!("user {user}"),
                is_bot: false,
            },
            direct: true,
            addressed: true,
            text: text.to_owned(),
            sent_at: chrono::Utc::now(),
            attachments: Vec::new(),
            replying_to: None,
            edit_of: None,
            refused: None,
        };
        self.push.send(event).expect("the connector takes events");
    }

    /// Reads what has been seen so far.
    pub fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
        read(&lock(&self.seen))
    }

    /// Waits until `done` holds of what has been seen, polling; panics naming `what` after
    /// `within`.
    pub async fn until(&self, what: &str, within: Duration, done: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + within;
        while !self.seen(&done) {
            assert!(Instant::now() < deadline, "not within {within:?}: {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The value of `series` in the service's `/metrics` text.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics.render().lines().find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|value| value.parse().ok())
        })
    }

    /// Waits until the metric `series` equals `value`.
    pub async fn until_metric(&self, series: &str, value: f64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.metric(series) != Some(value) {
            assert!(
                Instant::now() < deadline,
                "{series} is {:?}, not {value}, after {within:?}",
                self.metric(series)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stops the service (as SIGTERM would) and waits for it to end.
    pub async fn stop(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        match self.service.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => panic!("the service failed: {error}"),
            Err(error) => panic!("the service panicked: {error}"),
        }
        self.dir
    }
}

#[derive(Debug)]
struct FedConnector {
    events: tokio::sync::Mutex<Option<mpsc::UnboundedReceiver<InboundEvent>>>,
    seen: Shared,
}

impl Connector for FedConnector {
    fn receive(&self, attempt: ReceiveAttempt) -> ChannelFuture<'_, Result<(), ConnectorError>> {
        let ReceiveAttempt {
            inbound,
            up,
            cancel,
            ..
        } = attempt;
        Box::pin(async move {
            up.mark();
            let Some(mut events) = self.events.lock().await.take() else {
                cancel.cancelled().await;
                return Ok(());
            };
            loop {
                let event = tokio::select! {
                    () = cancel.cancelled() => return Ok(()),
                    event = events.recv() => event,
                };
                let Some(event) = event else { return Ok(()) };
                lock(&self.seen)
                    .arrived
                    .push((event.text.clone(), Instant::now()));
                let (journaled, acked) = tokio::sync::oneshot::channel();
                if inbound.send(Arrival { event, journaled }).await.is_err() {
                    return Ok(());
                }
                let _ = acked.await;
            }
        })
    }

    fn post<'a>(
        &'a self,
        delivery: &'a Delivery,
        _files: &'a [Upload],
    ) -> ChannelFuture<'a, Result<Receipt, DeliveryError>> {
        Box::pin(async move {
            lock(&self.seen)
                .posted
                .push((delivery.room.clone(), delivery.text.clone()));
            Ok(Receipt {
                platform_id: delivery.id.clone(),
            })
        })
    }

    fn fetch<'a>(
        &'a self,
        _event: &'a InboundEvent,
        _attachment: &'a Attachment,
        _limit: u64,
    ) -> ChannelFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(async {
            Err(FetchError::Failed {
                message: "the in-process connector has no files".into(),
            })
        })
    }

    fn typing<'a>(&'a self, _room: &'a str, _thread: Option<&'a str>) -> ChannelFuture<'a, ()> {
        Box::pin(async {})
    }

    fn limits(&self) -> PlatformLimits {
        PlatformLimits {
            max_chars: 4096,
            resend_window: None,
        }
    }
}

/// Answers every request at once with `ok: <the last user message>`.
#[derive(Debug)]
struct AnsweringModel {
    seen: Shared,
}

impl Model for AnsweringModel {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        _events: mpsc::UnboundedSender<StreamEvent>,
        _cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        let users: Vec<String> = request
            .messages
            .iter()
            .filter(|message| message.role == Role::User)
            .map(text_of)
            .collect();
        let last = users.last().cloned().unwrap_or_default();
        // The text as the sender wrote it, without perch's `<origin .../>` header line.
        let last = match last.split_once('\n') {
            Some((header, said)) if header.starts_with("<origin ") => said.to_owned(),
            _ => last,
        };
        lock(&self.seen)
            .requests
            .push((last.clone(), users.len(), Instant::now()));
        Box::pin(async move {
            Ok(ModelReply {
                parts: vec![Part::Text {
                    text: format!("ok: {last}"),
                }],
                usage: Usage::default(),
                stop: StopReason::End,
            })
        })
    }
}
