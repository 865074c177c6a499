//! The scheduler: one task that owns the heartbeat file's last good schedule and the slot
//! ledger, sleeps until something is due, launches each run as its own task, and records how it
//! ended. `perch heartbeat run`, `resume` and `list` reach it through [`Heartbeats`].

use super::file::{FILE_NAME, Reloaded, look, read_text};
use super::ledger::Ledger;
use super::listing::{describe, listing};
use super::{Job, JobEnd, Mode};
use crate::agent::AgentDir;
use crate::channel::BoxFuture;
use crate::host::clock::Clock;
use crate::host::workspace::{FileStamp, workspace_file_stamp};
use crate::log::LogError;
use perch_core::Timestamp;
use perch_core::control::HeartbeatList;
use perch_core::heartbeat::{
    HeartbeatEnv, HeartbeatFile, HeartbeatTask, LedgerRecord, LedgerState, Plan, SlotOutcome, plan,
    reduce,
};
use perch_core::name::TaskName;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// After checking a changed file, the scheduler leaves it alone for this many times as long as
/// the check took.
const QUIET_AFTER_CHECK: u32 = 4;

/// How long, at shutdown, the scheduler waits for runs in progress to end (the service drains
/// for 30 s).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

/// Runs one job and says how it ended: a run through a [`super::Host`]
/// ([`SchedulerSetup::hosted`]), or a test's stand-in for one.
pub type RunJob = Arc<dyn Fn(Job) -> BoxFuture<'static, JobEnd> + Send + Sync>;

/// What the scheduler needs. A service builds it with [`SchedulerSetup::hosted`]; a test of the
/// schedule alone may fill in `run_job` itself.
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
        let dir = self.setup.dir.clone();
        let seen = self.seen_text.take();
        let looked = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let reloaded = look(&dir, &env, seen.as_deref());
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
            crate::host::narrate::tell(&perch_core::narration::Event::HeartbeatFiring {
                task: task.name.to_string(),
                slot,
            });
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

    async fn finish(&mut self, mut done: Done) -> Result<(), LogError> {
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
            let outcome = done.end.outcome.name();
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
            crate::host::narrate::tell(&perch_core::narration::Event::HeartbeatVerdict {
                task: done.task.to_string(),
                outcome: done.end.outcome.clone(),
            });
            self.record(LedgerRecord::SlotFinished {
                task: done.task.clone(),
                slot: done.slot,
                run: done.run.clone(),
                outcome: done.end.outcome.clone(),
                at: now,
            })
            .await?;
            if done.mode != Mode::Scheduled {
                // A run by hand leaves the schedule alone: only a scheduled run stops its task.
                done.end.stop = None;
            }
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
        self.ledger.record(&mut self.records, record).await
    }
}
