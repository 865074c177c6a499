//! The durable outbox: a delivery is recorded (fsynced) with its id before any platform call,
//! and its receipt after. On a restart, a delivery without a receipt is resent with the same id
//! only inside the platform's own deduplication window; outside it (and always on Telegram,
//! which has none) it is marked `unknown` and reported, never resent; past the time to live it
//! is dropped with a record.

use crate::channel::{Delivery, Receipt};
use crate::clock::Clock;
use crate::log::{Journal, JournalItem, JournalWriter, LogError};
use perch_core::Timestamp;
use perch_core::delivery::{Sent, Unreceipted, delivery_id, unreceipted};
use perch_core::id::OperationId;
use perch_core::log::Settled;
use perch_core::name::LaneName;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// Deliveries older than this when perch restarts are dropped, not sent late.
pub const DELIVERY_TTL: Duration = Duration::from_secs(3600);

/// How long settled deliveries stay on disk, for `perch status`.
const RETAIN: Duration = Duration::from_secs(24 * 3600);
const MAX_SEGMENT_BYTES: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutboxRecord {
    /// About to send `delivery` on `channel`; `lane` is the lane whose session log is told how
    /// it settled (none for an owner alert, and in outboxes written before lanes were told).
    Intent {
        channel: String,
        delivery: Delivery,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lane: Option<DeliveryLane>,
    },
    /// The platform took the delivery recorded as `intent`.
    Receipt { intent: u64, receipt: Receipt },
    /// Whether the delivery recorded as `intent` was posted is unknown; it is not resent.
    Unknown { intent: u64, reason: String },
    /// The delivery recorded as `intent` was not sent: refused by the platform, or too old.
    Dropped { intent: u64, reason: String },
    /// perch stopped while the deliveries recorded as `intents` waited (their turn, a rate
    /// limit, a retry): certainly not posted, so the next start sends them on any platform.
    /// Not a settlement: each is settled when it is sent. Consumed as soon as it is written (it
    /// stays on disk as long as any of its intents is unsettled, since those are older).
    Unsent { intents: Vec<u64>, reason: String },
}

/// The lane a delivery belongs to, and the operation whose reply it carries (none for a chat
/// command's reply, a notice or a recovery note).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryLane {
    pub lane: LaneName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OperationId>,
}

