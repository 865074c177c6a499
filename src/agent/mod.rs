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

    /// The directory itself, as the guard canonicalized it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `workspace/`: the agent's files, mounted into its sandbox.
    pub fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    /// `.perch/`: the only place perch keeps durable state. Every path below it is spelled out
    /// here, once, so that a change of the on-disk layout is deliberate.
    pub fn state_dir(&self) -> PathBuf {
        self.root.join(".perch")
    }

    /// `.perch/lock`: the owner lock, held by the one process that acts for the agent.
    pub fn owner_lock_file(&self) -> PathBuf {
        self.state_dir().join("lock")
    }

    /// `.perch/sessions/`: one directory per lane (its segments and index).
    pub fn sessions_dir(&self) -> PathBuf {
        self.state_dir().join("sessions")
    }

    /// `.perch/inbox/`: the journal of arrivals, each kept until its lane has taken it.
    pub fn inbox_dir(&self) -> PathBuf {
        self.state_dir().join("inbox")
    }

    /// `.perch/outbox/`: the journal of deliveries, each kept until it is sent or given up.
    pub fn outbox_dir(&self) -> PathBuf {
        self.state_dir().join("outbox")
    }

    /// `.perch/conversations.json`: the generation of each conversation, as earlier versions
    /// kept it (moved into [`AgentDir::generations_dir`] at start).
    pub fn conversations_file(&self) -> PathBuf {
        self.state_dir().join("conversations.json")
    }

    /// `.perch/generations/`: one file per conversation that used `/new`, holding its
    /// generation.
    pub fn generations_dir(&self) -> PathBuf {
        self.state_dir().join("generations")
    }

    /// `.perch/generations/<lane>`: the generation of the conversation whose first lane is
    /// `base`.
    pub fn generation_file(&self, base: &perch_core::name::LaneName) -> PathBuf {
        self.generations_dir().join(base.as_str())
    }

    /// `.perch/earlier-lanes/`: one file per conversation that met a lane an earlier version
    /// of perch named for it, saying whether it kept that lane.
    pub fn earlier_lanes_dir(&self) -> PathBuf {
        self.state_dir().join("earlier-lanes")
    }

    /// `.perch/earlier-lanes/<lane>.json`: the decision about the earlier lane of the
    /// conversation whose own first lane is `own`.
    pub fn earlier_lane_file(&self, own: &perch_core::name::LaneName) -> PathBuf {
        self.earlier_lanes_dir().join(format!("{own}.json"))
    }

    /// `.perch/pairing.json`: pending pairing codes and the people they approved.
    pub fn pairing_file(&self) -> PathBuf {
        self.state_dir().join("pairing.json")
    }

    /// `.perch/control.sock`: the running service's control socket (mode 0600).
    pub fn control_socket(&self) -> PathBuf {
        self.state_dir().join("control.sock")
    }

    /// `.perch/starts.json`: the recent starts, for the crash-loop breaker.
    pub fn starts_file(&self) -> PathBuf {
        self.state_dir().join("starts.json")
    }

    /// `.perch/last-start.json`: what the last start recovered, for `perch status`.
    pub fn last_start_file(&self) -> PathBuf {
        self.state_dir().join("last-start.json")
    }

    /// `.perch/spend/`: the journal of model usage, for the daily spend guard.
    pub fn spend_dir(&self) -> PathBuf {
        self.state_dir().join("spend")
    }

    /// `.perch/heartbeats/`: the heartbeat slot ledger.
    pub fn heartbeat_ledger_dir(&self) -> PathBuf {
        self.state_dir().join("heartbeats")
    }

    /// `.perch/sandbox/`: the machine's lock, fingerprint and (for the double) its disk.
    pub fn sandbox_state_dir(&self) -> PathBuf {
        self.state_dir().join("sandbox")
    }

    /// `.perch/channels/<name>/store.json`: the store channel `name`'s hooks share.
    pub fn channel_store_file(&self, name: &str) -> PathBuf {
        self.state_dir()
            .join("channels")
            .join(name)
            .join("store.json")
    }

    /// `.perch/matrix/`: the Matrix channels' stores, one directory per channel.
    pub fn matrix_stores_dir(&self) -> PathBuf {
        self.state_dir().join("matrix")
    }

    /// `.perch/matrix/<name>/`: the Matrix channel `name`'s session, keys and stores (secret).
    pub fn matrix_store_dir(&self, name: &str) -> PathBuf {
        self.matrix_stores_dir().join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::AgentDir;
    use std::path::PathBuf;

    #[test]
    fn the_state_layout_is_spelled_out_here() {
        let dir = AgentDir {
            root: PathBuf::from("/agents/ops"),
        };
        let layout = [
            (dir.workspace(), "workspace"),
            (dir.state_dir(), ".perch"),
            (dir.owner_lock_file(), ".perch/lock"),
            (dir.sessions_dir(), ".perch/sessions"),
            (dir.inbox_dir(), ".perch/inbox"),
            (dir.outbox_dir(), ".perch/outbox"),
            (dir.conversations_file(), ".perch/conversations.json"),
            (dir.generations_dir(), ".perch/generations"),
            (
                dir.generation_file(&perch_core::name::LaneName::try_from("tg-1").unwrap()),
                ".perch/generations/tg-1",
            ),
            (dir.earlier_lanes_dir(), ".perch/earlier-lanes"),
            (
                dir.earlier_lane_file(&perch_core::name::LaneName::try_from("tg-1-ab").unwrap()),
                ".perch/earlier-lanes/tg-1-ab.json",
            ),
            (dir.pairing_file(), ".perch/pairing.json"),
            (dir.control_socket(), ".perch/control.sock"),
            (dir.starts_file(), ".perch/starts.json"),
            (dir.last_start_file(), ".perch/last-start.json"),
            (dir.spend_dir(), ".perch/spend"),
            (dir.heartbeat_ledger_dir(), ".perch/heartbeats"),
            (dir.sandbox_state_dir(), ".perch/sandbox"),
            (
                dir.channel_store_file("tg"),
                ".perch/channels/tg/store.json",
            ),
            (dir.matrix_stores_dir(), ".perch/matrix"),
            (dir.matrix_store_dir("mx"), ".perch/matrix/mx"),
        ];
        for (path, relative) in layout {
            assert_eq!(path, dir.root().join(relative));
        }
    }
}
