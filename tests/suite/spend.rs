//! The daily spend guard and owner alerts: `spend` and `owner` in agent.lua, `price` in
//! models.yml, and `perch run` end to end with the fake model and the fake Telegram.

use super::fake_model::{FakeModel, Reply, Script};
use super::fake_telegram::{Chat, FakeTelegram, Sent, TOKEN, User};
use super::support::{new_agent, perch, stderr, stdout, write};
use perch::agent::{self, AgentDir};
use perch::host::Places;
use perch_core::config::Api;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The owner's room: `tg:team`, a Telegram group.
const OWNER_CHAT: i64 = -100;

/// An agent on the fake model with one Telegram channel that answers direct messages and
/// declares the room `team`; `agent_options` go inside `agent { ... }`.
fn agent_with(
    model: &FakeModel,
    telegram: &FakeTelegram,
    agent_options: &str,
) -> tempfile::TempDir {
    let dir = new_agent();
    write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
    write(
        dir.path(),
        "agent.lua",
        &format!("agent {{ model = \"fake/m1\", {agent_options} }}\n"),
    );
    write(
        dir.path(),
        "channels/tg.lua",
        &format!(
            "channel {{\n  kind = \"telegram\",\n  token = env \"TELEGRAM_TOKEN\",\n  api_url = {:?},\n  dm = \"allow\",\n  rooms = {{ team = \"{OWNER_CHAT}\" }},\n}}\n",
            telegram.api_url()
        ),
    );
    dir
}

/// Makes the owner's group known to the fake (a bot can post only to chats it is in): the owner
/// says something there, which the agent does not answer.
fn owner_room(telegram: &FakeTelegram) {
    let owner = User::human(1, "Owner");
    telegram.push_message(&Chat::group(OWNER_CHAT, "Team"), &owner, "alerts go here");
}

fn launch(dir: &Path, failpoint: Option<&str>) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(["run", dir.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_SANDBOX", "namespace-double")
        .env("PERCH_CACHE", Places::from_environment().cache)
        .env("TELEGRAM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(point) = failpoint {
        command.env("PERCH_FAILPOINT", point);
    }
    command.spawn().unwrap()
}

/// SIGTERM, then waits for a clean exit; returns stderr.
fn stop(child: Child) -> String {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "perch run did not stop cleanly: {stderr}"
    );
    stderr
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sent_to(telegram: &FakeTelegram, chat: i64) -> Vec<Sent> {
    telegram
        .sent()
        .into_iter()
        .filter(|sent| sent.chat_id == chat)
        .collect()
}

fn problems(dir: &Path) -> Vec<String> {
    match agent::load(&AgentDir::open(dir).unwrap()) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn the_daily_cap_refuses_runs_without_asking_the_model_tells_the_owner_once_and_survives_a_restart()
{
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with(
        &model,
        &telegram,
        "spend = { tokens_per_day = 100 }, owner = \"tg:team\"",
    );
    owner_room(&telegram);
    model.push(Script::Reply(
        Reply::text("the only answer today").with_usage(100, 50, 0),
    ));
    let child = launch(dir.path(), None);
    let alice = User::human(42, "Alice");
    let private = Chat::private(&alice);
    telegram.push_message(&private, &alice, "hello");
    wait_until("the answer", || sent_to(&telegram, 42).len() == 1);
    assert_eq!(sent_to(&telegram, 42)[0].shown, "the only answer today");
    for text in ["one more", "and another", "still there?"] {
        telegram.push_message(&private, &alice, text);
    }
    wait_until("three refusals", || sent_to(&telegram, 42).len() == 4);
    let refusal = "the daily spend cap of 100 tokens is reached (150 tokens used today); it \
                   resets at 00:00 UTC";
    for sent in &sent_to(&telegram, 42)[1..] {
        assert!(sent.shown.contains(refusal), "{}", sent.shown);
    }
    assert_eq!(
        model.requests().len(),
        1,
        "a refused message reaches no model"
    );
    wait_until("the owner's alert", || {
        !sent_to(&telegram, OWNER_CHAT).is_empty()
    });
    let stderr = stop(child);
    let alerts = sent_to(&telegram, OWNER_CHAT);
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    assert!(
        alerts[0]
            .shown
            .starts_with("perch alert (spend): The daily spend cap of 100 tokens is reached"),
        "{}",
        alerts[0].shown
    );
    assert!(stderr.contains("alert (spend)"), "{stderr}");

    // The day's spend is on disk: after a restart the cap still holds, and the owner, told
    // already today, is not told again.
    let child = launch(dir.path(), None);
    telegram.push_message(&private, &alice, "after a restart?");
    wait_until("the refusal after the restart", || {
        sent_to(&telegram, 42).len() == 5
    });
    stop(child);
    assert!(
        sent_to(&telegram, 42)[4].shown.contains(refusal),
        "{}",
        sent_to(&telegram, 42)[4].shown
    );
    assert_eq!(model.requests().len(), 1);
    assert_eq!(sent_to(&telegram, OWNER_CHAT).len(), 1, "told once a day");
    let status = perch_cli(&["status", dir.path().to_str().unwrap(), "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["spend_today"]["tokens"], 150);
    assert_eq!(status["spend_today"]["told"], "all");
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_delivery_of_unknown_fate_is_reported_in_the_owner_room() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with(&model, &telegram, "owner = \"tg:team\"");
    owner_room(&telegram);
    model.push(Script::text("this may or may not have been posted"));
    let alice = User::human(42, "Alice");
    telegram.push_message(&Chat::private(&alice), &alice, "hello");
    let child = launch(dir.path(), Some("after:delivery_intent"));
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "the failpoint fired");

    let child = launch(dir.path(), None);
    wait_until("the owner's alert", || {
        !sent_to(&telegram, OWNER_CHAT).is_empty()
    });
    stop(child);
    let alerts = sent_to(&telegram, OWNER_CHAT);
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    assert!(
        alerts[0]
            .shown
            .starts_with("perch alert (delivery): delivery ")
            && alerts[0]
                .shown
                .contains("to tg room 42 has an unknown fate"),
        "{}",
        alerts[0].shown
    );
    assert!(
        sent_to(&telegram, 42).is_empty(),
        "never resent on Telegram"
    );
}

#[test]
fn spend_owner_and_price_are_checked_with_their_file_and_line() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with(&model, &telegram, "owner = \"tg:ops\"");
    assert_eq!(
        problems(dir.path()),
        vec![
            "agent.lua:1: owner: tg:ops is not a room the agent's channels declare\n  fix: use a \
             declared room: tg:team"
                .to_owned()
        ]
    );
    write(
        dir.path(),
        "agent.lua",
        "agent {\n  model = \"fake/m1\",\n  spend = { cost_per_day = 5 },\n}\n",
    );
    let found = problems(dir.path());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "agent.lua:1: spend.cost_per_day: models.yml gives fake/m1 no price, so its cost \
             cannot be counted"
        ),
        "{}",
        found[0]
    );
    let priced = model.models_yml("fake", "m1").replace(
        "reasoning: true",
        "reasoning: true\n        price: { input: 1.25, output: 10 }",
    );
    write(dir.path(), "models.yml", &priced);
    assert_eq!(problems(dir.path()), Vec::<String>::new(), "{priced}");
    let info = perch(&["info", dir.path().to_str().unwrap(), "--json"], &[]);
    assert!(info.status.success(), "{}", stderr(&info));
    let value: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(value["spend"]["source"], "agent.lua");
    assert_eq!(value["spend"]["costPerDay"], 5.0);
    assert_eq!(value["spend"]["tokensPerDay"], serde_json::Value::Null);
    assert_eq!(value["price"]["input"], 1.25);
}

