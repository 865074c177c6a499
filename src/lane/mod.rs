//! A lane: one conversation, owned by one task. Everything else talks to it through a
//! [`Lane`] handle, whose messages the task answers: send (a run, or a follow-up queued behind
//! the active one), steer (delivered at the next tool boundary), abort, compact, close.
//!
//! Every step of a run is on disk before and after it happens (see [`run`]), so opening a lane
//! after a crash first recovers it: every missing tool result is produced and every open
//! operation closed, without guessing.

mod run;
mod runtime;

pub use runtime::{MAX_ACTIVE_RUNS, Runtime};

use crate::host::clock::Clock;
use crate::log::{LaneLog, LogError, RecoveryReport, ToolRerun, recover};
use crate::model::{Model, StreamEvent};
use crate::tools::toolbox::Toolbox;
use perch_core::config::Thinking;
use perch_core::conversation::unanswered_calls;
use perch_core::heartbeat::ModelFailure;
use perch_core::id::EntryId;
use perch_core::id::OperationId;
use perch_core::log::{
    Entry, EntryBody, Line, Message, Note, Outcome, Part, Record, Resumption, Role, Trigger,
};
use perch_core::name::LaneName;
use perch_core::origin::{MessageOrigin, Relay};
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// What a lane needs besides its log: the model, the tools, the system prompt and the limits.
pub struct LaneSetup {
    pub model: Arc<dyn Model>,
    /// The model as `models.yml` names it, `provider/model`: what each reply's
    /// `model_replied` record names.
    pub model_name: String,
    pub toolbox: Arc<Toolbox>,
    /// Assembled afresh for every run, so edits to the workspace's files take effect.
    pub system_prompt: Arc<dyn Fn() -> String + Send + Sync>,
    pub thinking: Thinking,
    /// The model's context window, in tokens, from `models.yml`.
    pub context_window: u64,
    pub limits: RunLimits,
    pub clock: Clock,
    /// Shared by every lane of an agent: a run waits for a permit before it starts, so only so
    /// many lanes run at once.
    pub active_runs: Arc<Semaphore>,
    /// Counts runs, tool calls and tokens for `perch run --metrics`.
    pub metrics: Arc<crate::host::metrics::Metrics>,
    /// The daily spend guard, consulted before each model request and told each reply's usage.
    pub spend: Option<LaneSpend>,
}

/// A lane's part in the daily spend guard.
#[derive(Debug, Clone)]
pub struct LaneSpend {
    pub guard: crate::store::spend::SpendGuard,
    /// Heartbeat runs pause before conversations do.
    pub kind: perch_core::spend::RunKind,
    /// The lane's name, recorded with each reply's usage.
    pub lane: String,
    /// The model the lane's replies come from, `provider/id`.
    pub model: String,
    /// Its price per million tokens, from `models.yml`.
    pub price: Option<perch_core::spend::Price>,
}

impl fmt::Debug for LaneSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneSetup")
            .field("model", &self.model)
            .field("thinking", &self.thinking)
            .field("context_window", &self.context_window)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Bounds on one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunLimits {
    /// Tool calls one run may make; the calls past it are skipped and the run fails, explained.
    pub tool_calls: usize,
    /// Requests per model turn, the first included, before the run fails.
    pub attempts: u32,
    /// The wait before the first retry; it doubles for each next one, unless the provider
    /// says how long to wait (`Retry-After`).
    pub backoff: Duration,
    /// Compact before a run when the conversation is estimated to fill this share of the
    /// context window.
    pub compact_at: f64,
}

impl Default for RunLimits {
    fn default() -> RunLimits {
        RunLimits {
            tool_calls: 50,
            attempts: 4,
            backoff: Duration::from_secs(1),
            compact_at: 0.8,
        }
    }
}

/// A message for the lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub text: String,
    /// Inbox items this input came from; the run's first record names them, so a crash never
    /// loses or doubles a message.
    pub consumes: Vec<String>,
    /// Start a new branch for this input instead of continuing the conversation: the run sees
    /// only the system prompt and this input (a heartbeat's fresh run).
    pub fresh: bool,
    /// The chat messages this input is, each with where it came from: when there are any, the
    /// user entry holds one text part per message with its origin (and `text`, their texts
    /// joined, only sizes the input); when there are none, it holds `text` alone.
    pub said: Vec<Said>,
    /// What started it, written in the run's `operation_started`. A steer's also marks the user
    /// entry as relayed from its heartbeat task.
    pub trigger: Trigger,
}

