//! The outbox's records: each journal item of `.perch/outbox/` is one [`OutboxRecord`], and the
//! delivery an intent records.

use crate::attachment::OutboundFile;
use crate::id::OperationId;
use crate::log::Settled;
use crate::name::LaneName;
use serde::{Deserialize, Serialize};

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
            OutboxRecord::Intent { .. } | OutboxRecord::Unsent { .. } => None,
        }
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
        ];
        for (line, settled) in table {
            assert_eq!(OutboxRecord::read(&item(line)).unwrap().settled(), settled);
        }
    }
}