#[test]
fn without_spend_info_names_the_built_in_cap_and_spend_false_runs_uncapped() {
    let dir = new_agent();
    write(
        dir.path(),
        "agent.lua",
        "agent { model = \"openai/gpt-5-mini\" }\n",
    );
    let info = perch(&["info", dir.path().to_str().unwrap()], &[]);
    assert!(info.status.success(), "{}", stderr(&info));
    let shown = stdout(&info);
    assert!(
        shown.contains(
            "spend      2000000 tokens a day (UTC), the built-in default: agent.lua sets no spend"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("owner      (none: alerts go to the log only)"),
        "{shown}"
    );
    write(
        dir.path(),
        "agent.lua",
        "agent { model = \"openai/gpt-5-mini\", spend = false }\n",
    );
    let shown = stdout(&perch(&["info", dir.path().to_str().unwrap()], &[]));
    assert!(
        shown.contains("spend      uncapped (spend = false in agent.lua)"),
        "{shown}"
    );

    let starter = new_agent();
    let shown = stdout(&perch(&["info", starter.path().to_str().unwrap()], &[]));
    assert!(
        shown.contains("spend      2000000 tokens a day (UTC); heartbeats pause at 80%"),
        "the starter agent ships a cap: {shown}"
    );
}

fn perch_cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap()
}

#[test]
fn a_heartbeat_task_that_stops_is_reported_in_the_owner_room() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with(&model, &telegram, "owner = \"tg:team\"");
    owner_room(&telegram);
    write(
        dir.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the digest.\n    every: 1d\n",
    );
    let child = launch(dir.path(), None);
    wait_until("the channel to poll", || {
        !telegram.poll_offsets().is_empty()
    });
    model.push(Script::status(401, "invalid api key"));
    let run = perch_cli(&["heartbeat", "run", "digest", dir.path().to_str().unwrap()]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    wait_until("the owner's alert", || {
        !sent_to(&telegram, OWNER_CHAT).is_empty()
    });
    stop(child);
    let alerts = sent_to(&telegram, OWNER_CHAT);
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    assert!(
        alerts[0]
            .shown
            .starts_with("perch alert (heartbeat): heartbeat digest stopped: ")
            && alerts[0].shown.contains("perch heartbeat resume digest"),
        "{}",
        alerts[0].shown
    );
}

#[test]
fn heartbeats_pause_at_eighty_percent_of_the_cap_while_conversations_go_on() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with(&model, &telegram, "spend = { tokens_per_day = 100 }");
    write(
        dir.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the digest.\n    every: 1d\n",
    );
    let path = dir.path().to_str().unwrap();
    let child = launch(dir.path(), None);
    let alice = User::human(42, "Alice");
    let private = Chat::private(&alice);
    model.push(Script::Reply(Reply::text("first").with_usage(60, 25, 0)));
    telegram.push_message(&private, &alice, "hello");
    wait_until("the first answer", || sent_to(&telegram, 42).len() == 1);

    let run = perch_cli(&["heartbeat", "run", "digest", path]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let shown = String::from_utf8_lossy(&run.stdout);
    assert!(
        shown.contains(
            "skipped: heartbeats pause at 80% of the daily spend cap of 100 tokens (85 tokens \
             used today); they resume at 00:00 UTC"
        ),
        "{shown}"
    );
    assert_eq!(model.requests().len(), 1, "the heartbeat asked no model");

    model.push(Script::Reply(Reply::text("second").with_usage(5, 5, 0)));
    telegram.push_message(&private, &alice, "still answering?");
    wait_until("the second answer", || sent_to(&telegram, 42).len() == 2);
    stop(child);
    assert_eq!(sent_to(&telegram, 42)[1].shown, "second");
    assert_eq!(model.requests().len(), 2);
}
