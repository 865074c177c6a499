//! Folding a lane's lines into turns and events: what begins a turn, what joins the one before,
//! and what a user entry was, read from what perch wrote.

use super::{CallName, EventKind, Judgement, Origin, Redaction, Said, TranscriptEvent, Turn};
use crate::Timestamp;
use crate::heartbeat::{SlotOutcome, Verdict, judge};
use crate::id::{EntryId, OperationId};
use crate::log::{
    Entry, EntryBody, Header, HeartbeatNote, Intent, Line, LinePosition, Message, Note, Outcome,
    Part, ReadLine, Record, Role, Settled, Trigger,
};
use crate::name::LaneName;
use crate::origin::{MessageOrigin, Relay};
use std::collections::HashMap;

/// How a heartbeat's prompt begins: `[heartbeat NAME for SLOT`. Read only in entries of lanes
/// written before triggers were kept.
const HEARTBEAT_PROMPT: &str = "[heartbeat ";

/// How the correction after an invalid verdict begins (see [`crate::heartbeat::correction`]).
/// Read only in entries of lanes written before triggers were kept.
const CORRECTION: &str = "That reply is not a valid verdict: ";

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
                let texts = crate::conversation::text_parts(message);
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

/// The operation running now, as far as the lines read say.
#[derive(Debug)]
struct Running {
    op: OperationId,
    trigger: Option<Trigger>,
    /// Whether its first user entry was read: a later one is a steer.
    user_written: bool,
}

/// What a user entry is, as `perch log` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum UserEntry {
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
pub(super) fn user_entry(
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
    match &note.outcome {
        SlotOutcome::Message {
            text: said,
            target: to,
            delivery: id,
        } => {
            text = Some(r.apply(said));
            target = (!to.is_empty()).then(|| r.apply(to));
            delivery = (!id.is_empty()).then(|| r.apply(id));
        }
        SlotOutcome::Steer { text: said, lane } => {
            text = Some(r.apply(said));
            steered_lane = Some(lane.to_string());
        }
        _ => {}
    }
    EventKind::HeartbeatOutcome {
        entry,
        task: r.apply(note.task.as_str()),
        slot: note.slot.to_rfc3339(),
        run: r.apply(&note.run),
        mode: note.mode.map_or("", |mode| mode.as_str()).to_owned(),
        outcome: note.outcome.name().into(),
        text,
        target,
        delivery,
        steered_lane,
        reason: note.outcome.reason().map(|why| r.apply(why)),
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
