//! A lane's log as a person reads it: its lines folded into **turns** and **events**, the
//! predicates that select turns, and the text they are drawn as.
//!
//! A turn is one user entry or heartbeat firing and everything the run it started did, up to its
//! delivery: it begins at an `operation_started` of a run. Two kinds of run join the turn before
//! them instead of beginning one: a run `resumed` after a crash interrupted the previous one,
//! and the correction a heartbeat sends after an invalid verdict.
//!
//! What a user entry is (people's messages, a heartbeat's prompt, its correction, its steer) is
//! read from what perch wrote: the trigger of the run it opens, and its origins and relay. Only
//! an entry of a lane written before triggers were kept, with neither origins nor a trigger, is
//! recognised by its text ([`user_entry`](assemble::user_entry)). Everything else (compactions,
//! segment headers, notes, tail repairs, damaged lines) belongs to the turn it follows; a
//! settled delivery belongs to the turn of the operation it names (or of the heartbeat outcome
//! that named the delivery).
//!
//! Every event is one line of the log, named by its [`LinePosition`], so `position` is its
//! identity: stable across segment rolls and restarts. [`TranscriptEvent`] is both what
//! `perch log --json` prints, one object a line, and what the text renderer draws. Its shape is
//! a stable interface, described by `src/core/transcript/perch-log.schema.json`: fields are only ever added.
//!
//! Here: the types and the selection; `assemble` folds lines into turns, `render` draws them.

mod assemble;
mod render;

pub use assemble::Assembler;
pub use render::{
    OUTPUT_HEAD_LINES, footing, heading, json_line, money, render_event, render_turn,
};

use crate::Timestamp;
use crate::id::{EntryId, OperationId};
use crate::log::{LinePosition, Trigger};
use crate::name::LaneName;
use crate::redact::{redact_slack_token, redact_telegram_token};
use chrono::TimeDelta;
use serde::Serialize;

pub use crate::redact::REDACTED;

/// One line of a lane's log, as `perch log` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TranscriptEvent {
    pub lane: LaneName,
    /// The line's identity: its lane, segment file and byte offset.
    pub position: LinePosition,
    /// The position of the `operation_started` that began the turn this event belongs to; none
    /// for lines before the first turn read.
    pub turn: Option<LinePosition>,
    /// When the line was written; none for a damaged line.
    pub at: Option<Timestamp>,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What the line was, with the fields of each kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A segment file's header: the lane continues in segment `segment`.
    SegmentStarted {
        segment: u32,
        /// The file this one continues, after a compaction.
        previous: Option<String>,
    },
    /// A run began: the start of a turn, unless it resumes an interrupted one.
    RunStarted {
        op: OperationId,
        resumed: bool,
        consumes: Vec<String>,
        /// What started it, as its record says; none in lanes written before triggers.
        trigger: Option<Trigger>,
    },
    /// A compaction began.
    CompactionStarted {
        op: OperationId,
        /// What started it; none in lanes written before triggers.
        trigger: Option<Trigger>,
    },
    /// A user entry: one or more chat messages (several when collected into one turn), or
    /// input without a chat origin. `steer` when it joined a run already under way.
    UserMessage {
        entry: EntryId,
        steer: bool,
        messages: Vec<Said>,
    },
    /// The prompt of a heartbeat firing.
    HeartbeatPrompt {
        entry: EntryId,
        task: String,
        slot: String,
        text: String,
    },
    /// The message sent back after an invalid verdict.
    HeartbeatCorrection {
        entry: EntryId,
        reason: String,
        text: String,
    },
    /// A heartbeat's `Steer:`, relayed into this lane. `steer` when it joined a run already
    /// under way; otherwise it started a run of its own.
    HeartbeatSteer {
        entry: EntryId,
        task: String,
        slot: String,
        steer: bool,
        text: String,
    },
    /// A request to the model. `retry` when the request before it got no reply.
    AttemptStarted {
        op: OperationId,
        attempt: u32,
        retry: bool,
    },
    /// A model reply's usage and cost.
    ModelReplied {
        op: OperationId,
        attempt: u32,
        model: String,
        input: u64,
        output: u64,
        cached: u64,
        /// Millionths of the currency of `models.yml`'s prices; none when the model has no price.
        cost_micros: Option<u64>,
    },
    /// The model's reply: its text, how much reasoning it carried, the tools it called, and for
    /// a heartbeat's final reply, the verdict it was judged to be.
    AssistantMessage {
        entry: EntryId,
        text: String,
        reasoning_chars: usize,
        tool_calls: Vec<CallName>,
        verdict: Option<Judgement>,
    },
    /// A tool call began.
    ToolStarted {
        op: OperationId,
        call_id: String,
        tool: String,
        arguments: serde_json::Value,
    },
    /// A tool call's result entry.
    ToolResult {
        entry: EntryId,
        call_id: String,
        tool: Option<String>,
        output: String,
        is_error: bool,
    },
    /// A tool call ended.
    ToolFinished {
        op: OperationId,
        call_id: String,
        duration_ms: u64,
        exit_code: Option<i32>,
        is_error: bool,
    },
    /// A delivery settled on its platform.
    DeliverySettled {
        delivery: String,
        channel: String,
        op: Option<OperationId>,
        /// The platform id of the message it answers.
        answers: Option<String>,
        /// `sent`, `unknown`, `not_sent` or `dropped`.
        state: String,
        /// The posted message's id, when `sent`.
        platform_id: Option<String>,
        /// Why, for the other states.
        reason: Option<String>,
    },
    /// An operation ended.
    OperationFinished {
        op: OperationId,
        /// `run` or `compact`, when the operation's start was read.
        intent: Option<String>,
        /// `completed`, `cancelled` (an abort), `failed` or `interrupted` (closed by recovery).
        outcome: String,
        reason: Option<String>,
    },
    /// A compaction's summary, the new root the lane continues from.
    CompactionSummary {
        entry: EntryId,
        chars: usize,
        replaces: Option<String>,
    },
    /// A heartbeat run's outcome, as its lane notes it.
    HeartbeatOutcome {
        entry: EntryId,
        task: String,
        slot: String,
        run: String,
        /// `scheduled`, `manual` or `dry_run`.
        mode: String,
        /// `silent`, `message`, `steer`, `invalid`, `failed`, `skipped` or `interrupted`.
        outcome: String,
        text: Option<String>,
        target: Option<String>,
        delivery: Option<String>,
        steered_lane: Option<String>,
        reason: Option<String>,
    },
    /// Any other data entry.
    Note {
        entry: EntryId,
        name: String,
        value: serde_json::Value,
    },
    /// The lane's leaf moved.
    LeafSet { leaf: EntryId },
    /// A torn last line was cut off when the lane was opened.
    TailRepaired { truncated_bytes: u64, offset: u64 },
    /// A line that could not be read: torn, not JSON, or not a line of this format.
    Damaged {
        file: String,
        line: u64,
        reason: String,
    },
}

