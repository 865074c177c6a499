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
//! recognised by its text ([`user_entry`]). Everything else (compactions,
//! segment headers, notes, tail repairs, damaged lines) belongs to the turn it follows; a
//! settled delivery belongs to the turn of the operation it names (or of the heartbeat outcome
//! that named the delivery).
//!
//! Every event is one line of the log, named by its [`LinePosition`], so `position` is its
//! identity: stable across segment rolls and restarts. [`TranscriptEvent`] is both what
//! `perch log --json` prints, one object a line, and what the text renderer draws. Its shape is
//! a stable interface, described by `src/core/transcript/perch-log.schema.json`: fields are only ever added.

use crate::Timestamp;
use crate::heartbeat::{SlotOutcome, Verdict, judge};
use crate::id::{EntryId, OperationId};
use crate::log::{
    Entry, EntryBody, Header, HeartbeatNote, Intent, Line, LinePosition, Message, Note, Outcome,
    Part, ReadLine, Record, Role, Settled, Trigger,
};
use crate::name::LaneName;
use crate::origin::{MessageOrigin, Relay};
use crate::redact::redact_telegram_token;
use crate::terminal::{escaped, for_terminal};
use chrono::TimeDelta;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;

pub use crate::redact::REDACTED;

/// How a heartbeat's prompt begins: `[heartbeat NAME for SLOT`. Read only in entries of lanes
/// written before triggers were kept.
const HEARTBEAT_PROMPT: &str = "[heartbeat ";

/// How the correction after an invalid verdict begins (see [`crate::heartbeat::correction`]).
/// Read only in entries of lanes written before triggers were kept.
const CORRECTION: &str = "That reply is not a valid verdict: ";

/// How many lines of a tool's output the text shows.
pub const OUTPUT_HEAD_LINES: usize = 4;

/// How many characters of one shown line the text keeps.
const LINE_CHARS: usize = 300;

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

