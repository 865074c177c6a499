//! What `perch run` remembers about its own starts (`.perch/starts.json`, for the crash-loop
//! breaker), what the last start recovered (`.perch/last-start.json`, for `perch status`), and
//! which of the agent's files changed since it started (they need a restart to apply).

use crate::agent::AgentDir;
use perch_core::starts::{LastStart, Start};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The record of recent starts; none when there is no file yet.
pub fn read_starts(path: &Path) -> Result<Vec<Start>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|error| {
            format!(
                "{}: {error}; it only records recent starts for the crash-loop breaker, so \
                 delete it to start afresh",
                path.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

pub fn write_starts(path: &Path, starts: &[Start]) -> Result<(), String> {
    write_json(
        path,
        &serde_json::to_value(starts).map_err(|e| e.to_string())?,
    )
}

/// Writes `value` to `path` whole and durably ([`crate::store::atomic_file`]).
fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), String> {
    crate::store::atomic_file::write_json(path, value)
}

/// What `perch status` shows of the last start, when there is one and it reads.
pub fn read_last_start(dir: &AgentDir) -> Option<LastStart> {
    let text = std::fs::read_to_string(dir.last_start_file()).ok()?;
    LastStart::read(&text).ok()
}

/// Writes `.perch/last-start.json` whole and durably.
pub fn write_last_start(dir: &AgentDir, last: &LastStart) -> Result<(), String> {
    write_json(
        &dir.last_start_file(),
        &serde_json::to_value(last).map_err(|e| e.to_string())?,
    )
}

/// The files whose edits take effect only at the next start: everything `perch run` loads
/// once. (The workspace, HEARTBEAT.yml included, is read live.)
const LOADED_AT_START: [&str; 5] = [
    "agent.lua",
    "sandbox.lua",
    "models.yml",
    "instructions.md",
    "tools",
];

/// A digest of each file perch loads at start (`channels/` and `tools/` file by file).
pub fn config_digests(dir: &AgentDir) -> BTreeMap<String, String> {
    let mut digests = BTreeMap::new();
    let root = dir.root();
    let mut add = |relative: String, path: &Path| {
        if let Ok(bytes) = std::fs::read(path) {
            digests.insert(relative, format!("{:x}", Sha256::digest(&bytes)));
        }
    };
    for name in LOADED_AT_START.iter().chain(["channels"].iter()) {
        let path = root.join(name);
        if path.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&path)
                .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            entries.sort();
            for entry in entries {
                if entry.is_file()
                    && let Some(file) = entry.file_name()
                {
                    add(format!("{name}/{}", file.to_string_lossy()), &entry);
                }
            }
        } else {
            add((*name).to_owned(), &path);
        }
    }
    digests
}

/// The files that differ between two digests: changed, added or removed.
pub fn changed_files(
    at_start: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut changed: Vec<String> = at_start
        .iter()
        .filter(|(file, digest)| now.get(*file) != Some(digest))
        .map(|(file, _)| file.clone())
        .chain(
            now.keys()
                .filter(|file| !at_start.contains_key(*file))
                .cloned(),
        )
        .collect();
    changed.sort();
    changed.dedup();
    changed
}

/// The operations each lane has started and not finished, per its newest segment: after a crash,
/// the lanes recovery must close; while perch runs, the runs in progress. Read through each
/// lane's index ([`crate::log::open_operations`]).
pub fn open_operations(sessions: &Path) -> BTreeMap<String, usize> {
    crate::log::open_operations(sessions)
}
