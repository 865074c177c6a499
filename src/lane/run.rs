//! One run, as it goes to disk:
//!
//! 1. `operation_started` (the run's id, its intent, what started it, the inbox items it
//!    consumes, whether it resumes an interrupted run of them);
//! 2. the user entry (not for a resumption whose interrupted run wrote it already);
//! 3. for every model turn: `attempt_started` for each request, `model_replied` (the tokens
//!    and their cost) for the one answered, then the assistant entry;
//! 4. for each tool call: `tool_started` (tool, arguments, the id its result will carry, its
//!    replay declaration), the effect, the result entry under exactly that id, then
//!    `tool_finished` (how long it took, the command's exit code);
//! 5. `operation_finished` with the outcome.
//!
//! A crash between any two of these leaves an open operation that recovery closes. An abort is
//! the same reconciliation done live: the running command is killed, every promised result is
//! still written, and the operation is closed as cancelled.

use super::{Events, Finished, Input, LaneError, LaneEvent, Said, Shared, SteerFrom};
use crate::host::failpoint;
use crate::model::{ModelError, ModelErrorKind, ModelReply, ModelRequest, StreamEvent};
use perch_core::conversation::{self, estimate_tokens, summary_entry, text_of, tool_calls};
use perch_core::heartbeat::ModelFailure;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{
    Entry, EntryBody, Intent, Line, Message, Note, Outcome, Part, Record, Resumption, Role, Trigger,
};
use perch_core::name::ToolName;
use perch_core::origin::Relay;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const COMPACT_SYSTEM: &str = "You compact conversations. Write a summary of the conversation \
so far that lets it continue without the original: the people and their requests, decisions \
made, facts learned, files and commands that matter, and what is still open. Write only the \
summary.";

const COMPACT_REQUEST: &str = "Summarise the conversation so far, as instructed.";

pub(super) struct Runner<'s> {
    pub(super) shared: &'s Shared,
    /// The current branch, root first, kept in step with every entry appended.
    pub(super) branch: Vec<Entry>,
    pub(super) cancel: CancellationToken,
}

/// How the model turns of a run ended.
struct TurnsEnd {
    outcome: Outcome,
    text: String,
    model_failure: Option<ModelFailure>,
}

/// How a request to the model ended its run instead of replying: the outcome, and the kind of
/// the model's error when one failed it.
struct Unanswered {
    outcome: Outcome,
    model_failure: Option<ModelFailure>,
}

impl Unanswered {
    fn with(outcome: Outcome) -> Unanswered {
        Unanswered {
            outcome,
            model_failure: None,
        }
    }
}