/// One chat message of an [`Input`]: its text as the agent reads it, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub origin: MessageOrigin,
    pub text: String,
}

/// Who a steering message is from: a person in a chat, or a part of perch relaying it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SteerFrom {
    Person(Box<MessageOrigin>),
    Relay(Relay),
}

/// What a run shows while it works, for display.
#[derive(Debug, Clone, PartialEq)]
pub enum LaneEvent {
    Model(StreamEvent),
    ToolStarted {
        name: String,
        arguments: serde_json::Value,
    },
    ToolFinished {
        name: String,
        is_error: bool,
    },
    Retrying {
        attempt: u32,
        error: String,
        after: Duration,
    },
    /// A steering message was added to the conversation at a tool boundary.
    Steered,
    /// The conversation was compacted before the run.
    Compacted,
}

/// How a run or a compaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub op: OperationId,
    pub outcome: Outcome,
    /// The last assistant text of the run (the summary, for a compaction).
    pub text: String,
    /// The kind of the model's error, when one failed the run. Not in the session log, which
    /// keeps the reason's text; callers decide from this, never from the text.
    pub model_failure: Option<ModelFailure>,
}

/// Whether a steering message reached an active run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steered {
    /// Queued for the active run's next tool boundary.
    Delivered,
    /// No run is active; the caller decides what to do with the message.
    Idle,
}

#[derive(Debug)]
pub enum LaneError {
    Log(LogError),
    /// The lane's task has ended.
    Closed,
}

impl fmt::Display for LaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaneError::Log(error) => write!(f, "{error}"),
            LaneError::Closed => f.write_str("the lane is closed"),
        }
    }
}

impl std::error::Error for LaneError {}

impl From<LogError> for LaneError {
    fn from(error: LogError) -> LaneError {
        LaneError::Log(error)
    }
}

type Events = Option<mpsc::UnboundedSender<LaneEvent>>;
type Reply = oneshot::Sender<Result<Finished, LaneError>>;

enum Request {
    /// Work that waits its turn behind the active run and the work queued before it.
    Queue(Work),
    Steer {
        text: String,
        from: SteerFrom,
        reply: oneshot::Sender<Steered>,
    },
    Abort,
    Close {
        reply: oneshot::Sender<Result<(), LaneError>>,
    },
    Record {
        record: Record,
        reply: oneshot::Sender<Result<(), LaneError>>,
    },
}

/// A handle to a lane's task. Clones talk to the same task.
#[derive(Debug, Clone)]
pub struct Lane {
    requests: mpsc::UnboundedSender<Request>,
}

impl Lane {
    /// Opens the lane under `sessions` (creating it if new), recovers whatever a crash left
    /// open, and starts its task.
    pub async fn open(
        sessions: &Path,
        name: &LaneName,
        setup: LaneSetup,
    ) -> Result<(Lane, RecoveryReport), LaneError> {
        let sessions = sessions.to_owned();
        let name_owned = name.clone();
        let clock = setup.clock.clone();
        let (log, _) =
            tokio::task::spawn_blocking(move || LaneLog::open(&sessions, &name_owned, clock))
                .await
                .map_err(|error| {
                    LaneError::Log(LogError::WriterStopped {
                        reason: format!("opening the lane panicked: {error}"),
                    })
                })??;
        answer_calls_that_never_started(&log, &setup.clock).await?;
        let toolbox = Arc::clone(&setup.toolbox);
        let report = recover(
            &log,
            |tool| toolbox.replay(tool.as_str()),
            |pending: &perch_core::log::PendingTool| {
                // An owned future (no borrow of `pending`), so the lane's opening stays `Send`
                // for every caller.
                let toolbox = Arc::clone(&toolbox);
                let tool = pending.tool.to_string();
                let arguments = pending.arguments.clone();
                async move {
                    let outcome = toolbox
                        .call(&tool, &arguments, CancellationToken::new())
                        .await;
                    ToolRerun {
                        output: outcome.output,
                        is_error: outcome.is_error,
                    }
                }
            },
            &setup.clock,
        )
        .await?;
        let branch = log.branch().await?;
        let (requests, inbox) = mpsc::unbounded_channel();
        let task = LaneTask {
            shared: Arc::new(Shared {
                log,
                setup,
                steering: Mutex::new(VecDeque::new()),
            }),
            branch: Some(branch),
            queue: VecDeque::new(),
            cancel: CancellationToken::new(),
        };
        tokio::spawn(task.serve(inbox));
        Ok((Lane { requests }, report))
    }

