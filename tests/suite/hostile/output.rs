//! A guest flooding output: a bounded head and tail on the host, timeouts and cancellation.

use super::super::support::fake_model::{Reply, Script};
use super::super::support::procfs::status_kib;
use super::super::support::scenario::{Scenario, alice};
use super::super::support::wait::{Poll, wait_until};
use super::super::support::{new_agent, stderr, stdout, write};
use super::{exits_within, perch_on_the_double};
use std::path::Path;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// What the host keeps of each of a command's two streams.
const CAP_BYTES: u64 = 2 * 1024 * 1024;
/// perch's own peak resident size on the double, flood or no flood, with room to spare.
const BASELINE_BYTES: u64 = 64 * 1024 * 1024;

const TOOLS: &str = r#"
tool("flood", {
  description = "ctx.sh on a command that prints 3 MB",
  run = function(args, ctx)
    local out, code = ctx.sh("head -c 3000000 /dev/zero | tr '\\0' y")
    return #out .. "|" .. code .. "|" .. out:sub(524289, 524289 + 120)
  end,
})

tool("slow", {
  description = "ctx.sh on a command that outlives its timeout",
  run = function(args, ctx)
    local out, code = ctx.sh("echo started; sleep 30; echo never", { timeout = 1 })
    return out .. "|" .. code
  end,
})

tool("long", {
  description = "A result too long for the model, kept in the guest",
  run = function(args, ctx)
    return string.rep("x", 100000)
  end,
})
"#;

fn perch(args: &[&str]) -> Output {
    perch_on_the_double(args).output().unwrap()
}

fn agent() -> tempfile::TempDir {
    let dir = new_agent();
    write(dir.path(), "tools/hostile.lua", TOOLS);
    dir
}

/// The process's peak resident size (`VmHWM`), sampled until it exits, and its output.
fn peak_rss_until_exit(mut child: Child) -> (u64, Output) {
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "perch did not finish");
        if let Ok(text) = std::fs::read_to_string(&status) {
            let kib = status_kib(&text, "VmHWM:");
            peak = peak.max(kib.unwrap_or(0) * 1024);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (peak, child.wait_with_output().unwrap())
}

fn path_in(text: &str, suffix: &str) -> String {
    let start = text
        .find("/var/tmp/perch/")
        .unwrap_or_else(|| panic!("no kept file named in {text}"));
    let end = start + text[start..].find(suffix).unwrap() + suffix.len();
    text[start..end].to_owned()
}

#[test]
fn a_flooding_command_keeps_host_memory_bounded_and_its_whole_output_in_the_guest() {
    let dir = agent();
    let path = dir.path().to_str().unwrap();
    let flood = 200_000_000u64;
    let arguments = format!(r#"{{"command": "yes | head -c {flood}"}}"#);
    let child = perch_on_the_double(&["tool", path, "bash", "--args", &arguments])
        .spawn()
        .unwrap();
    let (peak, output) = peak_rss_until_exit(child);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        peak < CAP_BYTES + BASELINE_BYTES,
        "perch peaked at {} MiB while the guest printed {} MB",
        peak >> 20,
        flood / 1_000_000
    );
    let text = stdout(&output);
    assert!(text.starts_with("y\ny\ny\n"), "{}", &text[..100]);
    assert!(text.trim_end().ends_with("y\ny\ny"), "the tail is there");
    assert!(text.chars().count() <= 24_000, "{}", text.len());
    let mark = text.lines().find(|line| line.starts_with("[... ")).unwrap();
    let shown = (text.len() - mark.len() - 2) as u64;
    assert!(
        text.contains(&format!(
            "[... {} of {flood} bytes left out; the whole output is in /var/tmp/perch/",
            flood - shown
        )),
        "{mark}"
    );
    let kept = path_in(&text, ".out");
    let size = perch(&["exec", path, "--", "wc", "-c", "<", &kept]);
    assert_eq!(stdout(&size).trim(), flood.to_string(), "{}", stderr(&size));
}

#[test]
fn ctx_sh_marks_what_it_left_out() {
    let dir = agent();
    let output = perch(&["tool", dir.path().to_str().unwrap(), "flood"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let fields: Vec<&str> = text.splitn(3, '|').collect();
    let kept: usize = fields[0].parse().unwrap();
    assert!(kept < 1_100_000, "ctx.sh returned {kept} bytes of 3 MB");
    assert_eq!(fields[1], "0");
    assert!(
        fields[2].starts_with("\n[... 1951424 of 3000000 bytes of stdout left out ...]\nyyy"),
        "{text}"
    );
}

#[test]
fn ctx_sh_times_out() {
    let dir = agent();
    let started = Instant::now();
    let output = perch(&["tool", dir.path().to_str().unwrap(), "slow"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        stdout(&output),
        "started\n[ctx.sh timed out after 1 s and killed]|124\n"
    );
}

/// The guest replaces `cat`, which the command that keeps a long result in the guest uses, by
/// one that never ends (and says when it starts).
fn plant_a_hanging_cat(dir: &Path) {
    let plant = perch(&[
        "exec",
        dir.to_str().unwrap(),
        "--",
        "printf '#!/bin/sh\\ntouch /workspace/cat-started\\nexec sleep 600\\n' > /usr/local/bin/cat && chmod +x /usr/local/bin/cat",
    ]);
    assert!(plant.status.success(), "{}", stderr(&plant));
}

/// `perch tool DIR long` started on an agent whose `cat` hangs: the agent, and the process.
fn the_long_tool_started() -> (tempfile::TempDir, std::process::Child) {
    let dir = agent();
    plant_a_hanging_cat(dir.path());
    let child = perch_on_the_double(&["tool", dir.path().to_str().unwrap(), "long"])
        .spawn()
        .unwrap();
    (dir, child)
}

#[test]
fn keeping_a_long_result_in_the_guest_times_out() {
    let (_dir, child) = the_long_tool_started();
    let started = Instant::now();
    let output = exits_within(child, Duration::from_secs(60), "perch tool long");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("timed out after 10 s"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn cancelling_reaches_the_command_that_keeps_a_long_result() {
    let (dir, child) = the_long_tool_started();
    let marker = dir.path().join("workspace/cat-started");
    Poll::within(Duration::from_secs(60)).until("the keep command to start", || marker.exists());
    let interrupted = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let output = exits_within(child, Duration::from_secs(60), "perch tool long");
    assert!(
        interrupted.elapsed() < Duration::from_secs(5),
        "perch took {:?} to stop after the interrupt",
        interrupted.elapsed()
    );
    assert!(stderr(&output).contains("cancelled"), "{}", stderr(&output));
}

#[test]
fn stop_in_chat_reaches_the_command_that_keeps_a_long_result() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    agent.write("tools/hostile.lua", TOOLS);
    plant_a_hanging_cat(agent.path());
    model.push(Script::Reply(Reply::new().with_call(
        "call_long",
        "long",
        serde_json::json!({}),
    )));
    let service = agent.start();
    agent.send(&alice(), "make something long");
    wait_until("the keep command", || {
        agent.path().join("workspace/cat-started").exists()
    });
    agent.send(&alice(), "/stop");
    wait_until("the stop to be confirmed", || {
        telegram.has_shown("Stopped.")
    });
    model.push(Script::text("still here"));
    agent.send(&alice(), "are you there?");
    wait_until("the next message to be answered", || {
        telegram.has_shown("still here")
    });
    service.stop();
}
