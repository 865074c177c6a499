//! Heartbeats in the shell: the slot ledger on disk, the scheduler task that owns it, and the
//! judged turn every heartbeat run takes.
//!
//! The rules (the file, the slots, the verdict, the plan) are the core's
//! ([`perch_core::heartbeat`]); this module reads the file, keeps the ledger, sleeps until the
//! next plan and runs what is due. One task owns the schedule and the ledger; each run is its own
//! task and reports back to it.

use crate::agent::{AgentDir, LoadedAgent};
use crate::channel::BoxFuture;
use crate::lane::{Input, Lane};
use crate::log::{Clock, Journal, JournalEntry, JournalWriter, Journaled, LogError, peek_journal};
use crate::sandbox::{Command, End, Machine};
use crate::workspace::{FileStamp, read_workspace_text, workspace_file_stamp};
use perch_core::Timestamp;
use perch_core::control::{HeartbeatList, LastRun, RunEnd, TaskRow};
use perch_core::heartbeat::{
    Finished, HeartbeatEnv, HeartbeatFile, HeartbeatTask, LedgerRecord, LedgerState, ModelFailure,
    Plan, SlotOutcome, TargetSpec, Verdict, correction, judge, next_slot, parse_heartbeat_file,
    plan, reduce, stops_task,
};
use perch_core::log::Outcome;
use perch_core::name::TaskName;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// How often the scheduler looks at `HEARTBEAT.yml` for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// After checking a changed file, the scheduler leaves it alone for this many times as long as
/// the check took.
const QUIET_AFTER_CHECK: u32 = 4;

/// How long, at shutdown, the scheduler waits for runs in progress to end (the service drains
/// for 30 s).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

/// How long a task's check may run before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a consumed ledger record stays on disk.
const LEDGER_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

const LEDGER_SEGMENT_BYTES: u64 = 1 << 20;

/// The ledger's directory under `.perch/`.
pub fn ledger_dir(dir: &AgentDir) -> PathBuf {
    dir.state_dir().join("heartbeats")
}

/// The heartbeat file's name in the workspace.
const FILE_NAME: &str = "HEARTBEAT.yml";

/// The heartbeat file of an agent.
pub fn file_path(dir: &AgentDir) -> PathBuf {
    dir.workspace().join(FILE_NAME)
}

/// What the rest of the agent says that the heartbeat file is checked against: the room aliases
/// its channels declare, the models it declares, and the host's time zone.
pub fn heartbeat_env(agent: &LoadedAgent, host_tz: chrono_tz::Tz) -> HeartbeatEnv {
    let targets = agent
        .channels
        .iter()
        .flat_map(|channel| {
            channel.config.rooms.keys().map(|room| TargetSpec {
                channel: channel.config.name.clone(),
                room: room.clone(),
            })
        })
        .collect();
    HeartbeatEnv {
        host_tz,
        targets,
        models: agent.definition.models.all_refs(),
    }
}

/// The host's time zone: `TZ`, then `/etc/timezone`, then where `/etc/localtime` points; UTC
/// when none names an IANA zone.
pub fn host_tz() -> chrono_tz::Tz {
    let named = std::env::var("TZ")
        .ok()
        .map(|tz| tz.trim_start_matches(':').to_owned())
        .or_else(|| {
            std::fs::read_to_string("/etc/timezone")
                .ok()
                .map(|text| text.trim().to_owned())
        })
        .or_else(|| {
            std::fs::read_link("/etc/localtime")
                .ok()
                .and_then(|target| {
                    let text = target.to_string_lossy().into_owned();
                    text.split_once("zoneinfo/")
                        .map(|(_, zone)| zone.to_owned())
                })
        });
    named
        .and_then(|name| name.parse().ok())
        .unwrap_or(chrono_tz::Tz::UTC)
}

/// The most bytes of `HEARTBEAT.yml` perch reads; a longer file is a problem.
pub const FILE_LIMIT: u64 = 256 * 1024;

/// The heartbeat file's text, read without following a symlink, only when it is a regular
/// file, and at most [`FILE_LIMIT`] bytes; a missing file reads as empty. Never blocks on a FIFO
/// or a device. The error is the file's problem.
fn read_text(workspace: &Path) -> Result<String, String> {
    match read_workspace_text(workspace, Path::new(FILE_NAME), FILE_LIMIT) {
        Ok(text) => Ok(text.unwrap_or_default()),
        Err(problem) => Err(problem.to_string()),
    }
}

/// Reads and checks the heartbeat file of the agent in `dir`; a missing file has no tasks. The
/// error is the file's problems, one per line.
pub fn read_file(dir: &AgentDir, env: &HeartbeatEnv) -> Result<HeartbeatFile, String> {
    check(&read_text(&dir.workspace())?, env)
}

