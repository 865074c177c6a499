//! The durable inbox's ingest: events journaled (fsynced, group commit) per second, with many
//! connectors' events arriving at once.

use perch::channel::{InboundEvent, Sender};
use perch::host::clock::system_clock;
use perch::store::inbox::{Inbox, Recorded};
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
        replying_to: None,
        edit_of: None,
        refused: None,
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
#[allow(
    dead_code,
    clippy::unwrap_used,
    reason = "the suite's in-process service, shared with the tests, of which this uses a part"
)]
#[path = "../suite/support/in_process.rs"]
mod in_process;

#[cfg(feature = "sandbox-double")]
mod double {
    use super::in_process::InProcess;
    use perch::service::LaneLimits;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    pub async fn measure(events: usize) {
        let mut service = InProcess::start(LaneLimits::default(), |_| {});
        for n in 0..events {
            let text = format!("bench-{n}");
            service.send(u64::try_from(n % 50).unwrap_or(0), &text);
            // One at a time, so each measures the path, not a queue behind other runs.
            service
                .until(
                    &format!("event {n} reached its lane"),
                    Duration::from_secs(30),
                    |seen| seen.requests.iter().any(|(last, _, _)| *last == text),
                )
                .await;
        }
        let mut latencies: Vec<Duration> = service.seen(|seen| {
            let arrived: HashMap<&str, Instant> = seen
                .arrived
                .iter()
                .map(|(text, at)| (text.as_str(), *at))
                .collect();
            seen.requests
                .iter()
                .filter_map(|(text, _, at)| {
                    arrived
                        .get(text.as_str())
                        .map(|arrived| at.duration_since(*arrived))
                })
                .collect()
        });
        service.stop().await;
        latencies.sort();
        let p50 = latencies[latencies.len() / 2];
        let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
        println!(
            "inbox, arrival at a connector -> its lane's model request: {} events, one at a time: p50 {p50:.2?}, p99 {p99:.2?}",
            latencies.len()
        );
    }
}
