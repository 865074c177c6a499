//! The inbox's records: each journal item of `.perch/inbox/` is one [`InboxRecord`].

use crate::chat::Admitted;
use crate::journal::event::InboundEvent;
use serde::{Deserialize, Serialize};

/// One journal item of the inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InboxRecord {
    /// A raw event, as the connector handed it over.
    Event {
        channel: String,
        event: Box<InboundEvent>,
    },
    /// What became of the event journaled as `event` (on disk, a `verdict` record).
    #[serde(rename = "verdict")]
    Disposition {
        event: u64,
        #[serde(rename = "verdict")]
        disposition: Disposition,
    },
    /// The channel's `hook` (its file) started deciding the event journaled as `event`. A
    /// mark without a disposition after it means perch stopped during the hook: at restart the
    /// event is rejected rather than handed to the hook again. Journals written before this
    /// record existed simply have none.
    Deciding { event: u64, hook: String },
}

/// What perch decided about one event (admission, then the hook): its disposition. On disk its
/// tag is `verdict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Disposition {
    /// A message for `lane`, as the hook left it.
    Item { lane: String, text: String },
    /// A group message that did not address the agent: kept as context, starts no run.
    Context,
    /// Older than the channel's `max_age` when it arrived: not answered.
    Stale,
    /// The hook returned nothing.
    Dropped,
    /// The sender may not talk to the agent.
    Refused { reason: String },
    /// The hook failed on this event.
    Error { reason: String },
    /// A chat command (`/stop`, `/new`, `/status`), answered by perch itself.
    Command { command: String },
    /// An edit of an earlier message ([`InboundEvent::edit_of`]): kept, never answered.
    Edited,
}

impl Disposition {
    /// What the bot-loop guard counts of it: the hook ran on the event (a turn), the event was
    /// kept as context, or it was not admitted.
    pub fn admitted(&self) -> Admitted {
        match self {
            Disposition::Item { .. }
            | Disposition::Dropped
            | Disposition::Error { .. }
            | Disposition::Command { .. } => Admitted::Answered,
            Disposition::Context => Admitted::Context,
            Disposition::Stale | Disposition::Refused { .. } | Disposition::Edited => Admitted::No,
        }
    }
}

