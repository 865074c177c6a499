//! The chat event perch journals in its inbox: one message as the platform delivered it, with
//! its sender and the message it replies to.

use crate::Timestamp;
use crate::attachment::Attachment;
use serde::{Deserialize, Serialize};

/// One message as the platform delivered it, before any hook ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundEvent {
    /// The platform's id for this message, unique within the channel (Discord message id,
    /// Telegram `<chat id>:<message id>`, Matrix event id). Deduplication and reply references
    /// use it.
    pub platform_id: String,
    /// Where to resume receiving after this event, for platforms whose cursor perch keeps
    /// (Telegram's update id; Matrix's sync token of the batch the event came in, from which a
    /// sync delivers it again); `None` elsewhere.
    pub cursor: Option<String>,
    /// The platform's room id (Discord channel id, Telegram chat id, Matrix room id).
    pub room: String,
    /// The thread within the room, where the platform has threads.
    pub thread: Option<String>,
    pub sender: Sender,
    /// A direct message (a DM, a private chat), not a group room.
    pub direct: bool,
    /// The message mentions the agent or replies to one of its messages.
    pub addressed: bool,
    pub text: String,
    /// When the platform says the message was sent.
    pub sent_at: Timestamp,
    /// The files attached to the message, as references to fetch with
    /// the connector's `fetch`; absent in journals written before attachments existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// The message this one replies to, as the platform gave it (or, on Matrix, as a bounded
    /// fetch found it); absent when it replies to nothing, and in journals written before
    /// replies were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replying_to: Option<Box<Quote>>,
    /// Set when this event is an edit: the `platform_id` of the message it edits. An edit is
    /// journaled (with its new text) and never answered; its own `platform_id` names the edit
    /// (unique per edit), so it is not taken for a repeat of the original.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_of: Option<String>,
    /// Set when the connector refused the message before looking it up any further (Matrix:
    /// its room and sender did not pass the connector's gate, the pre-check of admission, or it
    /// edits a message someone else sent): why. It is journaled with only what the connector
    /// knew without asking (no quote, no display name, not checked for being direct) and
    /// refused with this reason, after a restart too. Absent otherwise, and in journals written
    /// before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A message another one replies to: who wrote it and what it said, shortened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// The platform's id for the quoted message (as [`InboundEvent::platform_id`]).
    pub platform_id: String,
    /// Its author; `None` when the platform did not say (or the fetch failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<Sender>,
    /// Its text, shortened to [`QUOTE_MAX_CHARS`]; empty when it could not be had.
    pub text: String,
}

/// How much of a quoted message is kept.
pub const QUOTE_MAX_CHARS: usize = 280;

/// How much of a quoted author's name (and id) is kept.
pub const QUOTE_NAME_MAX_CHARS: usize = 64;

/// How much of a quoted message's platform id is kept (Matrix caps event ids at 255 bytes).
const QUOTE_ID_MAX_CHARS: usize = 255;

impl Quote {
    /// A quote with every part bounded: the text to [`QUOTE_MAX_CHARS`], the author's name and
    /// id to [`QUOTE_NAME_MAX_CHARS`], each shortened on a character boundary with an ellipsis.
    pub fn bounded(platform_id: &str, author: Option<Sender>, text: &str) -> Quote {
        Quote {
            platform_id: shortened(platform_id, QUOTE_ID_MAX_CHARS),
            author: author.map(|author| Sender {
                id: shortened(&author.id, QUOTE_NAME_MAX_CHARS),
                name: shortened(&author.name, QUOTE_NAME_MAX_CHARS),
                is_bot: author.is_bot,
            }),
            text: shortened(text, QUOTE_MAX_CHARS),
        }
    }
}

/// `text` cut to at most `max` characters, the last of them an ellipsis when it was cut.
pub fn shortened(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some(_) => {
            let kept: String = text.chars().take(max.saturating_sub(1)).collect();
            format!("{kept}…")
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    /// The platform's user id.
    pub id: String,
    pub name: String,
    pub is_bot: bool,
}
