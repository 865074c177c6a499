use super::AgentDir;
use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::{fmt, io};

/// Exclusive ownership of an agent directory, held by a long-running command (`perch run`,
/// `perch chat`) for as long as it lives. Read-only commands never take it.
#[derive(Debug)]
pub struct OwnerLock {
    _file: File,
    path: PathBuf,
}

#[derive(Debug)]
pub enum LockError {
    Held { path: PathBuf, owner: Option<u32> },
    Io { path: PathBuf, source: io::Error },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Held { path, owner } => {
                let who = owner.map_or_else(
                    || "another perch process".to_owned(),
                    |pid| format!("perch process {pid}"),
                );
                write!(
                    f,
                    "{who} owns this agent directory (lock {}); stop it first, or run read-only commands such as `perch info`",
                    path.display()
                )
            }
            LockError::Io { path, source } => {
                write!(f, "could not take the lock {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for LockError {}

impl OwnerLock {
    /// Takes `.perch/lock`, creating `.perch/` (mode 0700) if needed. Fails if another process
    /// or task holds it, after a moment's patience ([`crate::host::file_lock::MOMENT`]) for a
    /// lock that a forked child still holds after its owner let go.
    pub fn acquire(agent: &AgentDir) -> Result<OwnerLock, LockError> {
        OwnerLock::acquire_path(agent.owner_lock_file())
    }

    /// Takes the lock file `name` in `dir`, creating `dir` (mode 0700) if needed.
    pub fn acquire_file(dir: &Path, name: &str) -> Result<OwnerLock, LockError> {
        OwnerLock::acquire_path(dir.join(name))
    }

    fn acquire_path(path: PathBuf) -> Result<OwnerLock, LockError> {
        let io_error = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_error)?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error)?;
        match crate::host::file_lock::lock_exclusive(&file, crate::host::file_lock::MOMENT) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let owner = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse().ok());
                return Err(LockError::Held { path, owner });
            }
            Err(TryLockError::Error(source)) => return Err(io_error(source)),
        }
        file.set_len(0).map_err(io_error)?;
        file.seek(SeekFrom::Start(0)).map_err(io_error)?;
        writeln!(file, "{}", std::process::id()).map_err(io_error)?;
        Ok(OwnerLock { _file: file, path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        let _ = fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .and_then(|file| file.set_len(0));
    }
}
