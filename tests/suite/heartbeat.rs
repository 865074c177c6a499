//! Heartbeats: the scheduler on paused time, and `perch heartbeat` with and without `perch run`.

use super::support::fake_model::Script;
use super::support::scenario::{Agent, Scenario};
use super::support::status::Report;
use super::support::wait::Poll;
use super::support::{new_agent, stderr, stdout, write};
use chrono::{TimeZone, Timelike, Utc};
use perch::agent::AgentDir;
use perch::heartbeat::{self, Heartbeats, Job, JobEnd, Ledger, Mode, SchedulerSetup};
use perch::host::clock::Clock;
use perch_core::Timestamp;
use perch_core::control::HeartbeatList;
use perch_core::heartbeat::{HeartbeatEnv, LedgerRecord, SlotOutcome, TargetSpec};
use perch_core::name::{ChannelName, RoomAlias};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A clock that reads tokio's (paused) time, starting at `start`.
fn tokio_clock(start: Timestamp) -> Clock {
    let base = tokio::time::Instant::now();
    Clock::new(move || start + chrono::Duration::from_std(base.elapsed()).unwrap())
}

fn env() -> HeartbeatEnv {
    HeartbeatEnv {
        host_tz: chrono_tz::Tz::UTC,
        targets: vec![TargetSpec {
            channel: ChannelName::try_from("ops").unwrap(),
            room: RoomAlias::try_from("standup").unwrap(),
        }],
        models: Vec::new(),
        channels_on_disk: None,
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Fired {
    task: String,
    slot: Timestamp,
    coalesced: u32,
    mode: Mode,
}

/// Records every job; a job of a task in `hold` never ends (a run in progress at a crash).
#[derive(Clone, Default)]
struct Recorder {
    fired: Arc<Mutex<Vec<Fired>>>,
    hold: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn run_job(&self) -> heartbeat::RunJob {
        let recorder = self.clone();
        Arc::new(move |job: Job| {
            let recorder = recorder.clone();
            Box::pin(async move {
                recorder.fired.lock().unwrap().push(Fired {
                    task: job.task.name.to_string(),
                    slot: job.slot,
                    coalesced: job.coalesced,
                    mode: job.mode,
                });
                if recorder
                    .hold
                    .lock()
                    .unwrap()
                    .contains(&job.task.name.to_string())
                {
                    std::future::pending::<()>().await;
                }
                JobEnd {
                    outcome: SlotOutcome::Silent,
                    reply: "SILENCE".into(),
                    stop: None,
                }
            })
        })
    }

    fn slots(&self, task: &str) -> Vec<Timestamp> {
        self.fired
            .lock()
            .unwrap()
            .iter()
            .filter(|fired| fired.task == task && fired.mode == Mode::Scheduled)
            .map(|fired| fired.slot)
            .collect()
    }
}

/// Opens the ledger, retrying while a stopped scheduler lets go of it.
async fn open_ledger(dir: &AgentDir, clock: Clock) -> (Ledger, Vec<(u64, LedgerRecord)>) {
    // Paused time moves on while this waits, so a scheduler still waiting for a run that will
    // never end gives up and lets go of the ledger.
    Poll::within(Duration::from_secs(10))
        .every(Duration::from_millis(10))
        .value_async("the ledger to be let go", || {
            Ledger::open(dir, clock.clone()).ok()
        })
        .await
}

async fn start(
    dir: &AgentDir,
    clock: Clock,
    recorder: &Recorder,
) -> (Heartbeats, CancellationToken) {
    let (ledger, records) = open_ledger(dir, clock.clone()).await;
    let shutdown = CancellationToken::new();
    let setup = SchedulerSetup {
        dir: dir.clone(),
        env: env(),
        clock,
        reload_every: Duration::from_secs(60),
        run_job: recorder.run_job(),
        on_stop: None,
        scheduled: true,
    };
    (
        heartbeat::start(setup, ledger, records, shutdown.clone()),
        shutdown,
    )
}

/// Lets paused time pass a minute at a time. After each minute it waits for the scheduler to
/// answer, so the scheduler has finished what was due (the ledger's fsync happens on another
/// thread, and paused time would otherwise run on while it waits).
async fn pass(heartbeats: &Heartbeats, duration: Duration) {
    let mut left = duration;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(60));
        tokio::time::sleep(step).await;
        heartbeats.list().await.unwrap();
        left -= step;
    }
}

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> Timestamp {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

const WEEK: &str = r#"tasks:
  - name: digest
    prompt: Post the stand-up digest.
    cron: "0 9 * * Mon-Fri"
    tz: Europe/Berlin
    delivery: ops:standup
  - name: prs
    prompt: Check the open pull requests; stay silent unless one needs a human.
    every: 1h
    tz: Europe/Berlin
    active_hours: "08:00-18:00"
  - name: nightly
    prompt: Tidy the notes.
    cron: "30 2 * * *"
    tz: Europe/Berlin
  - name: off
    prompt: Never.
    every: 30m
    enabled: false
"#;

#[tokio::test(start_paused = true)]
async fn a_simulated_week_fires_every_slot_once_across_a_dst_change() {
    let agent = new_agent();
    write(agent.path(), "workspace/HEARTBEAT.yml", WEEK);
    let dir = AgentDir::open(agent.path()).unwrap();
    // Thursday 22 October 2026, 12:00:30 UTC; Berlin leaves summer time on Sunday the 25th.
    let clock = tokio_clock(utc(2026, 10, 22, 12, 0) + chrono::Duration::seconds(30));
    let recorder = Recorder::default();
    let (heartbeats, shutdown) = start(&dir, clock, &recorder).await;
    pass(&heartbeats, Duration::from_secs(7 * 24 * 3600 - 45 * 60)).await;
    shutdown.cancel();

    // 09:00 in Berlin on weekdays: 07:00 UTC in summer time, 08:00 UTC after the change.
    assert_eq!(
        recorder.slots("digest"),
        vec![
            utc(2026, 10, 23, 7, 0),
            utc(2026, 10, 26, 8, 0),
            utc(2026, 10, 27, 8, 0),
            utc(2026, 10, 28, 8, 0),
            utc(2026, 10, 29, 8, 0),
        ]
    );
    // 02:30 happens twice on the 25th (summer time, then winter time): it fires once.
    assert_eq!(
        recorder.slots("nightly"),
        vec![
            utc(2026, 10, 23, 0, 30),
            utc(2026, 10, 24, 0, 30),
            utc(2026, 10, 25, 0, 30),
            utc(2026, 10, 26, 1, 30),
            utc(2026, 10, 27, 1, 30),
            utc(2026, 10, 28, 1, 30),
            utc(2026, 10, 29, 1, 30),
        ]
    );
    // Hourly, epoch-aligned, only from 08:00 to 18:00 Berlin time.
    let berlin = chrono_tz::Europe::Berlin;
    let mut expected = Vec::new();
    let mut at = utc(2026, 10, 22, 13, 0);
    while at < utc(2026, 10, 29, 11, 15) {
        let local = at.with_timezone(&berlin).hour();
        if (8..18).contains(&local) {
            expected.push(at);
        }
        at += chrono::Duration::hours(1);
    }
    assert_eq!(recorder.slots("prs"), expected);
    assert!(
        recorder.slots("off").is_empty(),
        "a disabled task never runs"
    );
}

const HOURLY: &str = r#"tasks:
  - name: hourly
    prompt: Look around.
    every: 1h
"#;

#[tokio::test(start_paused = true)]
async fn a_restart_mid_slot_does_not_repeat_it_and_downtime_coalesces_into_one_run() {
    let agent = new_agent();
    write(agent.path(), "workspace/HEARTBEAT.yml", HOURLY);
    let dir = AgentDir::open(agent.path()).unwrap();
    let clock = tokio_clock(utc(2026, 3, 1, 10, 0) + chrono::Duration::seconds(30));
    let recorder = Recorder::default();
    recorder.hold.lock().unwrap().push("hourly".into());
    let (heartbeats, shutdown) = start(&dir, clock.clone(), &recorder).await;
    pass(&heartbeats, Duration::from_secs(3600)).await;
    assert_eq!(recorder.slots("hourly"), vec![utc(2026, 3, 1, 11, 0)]);
    // perch stops while the 11:00 run is in progress, and stays down for five hours.
    shutdown.cancel();
    tokio::time::advance(Duration::from_secs(5 * 3600)).await;
    recorder.hold.lock().unwrap().clear();
    recorder.fired.lock().unwrap().clear();

    let (heartbeats, shutdown) = start(&dir, clock.clone(), &recorder).await;
    pass(&heartbeats, Duration::from_secs(120)).await;
    let fired = recorder.fired.lock().unwrap().clone();
    assert_eq!(
        fired,
        vec![Fired {
            task: "hourly".into(),
            slot: utc(2026, 3, 1, 16, 0),
            coalesced: 4,
            mode: Mode::Scheduled,
        }],
        "the 12:00 to 16:00 slots fold into one run; the interrupted 11:00 one is not repeated"
    );
    let list = serde_json::to_value(heartbeats.list().await.unwrap()).unwrap();
    assert_eq!(list["tasks"][0]["last"]["outcome"], "silent");
    assert_eq!(list["tasks"][0]["next"], "2026-03-01T17:00:00+00:00");
    pass(&heartbeats, Duration::from_secs(3600)).await;
    assert_eq!(
        recorder.slots("hourly"),
        vec![utc(2026, 3, 1, 16, 0), utc(2026, 3, 1, 17, 0)]
    );
    shutdown.cancel();
    drop(heartbeats);

    let state = heartbeat::peek_ledger(&dir).unwrap();
    let task = state
        .task(&perch_core::name::TaskName::try_from("hourly").unwrap())
        .unwrap();
    assert!(task.open.is_empty(), "no run is left open: {task:?}");
    let ledger = std::fs::read_dir(dir.heartbeat_ledger_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap_or_default())
        .collect::<String>();
    assert!(
        ledger.contains("\"interrupted\""),
        "the 11:00 run is recorded as interrupted: {ledger}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_invalid_edit_keeps_the_last_good_schedule_and_a_valid_one_takes_over() {
    let agent = new_agent();
    write(agent.path(), "workspace/HEARTBEAT.yml", HOURLY);
    let dir = AgentDir::open(agent.path()).unwrap();
    let clock = tokio_clock(utc(2026, 6, 1, 10, 0) + chrono::Duration::seconds(30));
    let recorder = Recorder::default();
    let (heartbeats, shutdown) = start(&dir, clock, &recorder).await;
    pass(&heartbeats, Duration::from_secs(3600)).await;
    assert_eq!(recorder.slots("hourly"), vec![utc(2026, 6, 1, 11, 0)]);

    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    cron: \"0 25 * * *\"\n",
    );
    pass(&heartbeats, Duration::from_secs(120)).await;
    let list = serde_json::to_value(heartbeats.list().await.unwrap()).unwrap();
    let error = list["reload_error"].as_str().unwrap();
    assert!(
        error.contains("workspace/HEARTBEAT.yml:4"),
        "the error names the file and line: {error}"
    );
    pass(&heartbeats, Duration::from_secs(3600)).await;
    assert_eq!(
        recorder.slots("hourly"),
        vec![utc(2026, 6, 1, 11, 0), utc(2026, 6, 1, 12, 0)],
        "the last good schedule kept running"
    );

    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 20m\n",
    );
    pass(&heartbeats, Duration::from_secs(3600)).await;
    let list = serde_json::to_value(heartbeats.list().await.unwrap()).unwrap();
    assert!(list["reload_error"].is_null());
    assert_eq!(
        recorder.slots("hourly"),
        vec![
            utc(2026, 6, 1, 11, 0),
            utc(2026, 6, 1, 12, 0),
            utc(2026, 6, 1, 12, 20),
            utc(2026, 6, 1, 12, 40),
            utc(2026, 6, 1, 13, 0),
        ]
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_delivery_to_a_room_added_while_perch_runs_says_to_restart() {
    let agent = new_agent();
    write(
        agent.path(),
        "channels/ops.lua",
        "channel {\n  kind = \"telegram\",\n  token = env \"TG_TOKEN\",\n  \
         rooms = { standup = \"-100\", report = \"-200\" },\n}\n",
    );
    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: report\n    prompt: Report.\n    every: 1h\n    delivery: ops:report\n  \
         - name: elsewhere\n    prompt: Report.\n    every: 1h\n    delivery: ops:nowhere\n",
    );
    let dir = AgentDir::open(agent.path()).unwrap();
    let clock = tokio_clock(utc(2026, 6, 1, 10, 0));
    let (heartbeats, shutdown) = start(&dir, clock, &Recorder::default()).await;
    pass(&heartbeats, Duration::from_secs(60)).await;
    let list = serde_json::to_value(heartbeats.list().await.unwrap()).unwrap();
    let error = list["reload_error"].as_str().unwrap();
    assert!(
        error.contains(
            "workspace/HEARTBEAT.yml:5:15: tasks[1].delivery: ops:report is not a room the \
             agent's channels declare\n  fix: channels/ops.lua declares it now, but perch loaded \
             that file before; restart perch to load it"
        ),
        "{error}"
    );
    assert!(
        error.contains(
            "tasks[2].delivery: ops:nowhere is not a room the agent's channels declare\n  fix: use \
             a declared room: ops:standup (channel files are read at start: restart perch after \
             editing channels/*.lua)"
        ),
        "{error}"
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_manual_run_consumes_no_slot_and_a_dry_run_leaves_no_record() {
    let agent = new_agent();
    write(agent.path(), "workspace/HEARTBEAT.yml", HOURLY);
    let dir = AgentDir::open(agent.path()).unwrap();
    let clock = tokio_clock(utc(2026, 6, 1, 10, 30));
    let recorder = Recorder::default();
    let (heartbeats, shutdown) = start(&dir, clock, &recorder).await;
    let end = heartbeats.run_now("hourly", false).await.unwrap();
    assert_eq!(end.outcome, SlotOutcome::Silent);
    heartbeats.run_now("hourly", true).await.unwrap();
    let unknown = heartbeats.run_now("nope", false).await.unwrap_err();
    assert!(unknown.contains("the tasks are hourly"), "{unknown}");
    pass(&heartbeats, Duration::from_secs(3600)).await;
    let fired = recorder.fired.lock().unwrap().clone();
    let modes: Vec<(Mode, Timestamp)> = fired.iter().map(|f| (f.mode, f.slot)).collect();
    assert_eq!(
        modes,
        vec![
            (Mode::Manual, utc(2026, 6, 1, 10, 30)),
            (Mode::DryRun, utc(2026, 6, 1, 10, 30)),
            (Mode::Scheduled, utc(2026, 6, 1, 11, 0)),
        ],
        "the manual run did not take the 11:00 slot"
    );
    shutdown.cancel();
    drop(heartbeats);
    let ledger: String = std::fs::read_dir(dir.heartbeat_ledger_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap_or_default())
        .collect();
    assert_eq!(
        ledger.matches("\"slot_started\"").count(),
        2,
        "the manual run and the 11:00 run are recorded, the dry run is not: {ledger}"
    );
}

#[test]
fn perch_info_lists_the_tasks_or_says_why_the_file_does_not_check() {
    let agent = new_agent();
    let dir = agent.path().to_str().unwrap();
    write(agent.path(), "workspace/HEARTBEAT.yml", HOURLY);
    let key = [("OPENAI_API_KEY", "sk-test")];
    let shown = super::support::perch(&["info", dir], &key);
    assert!(shown.status.success(), "{}", super::support::stderr(&shown));
    let text = super::support::stdout(&shown);
    assert!(
        text.contains("heartbeats") && text.contains("hourly"),
        "{text}"
    );

    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 1m\n",
    );
    let shown = super::support::perch(&["info", dir, "--json"], &key);
    assert!(
        !shown.status.success(),
        "a file that does not check fails perch info"
    );
    assert!(
        super::support::stderr(&shown).contains("workspace/HEARTBEAT.yml:4"),
        "{}",
        super::support::stderr(&shown)
    );
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let error = json["heartbeats"]["error"].as_str().unwrap();
    assert!(error.contains("workspace/HEARTBEAT.yml:4"), "{error}");
}

#[test]
fn perch_info_refuses_six_cron_fields_without_seconds_and_names_the_field() {
    let agent = new_agent();
    let dir = agent.path().to_str().unwrap();
    let key = [("OPENAI_API_KEY", "sk-test")];
    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: report\n    prompt: Report.\n    cron: \"0 9 * * Mon-Fri *\"\n",
    );
    let shown = super::support::perch(&["info", dir], &key);
    assert!(!shown.status.success());
    let text = stderr(&shown);
    assert!(
        text.contains(
            "workspace/HEARTBEAT.yml:4:11: tasks[1].cron: \"0 9 * * Mon-Fri *\" has six fields; \
             a pattern has five (minute hour day-of-month month day-of-week), and six are read \
             seconds first only when the task says seconds: true (read that way, the month field \
             \"Mon-Fri\": \"Mon\" names a day of the week; days go in the day-of-week field); \
             fix: remove the extra field: \"0 9 * * Mon-Fri\"; or, if the first field is the \
             second, add seconds: true to the task"
        ),
        "{text}"
    );

    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: report\n    prompt: Report.\n    cron: \"0 25 * * *\"\n",
    );
    let text = stderr(&super::support::perch(&["info", dir], &key));
    assert!(
        text.contains(
            "workspace/HEARTBEAT.yml:4:11: tasks[1].cron: the hour field \"25\" is out of range \
             0-23; fix: write the hour as * or numbers 0-23"
        ),
        "{text}"
    );
    assert!(!text.contains("Component error"), "{text}");
}

