//! What a lane records for `perch log` besides the conversation: usage, tool ends, settlements.

use super::support::fake_model::{Reply, Script};
use super::support::fake_telegram::Failure;
use super::support::scenario::{Scenario, alice, crash_on_one_message};
use super::support::wait::wait_until;
use super::support::write;
use serde_json::{Value, json};
use std::path::Path;

/// Every line of the lane `lane`'s first segment, parsed.
fn segment_lines(dir: &Path, lane: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(format!(".perch/sessions/{lane}/000001.jsonl")))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Every line of the lane `tg-42-a69b25403314d72a`'s (Telegram chat 42's) first segment, parsed.
fn lane_lines(dir: &Path) -> Vec<Value> {
    segment_lines(dir, "tg-42-a69b25403314d72a")
}

fn records(lines: &[Value], kind: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|line| line["kind"] == "record" && line["type"] == kind)
        .cloned()
        .collect()
}

fn wait_for_settlements(dir: &Path, count: usize) -> Vec<Value> {
    wait_until("the deliveries' settlements in the lane", || {
        records(&lane_lines(dir), "delivery_settled").len() >= count
    });
    records(&lane_lines(dir), "delivery_settled")
}

#[test]
fn a_telegram_exchange_with_a_bash_call_records_usage_the_tool_and_the_delivery() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram, dir) = (&agent.model, agent.telegram(), &agent.dir);
    agent.write("models.yml", &model.priced_models_yml());
    model.push(Script::Reply(
        Reply::new()
            .with_call("call-1", "bash", json!({ "command": "echo hi; exit 3" }))
            .with_usage(1000, 200, 0),
    ));
    model.push(Script::text("It exited 3."));
    let service = agent.start();
    let pushed = agent.send(&alice(), "run it");
    let settled = wait_for_settlements(dir.path(), 1);
    service.stop();

    let lines = lane_lines(dir.path());
    let started = &records(&lines, "operation_started")[0];
    let op = &started["op"];
    let replied = records(&lines, "model_replied");
    assert_eq!(replied.len(), 2, "{replied:?}");
    assert_eq!(
        (
            &replied[0]["op"],
            &replied[0]["attempt"],
            &replied[0]["model"]
        ),
        (op, &json!(1), &json!("fake/m1"))
    );
    assert_eq!(
        (
            &replied[0]["input"],
            &replied[0]["output"],
            &replied[0]["cost"]
        ),
        (&json!(1000), &json!(200), &json!(3250)),
        "1000 input tokens at 1.25 and 200 output at 10 per million: 3250 millionths"
    );
    assert!(replied[0].get("cached").is_none(), "{}", replied[0]);
    assert_eq!(replied[1]["attempt"], 2);
    assert_eq!(
        (&replied[1]["input"], &replied[1]["output"]),
        (&json!(20), &json!(10))
    );

    let tool_started = &records(&lines, "tool_started")[0];
    let finished = records(&lines, "tool_finished");
    assert_eq!(finished.len(), 1, "{finished:?}");
    let finished = &finished[0];
    assert_eq!(finished["op"], *op);
    assert_eq!(finished["call_id"], "call-1");
    assert_eq!(finished["result"], tool_started["result"]);
    assert_eq!(finished["exit_code"], 3);
    assert_eq!(finished["is_error"], false);
    assert!(finished["duration_ms"].is_u64(), "{finished}");
    let position = |wanted: &Value| lines.iter().position(|line| line == wanted).unwrap();
    let result_entry = lines
        .iter()
        .position(|line| line["id"] == tool_started["result"])
        .unwrap();
    assert!(
        position(finished) > result_entry,
        "written after the result entry"
    );
    let first_assistant = lines
        .iter()
        .position(|line| line["body"]["role"] == "assistant")
        .unwrap();
    assert!(
        position(&replied[0]) < first_assistant,
        "written before the reply's entry"
    );

    let sent = telegram.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(settled.len(), 1, "{settled:?}");
    let settled = &settled[0];
    assert_eq!(settled["channel"], "tg");
    assert_eq!(settled["op"], *op);
    assert_eq!(settled["answers"], pushed.platform_id());
    assert_eq!(
        settled["settled"],
        json!({ "state": "sent", "platform_id": format!("42:{}", sent[0].message_id) })
    );
    assert!(
        settled["delivery"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{settled}"
    );
    let finished_at = position(&records(&lines, "operation_finished")[0]);
    assert!(
        position(settled) > finished_at,
        "settled after its run ended"
    );

    // The lane reopens with these records in it, and the next exchange is recorded the same way.
    model.push(Script::text("again"));
    let service = agent.start();
    agent.send(&alice(), "once more");
    let settled = wait_for_settlements(dir.path(), 2);
    service.stop();
    assert_eq!(telegram.sent().len(), 2);
    assert_eq!(
        settled[1]["answers"].as_str().unwrap().split(':').next(),
        Some("42")
    );
    assert_eq!(records(&lane_lines(dir.path()), "model_replied").len(), 3);
}

