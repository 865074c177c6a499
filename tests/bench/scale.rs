//! Scale (issue 14): what distinct conversations cost `perch run` and whether it is given back.
//! The real binary runs against the suite's Telegram fake and an instant model (the suite's
//! model fake, answering every request at once), on the namespace double. Distinct users each
//! send one message in their own private chat, and each is answered before the figures are
//! read. Printed: the process's threads, open descriptors, resident size and the allocator's
//! allocated bytes (perch's `perch_heap_allocated_bytes`, from `--metrics`) after 10, 1,000 and
//! 10,000 conversations (10 and 300 under `--smoke`) and again once they have gone idle; the
//! median time to answer over the first and the last 100 conversations; and the time to restart
//! with every lane on disk, after a clean stop and after a crash. Each figure stands beside its target with a verdict; none is
//! asserted, since measuring is the point. The run stops early, and says so, when a
//! conversation is not answered in time.

#[allow(
    dead_code,
    clippy::unwrap_used,
    reason = "the suite's fakes, shared with the tests, of which this uses a part"
)]
#[path = "../suite/support/binary.rs"]
mod support;

#[allow(
    dead_code,
    clippy::unwrap_used,
    reason = "the suite's fakes, shared with the tests, of which this uses a part"
)]
#[path = "../suite/support/http.rs"]
mod http;

#[allow(
    clippy::unwrap_used,
    reason = "the suite's fakes, shared with the tests, unwrap as tests do"
)]
#[path = "../suite/support/fake_model/mod.rs"]
mod fake_model;

#[allow(
    clippy::unwrap_used,
    reason = "the suite's fakes, shared with the tests, unwrap as tests do"
)]
#[path = "../suite/support/fake_telegram/mod.rs"]
mod fake_telegram;

use fake_model::FakeModel;
use fake_telegram::{Chat, FakeTelegram, TOKEN as TELEGRAM_TOKEN, User};
use perch::agent::AgentDir;
use perch::host::Places;
use perch_core::config::Api;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How far threads and descriptors may be above their figure at 10 conversations once the
/// conversations are idle: "the same, within a small constant".
const THREADS_SLACK: u64 = 8;
const FDS_SLACK: usize = 16;
/// The restart target with every lane on disk (issue 14: 10,000 lanes under 2 s).
const RESTART_TARGET: Duration = Duration::from_secs(2);
/// The median time to answer over the last 100 conversations may be at most this many times
/// that over the first 100.
const LATENCY_RATIO_TARGET: f64 = 2.0;
/// Conversations timed one at a time at the start and at the end; the ones between go in bursts.
const TIMED: usize = 100;
const BURST: usize = 100;
/// Allocated bytes per idle conversation, past the 10th.
const ALLOCATED_PER_CONVERSATION_TARGET: f64 = 2048.0;
/// How long to wait for the conversations to go idle: longer than perch's idle lane (10 s) and
/// idle conversation (2 s) together, and than the HTTP client keeps an idle connection to the
/// platform (90 s); it ends as soon as everything has settled. The smoke run waits less.
const IDLE_WAIT: Duration = Duration::from_secs(120);
const IDLE_WAIT_SMOKE: Duration = Duration::from_secs(30);
/// How long one conversation may take to be answered before the run stops there.
const ANSWER_DEADLINE: Duration = Duration::from_secs(20);
/// Overrides how many conversations the run goes to (300 under `--smoke`, else 10,000), as in
/// `PERCH_BENCH_CONVERSATIONS=1000 cargo bench ...`; the figures are still read at 10 and 1,000.
const CONVERSATIONS_VAR: &str = "PERCH_BENCH_CONVERSATIONS";
/// The first Telegram user id; conversation `i` is user `FIRST_USER + i` in a private chat.
const FIRST_USER: i64 = 5_000_000;

/// Runs the scale benchmark (see the module documentation).
pub async fn conversations(smoke: bool) {
    let finished = tokio::task::spawn_blocking(move || measure(smoke)).await;
    if let Err(error) = finished {
        println!("scale: the benchmark panicked: {error}");
    }
}