/// `perch heartbeat list DIR --json`, read as the listing it prints.
fn listed(agent: &Agent) -> HeartbeatList {
    serde_json::from_slice(&agent.perch(&["heartbeat", "list", "--json"]).stdout).unwrap()
}

/// `perch ARGS DIR`, which must succeed; its stdout.
fn succeeds(agent: &Agent, args: &[&str]) -> String {
    let output = agent.perch(args);
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
}

#[test]
fn a_heartbeat_message_is_posted_once_an_invalid_verdict_never_and_a_dry_run_delivers_nothing() {
    let agent = Scenario::discord("rooms = { standup = \"555\" }").build();
    let (model, discord) = (&agent.model, agent.discord());
    discord.guild_channel(555);
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the stand-up digest.\n    cron: \"0 9 * * Mon-Fri\"\n    tz: Europe/Berlin\n    delivery: dc:standup\n  - name: quiet\n    prompt: Only when there is news.\n    every: 1h\n    check: \"test -e /workspace/news\"\n",
    );
    let service = agent.start();
    agent.wait_for_gateway();

    model.push(Script::text("Message: All green today.\nTwo reviews wait."));
    let shown = succeeds(&agent, &["heartbeat", "run", "digest"]);
    assert!(
        shown.contains("digest: message to dc:standup: All green today. ⏎ Two reviews wait."),
        "{shown}"
    );
    assert_eq!(shown.lines().count(), 1, "one plain line: {shown}");
    let posted = discord.posted();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].channel, 555);
    assert_eq!(
        posted[0].body["content"],
        "All green today.\nTwo reviews wait."
    );
    let asked = &model.requests()[0].body["messages"];
    let prompt = asked.as_array().unwrap().last().unwrap()["content"].to_string();
    assert!(prompt.contains("Post the stand-up digest."), "{prompt}");
    assert!(prompt.contains("SILENCE"), "the rule is stated: {prompt}");
    assert_eq!(
        asked.as_array().unwrap().len(),
        2,
        "a fresh run holds the system prompt and the task's prompt only: {asked}"
    );

    model.push(Script::text("SILENCE."));
    model.push(Script::text("I looked around. SILENCE"));
    let invalid = agent.perch(&["heartbeat", "run", "digest"]);
    let shown = stdout(&invalid);
    assert!(
        !invalid.status.success(),
        "an invalid verdict exits 1: {shown}"
    );
    assert!(shown.starts_with("digest: invalid verdict: "), "{shown}");
    let correction = model.requests()[2].body["messages"].to_string();
    assert!(
        correction.contains("SILENCE."),
        "the retry carries the first reply and the correction: {correction}"
    );
    assert!(
        model.requests()[1].body["messages"]
            .to_string()
            .contains("last run of this task"),
        "a fresh run is told the task's last outcome"
    );

    model.push(Script::text("Message: a dry one"));
    let dry = succeeds(&agent, &["heartbeat", "run", "digest", "--dry-run"]);
    assert!(
        dry.contains("digest: message to dc:standup (dry run: nothing posted): a dry one"),
        "{dry}"
    );
    assert_eq!(
        discord.posted().len(),
        1,
        "nothing but the valid message was posted"
    );

    let list = listed(&agent);
    assert_eq!(list.tasks[0].name, "digest");
    let last = list.tasks[0].last.as_ref().unwrap();
    assert!(last.outcome.starts_with("invalid verdict"), "{list:?}");
    assert!(
        list.tasks[0]
            .next
            .as_ref()
            .unwrap()
            .ends_with(":00:00+00:00")
    );

    let asked_before = model.requests().len();
    let quiet = stdout(&agent.perch(&["heartbeat", "run", "quiet"]));
    assert!(quiet.contains("skipped: the check exited 1"), "{quiet}");
    assert_eq!(
        model.requests().len(),
        asked_before,
        "a failed check costs no model turn"
    );

    model.push(Script::status(401, "invalid api key"));
    let refused = agent.perch(&["heartbeat", "run", "digest"]);
    assert!(!refused.status.success(), "a failed run exits 1");
    assert!(
        stdout(&refused).starts_with("digest: failed: "),
        "{}",
        stdout(&refused)
    );
    assert_eq!(
        listed(&agent).tasks[0].status,
        "scheduled",
        "a run by hand never stops the scheduled task, even on a refused key"
    );
    service.stop();

    let after = stdout(&agent.perch(&["heartbeat", "list"]));
    assert!(
        after.contains("digest  cron 0 9 * * Mon-Fri (Europe/Berlin)  scheduled"),
        "{after}"
    );
}

