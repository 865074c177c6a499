//! The durable outbox: a delivery is recorded (fsynced) with its id when it is queued, each
//! attempt at it is marked (fsynced) just before the platform call, and its receipt is recorded
//! after. On a restart, a delivery never attempted, or known not posted since, is sent; one
//! attempted without a receipt is resent with the same id only inside the platform's own
//! deduplication window, and outside it (and always on Telegram and Slack, which have none) it
//! is marked `unknown` and reported, never resent. Past the time to live it is dropped with a
//! record.

use crate::channel::Delivery;
use crate::host::clock::Clock;
use crate::log::{Journal, JournalItem, JournalWriter, LogError};
use perch_core::Timestamp;
use perch_core::delivery::{Sent, Unreceipted, delivery_id, unreceipted};
use perch_core::journal::outbox::Attempted;
pub use perch_core::journal::outbox::{DeliveryLane, OutboxRecord};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// Deliveries older than this when perch restarts are dropped, not sent late.
pub const DELIVERY_TTL: Duration = Duration::from_secs(3600);

/// How long settled deliveries stay on disk, for `perch status`.
const RETAIN: Duration = Duration::from_secs(24 * 3600);
const MAX_SEGMENT_BYTES: u64 = 8 << 20;

/// A delivery recorded and not settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    pub seq: u64,
    pub at: Timestamp,
    pub channel: String,
    pub delivery: Delivery,
    pub lane: Option<DeliveryLane>,
    /// Whether it may have been posted.
    pub sent: Sent,
}

/// What the outbox held when it was opened.
#[derive(Debug, Clone, Default)]
pub struct OutboxBacklog {
    pub unsettled: Vec<Unsettled>,
    /// Deliveries marked unknown, still on disk: `(channel, delivery id, reason)`.
    pub unknown: Vec<(String, String, String)>,
    /// `(channel, platform id)` of every message a delivery on disk answers: a reply to it was
    /// at least recorded, so recovery never writes another.
    pub replied_to: HashSet<(String, String)>,
}

/// A handle to the outbox's writer. Clones share it.
#[derive(Debug, Clone)]
pub struct Outbox {
    writer: JournalWriter,
    clock: Clock,
}

impl Outbox {
    /// Opens the journal in `dir` and starts its writer thread. Blocking. What a crash left
    /// unconsumed though it is done with (a settled delivery and the record that settled it, an
    /// `unsent` record) is consumed now, so it is not counted as pending forever.
    pub fn open(dir: &Path, clock: Clock) -> Result<(Outbox, OutboxBacklog), LogError> {
        let (mut journal, contents) =
            Journal::open_retaining(dir, MAX_SEGMENT_BYTES, RETAIN, clock.clone())?;
        let mut intents: BTreeMap<u64, (Timestamp, String, Delivery, Option<DeliveryLane>)> =
            BTreeMap::new();
        let mut settled = HashSet::new();
        let mut attempted = Attempted::default();
        let mut backlog = OutboxBacklog::default();
        let mut all: Vec<&JournalItem> =
            contents.consumed.iter().chain(&contents.pending).collect();
        all.sort_by_key(|item| item.seq);
        for item in &all {
            let record = OutboxRecord::read(&item.body).ok();
            if let Some(record) = &record {
                attempted.read(item.seq, record);
            }
            match record {
                Some(OutboxRecord::Intent {
                    channel,
                    delivery,
                    lane,
                    ..
                }) => {
                    if let Some(to) = &delivery.reply_to {
                        backlog.replied_to.insert((channel.clone(), to.clone()));
                    }
                    intents.insert(item.seq, (item.at, channel, delivery, lane));
                }
                Some(
                    OutboxRecord::Receipt { intent, .. } | OutboxRecord::Dropped { intent, .. },
                ) => {
                    settled.insert(intent);
                }
                Some(OutboxRecord::Unknown { intent, reason }) => {
                    settled.insert(intent);
                    if let Some((_, channel, delivery, _)) = intents.get(&intent) {
                        backlog
                            .unknown
                            .push((channel.clone(), delivery.id.clone(), reason));
                    }
                }
                Some(OutboxRecord::Sending { .. } | OutboxRecord::Unsent { .. }) | None => {}
            }
        }
        let pending: HashSet<u64> = contents.pending.iter().map(|item| item.seq).collect();
        let done: Vec<u64> = contents
            .pending
            .iter()
            .filter(|item| {
                settled.contains(&item.seq)
                    || OutboxRecord::read(&item.body)
                        .is_ok_and(|record| !matches!(record, OutboxRecord::Intent { .. }))
            })
            .map(|item| item.seq)
            .collect();
        journal.consume(&done)?;
        backlog.unsettled = intents
            .into_iter()
            .filter(|(seq, _)| pending.contains(seq) && !settled.contains(seq))
            .map(|(seq, (at, channel, delivery, lane))| Unsettled {
                seq,
                at,
                channel,
                delivery,
                lane,
                sent: attempted.sent(seq),
            })
            .collect();
        let writer = JournalWriter::start(journal, dir, "outbox")?;
        Ok((Outbox { writer, clock }, backlog))
    }