#[test]
fn a_delivery_the_platform_refuses_is_recorded_as_not_sent() {
    let agent = Scenario::telegram_dm().build();
    let (telegram, dir) = (agent.telegram(), &agent.dir);
    agent.model.push(Script::text("this will be refused"));
    telegram.fail_next(
        "sendMessage",
        Failure::Api {
            code: 400,
            description: "Bad Request: chat not found".into(),
        },
    );
    let service = agent.start();
    let pushed = agent.send(&alice(), "hello");
    let settled = wait_for_settlements(dir.path(), 1);
    service.stop();
    assert!(telegram.sent().is_empty());
    assert_eq!(settled.len(), 1, "{settled:?}");
    assert_eq!(settled[0]["answers"], pushed.platform_id());
    assert_eq!(settled[0]["settled"]["state"], "not_sent", "{}", settled[0]);
    assert!(
        settled[0]["settled"]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("chat not found")),
        "{}",
        settled[0]
    );
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_delivery_of_unknown_fate_after_a_crash_is_recorded_as_unknown_once() {
    let agent = crash_on_one_message(Some("maybe posted"), "hello", "after:delivery_sending");
    let dir = &agent.dir;
    assert!(records(&lane_lines(dir.path()), "delivery_settled").is_empty());
    let op = records(&lane_lines(dir.path()), "operation_started")[0]["op"].clone();

    let service = agent.start();
    let settled = wait_for_settlements(dir.path(), 1);
    agent.wait_for_service();
    service.stop();
    assert!(
        agent.telegram().sent().is_empty(),
        "never resent on Telegram"
    );
    assert_eq!(settled.len(), 1, "{settled:?}");
    assert_eq!(settled[0]["op"], op);
    assert_eq!(settled[0]["settled"]["state"], "unknown", "{}", settled[0]);
    assert!(
        settled[0]["answers"]
            .as_str()
            .is_some_and(|id| id.starts_with("42:")),
        "{}",
        settled[0]
    );

    // Settled once: a further start records nothing more for it.
    let service = agent.start();
    wait_until("the service, its outbox empty", || {
        let status = agent.status();
        status.running && status.outbox_pending == 0
    });
    service.stop();
    assert_eq!(
        records(&lane_lines(dir.path()), "delivery_settled").len(),
        1
    );
}