#[test]
fn a_heartbeat_run_without_a_service_delivers_through_the_outbox_and_fires_no_slot() {
    let agent = Scenario::discord("rooms = { standup = \"555\" }").build();
    let (model, discord) = (&agent.model, agent.discord());
    discord.guild_channel(555);
    // `every: 5m` is due at once in a running service's first minutes; here it must not fire.
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the digest.\n    every: 5m\n    delivery: dc:standup\n",
    );
    model.push(Script::text("Message: Nothing is on fire."));
    let output = agent.perch_alone(&["heartbeat", "run", "digest"]);
    let shown = stdout(&output);
    assert!(output.status.success(), "{shown}{}", stderr(&output));
    assert!(
        shown.contains("digest: message to dc:standup: Nothing is on fire."),
        "{shown}"
    );
    assert_eq!(discord.posted().len(), 1);
    assert_eq!(discord.posted()[0].body["content"], "Nothing is on fire.");
    assert_eq!(model.requests().len(), 1, "one run: the manual one");
    let status = agent.status();
    assert!(!status.running);
    assert_eq!(status.outbox_pending, 0, "the delivery has its receipt");
    assert!(
        status.heartbeat_tasks()[0].last.as_ref().unwrap().manual,
        "recorded as a manual run: {status:?}"
    );
}