/// One chat message of a user entry, with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Said {
    pub text: String,
    pub origin: Option<Origin>,
}

/// A message's origin as the transcript shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Origin {
    pub channel: String,
    /// The room's alias, or the platform's room id.
    pub room: String,
    pub thread: Option<String>,
    pub sender_id: String,
    pub sender_name: String,
    pub direct: bool,
    pub sent_at: Timestamp,
    /// The platform id of the message it replies to.
    pub replying_to: Option<String>,
    pub replying_to_author: Option<String>,
    pub replying_to_text: Option<String>,
    /// Lines of group context offered with it.
    pub earlier_lines: usize,
}

/// A tool the model called.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallName {
    pub call_id: String,
    pub tool: String,
}

/// A heartbeat reply judged as a verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    pub valid: bool,
    /// `silence`, `message` or `steer`, when valid.
    pub verdict: Option<String>,
    /// Why it is not a verdict, when invalid.
    pub reason: Option<String>,
}

/// Secret values to cut out of everything shown, and the shapes of Telegram's and Slack's
/// tokens.
#[derive(Debug, Clone, Default)]
pub struct Redaction {
    values: Vec<String>,
}

impl Redaction {
    /// Redacts `values`; a short one only where it stands as a whole token
    /// ([`crate::redact::redact_value`]), an empty one nowhere.
    pub fn new(values: impl IntoIterator<Item = String>) -> Redaction {
        let mut values: Vec<String> = values.into_iter().filter(|v| !v.is_empty()).collect();
        values.sort_by_key(|value| std::cmp::Reverse(value.len()));
        values.dedup();
        Redaction { values }
    }

    /// `text` without any secret value and without anything shaped like a Telegram or Slack
    /// token.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for value in &self.values {
            out = crate::redact::redact_value(&out, value, REDACTED);
        }
        if out.contains(':') {
            out = redact_telegram_token(&out, "");
        }
        if out.contains("xox") || out.contains("xapp-") || out.contains("ticket=") {
            out = redact_slack_token(&out, "");
        }
        out
    }

    fn value(&self, value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::String(text) => serde_json::Value::String(self.apply(text)),
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(|item| self.value(item)).collect())
            }
            serde_json::Value::Object(map) => serde_json::Value::Object(
                map.iter()
                    .map(|(key, item)| (self.apply(key), self.value(item)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// What a turn is about, for selecting and heading it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnFacts {
    pub at: Option<Timestamp>,
    /// The origins of its user messages.
    pub origins: Vec<Origin>,
    /// The heartbeat task it is a firing of.
    pub task: Option<String>,
    pub slot: Option<String>,
    /// The heartbeat task and slot whose steer it holds.
    pub steered_by: Option<(String, String)>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: u64,
    /// Whether any reply had a price.
    pub priced: bool,
    pub model_calls: u32,
}

/// One turn and its events, in log order.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub lane: LaneName,
    /// The `operation_started` that began it; none for the lines before the first turn read.
    pub start: Option<LinePosition>,
    pub facts: TurnFacts,
    pub events: Vec<TranscriptEvent>,
}

impl Turn {
    fn new(lane: LaneName, start: Option<LinePosition>) -> Turn {
        Turn {
            lane,
            start,
            facts: TurnFacts::default(),
            events: Vec::new(),
        }
    }
}

/// Which turns to show.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    /// `CHANNEL` or `CHANNEL:ROOM`.
    pub place: Option<Place>,
    /// A sender's platform id or display name.
    pub sender: Option<String>,
    pub task: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
}