#[test]
fn a_heartbeat_message_is_recorded_as_settled_in_the_heartbeat_lane() {
    let agent = Scenario::discord("rooms = { standup = \"555\" }").build();
    let discord = agent.discord();
    discord.guild_channel(555);
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the stand-up digest.\n    every: 1h\n    delivery: dc:standup\n",
    );
    let service = agent.start();
    agent.wait_for_gateway();
    agent.model.push(Script::text("Message: All green today."));
    let run = agent.perch(&["heartbeat", "run", "digest"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let lines = || segment_lines(agent.path(), "heartbeat-digest");
    wait_until("the settlement in the heartbeat's lane", || {
        !records(&lines(), "delivery_settled").is_empty()
    });
    service.stop();
    assert_eq!(discord.posted().len(), 1);
    let lines = lines();
    let settled = records(&lines, "delivery_settled");
    assert_eq!(settled.len(), 1, "{settled:?}");
    let op = &records(&lines, "operation_started")[0]["op"];
    assert_eq!(settled[0]["op"], *op, "the run that gave the verdict");
    assert_eq!(settled[0]["channel"], "dc");
    assert!(settled[0].get("answers").is_none(), "{}", settled[0]);
    assert_eq!(settled[0]["settled"]["state"], "sent", "{}", settled[0]);
    assert!(
        settled[0]["settled"]["platform_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{}",
        settled[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lua_tool_reports_the_exit_code_of_its_last_command_and_none_without_one() {
    use perch::agent::{self, AgentDir};
    use perch::sandbox::{self, Backend, MachineSetup};
    use perch::tools::lua_tool::run_tool_coded;
    use tokio_util::sync::CancellationToken;
    let dir = super::support::new_agent();
    write(
        dir.path(),
        "tools/codes.lua",
        r#"
tool("twice", {
  description = "Runs two commands",
  run = function(args, ctx)
    ctx.sh("exit 4")
    local out = ctx.sh("echo done; exit 5")
    return out
  end,
})

tool("plain", {
  description = "Runs no command",
  run = function(args, ctx)
    return "nothing ran"
  end,
})
"#,
    );
    let loaded = agent::load(&AgentDir::open(dir.path()).unwrap())
        .unwrap_or_else(|problems| panic!("{problems}"));
    let setup = MachineSetup {
        backend: Backend::NamespaceDouble,
        places: perch::host::Places::from_environment(),
        idle: std::time::Duration::from_secs(30),
    };
    let machine = sandbox::machine_for(&loaded, &setup, |_| None).unwrap();
    let no_arguments = json!({});
    let call = |name: &'static str| {
        run_tool_coded(
            &loaded,
            &machine,
            name,
            &no_arguments,
            CancellationToken::new(),
        )
    };
    let twice = call("twice").await;
    assert_eq!(twice.result, Ok("done\n".to_owned()));
    assert_eq!(twice.exit_code, Some(5));
    let plain = call("plain").await;
    assert_eq!(plain.result, Ok("nothing ran".to_owned()));
    assert_eq!(plain.exit_code, None);
}

#[cfg(feature = "sandbox-double")]
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_too_old_to_send_at_a_restart_is_recorded_as_dropped() {
    use super::support::in_process::InProcess;
    use super::support::wait::Poll;
    use perch::channel::Delivery;
    use perch::host::clock::Clock;
    use perch::log::Journal;
    use perch::store::outbox::{DeliveryLane, OutboxRecord};
    use perch_core::name::LaneName;
    use std::time::Duration;
    let service = InProcess::start(perch::service::LaneLimits::default(), |dir| {
        // What a crash two hours ago left: the lane, and a reply in it recorded and never sent.
        let lane = LaneName::try_from("tg-7").unwrap();
        std::fs::create_dir_all(dir.join(".perch/sessions/tg-7")).unwrap();
        let two_hours_ago = chrono::Utc::now() - chrono::Duration::hours(2);
        let (mut outbox, _) = Journal::open(
            &dir.join(".perch/outbox"),
            8 << 20,
            Clock::new(move || two_hours_ago),
        )
        .unwrap();
        let intent = OutboxRecord::Intent {
            channel: "tg".into(),
            delivery: Delivery {
                id: "d0123456789abcdef01234567".into(),
                room: "7".into(),
                thread: None,
                reply_to: Some("7:1".into()),
                text: "too late".into(),
                attachments: Vec::new(),
            },
            lane: Some(DeliveryLane::new(lane, None)),
            marked: true,
        };
        outbox
            .append(&[serde_json::to_value(&intent).unwrap()])
            .unwrap();
    });
    let dir = service.dir.path().to_path_buf();
    let settled = || records(&segment_lines(&dir, "tg-7"), "delivery_settled");
    Poll::within(Duration::from_secs(30))
        .every(Duration::from_millis(10))
        .until_async("a settlement in the lane", || {
            let none = settled().is_empty();
            async move { !none }
        })
        .await;
    assert!(service.seen(|seen| seen.posted.is_empty()), "not sent late");
    let _dir = service.stop().await;
    assert_eq!(
        settled(),
        [json!({
            "kind": "record",
            "type": "delivery_settled",
            "delivery": "d0123456789abcdef01234567",
            "channel": "tg",
            "answers": "7:1",
            "settled": { "state": "dropped", "reason": "older than the outbox's time to live" },
            "at": settled()[0]["at"],
        })]
    );
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_reply_delivered_after_a_restart_names_the_run_it_carries() {
    let agent = crash_on_one_message(
        Some("the answer, once"),
        "what is it?",
        "before:delivery_intent",
    );
    let op = records(&lane_lines(agent.path()), "operation_started")[0]["op"].clone();
    let service = agent.start();
    let settled = wait_for_settlements(agent.path(), 1);
    agent.wait_for_service();
    service.stop();
    assert_eq!(agent.telegram().sent().len(), 1);
    assert_eq!(settled[0]["op"], op, "{}", settled[0]);
    assert_eq!(settled[0]["settled"]["state"], "sent");
}
