//! What the service's unit tests share.

use crate::agent::AgentDir;

/// An agent directory with an empty `agent.lua` and the folder `made` (such as `.perch`).
pub(crate) fn agent_with(made: &str) -> (tempfile::TempDir, AgentDir) {
    let temp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(temp.path().join(made)).unwrap();
    std::fs::write(temp.path().join("agent.lua"), "").unwrap();
    let dir = AgentDir::open(temp.path()).unwrap();
    (temp, dir)
}
