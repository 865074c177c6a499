//! Socket Mode's frames: what Slack sends over the socket ([`Frame`], read by [`read_frame`]) and
//! the acknowledgement perch sends back ([`ack`]).
//!
//! Reading never fails: a frame perch cannot read becomes [`Frame::Unreadable`], with its
//! envelope id when one could be found, so that it is journaled as such and acknowledged rather
//! than dropped.

use crate::journal::event::shortened;
use serde::Deserialize;

/// How much of an unreadable frame is kept for the journal.
pub const UNREADABLE_EXCERPT_CHARS: usize = 280;

/// One frame Slack sent over a Socket Mode connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// The connection is open and events will follow.
    Hello {
        /// How many connections the app has open, this one included.
        connections: Option<u32>,
        app_id: Option<String>,
    },
    /// An Events API delivery, to be journaled, then acknowledged with [`ack`].
    Events(EventsEnvelope),
    /// Slack is about to close the connection, or has turned Socket Mode off.
    Disconnect { reason: DisconnectReason },
    /// A frame of another type (`slash_commands`, `interactive`): perch takes none, so it is
    /// acknowledged, when it has an envelope id, and otherwise ignored.
    Other {
        kind: String,
        envelope_id: Option<String>,
    },
    /// Not a frame perch can read: journaled as such, and acknowledged when its envelope id was
    /// found.
    Unreadable {
        envelope_id: Option<String>,
        /// Why, in a few words.
        reason: String,
        /// The frame's beginning, at most [`UNREADABLE_EXCERPT_CHARS`] characters.
        excerpt: String,
    },
}

/// An `events_api` envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsEnvelope {
    /// What the acknowledgement names.
    pub envelope_id: String,
    /// 0 for the first delivery; Slack counts up each time it redelivers an envelope that was
    /// not acknowledged in time.
    pub retry_attempt: u32,
    /// Why Slack redelivered it (`timeout`); `None` on a first delivery.
    pub retry_reason: Option<String>,
    /// The `event_callback` payload, read by [`crate::slack::event::classify`].
    pub payload: serde_json::Value,
}

/// Why Slack sent `disconnect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisconnectReason {
    /// Slack's routine replacement of the connection.
    RefreshRequested,
    /// The connection closes in about ten seconds.
    Warning,
    /// Socket Mode was turned off in the app's settings.
    LinkDisabled,
    /// A reason Slack did not document when this was written (`too_many_websockets`).
    Other(String),
}

impl DisconnectReason {
    fn read(reason: &str) -> DisconnectReason {
        match reason {
            "refresh_requested" => DisconnectReason::RefreshRequested,
            "warning" => DisconnectReason::Warning,
            "link_disabled" => DisconnectReason::LinkDisabled,
            other => DisconnectReason::Other(other.to_owned()),
        }
    }

    /// The reason as Slack spells it.
    pub fn as_str(&self) -> &str {
        match self {
            DisconnectReason::RefreshRequested => "refresh_requested",
            DisconnectReason::Warning => "warning",
            DisconnectReason::LinkDisabled => "link_disabled",
            DisconnectReason::Other(other) => other,
        }
    }
}

#[derive(Deserialize)]
struct RawFrame {
    #[serde(rename = "type")]
    kind: Option<String>,
    envelope_id: Option<String>,
}

#[derive(Deserialize)]
struct RawHello {
    num_connections: Option<u32>,
    connection_info: Option<ConnectionInfo>,
}

#[derive(Deserialize)]
struct ConnectionInfo {
    app_id: Option<String>,
}

#[derive(Deserialize)]
struct RawDisconnect {
    reason: String,
}

#[derive(Deserialize)]
struct RawEvents {
    envelope_id: String,
    payload: serde_json::Value,
    #[serde(default)]
    retry_attempt: u32,
    #[serde(default)]
    retry_reason: Option<String>,
}

/// Reads one text frame of a Socket Mode connection.
pub fn read_frame(text: &str) -> Frame {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(error) => return unreadable(None, format!("not JSON: {error}"), text),
    };
    let raw = match RawFrame::deserialize(&value) {
        Ok(raw) => raw,
        Err(error) => return unreadable(None, format!("not a frame: {error}"), text),
    };
    let envelope_id = raw.envelope_id.filter(|id| !id.is_empty());
    let Some(kind) = raw.kind else {
        return unreadable(envelope_id, "a frame with no type".to_owned(), text);
    };
    match kind.as_str() {
        "hello" => match RawHello::deserialize(&value) {
            Ok(hello) => Frame::Hello {
                connections: hello.num_connections,
                app_id: hello.connection_info.and_then(|info| info.app_id),
            },
            Err(error) => unreadable(envelope_id, format!("a hello frame: {error}"), text),
        },
        "disconnect" => match RawDisconnect::deserialize(&value) {
            Ok(disconnect) => Frame::Disconnect {
                reason: DisconnectReason::read(&disconnect.reason),
            },
            Err(error) => unreadable(envelope_id, format!("a disconnect frame: {error}"), text),
        },
        "events_api" => match RawEvents::deserialize(&value) {
            Ok(events) if !events.envelope_id.is_empty() && events.payload.is_object() => {
                Frame::Events(EventsEnvelope {
                    envelope_id: events.envelope_id,
                    retry_attempt: events.retry_attempt,
                    retry_reason: events.retry_reason.filter(|reason| !reason.is_empty()),
                    payload: events.payload,
                })
            }
            Ok(_) => unreadable(
                envelope_id,
                "an events_api envelope with no envelope id or payload".to_owned(),
                text,
            ),
            Err(error) => unreadable(
                envelope_id,
                format!("an events_api envelope: {error}"),
                text,
            ),
        },
        _ => Frame::Other { kind, envelope_id },
    }
}

