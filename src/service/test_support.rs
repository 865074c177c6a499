//! What the service's unit tests share.

use crate::agent::AgentDir;

/// An agent directory with an empty `agent.lua` and the folder `made` (such as `.perch`).
pub(crate) fn agent_with(made: &str) -> (tempfile::TempDir, AgentDir) {
    let temp = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir_all(temp.path().join(made)).expect("the folder is made");
    std::fs::write(temp.path().join("agent.lua"), "").expect("agent.lua is written");
    let dir = AgentDir::open(temp.path()).expect("an agent directory");
    (temp, dir)
}