    /// Runs `input`; if a run is active, it is queued as a follow-up and runs next.
    pub async fn send(&self, input: Input, events: Events) -> Result<Finished, LaneError> {
        self.run(input, None, events).await
    }

    /// Continues a run a crash interrupted, taking the same inbox items (`input.consumes`): its
    /// `operation_started` says it is a resumption, and it starts from the lane's leaf, writing
    /// `input.text` as a user entry only when the interrupted run had not
    /// ([`Resumption::WithInput`]). Queued like [`Lane::send`].
    pub async fn resume(
        &self,
        input: Input,
        resumption: Resumption,
        events: Events,
    ) -> Result<Finished, LaneError> {
        self.run(input, Some(resumption), events).await
    }

    async fn run(
        &self,
        input: Input,
        resume: Option<Resumption>,
        events: Events,
    ) -> Result<Finished, LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Queue(Work::Run {
            input,
            resume,
            events,
            reply,
        }))?;
        answer.await.map_err(|_| LaneError::Closed)?
    }

    /// Summarises the conversation into one entry and moves the leaf to it, as `perch compact`
    /// asks.
    pub async fn compact(&self, events: Events) -> Result<Finished, LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Queue(Work::Compact { events, reply }))?;
        answer.await.map_err(|_| LaneError::Closed)?
    }

    /// Appends `note` to the conversation after the active and queued runs: kept in the lane's
    /// tree, never shown to the model.
    pub async fn note(&self, note: Note) -> Result<(), LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Queue(Work::Note { note, reply }))?;
        answer.await.map_err(|_| LaneError::Closed)?
    }

    /// Adds a chat message to the active run at its next tool boundary, its entry keeping where
    /// it came from; tool calls of the current reply not yet started are skipped, with a result
    /// saying so.
    pub async fn steer_said(&self, said: Said) -> Result<Steered, LaneError> {
        self.steer(said.text, SteerFrom::Person(Box::new(said.origin)))
            .await
    }

    /// [`Lane::steer_said`] with a text perch relays (a heartbeat's `Steer:`): its entry says
    /// where it was relayed from, and has no sender.
    pub async fn steer_relayed(&self, relay: Relay, text: String) -> Result<Steered, LaneError> {
        self.steer(text, SteerFrom::Relay(relay)).await
    }

    async fn steer(&self, text: String, from: SteerFrom) -> Result<Steered, LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Steer { text, from, reply })?;
        answer.await.map_err(|_| LaneError::Closed)
    }

    /// Aborts the active run: its running command is killed, the results it promised are
    /// written, and its operation is closed as cancelled. Queued follow-ups still run.
    pub fn abort(&self) -> Result<(), LaneError> {
        self.request(Request::Abort)
    }

    /// Appends a record of something observed outside the lane's runs (a delivery's fate) now,
    /// between the lines of any run in progress, through the lane's one writer. The log refuses
    /// a record that needs an open operation it does not have.
    pub async fn record(&self, record: Record) -> Result<(), LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Record { record, reply })?;
        answer.await.map_err(|_| LaneError::Closed)?
    }

    /// Aborts the active run, waits for it to reconcile, and closes the log.
    pub async fn close(self) -> Result<(), LaneError> {
        let (reply, answer) = oneshot::channel();
        self.request(Request::Close { reply })?;
        answer.await.map_err(|_| LaneError::Closed)?
    }

    fn request(&self, request: Request) -> Result<(), LaneError> {
        self.requests.send(request).map_err(|_| LaneError::Closed)
    }
}

/// A crash between writing the assistant's tool calls and the first `tool_started` leaves calls
/// that nothing will answer: none of them ran, so each gets a result saying so. Calls that did
/// start are left to [`recover`], which knows whether they may run again.
async fn answer_calls_that_never_started(log: &LaneLog, clock: &Clock) -> Result<(), LaneError> {
    let started: HashSet<String> = log
        .pending_tools()
        .await?
        .into_iter()
        .flat_map(|(_, tools)| tools.into_iter().map(|tool| tool.call_id))
        .collect();
    let branch = log.branch().await?;
    let mut parent = branch.last().map(|entry| entry.id);
    for (call_id, name) in unanswered_calls(&branch) {
        if started.contains(&call_id) {
            continue;
        }
        let id = EntryId::from_uuid(uuid::Uuid::now_v7());
        let entry = Entry {
            id,
            parent,
            at: clock.now(),
            body: EntryBody::Message(Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id,
                    output: format!(
                        "interrupted: perch stopped before this call of {name} started; it did not run"
                    ),
                    is_error: true,
                }],
                origins: Vec::new(),
                relay: None,
            }),
        };
        log.append(&Line::Entry(entry)).await?;
        parent = Some(id);
    }
    Ok(())
}