fn check(text: &str, env: &HeartbeatEnv) -> Result<HeartbeatFile, String> {
    parse_heartbeat_file(text, env).map_err(|problems| {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// What one look at the heartbeat file found.
enum Reloaded {
    /// The same text as last time: nothing to check again.
    Unchanged,
    Unreadable(String),
    Read {
        text: String,
        checked: Result<HeartbeatFile, String>,
    },
}

/// Reads the file and, when its text differs from `seen`, checks it. Blocking: the scheduler
/// runs it off the async runtime.
fn look(workspace: &Path, env: &HeartbeatEnv, seen: Option<&str>) -> Reloaded {
    match read_text(workspace) {
        Err(error) => Reloaded::Unreadable(error),
        Ok(text) if seen == Some(text.as_str()) => Reloaded::Unchanged,
        Ok(text) => {
            let checked = check(&text, env);
            Reloaded::Read { text, checked }
        }
    }
}

/// The ledger's records still in force, oldest first, read without taking the ledger (for
/// `perch heartbeat list` and `perch status`).
pub fn peek_ledger(dir: &AgentDir) -> Result<LedgerState, String> {
    let contents = peek_journal(&ledger_dir(dir)).map_err(|error| error.to_string())?;
    Ok(reduce(contents.pending.iter().filter_map(|item| {
        serde_json::from_value(item.body.clone()).ok()
    })))
}

/// The slot ledger: a journal whose records still in force are its unconsumed items. Records a
/// later one makes irrelevant are consumed, so the ledger stays small however long the agent
/// runs.
#[derive(Debug, Clone)]
pub struct Ledger {
    writer: JournalWriter,
}

impl Ledger {
    /// Opens the ledger and returns its records in force with their sequence numbers. Blocking.
    pub fn open(
        dir: &AgentDir,
        clock: Clock,
    ) -> Result<(Ledger, Vec<(u64, LedgerRecord)>), LogError> {
        let path = ledger_dir(dir);
        let (journal, contents) =
            Journal::open_retaining(&path, LEDGER_SEGMENT_BYTES, LEDGER_RETAIN, clock)?;
        let records = contents
            .pending
            .iter()
            .filter_map(|item| {
                serde_json::from_value(item.body.clone())
                    .ok()
                    .map(|record| (item.seq, record))
            })
            .collect();
        let writer = JournalWriter::start(journal, HashSet::new(), &path, "heartbeats")?;
        Ok((Ledger { writer }, records))
    }

    async fn append(&self, record: &LedgerRecord) -> Result<u64, LogError> {
        let body = serde_json::to_value(record).map_err(|error| LogError::WriterStopped {
            reason: format!("a ledger record did not encode: {error}"),
        })?;
        match self
            .writer
            .append(vec![JournalEntry { body, key: None }])
            .await?
            .first()
        {
            Some(Journaled::New { seq }) => Ok(*seq),
            _ => Err(LogError::WriterStopped {
                reason: "a ledger record was not written".into(),
            }),
        }
    }
}

/// Resumes a stopped task without a running service; the caller holds the directory's lock.
pub async fn resume_here(dir: &AgentDir, task: &str) -> Result<(), String> {
    let name = TaskName::try_from(task).map_err(|error| format!("{task}: {error}"))?;
    let clock = crate::log::system_clock();
    let (ledger, records) = Ledger::open(dir, clock.clone()).map_err(|error| error.to_string())?;
    let state = reduce(records.into_iter().map(|(_, record)| record));
    if state
        .task(&name)
        .is_none_or(|state| state.stopped.is_none())
    {
        return Err(format!("{task} is not stopped"));
    }
    ledger
        .append(&LedgerRecord::TaskResumed {
            task: name,
            at: clock.now(),
        })
        .await
        .map(drop)
        .map_err(|error| error.to_string())
}

/// One heartbeat run to perform.
#[derive(Debug, Clone)]
pub struct Job {
    pub task: HeartbeatTask,
    /// The scheduled instant, or when a manual run was asked for.
    pub slot: Timestamp,
    pub run: String,
    /// Missed slots folded into this run.
    pub coalesced: u32,
    /// The task's last outcome, offered to a fresh run.
    pub last: Option<Finished>,
    pub mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Scheduled,
    /// `perch heartbeat run`: recorded, but no slot is consumed.
    Manual,
    /// `perch heartbeat run --dry-run`: its own lane, nothing delivered, nothing recorded.
    DryRun,
}

/// How a run ended, and whether the task must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnd {
    pub outcome: SlotOutcome,
    /// The model's last reply, as judged.
    pub reply: String,
    /// Set when the failure will not go away by itself (the key was refused, the quota is
    /// spent): the task stops until its entry changes or it is resumed.
    pub stop: Option<String>,
}

/// Runs one job: the service's turn (check, lane, judged reply, delivery), or a test's.
pub type RunJob = Arc<dyn Fn(Job) -> BoxFuture<'static, JobEnd> + Send + Sync>;

/// What the scheduler needs.
pub struct SchedulerSetup {
    pub dir: AgentDir,
    pub env: HeartbeatEnv,
    pub clock: Clock,
    pub reload_every: Duration,
    pub run_job: RunJob,
    /// Told when a task stops until it is resumed (its name and why), to alert the owner.
    pub on_stop: Option<OnStop>,
    /// Whether scheduled slots run; `false` for a process that only serves `perch heartbeat
    /// run` (no service was running), so no slot fires behind the operator's back.
    pub scheduled: bool,
}

/// Told when a heartbeat task stops: its name and the reason.
pub type OnStop = Arc<dyn Fn(&TaskName, &str) + Send + Sync>;

impl std::fmt::Debug for SchedulerSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerSetup")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

enum Request {
    RunNow {
        task: String,
        dry_run: bool,
        reply: oneshot::Sender<Result<JobEnd, String>>,
    },
    Resume {
        task: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    List {
        reply: oneshot::Sender<HeartbeatList>,
    },
}

/// A handle to the scheduler task.
#[derive(Debug, Clone)]
pub struct Heartbeats {
    requests: mpsc::UnboundedSender<Request>,
}

impl Heartbeats {
    /// Runs `task` now, outside its schedule, and waits for its end.
    pub async fn run_now(&self, task: &str, dry_run: bool) -> Result<JobEnd, String> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::RunNow {
            task: task.to_owned(),
            dry_run,
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Resumes a stopped task.
    pub async fn resume(&self, task: &str) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Resume {
            task: task.to_owned(),
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Every task with its next firing, last outcome and state, and the reload error if the
    /// file's last edit did not check.
    pub async fn list(&self) -> Result<HeartbeatList, String> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::List { reply })?;
        answer.await.map_err(|_| stopped())
    }

    fn send(&self, request: Request) -> Result<(), String> {
        self.requests.send(request).map_err(|_| stopped())
    }
}

fn stopped() -> String {
    "the heartbeat scheduler has stopped".into()
}

/// Starts the scheduler over an open ledger; it runs until `shutdown`.
pub fn start(
    setup: SchedulerSetup,
    ledger: Ledger,
    records: Vec<(u64, LedgerRecord)>,
    shutdown: CancellationToken,
) -> Heartbeats {
    let (requests, inbox) = mpsc::unbounded_channel();
    let scheduler = Scheduler {
        setup,
        ledger,
        records,
        loaded: None,
        seen_text: None,
        reload_error: None,
        quiet_until: None,
        seen_stamp: None,
        first_seen: HashMap::new(),
        running: HashMap::new(),
        in_flight: HashSet::new(),
    };
    tokio::spawn(scheduler.serve(inbox, shutdown));
    Heartbeats { requests }
}

struct Done {
    task: TaskName,
    slot: Timestamp,
    run: String,
    mode: Mode,
    end: JobEnd,
    reply: Option<oneshot::Sender<Result<JobEnd, String>>>,
}

struct Scheduler {
    setup: SchedulerSetup,
    ledger: Ledger,
    /// The ledger's records in force, with their sequence numbers, in order.
    records: Vec<(u64, LedgerRecord)>,
    /// The last file that checked.
    loaded: Option<HeartbeatFile>,
    /// The text last read, to notice changes.
    seen_text: Option<String>,
    reload_error: Option<String>,
    /// Until when the file is not looked at again: after a check, for a few times as long as
    /// the check took, so that a guest rewriting the file in a loop gets only a bounded share
    /// of a core.
    quiet_until: Option<tokio::time::Instant>,
    /// The file's stamp when its text was last read: while it stays the same, the file is not
    /// read again.
    seen_stamp: Option<Option<FileStamp>>,
    /// When this process first saw each task: a task without history never fires for slots
    /// before it.
    first_seen: HashMap<TaskName, Timestamp>,
    /// Scheduled runs in progress, by task.
    running: HashMap<TaskName, String>,
    /// Every run in progress in this process (scheduled and manual), by run id.
    in_flight: HashSet<String>,
}

impl Scheduler {
    async fn serve(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request>,
        shutdown: CancellationToken,
    ) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        loop {
            self.reload().await;
            let wake = match self.step_if_scheduled(&done_tx).await {
                Ok(wake) => wake,
                Err(error) => {
                    tracing::error!("heartbeats: the ledger failed, stopping: {error}");
                    return;
                }
            };
            let now = self.setup.clock.now();
            let until_wake = wake
                .and_then(|at| (at - now).to_std().ok())
                .unwrap_or(Duration::ZERO);
            let nap = if wake.is_some() {
                until_wake.min(self.setup.reload_every)
            } else {
                self.setup.reload_every
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(nap) => {}
                request = requests.recv() => match request {
                    Some(request) => self.answer(request, &done_tx).await,
                    None => return,
                },
                Some(done) = done_rx.recv() => if let Err(error) = self.finish(done).await {
                    tracing::error!("heartbeats: the ledger failed, stopping: {error}");
                    return;
                },
            }
        }
        // Shutting down: nothing new starts; the runs in progress may finish, for as long as the
        // service drains, and their ends are recorded. A run still going after that is recorded
        // as interrupted at the next start.
        let finishing = async {
            while !self.in_flight.is_empty() {
                let Some(done) = done_rx.recv().await else {
                    return;
                };
                if let Err(error) = self.finish(done).await {
                    tracing::error!("heartbeats: the ledger failed, stopping: {error}");
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, finishing).await;
    }

    /// Reads the file if it changed; an edit that does not check keeps the last good schedule.
    /// A read that fails is tried again on the next look, and its error goes once one succeeds.
    async fn reload(&mut self) {
        if self
            .quiet_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
        {
            return;
        }
        let workspace = self.setup.dir.workspace();
        let stamp = workspace_file_stamp(&workspace, Path::new(FILE_NAME)).ok();
        if stamp.is_some() && stamp == self.seen_stamp && self.seen_text.is_some() {
            let settled = stamp
                .flatten()
                .is_none_or(|stamp| stamp.is_settled(std::time::SystemTime::now()));
            // A file changed only just now may change again without a new stamp, so its text
            // is compared: a regular file of at most FILE_LIMIT bytes, read without blocking.
            if settled || read_text(&workspace).ok() == self.seen_text {
                return;
            }
        }
        self.seen_stamp = None;
        let env = self.setup.env.clone();
        let seen = self.seen_text.take();
        let looked = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let reloaded = look(&workspace, &env, seen.as_deref());
            (seen, reloaded, started.elapsed())
        })
        .await;
        let (seen_before, text, checked) = match looked {
            Err(error) => {
                self.reload_error = Some(format!(
                    "{}: the check stopped: {error}",
                    perch_core::heartbeat::FILE
                ));
                return;
            }
            Ok((seen, Reloaded::Unchanged, _)) => {
                self.seen_text = seen;
                self.seen_stamp = stamp;
                return;
            }
            Ok((_, Reloaded::Unreadable(error), _)) => {
                self.reload_error = Some(error);
                return;
            }
            Ok((seen, Reloaded::Read { text, checked }, took)) => {
                self.quiet_until =
                    Some(tokio::time::Instant::now() + took.saturating_mul(QUIET_AFTER_CHECK));
                (seen.is_some(), text, checked)
            }
        };
        match checked {
            Ok(file) => {
                let now = self.setup.clock.now();
                for task in &file.tasks {
                    self.first_seen.entry(task.name.clone()).or_insert(now);
                }
                if seen_before {
                    tracing::info!(
                        tasks = file.tasks.len(),
                        "heartbeats: reloaded {} ({} tasks)",
                        perch_core::heartbeat::FILE,
                        file.tasks.len()
                    );
                }
                self.loaded = Some(file);
                self.reload_error = None;
            }
            Err(error) => {
                tracing::warn!(
                    "heartbeats: the edit does not check; the last good schedule keeps running:\n{error}"
                );
                self.reload_error = Some(error);
            }
        }
        self.seen_text = Some(text);
        self.seen_stamp = stamp;
    }

    fn state(&self) -> LedgerState {
        reduce(self.records.iter().map(|(_, record)| record.clone()))
    }

    fn tasks(&self) -> Vec<HeartbeatTask> {
        self.loaded
            .as_ref()
            .map(|file| file.tasks.clone())
            .unwrap_or_default()
    }

    /// Does what is due for every task; returns the earliest instant something is due next.
    async fn step_if_scheduled(
        &mut self,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<Option<Timestamp>, LogError> {
        if self.setup.scheduled {
            self.step(done).await
        } else {
            Ok(None)
        }
    }

    async fn step(
        &mut self,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<Option<Timestamp>, LogError> {
        let mut wake: Option<Timestamp> = None;
        for task in self.tasks() {
            if self.running.contains_key(&task.name) {
                continue;
            }
            // Skips and interruptions are recorded, then the task is planned again.
            for _ in 0..8 {
                let now = self.setup.clock.now();
                let state = self.state();
                let first_seen = self.first_seen.get(&task.name).copied().unwrap_or(now);
                match plan(&task, state.task(&task.name), first_seen, now) {
                    Plan::Wait { until } => {
                        wake = Some(wake.map_or(until, |wake| wake.min(until)));
                        break;
                    }
                    Plan::Run { slot, coalesced } => {
                        self.launch(&task, slot, coalesced, Mode::Scheduled, None, done)
                            .await?;
                        break;
                    }
                    Plan::Skip {
                        from,
                        to,
                        count,
                        reason,
                    } => {
                        self.record(LedgerRecord::SlotsSkipped {
                            task: task.name.clone(),
                            from,
                            to,
                            count,
                            reason,
                            at: now,
                        })
                        .await?;
                    }
                    Plan::Running { run, .. } if self.in_flight.contains(&run) => break,
                    Plan::Running { run, slot } => {
                        self.record(LedgerRecord::SlotFinished {
                            task: task.name.clone(),
                            slot,
                            run,
                            outcome: SlotOutcome::Interrupted {
                                reason: "perch stopped during this run; it is not repeated, \
                                         since it may already have delivered"
                                    .into(),
                            },
                            at: now,
                        })
                        .await?;
                    }
                    Plan::Stopped {
                        entry_changed: true,
                        ..
                    } => {
                        tracing::info!(
                            task = %task.name,
                            "heartbeats: {} changed since it stopped; resuming it",
                            task.name
                        );
                        self.record(LedgerRecord::TaskResumed {
                            task: task.name.clone(),
                            at: now,
                        })
                        .await?;
                    }
                    Plan::Stopped { .. } | Plan::Disabled | Plan::Exhausted => break,
                }
            }
        }
        Ok(wake)
    }

    async fn launch(
        &mut self,
        task: &HeartbeatTask,
        slot: Timestamp,
        coalesced: u32,
        mode: Mode,
        reply: Option<oneshot::Sender<Result<JobEnd, String>>>,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<(), LogError> {
        let run = uuid::Uuid::now_v7().to_string();
        let state = self.state();
        let last = state
            .task(&task.name)
            .and_then(|state| state.last_outcome.clone());
        if mode != Mode::DryRun {
            self.record(LedgerRecord::SlotStarted {
                task: task.name.clone(),
                slot,
                run: run.clone(),
                manual: mode == Mode::Manual,
                coalesced,
                at: self.setup.clock.now(),
            })
            .await?;
        }
        if mode == Mode::Scheduled {
            self.running.insert(task.name.clone(), run.clone());
        }
        self.in_flight.insert(run.clone());
        let job = Job {
            task: task.clone(),
            slot,
            run: run.clone(),
            coalesced,
            last,
            mode,
        };
        let run_job = Arc::clone(&self.setup.run_job);
        let done = done.clone();
        let name = task.name.clone();
        tokio::spawn(async move {
            let end = run_job(job).await;
            let _ = done.send(Done {
                task: name,
                slot,
                run,
                mode,
                end,
                reply,
            });
        });
        Ok(())
    }

    async fn finish(&mut self, done: Done) -> Result<(), LogError> {
        if done.mode == Mode::Scheduled {
            self.running.remove(&done.task);
        }
        self.in_flight.remove(&done.run);
        let now = self.setup.clock.now();
        if done.mode != Mode::DryRun {
            let line = format!(
                "heartbeats: {} ({}): {}",
                done.task,
                done.slot.to_rfc3339(),
                describe(&done.end.outcome)
            );
            let (task, slot) = (done.task.as_str(), done.slot.to_rfc3339());
            let outcome = crate::metrics::outcome_label(&done.end.outcome);
            match &done.end.outcome {
                SlotOutcome::Invalid { .. }
                | SlotOutcome::Failed { .. }
                | SlotOutcome::Interrupted { .. } => {
                    tracing::warn!(task, slot, outcome, "{line}");
                }
                SlotOutcome::Silent
                | SlotOutcome::Message { .. }
                | SlotOutcome::Steer { .. }
                | SlotOutcome::Skipped { .. } => tracing::info!(task, slot, outcome, "{line}"),
            }
            self.record(LedgerRecord::SlotFinished {
                task: done.task.clone(),
                slot: done.slot,
                run: done.run.clone(),
                outcome: done.end.outcome.clone(),
                at: now,
            })
            .await?;
            if let Some(reason) = &done.end.stop {
                let fingerprint = self
                    .tasks()
                    .iter()
                    .find(|task| task.name == done.task)
                    .map(HeartbeatTask::fingerprint)
                    .unwrap_or_default();
                tracing::warn!(
                    task = %done.task,
                    "heartbeats: {} stopped: {reason}",
                    done.task
                );
                self.record(LedgerRecord::TaskStopped {
                    task: done.task.clone(),
                    reason: reason.clone(),
                    fingerprint,
                    at: now,
                })
                .await?;
                if let Some(on_stop) = &self.setup.on_stop {
                    on_stop(&done.task, reason);
                }
            }
        }
        if let Some(reply) = done.reply {
            let _ = reply.send(Ok(done.end));
        }
        Ok(())
    }

    async fn answer(&mut self, request: Request, done: &mpsc::UnboundedSender<Done>) {
        match request {
            Request::RunNow {
                task,
                dry_run,
                reply,
            } => {
                let Some(found) = self.tasks().into_iter().find(|t| t.name.as_str() == task) else {
                    let _ = reply.send(Err(self.unknown_task(&task)));
                    return;
                };
                let mode = if dry_run { Mode::DryRun } else { Mode::Manual };
                let now = self.setup.clock.now();
                if let Err(error) = self.launch(&found, now, 0, mode, Some(reply), done).await {
                    tracing::error!(task, "heartbeats: cannot record a manual run: {error}");
                }
            }
            Request::Resume { task, reply } => {
                let Ok(name) = TaskName::try_from(task.as_str()) else {
                    let _ = reply.send(Err(self.unknown_task(&task)));
                    return;
                };
                let state = self.state();
                let stopped = state
                    .task(&name)
                    .is_some_and(|state| state.stopped.is_some());
                let answer = if stopped {
                    self.record(LedgerRecord::TaskResumed {
                        task: name,
                        at: self.setup.clock.now(),
                    })
                    .await
                    .map_err(|error| error.to_string())
                } else {
                    Err(format!("{task} is not stopped"))
                };
                let _ = reply.send(answer);
            }
            Request::List { reply } => {
                let _ = reply.send(self.list());
            }
        }
    }

    fn unknown_task(&self, task: &str) -> String {
        let names: Vec<String> = self.tasks().iter().map(|t| t.name.to_string()).collect();
        if names.is_empty() {
            format!(
                "no task {task}: {} has no tasks",
                perch_core::heartbeat::FILE
            )
        } else {
            format!("no task {task}; the tasks are {}", names.join(", "))
        }
    }

    fn list(&self) -> HeartbeatList {
        let now = self.setup.clock.now();
        let state = self.state();
        let tasks = self.tasks();
        listing(
            &tasks,
            &state,
            &self.first_seen,
            now,
            self.reload_error.as_deref(),
        )
    }

    /// Appends a record and consumes what it makes irrelevant.
    async fn record(&mut self, record: LedgerRecord) -> Result<(), LogError> {
        let seq = self.ledger.append(&record).await?;
        self.records.push((seq, record));
        let superseded = superseded(&self.records);
        if !superseded.is_empty() {
            self.ledger.writer.consume(superseded.clone()).await?;
            self.records.retain(|(seq, _)| !superseded.contains(seq));
        }
        Ok(())
    }
}

/// The records the last one makes irrelevant, so the ledger stays small however long the agent
/// runs: after a scheduled run that ended well, or skipped slots, the task's earlier slot records
/// (its failures in a row no longer count; its latest finished run stays, for its outcome);
/// after a resume, the stop and the resume; after a stop, an earlier stop. A run's start is
/// consumed only with its end, so an open run and a manual run are never mistaken.
fn superseded(records: &[(u64, LedgerRecord)]) -> Vec<u64> {
    let Some(((last_seq, last), earlier)) = records.split_last() else {
        return Vec::new();
    };
    let task = last.task();
    let earlier: Vec<&(u64, LedgerRecord)> = earlier
        .iter()
        .filter(|(_, record)| record.task() == task)
        .collect();
    let is_slot = |record: &LedgerRecord| {
        matches!(
            record,
            LedgerRecord::SlotStarted { .. }
                | LedgerRecord::SlotFinished { .. }
                | LedgerRecord::SlotsSkipped { .. }
        )
    };
    let candidates: Vec<u64> = match last {
        LedgerRecord::SlotFinished { run, outcome, .. } => {
            let scheduled_start = earlier.iter().find_map(|(seq, record)| match record {
                LedgerRecord::SlotStarted {
                    run: started,
                    manual: false,
                    ..
                } if started == run => Some(*seq),
                _ => None,
            });
            let ended_well = !matches!(
                outcome,
                SlotOutcome::Failed { .. } | SlotOutcome::Invalid { .. }
            );
            match scheduled_start {
                Some(start) if ended_well => earlier
                    .iter()
                    .filter(|(seq, record)| *seq < start && is_slot(record))
                    .map(|(seq, _)| *seq)
                    .collect(),
                _ => Vec::new(),
            }
        }
        LedgerRecord::SlotsSkipped { .. } => {
            let latest_finished = earlier
                .iter()
                .rev()
                .find(|(_, record)| matches!(record, LedgerRecord::SlotFinished { .. }))
                .map(|(seq, _)| *seq);
            earlier
                .iter()
                .filter(|(seq, record)| is_slot(record) && Some(*seq) != latest_finished)
                .map(|(seq, _)| *seq)
                .collect()
        }
        LedgerRecord::TaskResumed { .. } => earlier
            .iter()
            .filter(|(_, record)| matches!(record, LedgerRecord::TaskStopped { .. }))
            .map(|(seq, _)| *seq)
            .chain([*last_seq])
            .collect(),
        LedgerRecord::TaskStopped { .. } => earlier
            .iter()
            .filter(|(_, record)| matches!(record, LedgerRecord::TaskStopped { .. }))
            .map(|(seq, _)| *seq)
            .collect(),
        LedgerRecord::SlotStarted { .. } => Vec::new(),
    };
    let finish_of = |run: &str| {
        records.iter().find_map(|(seq, record)| match record {
            LedgerRecord::SlotFinished { run: finished, .. } if finished == run => Some(*seq),
            _ => None,
        })
    };
    candidates
        .iter()
        .copied()
        .filter(|seq| {
            records.iter().all(|(at, record)| match record {
                LedgerRecord::SlotStarted { run, .. } if at == seq => {
                    finish_of(run).is_some_and(|finish| candidates.contains(&finish))
                }
                _ => true,
            })
        })
        .collect()
}

/// The tasks as `perch heartbeat list` shows them.
pub fn listing(
    tasks: &[HeartbeatTask],
    state: &LedgerState,
    first_seen: &HashMap<TaskName, Timestamp>,
    now: Timestamp,
    reload_error: Option<&str>,
) -> HeartbeatList {
    let rows = tasks
        .iter()
        .map(|task| {
            let task_state = state.task(&task.name);
            let first_seen = first_seen.get(&task.name).copied().unwrap_or(now);
            let (status, next) = match plan(task, task_state, first_seen, now) {
                Plan::Wait { until } => ("scheduled".to_owned(), Some(until)),
                Plan::Run { slot, .. } => ("due".to_owned(), Some(slot)),
                Plan::Skip { .. } => ("due".to_owned(), next_slot(&task.schedule, now)),
                Plan::Running { .. } => ("running".to_owned(), None),
                Plan::Stopped { reason, .. } => (format!("stopped: {reason}"), None),
                Plan::Disabled => ("disabled".to_owned(), None),
                Plan::Exhausted => ("never fires again".to_owned(), None),
            };
            let last = task_state.and_then(|state| state.last_outcome.as_ref());
            TaskRow {
                name: task.name.to_string(),
                schedule: schedule_text(task),
                status,
                next: next.map(|at| at.to_rfc3339()),
                last: last.map(|finished| LastRun {
                    slot: finished.slot.to_rfc3339(),
                    at: finished.at.to_rfc3339(),
                    manual: finished.manual,
                    outcome: describe(&finished.outcome),
                }),
                delivery: task.delivery.as_ref().map(ToString::to_string),
            }
        })
        .collect();
    HeartbeatList {
        tasks: rows,
        reload_error: reload_error.map(str::to_owned),
    }
}

fn schedule_text(task: &HeartbeatTask) -> String {
    match &task.schedule {
        perch_core::heartbeat::Schedule::Every(every) => format!("every {} s", every.as_secs()),
        perch_core::heartbeat::Schedule::Cron { expr, .. } => {
            format!("cron {expr} ({})", task.tz.name())
        }
    }
}

/// One line for an outcome.
pub fn describe(outcome: &SlotOutcome) -> String {
    match outcome {
        SlotOutcome::Silent => "silent".into(),
        SlotOutcome::Message { target, .. } if target.is_empty() => {
            "message (no delivery target)".into()
        }
        SlotOutcome::Message { target, .. } => format!("message to {target}"),
        SlotOutcome::Steer { lane, .. } => format!("steer into {lane}"),
        SlotOutcome::Invalid { reason } => format!("invalid verdict: {reason}"),
        SlotOutcome::Failed { reason } => format!("failed: {reason}"),
        SlotOutcome::Skipped { reason } => format!("skipped: {reason}"),
        SlotOutcome::Interrupted { reason } => format!("interrupted: {reason}"),
    }
}

/// What the model is told for one run: the task, when, the task's last outcome (a fresh run
/// has no other memory of it), and the verdict rule.
pub fn turn_prompt(job: &Job) -> String {
    let mut text = format!(
        "[heartbeat {} for {}{}]\n\n{}\n\n",
        job.task.name,
        job.slot.to_rfc3339(),
        if job.coalesced > 0 {
            format!(", standing in for {} missed runs", job.coalesced)
        } else {
            String::new()
        },
        job.task.prompt.trim()
    );
    if let Some(last) = &job.last {
        text.push_str(&format!(
            "Your last run of this task ({}) ended: {}.\n\n",
            last.at.to_rfc3339(),
            describe_for_model(&last.outcome)
        ));
    }
    text.push_str(perch_core::heartbeat::VERDICT_RULE);
    text
}

fn describe_for_model(outcome: &SlotOutcome) -> String {
    match outcome {
        SlotOutcome::Message { text, .. } => format!("you sent \"Message: {text}\""),
        SlotOutcome::Steer { text, .. } => format!("you steered: \"{text}\""),
        other => describe(other),
    }
}

/// The verdict of a turn, judged, with one corrective retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    Valid {
        verdict: Verdict,
        reply: String,
    },
    Invalid {
        reason: String,
        reply: String,
    },
    /// The run failed; `model_failure` is the kind of the model's error when one failed it.
    Failed {
        reason: String,
        model_failure: Option<ModelFailure>,
    },
}

/// Sends the job's prompt to `lane` and judges the final reply; an invalid one gets one
/// corrective message naming the rule, and is judged again.
pub async fn judged_turn(lane: &Lane, job: &Job) -> Judged {
    let fresh = !job.task.continue_history;
    let mut input = Input {
        text: turn_prompt(job),
        consumes: Vec::new(),
        fresh,
    };
    let mut corrected = false;
    loop {
        let finished = match lane.send(input, None).await {
            Ok(finished) => finished,
            Err(error) => {
                return Judged::Failed {
                    reason: error.to_string(),
                    model_failure: None,
                };
            }
        };
        match finished.outcome {
            Outcome::Completed => {}
            Outcome::Cancelled => {
                return Judged::Failed {
                    reason: "the run was cancelled".into(),
                    model_failure: None,
                };
            }
            Outcome::Failed { reason } | Outcome::Interrupted { reason } => {
                return Judged::Failed {
                    reason,
                    model_failure: finished.model_failure,
                };
            }
        }
        match judge(&finished.text) {
            Ok(verdict) => {
                return Judged::Valid {
                    verdict,
                    reply: finished.text,
                };
            }
            Err(invalid) if corrected => {
                return Judged::Invalid {
                    reason: invalid.reason,
                    reply: finished.text,
                };
            }
            Err(invalid) => {
                corrected = true;
                input = Input {
                    text: correction(&invalid),
                    consumes: Vec::new(),
                    fresh: false,
                };
            }
        }
    }
}

/// What a turn came to before its verdict takes effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turned {
    /// Nothing to deliver or steer: skipped by its check, failed, or invalid.
    Ended(JobEnd),
    /// A valid verdict, for the caller to carry out.
    Verdict { verdict: Verdict, reply: String },
}

/// The task's check, then the judged turn in `lane`.
pub async fn take_turn(lane: &Lane, machine: &Machine, job: &Job) -> Turned {
    let ended = |outcome: SlotOutcome, reply: String, stop: Option<String>| {
        Turned::Ended(JobEnd {
            outcome,
            reply,
            stop,
        })
    };
    if let Some(check) = &job.task.check {
        match run_check(machine, check).await {
            Ok(None) => {}
            Ok(Some(reason)) => return ended(SlotOutcome::Skipped { reason }, String::new(), None),
            Err(reason) => return ended(SlotOutcome::Failed { reason }, String::new(), None),
        }
    }
    match judged_turn(lane, job).await {
        Judged::Failed {
            reason,
            model_failure,
        } => {
            let stop = stops_task(model_failure).then(|| reason.clone());
            ended(SlotOutcome::Failed { reason }, String::new(), stop)
        }
        Judged::Invalid { reason, reply } => ended(SlotOutcome::Invalid { reason }, reply, None),
        Judged::Valid { verdict, reply } => Turned::Verdict { verdict, reply },
    }
}

/// The outcome a verdict would have, carried out nowhere: a dry run's.
pub fn dry_outcome(job: &Job, verdict: Verdict) -> SlotOutcome {
    match verdict {
        Verdict::Silence => SlotOutcome::Silent,
        Verdict::Message(text) => SlotOutcome::Message {
            text,
            target: job
                .task
                .delivery
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            delivery: String::new(),
        },
        Verdict::Steer(text) => SlotOutcome::Steer {
            text,
            lane: job.task.steer_lane(),
        },
    }
}

/// A run's end as `perch heartbeat run` prints it.
pub fn run_end(end: &JobEnd) -> RunEnd {
    RunEnd {
        outcome: describe(&end.outcome),
        valid: !matches!(end.outcome, SlotOutcome::Invalid { .. }),
        detail: end.outcome.clone(),
        reply: end.reply.clone(),
        stopped: end.stop.clone(),
    }
}

/// Runs a task's check in the machine: `Ok(None)` when it passed (exit 0), `Ok(Some(why))` when
/// the slot is to be skipped.
pub async fn run_check(machine: &Machine, check: &str) -> Result<Option<String>, String> {
    let mut command = Command::shell(check);
    command.timeout = CHECK_TIMEOUT;
    let output = machine
        .run(command, CancellationToken::new())
        .await
        .map_err(|error| format!("the check could not run: {error}"))?;
    match output.end {
        End::Exited(0) => Ok(None),
        End::Exited(code) => Ok(Some(format!("the check exited {code}"))),
        End::TimedOut(after) => Err(format!(
            "the check did not finish within {} s",
            after.as_secs()
        )),
        end => Err(format!("the check ended: {end:?}")),
    }
}

/// The data entry a run's outcome leaves in the task's lane.
pub fn outcome_note(job: &Job, end: &JobEnd) -> serde_json::Value {
    serde_json::json!({
        "task": job.task.name.to_string(),
        "slot": job.slot.to_rfc3339(),
        "run": job.run,
        "mode": match job.mode {
            Mode::Scheduled => "scheduled",
            Mode::Manual => "manual",
            Mode::DryRun => "dry_run",
        },
        "outcome": serde_json::to_value(&end.outcome).unwrap_or(serde_json::Value::Null),
    })
}

/// First-seen instants for a list made outside the service: now, for every task.
pub fn first_seen_now(tasks: &[HeartbeatTask], now: Timestamp) -> HashMap<TaskName, Timestamp> {
    tasks.iter().map(|task| (task.name.clone(), now)).collect()
}
