//! `perch init`: the files of a new agent directory. The templates are the example agent in
//! `agents/starter/`, compiled in, so what `init` writes is what the catalog test loads.
//! `perch channel add`: the stock channel adapters in `channels/`, compiled in likewise.

use super::AgentDir;
use super::load::{LoadedChannel, load_channel};
use nix::fcntl::OFlag;
use perch_core::config::ChannelKind;
use perch_core::name::ChannelName;
use perch_core::problem::Problems;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

enum Template {
    File(&'static str),
    Dir,
}

const TEMPLATES: &[(&str, Template)] = &[
    (
        "agent.lua",
        Template::File(include_str!("../../agents/starter/agent.lua")),
    ),
    (
        "sandbox.lua",
        Template::File(include_str!("../../agents/starter/sandbox.lua")),
    ),
    (
        "tools/example.lua",
        Template::File(include_str!("../../agents/starter/tools/example.lua")),
    ),
    (
        "instructions.md",
        Template::File(include_str!("../../agents/starter/instructions.md")),
    ),
    (
        "models.yml",
        Template::File(include_str!("../../agents/starter/models.yml")),
    ),
    (
        "workspace/AGENTS.md",
        Template::File(include_str!("../../agents/starter/workspace/AGENTS.md")),
    ),
    (
        "workspace/SOUL.md",
        Template::File(include_str!("../../agents/starter/workspace/SOUL.md")),
    ),
    (
        "workspace/KNOWLEDGE.md",
        Template::File(include_str!("../../agents/starter/workspace/KNOWLEDGE.md")),
    ),
    (
        "workspace/HEARTBEAT.yml",
        Template::File(include_str!("../../agents/starter/workspace/HEARTBEAT.yml")),
    ),
    ("workspace/knowledge", Template::Dir),
    ("workspace/notes", Template::Dir),
    ("workspace/skills", Template::Dir),
    ("channels", Template::Dir),
    (
        ".gitignore",
        Template::File(include_str!("../../agents/starter/.gitignore")),
    ),
];

/// What `init` found or did for one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitStatus {
    Created,
    /// Equal to the template.
    Unchanged,
    /// Edited by the user; kept as it is.
    Changed,
    /// Something is in the way (a symlink, a file where a directory belongs); left alone.
    Refused {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitItem {
    /// Relative to the agent directory; directories end in `/`.
    pub path: String,
    pub status: InitStatus,
}

/// Writes every missing file and directory of a new agent into `dir` (created if needed) and
/// reports on each. Never writes outside `dir`, never follows a symlink inside it, never
/// overwrites a file.
pub fn init(dir: &Path) -> io::Result<(PathBuf, Vec<InitItem>)> {
    fs::create_dir_all(dir)?;
    let root = dir.canonicalize()?;
    let items = TEMPLATES
        .iter()
        .map(|(relative, template)| {
            let status =
                place(&root, relative, template).unwrap_or_else(|error| InitStatus::Refused {
                    reason: error.to_string(),
                });
            let path = match template {
                Template::Dir => format!("{relative}/"),
                Template::File(_) => (*relative).to_owned(),
            };
            InitItem { path, status }
        })
        .collect();
    Ok((root, items))
}

fn place(root: &Path, relative: &str, template: &Template) -> io::Result<InitStatus> {
    let path = root.join(relative);
    if let Some(reason) = blocked(root, Path::new(relative)) {
        return Ok(InitStatus::Refused { reason });
    }
    match template {
        Template::Dir => match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => Ok(InitStatus::Unchanged),
            Ok(_) => Ok(InitStatus::Refused {
                reason: "something other than a directory is in the way".into(),
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&path)?;
                Ok(InitStatus::Created)
            }
            Err(error) => Err(error),
        },
        Template::File(text) => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    file.write_all(text.as_bytes())?;
                    file.sync_all()?;
                    Ok(InitStatus::Created)
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                    let meta = fs::symlink_metadata(&path)?;
                    if !meta.is_file() {
                        return Ok(InitStatus::Refused {
                            reason: "something other than a file is in the way".into(),
                        });
                    }
                    let guest_writable = relative.starts_with("workspace/");
                    if holds_exactly(&path, text.as_bytes(), guest_writable)? {
                        Ok(InitStatus::Unchanged)
                    } else {
                        Ok(InitStatus::Changed)
                    }
                }
                Err(error) => Err(error),
            }
        }
    }
}

/// Whether the file at `path` holds exactly `expected`, read without following a symlink,
/// without waiting on a FIFO and no further than one byte past `expected`: the guest may have
/// swapped a workspace file for anything. With `guest_writable`, a file with another hard link
/// (perhaps to a file outside the directory) is an error, never read.
fn holds_exactly(path: &Path, expected: &[u8], guest_writable: bool) -> io::Result<bool> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(false);
    }
    if guest_writable && meta.nlink() > 1 {
        return Err(io::Error::other(format!(
            "it has {} hard links, and perch reads no workspace file linked from elsewhere; \
             replace it with a copy of its own",
            meta.nlink()
        )));
    }
    let mut bytes = Vec::new();
    file.take(expected.len() as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes == expected)
}

/// A symlink anywhere on the way from `root` to `relative` could lead outside the directory.
fn blocked(root: &Path, relative: &Path) -> Option<String> {
    let mut path = root.to_owned();
    for component in relative.components() {
        let Component::Normal(part) = component else {
            return Some("not a plain relative path".into());
        };
        path.push(part);
        if fs::symlink_metadata(&path).is_ok_and(|meta| meta.file_type().is_symlink()) {
            return Some(format!(
                "{} is a symlink, which could lead outside the agent directory",
                path.display()
            ));
        }
    }
    None
}

/// The stock adapter for `kind`, as `perch channel add` writes it.
pub fn stock_channel(kind: ChannelKind) -> &'static str {
    match kind {
        ChannelKind::Discord => include_str!("../../channels/discord.lua"),
        ChannelKind::Telegram => include_str!("../../channels/telegram.lua"),
        ChannelKind::Matrix => include_str!("../../channels/matrix.lua"),
        ChannelKind::Slack => include_str!("../../channels/slack.lua"),
    }
}

/// A channel file `perch channel add` created.
#[derive(Debug)]
pub struct AddedChannel {
    /// Where it was written.
    pub path: PathBuf,
    /// The channel as it loads.
    pub channel: LoadedChannel,
}

/// Writes the stock adapter for `kind` into `dir` as `channels/<name>.lua` (`name` defaults to
/// the kind). Refuses to overwrite any file, and never follows a symlink inside `dir`.
pub fn add_channel(
    dir: &AgentDir,
    kind: ChannelKind,
    name: Option<&ChannelName>,
) -> Result<AddedChannel, String> {
    let name = name.map_or(kind.as_str(), ChannelName::as_str);
    let relative = format!("channels/{name}.lua");
    let text = stock_channel(kind);
    let mut problems = Vec::new();
    let Some(channel) = load_channel(&relative, text, &mut problems) else {
        return Err(Problems::from(problems).to_string());
    };
    match place(dir.root(), &relative, &Template::File(text)) {
        Ok(InitStatus::Created) => Ok(AddedChannel {
            path: dir.root().join(&relative),
            channel,
        }),
        Ok(InitStatus::Unchanged | InitStatus::Changed) => Err(format!(
            "{relative} already exists, and perch never overwrites a file; edit it, or add \
             another channel with --name NAME"
        )),
        Ok(InitStatus::Refused { reason }) => Err(format!("{relative}: {reason}")),
        Err(error) => Err(format!("cannot write {relative}: {error}")),
    }
}
