//! The outbox's records: each journal item of `.perch/outbox/` is one [`OutboxRecord`], and the
//! delivery an intent records.

use crate::attachment::OutboundFile;
use crate::delivery::Sent;
use crate::id::OperationId;
use crate::log::Settled;
use crate::name::LaneName;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
        /// Every attempt at this delivery is preceded by a [`OutboxRecord::Sending`], so without
        /// one it was never attempted. False in outboxes written before perch marked its
        /// attempts, whose unreceipted intents may have been posted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        marked: bool,
    },
    /// perch is about to hand the delivery recorded as `intent` to its platform: from here it may
    /// have been posted. Not a settlement; consumed as soon as it is written, like `unsent`.
    Sending { intent: u64 },
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

/// One outgoing message, already split to the platform's limit and formatted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// perch's id for this delivery: at most 25 ASCII characters (Discord's nonce limit), the
    /// same on every resend, so platforms with idempotency can drop a duplicate.
    pub id: String,
    pub room: String,
    pub thread: Option<String>,
    /// The `platform_id` of the message this answers.
    pub reply_to: Option<String>,
    pub text: String,
    /// Workspace files to attach, read at delivery time and handed to the connector's `post`; the
    /// outbox journals which files, never their bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<OutboundFile>,
}

/// What the platform answered to a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The platform's id for the posted message.
    pub platform_id: String,
}

impl OutboxRecord {
    /// Reads the record a journal item's body holds: the one reader of the outbox's lines.
    pub fn read(body: &serde_json::Value) -> Result<OutboxRecord, serde_json::Error> {
        OutboxRecord::deserialize(body)
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
            OutboxRecord::Intent { .. }
            | OutboxRecord::Sending { .. }
            | OutboxRecord::Unsent { .. } => None,
        }
    }
}

/// Whether each unreceipted delivery may have been posted, read from the outbox's records in
/// the order they were written: an intent starts as never attempted (or, unmarked, as possibly
/// posted), `sending` makes it possibly posted and `unsent` certainly not again.
#[derive(Debug, Default)]
pub struct Attempted {
    intents: BTreeMap<u64, Sent>,
}

impl Attempted {
    /// Takes the record written as `seq`; records must come in `seq` order.
    pub fn read(&mut self, seq: u64, record: &OutboxRecord) {
        match record {
            OutboxRecord::Intent { marked, .. } => {
                let sent = if *marked { Sent::Not } else { Sent::Maybe };
                self.intents.insert(seq, sent);
            }
            OutboxRecord::Sending { intent } => self.set(*intent, Sent::Maybe),
            OutboxRecord::Unsent { intents, .. } => {
                for intent in intents {
                    self.set(*intent, Sent::Not);
                }
            }
            OutboxRecord::Receipt { .. }
            | OutboxRecord::Unknown { .. }
            | OutboxRecord::Dropped { .. } => {}
        }
    }

    fn set(&mut self, intent: u64, sent: Sent) {
        if let Some(known) = self.intents.get_mut(&intent) {
            *known = sent;
        }
    }

