//! The durable inbox's ingest: events journaled (fsynced, group commit) per second, with many
//! connectors' events arriving at once.

use perch::channel::{InboundEvent, Sender};
use perch::inbox::{Inbox, Recorded};
use perch::log::system_clock;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TARGET_EVENTS_PER_SECOND: f64 = 20_000.0;

pub(crate) fn event(producer: usize, n: usize) -> InboundEvent {
    InboundEvent {
        platform_id: format!("{producer}:{n}"),
        cursor: Some(n.to_string()),
        room: format!("room-{}", producer % 50),
        thread: None,
        sender: Sender {
            id: producer.to_string(),
            name: format!("user {producer}"),
            is_bot: false,
        },
        direct: false,
        addressed: true,
        text: format!("message {n} from {producer}: a short chat message of ordinary length"),
        sent_at: chrono::Utc::now(),
        attachments: Vec::new(),
    }
}

pub async fn ingest(smoke: bool) {
    let producers = 64;
    let per_producer = if smoke { 50 } else { 500 };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (inbox, _) = Inbox::open(dir.path(), system_clock()).expect("the inbox opens");
    let inbox = Arc::new(inbox);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for producer in 0..producers {
        let inbox = Arc::clone(&inbox);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_producer);
            for n in 0..per_producer {
                let sent = Instant::now();
                let recorded = inbox
                    .record_event("bench", &event(producer, n))
                    .await
                    .expect("the event is journaled");
                assert!(matches!(recorded, Recorded::New { .. }));
                latencies.push(sent.elapsed());
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a producer finishes"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let total = producers * per_producer;
    #[expect(clippy::cast_precision_loss, reason = "a rate for display")]
    let rate = total as f64 / elapsed.as_secs_f64();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[latencies.len() * 99 / 100];
    println!(
        "inbox ingest: {producers} connectors x {per_producer} events, each fsynced before its ack\n  {rate:>10.0} events/s   p50 {p50:.2?}   p99 {p99:.2?}   (target: >= {TARGET_EVENTS_PER_SECOND:.0} events/s: {})",
        if rate >= TARGET_EVENTS_PER_SECOND {
            "met"
        } else {
            "MISSED"
        }
    );
}

/// From an event handed over by a connector to the model request its run makes (the lane has
/// received it and started), through `perch run`'s whole inbound path: journal, admission,
/// hook, verdict, conversation, lane. An in-process connector and model stand in for the
/// platform and the provider; the sandbox is the namespace double.
pub async fn arrival_to_lane(smoke: bool) {
    #[cfg(feature = "sandbox-double")]
    double::measure(if smoke { 20 } else { 500 }).await;
    #[cfg(not(feature = "sandbox-double"))]
    {
        let _ = smoke;
        println!("inbox, arrival -> lane: skipped: built without the sandbox-double feature");
    }
}

#[cfg(feature = "sandbox-double")]
mod double {
    use super::event;
    use perch::agent::{self, AgentDir, LoadedChannel};
    use perch::channel::{
        Arrival, BoxFuture as ChannelFuture, Connector, ConnectorError, Delivery, DeliveryError,
        InboundEvent, PlatformLimits, Receipt,
    };
    use perch::doctor::Places;
    use perch::lane::RunLimits;
    use perch::log::system_clock;
    use perch::model::{
        BoxFuture, Model, ModelError, ModelReply, ModelRequest, StopReason, StreamEvent, Usage,
    };
    use perch::sandbox::{Backend, MachineSetup};
    use perch::service::{ServiceSetup, run};
    use perch_core::log::Part;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::{Duration, Instant};
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    type Times = Arc<Mutex<HashMap<String, Instant>>>;

    #[derive(Debug)]
    struct InProcessConnector {
        events: tokio::sync::Mutex<Option<mpsc::UnboundedReceiver<InboundEvent>>>,
        arrived: Times,
    }

    impl Connector for InProcessConnector {
        fn receive<'a>(
            &'a self,
            _resume: Option<String>,
            _since: Vec<(String, String)>,
            inbound: mpsc::Sender<Arrival>,
            cancel: CancellationToken,
        ) -> ChannelFuture<'a, Result<(), ConnectorError>> {
            Box::pin(async move {
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
                    self.arrived
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(event.text.clone(), Instant::now());
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
            _files: &'a [perch::channel::Upload],
        ) -> ChannelFuture<'a, Result<Receipt, DeliveryError>> {
            Box::pin(async move {
                Ok(Receipt {
                    platform_id: delivery.id.clone(),
                })
            })
        }

        fn fetch<'a>(
            &'a self,
            _event: &'a InboundEvent,
            _attachment: &'a perch::channel::Attachment,
            _limit: u64,
        ) -> ChannelFuture<'a, Result<Vec<u8>, perch::channel::FetchError>> {
            Box::pin(async {
                Err(perch::channel::FetchError::Failed {
                    message: "the benchmark's connector has no files".into(),
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

    #[derive(Debug)]
    struct NotingModel {
        entered: Times,
    }

    impl Model for NotingModel {
        fn complete<'a>(
            &'a self,
            request: &'a ModelRequest,
            _events: mpsc::UnboundedSender<StreamEvent>,
            _cancel: CancellationToken,
        ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
            let now = Instant::now();
            let text = request
                .messages
                .last()
                .and_then(|message| {
                    message.parts.iter().find_map(|part| match part {
                        Part::Text { text } => Some(text.clone()),
                        _ => None,
                    })
                })
                .unwrap_or_default();
            self.entered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(text, now);
            Box::pin(async {
                Ok(ModelReply {
                    parts: vec![Part::Text { text: "ok".into() }],
                    usage: Usage::default(),
                    stop: StopReason::End,
                })
            })
        }
    }

    pub async fn measure(events: usize) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        agent::init(dir.path()).expect("perch init");
        std::fs::write(
            dir.path().join("channels/bench.lua"),
            "channel { kind = \"telegram\", token = env \"BENCH_TOKEN\", dm = \"allow\" }\n",
        )
        .expect("the channel file");
        let loaded =
            agent::load(&AgentDir::open(dir.path()).expect("an agent")).expect("the agent loads");
        let arrived: Times = Arc::default();
        let entered: Times = Arc::default();
        let (push, received) = mpsc::unbounded_channel();
        let connector: Arc<dyn Connector> = Arc::new(InProcessConnector {
            events: tokio::sync::Mutex::new(Some(received)),
            arrived: Arc::clone(&arrived),
        });
        let setup = ServiceSetup {
            machine: MachineSetup {
                backend: Backend::NamespaceDouble,
                places: Places::from_environment(),
                idle: Duration::from_secs(600),
            },
            model: Arc::new(NotingModel {
                entered: Arc::clone(&entered),
            }),
            connectors: Arc::new(move |_: &LoadedChannel| Ok(Arc::clone(&connector))),
            clock: system_clock(),
            limits: RunLimits::default(),
            lanes: perch::service::LaneLimits::default(),
            reconnect: Duration::from_millis(10),
            heartbeat_reload: perch::heartbeat::RELOAD_EVERY,
            notifier: perch::notify::Notifier::disabled(),
            drain: Duration::from_secs(30),
            metrics: Arc::default(),
            metrics_listener: None,
            once: None,
        };
        let shutdown = CancellationToken::new();
        let service = tokio::spawn(run(loaded, setup, shutdown.clone()));
        for n in 0..events {
            let mut event: InboundEvent = event(n % 50, n);
            event.direct = true;
            event.text = format!("bench-{n}");
            push.send(event).expect("the connector takes events");
            // One at a time, so each measures the path, not a queue behind other runs.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !entered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&format!("bench-{n}"))
            {
                assert!(
                    Instant::now() < deadline,
                    "event {n} never reached its lane"
                );
                tokio::task::yield_now().await;
            }
        }
        shutdown.cancel();
        let _ = service.await;
        let arrived = arrived.lock().unwrap_or_else(PoisonError::into_inner);
        let entered = entered.lock().unwrap_or_else(PoisonError::into_inner);
        let mut latencies: Vec<Duration> = arrived
            .iter()
            .filter_map(|(text, at)| entered.get(text).map(|lane| lane.duration_since(*at)))
            .collect();
        latencies.sort();
        let p50 = latencies[latencies.len() / 2];
        let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
        println!(
            "inbox, arrival at a connector -> its lane's model request: {} events, one at a time: p50 {p50:.2?}, p99 {p99:.2?}",
            latencies.len()
        );
    }
}