impl InboxRecord {
    /// Reads the record a journal item's body holds: the one reader of the inbox's lines.
    pub fn read(body: &serde_json::Value) -> Result<InboxRecord, serde_json::Error> {
        InboxRecord::deserialize(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::event::Sender;
    use chrono::TimeZone;

    fn item(body: &str) -> serde_json::Value {
        serde_json::from_str(body).unwrap()
    }

    /// Ada's direct message in Telegram's room 42: the event the records below vary.
    fn adas_hello() -> InboundEvent {
        InboundEvent {
            platform_id: "42:17".into(),
            cursor: Some("1001".into()),
            room: "42".into(),
            thread: None,
            sender: Sender {
                id: "42".into(),
                name: "Ada".into(),
                is_bot: false,
            },
            direct: true,
            addressed: true,
            text: "hello".into(),
            sent_at: chrono::Utc
                .with_ymd_and_hms(2026, 12, 2, 5, 59, 58)
                .unwrap(),
            attachments: Vec::new(),
            replying_to: None,
            edit_of: None,
            refused: None,
        }
    }

    /// `record` is written as `line`, and `line` read back is `record`.
    fn assert_golden(record: &InboxRecord, line: &str) {
        assert_eq!(serde_json::to_string(record).unwrap(), line);
        assert_eq!(&InboxRecord::read(&item(line)).unwrap(), record);
    }

    #[test]
    fn an_event_the_connector_refused_golden() {
        let record = InboxRecord::Event {
            channel: "mx".into(),
            event: Box::new(InboundEvent {
                platform_id: "$ev".into(),
                cursor: Some("s1".into()),
                room: "!lobby:example.org".into(),
                sender: Sender {
                    id: "@mallory:example.org".into(),
                    name: "mallory".into(),
                    is_bot: false,
                },
                direct: false,
                text: "hi".into(),
                refused: Some("neither the room nor the sender is allowed".into()),
                ..adas_hello()
            }),
        };
        let line = concat!(
            r#"{"type":"event","channel":"mx","event":{"platform_id":"$ev","cursor":"s1","#,
            r#""room":"!lobby:example.org","thread":null,"sender":{"id":"@mallory:example.org","#,
            r#""name":"mallory","is_bot":false},"direct":false,"addressed":true,"text":"hi","#,
            r#""sent_at":"2026-12-02T05:59:58Z","#,
            r#""refused":"neither the room nor the sender is allowed"}}"#
        );
        assert_golden(&record, line);
    }

    #[test]
    fn an_event_record_golden() {
        let record = InboxRecord::Event {
            channel: "tg".into(),
            event: Box::new(adas_hello()),
        };
        let line = concat!(
            r#"{"type":"event","channel":"tg","event":{"platform_id":"42:17","cursor":"1001","#,
            r#""room":"42","thread":null,"sender":{"id":"42","name":"Ada","is_bot":false},"#,
            r#""direct":true,"addressed":true,"text":"hello","sent_at":"2026-12-02T05:59:58Z"}}"#
        );
        assert_golden(&record, line);
    }

    #[test]
    fn a_disposition_record_golden() {
        let record = InboxRecord::Disposition {
            event: 3,
            disposition: Disposition::Item {
                lane: "tg-42".into(),
                text: "hello".into(),
            },
        };
        let line = r#"{"type":"verdict","event":3,"verdict":{"verdict":"item","lane":"tg-42","text":"hello"}}"#;
        assert_golden(&record, line);
    }

    #[test]
    fn an_edit_and_its_disposition_golden() {
        let event = InboundEvent {
            platform_id: "42:17:edited:1796104800".into(),
            cursor: Some("1002".into()),
            addressed: false,
            text: "hello again".into(),
            replying_to: Some(Box::new(crate::journal::event::Quote {
                platform_id: "42:16".into(),
                author: Some(Sender {
                    id: "7".into(),
                    name: "perch".into(),
                    is_bot: true,
                }),
                text: "hi".into(),
            })),
            edit_of: Some("42:17".into()),
            ..adas_hello()
        };
        let record = InboxRecord::Event {
            channel: "tg".into(),
            event: Box::new(event),
        };
        let line = concat!(
            r#"{"type":"event","channel":"tg","event":{"platform_id":"42:17:edited:1796104800","#,
            r#""cursor":"1002","room":"42","thread":null,"sender":{"id":"42","name":"Ada","#,
            r#""is_bot":false},"direct":true,"addressed":false,"text":"hello again","#,
            r#""sent_at":"2026-12-02T05:59:58Z","replying_to":{"platform_id":"42:16","#,
            r#""author":{"id":"7","name":"perch","is_bot":true},"text":"hi"},"edit_of":"42:17"}}"#
        );
        assert_golden(&record, line);
        let disposition = InboxRecord::Disposition {
            event: 4,
            disposition: Disposition::Edited,
        };
        assert_golden(
            &disposition,
            r#"{"type":"verdict","event":4,"verdict":{"verdict":"edited"}}"#,
        );
        assert_eq!(Disposition::Edited.admitted(), Admitted::No);
    }

    #[test]
    fn every_disposition_and_the_deciding_mark_golden() {
        let table = [
            (
                Disposition::Context,
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"context"}}"#,
            ),
            (
                Disposition::Stale,
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"stale"}}"#,
            ),
            (
                Disposition::Dropped,
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"dropped"}}"#,
            ),
            (
                Disposition::Refused {
                    reason: "not on the allowlist".into(),
                },
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"refused","reason":"not on the allowlist"}}"#,
            ),
            (
                Disposition::Error {
                    reason: "channels/tg.lua:3: boom".into(),
                },
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"error","reason":"channels/tg.lua:3: boom"}}"#,
            ),
            (
                Disposition::Command {
                    command: "/new".into(),
                },
                r#"{"type":"verdict","event":3,"verdict":{"verdict":"command","command":"/new"}}"#,
            ),
        ];
        for (disposition, line) in table {
            let record = InboxRecord::Disposition {
                event: 3,
                disposition,
            };
            assert_golden(&record, line);
        }
        let mark = InboxRecord::Deciding {
            event: 3,
            hook: "channels/tg.lua".into(),
        };
        assert_golden(
            &mark,
            r#"{"type":"deciding","event":3,"hook":"channels/tg.lua"}"#,
        );
    }

    #[test]
    fn an_event_in_a_thread_with_a_file_and_an_unknown_author_quoted_golden() {
        let record = InboxRecord::Event {
            channel: "mx".into(),
            event: Box::new(InboundEvent {
                platform_id: "$e:x".into(),
                cursor: None,
                room: "!r:x".into(),
                thread: Some("$root:x".into()),
                sender: Sender {
                    id: "@ada:x".into(),
                    name: "Ada".into(),
                    is_bot: false,
                },
                direct: false,
                text: "see the file".into(),
                attachments: vec![crate::attachment::Attachment {
                    source: "mxc://x/abc".into(),
                    name: Some("report.pdf".into()),
                    content_type: Some("application/pdf".into()),
                    size: Some(1234),
                    encrypted: true,
                }],
                replying_to: Some(Box::new(crate::journal::event::Quote {
                    platform_id: "$q:x".into(),
                    author: None,
                    text: String::new(),
                })),
                ..adas_hello()
            }),
        };
        let line = concat!(
            r#"{"type":"event","channel":"mx","event":{"platform_id":"$e:x","cursor":null,"#,
            r#""room":"!r:x","thread":"$root:x","sender":{"id":"@ada:x","name":"Ada","#,
            r#""is_bot":false},"direct":false,"addressed":true,"text":"see the file","#,
            r#""sent_at":"2026-12-02T05:59:58Z","attachments":[{"source":"mxc://x/abc","#,
            r#""name":"report.pdf","content_type":"application/pdf","size":1234,"#,
            r#""encrypted":true}],"replying_to":{"platform_id":"$q:x","text":""}}}"#
        );
        assert_golden(&record, line);
    }

    #[test]
    fn an_event_journaled_before_attachments_replies_and_edits_existed_still_reads() {
        let line = concat!(
            r#"{"type":"event","channel":"tg","event":{"platform_id":"42:17","cursor":"1001","#,
            r#""room":"42","thread":null,"sender":{"id":"42","name":"Ada","is_bot":false},"#,
            r#""direct":true,"addressed":true,"text":"hello","sent_at":"2026-12-02T05:59:58Z"}}"#
        );
        let Ok(InboxRecord::Event { event, .. }) = InboxRecord::read(&item(line)) else {
            panic!("an event");
        };
        assert!(event.attachments.is_empty());
        assert_eq!(event.replying_to, None);
        assert_eq!(event.edit_of, None);
    }
}
