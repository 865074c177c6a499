//! The published figures that need a running `perch run` (ignored; tests/figures.sh runs them).
//!
//! The time from process start to the first message answered; idle memory (RSS and PSS,
//! resident memory by mapping, the heap) and idle CPU with four channels connected (Telegram,
//! Discord, Matrix and Slack), with three (Slack aside) and with Telegram and Discord only; and
//! memory per agent with 1, 10 and 50 agents on one host.
//! `tests/figures.sh` runs them against the dist build (`PERCH_FIGURES_BIN`) and prints each
//! figure beside its target. Figures are not gates: a test fails only if the service does not
//! work (a process died, a channel is not `receiving`).
//!
//! Idle is the platforms' own rhythm: the Telegram fake holds `getUpdates` for the timeout perch
//! asks (Telegram allows up to 50 s), the Discord fake's HELLO announces Discord's 41,250 ms
//! heartbeat, Synapse holds `/sync` for the timeout perch asks, and the Slack fake's Socket Mode
//! sends nothing while perch pings it every 30 s. `PERCH_FIGURE_IDLE_SECS` shortens the idle
//! minute (60 s by default) to try the figures quickly.
#![allow(clippy::print_stdout)]

mod measure;

use measure::*;

use super::standin_home::{Preparation, prepare};
use super::support::fake_discord::{FakeDiscord, TOKEN as DISCORD_TOKEN};
use super::support::fake_model::{FakeModel, Script};
use super::support::fake_slack::{self, FakeSlack};
use super::support::fake_telegram::{Chat, FakeTelegram, TOKEN as TELEGRAM_TOKEN, User};
use super::support::procfs::{self, kib_field};
use super::support::status::status;
use super::support::synapse::{Account, Synapse};
use super::support::wait::Poll;
use super::support::{new_agent, write};
use perch::host::Places;
use perch_core::config::Api;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const PASSPHRASE: &str = "store-passphrase-for-figures";

/// The heartbeat interval Discord's gateway announces in HELLO.
const DISCORD_HEARTBEAT_MS: u64 = 41_250;

/// How many groups of mappings the resident breakdown prints.
const TOP_MAPPINGS: usize = 8;

const MIB: f64 = 1024.0;

/// The measured idle period: a minute, or `PERCH_FIGURE_IDLE_SECS` seconds.
fn idle_period() -> Duration {
    let secs = std::env::var("PERCH_FIGURE_IDLE_SECS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// Time for the tail of a start (key uploads, threads the runtime lets go) before the CPU
/// window opens.
fn settle_period() -> Duration {
    idle_period().min(Duration::from_secs(10))
}

/// The `perch` these figures measure.
enum Measured {
    /// This test build's, with the namespace double standing in for the microVM.
    TestBuild,
    /// `PERCH_FIGURES_BIN`: the binary users install (tests/figures.sh names the dist build),
    /// which has no test features, so it runs on the stand-in runtime's home. No figure boots a
    /// machine; `perch run` only checks at start that the runtime is there.
    Installed { binary: PathBuf, msb_home: PathBuf },
}

fn measured() -> &'static Measured {
    static MEASURED: OnceLock<Measured> = OnceLock::new();
    MEASURED.get_or_init(|| {
        let Some(binary) = std::env::var_os("PERCH_FIGURES_BIN").map(PathBuf::from) else {
            return Measured::TestBuild;
        };
        assert!(
            binary.is_file(),
            "PERCH_FIGURES_BIN {} is not a file",
            binary.display()
        );
        // A thread of its own: the three- and four-channel figures are tokio tests.
        let places = std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(prepare(Preparation::Fresh))
        })
        .join()
        .unwrap()
        .unwrap_or_else(|reason| panic!("PERCH_FIGURES_BIN needs the stand-in runtime: {reason}"));
        println!("figures of {}", binary.display());
        Measured::Installed {
            binary,
            msb_home: places.msb_home,
        }
    })
}

