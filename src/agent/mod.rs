//! The agent directory: the guard that recognises one, the files `perch init` writes, loading
//! its configuration, and the lock that gives it one owner at a time.

mod load;
mod lock;
mod scaffold;

pub use load::{LoadedAgent, LoadedChannel, load, load_channel};
pub use lock::{LockError, OwnerLock};
pub use scaffold::{AddedChannel, InitItem, InitStatus, add_channel, init, stock_channel};

use std::fmt;
use std::path::{Path, PathBuf};

/// A directory that passed the guard: it holds `agent.lua` or `instructions.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDir {
    root: PathBuf,
}

/// The directory is not an agent directory, so perch will not attach itself to it.
#[derive(Debug)]
pub enum NotAnAgent {
    Missing(PathBuf),
    Unmarked(PathBuf),
}

impl fmt::Display for NotAnAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAnAgent::Missing(path) => write!(
                f,
                "{} does not exist; create an agent there with `perch init {}`",
                path.display(),
                path.display()
            ),
            NotAnAgent::Unmarked(path) => write!(
                f,
                "{} is not a perch agent directory: it has neither agent.lua nor instructions.md. \
                 Run `perch init {}` to make it one, or pass the agent's directory",
                path.display(),
                path.display()
            ),
        }
    }
}

impl std::error::Error for NotAnAgent {}

impl AgentDir {
    /// Applies the guard to `path`.
    pub fn open(path: &Path) -> Result<AgentDir, NotAnAgent> {
        let root = path
            .canonicalize()
            .map_err(|_| NotAnAgent::Missing(path.to_owned()))?;
        if !root.is_dir() {
            return Err(NotAnAgent::Missing(path.to_owned()));
        }
        if root.join("agent.lua").is_file() || root.join("instructions.md").is_file() {
            Ok(AgentDir { root })
        } else {
            Err(NotAnAgent::Unmarked(root))
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `.perch/`: the only place perch keeps durable state.
    pub fn state_dir(&self) -> PathBuf {
        self.root.join(".perch")
    }

    /// `.perch/sessions/`: one directory per lane.
    pub fn sessions_dir(&self) -> PathBuf {
        self.state_dir().join("sessions")
    }

    pub fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }
}
