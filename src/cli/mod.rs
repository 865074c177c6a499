//! The `perch` command line: one module per command group, each with its clap definition (whose
//! doc comments are the `--help` text) and what the command does. `main.rs` parses and
//! dispatches to them.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod agent_checks;
pub mod channel;
pub mod chat;
pub mod doctor;
pub mod heartbeat;
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

/// The agent directory a command names, or the current directory.
fn dir_or_current(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| PathBuf::from("."))
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
                eprintln!("{error}error: {problem}");
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

/// `value` as perch prints JSON: pretty, keys sorted.
fn printed<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_value(value)
        .and_then(|tree| serde_json::to_string_pretty(&tree))
        .map_err(|error| error.to_string())
}