fn unreadable(envelope_id: Option<String>, reason: String, text: &str) -> Frame {
    Frame::Unreadable {
        envelope_id,
        reason,
        excerpt: shortened(text, UNREADABLE_EXCERPT_CHARS),
    }
}

/// The frame that acknowledges the envelope `envelope_id`: `{"envelope_id":"…"}`.
pub fn ack(envelope_id: &str) -> String {
    serde_json::json!({ "envelope_id": envelope_id }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slack::fixture;

    #[test]
    fn the_documented_frames_read() {
        assert_eq!(
            read_frame(&fixture!("socket-hello.json").text()),
            Frame::Hello {
                connections: Some(1),
                app_id: Some("A01K58AR4RF".into())
            }
        );
        let disconnects = [
            (
                fixture!("socket-disconnect-refresh-requested.json"),
                DisconnectReason::RefreshRequested,
            ),
            (
                fixture!("socket-disconnect-warning.json"),
                DisconnectReason::Warning,
            ),
            (
                fixture!("socket-disconnect-link-disabled.json"),
                DisconnectReason::LinkDisabled,
            ),
        ];
        for (file, reason) in disconnects {
            assert_eq!(read_frame(&file.text()), Frame::Disconnect { reason });
        }
    }

    #[test]
    fn an_events_envelope_keeps_its_id_retry_and_payload() {
        let first = fixture!("events-app-mention.json");
        let Frame::Events(envelope) = read_frame(&first.text()) else {
            panic!("not an events envelope");
        };
        assert_eq!(envelope.envelope_id, "dbdd0ef3-1543-4f94-bfb4-133d0e6c1545");
        assert_eq!((envelope.retry_attempt, envelope.retry_reason), (0, None));
        assert_eq!(envelope.payload, first.body["payload"]);

        let retried = fixture!("events-message-im-retry.json");
        let Frame::Events(envelope) = read_frame(&retried.text()) else {
            panic!("not an events envelope");
        };
        assert_eq!(
            (envelope.retry_attempt, envelope.retry_reason.as_deref()),
            (1, Some("timeout"))
        );
    }

    #[test]
    fn every_frame_reads_as_something_and_keeps_an_id_it_can_find() {
        let long = format!("{{\"type\":\"events_api\",\"x\":\"{}\"", "a".repeat(1000));
        let cases: Vec<(&str, Frame)> = vec![
            (
                r#"{"type":"disconnect","reason":"too_many_websockets"}"#,
                Frame::Disconnect {
                    reason: DisconnectReason::Other("too_many_websockets".into()),
                },
            ),
            (
                r#"{"type":"slash_commands","envelope_id":"e1","payload":{}}"#,
                Frame::Other {
                    kind: "slash_commands".into(),
                    envelope_id: Some("e1".into()),
                },
            ),
            (
                r#"{"type":"interactive","envelope_id":""}"#,
                Frame::Other {
                    kind: "interactive".into(),
                    envelope_id: None,
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(read_frame(text), expected, "{text}");
        }
        let unreadable: Vec<(&str, Option<&str>, &str)> = vec![
            ("not json", None, "not JSON"),
            ("[1,2]", None, "not a frame"),
            (r#"{"envelope_id":"e2"}"#, Some("e2"), "no type"),
            (
                r#"{"type":"events_api","envelope_id":"e3"}"#,
                Some("e3"),
                "an events_api envelope",
            ),
            (
                r#"{"type":"events_api","envelope_id":"e4","payload":"text"}"#,
                Some("e4"),
                "no envelope id or payload",
            ),
            (
                r#"{"type":"events_api","envelope_id":"e5","payload":{},"retry_attempt":-1}"#,
                Some("e5"),
                "an events_api envelope",
            ),
            (r#"{"type":"disconnect"}"#, None, "a disconnect frame"),
            (&long, None, "not JSON"),
        ];
        for (text, id, why) in unreadable {
            let Frame::Unreadable {
                envelope_id,
                reason,
                excerpt,
            } = read_frame(text)
            else {
                panic!("{text} read");
            };
            assert_eq!(envelope_id.as_deref(), id, "{text}");
            assert!(reason.contains(why), "{text}: {reason}");
            assert!(excerpt.chars().count() <= UNREADABLE_EXCERPT_CHARS);
            assert!(text.starts_with(excerpt.trim_end_matches('…')));
        }
    }

    #[test]
    fn the_ack_names_the_envelope() {
        assert_eq!(ack("dbdd0ef3"), r#"{"envelope_id":"dbdd0ef3"}"#);
        assert_eq!(ack("a\"b"), r#"{"envelope_id":"a\"b"}"#);
    }
}
