//! `perch heartbeat`: the scheduled tasks of workspace/HEARTBEAT.yml listed, run now, resumed;
//! through the running service when there is one.

use super::{STATUS_TIMEOUT, dir_or_current, emit, emit_escaped, load_agent, printed, runtime};
use crate::agent::{self, AgentDir};
use crate::heartbeat;
use crate::host::notify::Notifier;
use crate::model;
use crate::store::control::{self, ControlRequest};
use clap::Subcommand;
use perch_core::control::{HeartbeatList, HeartbeatListed, HeartbeatRan, Resumed, RunEnd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// The scheduled tasks in workspace/HEARTBEAT.yml
#[derive(Debug, clap::Args)]
pub struct HeartbeatArgs {
    #[command(subcommand)]
    pub command: HeartbeatCommand,
}

#[derive(Debug, Subcommand)]
pub enum HeartbeatCommand {
    /// List each task with its schedule, its next firing and its last outcome
    ///
    /// Also the error of an edit that did not check (the last good schedule keeps running).
    /// Read-only.
    List {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Run a task now, and print the reply and its judgement
    ///
    /// Does not consume a slot. Goes through the running `perch run` when there is one; otherwise this process takes the
    /// directory, connects the channels to deliver (never to receive) and stops after the run.
    /// With --dry-run, the whole turn runs, tools included, in the task's dry-run lane, and
    /// nothing is delivered.
    Run {
        /// The task's name
        name: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Resume a task that stopped on an authentication or quota error
    ///
    /// Editing the task's entry in HEARTBEAT.yml resumes it too.
    Resume {
        /// The task's name
        name: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
}

impl HeartbeatCommand {
    /// The agent directory this command's DIR argument names.
    pub fn dir_mut(&mut self) -> &mut Option<PathBuf> {
        match self {
            HeartbeatCommand::List { dir, .. }
            | HeartbeatCommand::Run { dir, .. }
            | HeartbeatCommand::Resume { dir, .. } => dir,
        }
    }
}

pub fn run(args: HeartbeatArgs) -> Result<ExitCode, String> {
    match args.command {
        HeartbeatCommand::List { dir, json } => list(dir_or_current(dir), json),
        HeartbeatCommand::Run {
            name,
            dir,
            dry_run,
            json,
        } => run_now(dir_or_current(dir), &name, dry_run, json),
        HeartbeatCommand::Resume { name, dir } => resume(dir_or_current(dir), &name),
    }
}

/// The heartbeat tasks as the running service sees them, or, when none runs, as the file and
/// the ledger say.
pub(super) fn heartbeat_listing(agent_dir: &AgentDir) -> Result<HeartbeatList, String> {
    let live = runtime()?.block_on(control::ask_within::<HeartbeatListed>(
        agent_dir,
        &ControlRequest::HeartbeatList,
        STATUS_TIMEOUT,
    ));
    if let Some(Ok(answer)) = live {
        return Ok(answer.list);
    }
    let loaded = agent::load(agent_dir).map_err(|problems| {
        format!(
            "{} problem(s) in the agent's files: run `perch info`",
            problems.len()
        )
    })?;
    let env = heartbeat::heartbeat_env(&loaded, heartbeat::host_tz());
    let (tasks, error) = match heartbeat::read_file(agent_dir, &env) {
        Ok(file) => (file.tasks, None),
        Err(error) => (Vec::new(), Some(error)),
    };
    let state = heartbeat::peek_ledger(agent_dir)?;
    let now = chrono::Utc::now();
    Ok(heartbeat::listing(
        &tasks,
        &state,
        &heartbeat::first_seen_now(&tasks, now),
        now,
        error.as_deref(),
    ))
}

fn list(dir: PathBuf, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let list = heartbeat_listing(&agent_dir)?;
    if json {
        emit(&format!("{}\n", printed(&list)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = String::new();
    if list.tasks.is_empty() {
        text.push_str("no heartbeat tasks\n");
    }
    for task in &list.tasks {
        text.push_str(&format!(
            "{}  {}  {}{}\n",
            task.name,
            task.schedule,
            task.status,
            task.next
                .as_deref()
                .map(|next| format!(", next {next}"))
                .unwrap_or_default(),
        ));
        if let Some(last) = &task.last {
            text.push_str(&format!("    last: {} ({})\n", last.outcome, last.at));
        }
    }
    if let Some(error) = &list.reload_error {
        text.push_str(&format!(
            "the last edit of workspace/HEARTBEAT.yml does not check; the last good schedule keeps running:\n{error}\n"
        ));
    }
    emit_escaped(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn run_now(dir: PathBuf, name: &str, dry_run: bool, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::HeartbeatRun {
        task: name.to_owned(),
        dry_run,
    };
    let end = match runtime()?.block_on(control::ask::<HeartbeatRan>(&agent_dir, &request)) {
        Some(answer) => answer?.end,
        None => heartbeat_run_here(&dir, name, dry_run)?,
    };
    if json {
        emit(&format!("{}\n", printed(&end)?))?;
    } else {
        emit(&format!("{}\n", heartbeat::run_line(name, &end, dry_run)))?;
    }
    Ok(if end.detail.went_wrong() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A heartbeat run with no service running: this process takes the directory, connects the
/// channels (to deliver, never to receive), runs the task once through the same scheduler and
/// outbox `perch run` uses, and stops. No scheduled slot fires meanwhile.
fn heartbeat_run_here(dir: &Path, name: &str, dry_run: bool) -> Result<RunEnd, String> {
    let agent = match load_agent(dir)? {
        Ok(agent) => agent,
        Err(_) => return Err("the agent's files do not check: run `perch info`".into()),
    };
    runtime()?.block_on(async {
        let lookup = |name: &str| std::env::var(name).ok();
        let endpoint = model::endpoint_for(&agent, lookup)?;
        let (end, ended) = tokio::sync::oneshot::channel();
        let once = crate::service::HeartbeatOnce {
            task: name.to_owned(),
            dry_run,
            end,
        };
        let setup =
            super::run::service_setup(&agent, endpoint, Notifier::disabled(), None, Some(once));
        crate::service::run(agent, setup, CancellationToken::new()).await?;
        let end = ended
            .await
            .map_err(|_| "the heartbeat run ended without a result".to_owned())??;
        Ok(heartbeat::run_end(&end))
    })
}

fn resume(dir: PathBuf, name: &str) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::HeartbeatResume {
        task: name.to_owned(),
    };
    match runtime()?.block_on(control::ask::<Resumed>(&agent_dir, &request)) {
        Some(answer) => {
            answer?;
        }
        None => {
            let _lock =
                crate::agent::OwnerLock::acquire(&agent_dir).map_err(|error| error.to_string())?;
            runtime()?.block_on(heartbeat::resume_here(&agent_dir, name))?;
        }
    }
    emit(&format!("resumed {name}\n"))?;
    Ok(ExitCode::SUCCESS)
}
