//! The daily spend cap and owner alerts, in agent.lua and models.yml and through `perch run`.

use super::support::fake_model::{Reply, Script};
use super::support::fake_telegram::{Chat, FakeTelegram, Sent, User};
use super::support::scenario::{Agent, Perch, Scenario, alice};
use super::support::status::Report;
use super::support::wait::wait_until;
use super::support::{new_agent, perch, stderr, stdout, write};
use perch::agent::{self, AgentDir};
use perch_core::spend::Level;
use std::path::Path;

/// The owner's room: `tg:team`, a Telegram group.
const OWNER_CHAT: i64 = -100;

/// An agent on the fake model with one Telegram channel that answers direct messages and
/// declares the room `team`; `agent_options` go inside `agent { ... }`.
fn agent_with(agent_options: &str) -> Agent {
    Scenario::telegram("dm = \"allow\", rooms = { team = \"-100\" }")
        .agent(agent_options)
        .build()
}

/// Makes the owner's group known to the fake (a bot can post only to chats it is in): the owner
/// says something there, which the agent does not answer.
fn owner_room(telegram: &FakeTelegram) {
    let owner = User::human(1, "Owner");
    telegram.push_message(&Chat::group(OWNER_CHAT, "Team"), &owner, "alerts go here");
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

/// `perch heartbeat run TASK DIR`, which must succeed; its stdout.
fn heartbeat_run(agent: &Agent, task: &str) -> String {
    let run = agent.perch(&["heartbeat", "run", task]);
    assert!(run.status.success(), "{}", stderr(&run));
    stdout(&run)
}

/// Waits for the alert in the owner's room, stops `service`, and checks that the owner was told
/// once: the alert's text, and what the service logged.
fn the_owner_was_told_once(telegram: &FakeTelegram, service: Perch) -> (String, String) {
    wait_until("the owner's alert", || {
        !sent_to(telegram, OWNER_CHAT).is_empty()
    });
    let alerts = sent_to(telegram, OWNER_CHAT);
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    let stderr = service.stop();
    assert_eq!(sent_to(telegram, OWNER_CHAT).len(), 1, "told once");
    (alerts[0].shown.clone(), stderr)
}

#[test]
fn the_daily_cap_refuses_runs_without_asking_the_model_tells_the_owner_once_and_survives_a_restart()
{
    let agent = agent_with("spend = { tokens_per_day = 100 }, owner = \"tg:team\"");
    let (model, telegram) = (&agent.model, agent.telegram());
    owner_room(telegram);
    model.push(Script::Reply(
        Reply::text("the only answer today").with_usage(100, 50, 0),
    ));
    let service = agent.start();
    agent.send(&alice(), "hello");
    wait_until("the answer", || sent_to(telegram, 42).len() == 1);
    assert_eq!(sent_to(telegram, 42)[0].shown, "the only answer today");
    for text in ["one more", "and another", "still there?"] {
        agent.send(&alice(), text);
    }
    wait_until("three refusals", || sent_to(telegram, 42).len() == 4);
    let refusal = "the daily spend cap of 100 tokens is reached (150 tokens used today); it \
                   resets at 00:00 UTC";
    for sent in &sent_to(telegram, 42)[1..] {
        assert!(sent.shown.contains(refusal), "{}", sent.shown);
    }
    assert_eq!(
        model.requests().len(),
        1,
        "a refused message reaches no model"
    );
    let (alert, stderr) = the_owner_was_told_once(telegram, service);
    assert!(
        alert.starts_with("perch alert (spend): The daily spend cap of 100 tokens is reached"),
        "{alert}"
    );
    assert!(stderr.contains("alert (spend)"), "{stderr}");

    // The day's spend is on disk: after a restart the cap still holds, and the owner, told
    // already today, is not told again.
    let service = agent.start();
    agent.send(&alice(), "after a restart?");
    wait_until("the refusal after the restart", || {
        sent_to(telegram, 42).len() == 5
    });
    service.stop();
    assert!(
        sent_to(telegram, 42)[4].shown.contains(refusal),
        "{}",
        sent_to(telegram, 42)[4].shown
    );
    assert_eq!(model.requests().len(), 1);
    assert_eq!(sent_to(telegram, OWNER_CHAT).len(), 1, "told once a day");
    let status = agent.status();
    assert_eq!(status.spend().tokens, 150);
    assert_eq!(status.spend().told, Some(Level::All));
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_delivery_of_unknown_fate_is_reported_in_the_owner_room() {
    let agent = agent_with("owner = \"tg:team\"");
    let telegram = agent.telegram();
    owner_room(telegram);
    agent
        .model
        .push(Script::text("this may or may not have been posted"));
    agent.send(&alice(), "hello");
    agent.crash_at("after:delivery_sending");

    let service = agent.start();
    let (alert, _) = the_owner_was_told_once(telegram, service);
    assert!(
        alert.starts_with("perch alert (delivery): delivery ")
            && alert.contains("to tg room 42 has an unknown fate"),
        "{alert}"
    );
    assert!(sent_to(telegram, 42).is_empty(), "never resent on Telegram");
}

#[test]
fn spend_owner_and_price_are_checked_with_their_file_and_line() {
    let agent = agent_with("owner = \"tg:ops\"");
    assert_eq!(
        problems(agent.path()),
        vec![
            "agent.lua:1: owner: tg:ops is not a room the agent's channels declare\n  fix: use a \
             declared room: tg:team"
                .to_owned()
        ]
    );
    agent.write(
        "agent.lua",
        "agent {\n  model = \"fake/m1\",\n  spend = { cost_per_day = 5 },\n}\n",
    );
    let found = problems(agent.path());
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "agent.lua:3: spend.cost_per_day: models.yml gives fake/m1 no price, so its cost \
             cannot be counted"
        ),
        "{}",
        found[0]
    );
    let priced = agent.model.priced_models_yml();
    agent.write("models.yml", &priced);
    assert_eq!(problems(agent.path()), Vec::<String>::new(), "{priced}");
    let info = agent.perch_alone(&["info", "--json"]);
    assert!(info.status.success(), "{}", stderr(&info));
    let value: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(value["spend"]["source"], "agent.lua");
    assert_eq!(value["spend"]["cost_per_day"], 5.0);
    assert_eq!(value["spend"]["tokens_per_day"], serde_json::Value::Null);
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
    let info = perch(
        &["info", dir.path().to_str().unwrap()],
        &[("OPENAI_API_KEY", "sk-test")],
    );
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

/// A daily heartbeat task `digest`.
const DIGEST: &str = "tasks:\n  - name: digest\n    prompt: Post the digest.\n    every: 1d\n";

/// A run by hand that a refused key fails stops nothing and tells the owner nothing: only a
/// scheduled run stops its task (and alerts the owner, which the scheduler's unit tests show).
#[test]
fn a_heartbeat_run_by_hand_on_a_refused_key_stops_nothing_and_alerts_nobody() {
    let agent = agent_with("owner = \"tg:team\"");
    let telegram = agent.telegram();
    owner_room(telegram);
    agent.write("workspace/HEARTBEAT.yml", DIGEST);
    let service = agent.start();
    wait_until("the channel to poll", || {
        !telegram.poll_offsets().is_empty()
    });
    agent.model.push(Script::status(401, "invalid api key"));
    let run = agent.perch(&["heartbeat", "run", "digest"]);
    assert!(!run.status.success(), "a failed run exits 1");
    let listed = stdout(&agent.perch(&["heartbeat", "list"]));
    assert!(listed.contains("scheduled"), "{listed}");
    service.stop();
    assert!(
        sent_to(telegram, OWNER_CHAT).is_empty(),
        "the owner is not alerted"
    );
}

#[test]
fn heartbeats_pause_at_eighty_percent_of_the_cap_while_conversations_go_on() {
    let agent = agent_with("spend = { tokens_per_day = 100 }");
    let (model, telegram) = (&agent.model, agent.telegram());
    agent.write("workspace/HEARTBEAT.yml", DIGEST);
    let service = agent.start();
    model.push(Script::Reply(Reply::text("first").with_usage(60, 25, 0)));
    agent.send(&alice(), "hello");
    wait_until("the first answer", || sent_to(telegram, 42).len() == 1);

    let shown = heartbeat_run(&agent, "digest");
    assert!(
        shown.contains(
            "skipped: heartbeats pause at 80% of the daily spend cap of 100 tokens (85 tokens \
             used today); they resume at 00:00 UTC"
        ),
        "{shown}"
    );
    assert_eq!(model.requests().len(), 1, "the heartbeat asked no model");

    model.push(Script::Reply(Reply::text("second").with_usage(5, 5, 0)));
    agent.send(&alice(), "still answering?");
    wait_until("the second answer", || sent_to(telegram, 42).len() == 2);
    service.stop();
    assert_eq!(sent_to(telegram, 42)[1].shown, "second");
    assert_eq!(model.requests().len(), 2);
}
