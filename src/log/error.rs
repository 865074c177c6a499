use perch_core::log::Violation;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong with a log file, each with what to do about it.
#[derive(Debug)]
pub enum LogError {
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// A line that a crash cannot have produced. Lines count from 1.
    Corrupt {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    /// Another writer holds the lane or journal.
    Held {
        path: PathBuf,
    },
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
    },
    /// The append would break the log's invariants; nothing was written.
    Refused(Violation),
    /// A segment may only be closed when no operation is open in it.
    OperationsOpen {
        count: usize,
    },
    /// The writer stopped (after a failed write, or because the log was closed).
    WriterStopped {
        reason: String,
    },
}

impl LogError {
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
    ) -> impl FnOnce(io::Error) -> LogError {
        let path = path.into();
        move |source| LogError::Io {
            path,
            action,
            source,
        }
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io {
                path,
                action,
                source,
            } => {
                write!(f, "could not {action} {}: {source}", path.display())
            }
            LogError::Corrupt { path, line, reason } => write!(
                f,
                "{}:{line}: corrupt log line ({reason}); a crash cannot leave this, so perch will not open the file. \
                 Restore it from a backup, or move it aside to start the lane afresh",
                path.display()
            ),
            LogError::Held { path } => write!(
                f,
                "{} is held by another writer (another perch process, or another task of this one); \
                 stop that one first",
                path.display()
            ),
            LogError::UnsupportedVersion { path, found } => write!(
                f,
                "{} has log format version {found}, which this perch does not read; use the perch that wrote it",
                path.display()
            ),
            LogError::Refused(violation) => write!(f, "append refused: {violation}"),
            LogError::OperationsOpen { count } => write!(
                f,
                "cannot start a new segment while {count} operation(s) are open; finish or recover them first"
            ),
            LogError::WriterStopped { reason } => {
                write!(f, "the log writer stopped: {reason}; reopen the lane")
            }
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Io { source, .. } => Some(source),
            LogError::Refused(violation) => Some(violation),
            _ => None,
        }
    }
}