    /// A fresh delivery id.
    pub fn new_id() -> String {
        delivery_id(*uuid::Uuid::now_v7().as_bytes())
    }

    /// Records the intent to send `delivery`, belonging to `lane` (fsynced); returns its
    /// sequence number.
    pub async fn intend(
        &self,
        channel: &str,
        delivery: &Delivery,
        lane: Option<&DeliveryLane>,
    ) -> Result<u64, LogError> {
        self.append(&OutboxRecord::Intent {
            channel: channel.to_owned(),
            delivery: delivery.clone(),
            lane: lane.cloned(),
            marked: true,
        })
        .await
    }

    /// Records (fsynced) that the delivery recorded as `intent` is about to be handed to its
    /// platform, so a crash from here on leaves it possibly posted.
    pub async fn sending(&self, intent: u64) -> Result<(), LogError> {
        let seq = self.append(&OutboxRecord::Sending { intent }).await?;
        self.writer.consume(vec![seq]).await
    }

    /// Records how the delivery recorded as `intent` ended, and settles it.
    pub async fn settle(&self, intent: u64, record: OutboxRecord) -> Result<(), LogError> {
        let seq = self.append(&record).await?;
        self.writer.consume(vec![intent, seq]).await
    }

    /// Records that the deliveries recorded as `intents` were certainly not sent (perch is
    /// stopping while they wait, or the platform refused an attempt before taking it), so the
    /// next start sends them.
    pub async fn unsent(&self, intents: Vec<u64>, reason: &str) -> Result<(), LogError> {
        if intents.is_empty() {
            return Ok(());
        }
        let record = OutboxRecord::Unsent {
            intents,
            reason: reason.to_owned(),
        };
        let seq = self.append(&record).await?;
        self.writer.consume(vec![seq]).await
    }

    /// What to do with an unsettled delivery now, given the platform's resend window.
    pub fn decide(&self, unsettled: &Unsettled, resend_window: Option<Duration>) -> Unreceipted {
        unreceipted(
            unsettled.at,
            self.clock.now(),
            resend_window,
            DELIVERY_TTL,
            unsettled.sent,
        )
    }

    /// Deliveries recorded and not settled.
    pub async fn depth(&self) -> usize {
        self.writer.depth().await
    }