impl DeliveryLane {
    pub fn new(lane: LaneName, op: Option<OperationId>) -> DeliveryLane {
        DeliveryLane { lane, op }
    }
}

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
    /// Opens the journal in `dir` and starts its writer thread. Blocking.
    pub fn open(dir: &Path, clock: Clock) -> Result<(Outbox, OutboxBacklog), LogError> {
        let (journal, contents) =
            Journal::open_retaining(dir, MAX_SEGMENT_BYTES, RETAIN, clock.clone())?;
        let mut intents: BTreeMap<u64, (Timestamp, String, Delivery, Option<DeliveryLane>)> =
            BTreeMap::new();
        let mut settled = HashSet::new();
        let mut unsent = HashSet::new();
        let mut backlog = OutboxBacklog::default();
        let all: Vec<&JournalItem> = contents.consumed.iter().chain(&contents.pending).collect();
        for item in &all {
            match OutboxRecord::read(item).ok() {
                Some(OutboxRecord::Intent {
                    channel,
                    delivery,
                    lane,
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
                Some(OutboxRecord::Unsent { intents, .. }) => unsent.extend(intents),
                None => {}
            }
        }
        let pending: HashSet<u64> = contents.pending.iter().map(|item| item.seq).collect();
        backlog.unsettled = intents
            .into_iter()
            .filter(|(seq, _)| pending.contains(seq) && !settled.contains(seq))
            .map(|(seq, (at, channel, delivery, lane))| Unsettled {
                seq,
                at,
                channel,
                delivery,
                lane,
                sent: if unsent.contains(&seq) {
                    Sent::Not
                } else {
                    Sent::Maybe
                },
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
        })
        .await
    }

    /// Records how the delivery recorded as `intent` ended, and settles it.
    pub async fn settle(&self, intent: u64, record: OutboxRecord) -> Result<(), LogError> {
        let seq = self.append(&record).await?;
        self.writer.consume(vec![intent, seq]).await
    }

    /// Records that the deliveries recorded as `intents` were certainly not sent (perch is
    /// stopping while they wait), so the next start sends them.
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

impl OutboxRecord {
    /// Reads the record a journal item holds: the one reader of the outbox's lines.
    pub fn read(item: &JournalItem) -> Result<OutboxRecord, serde_json::Error> {
        OutboxRecord::deserialize(&item.body)
    }

    /// How a settlement ended, as a lane's `delivery_settled` says it; `None` for a record that
    /// settles nothing. Refused and never reaching the platform are both `not_sent`.
    pub fn settled(&self) -> Option<Settled> {
        match self {
            OutboxRecord::Receipt { receipt, .. } => Some(Settled::Sent {
                platform_id: receipt.platform_id.clone(),
            }),
            OutboxRecord::Unknown { reason, .. } => Some(Settled::Unknown {
                reason: reason.clone(),
            }),
            OutboxRecord::Dropped { reason, .. } => Some(Settled::NotSent {
                reason: reason.clone(),
            }),
            OutboxRecord::Intent { .. } | OutboxRecord::Unsent { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn item(body: &str) -> JournalItem {
        JournalItem {
            seq: 1,
            at: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 6, 0, 0).unwrap(),
            body: serde_json::from_str(body).unwrap(),
        }
    }

    #[test]
    fn outbox_records_golden() {
        let table = [
            (
                OutboxRecord::Intent {
                    channel: "tg".into(),
                    delivery: Delivery {
                        id: "d0123456789abcdef01234567".into(),
                        room: "42".into(),
                        thread: None,
                        reply_to: Some("42:17".into()),
                        text: "hi".into(),
                        attachments: Vec::new(),
                    },
                    lane: None,
                },
                concat!(
                    r#"{"type":"intent","channel":"tg","delivery":{"id":"d0123456789abcdef01234567","#,
                    r#""room":"42","thread":null,"reply_to":"42:17","text":"hi"}}"#
                ),
            ),
            (
                OutboxRecord::Intent {
                    channel: "tg".into(),
                    delivery: Delivery {
                        id: "d0123456789abcdef01234567".into(),
                        room: "42".into(),
                        thread: None,
                        reply_to: Some("42:17".into()),
                        text: "hi".into(),
                        attachments: Vec::new(),
                    },
                    lane: Some(DeliveryLane::new(
                        LaneName::try_from("tg-42").unwrap(),
                        Some(OperationId::from_bytes([1; 16])),
                    )),
                },
                concat!(
                    r#"{"type":"intent","channel":"tg","delivery":{"id":"d0123456789abcdef01234567","#,
                    r#""room":"42","thread":null,"reply_to":"42:17","text":"hi"},"#,
                    r#""lane":{"lane":"tg-42","op":"01010101-0101-0101-0101-010101010101"}}"#
                ),
            ),
            (
                OutboxRecord::Receipt {
                    intent: 1,
                    receipt: Receipt {
                        platform_id: "42:18".into(),
                    },
                },
                r#"{"type":"receipt","intent":1,"receipt":{"platform_id":"42:18"}}"#,
            ),
            (
                OutboxRecord::Unknown {
                    intent: 1,
                    reason: "failed: timeout".into(),
                },
                r#"{"type":"unknown","intent":1,"reason":"failed: timeout"}"#,
            ),
            (
                OutboxRecord::Dropped {
                    intent: 1,
                    reason: "chat not found".into(),
                },
                r#"{"type":"dropped","intent":1,"reason":"chat not found"}"#,
            ),
            (
                OutboxRecord::Unsent {
                    intents: vec![1, 2],
                    reason: "perch stopped while it was rate-limited".into(),
                },
                r#"{"type":"unsent","intents":[1,2],"reason":"perch stopped while it was rate-limited"}"#,
            ),
        ];
        for (record, line) in table {
            assert_eq!(serde_json::to_string(&record).unwrap(), line);
            assert_eq!(OutboxRecord::read(&item(line)).unwrap(), record);
        }
    }

    #[test]
    fn a_settlement_is_told_to_the_lane_as_sent_unknown_or_not_sent() {
        let table = [
            (
                r#"{"type":"receipt","intent":1,"receipt":{"platform_id":"42:18"}}"#,
                Some(Settled::Sent {
                    platform_id: "42:18".into(),
                }),
            ),
            (
                r#"{"type":"unknown","intent":1,"reason":"failed: timeout"}"#,
                Some(Settled::Unknown {
                    reason: "failed: timeout".into(),
                }),
            ),
            (
                r#"{"type":"dropped","intent":1,"reason":"chat not found"}"#,
                Some(Settled::NotSent {
                    reason: "chat not found".into(),
                }),
            ),
            (
                r#"{"type":"unsent","intents":[1],"reason":"stopping"}"#,
                None,
            ),
        ];
        for (line, settled) in table {
            assert_eq!(OutboxRecord::read(&item(line)).unwrap().settled(), settled);
        }
    }
}
