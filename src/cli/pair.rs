//! `perch pair approve`: a sender's pairing code approved, through the running service or
//! directly.

use super::{dir_or_current, emit, runtime};
use crate::agent::{AgentDir, OwnerLock};
use crate::store::control::{self, ControlRequest};
use crate::store::pairing::{no_pending_pairing, read_pairing, write_pairing};
use clap::Subcommand;
use perch_core::control::Approved;
use perch_core::pairing::Approval;
use perch_core::terminal::shown;
use std::path::PathBuf;
use std::process::ExitCode;

/// Approve the sender who was given CODE, so they may talk to the agent in direct messages.
/// Reaches a running `perch run` through .perch/control.sock; acts directly otherwise.
#[derive(Debug, clap::Args)]
pub struct PairArgs {
    #[command(subcommand)]
    pub command: PairCommand,
}

#[derive(Debug, Subcommand)]
pub enum PairCommand {
    /// Approve the pairing code a sender was given
    Approve {
        /// The code, as the sender received it
        code: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
}

pub fn run(args: PairArgs) -> Result<ExitCode, String> {
    match args.command {
        PairCommand::Approve { code, dir } => pair_approve(dir_or_current(dir), &code),
    }
}

fn pair_approve(dir: PathBuf, code: &str) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::PairApprove {
        code: code.to_owned(),
    };
    let approved: Approved = match runtime()?.block_on(control::ask(&agent_dir, &request)) {
        Some(answer) => answer?,
        None => {
            let _lock = OwnerLock::acquire(&agent_dir).map_err(|error| {
                format!("{error}; its control socket does not answer, so the code cannot be approved now")
            })?;
            let path = agent_dir.pairing_file();
            let mut pairing = read_pairing(&path)?;
            match pairing.approve(code, chrono::Utc::now()) {
                Approval::Approved(approved) => {
                    write_pairing(&path, &pairing)?;
                    approved
                }
                Approval::Unknown => return Err(no_pending_pairing(code)),
            }
        }
    };
    emit(&format!(
        "approved {} ({}) on channel {}\n",
        shown(&approved.name),
        shown(&approved.sender),
        shown(&approved.channel)
    ))?;
    Ok(ExitCode::SUCCESS)
}