    async fn append(&self, record: &OutboxRecord) -> Result<u64, LogError> {
        self.writer.append_record(record, "an outbox record").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Receipt;
    use crate::host::clock::system_clock;
    use crate::log::peek_journal;

    fn intent(reply_to: &str) -> serde_json::Value {
        serde_json::to_value(OutboxRecord::Intent {
            channel: "sl".into(),
            delivery: Delivery {
                id: Outbox::new_id(),
                room: "C1".into(),
                thread: None,
                reply_to: Some(reply_to.into()),
                text: "hi".into(),
                attachments: Vec::new(),
            },
            lane: None,
            marked: false,
        })
        .unwrap()
    }

    fn as_body(record: OutboxRecord) -> serde_json::Value {
        serde_json::to_value(record).unwrap()
    }

    /// Opens the outbox in `dir` again, waiting for the previous handle's writer thread to let
    /// go of the journal (it does once it sees the handle gone).
    fn reopen(dir: &Path) -> (Outbox, OutboxBacklog) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match Outbox::open(dir, system_clock()) {
                Err(LogError::Held { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                opened => return opened.unwrap(),
            }
        }
    }

    /// Each unsettled delivery's intent and whether it may have been posted.
    fn unsettled(backlog: &OutboxBacklog) -> Vec<(u64, Sent)> {
        backlog
            .unsettled
            .iter()
            .map(|delivery| (delivery.seq, delivery.sent))
            .collect()
    }

    #[test]
    fn what_a_crash_left_settled_and_unconsumed_is_consumed_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open_retaining(dir.path(), MAX_SEGMENT_BYTES, RETAIN, system_clock()).unwrap();
        // perch died after each of the last three records and before consuming what it
        // settles (a receipt, an unknown fate, an `unsent` mark); the fourth delivery waited.
        let intents = journal
            .append(&[
                intent("C1:1"),
                intent("C1:2"),
                intent("C1:3"),
                intent("C1:4"),
            ])
            .unwrap();
        let receipt = Receipt {
            platform_id: "C1:5".into(),
        };
        journal
            .append(&[
                as_body(OutboxRecord::Receipt {
                    intent: intents[0],
                    receipt,
                }),
                as_body(OutboxRecord::Unknown {
                    intent: intents[1],
                    reason: "perch stopped".into(),
                }),
                as_body(OutboxRecord::Unsent {
                    intents: vec![intents[2]],
                    reason: "perch stopped while this delivery waited".into(),
                }),
            ])
            .unwrap();
        drop(journal);

        let (outbox, backlog) = Outbox::open(dir.path(), system_clock()).unwrap();
        drop(outbox);
        let waiting = [(intents[2], Sent::Not), (intents[3], Sent::Maybe)];
        assert_eq!(unsettled(&backlog), waiting);
        assert_eq!(backlog.unknown.len(), 1);
        let pending: Vec<u64> = peek_journal(dir.path())
            .unwrap()
            .pending
            .iter()
            .map(|item| item.seq)
            .collect();
        assert_eq!(
            pending,
            [intents[2], intents[3]],
            "only the unsettled deliveries are pending"
        );

        assert_eq!(
            unsettled(&reopen(dir.path()).1),
            waiting,
            "the consumed `unsent` record is still read"
        );
    }

    #[tokio::test]
    async fn a_delivery_is_possibly_posted_from_its_attempt_on_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let (outbox, _) = Outbox::open(dir.path(), system_clock()).unwrap();
        let delivery = |text: &str| Delivery {
            id: Outbox::new_id(),
            room: "C1".into(),
            thread: None,
            reply_to: None,
            text: text.into(),
            attachments: Vec::new(),
        };
        let queued = outbox
            .intend("sl", &delivery("queued"), None)
            .await
            .unwrap();
        let attempted = outbox
            .intend("sl", &delivery("attempted"), None)
            .await
            .unwrap();
        let refused = outbox
            .intend("sl", &delivery("rate limited"), None)
            .await
            .unwrap();
        outbox.sending(attempted).await.unwrap();
        outbox.sending(refused).await.unwrap();
        outbox.unsent(vec![refused], "rate limited").await.unwrap();
        drop(outbox);

        let expected = [
            (queued, Sent::Not),
            (attempted, Sent::Maybe),
            (refused, Sent::Not),
        ];
        for _ in 0..2 {
            assert_eq!(unsettled(&reopen(dir.path()).1), expected);
        }
    }
}
