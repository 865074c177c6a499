//! The published figures that need a running `perch run`: idle memory with three channels
//! connected, and the time from process start to the first message answered. Ignored in normal
//! runs; `tests/figures.sh` runs them in a release build and prints each figure beside its
//! target. Figures are not gates: the test fails only if the service does not work.
#![allow(clippy::print_stdout)]

use super::fake_discord::{FakeDiscord, TOKEN as DISCORD_TOKEN};
use super::fake_model::{FakeModel, Script};
use super::fake_telegram::{Chat, FakeTelegram, TOKEN as TELEGRAM_TOKEN, User};
use super::support::{new_agent, write};
use super::synapse::Synapse;
use perch::doctor::Places;
use perch_core::config::Api;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PASSPHRASE: &str = "store-passphrase-for-figures";

fn launch(dir: &Path, matrix_password: Option<&str>) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(["run", dir.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_SANDBOX", "namespace-double")
        .env("PERCH_CACHE", Places::from_environment().cache)
        .env("TELEGRAM_TOKEN", TELEGRAM_TOKEN)
        .env("DISCORD_TOKEN", DISCORD_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(password) = matrix_password {
        command
            .env("MATRIX_PASSWORD", password)
            .env("MATRIX_STORE_PASSPHRASE", PASSPHRASE);
    }
    command.spawn().unwrap()
}

fn stop(child: Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn telegram_and_discord(
    model: &FakeModel,
    telegram: &FakeTelegram,
    discord: &FakeDiscord,
) -> tempfile::TempDir {
    let dir = new_agent();
    write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
    write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
    write(
        dir.path(),
        "channels/tg.lua",
        &format!(
            "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {:?}, dm = \"allow\" }}\n",
            telegram.api_url()
        ),
    );
    write(
        dir.path(),
        "channels/dc.lua",
        &format!(
            "channel {{ kind = \"discord\", token = env \"DISCORD_TOKEN\", api_url = {:?} }}\n",
            discord.url()
        ),
    );
    dir
}

#[test]
#[ignore = "a published figure: run by tests/figures.sh in a release build"]
fn figure_start_to_first_message_answered() {
    let mut timings = Vec::new();
    for round in 0..5 {
        let model = FakeModel::start(Api::OpenAiCompletions);
        let telegram = FakeTelegram::start();
        let discord = FakeDiscord::start();
        let dir = telegram_and_discord(&model, &telegram, &discord);
        model.push(Script::text("here"));
        let alice = User::human(42, "Alice");
        telegram.push_message(&Chat::private(&alice), &alice, &format!("round {round}"));
        let started = Instant::now();
        let child = launch(dir.path(), None);
        wait_until("the answer", || !telegram.sent().is_empty());
        timings.push(started.elapsed());
        stop(child);
    }
    timings.sort();
    println!(
        "start to first message answered (Telegram fake, fake model, no VM): median {:.0} ms of 5 (min {:.0} ms, max {:.0} ms); target <= 300 ms",
        timings[2].as_secs_f64() * 1000.0,
        timings[0].as_secs_f64() * 1000.0,
        timings[4].as_secs_f64() * 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a published figure: run by tests/figures.sh in a release build, with Synapse"]
async fn figure_idle_memory_with_three_channels_connected() {
    let synapse = Synapse::from_env();
    let bot = synapse.register("figures-bot").await;
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let discord = FakeDiscord::start();
    let dir = telegram_and_discord(&model, &telegram, &discord);
    write(
        dir.path(),
        "channels/mx.lua",
        &format!(
            "channel {{ kind = \"matrix\", homeserver = {:?}, user = {:?}, password = env \"MATRIX_PASSWORD\", store_passphrase = env \"MATRIX_STORE_PASSPHRASE\" }}\n",
            bot.url, bot.user_id
        ),
    );
    let child = launch(dir.path(), Some(&bot.password));
    let session = dir.path().join(".perch/matrix/mx/session.json");
    let pid = child.id();
    tokio::task::spawn_blocking(move || {
        wait_until("Telegram polling", || !telegram.poll_offsets().is_empty());
        wait_until("the Discord gateway", || discord.live_sessions() > 0);
        wait_until("the Matrix login", || session.exists());
        // The figure is defined as the memory after a minute without traffic.
        std::thread::sleep(Duration::from_secs(60));
        println!(
            "idle RSS of perch run, three channels connected (Telegram and Discord fakes, Synapse), after 60 s: {:.1} MiB; target <= 20 MB",
            rss_mib(pid)
        );
        (telegram, discord)
    })
    .await
    .unwrap();
    stop(child);
}