/// A channel, and a room in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub channel: String,
    pub room: Option<String>,
}

impl Place {
    /// `CHANNEL[:ROOM]`; the room may itself hold colons (`-100:7`).
    pub fn parse(text: &str) -> Result<Place, String> {
        let (channel, room) = match text.split_once(':') {
            Some((channel, room)) => (channel, Some(room)),
            None => (text, None),
        };
        if channel.is_empty() || room.is_some_and(str::is_empty) {
            return Err(format!(
                "{text:?} is not a place: write CHANNEL or CHANNEL:ROOM, as in telegram:team"
            ));
        }
        Ok(Place {
            channel: channel.to_owned(),
            room: room.map(str::to_owned),
        })
    }
}

impl Selection {
    /// Whether `turn` is selected. A turn without a time (only damaged lines) passes any time
    /// window.
    pub fn selects(&self, turn: &Turn) -> bool {
        let facts = &turn.facts;
        if let Some(place) = &self.place {
            let heartbeat_here = place.channel == "heartbeat"
                && facts.task.is_some()
                && place
                    .room
                    .as_ref()
                    .is_none_or(|room| facts.task.as_ref() == Some(room));
            let origin_here = facts.origins.iter().any(|origin| {
                origin.channel == place.channel
                    && place.room.as_ref().is_none_or(|room| &origin.room == room)
            });
            if !heartbeat_here && !origin_here {
                return false;
            }
        }
        if let Some(sender) = &self.sender
            && !facts.origins.iter().any(|origin| {
                &origin.sender_id == sender || origin.sender_name.eq_ignore_ascii_case(sender)
            })
        {
            return false;
        }
        if let Some(task) = &self.task
            && facts.task.as_ref() != Some(task)
        {
            return false;
        }
        if let Some(at) = facts.at {
            if self.since.is_some_and(|since| at < since) {
                return false;
            }
            if self.until.is_some_and(|until| at >= until) {
                return false;
            }
        }
        true
    }

    /// Whether reading further back could find more selected turns than a turn starting at
    /// `earliest`: false once the window's start is passed.
    pub fn wants_before(&self, earliest: Option<Timestamp>) -> bool {
        match (self.since, earliest) {
            (Some(since), Some(earliest)) => earliest > since,
            _ => true,
        }
    }
}

/// `--since` and `--until`: a duration before `now` (`90s`, `30m`, `2h`, `3d`, `1w`), an RFC 3339
/// time (`2026-12-02T09:00:00Z`), or a date (`2026-12-02`, midnight UTC).
pub fn parse_when(text: &str, now: Timestamp) -> Result<Timestamp, String> {
    let text = text.trim();
    let problem = || {
        format!(
            "{text:?} is not a time: write a duration before now (30m, 2h, 3d, 1w) or a time \
             (2026-12-02T09:00:00Z, or 2026-12-02 for midnight UTC)"
        )
    };
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&chrono::Utc));
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return date
            .and_hms_opt(0, 0, 0)
            .map(|midnight| midnight.and_utc())
            .ok_or_else(problem);
    }
    let split = text
        .find(|ch: char| !ch.is_ascii_digit())
        .ok_or_else(problem)?;
    let (number, unit) = text.split_at(split);
    let number: i64 = number.parse().map_err(|_| problem())?;
    let seconds = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(problem()),
    };
    number
        .checked_mul(seconds)
        .and_then(TimeDelta::try_seconds)
        .and_then(|delta| now.checked_sub_signed(delta))
        .ok_or_else(problem)
}

/// Totals over a set of turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub turns: usize,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: u64,
    pub priced: bool,
}

impl Totals {
    pub fn add(&mut self, facts: &TurnFacts) {
        self.turns += 1;
        self.input_tokens += facts.input_tokens;
        self.output_tokens += facts.output_tokens;
        self.cost_micros += facts.cost_micros;
        self.priced |= facts.priced;
    }
}

#[cfg(test)]
mod tests;