/// What the task and its active run share.
struct Shared {
    log: LaneLog,
    setup: LaneSetup,
    /// Steering messages for the active run, taken at its next tool boundary.
    steering: Mutex<VecDeque<(String, SteerFrom)>>,
}

impl Shared {
    fn take_steering(&self) -> Vec<(String, SteerFrom)> {
        self.steering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect()
    }

    fn has_steering(&self) -> bool {
        !self
            .steering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

/// What a lane does in its turn, one at a time: a run, a compaction, a note.
enum Work {
    Run {
        input: Input,
        resume: Option<Resumption>,
        events: Events,
        reply: Reply,
    },
    Compact {
        events: Events,
        reply: Reply,
    },
    Note {
        note: Note,
        reply: oneshot::Sender<Result<(), LaneError>>,
    },
}

type ActiveRun = Pin<Box<dyn Future<Output = Vec<Entry>> + Send>>;

struct LaneTask {
    shared: Arc<Shared>,
    /// The current branch, root first; held by the active run while there is one.
    branch: Option<Vec<Entry>>,
    queue: VecDeque<Work>,
    cancel: CancellationToken,
}

enum Event {
    Request(Option<Request>),
    Finished(Vec<Entry>),
}

impl LaneTask {
    async fn serve(mut self, mut inbox: mpsc::UnboundedReceiver<Request>) {
        let mut active: Option<ActiveRun> = None;
        let mut closing: Option<oneshot::Sender<Result<(), LaneError>>> = None;
        loop {
            if active.is_none() {
                if let Some(reply) = closing.take() {
                    let _ = reply.send(
                        self.shared
                            .log
                            .clone()
                            .close()
                            .await
                            .map_err(LaneError::from),
                    );
                    return;
                }
                if let Some(work) = self.queue.pop_front() {
                    active = Some(self.start(work));
                }
            }
            let event = {
                let running = async {
                    match active.as_mut() {
                        Some(run) => run.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    request = inbox.recv() => Event::Request(request),
                    branch = running => Event::Finished(branch),
                }
            };
            match event {
                Event::Finished(branch) => {
                    active = None;
                    self.branch = Some(branch);
                }
                Event::Request(None) => {
                    self.cancel.cancel();
                    if let Some(run) = active.take() {
                        run.await;
                    }
                    return;
                }
                Event::Request(Some(request)) => match request {
                    Request::Queue(work) => self.queue.push_back(work),
                    Request::Steer { text, from, reply } => {
                        let answer = if active.is_some() {
                            self.shared
                                .steering
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push_back((text, from));
                            Steered::Delivered
                        } else {
                            Steered::Idle
                        };
                        let _ = reply.send(answer);
                    }
                    Request::Abort => self.cancel.cancel(),
                    Request::Record { record, reply } => {
                        let appended = self.shared.log.append(&Line::Record(record)).await;
                        let _ = reply.send(appended.map(drop).map_err(LaneError::from));
                    }
                    Request::Close { reply } => {
                        self.cancel.cancel();
                        for work in self.queue.drain(..) {
                            match work {
                                Work::Run { reply, .. } | Work::Compact { reply, .. } => {
                                    let _ = reply.send(Err(LaneError::Closed));
                                }
                                Work::Note { reply, .. } => {
                                    let _ = reply.send(Err(LaneError::Closed));
                                }
                            }
                        }
                        closing = Some(reply);
                    }
                },
            }
        }
    }

    fn start(&mut self, work: Work) -> ActiveRun {
        self.cancel = CancellationToken::new();
        let shared = Arc::clone(&self.shared);
        let cancel = self.cancel.clone();
        let branch = self.branch.take().unwrap_or_default();
        Box::pin(async move {
            let permit = Arc::clone(&shared.setup.active_runs).acquire_owned().await;
            let mut runner = run::Runner {
                shared: &shared,
                branch,
                cancel,
            };
            match work {
                Work::Run {
                    input,
                    resume,
                    events,
                    reply,
                } => {
                    let result = runner.run(input, resume, &events).await;
                    let _ = reply.send(result);
                }
                Work::Compact { events, reply } => {
                    let result = runner.compact(Trigger::CompactCommand, &events).await;
                    let _ = reply.send(result);
                }
                Work::Note { note, reply } => {
                    let _ = reply.send(runner.note(note).await);
                }
            }
            drop(permit);
            runner.branch
        })
    }
}
