//! `perch chown`: an agent's files given from one service user to another, as root, without
//! following anything the old user could have planted ([`crate::host::ownership`]).

use super::{dir_or_current, emit_escaped};
use crate::host::ownership::hand_over;
use nix::unistd::{Gid, Group, Uid, User};
use std::path::PathBuf;
use std::process::ExitCode;

/// The most skipped entries listed one per line; the rest are counted.
const SKIPS_LISTED: usize = 100;

/// Give an agent's files from one user to another (run as root)
///
/// Walks DIR without following symbolic links and gives each file and directory the old user
/// owns to the new one. Symbolic links, files with more than one hard link, files of any other
/// owner and other filesystems are left alone and listed. deploy/install.sh --agent runs it
/// when an agent moves from the shared user perch to its own.
#[derive(Debug, clap::Args)]
pub struct ChownArgs {
    /// The user whose files change owner (a name or a numeric uid)
    #[arg(long, value_name = "USER")]
    pub from: String,
    /// The new owner, USER or USER:GROUP (names or numeric ids) [default GROUP: USER's group]
    #[arg(long, value_name = "USER[:GROUP]")]
    pub to: String,
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
}

pub fn run(args: ChownArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
    let from = user(&args.from)?.0;
    let (user_part, group_part) = match args.to.split_once(':') {
        Some((user_part, group_part)) => (user_part, Some(group_part)),
        None => (args.to.as_str(), None),
    };
    let (to_user, primary) = user(user_part)?;
    let to_group = match group_part {
        Some(name) => group(name)?,
        None => primary,
    };
    let report = hand_over(&dir, from, to_user, to_group)?;
    let mut out = format!(
        "gave {} entries under {} to {}\n",
        report.given,
        dir.display(),
        args.to
    );
    for (path, reason) in report.skipped.iter().take(SKIPS_LISTED) {
        let shown = if path.as_os_str().is_empty() {
            ".".into()
        } else {
            path.display().to_string()
        };
        out.push_str(&format!("  skipped  {shown}: {reason}\n"));
    }
    if report.skipped.len() > SKIPS_LISTED {
        out.push_str(&format!(
            "  skipped  {} more\n",
            report.skipped.len() - SKIPS_LISTED
        ));
    }
    emit_escaped(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// A user by name or numeric uid, with its primary group.
fn user(given: &str) -> Result<(Uid, Gid), String> {
    let found = match given.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(given),
    }
    .map_err(|error| format!("looking up the user {given}: {error}"))?;
    match (found, given.parse::<u32>()) {
        (Some(user), _) => Ok((user.uid, user.gid)),
        (None, Ok(uid)) => Ok((Uid::from_raw(uid), Gid::from_raw(uid))),
        (None, Err(_)) => Err(format!(
            "there is no user {given}; create it first (deploy/install.sh --agent NAME does)"
        )),
    }
}

/// A group by name or numeric gid.
fn group(given: &str) -> Result<Gid, String> {
    if let Ok(gid) = given.parse::<u32>() {
        return Ok(Gid::from_raw(gid));
    }
    Group::from_name(given)
        .map_err(|error| format!("looking up the group {given}: {error}"))?
        .map(|group| group.gid)
        .ok_or_else(|| format!("there is no group {given}"))
}
