use crate::Timestamp;
use crate::config::Replay;
use crate::id::{EntryId, OperationId, SessionId};
use crate::name::{LaneName, ToolName};
use crate::origin::{MessageOrigin, Relay};
use crate::spend::Money;
use serde::{Deserialize, Serialize};

use super::note::Note;
use super::trigger::Trigger;

/// The version written in every header. A log of another version is refused, not guessed at.
pub const FORMAT_VERSION: u32 = 1;

/// One line of a lane's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Header(Header),
    Record(Record),
    Entry(Entry),
}

/// The first line of every segment file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub version: u32,
    pub session: SessionId,
    pub lane: LaneName,
    /// This file's place in the lane's chain of segments, from 1.
    pub segment: u32,
    pub created: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
}

/// The segment this one continues, and the leaf the lane had when it was closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Previous {
    pub file: String,
    pub leaf: Option<EntryId>,
}

/// Bookkeeping. Records of intent name the ids their results will carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    OperationStarted {
        op: OperationId,
        intent: Intent,
        /// Inbox items this operation takes; they are consumed when it finishes.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        consumes: Vec<String>,
        /// This run continues an interrupted run of the same items, from the lane's leaf: the
        /// restart's one attempt to finish it, never made twice for an item.
        #[serde(default, skip_serializing_if = "is_false")]
        resumed: bool,
        /// What started it; none in lanes written before triggers were kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger: Option<Trigger>,
        at: Timestamp,
    },
    AttemptStarted {
        op: OperationId,
        attempt: u32,
        at: Timestamp,
    },
    ToolStarted {
        op: OperationId,
        call_id: String,
        tool: ToolName,
        arguments: serde_json::Value,
        /// The id the tool's result entry will carry.
        result: EntryId,
        replay: Replay,
        at: Timestamp,
    },
    OperationFinished {
        op: OperationId,
        outcome: Outcome,
        at: Timestamp,
    },
    /// One model reply: the tokens it used and what they cost at the model's price then (no
    /// cost when `models.yml` gives the model no price). Written before the reply's entry.
    ModelReplied {
        op: OperationId,
        attempt: u32,
        /// The model as `models.yml` names it, `provider/model`.
        model: String,
        input: u64,
        output: u64,
        /// Cached input tokens, counted in `input` too.
        #[serde(default, skip_serializing_if = "is_zero")]
        cached: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost: Option<Money>,
        at: Timestamp,
    },
    /// A tool call that a `tool_started` announced has ended; written after its result entry.
    ToolFinished {
        op: OperationId,
        call_id: String,
        /// The result entry the `tool_started` named.
        result: EntryId,
        duration_ms: u64,
        /// A command's exit status; none for a tool that ran no command, or a command killed
        /// before it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        is_error: bool,
        at: Timestamp,
    },
    /// A delivery of this lane's settled on its platform: appended when the outbox settles it,
    /// which may be after the operation that wrote it finished, or after a restart.
    DeliverySettled {
        /// The outbox's delivery id (the platform's idempotency key where it has one).
        delivery: String,
        channel: String,
        /// The operation whose reply it carried; none for a command reply or a recovery note.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        op: Option<OperationId>,
        /// The platform id of the message it answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answers: Option<String>,
        settled: Settled,
        at: Timestamp,
    },
    LeafSet {
        leaf: EntryId,
        at: Timestamp,
    },
    /// A torn last line was cut off when the file was opened.
    TailRepaired {
        truncated_bytes: u64,
        offset: u64,
        at: Timestamp,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Answer the consumed input: model turns and tool calls until the model is done.
    Run,
    /// Summarise the branch into one entry and move the leaf to it.
    Compact,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    Completed,
    Cancelled,
    Failed { reason: String },
    Interrupted { reason: String },
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum Settled {
    /// The platform took it; `platform_id` is the posted message's id.
    Sent { platform_id: String },
    /// It may or may not have been posted (perch stopped mid-send, outside the platform's
    /// deduplication window); it is not sent again.
    Unknown { reason: String },
    /// The platform refused it for good (too long, no access, unknown room).
    NotSent { reason: String },
    /// perch gave it up unsent: older than the delivery time to live at a restart.
    Dropped { reason: String },
}

/// A node of the conversation tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub id: EntryId,
    pub parent: Option<EntryId>,
    pub at: Timestamp,
    pub body: EntryBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EntryBody {
    Message(Message),
    /// A note kept in the tree: a summary, a heartbeat's outcome, what a hook keeps. On disk a
    /// `data` entry.
    #[serde(rename = "data")]
    Note(Note),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
    /// Where a user message's text parts came from: the first origin is the first text part's,
    /// and so on (several when messages were collected into one turn). Empty for other roles,
    /// for input without a chat origin, and in lanes written before origins were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<MessageOrigin>,
    /// Where a user message perch relays came from (a heartbeat's steer): it has no origins,
    /// and its text is not a person's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<Relay>,
}

impl Message {
    /// A message with neither origins nor a relay: perch's own, the model's, or a tool's.
    pub fn new(role: Role, parts: Vec<Part>) -> Message {
        Message {
            role,
            parts,
            origins: Vec::new(),
            relay: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Part {
    Text {
        text: String,
    },
    Reasoning {
        text: String,
        /// The provider's signature over `text` (Anthropic's thinking blocks), which lets the
        /// block be sent back while a tool-using turn continues.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    ToolCall {
        call_id: String,
        name: String,
        arguments: serde_json::Value,
    },
    ToolResult {
        call_id: String,
        output: String,
        is_error: bool,
    },
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// How far an append must reach before the caller continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Commit {
    /// Written to the operating system: survives the process dying.
    Flush,
    /// Also fsynced: survives the machine dying. For lines that precede an effect that cannot be
    /// taken back.
    Sync,
}

impl Line {
    /// The durability each line needs, decided here once so no caller can forget it.
    pub fn commit(&self) -> Commit {
        match self {
            Line::Header(_) => Commit::Sync,
            Line::Record(Record::ToolStarted { replay, .. }) => match replay {
                Replay::Never => Commit::Sync,
                Replay::Safe => Commit::Flush,
            },
            Line::Record(Record::TailRepaired { .. }) => Commit::Sync,
            Line::Record(
                Record::OperationStarted { .. }
                | Record::AttemptStarted { .. }
                | Record::OperationFinished { .. }
                | Record::ModelReplied { .. }
                | Record::ToolFinished { .. }
                | Record::DeliverySettled { .. }
                | Record::LeafSet { .. },
            )
            | Line::Entry(_) => Commit::Flush,
        }
    }
}

#[cfg(test)]
mod tests;
