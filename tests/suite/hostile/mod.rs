//! The standing adversarial suite: each test plays an attacker through the real binary (a guest
//! writing into `workspace/` or running commands, a chat user sending messages through the
//! platform fakes, a second local user) and asserts that perch stays bounded and keeps working.
//! A new guest-reachable or chat-reachable input gets a case here.

mod chat;
mod deploy;
mod lua;
mod output;
mod workspace_files;

use super::fake_telegram::TOKEN;
use super::service::terminate;
use perch::host::Places;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Clears the environment but for PATH.
fn isolated(command: &mut Command) -> &mut Command {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
}

/// [`isolated`], then the namespace double, perch's cache and the fake Telegram token.
pub(super) fn on_the_double(command: &mut Command) -> &mut Command {
    isolated(command)
        .env("PERCH_SANDBOX", "namespace-double")
        .env("PERCH_CACHE", Places::from_environment().cache)
        .env("TELEGRAM_TOKEN", TOKEN)
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

/// Waits at most `limit` for `child` to exit; kills it and fails the test if it does not.
pub(super) fn exits_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// SIGTERM, then at most `limit` for a clean exit; returns the stderr.
pub(super) fn stop_within(child: Child, limit: Duration) -> String {
    terminate(&child);
    let output = exits_within(child, limit, "perch run after SIGTERM");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "perch run did not stop cleanly ({}): {stderr}",
        output.status
    );
    stderr
}
