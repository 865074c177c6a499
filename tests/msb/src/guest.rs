//! The guest the relay runs commands in. This is h2's STUB: it runs commands directly on the
//! host, so the relay can be built and tested before the namespace guest exists. h1's real
//! `guest.rs` (the image's root filesystem under an overlay, in its own namespaces) replaces it
//! with the same API.

use std::path::PathBuf;
use std::process::Stdio;

/// One request to run a process in the guest.
#[derive(Debug, Clone)]
pub struct GuestCommand {
    /// The program: a guest path, or a name the caller already resolved along PATH.
    pub program: String,
    /// Its arguments, without the program itself.
    pub args: Vec<String>,
    /// Exactly the environment the process gets ("K=V" already split).
    pub env: Vec<(String, String)>,
    /// Guest path; None = "/".
    pub cwd: Option<String>,
    /// Guest user name or uid; None = root.
    pub user: Option<String>,
}

/// The guest: here, the host itself.
#[derive(Debug, Default)]
pub struct Guest {
    baseline_env: Vec<(String, String)>,
}

impl Guest {
    /// A guest that is the host, giving every exec `baseline_env` before its own environment.
    pub fn on_host(baseline_env: Vec<(String, String)>) -> Self {
        Self { baseline_env }
    }

    /// Spawns `command` with piped stdin/stdout/stderr, as the leader of a new process group
    /// (so `killpg(child.id())` reaches the whole command), killed when the handle drops.
    /// The stub ignores `user` and runs as the calling user.
    pub fn spawn(&self, command: &GuestCommand) -> std::io::Result<tokio::process::Child> {
        tokio::process::Command::new(&command.program)
            .args(&command.args)
            .env_clear()
            .envs(command.env.iter().map(|(key, value)| (key, value)))
            .current_dir(command.cwd.as_deref().unwrap_or("/"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }

    /// The guest's root directory as the host sees it: the host's own root.
    pub fn root(&self) -> PathBuf {
        PathBuf::from("/")
    }

    /// The environment every exec gets before the request's own.
    pub fn baseline_env(&self) -> &[(String, String)] {
        &self.baseline_env
    }
}