/// Secret values to cut out of everything shown, and the shape of a bot token.
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

    /// `text` without any secret value and without anything shaped like a bot token.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for value in &self.values {
            out = crate::redact::redact_value(&out, value, REDACTED);
        }
        if out.contains(':') {
            out = redact_telegram_token(&out, "");
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

/// Folds one lane's lines, in order, into turns. Feed it with [`Assembler::push`]; the turns so
/// far are [`Assembler::turns`].
#[derive(Debug)]
pub struct Assembler {
    lane: LaneName,
    redaction: Redaction,
    turns: Vec<Turn>,
    /// The turn each operation belongs to.
    ops: HashMap<OperationId, usize>,
    intents: HashMap<OperationId, Intent>,
    /// Operations whose last request has had no reply yet.
    awaiting: HashMap<OperationId, bool>,
    tools: HashMap<String, String>,
    /// The turn of each delivery a heartbeat outcome names.
    deliveries: HashMap<String, usize>,
    /// The operation running now.
    running: Option<Running>,
    /// Turns whose last operation ended interrupted.
    interrupted: Vec<usize>,
}

/// The operation running now, as far as the lines read say.
#[derive(Debug)]
struct Running {
    op: OperationId,
    trigger: Option<Trigger>,
    /// Whether its first user entry was read: a later one is a steer.
    user_written: bool,
}

impl Assembler {
    pub fn new(lane: LaneName, redaction: Redaction) -> Assembler {
        Assembler {
            lane,
            redaction,
            turns: Vec::new(),
            ops: HashMap::new(),
            intents: HashMap::new(),
            awaiting: HashMap::new(),
            tools: HashMap::new(),
            deliveries: HashMap::new(),
            running: None,
            interrupted: Vec::new(),
        }
    }

    /// Adds the next line; returns the event it became (also kept in its turn).
    pub fn push(&mut self, position: LinePosition, line: &ReadLine) -> TranscriptEvent {
        let (at, kind) = match line {
            ReadLine::Damaged { file, line, reason } => (
                None,
                EventKind::Damaged {
                    file: file.clone(),
                    line: *line,
                    reason: reason.clone(),
                },
            ),
            ReadLine::Line(line) => self.kind_of(line),
        };
        let index = self.place(&position, &kind, at);
        let turn = self.turns[index].start.clone();
        let event = TranscriptEvent {
            lane: self.lane.clone(),
            position,
            turn,
            at,
            kind,
        };
        self.account(index, &event);
        self.turns[index].events.push(event.clone());
        if let EventKind::HeartbeatCorrection { .. } = &event.kind {
            self.join_correction(index);
        }
        event
    }

    /// The turns so far, oldest first.
    pub fn turns(&self) -> &[Turn] {
        &self.turns
    }

    pub fn into_turns(self) -> Vec<Turn> {
        self.turns
    }

    fn kind_of(&mut self, line: &Line) -> (Option<Timestamp>, EventKind) {
        match line {
            Line::Header(header) => (Some(header.created), segment_started(header)),
            Line::Record(record) => self.record(record),
            Line::Entry(entry) => (Some(entry.at), self.entry(entry)),
        }
    }

    fn record(&mut self, record: &Record) -> (Option<Timestamp>, EventKind) {
        let r = &self.redaction;
        match record {
            Record::OperationStarted {
                op,
                intent,
                consumes,
                resumed,
                trigger,
                at,
            } => {
                self.intents.insert(*op, *intent);
                self.running = Some(Running {
                    op: *op,
                    trigger: trigger.clone(),
                    user_written: false,
                });
                let trigger = trigger.as_ref().map(|trigger| redacted(trigger, r));
                let kind = match intent {
                    Intent::Run => EventKind::RunStarted {
                        op: *op,
                        resumed: *resumed,
                        consumes: consumes.clone(),
                        trigger,
                    },
                    Intent::Compact => EventKind::CompactionStarted { op: *op, trigger },
                };
                (Some(*at), kind)
            }
            Record::AttemptStarted { op, attempt, at } => {
                let retry = self.awaiting.insert(*op, true).unwrap_or(false);
                (
                    Some(*at),
                    EventKind::AttemptStarted {
                        op: *op,
                        attempt: *attempt,
                        retry,
                    },
                )
            }
            Record::ToolStarted {
                op,
                call_id,
                tool,
                arguments,
                at,
                ..
            } => {
                self.tools.insert(call_id.clone(), tool.to_string());
                (
                    Some(*at),
                    EventKind::ToolStarted {
                        op: *op,
                        call_id: r.apply(call_id),
                        tool: tool.to_string(),
                        arguments: r.value(arguments),
                    },
                )
            }
            Record::OperationFinished { op, outcome, at } => {
                if self
                    .running
                    .as_ref()
                    .is_some_and(|running| running.op == *op)
                {
                    self.running = None;
                }
                self.awaiting.remove(op);
                let (name, reason) = match outcome {
                    Outcome::Completed => ("completed", None),
                    Outcome::Cancelled => ("cancelled", None),
                    Outcome::Failed { reason } => ("failed", Some(r.apply(reason))),
                    Outcome::Interrupted { reason } => ("interrupted", Some(r.apply(reason))),
                };
                (
                    Some(*at),
                    EventKind::OperationFinished {
                        op: *op,
                        intent: self
                            .intents
                            .get(op)
                            .map(|intent| intent_name(*intent).into()),
                        outcome: name.into(),
                        reason,
                    },
                )
            }
            Record::ModelReplied {
                op,
                attempt,
                model,
                input,
                output,
                cached,
                cost,
                at,
            } => (
                Some(*at),
                EventKind::ModelReplied {
                    op: *op,
                    attempt: *attempt,
                    model: r.apply(model),
                    input: *input,
                    output: *output,
                    cached: *cached,
                    cost_micros: cost.map(|cost| cost.micros()),
                },
            ),
            Record::ToolFinished {
                op,
                call_id,
                duration_ms,
                exit_code,
                is_error,
                at,
                ..
            } => (
                Some(*at),
                EventKind::ToolFinished {
                    op: *op,
                    call_id: r.apply(call_id),
                    duration_ms: *duration_ms,
                    exit_code: *exit_code,
                    is_error: *is_error,
                },
            ),
            Record::DeliverySettled {
                delivery,
                channel,
                op,
                answers,
                settled,
                at,
            } => {
                let (state, platform_id, reason) = match settled {
                    Settled::Sent { platform_id } => ("sent", Some(r.apply(platform_id)), None),
                    Settled::Unknown { reason } => ("unknown", None, Some(r.apply(reason))),
                    Settled::NotSent { reason } => ("not_sent", None, Some(r.apply(reason))),
                    Settled::Dropped { reason } => ("dropped", None, Some(r.apply(reason))),
                };
                (
                    Some(*at),
                    EventKind::DeliverySettled {
                        delivery: r.apply(delivery),
                        channel: r.apply(channel),
                        op: *op,
                        answers: answers.as_deref().map(|answers| r.apply(answers)),
                        state: state.into(),
                        platform_id,
                        reason,
                    },
                )
            }
            Record::LeafSet { leaf, at } => (Some(*at), EventKind::LeafSet { leaf: *leaf }),
            Record::TailRepaired {
                truncated_bytes,
                offset,
                at,
            } => (
                Some(*at),
                EventKind::TailRepaired {
                    truncated_bytes: *truncated_bytes,
                    offset: *offset,
                },
            ),
        }
    }

    fn entry(&mut self, entry: &Entry) -> EventKind {
        let r = &self.redaction;
        match &entry.body {
            EntryBody::Note(Note::Summary { text, replaces }) => EventKind::CompactionSummary {
                entry: entry.id,
                chars: text.chars().count(),
                replaces: replaces.map(|leaf| leaf.to_string()),
            },
            EntryBody::Note(Note::HeartbeatOutcome(note)) => heartbeat_outcome(entry.id, note, r),
            EntryBody::Note(Note::Hook { name, value }) => EventKind::Note {
                entry: entry.id,
                name: r.apply(name),
                value: r.value(value),
            },
            EntryBody::Message(message) => self.message(entry.id, message),
        }
    }

    fn message(&mut self, id: EntryId, message: &Message) -> EventKind {
        let r = &self.redaction;
        match message.role {
            Role::User => {
                let text = plain_text(message);
                let (steer, trigger) = match &mut self.running {
                    Some(running) => (
                        std::mem::replace(&mut running.user_written, true),
                        running.trigger.as_ref(),
                    ),
                    None => (false, None),
                };
                match user_entry(message, &text, !steer, trigger) {
                    UserEntry::Said => {}
                    UserEntry::HeartbeatPrompt { task, slot } => {
                        return EventKind::HeartbeatPrompt {
                            entry: id,
                            task: r.apply(&task),
                            slot: r.apply(&slot),
                            text: r.apply(&text),
                        };
                    }
                    UserEntry::Correction { reason } => {
                        return EventKind::HeartbeatCorrection {
                            entry: id,
                            reason: r.apply(&reason),
                            text: r.apply(&text),
                        };
                    }
                    UserEntry::Steer { task, slot } => {
                        return EventKind::HeartbeatSteer {
                            entry: id,
                            task: r.apply(&task),
                            slot: r.apply(&slot),
                            steer,
                            text: r.apply(&text),
                        };
                    }
                }
                let texts: Vec<&str> = message
                    .parts
                    .iter()
                    .filter_map(|part| match part {
                        Part::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                let messages = texts
                    .iter()
                    .enumerate()
                    .map(|(index, text)| Said {
                        text: r.apply(text),
                        origin: message
                            .origins
                            .get(index)
                            .map(|origin| origin_of(origin, r)),
                    })
                    .collect();
                EventKind::UserMessage {
                    entry: id,
                    steer,
                    messages,
                }
            }
            Role::Assistant => {
                if let Some(running) = &self.running {
                    self.awaiting.insert(running.op, false);
                }
                let mut reasoning_chars = 0;
                let mut tool_calls = Vec::new();
                for part in &message.parts {
                    match part {
                        Part::Reasoning { text, .. } => reasoning_chars += text.chars().count(),
                        Part::ToolCall { call_id, name, .. } => {
                            self.tools.insert(call_id.clone(), name.clone());
                            tool_calls.push(CallName {
                                call_id: r.apply(call_id),
                                tool: r.apply(name),
                            });
                        }
                        _ => {}
                    }
                }
                let text = plain_text(message);
                let in_heartbeat = self
                    .turns
                    .last()
                    .is_some_and(|turn| turn.facts.task.is_some());
                let verdict = (in_heartbeat && tool_calls.is_empty()).then(|| judged(&text, r));
                EventKind::AssistantMessage {
                    entry: id,
                    text: r.apply(&text),
                    reasoning_chars,
                    tool_calls,
                    verdict,
                }
            }
            Role::Tool => {
                let (call_id, output, is_error) = message
                    .parts
                    .iter()
                    .find_map(|part| match part {
                        Part::ToolResult {
                            call_id,
                            output,
                            is_error,
                        } => Some((call_id.as_str(), output.as_str(), *is_error)),
                        _ => None,
                    })
                    .unwrap_or(("", "", false));
                EventKind::ToolResult {
                    entry: id,
                    call_id: r.apply(call_id),
                    tool: self.tools.get(call_id).cloned(),
                    output: r.apply(output),
                    is_error,
                }
            }
        }
    }

    /// The index of the turn an event joins, beginning a turn when the event begins one.
    fn place(&mut self, position: &LinePosition, kind: &EventKind, at: Option<Timestamp>) -> usize {
        let index = match kind {
            EventKind::RunStarted { op, resumed, .. } => {
                let joins = resumed.then(|| self.interrupted.last().copied()).flatten();
                let index = match joins {
                    Some(index) => index,
                    None => {
                        self.turns
                            .push(Turn::new(self.lane.clone(), Some(position.clone())));
                        self.turns.len() - 1
                    }
                };
                self.ops.insert(*op, index);
                index
            }
            EventKind::DeliverySettled { op, delivery, .. } => {
                let by_op = op.as_ref().and_then(|op| self.ops.get(op));
                match by_op.or_else(|| self.deliveries.get(delivery)) {
                    Some(&index) => index,
                    None => self.current(),
                }
            }
            EventKind::HeartbeatOutcome {
                delivery: Some(delivery),
                ..
            } => {
                let index = self.current();
                self.deliveries.insert(delivery.clone(), index);
                index
            }
            EventKind::CompactionStarted { op, .. } => {
                let index = self.current();
                self.ops.insert(*op, index);
                index
            }
            _ => self.current(),
        };
        if let EventKind::OperationFinished { op, outcome, .. } = kind {
            let index = self.ops.get(op).copied().unwrap_or(index);
            self.interrupted.retain(|&turn| turn != index);
            if outcome == "interrupted" {
                self.interrupted.push(index);
            }
            return index;
        }
        if self.turns[index].facts.at.is_none() {
            self.turns[index].facts.at = at;
        }
        index
    }

    fn current(&mut self) -> usize {
        if self.turns.is_empty() {
            self.turns.push(Turn::new(self.lane.clone(), None));
        }
        self.turns.len() - 1
    }

    fn account(&mut self, index: usize, event: &TranscriptEvent) {
        let facts = &mut self.turns[index].facts;
        match &event.kind {
            EventKind::UserMessage { messages, .. } => {
                facts
                    .origins
                    .extend(messages.iter().filter_map(|said| said.origin.clone()));
            }
            EventKind::HeartbeatPrompt { task, slot, .. } => {
                facts.task = Some(task.clone());
                facts.slot = Some(slot.clone());
            }
            EventKind::HeartbeatOutcome { task, slot, .. } => {
                facts.task.get_or_insert_with(|| task.clone());
                facts.slot.get_or_insert_with(|| slot.clone());
            }
            EventKind::HeartbeatSteer { task, slot, .. } => {
                facts
                    .steered_by
                    .get_or_insert_with(|| (task.clone(), slot.clone()));
            }
            EventKind::ModelReplied {
                input,
                output,
                cost_micros,
                ..
            } => {
                facts.input_tokens += input;
                facts.output_tokens += output;
                facts.model_calls += 1;
                if let Some(cost) = cost_micros {
                    facts.cost_micros += cost;
                    facts.priced = true;
                }
            }
            _ => {}
        }
    }

    /// A correction's run joins the heartbeat turn before it.
    fn join_correction(&mut self, index: usize) {
        if index == 0 || index + 1 != self.turns.len() {
            return;
        }
        let previous = &self.turns[index - 1];
        if previous.facts.task.is_none() || previous.lane != self.turns[index].lane {
            return;
        }
        let Some(moved) = self.turns.pop() else {
            return;
        };
        let into = index - 1;
        let start = self.turns[into].start.clone();
        for turn in self
            .ops
            .values_mut()
            .chain(self.deliveries.values_mut())
            .chain(self.interrupted.iter_mut())
        {
            if *turn == index {
                *turn = into;
            }
        }
        let target = &mut self.turns[into];
        target.facts.input_tokens += moved.facts.input_tokens;
        target.facts.output_tokens += moved.facts.output_tokens;
        target.facts.cost_micros += moved.facts.cost_micros;
        target.facts.priced |= moved.facts.priced;
        target.facts.model_calls += moved.facts.model_calls;
        target
            .events
            .extend(moved.events.into_iter().map(|mut event| {
                event.turn = start.clone();
                event
            }));
    }
}

/// What a user entry is, as `perch log` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UserEntry {
    /// What people said, or input without a chat origin.
    Said,
    HeartbeatPrompt {
        task: String,
        slot: String,
    },
    Correction {
        reason: String,
    },
    Steer {
        task: String,
        slot: String,
    },
}

/// What the user entry `message` (its text parts joined, `text`) is, from what perch wrote:
/// its relay, its origins, and, when it is the first user entry of its run (`opening`), the
/// `trigger` of that run. An entry with origins is always people's, whatever its text. Only an
/// entry with neither origins nor a trigger (lanes written before triggers were kept) is read
/// by its text, as it was then.
fn user_entry(
    message: &Message,
    text: &str,
    opening: bool,
    trigger: Option<&Trigger>,
) -> UserEntry {
    if let Some(Relay::HeartbeatSteer { task, slot }) = &message.relay {
        return UserEntry::Steer {
            task: task.to_string(),
            slot: slot.to_rfc3339(),
        };
    }
    if !message.origins.is_empty() || !opening {
        return UserEntry::Said;
    }
    match trigger {
        Some(Trigger::Heartbeat { task, slot, .. }) => UserEntry::HeartbeatPrompt {
            task: task.to_string(),
            slot: slot.to_rfc3339(),
        },
        Some(Trigger::Correction { reason, .. }) => UserEntry::Correction {
            reason: reason.clone(),
        },
        Some(Trigger::Steer { task, slot }) => UserEntry::Steer {
            task: task.to_string(),
            slot: slot.to_rfc3339(),
        },
        Some(
            Trigger::Chat | Trigger::Terminal | Trigger::ContextFull | Trigger::CompactCommand,
        ) => UserEntry::Said,
        None => legacy_user_entry(text),
    }
}

/// A user entry of a lane written before triggers were kept, without origins: a heartbeat's
/// prompt and its correction are known by how their text begins.
fn legacy_user_entry(text: &str) -> UserEntry {
    if let Some((task, slot)) = heartbeat_prompt(text) {
        return UserEntry::HeartbeatPrompt { task, slot };
    }
    if let Some(rest) = text.strip_prefix(CORRECTION) {
        let reason = rest
            .split_once(". Your whole reply")
            .map_or(rest, |(reason, _)| reason);
        return UserEntry::Correction {
            reason: reason.to_owned(),
        };
    }
    UserEntry::Said
}

/// `trigger` with the text it quotes (a correction's reason) redacted.
fn redacted(trigger: &Trigger, r: &Redaction) -> Trigger {
    match trigger {
        Trigger::Correction { task, slot, reason } => Trigger::Correction {
            task: task.clone(),
            slot: *slot,
            reason: r.apply(reason),
        },
        other => other.clone(),
    }
}

fn heartbeat_outcome(entry: EntryId, note: &HeartbeatNote, r: &Redaction) -> EventKind {
    let mut text = None;
    let mut target = None;
    let mut delivery = None;
    let mut steered_lane = None;
    let mut reason = None;
    let name = match &note.outcome {
        SlotOutcome::Silent => "silent",
        SlotOutcome::Message {
            text: said,
            target: to,
            delivery: id,
        } => {
            text = Some(r.apply(said));
            target = (!to.is_empty()).then(|| r.apply(to));
            delivery = (!id.is_empty()).then(|| r.apply(id));
            "message"
        }
        SlotOutcome::Steer { text: said, lane } => {
            text = Some(r.apply(said));
            steered_lane = Some(lane.to_string());
            "steer"
        }
        SlotOutcome::Invalid { reason: why } => {
            reason = Some(r.apply(why));
            "invalid"
        }
        SlotOutcome::Failed { reason: why } => {
            reason = Some(r.apply(why));
            "failed"
        }
        SlotOutcome::Skipped { reason: why } => {
            reason = Some(r.apply(why));
            "skipped"
        }
        SlotOutcome::Interrupted { reason: why } => {
            reason = Some(r.apply(why));
            "interrupted"
        }
    };
    EventKind::HeartbeatOutcome {
        entry,
        task: r.apply(note.task.as_str()),
        slot: note.slot.to_rfc3339(),
        run: r.apply(&note.run),
        mode: note.mode.map_or("", |mode| mode.as_str()).to_owned(),
        outcome: name.into(),
        text,
        target,
        delivery,
        steered_lane,
        reason,
    }
}

fn judged(text: &str, r: &Redaction) -> Judgement {
    match judge(text) {
        Ok(verdict) => Judgement {
            valid: true,
            verdict: Some(
                match verdict {
                    Verdict::Silence => "silence",
                    Verdict::Message(_) => "message",
                    Verdict::Steer(_) => "steer",
                }
                .into(),
            ),
            reason: None,
        },
        Err(invalid) => Judgement {
            valid: false,
            verdict: None,
            reason: Some(r.apply(&invalid.reason)),
        },
    }
}

fn segment_started(header: &Header) -> EventKind {
    EventKind::SegmentStarted {
        segment: header.segment,
        previous: header
            .previous
            .as_ref()
            .map(|previous| previous.file.clone()),
    }
}

fn intent_name(intent: Intent) -> &'static str {
    match intent {
        Intent::Run => "run",
        Intent::Compact => "compact",
    }
}

/// The text parts of a message, joined by blank lines.
fn plain_text(message: &Message) -> String {
    let texts: Vec<&str> = message
        .parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n\n")
}

/// The task and slot of a heartbeat prompt, `[heartbeat NAME for SLOT…]`.
fn heartbeat_prompt(text: &str) -> Option<(String, String)> {
    let rest = text.strip_prefix(HEARTBEAT_PROMPT)?;
    let (head, _) = rest.split_once(']')?;
    let (task, slot) = head.split_once(" for ")?;
    let slot = slot.split(',').next().unwrap_or(slot);
    Some((task.to_owned(), slot.to_owned()))
}

fn origin_of(origin: &MessageOrigin, r: &Redaction) -> Origin {
    Origin {
        channel: r.apply(&origin.channel),
        room: r.apply(&origin.room),
        thread: origin.thread.as_deref().map(|thread| r.apply(thread)),
        sender_id: r.apply(&origin.sender.id),
        sender_name: r.apply(&origin.sender.name),
        direct: origin.direct,
        sent_at: origin.sent_at,
        replying_to: origin
            .replying_to
            .as_ref()
            .map(|quoted| r.apply(&quoted.platform_id)),
        replying_to_author: origin
            .replying_to
            .as_ref()
            .and_then(|quoted| quoted.author.as_ref())
            .map(|author| r.apply(&author.name)),
        replying_to_text: origin
            .replying_to
            .as_ref()
            .filter(|quoted| !quoted.text.is_empty())
            .map(|quoted| r.apply(&quoted.text)),
        earlier_lines: origin.earlier.len(),
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

/// `event` as one line of `perch log --json`. Characters a terminal would act on (controls, bidi
/// and other invisible format characters) are written as `\uXXXX` escapes, so the line is safe
/// to print and still decodes to exactly the text that was logged.
pub fn json_line(event: &TranscriptEvent) -> String {
    let text = serde_json::to_string(event).unwrap_or_default();
    if !text.chars().any(crate::terminal::is_unsafe_for_terminal) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for ch in text.chars() {
        if crate::terminal::is_unsafe_for_terminal(ch) {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// Money in millionths, as text: `0.0031`, `12`.
pub fn money(micros: u64) -> String {
    crate::spend::Money::from_micros(micros).to_string()
}

fn time(at: Timestamp) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// One line shown safely: escaped and cut.
fn safe(text: &str) -> String {
    for_terminal(text, LINE_CHARS)
}

/// A turn's heading line.
pub fn heading(turn: &Turn) -> String {
    let facts = &turn.facts;
    let mut out = facts.at.map_or_else(|| "(no time)".to_owned(), time);
    let _ = write!(out, "  {}", turn.lane);
    if let Some(task) = &facts.task {
        let _ = write!(out, "  heartbeat {}", safe(task));
        if let Some(slot) = &facts.slot {
            let _ = write!(out, " (slot {})", safe(slot));
        }
    }
    if let Some((task, slot)) = &facts.steered_by {
        let _ = write!(
            out,
            "  steered by heartbeat {} (slot {})",
            safe(task),
            safe(slot)
        );
    }
    let mut places: Vec<String> = Vec::new();
    let mut senders: Vec<String> = Vec::new();
    for origin in &facts.origins {
        let place = format!(
            "{}:{}{}",
            safe(&origin.channel),
            safe(&origin.room),
            origin
                .thread
                .as_ref()
                .map(|thread| format!(" thread {}", safe(thread)))
                .unwrap_or_default()
        );
        if !places.contains(&place) {
            places.push(place);
        }
        let sender = format!(
            "{} ({})",
            safe(&origin.sender_name),
            safe(&origin.sender_id)
        );
        if !senders.contains(&sender) {
            senders.push(sender);
        }
    }
    if !places.is_empty() {
        let _ = write!(out, "  {}", places.join(", "));
    }
    if !senders.is_empty() {
        let _ = write!(out, "  {}", senders.join(", "));
    }
    if turn.start.is_none() {
        out.push_str("  (before the first turn read)");
    }
    out
}

/// A turn's closing line: its tokens and cost.
pub fn footing(facts: &TurnFacts) -> Option<String> {
    if facts.model_calls == 0 {
        return None;
    }
    let mut out = format!(
        "  {:<10}{} model call{}, {} tokens in, {} out",
        "usage",
        facts.model_calls,
        if facts.model_calls == 1 { "" } else { "s" },
        facts.input_tokens,
        facts.output_tokens
    );
    if facts.priced {
        let _ = write!(out, ", cost {}", money(facts.cost_micros));
    }
    Some(out)
}

/// A whole turn as text: heading, events, usage.
pub fn render_turn(turn: &Turn, out: &mut String) {
    out.push_str(&heading(turn));
    out.push('\n');
    for event in &turn.events {
        for line in render_event(event) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let Some(line) = footing(&turn.facts) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
}

fn labelled(label: &str, text: &str, lines: &mut Vec<String>) {
    let mut first = true;
    for piece in text.split('\n') {
        let piece = piece.strip_suffix('\r').unwrap_or(piece);
        lines.push(format!(
            "  {:<10}{}",
            if first { label } else { "" },
            safe(piece)
        ));
        first = false;
    }
}

/// One event as text lines (none for the bookkeeping a reader need not see).
pub fn render_event(event: &TranscriptEvent) -> Vec<String> {
    let mut lines = Vec::new();
    match &event.kind {
        EventKind::SegmentStarted { segment, previous } => lines.push(format!(
            "  {:<10}segment {segment}{}",
            "log",
            previous
                .as_ref()
                .map(|file| format!(", continuing {}", safe(file)))
                .unwrap_or_default()
        )),
        EventKind::RunStarted { resumed: true, .. } => lines.push(format!(
            "  {:<10}resumed after a restart: the interrupted run continues",
            "recovery"
        )),
        EventKind::RunStarted { .. }
        | EventKind::LeafSet { .. }
        | EventKind::AttemptStarted { retry: false, .. } => {}
        EventKind::CompactionStarted { trigger, .. } => lines.push(format!(
            "  {:<10}compaction started{}",
            "compact",
            match trigger {
                Some(Trigger::ContextFull) =>
                    ", since the conversation neared the model's context window",
                Some(Trigger::CompactCommand) => ", asked for with perch compact",
                _ => "",
            }
        )),
        EventKind::UserMessage {
            steer, messages, ..
        } => {
            for said in messages {
                let who = match &said.origin {
                    Some(origin) => format!("{}: ", safe(&origin.sender_name)),
                    None => String::new(),
                };
                labelled(
                    if *steer { "steer" } else { "user" },
                    &format!("{who}{}", said.text),
                    &mut lines,
                );
                if let Some(origin) = &said.origin
                    && let Some(quoted) = &origin.replying_to
                {
                    lines.push(format!(
                        "  {:<10}replying to {}{}{}",
                        "",
                        safe(quoted),
                        origin
                            .replying_to_author
                            .as_ref()
                            .map(|author| format!(" by {}", safe(author)))
                            .unwrap_or_default(),
                        origin
                            .replying_to_text
                            .as_ref()
                            .map(|text| format!(": \"{}\"", for_terminal(text, 80)))
                            .unwrap_or_default()
                    ));
                }
            }
        }
        EventKind::HeartbeatPrompt { task, slot, .. } => lines.push(format!(
            "  {:<10}task {} fired for slot {}",
            "heartbeat",
            safe(task),
            safe(slot)
        )),
        EventKind::HeartbeatCorrection { reason, .. } => lines.push(format!(
            "  {:<10}asked again for a verdict, since {}",
            "corrected",
            safe(reason)
        )),
        EventKind::HeartbeatSteer {
            task, slot, text, ..
        } => {
            lines.push(format!(
                "  {:<10}from heartbeat {} (slot {})",
                "steer",
                safe(task),
                safe(slot)
            ));
            labelled("", text, &mut lines);
        }
        EventKind::AttemptStarted { attempt, .. } => lines.push(format!(
            "  {:<10}request {attempt} after the last one got no reply",
            "retry"
        )),
        EventKind::ModelReplied {
            model,
            input,
            output,
            cached,
            cost_micros,
            ..
        } => lines.push(format!(
            "  {:<10}{}: {input} in{}, {output} out{}",
            "model",
            safe(model),
            if *cached > 0 {
                format!(" ({cached} cached)")
            } else {
                String::new()
            },
            cost_micros
                .map(|cost| format!(", cost {}", money(cost)))
                .unwrap_or_default()
        )),
        EventKind::AssistantMessage {
            text,
            reasoning_chars,
            verdict,
            ..
        } => {
            if *reasoning_chars > 0 {
                lines.push(format!(
                    "  {:<10}[reasoning: {reasoning_chars} chars]",
                    "reasoning"
                ));
            }
            if !text.is_empty() {
                labelled("reply", text, &mut lines);
            }
            if let Some(verdict) = verdict {
                lines.push(match (&verdict.verdict, &verdict.reason) {
                    (Some(kind), _) => format!("  {:<10}valid: {kind}", "verdict"),
                    (None, Some(reason)) => {
                        format!("  {:<10}invalid: {}", "verdict", safe(reason))
                    }
                    (None, None) => format!("  {:<10}invalid", "verdict"),
                });
            }
        }
        EventKind::ToolStarted {
            tool, arguments, ..
        } => {
            let arguments = serde_json::to_string(arguments).unwrap_or_default();
            lines.push(format!(
                "  {:<10}{} {}",
                "tool",
                safe(tool),
                for_terminal(&arguments, LINE_CHARS)
            ));
        }
        EventKind::ToolResult {
            tool,
            output,
            is_error,
            call_id,
            ..
        } => {
            let shown: Vec<&str> = output.lines().collect();
            lines.push(format!(
                "  {:<10}{}{} ({} line{})",
                "output",
                tool.as_deref().map_or_else(|| safe(call_id), safe),
                if *is_error { ", error" } else { "" },
                shown.len(),
                if shown.len() == 1 { "" } else { "s" }
            ));
            for line in shown.iter().take(OUTPUT_HEAD_LINES) {
                lines.push(format!("  {:<10}│ {}", "", safe(line)));
            }
            if shown.len() > OUTPUT_HEAD_LINES {
                lines.push(format!(
                    "  {:<10}│ … {} more",
                    "",
                    shown.len() - OUTPUT_HEAD_LINES
                ));
            }
        }
        EventKind::ToolFinished {
            duration_ms,
            exit_code,
            is_error,
            ..
        } => lines.push(format!(
            "  {:<10}{}, {}{}",
            "ended",
            exit_code.map_or_else(|| "no exit code".to_owned(), |code| format!("exit {code}")),
            duration(*duration_ms),
            if *is_error { ", error" } else { "" }
        )),
        EventKind::DeliverySettled {
            delivery,
            channel,
            answers,
            state,
            platform_id,
            reason,
            ..
        } => {
            let mut line = format!("  {:<10}{}", "delivery", safe(state));
            if let Some(id) = platform_id {
                let _ = write!(line, " as message {}", safe(id));
            }
            let _ = write!(line, " on {} ({})", safe(channel), safe(delivery));
            if let Some(answers) = answers {
                let _ = write!(line, ", answering {}", safe(answers));
            }
            if let Some(reason) = reason {
                let _ = write!(line, ": {}", safe(reason));
            }
            lines.push(line);
        }
        EventKind::OperationFinished {
            intent,
            outcome,
            reason,
            ..
        } => {
            let what = match (intent.as_deref(), outcome.as_str()) {
                (Some("compact"), "completed") => "compaction completed".to_owned(),
                (Some("compact"), other) => format!("compaction {other}"),
                (_, "cancelled") => "cancelled (aborted)".to_owned(),
                (_, "interrupted") => "interrupted (closed on recovery)".to_owned(),
                (_, other) => other.to_owned(),
            };
            lines.push(format!(
                "  {:<10}{what}{}",
                "end",
                reason
                    .as_ref()
                    .map(|reason| format!(": {}", safe(reason)))
                    .unwrap_or_default()
            ));
        }
        EventKind::CompactionSummary { chars, .. } => lines.push(format!(
            "  {:<10}summary of {chars} chars; the lane continues from it",
            "compact"
        )),
        EventKind::HeartbeatOutcome {
            task,
            slot,
            mode,
            outcome,
            text,
            target,
            delivery,
            steered_lane,
            reason,
            ..
        } => {
            let mut line = format!(
                "  {:<10}{} ({} run of {} for slot {})",
                "outcome",
                safe(outcome),
                safe(mode),
                safe(task),
                safe(slot)
            );
            if let Some(target) = target {
                let _ = write!(line, " to {}", safe(target));
            }
            if let Some(delivery) = delivery {
                let _ = write!(line, " as delivery {}", safe(delivery));
            }
            if let Some(lane) = steered_lane {
                let _ = write!(line, " into lane {}", safe(lane));
            }
            if let Some(reason) = reason {
                let _ = write!(line, ": {}", safe(reason));
            }
            lines.push(line);
            if let Some(text) = text {
                labelled("", text, &mut lines);
            }
        }
        EventKind::Note { name, value, .. } => lines.push(format!(
            "  {:<10}{} {}",
            "note",
            safe(name),
            for_terminal(&serde_json::to_string(value).unwrap_or_default(), LINE_CHARS)
        )),
        EventKind::TailRepaired {
            truncated_bytes,
            offset,
        } => lines.push(format!(
            "  {:<10}a torn last line ({truncated_bytes} bytes at offset {offset}) was cut off on open",
            "repair"
        )),
        EventKind::Damaged { file, line, reason } => lines.push(format!(
            "  {:<10}{}:{line}: {}",
            "DAMAGED",
            escaped(file),
            safe(reason)
        )),
    }
    lines
}

fn duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{}.{} s", ms / 1_000, (ms % 1_000) / 100)
    }
}

#[cfg(test)]
mod tests;
