//! The standing adversarial suite: each test plays an attacker through the real binary.
//!
//! The attackers: a guest writing into `workspace/` or running commands, a chat user sending
//! messages through the platform fakes, a second local user; perch must stay bounded and keep
//! working. A new guest-reachable or chat-reachable input gets a case here.

mod chat;
mod deploy;
mod inbox;
mod lua;
mod output;
mod workspace_files;

use super::support::fake_telegram::TOKEN;
pub(super) use super::support::scenario::exits_within;
use std::process::{Command, Stdio};

/// Clears the environment but for PATH.
fn isolated(command: &mut Command) -> &mut Command {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
}

/// The namespace double, perch's cache and the fake Telegram token, and PATH alone beside them.
pub(super) fn on_the_double(command: &mut Command) -> &mut Command {
    super::support::scenario::on_the_double(command).env("TELEGRAM_TOKEN", TOKEN)
}

fn perch_with(args: &[&str], environment: fn(&mut Command) -> &mut Command) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    environment(command.args(args))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `perch ARGS` with nothing of the test's environment but PATH; stdin closed, output piped.
pub(super) fn perch_isolated(args: &[&str]) -> Command {
    perch_with(args, isolated)
}

/// `perch ARGS` set up by [`on_the_double`]; stdin closed, output piped.
pub(super) fn perch_on_the_double(args: &[&str]) -> Command {
    perch_with(args, on_the_double)
}