impl Runner<'_> {
    pub(super) async fn run(
        &mut self,
        input: Input,
        resume: Option<Resumption>,
        events: &Events,
    ) -> Result<Finished, LaneError> {
        let started = std::time::Instant::now();
        // A resumption continues the branch it interrupted, as it is.
        let resuming = resume.is_some();
        if input.fresh && !resuming {
            self.branch.clear();
        } else if !resuming && self.needs_compaction(&input.text) {
            let compacted = self.compact(Trigger::ContextFull, events).await?;
            if compacted.outcome == Outcome::Completed {
                emit(events, LaneEvent::Compacted);
            }
        }
        let op = OperationId::from_uuid(uuid::Uuid::now_v7());
        let relay = input.trigger.relay();
        self.record(Record::OperationStarted {
            op,
            intent: Intent::Run,
            consumes: input.consumes,
            resumed: resume.is_some(),
            trigger: Some(input.trigger),
            at: self.now(),
        })
        .await?;
        failpoint::hit("after:operation_started");
        if resume != Some(Resumption::FromLeaf) {
            self.entry(user_message(input.text, input.said, relay))
                .await?;
            failpoint::hit("after:user_entry");
        }
        let end = self.turns(op, events).await?;
        self.finish(op, end.outcome.clone()).await?;
        self.shared.setup.metrics.run_finished(started.elapsed());
        Ok(Finished {
            op,
            outcome: end.outcome,
            text: end.text,
            model_failure: end.model_failure,
        })
    }

    /// A compaction, started by `trigger`.
    pub(super) async fn compact(
        &mut self,
        trigger: Trigger,
        events: &Events,
    ) -> Result<Finished, LaneError> {
        let op = OperationId::from_uuid(uuid::Uuid::now_v7());
        self.record(Record::OperationStarted {
            op,
            intent: Intent::Compact,
            consumes: Vec::new(),
            resumed: false,
            trigger: Some(trigger),
            at: self.now(),
        })
        .await?;
        let mut messages = conversation::messages(&self.branch);
        messages.push(Message::new(
            Role::User,
            vec![Part::Text {
                text: COMPACT_REQUEST.into(),
            }],
        ));
        let request = ModelRequest {
            system: COMPACT_SYSTEM.into(),
            messages,
            tools: Vec::new(),
            thinking: self.shared.setup.thinking,
        };
        let mut model_failure = None;
        let (outcome, text) = match self.ask(op, &request, &mut 0, events).await? {
            Ok(reply) => {
                let summary = text_of(&Message::new(Role::Assistant, reply.parts));
                let summarised = self.leaf();
                let entry = summary_entry(self.new_id(), &summary, summarised, self.now());
                self.append_entry(entry).await?;
                (Outcome::Completed, summary)
            }
            Err(unanswered) => {
                model_failure = unanswered.model_failure;
                (unanswered.outcome, String::new())
            }
        };
        self.finish(op, outcome.clone()).await?;
        if outcome == Outcome::Completed {
            self.shared.log.roll().await?;
        }
        Ok(Finished {
            op,
            outcome,
            text,
            model_failure,
        })
    }

    fn needs_compaction(&self, next: &str) -> bool {
        let setup = &self.shared.setup;
        if setup.context_window == 0 || self.branch.len() < 2 {
            return false;
        }
        let system = (setup.system_prompt)();
        let estimate = estimate_tokens(&system, &conversation::messages(&self.branch))
            + estimate_tokens(next, &[]);
        #[expect(
            clippy::cast_precision_loss,
            reason = "a threshold, not an exact count"
        )]
        let threshold = setup.context_window as f64 * setup.limits.compact_at;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a threshold, not an exact count"
        )]
        let over = estimate as f64 >= threshold;
        over
    }

    async fn turns(&mut self, op: OperationId, events: &Events) -> Result<TurnsEnd, LaneError> {
        let limits = self.shared.setup.limits;
        let mut attempt = 0;
        let mut tool_calls_made = 0;
        loop {
            let request = ModelRequest {
                system: (self.shared.setup.system_prompt)(),
                messages: conversation::messages(&self.branch),
                tools: self.shared.setup.toolbox.specs(),
                thinking: self.shared.setup.thinking,
            };
            let reply = match self.ask(op, &request, &mut attempt, events).await? {
                Ok(reply) => reply,
                Err(unanswered) => {
                    return Ok(TurnsEnd {
                        outcome: unanswered.outcome,
                        text: String::new(),
                        model_failure: unanswered.model_failure,
                    });
                }
            };
            let assistant = Message::new(Role::Assistant, reply.parts);
            let text = text_of(&assistant);
            let calls = tool_calls(&assistant);
            self.entry(assistant).await?;
            failpoint::hit("after:assistant_entry");
            if calls.is_empty() {
                return Ok(TurnsEnd {
                    outcome: Outcome::Completed,
                    text,
                    model_failure: None,
                });
            }
            let mut skipping: Option<String> = None;
            let mut over_limit = false;
            for (call_id, name, arguments) in calls {
                if skipping.is_none() {
                    if self.cancel.is_cancelled() {
                        skipping = Some("skipped: the run was aborted".into());
                    } else if self.shared.has_steering() {
                        skipping = Some("skipped: new message".into());
                    } else if tool_calls_made >= limits.tool_calls {
                        over_limit = true;
                        skipping = Some(format!(
                            "skipped: this run reached its limit of {} tool calls",
                            limits.tool_calls
                        ));
                    }
                }
                if let Some(reason) = &skipping {
                    self.tool_result(self.new_id(), call_id, reason.clone(), true)
                        .await?;
                    continue;
                }
                tool_calls_made += 1;
                self.call_tool(op, call_id, name, arguments, events).await?;
            }
            if self.cancel.is_cancelled() {
                return Ok(TurnsEnd {
                    outcome: Outcome::Cancelled,
                    text,
                    model_failure: None,
                });
            }
            if over_limit {
                return Ok(TurnsEnd {
                    outcome: Outcome::Failed {
                        reason: format!(
                            "the model asked for more than {} tool calls in one run; the calls past the limit were skipped",
                            limits.tool_calls
                        ),
                    },
                    text,
                    model_failure: None,
                });
            }
            for (text, from) in self.shared.take_steering() {
                let message = match from {
                    SteerFrom::Person(origin) => {
                        let said = vec![Said {
                            origin: *origin,
                            text: text.clone(),
                        }];
                        user_message(text, said, None)
                    }
                    SteerFrom::Relay(relay) => user_message(text, Vec::new(), Some(relay)),
                };
                self.entry(message).await?;
                emit(events, LaneEvent::Steered);
            }
        }
    }

    async fn call_tool(
        &mut self,
        op: OperationId,
        call_id: String,
        name: String,
        arguments: serde_json::Value,
        events: &Events,
    ) -> Result<(), LaneError> {
        let toolbox = &self.shared.setup.toolbox;
        let result = self.new_id();
        let (Ok(tool), Some(replay)) = (ToolName::try_from(name.as_str()), toolbox.replay(&name))
        else {
            let known: Vec<String> = toolbox.specs().into_iter().map(|spec| spec.name).collect();
            let output = format!(
                "there is no tool {name:?}; the tools are: {}",
                known.join(", ")
            );
            return self.tool_result(result, call_id, output, true).await;
        };
        self.record(Record::ToolStarted {
            op,
            call_id: call_id.clone(),
            tool,
            arguments: arguments.clone(),
            result,
            replay,
            at: self.now(),
        })
        .await?;
        failpoint::hit("after:tool_started");
        emit(
            events,
            LaneEvent::ToolStarted {
                name: name.clone(),
                arguments: arguments.clone(),
            },
        );
        let began = std::time::Instant::now();
        let outcome = toolbox.call(&name, &arguments, self.cancel.clone()).await;
        let duration_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.shared.setup.metrics.tool_call(&name);
        emit(
            events,
            LaneEvent::ToolFinished {
                name,
                is_error: outcome.is_error,
            },
        );
        self.tool_result(result, call_id.clone(), outcome.output, outcome.is_error)
            .await?;
        failpoint::hit("after:tool_result");
        self.record(Record::ToolFinished {
            op,
            call_id,
            result,
            duration_ms,
            exit_code: outcome.exit_code,
            is_error: outcome.is_error,
            at: self.now(),
        })
        .await
    }

    /// Asks the model, one recorded attempt per request, retrying what may succeed later.
    /// `Err` is the outcome the run ends with.
    async fn ask(
        &mut self,
        op: OperationId,
        request: &ModelRequest,
        attempt: &mut u32,
        events: &Events,
    ) -> Result<Result<ModelReply, Unanswered>, LaneError> {
        let limits = self.shared.setup.limits;
        let mut tries = 0;
        loop {
            if self.cancel.is_cancelled() {
                return Ok(Err(Unanswered::with(Outcome::Cancelled)));
            }
            if let Some(spend) = &self.shared.setup.spend
                && let Err(reason) = spend.guard.check(spend.kind).await
            {
                return Ok(Err(Unanswered::with(Outcome::Failed { reason })));
            }
            tries += 1;
            *attempt += 1;
            self.record(Record::AttemptStarted {
                op,
                attempt: *attempt,
                at: self.now(),
            })
            .await?;
            failpoint::hit("after:attempt_started");
            let error = match self.request_once(request, events).await {
                Ok(reply) => {
                    let setup = &self.shared.setup;
                    setup.metrics.tokens(reply.usage.input, reply.usage.output);
                    let usage = perch_core::spend::TokenUsage {
                        input: reply.usage.input,
                        output: reply.usage.output,
                        cached: reply.usage.cached,
                    };
                    let price = setup.spend.as_ref().and_then(|spend| spend.price);
                    if let Some(spend) = &setup.spend {
                        spend
                            .guard
                            .record(&spend.lane, &spend.model, spend.price, usage)
                            .await;
                    }
                    self.record(Record::ModelReplied {
                        op,
                        attempt: *attempt,
                        model: setup.model_name.clone(),
                        input: usage.input,
                        output: usage.output,
                        cached: usage.cached,
                        cost: price.map(|price| price.cost(usage)),
                        at: self.now(),
                    })
                    .await?;
                    return Ok(Ok(reply));
                }
                Err(error) => error,
            };
            if error.kind == ModelErrorKind::Cancelled {
                return Ok(Err(Unanswered::with(Outcome::Cancelled)));
            }
            let wait = match error.kind.retry() {
                Some(wait) if tries < limits.attempts => {
                    wait.unwrap_or_else(|| limits.backoff.saturating_mul(1 << (tries - 1).min(16)))
                }
                _ => {
                    let reason = if tries > 1 {
                        format!("{error} (after {tries} attempts)")
                    } else {
                        error.to_string()
                    };
                    return Ok(Err(Unanswered {
                        outcome: Outcome::Failed { reason },
                        model_failure: Some(error.kind.failure()),
                    }));
                }
            };
            emit(
                events,
                LaneEvent::Retrying {
                    attempt: *attempt,
                    error: error.to_string(),
                    after: wait,
                },
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.cancel.cancelled() => return Ok(Err(Unanswered::with(Outcome::Cancelled))),
            }
        }
    }

    async fn request_once(
        &self,
        request: &ModelRequest,
        events: &Events,
    ) -> Result<ModelReply, ModelError> {
        let (stream, mut deltas) = mpsc::unbounded_channel::<StreamEvent>();
        let forward = events.clone().map(|events| {
            tokio::spawn(async move {
                while let Some(delta) = deltas.recv().await {
                    let _ = events.send(LaneEvent::Model(delta));
                }
            })
        });
        let reply = self
            .shared
            .setup
            .model
            .complete(request, stream, self.cancel.clone())
            .await;
        if let Some(forward) = forward {
            let _ = forward.await;
        }
        reply
    }

    async fn tool_result(
        &mut self,
        id: EntryId,
        call_id: String,
        output: String,
        is_error: bool,
    ) -> Result<(), LaneError> {
        let entry = Entry {
            id,
            parent: self.leaf(),
            at: self.now(),
            body: EntryBody::Message(Message::new(
                Role::Tool,
                vec![Part::ToolResult {
                    call_id,
                    output,
                    is_error,
                }],
            )),
        };
        self.append_entry(entry).await
    }

    pub(super) async fn note(&mut self, note: Note) -> Result<(), LaneError> {
        self.append_body(EntryBody::Note(note)).await
    }

    async fn entry(&mut self, message: Message) -> Result<(), LaneError> {
        self.append_body(EntryBody::Message(message)).await
    }

    /// Appends `body` as a new entry under the leaf, now.
    async fn append_body(&mut self, body: EntryBody) -> Result<(), LaneError> {
        let entry = Entry {
            id: self.new_id(),
            parent: self.leaf(),
            at: self.now(),
            body,
        };
        self.append_entry(entry).await
    }

    async fn append_entry(&mut self, entry: Entry) -> Result<(), LaneError> {
        self.shared.log.append(&Line::Entry(entry.clone())).await?;
        if entry.parent.is_none() {
            self.branch.clear();
        }
        self.branch.push(entry);
        Ok(())
    }

    async fn record(&self, record: Record) -> Result<(), LaneError> {
        self.shared.log.append(&Line::Record(record)).await?;
        Ok(())
    }

    async fn finish(&self, op: OperationId, outcome: Outcome) -> Result<(), LaneError> {
        failpoint::hit("before:operation_finished");
        self.record(Record::OperationFinished {
            op,
            outcome,
            at: self.now(),
        })
        .await
    }

    fn leaf(&self) -> Option<EntryId> {
        self.branch.last().map(|entry| entry.id)
    }

    fn new_id(&self) -> EntryId {
        EntryId::from_uuid(uuid::Uuid::now_v7())
    }

    fn now(&self) -> perch_core::Timestamp {
        self.shared.setup.clock.now()
    }
}

/// A user entry: each chat message as a text part with its origin, or `text` alone, relayed
/// from `relay` when perch relays it.
fn user_message(text: String, said: Vec<Said>, relay: Option<Relay>) -> Message {
    if said.is_empty() {
        return Message {
            relay,
            ..Message::new(Role::User, vec![Part::Text { text }])
        };
    }
    let (origins, parts) = said
        .into_iter()
        .map(|said| (said.origin, Part::Text { text: said.text }))
        .unzip();
    Message {
        role: Role::User,
        parts,
        origins,
        relay: None,
    }
}

fn emit(events: &Events, event: LaneEvent) {
    if let Some(events) = events {
        let _ = events.send(event);
    }
}