fn command(dir: &Path, matrix_password: Option<&str>, options: &[&str]) -> Command {
    let mut command = match measured() {
        Measured::TestBuild => {
            let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
            command.env_clear().env("PERCH_SANDBOX", "namespace-double");
            command
        }
        Measured::Installed { binary, msb_home } => {
            let mut command = Command::new(binary);
            command
                .env_clear()
                .env("MSB_HOME", msb_home)
                .env("PERCH_ASSUME_KVM", "1");
            command
        }
    };
    command
        .arg("run")
        .args(options)
        .arg(dir)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_CACHE", Places::from_environment().cache)
        .env("TELEGRAM_TOKEN", TELEGRAM_TOKEN)
        .env("DISCORD_TOKEN", DISCORD_TOKEN)
        .env("SLACK_APP_TOKEN", fake_slack::APP_TOKEN)
        .env("SLACK_BOT_TOKEN", fake_slack::BOT_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(password) = matrix_password {
        command
            .env("MATRIX_PASSWORD", password)
            .env("MATRIX_STORE_PASSPHRASE", PASSPHRASE);
    }
    command
}

fn launch(dir: &Path, matrix_password: Option<&str>) -> Child {
    command(dir, matrix_password, &[]).spawn().unwrap()
}

/// `perch run` serving `/metrics` on a free loopback port, its stderr (which names the port)
/// written to `stderr`.
fn launch_with_metrics(dir: &Path, matrix_password: Option<&str>, stderr: &Path) -> Child {
    command(dir, matrix_password, &["--metrics=127.0.0.1:0"])
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .unwrap()
}

fn signal_stop(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

fn stop(child: Child) {
    stop_all(vec![child]);
}

/// Stops every child at once, then waits for each to exit cleanly.
fn stop_all(children: Vec<Child>) {
    for child in &children {
        signal_stop(child);
    }
    for child in children {
        assert!(child.wait_with_output().unwrap().status.success());
    }
}

/// How the figures wait: for two minutes at the most, looking every millisecond unless they
/// say otherwise (the time to the first answer is one of the figures).
const FIGURES: Poll = Poll::within(Duration::from_secs(120)).every(Duration::from_millis(1));

/// Whether `perch status` shows `expected` channels, every one `receiving`.
fn channels_receiving(dir: &Path, expected: usize) -> bool {
    let channels = status(dir).channel_health.unwrap_or_default();
    channels.len() == expected
        && channels
            .iter()
            .all(|channel| channel.connection == "receiving")
}

fn assert_alive(child: &mut Child) {
    assert!(
        child.try_wait().unwrap().is_none(),
        "perch run {} exited during the figure",
        child.id()
    );
}

/// Writes back, then drops, the page cache of the measured binary before a figure starts it, so
/// the start reads it in as one after a boot does (page faults and the device's readahead)
/// rather than finding the large folios of the write that just produced it, which a fault maps
/// whole. Says what was done, with the device's readahead, which sets how much of the file a
/// fault brings in.
fn start_from_a_cold_page_cache() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let Measured::Installed { binary, .. } = measured() else {
        return None;
    };
    let file = std::fs::File::open(binary).unwrap();
    // Pages a write left dirty or under writeback stay cached through POSIX_FADV_DONTNEED; a
    // binary `strip` has just written would start warm and count as referenced in the idle
    // minute.
    file.sync_all().unwrap();
    nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
    let device = file.metadata().unwrap().dev();
    let block = format!(
        "/sys/dev/block/{}:{}",
        nix::sys::stat::major(device),
        nix::sys::stat::minor(device)
    );
    let readahead = ["queue", "../queue"]
        .iter()
        .find_map(|queue| std::fs::read_to_string(format!("{block}/{queue}/read_ahead_kb")).ok())
        .map_or_else(
            || "its device's readahead unknown".to_owned(),
            |kib| format!("its device's readahead {} KiB", kib.trim()),
        );
    Some(format!(
        "the binary's page cache dropped before the start, as after a boot; {readahead}"
    ))
}

/// Where `perch run --metrics` serves, once its stderr names it.
fn metrics_address(stderr: &Path) -> Option<String> {
    procfs::metrics_address(&std::fs::read_to_string(stderr).ok()?)
}

/// The value of the unlabelled metric `name`, scraped now.
fn scrape_gauge(address: &str, name: &str) -> Option<u64> {
    procfs::gauge(&procfs::scrape(address)?, name)
}

fn agent_with_model(model: &FakeModel) -> tempfile::TempDir {
    let dir = new_agent();
    write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
    write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
    dir
}

fn add_telegram(dir: &Path, telegram: &FakeTelegram) {
    write(
        dir,
        "channels/tg.lua",
        &format!(
            "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {:?}, dm = \"allow\" }}\n",
            telegram.api_url()
        ),
    );
}

fn telegram_and_discord(
    model: &FakeModel,
    telegram: &FakeTelegram,
    discord: &FakeDiscord,
) -> tempfile::TempDir {
    let dir = agent_with_model(model);
    add_telegram(dir.path(), telegram);
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

fn add_matrix(dir: &Path, bot: &Account) {
    write(
        dir,
        "channels/mx.lua",
        &format!(
            "channel {{ kind = \"matrix\", homeserver = {:?}, user = {:?}, password = env \"MATRIX_PASSWORD\", store_passphrase = env \"MATRIX_STORE_PASSPHRASE\" }}\n",
            bot.url, bot.user_id
        ),
    );
}

fn add_slack(dir: &Path, slack: &FakeSlack) {
    write(
        dir,
        "channels/sl.lua",
        &format!(
            "channel {{ kind = \"slack\", app_token = env \"SLACK_APP_TOKEN\", bot_token = env \"SLACK_BOT_TOKEN\", api_url = {:?} }}\n",
            slack.api_url()
        ),
    );
}

#[test]
#[ignore = "a published figure: run by tests/figures.sh against the dist build"]
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
        FIGURES.until("the answer", || !telegram.sent().is_empty());
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

/// The channels of an idle figure: the fakes stay up for the whole measurement.
struct IdleSetup<'a> {
    dir: &'a Path,
    matrix_password: Option<&'a str>,
    telegram: &'a FakeTelegram,
    discord: &'a FakeDiscord,
    slack: Option<&'a FakeSlack>,
    channels: usize,
    /// How the figure names the channels, in full and short.
    label: &'a str,
    short: &'a str,
    rss_target: &'a str,
}

/// What the Slack fake has seen of perch's socket: its pings and the sockets it opened.
struct SlackRhythm {
    pings: usize,
    connections_opened: usize,
}

impl SlackRhythm {
    fn of(slack: &FakeSlack) -> SlackRhythm {
        SlackRhythm {
            pings: slack.pings(),
            connections_opened: slack.connections_opened(),
        }
    }

    fn since(&self, before: &SlackRhythm) -> SlackRhythm {
        SlackRhythm {
            pings: self.pings - before.pings,
            connections_opened: self.connections_opened - before.connections_opened,
        }
    }
}

/// Starts `perch run`, waits until every channel is `receiving` and the start has settled, then
/// measures a period without traffic: CPU and context switches over it, memory at its end.
fn idle_figures(setup: &IdleSetup<'_>) {
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let cold_start = start_from_a_cold_page_cache();
    let mut child = launch_with_metrics(setup.dir, setup.matrix_password, stderr.path());
    let pid = child.id();
    FIGURES.until("Telegram polling", || {
        !setup.telegram.poll_offsets().is_empty()
    });
    FIGURES.until("the Discord gateway", || setup.discord.live_sessions() > 0);
    if let Some(slack) = setup.slack {
        FIGURES.until("Slack's socket", || slack.live_connections() > 0);
    }
    FIGURES
        .every(Duration::from_millis(50))
        .until("every channel receiving", || {
            channels_receiving(setup.dir, setup.channels)
        });
    let address = metrics_address(stderr.path()).expect("perch run names its metrics address");
    let connected = Instant::now();
    std::thread::sleep(settle_period());

    let polls_before = setup.telegram.poll_offsets().len();
    let heartbeats_before = setup.discord.heartbeats();
    let slack_before = setup.slack.map(SlackRhythm::of);
    clear_referenced(pid);
    let start = cpu_sample(pid);
    // The figure is what perch does during this period without traffic.
    std::thread::sleep(idle_period());
    let end = cpu_sample(pid);
    let polls = setup.telegram.poll_offsets().len() - polls_before;
    let heartbeats = setup.discord.heartbeats() - heartbeats_before;
    let slack_window = setup
        .slack
        .zip(slack_before)
        .map(|(slack, before)| SlackRhythm::of(slack).since(&before));
    assert_alive(&mut child);

    let total = resident(pid);
    let groups = breakdown(pid);
    let allocated = scrape_gauge(&address, "perch_heap_allocated_bytes");
    assert!(
        channels_receiving(setup.dir, setup.channels),
        "a channel stopped receiving during the idle period: {:?}",
        status(setup.dir).channel_health
    );
    let poll_timeout = setup
        .telegram
        .calls()
        .iter()
        .rev()
        .find(|call| call.method.eq_ignore_ascii_case("getUpdates"))
        .and_then(|call| call.body.get("timeout").and_then(Value::as_u64))
        .unwrap_or(0);
    stop(child);

    let (label, short) = (setup.label, setup.short);
    let mib = |kib: u64| kib as f64 / MIB;
    println!(
        "idle RSS and PSS of perch run, {label}, after {} s: RSS {:.1} MiB, PSS {:.1} MiB; target RSS {}",
        connected.elapsed().as_secs(),
        mib(total.rss_kib),
        mib(total.pss_kib),
        setup.rss_target
    );
    if let Some(cold_start) = &cold_start {
        println!("idle RSS and PSS of perch run, {short}: {cold_start}");
    }
    let text = groups
        .iter()
        .find(|(name, _)| name == "perch binary, text (r-x)")
        .map(|(_, group)| *group)
        .unwrap_or_default();
    println!(
        "idle working set, {short}: {:.1} MiB of the {:.1} MiB RSS referenced during the {} s without traffic (accessed bits cleared at its start), {:.1} MiB of it the binary's text ({:.1} MiB resident)",
        mib(total.referenced_kib),
        mib(total.rss_kib),
        idle_period().as_secs(),
        mib(text.referenced_kib),
        mib(text.rss_kib)
    );
    let mut attributed = 0;
    for (rank, (name, group)) in groups.iter().take(TOP_MAPPINGS).enumerate() {
        attributed += group.rss_kib;
        println!(
            "idle RSS by mapping, {short}: {}. {name}: RSS {:.1} MiB ({:.1}% of RSS), PSS {:.1} MiB",
            rank + 1,
            mib(group.rss_kib),
            100.0 * group.rss_kib as f64 / total.rss_kib as f64,
            mib(group.pss_kib)
        );
    }
    println!(
        "idle RSS by mapping, {short}: the top {} of {} groups hold {:.1}% of {:.1} MiB RSS",
        groups.len().min(TOP_MAPPINGS),
        groups.len(),
        100.0 * attributed as f64 / total.rss_kib as f64,
        mib(total.rss_kib)
    );
    let heap_rss: u64 = groups
        .iter()
        .filter(|(name, _)| name == "[heap]" || name == THREAD_ARENAS)
        .map(|(_, group)| group.rss_kib)
        .sum();
    match allocated {
        Some(bytes) => println!(
            "idle heap, {short}: {:.1} MiB allocated (perch_heap_allocated_bytes) against {:.1} MiB resident in [heap] and {THREAD_ARENAS}",
            bytes as f64 / MIB / MIB,
            mib(heap_rss)
        ),
        None => println!(
            "idle heap, {short}: allocated bytes not measured (no perch_heap_allocated_bytes); {:.1} MiB resident in [heap] and {THREAD_ARENAS}",
            mib(heap_rss)
        ),
    }
    let cpu = idle_cpu(&start, &end);
    let seconds = cpu.elapsed.as_secs_f64();
    let per_minute = |value: f64| value * 60.0 / seconds;
    println!(
        "idle CPU of perch run, {label}: {:.1} ms per minute (utime+stime {} ms over {seconds:.1} s; {:.1} ms on CPU by schedstat); target <= 50 ms per minute",
        per_minute(cpu.cpu_ms as f64),
        cpu.cpu_ms,
        cpu.on_cpu.on_cpu_ns as f64 / 1e6
    );
    let slack_rhythm = slack_window.map_or_else(String::new, |window| {
        format!(
            ", {} Slack pings (perch's, every 30 s), {} Slack sockets opened",
            window.pings, window.connections_opened
        )
    });
    println!(
        "idle wakeups of perch run, {short}: {:.0} context switches per minute ({} voluntary, {} involuntary over {seconds:.1} s; threads {} at start, {} at end, {} ended uncounted); in the window {polls} getUpdates (timeout {poll_timeout} s), {heartbeats} Discord heartbeats (interval {DISCORD_HEARTBEAT_MS} ms){slack_rhythm}",
        per_minute((cpu.on_cpu.voluntary + cpu.on_cpu.involuntary) as f64),
        cpu.on_cpu.voluntary,
        cpu.on_cpu.involuntary,
        cpu.threads_at_start,
        cpu.threads_at_end,
        cpu.ended
    );
    let by_thread: Vec<String> = cpu
        .switches_by_thread
        .iter()
        .map(|(name, switches)| format!("{name} {switches}"))
        .collect();
    println!(
        "idle wakeups by thread, {short}, context switches over {seconds:.1} s: {}",
        by_thread.join(", ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a published figure: run by tests/figures.sh against the dist build, with Synapse"]
async fn figure_idle_with_three_channels_connected() {
    let synapse = Synapse::from_env();
    let bot = synapse.register("figures-bot").await;
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let discord = FakeDiscord::start();
    discord.set_heartbeat_interval(DISCORD_HEARTBEAT_MS);
    let dir = telegram_and_discord(&model, &telegram, &discord);
    add_matrix(dir.path(), &bot);
    tokio::task::spawn_blocking(move || {
        idle_figures(&IdleSetup {
            dir: dir.path(),
            matrix_password: Some(&bot.password),
            telegram: &telegram,
            discord: &discord,
            slack: None,
            channels: 3,
            label: "three channels connected (Telegram and Discord fakes, Synapse)",
            short: "three channels",
            rss_target: "<= 20 MB (<= 35 MB with Matrix's encrypted stores open)",
        });
        drop(model);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a published figure: run by tests/figures.sh against the dist build, with Synapse"]
async fn figure_idle_with_four_channels_connected() {
    let synapse = Synapse::from_env();
    let bot = synapse.register("figures-bot").await;
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let discord = FakeDiscord::start();
    discord.set_heartbeat_interval(DISCORD_HEARTBEAT_MS);
    let slack = FakeSlack::start();
    let dir = telegram_and_discord(&model, &telegram, &discord);
    add_matrix(dir.path(), &bot);
    add_slack(dir.path(), &slack);
    tokio::task::spawn_blocking(move || {
        idle_figures(&IdleSetup {
            dir: dir.path(),
            matrix_password: Some(&bot.password),
            telegram: &telegram,
            discord: &discord,
            slack: Some(&slack),
            channels: 4,
            label: "four channels connected (Telegram, Discord and Slack fakes, Synapse)",
            short: "four channels",
            rss_target: "<= 20 MB (<= 35 MB with Matrix's encrypted stores open)",
        });
        drop(model);
    })
    .await
    .unwrap();
}

#[test]
#[ignore = "a published figure: run by tests/figures.sh against the dist build"]
fn figure_idle_with_telegram_and_discord_connected() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let discord = FakeDiscord::start();
    discord.set_heartbeat_interval(DISCORD_HEARTBEAT_MS);
    let dir = telegram_and_discord(&model, &telegram, &discord);
    idle_figures(&IdleSetup {
        dir: dir.path(),
        matrix_password: None,
        telegram: &telegram,
        discord: &discord,
        slack: None,
        channels: 2,
        label: "Telegram and Discord connected (fakes)",
        short: "Telegram and Discord",
        rss_target: "<= 20 MB",
    });
}

/// `count` idle agents on one host, each its own `perch run` with one Telegram channel (each
/// its own fake, so no two poll one bot), no VM booted: memory per agent once they have idled.
fn agents_per_host(count: usize) {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let fakes: Vec<FakeTelegram> = (0..count).map(|_| FakeTelegram::start()).collect();
    let dirs: Vec<tempfile::TempDir> = fakes
        .iter()
        .map(|telegram| {
            let dir = agent_with_model(&model);
            add_telegram(dir.path(), telegram);
            dir
        })
        .collect();
    let cold_start = start_from_a_cold_page_cache();
    let mut children: Vec<Child> = dirs.iter().map(|dir| launch(dir.path(), None)).collect();
    for (dir, telegram) in dirs.iter().zip(&fakes) {
        FIGURES
            .every(Duration::from_millis(20))
            .until("Telegram polling", || !telegram.poll_offsets().is_empty());
        FIGURES
            .every(Duration::from_millis(50))
            .until("the channel receiving", || {
                channels_receiving(dir.path(), 1)
            });
    }
    // The figure is the memory of agents that have idled for this period.
    std::thread::sleep(idle_period());
    let mut total = Resident::default();
    for child in &mut children {
        assert_alive(child);
        total.add(resident(child.id()));
    }
    for dir in &dirs {
        assert!(
            channels_receiving(dir.path(), 1),
            "an agent stopped receiving"
        );
    }
    stop_all(children);
    let per_agent = |kib: u64| kib as f64 / MIB / count as f64;
    println!(
        "agents per host: {count} idle perch run (one Telegram channel each, no VM booted), after {} s: PSS {:.1} MiB per agent, RSS {:.1} MiB per agent (PSS {:.1} MiB in all); target PSS <= 20 MB per agent at 50 agents",
        idle_period().as_secs(),
        per_agent(total.pss_kib),
        per_agent(total.rss_kib),
        total.pss_kib as f64 / MIB
    );
    if let Some(cold_start) = cold_start {
        println!("agents per host: {count} agents, {cold_start}");
    }
}

#[test]
#[ignore = "a published figure: run by tests/figures.sh against the dist build"]
fn figure_memory_per_agent_with_1_10_and_50_agents() {
    for count in [1, 10, 50] {
        agents_per_host(count);
    }
}
