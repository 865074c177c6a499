//! The `perch` command line: one module per command group, each with its clap definition (whose
//! doc comments are the `--help` text) and what the command does. `main.rs` parses and
//! dispatches to them.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod agent_checks;
pub mod channel;
pub mod chat;
pub mod chown;
pub mod doctor;
pub mod heartbeat;
pub mod human;
pub mod image;
pub mod info;
pub mod init;
pub mod log;
pub mod pair;
pub mod run;
pub mod status;
pub mod tool;

use crate::agent::{self, AgentDir, LoadedAgent};
use crate::sandbox::{self, Machine, MachineSetup};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// The agent directory given as `-C DIR` (`flag`) or as the command's own DIR argument
/// (`positional`); both are taken when they name the same directory.
pub fn given_dir(
    flag: Option<PathBuf>,
    positional: Option<PathBuf>,
) -> Result<Option<PathBuf>, String> {
    match (flag, positional) {
        (Some(flag), Some(positional)) if !same_dir(&flag, &positional) => Err(format!(
            "two agent directories: -C {} and {}; give one",
            flag.display(),
            positional.display()
        )),
        (flag, positional) => Ok(flag.or(positional)),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// The agent directory a command names, or the current directory.
fn dir_or_current(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| PathBuf::from("."))
}

/// The line a command that sets an agent up ends with: the commands to type next, from the
/// directory the command was given (a `cd` first when that is not the current one), with an
/// `export` for each variable still to set.
fn next_line(dir: &Path, variables: &[String], commands: &[&str]) -> String {
    let mut steps = Vec::new();
    if dir != Path::new(".") {
        steps.push(format!("cd {}", dir.display()));
    }
    steps.extend(
        variables
            .iter()
            .map(|variable| format!("export {variable}=…")),
    );
    steps.extend(commands.iter().map(|command| (*command).to_owned()));
    format!("next: {}\n", steps.join("; "))
}

/// Writes to stdout; a closed pipe (`perch info | head`) is not an error.
fn emit(text: &str) -> Result<(), String> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write output: {error}"))
        }
        _ => Ok(()),
    }
}

fn load_agent(dir: &Path) -> Result<Result<LoadedAgent, ExitCode>, String> {
    let agent_dir = AgentDir::open(dir).map_err(|error| error.to_string())?;
    match agent::load(&agent_dir) {
        Ok(loaded) => Ok(Ok(loaded)),
        Err(problems) => {
            let error = error_prefix();
            for problem in problems.iter() {
                eprintln!(
                    "{error}error: {}",
                    perch_core::terminal::escaped_lines(&problem.to_string())
                );
            }
            let count = problems.len();
            let noun = if count == 1 { "problem" } else { "problems" };
            eprintln!("{error}{count} {noun} in {}", agent_dir.root().display());
            Ok(Err(ExitCode::FAILURE))
        }
    }
}

/// What starts an error line on stderr: under systemd's journal, the priority `<3>`, so the
/// journal keeps it as an error; nothing elsewhere.
pub fn error_prefix() -> String {
    crate::host::narrate::Output::of_stderr().priority_prefix(perch_core::narration::Level::Error)
}

/// The most async worker threads a process starts: an agent mostly waits on the network, its
/// model and its VM, so more cores do not need more workers (each holds a stack and an arena).
const WORKERS_MAX: usize = 2;

/// The most threads for blocking work (file I/O, SQLite), and how long an idle one lingers.
const BLOCKING_MAX: usize = 64;
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(2);

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(WORKERS_MAX))
        .max_blocking_threads(BLOCKING_MAX)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))
}

/// A token cancelled by the first Ctrl-C.
fn cancel_on_interrupt() -> CancellationToken {
    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    cancel
}

fn machine(agent: &LoadedAgent) -> Result<Machine, String> {
    sandbox::machine_for(agent, &MachineSetup::from_environment(), |name| {
        std::env::var(name).ok()
    })
    .map_err(|error| error.to_string())
}

/// How long `perch status` (and `perch heartbeat list`) waits for each answer of the running
/// service before it shows what `.perch/` holds.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `value` as perch prints JSON: pretty, keys sorted, and every control and bidi character in
/// a string written as a `\uXXXX` escape (as `perch log --json` does), so a name a guest or a
/// chat user chose cannot act on the terminal the JSON is shown on.
fn printed<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_value(value)
        .and_then(|tree| serde_json::to_string_pretty(&tree))
        .map(|text| perch_core::terminal::json_escaped(&text))
        .map_err(|error| error.to_string())
}

/// Human output that quotes what a guest, a chat user or a model wrote, written to stdout
/// with every control and bidi character escaped and its lines kept.
fn emit_escaped(text: &str) -> Result<(), String> {
    emit(&perch_core::terminal::escaped_lines(text))
}
