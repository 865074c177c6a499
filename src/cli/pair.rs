//! `perch pair`: the operator's control of pairing (list, approve, deny, revoke), through the
//! running service or, when none runs, on `.perch/pairing.json` directly under the agent lock.

use super::{dir_or_current, emit, printed, runtime};
use crate::agent::{self, AgentDir, OwnerLock};
use crate::store::control::{self, ControlRequest};
use crate::store::pairing::{
    no_pending_pairing, no_pending_request, not_approved, read_pairing, write_pairing,
};
use clap::Subcommand;
use perch_core::Timestamp;
use perch_core::control::{PairApproved, PairListed, PairSender};
use perch_core::pairing::{Approval, Who};
use perch_core::terminal::shown;
use std::path::PathBuf;
use std::process::ExitCode;

/// Control who may talk to the agent in direct messages
///
/// List the pairing requests and the approved senders, approve a request or a sender by id, deny a request, revoke a sender.
/// Reaches a running `perch run` through .perch/control.sock; acts on .perch/pairing.json
/// directly otherwise.
#[derive(Debug, clap::Args)]
pub struct PairArgs {
    #[command(subcommand)]
    pub command: PairCommand,
}

#[derive(Debug, Subcommand)]
pub enum PairCommand {
    /// List the pending pairing requests and the approved senders
    List {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Approve a request by its code, or a sender by CHANNEL:USER_ID
    ///
    /// A sender is approved by id with or without a request.
    Approve {
        /// The code the sender received, or CHANNEL:USER_ID (as in tg:123456789)
        who: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
    /// Drop a pending request, by its code or CHANNEL:USER_ID; the sender is not told
    Deny {
        /// The request's code, or CHANNEL:USER_ID
        who: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
    /// Remove an approved sender: their next direct message is a stranger's again
    Revoke {
        /// CHANNEL:USER_ID, as `perch pair list` shows it
        who: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
}

impl PairCommand {
    /// The agent directory this command's DIR argument names.
    pub fn dir_mut(&mut self) -> &mut Option<PathBuf> {
        match self {
            PairCommand::List { dir, .. }
            | PairCommand::Approve { dir, .. }
            | PairCommand::Deny { dir, .. }
            | PairCommand::Revoke { dir, .. } => dir,
        }
    }
}

pub fn run(args: PairArgs) -> Result<ExitCode, String> {
    match args.command {
        PairCommand::List { dir, json } => pair_list(&open(dir)?, json),
        PairCommand::Approve { who, dir } => pair_approve(&open(dir)?, Who::parse(&who)?),
        PairCommand::Deny { who, dir } => pair_deny(&open(dir)?, Who::parse(&who)?),
        PairCommand::Revoke { who, dir } => match Who::parse(&who)? {
            Who::Sender { channel, sender } => pair_revoke(&open(dir)?, channel, sender),
            Who::Code { .. } => Err(format!(
                "{}: revoke takes CHANNEL:USER_ID (as `perch pair list` shows it), not a code",
                shown(&who)
            )),
        },
    }
}

fn open(dir: Option<PathBuf>) -> Result<AgentDir, String> {
    AgentDir::open(&dir_or_current(dir)).map_err(|error| error.to_string())
}

/// Asks the running service; `None` when none runs.
fn ask_service<T: serde::de::DeserializeOwned>(
    dir: &AgentDir,
    request: &ControlRequest,
) -> Result<Option<T>, String> {
    runtime()?.block_on(control::ask(dir, request)).transpose()
}

/// Changes `.perch/pairing.json` with `change` under the agent's lock, when no service runs;
/// `doing` says what could not be done otherwise.
fn change_offline<T>(
    dir: &AgentDir,
    doing: &str,
    change: impl FnOnce(&mut perch_core::pairing::Pairing) -> Result<T, String>,
) -> Result<T, String> {
    let _lock = OwnerLock::acquire(dir).map_err(|error| {
        format!("{error}; its control socket does not answer, so {doing} cannot be done now")
    })?;
    let path = dir.pairing_file();
    let mut pairing = read_pairing(&path)?;
    let changed = change(&mut pairing)?;
    write_pairing(&path, &pairing)?;
    Ok(changed)
}

fn pair_list(dir: &AgentDir, json: bool) -> Result<ExitCode, String> {
    let now = chrono::Utc::now();
    let listed = match ask_service::<PairListed>(dir, &ControlRequest::PairList)? {
        Some(listed) => listed,
        None => {
            let mut pairing = read_pairing(&dir.pairing_file())?;
            pairing.expire(now);
            PairListed {
                pending: pairing.pending,
                approved: pairing.approved,
            }
        }
    };
    if json {
        emit(&format!("{}\n", printed(&listed)?))?;
    } else {
        emit(&listing_text(&listed, now))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `perch pair list` as text: one line per request (oldest first) and per approved sender, every
/// name and id made safe for a terminal.
fn listing_text(listed: &PairListed, now: Timestamp) -> String {
    let mut out = format!("pending requests: {}\n", listed.pending.len());
    let mut rows: Vec<[String; 4]> = listed
        .pending
        .iter()
        .map(|pending| {
            [
                format!("{}:{}", shown(&pending.channel), shown(&pending.sender)),
                display_name(&pending.name),
                format!("code {}", shown(&pending.code)),
                format!("asked {} ago", age(now - pending.requested())),
            ]
        })
        .collect();
    out.push_str(&aligned(&rows));
    out.push_str(&format!("approved senders: {}\n", listed.approved.len()));
    rows = listed
        .approved
        .iter()
        .map(|approved| {
            [
                format!("{}:{}", shown(&approved.channel), shown(&approved.sender)),
                display_name(&approved.name),
                String::new(),
                String::new(),
            ]
        })
        .collect();
    out.push_str(&aligned(&rows));
    if !listed.pending.is_empty() {
        out.push_str(
            "approve with `perch pair approve CODE` or `perch pair approve CHANNEL:USER_ID`\n",
        );
    }
    out
}

fn display_name(name: &str) -> String {
    if name.is_empty() {
        "(no name known)".to_owned()
    } else {
        shown(name)
    }
}

fn aligned(rows: &[[String; 4]]) -> String {
    let mut widths = [0; 4];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:width$}"))
                .collect();
            format!("  {}\n", cells.join("  ").trim_end())
        })
        .collect()
}

fn age(elapsed: chrono::Duration) -> String {
    let minutes = elapsed.num_minutes().max(0);
    match minutes {
        0 => "under a minute".to_owned(),
        1..=59 => format!("{minutes} min"),
        _ => format!("{} h {} min", minutes / 60, minutes % 60),
    }
}

fn who_line(channel: &str, sender: &str, name: &str) -> String {
    if name.is_empty() {
        format!("{} on channel {}", shown(sender), shown(channel))
    } else {
        format!(
            "{} ({}) on channel {}",
            shown(name),
            shown(sender),
            shown(channel)
        )
    }
}

fn pair_approve(dir: &AgentDir, who: Who) -> Result<ExitCode, String> {
    let request = ControlRequest::PairApprove { who: who.clone() };
    let line = match ask_service::<PairApproved>(dir, &request)? {
        Some(approved) => format!(
            "approved {}; {}\n",
            who_line(&approved.channel, &approved.sender, &approved.name),
            if approved.told {
                "they were told in their direct messages"
            } else {
                "they were not told (no direct message from them is known); they can write now"
            }
        ),
        None => {
            if let Who::Sender { channel, .. } = &who {
                declared_channel(dir, channel)?;
            }
            let approved = change_offline(dir, "the approval", |pairing| {
                match pairing.approve_while_stopped(&who, chrono::Utc::now()) {
                    Approval::Approved(approved) => Ok(approved),
                    Approval::Unknown => Err(match &who {
                        Who::Code { code } => no_pending_pairing(&shown(code)),
                        Who::Sender { .. } => no_pending_request(&who),
                    }),
                }
            })?;
            let told = if approved.room.is_some() {
                "they will be told in their direct messages when it starts"
            } else {
                "they were not told (no direct message from them is known); they can write once \
                 it runs"
            };
            format!(
                "approved {}; perch is not running: {told}\n",
                who_line(&approved.channel, &approved.sender, &approved.name)
            )
        }
    };
    emit(&line)?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses a channel the agent does not declare, when its files load (a sender approved on it
/// could never talk); when they do not load, `perch run` would not start either, and the
/// approval is kept for when they do.
fn declared_channel(dir: &AgentDir, channel: &str) -> Result<(), String> {
    let Ok(loaded) = agent::load(dir) else {
        return Ok(());
    };
    let names: Vec<String> = loaded
        .channels
        .iter()
        .map(|channel| channel.config.name.to_string())
        .collect();
    if names.iter().any(|name| name == channel) {
        return Ok(());
    }
    Err(format!(
        "no channel {} is declared (channels: {})",
        shown(channel),
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    ))
}

fn pair_deny(dir: &AgentDir, who: Who) -> Result<ExitCode, String> {
    let request = ControlRequest::PairDeny { who: who.clone() };
    let denied = match ask_service::<PairSender>(dir, &request)? {
        Some(denied) => denied,
        None => change_offline(dir, "the denial", |pairing| {
            pairing
                .deny(&who, chrono::Utc::now())
                .map(|denied| PairSender {
                    channel: denied.channel,
                    sender: denied.sender,
                    name: denied.name,
                })
                .ok_or_else(|| no_pending_request(&who))
        })?,
    };
    emit(&format!(
        "denied the request of {}; they were not told, and may ask again\n",
        who_line(&denied.channel, &denied.sender, &denied.name)
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn pair_revoke(dir: &AgentDir, channel: String, sender: String) -> Result<ExitCode, String> {
    let request = ControlRequest::PairRevoke {
        channel: channel.clone(),
        sender: sender.clone(),
    };
    let revoked = match ask_service::<PairSender>(dir, &request)? {
        Some(revoked) => revoked,
        None => change_offline(dir, "the revocation", |pairing| {
            pairing
                .revoke(&channel, &sender)
                .map(|revoked| PairSender {
                    channel: revoked.channel,
                    sender: revoked.sender,
                    name: revoked.name,
                })
                .ok_or_else(|| not_approved(&channel, &sender))
        })?,
    };
    emit(&format!(
        "revoked {}: no longer approved\n",
        who_line(&revoked.channel, &revoked.sender, &revoked.name)
    ))?;
    Ok(ExitCode::SUCCESS)
}
