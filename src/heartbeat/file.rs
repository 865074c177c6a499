//! `HEARTBEAT.yml`: where it is, what it is checked against, and how it is read (never through a
//! symlink, never more than [`FILE_LIMIT`] bytes, never blocking on a FIFO).

use crate::agent::{AgentDir, LoadedAgent, load_channel};
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
        channels_on_disk: None,
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
///
/// `env` is what the agent's files said when perch started. When the file does not check, it
/// is checked again knowing the rooms the channel files declare now, so that a delivery to a
/// room added since says that perch must restart to load it.
pub(super) fn look(dir: &AgentDir, env: &HeartbeatEnv, seen: Option<&str>) -> Reloaded {
    match read_text(&dir.workspace()) {
        Err(error) => Reloaded::Unreadable(error),
        Ok(text) if seen == Some(text.as_str()) => Reloaded::Unchanged,
        Ok(text) => {
            let checked = check(&text, env).or_else(|_| {
                let now = HeartbeatEnv {
                    channels_on_disk: Some(channel_rooms_on_disk(dir.root())),
                    ..env.clone()
                };
                check(&text, &now)
            });
            Reloaded::Read { text, checked }
        }
    }
}

/// The rooms the channel files in `root` declare now; a file that does not check declares
/// none.
fn channel_rooms_on_disk(root: &Path) -> Vec<TargetSpec> {
    let Ok(listing) = std::fs::read_dir(root.join("channels")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = listing
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|name| {
            let file = format!("channels/{name}");
            let source = read_channel_text(&root.join(&file))?;
            load_channel(&file, &source, &mut Vec::new())
        })
        .flat_map(|channel| {
            let name = channel.config.name;
            channel
                .config
                .rooms
                .into_keys()
                .map(move |room| TargetSpec {
                    channel: name.clone(),
                    room,
                })
        })
        .collect()
}

/// The most bytes of a channel file read for [`channel_rooms_on_disk`].
const CHANNEL_FILE_LIMIT: u64 = 1024 * 1024;

/// A channel file's text when it is a regular file of at most [`CHANNEL_FILE_LIMIT`] bytes,
/// opened without following a symlink or blocking on a FIFO.
fn read_channel_text(path: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(CHANNEL_FILE_LIMIT + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= CHANNEL_FILE_LIMIT).then_some(text)
}