    /// Whether the delivery recorded as `intent` may have been posted; an intent never read is
    /// taken as possibly posted.
    pub fn sent(&self, intent: u64) -> Sent {
        self.intents.get(&intent).copied().unwrap_or(Sent::Maybe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(body: &str) -> serde_json::Value {
        serde_json::from_str(body).unwrap()
    }

    fn hi() -> Delivery {
        Delivery {
            id: "d0123456789abcdef01234567".into(),
            room: "42".into(),
            thread: None,
            reply_to: Some("42:17".into()),
            text: "hi".into(),
            attachments: Vec::new(),
        }
    }

    #[test]
    fn outbox_records_golden() {
        let table = [
            (
                OutboxRecord::Intent {
                    channel: "tg".into(),
                    delivery: hi(),
                    lane: None,
                    marked: false,
                },
                concat!(
                    r#"{"type":"intent","channel":"tg","delivery":{"id":"d0123456789abcdef01234567","#,
                    r#""room":"42","thread":null,"reply_to":"42:17","text":"hi"}}"#
                ),
            ),
            (
                OutboxRecord::Intent {
                    channel: "tg".into(),
                    delivery: hi(),
                    lane: Some(DeliveryLane::new(
                        LaneName::try_from("tg-42").unwrap(),
                        Some(OperationId::from_bytes([1; 16])),
                    )),
                    marked: true,
                },
                concat!(
                    r#"{"type":"intent","channel":"tg","delivery":{"id":"d0123456789abcdef01234567","#,
                    r#""room":"42","thread":null,"reply_to":"42:17","text":"hi"},"#,
                    r#""lane":{"lane":"tg-42","op":"01010101-0101-0101-0101-010101010101"},"#,
                    r#""marked":true}"#
                ),
            ),
            (
                OutboxRecord::Sending { intent: 1 },
                r#"{"type":"sending","intent":1}"#,
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
    fn an_intent_with_files_in_a_thread_golden() {
        let record = OutboxRecord::Intent {
            channel: "mx".into(),
            delivery: Delivery {
                id: "d0123456789abcdef01234567".into(),
                room: "!r:x".into(),
                thread: Some("$root:x".into()),
                reply_to: None,
                text: "here".into(),
                attachments: vec![OutboundFile {
                    path: "notes/report.pdf".into(),
                    name: "report.pdf".into(),
                }],
            },
            lane: Some(DeliveryLane::new(LaneName::try_from("mx-r").unwrap(), None)),
            marked: false,
        };
        let line = concat!(
            r#"{"type":"intent","channel":"mx","delivery":{"id":"d0123456789abcdef01234567","#,
            r#""room":"!r:x","thread":"$root:x","reply_to":null,"text":"here","#,
            r#""attachments":[{"path":"notes/report.pdf","name":"report.pdf"}]},"#,
            r#""lane":{"lane":"mx-r"}}"#
        );
        assert_eq!(serde_json::to_string(&record).unwrap(), line);
        assert_eq!(OutboxRecord::read(&item(line)).unwrap(), record);
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
            (r#"{"type":"sending","intent":1}"#, None),
        ];
        for (line, settled) in table {
            assert_eq!(OutboxRecord::read(&item(line)).unwrap().settled(), settled);
        }
    }

    #[test]
    fn a_delivery_may_have_been_posted_only_once_an_attempt_at_it_began() {
        let intent = |marked| OutboxRecord::Intent {
            channel: "tg".into(),
            delivery: hi(),
            lane: None,
            marked,
        };
        let sending = OutboxRecord::Sending { intent: 1 };
        let unsent = OutboxRecord::Unsent {
            intents: vec![1],
            reason: "rate limited".into(),
        };
        let table: [(&str, Vec<OutboxRecord>, Sent); 7] = [
            ("recorded, never attempted", vec![intent(true)], Sent::Not),
            (
                "attempted",
                vec![intent(true), sending.clone()],
                Sent::Maybe,
            ),
            (
                "attempted, then known not posted",
                vec![intent(true), sending.clone(), unsent.clone()],
                Sent::Not,
            ),
            (
                "attempted again after that",
                vec![
                    intent(true),
                    sending.clone(),
                    unsent.clone(),
                    sending.clone(),
                ],
                Sent::Maybe,
            ),
            (
                "written before attempts were marked",
                vec![intent(false)],
                Sent::Maybe,
            ),
            (
                "written before, then stopped while it waited",
                vec![intent(false), unsent],
                Sent::Not,
            ),
            ("a mark for an intent not read", vec![sending], Sent::Maybe),
        ];
        for (case, records, sent) in table {
            let mut attempted = Attempted::default();
            for record in &records {
                let seq = match record {
                    OutboxRecord::Intent { .. } => 1,
                    _ => 2,
                };
                attempted.read(seq, record);
            }
            assert_eq!(attempted.sent(1), sent, "{case}");
        }
    }
}