fn measure(smoke: bool) {
    let total = std::env::var(CONVERSATIONS_VAR)
        .ok()
        .and_then(|value| value.parse::<usize>().ok())
        .filter(|&total| total > 10)
        .unwrap_or(if smoke { 300 } else { 10_000 });
    let checkpoints: Vec<usize> = [10, 1_000]
        .into_iter()
        .filter(|&checkpoint| checkpoint < total)
        .chain([total])
        .collect();
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = support::new_agent();
    let scratch = tempfile::tempdir().expect("a scratch directory");
    support::write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
    support::write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
    support::write(
        dir.path(),
        "channels/tg.lua",
        &format!(
            "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {:?}, dm = \"allow\" }}\n",
            telegram.api_url()
        ),
    );
    let notify_path = scratch.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("a notify socket");
    let stderr_path = scratch.path().join("perch-stderr.log");
    let mut perch = Perch::launch(dir.path(), &notify_path, &stderr_path);
    if let Err(why) = perch.wait_ready(&notify, Duration::from_secs(60)) {
        println!("scale: perch run did not start: {why}");
        return;
    }
    println!(
        "scale: perch run (pid {}), Telegram fake, instant model, namespace double; open files limit {}",
        perch.pid(),
        open_files_limit(perch.pid())
    );
    let mut driver = Driver {
        telegram: &telegram,
        pushed: 0,
    };
    let mut at_ten = None;
    let mut at_end = None;
    let mut first_times = Vec::new();
    let mut last_times = Vec::new();
    while driver.pushed < total {
        let done = driver.pushed;
        let answered = if done < TIMED || done >= total.saturating_sub(TIMED) {
            let elapsed = driver.one(&mut perch);
            if let Ok(elapsed) = elapsed {
                if done < TIMED {
                    first_times.push(elapsed);
                } else {
                    last_times.push(elapsed);
                }
            }
            elapsed.map(drop)
        } else {
            let next_checkpoint = checkpoints
                .iter()
                .copied()
                .find(|&checkpoint| checkpoint > done)
                .unwrap_or(total);
            let until = next_checkpoint
                .min(total.saturating_sub(TIMED))
                .min(done + BURST);
            driver.burst(&mut perch, until - done)
        };
        if let Err(why) = answered {
            let answered = telegram.sent_count();
            let figures = perch.figures();
            println!("scale: stopped after {answered} conversation(s) answered: {why}; {figures}");
            at_end = Some((answered, figures));
            break;
        }
        if checkpoints.contains(&driver.pushed) {
            let figures = perch.figures();
            println!("scale, {} conversations answered: {figures}", driver.pushed);
            if driver.pushed == 10 {
                at_ten = Some(figures);
            }
            at_end = Some((driver.pushed, figures));
        }
    }
    let reached = at_end.map_or(driver.pushed, |(answered, _)| answered);
    let idle_wait = if smoke { IDLE_WAIT_SMOKE } else { IDLE_WAIT };
    let idle = at_ten.map(|baseline| {
        let started = Instant::now();
        let settled = loop {
            let figures = perch.figures();
            if perch.gauge("perch_lanes_open") == Some(0)
                && perch.gauge("perch_conversations_active") == Some(0)
                && figures.threads <= baseline.threads + THREADS_SLACK
                && figures.fds <= baseline.fds + FDS_SLACK
            {
                break Some((figures, started.elapsed()));
            }
            if started.elapsed() >= idle_wait {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (figures, note) = match settled {
            Some((figures, after)) => (
                figures,
                format!(
                    "no lane open, no conversation active, threads and descriptors back within their slack after {after:.1?}"
                ),
            ),
            None => (
                perch.figures(),
                format!(
                    "not settled after {idle_wait:?}: perch_lanes_open {:?}, perch_conversations_active {:?}",
                    perch.gauge("perch_lanes_open"),
                    perch.gauge("perch_conversations_active")
                ),
            ),
        };
        println!("scale, {reached} conversations, then idle: {figures}; {note}");
        (baseline, figures)
    });
    if let (Some((baseline, idle)), Some((end, active))) = (idle, at_end) {
        println!(
            "scale, threads: {} at 10, {} at {end}, {} idle; target idle <= {} (at 10 + {THREADS_SLACK}): {}",
            baseline.threads,
            active.threads,
            idle.threads,
            baseline.threads + THREADS_SLACK,
            verdict(idle.threads <= baseline.threads + THREADS_SLACK)
        );
        println!(
            "scale, open descriptors: {} at 10, {} at {end}, {} idle; target idle <= {} (at 10 + {FDS_SLACK}): {}",
            baseline.fds,
            active.fds,
            idle.fds,
            baseline.fds + FDS_SLACK,
            verdict(idle.fds <= baseline.fds + FDS_SLACK)
        );
        let per_conversation = (idle.rss_kib.saturating_sub(baseline.rss_kib) as f64) * 1024.0
            / (end.saturating_sub(10).max(1) as f64);
        println!(
            "scale, RSS: {:.1} MiB at 10, {:.1} MiB at {end}, {:.1} MiB idle ({:.1} KiB per conversation past the 10th, for reference)",
            mib(baseline.rss_kib),
            mib(active.rss_kib),
            mib(idle.rss_kib),
            per_conversation / 1024.0
        );
    }
    if let (Some((baseline, idle)), Some((end, _))) = (idle, at_end) {
        match (baseline.allocated, idle.allocated) {
            (Some(at_ten), Some(at_idle)) => {
                let per_conversation = (at_idle.saturating_sub(at_ten) as f64)
                    / (end.saturating_sub(10).max(1) as f64);
                println!(
                    "scale, allocated bytes: {:.1} MiB at 10, {:.1} MiB idle after {end}: {per_conversation:.0} B per idle conversation past the 10th; target <= {ALLOCATED_PER_CONVERSATION_TARGET:.0} B: {}",
                    at_ten as f64 / 1048576.0,
                    at_idle as f64 / 1048576.0,
                    verdict(per_conversation <= ALLOCATED_PER_CONVERSATION_TARGET)
                );
            }
            _ => println!(
                "scale, allocated bytes: not measured (no perch_heap_allocated_bytes in /metrics)"
            ),
        }
    }
    let limit = open_files_limit(perch.pid());
    println!(
        "scale, answered: {reached} of {total} conversations (open files limit {limit}); target all, also under `ulimit -Hn 1024`: {}",
        verdict(reached == total)
    );
    match (median(&mut first_times), median(&mut last_times)) {
        (Some(first), Some(last)) if reached == total => {
            let ratio = last.as_secs_f64() / first.as_secs_f64().max(f64::EPSILON);
            println!(
                "scale, time to answer: median {first:.1?} over conversations 1-{}, {last:.1?} over the last {} (to {reached}), {ratio:.2}x; target <= {LATENCY_RATIO_TARGET}x: {}",
                first_times.len(),
                last_times.len(),
                verdict(ratio <= LATENCY_RATIO_TARGET)
            );
        }
        (Some(first), _) => println!(
            "scale, time to answer: median {first:.1?} over conversations 1-{}; the last {TIMED} not measured (the run stopped at {reached}); target last <= {LATENCY_RATIO_TARGET}x first: not measured",
            first_times.len()
        ),
        _ => println!("scale, time to answer: not measured (the run stopped early)"),
    }
    let lanes = lanes_on_disk(dir.path());
    let stopping = Instant::now();
    if let Err(why) = perch.stop() {
        println!("scale, restart: not measured: {why}");
        return;
    }
    let stopped = stopping.elapsed();
    let starting = Instant::now();
    perch = Perch::launch(dir.path(), &notify_path, &stderr_path);
    match perch.wait_ready(&notify, Duration::from_secs(120)) {
        Ok(()) => {
            let ready = starting.elapsed();
            println!(
                "scale, restart with {lanes} lane(s) on disk: stop {stopped:.1?}, start to READY=1 {ready:.1?}; target < {RESTART_TARGET:?}: {}",
                verdict(ready < RESTART_TARGET)
            );
            match driver.one(&mut perch) {
                Ok(_) => println!(
                    "scale, after the restart: start to a new conversation answered {:.1?}; {}",
                    starting.elapsed(),
                    perch.figures()
                ),
                Err(why) => println!("scale, after the restart: {why}"),
            }
        }
        Err(why) => println!("scale, restart with {lanes} lane(s) on disk: {why}"),
    }
    // After a crash the start cannot know which lanes were open, and reads every lane's index.
    perch.kill();
    let starting = Instant::now();
    perch = Perch::launch(dir.path(), &notify_path, &stderr_path);
    match perch.wait_ready(&notify, Duration::from_secs(120)) {
        Ok(()) => println!(
            "scale, start after a crash (SIGKILL) with {lanes} lane(s) on disk, every lane's index read: start to READY=1 {:.1?} (no target)",
            starting.elapsed()
        ),
        Err(why) => println!("scale, start after a crash: {why}"),
    }
    if let Err(why) = perch.stop() {
        println!("scale: {why}");
    }
}

/// A running `perch run`, stopped (SIGTERM, then SIGKILL) when dropped.
struct Perch {
    child: Child,
    stderr: PathBuf,
    /// Where its `/metrics` is served, once read from its stderr.
    metrics: Option<String>,
}

impl Perch {
    fn launch(dir: &Path, notify: &Path, stderr: &Path) -> Perch {
        let log = std::fs::File::create(stderr).expect("the stderr log");
        let child = Command::new(env!("CARGO_BIN_EXE_perch"))
            .arg("run")
            .arg("--metrics=127.0.0.1:0")
            .arg(dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PERCH_SANDBOX", "namespace-double")
            .env("PERCH_CACHE", Places::from_environment().cache)
            .env("TELEGRAM_TOKEN", TELEGRAM_TOKEN)
            .env("NOTIFY_SOCKET", notify)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("perch run starts");
        Perch {
            child,
            stderr: stderr.to_owned(),
            metrics: None,
        }
    }

    /// The process's figures, with the allocator's from `/metrics`.
    fn figures(&mut self) -> Figures {
        Figures {
            allocated: self.gauge("perch_heap_allocated_bytes"),
            ..Figures::of(self.pid())
        }
    }

    /// The value of the unlabelled metric `name`, scraped now.
    fn gauge(&mut self, name: &str) -> Option<u64> {
        let scrape = self.scrape()?;
        crate::procfs::gauge(&scrape, name)
    }

    fn scrape(&mut self) -> Option<String> {
        if self.metrics.is_none() {
            let text = std::fs::read_to_string(&self.stderr).ok()?;
            self.metrics = Some(crate::procfs::metrics_address(&text)?);
        }
        crate::procfs::scrape(self.metrics.as_deref()?)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ok while the process runs; why not, with the end of its stderr, once it has exited.
    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "perch run exited ({status}): {}",
                self.stderr_tail()
            )),
            Err(error) => Err(format!("perch run cannot be waited for: {error}")),
        }
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Waits for systemd's `READY=1` on `notify`, which perch sends once recovery is done and
    /// every channel's first connection attempt is over.
    fn wait_ready(&mut self, notify: &UnixDatagram, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        notify
            .set_read_timeout(Some(Duration::from_millis(20)))
            .map_err(|error| error.to_string())?;
        let mut buffer = [0_u8; 4096];
        loop {
            if let Ok(length) = notify.recv(&mut buffer)
                && String::from_utf8_lossy(&buffer[..length])
                    .lines()
                    .any(|line| line == "READY=1")
            {
                return Ok(());
            }
            self.alive()?;
            if Instant::now() >= deadline {
                return Err(format!("no READY=1 within {within:?}"));
            }
        }
    }

    /// SIGKILL, as a crash would.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) -> Result<(), String> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).map_err(|e| e.to_string())?);
        if self.alive().is_err() {
            return Ok(());
        }
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .map_err(|error| format!("perch run cannot be signalled: {error}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err("perch run did not stop within 60 s of SIGTERM".into());
                }
            }
        }
    }
}

