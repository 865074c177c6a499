//! Replacing a small file whole: the one way perch rewrites its JSON state files (pairing,
//! conversation generations, starts, hook stores, Matrix sessions).
//!
//! The new contents are written under `<name>.tmp` beside the file, fsynced, renamed over it,
//! and the directory is fsynced: a crash leaves the old file or the new one, never half of
//! either, and once the call returns the new one survives a power loss. Every caller gets that
//! durability, because most of these writes come before an acknowledgement (an approval
//! reported, a `/new` confirmed, a pairing offered) and none is frequent enough for an fsync to
//! matter.
//!
//! [`replace`] assumes one writer at a time (the owner lock sees to that under `.perch/`).
//! [`replace_shared`] is for a file several processes may replace at once (the image cache's
//! records): each writes a temporary of its own, created afresh, so the last rename wins whole.

use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` durably. With `mode`, the file is created with that mode (and
/// set to it, whatever the umask), so a private file is never readable by others, not even as
/// its temporary.
pub fn replace(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let temporary = temporary_path(path);
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if let Some(mode) = mode {
        options.mode(mode);
    }
    let mut file = options.open(&temporary)?;
    if let Some(mode) = mode {
        file.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, path)?;
    sync_parent(path)
}

/// Replaces `path` with `bytes` durably when other processes may be replacing it too: the
/// temporary is `<name>.<pid>.tmp`, created new (so never through a link or over a file another
/// writer holds; a leftover of this pid is removed first) and removed again if the write fails.
pub fn replace_shared(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temporary = sibling(path, &format!(".{}.tmp", std::process::id()));
    match fs::remove_file(&temporary) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    sync_parent(path)
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Replaces `path` with `value` as pretty JSON, durably; the error names the path.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text =
        serde_json::to_vec_pretty(value).map_err(|error| format!("{}: {error}", path.display()))?;
    replace(path, &text, None).map_err(|error| format!("{}: {error}", path.display()))
}

/// `<path>.tmp`: beside the file, so the rename never crosses a file system.
fn temporary_path(path: &Path) -> PathBuf {
    sibling(path, ".tmp")
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_contents_and_no_temporary_is_left() {
        let dir = std::env::temp_dir().join(format!("perch-atomic-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        write_json(&path, &serde_json::json!({"a": 1})).unwrap();
        write_json(&path, &serde_json::json!({"a": 2})).unwrap();
        let read: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(read, serde_json::json!({"a": 2}));
        assert!(!dir.join("state.json.tmp").exists());
        replace(&path, b"{}", Some(0o600)).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shared_replace_never_writes_through_a_planted_link_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("perch-atomic-shared-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("default.json");
        let victim = dir.join("victim");
        fs::write(&victim, b"untouched").unwrap();
        let temporary = dir.join(format!("default.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &temporary).unwrap();

        replace_shared(&path, b"{\"a\": 1}\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{\"a\": 1}\n");
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
        assert!(fs::symlink_metadata(&temporary).is_err());

        let missing = dir.join("no-such-dir").join("default.json");
        assert!(replace_shared(&missing, b"{}").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
