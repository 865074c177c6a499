//! `HEARTBEAT.yml`: where it is, what it is checked against, and how it is read (never through a
//! symlink, never more than [`FILE_LIMIT`] bytes, never blocking on a FIFO).

use crate::agent::{AgentDir, LoadedAgent};
use crate::host::workspace::read_workspace_text;
use perch_core::heartbeat::{HeartbeatEnv, HeartbeatFile, TargetSpec, parse_heartbeat_file};
use std::path::{Path, PathBuf};

/// The heartbeat file's name in the workspace.
pub(super) const FILE_NAME: &str = "HEARTBEAT.yml";

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
const FILE_LIMIT: u64 = 256 * 1024;

/// The heartbeat file's text, read without following a symlink, only when it is a regular
/// file, and at most [`FILE_LIMIT`] bytes; a missing file reads as empty. Never blocks on a FIFO
/// or a device. The error is the file's problem.
pub(super) fn read_text(workspace: &Path) -> Result<String, String> {
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
pub(super) enum Reloaded {
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
pub(super) fn look(workspace: &Path, env: &HeartbeatEnv, seen: Option<&str>) -> Reloaded {
    match read_text(workspace) {
        Err(error) => Reloaded::Unreadable(error),
        Ok(text) if seen == Some(text.as_str()) => Reloaded::Unchanged,
        Ok(text) => {
            let checked = check(&text, env);
            Reloaded::Read { text, checked }
        }
    }
}