impl Drop for Perch {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Sends conversations: each is a new user's first message in their own private chat.
struct Driver<'a> {
    telegram: &'a FakeTelegram,
    pushed: usize,
}

impl Driver<'_> {
    fn push(&mut self) {
        let id = FIRST_USER + i64::try_from(self.pushed).unwrap_or(i64::MAX - FIRST_USER);
        let user = User::human(id, &format!("User {}", self.pushed + 1));
        self.telegram
            .push_message(&Chat::private(&user), &user, "hello");
        self.pushed += 1;
    }

    /// One conversation, timed from the message to its answer.
    fn one(&mut self, perch: &mut Perch) -> Result<Duration, String> {
        let started = Instant::now();
        self.push();
        self.wait_answered(perch, ANSWER_DEADLINE)?;
        Ok(started.elapsed())
    }

    /// `count` conversations at once, until all are answered.
    fn burst(&mut self, perch: &mut Perch, count: usize) -> Result<(), String> {
        for _ in 0..count {
            self.push();
        }
        self.wait_answered(perch, ANSWER_DEADLINE * 3)
    }

    /// Until every conversation pushed has its answer.
    fn wait_answered(&self, perch: &mut Perch, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while self.telegram.sent_count() < self.pushed {
            perch.alive()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} of {} conversation(s) answered; conversation {} had no answer within {within:?}",
                    self.telegram.sent_count(),
                    self.pushed,
                    self.telegram.sent_count() + 1
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// What `/proc/<pid>` says the process holds, and the allocator's allocated bytes.
#[derive(Debug, Clone, Copy)]
struct Figures {
    threads: u64,
    fds: usize,
    rss_kib: u64,
    allocated: Option<u64>,
}

impl Figures {
    fn of(pid: u32) -> Figures {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or_default()
        };
        Figures {
            threads: field("Threads:"),
            fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count),
            rss_kib: field("VmRSS:"),
            allocated: None,
        }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "threads {}, open descriptors {}, RSS {:.1} MiB",
            self.threads,
            self.fds,
            mib(self.rss_kib)
        )?;
        match self.allocated {
            Some(bytes) => write!(formatter, ", allocated {:.1} MiB", bytes as f64 / 1048576.0),
            None => Ok(()),
        }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn median(samples: &mut [Duration]) -> Option<Duration> {
    samples.sort();
    samples.get(samples.len() / 2).copied()
}

/// The soft `Max open files` of the process, as perch left it after raising it.
fn open_files_limit(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|line| line.starts_with("Max open files"))
                .and_then(|line| {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    Some(format!("{} soft, {} hard", words.get(3)?, words.get(4)?))
                })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Lanes with a directory under `.perch/sessions/`.
fn lanes_on_disk(dir: &Path) -> usize {
    AgentDir::open(dir)
        .ok()
        .and_then(|agent| std::fs::read_dir(agent.sessions_dir()).ok())
        .map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.path().is_dir())
                .count()
        })
}
