//! The `perch` command line.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use clap::{Parser, Subcommand};
use perch::agent::{self, AgentDir, InitStatus};
use perch::{doctor, info};
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// perch hosts one AI agent per directory, headless, with every command the model authors
/// running inside a microVM.
#[derive(Debug, Parser)]
#[command(name = "perch", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create an agent directory, or fill in what it lacks. Idempotent: files you edited are
    /// kept, and nothing outside DIR is written.
    Init {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
    /// Show what the agent is: model, sandbox, egress hosts, secrets (names, never values) and
    /// tools. Reads only; never takes the agent's lock or repairs anything.
    Info {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Check that this machine can run perch's microVMs: KVM, hardware virtualization, the
    /// microsandbox runtime, the cache directory.
    Doctor,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Init { dir } => init(dir.unwrap_or_else(|| PathBuf::from("."))),
        Command::Info { dir, json } => show_info(dir.unwrap_or_else(|| PathBuf::from(".")), json),
        Command::Doctor => run_doctor(),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
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

fn init(dir: PathBuf) -> Result<ExitCode, String> {
    let (root, items) =
        agent::init(&dir).map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    let mut out = format!("initialised {}\n", root.display());
    let mut refused = false;
    for item in &items {
        let (word, note) = match &item.status {
            InitStatus::Created => ("created", String::new()),
            InitStatus::Unchanged => ("unchanged", String::new()),
            InitStatus::Changed => ("changed", "  (yours, kept as it is)".to_owned()),
            InitStatus::Refused { reason } => {
                refused = true;
                ("refused", format!("  ({reason})"))
            }
        };
        out.push_str(&format!("  {word:<10} {}{note}\n", item.path));
    }
    out.push_str("\nedit instructions.md and models.yml, then check the agent with `perch info`\n");
    emit(&out)?;
    Ok(if refused {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn show_info(dir: PathBuf, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let loaded = match agent::load(&agent_dir) {
        Ok(loaded) => loaded,
        Err(problems) => {
            for problem in problems.iter() {
                eprintln!("error: {problem}");
            }
            let count = problems.len();
            let noun = if count == 1 { "problem" } else { "problems" };
            eprintln!("{count} {noun} in {}", agent_dir.root().display());
            return Ok(ExitCode::FAILURE);
        }
    };
    if json {
        let text = serde_json::to_string_pretty(&info::to_json(&loaded))
            .map_err(|error| error.to_string())?;
        emit(&format!("{text}\n"))?;
    } else {
        emit(&info::to_text(&loaded))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_doctor() -> Result<ExitCode, String> {
    let checks = doctor::run(&doctor::Places::from_environment());
    let mut out = String::new();
    for check in &checks {
        out.push_str(&format!("{check}\n"));
    }
    emit(&out)?;
    let failed = checks
        .iter()
        .any(|check| check.status == doctor::Status::Fail);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
