//! Lua that tries to escape its budget: `__close` handlers, C-level pattern matching on huge
//! subjects, hooks that never return.

use super::super::fake_model::{FakeModel, Script};
use super::super::fake_telegram::{Chat, FakeTelegram, User};
use super::super::service::{agent_with, start};
use super::super::support::{new_agent, stderr, stdout, write};
use super::{exits_within, perch_on_the_double, stop_within};
use chrono::TimeZone;
use perch::channel::{InboundEvent, Sender};
use perch::host::clock::Clock;
use perch::store::inbox::{Disposition, Inbox, Recorded};
use perch_core::config::Api;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// A `__close` handler that never returns, added to the metatable after `setmetatable` (which
/// refuses `__close`), then a `<close>` variable in a coroutine the budget stops. Lua runs such a
/// handler with hooks off, so before perch copied metatables this never returned.
const CLOSE_IN_A_COROUTINE: &str = "local mt = {}\n  local forever = setmetatable({}, mt)\n  \
    mt.__close = function() while true do end end\n  \
    coroutine.wrap(function()\n    local x <close> = forever\n    while true do end\n  end)()";

/// SIGTERM, then at most ten seconds to exit cleanly.
fn stop(child: Child) -> String {
    stop_within(child, Duration::from_secs(10))
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_json(dir: &Path) -> serde_json::Value {
    let child = perch_on_the_double(&["status", dir.to_str().unwrap(), "--json"])
        .spawn()
        .unwrap();
    let output = exits_within(child, Duration::from_secs(20), "perch status");
    serde_json::from_slice(&output.stdout).unwrap_or_default()
}

/// An agent with a Telegram channel whose `on_message` is `on_message`.
fn agent_with_hook(
    model: &FakeModel,
    telegram: &FakeTelegram,
    on_message: &str,
) -> tempfile::TempDir {
    agent_with(
        model,
        "channels/tg.lua",
        &format!(
            "channel {{\n  kind = \"telegram\",\n  token = env \"TELEGRAM_TOKEN\",\n  api_url = {:?},\n  \
             dm = \"allow\",\n  on_message = {on_message},\n}}\n",
            telegram.api_url()
        ),
    )
}

fn replies_to(telegram: &FakeTelegram, chat: i64) -> Vec<String> {
    telegram
        .sent()
        .into_iter()
        .filter(|sent| sent.chat_id == chat)
        .map(|sent| sent.shown)
        .collect()
}

#[test]
fn a_close_handler_in_a_failed_coroutine_is_a_problem_for_perch_info_not_a_hang() {
    let dir = new_agent();
    write(
        dir.path(),
        "channels/tg.lua",
        &format!(
            "{CLOSE_IN_A_COROUTINE}\nchannel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\" }}\n"
        ),
    );
    let child = perch_on_the_double(&["info", dir.path().to_str().unwrap()])
        .spawn()
        .unwrap();
    let output = exits_within(child, Duration::from_secs(30), "perch info");
    let stdout = stdout(&output);
    assert!(!output.status.success(), "{stdout}");
    let shown = format!("{stdout}{}", stderr(&output));
    assert!(
        shown.contains("channels/tg.lua:5: variable 'x' got a non-closable value"),
        "{shown}"
    );
}

#[test]
fn escapes_in_on_message_fail_that_message_within_the_budget_and_others_are_answered() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let on_message = format!(
        "function(msg)\n  if msg.text == \"close\" then\n  {CLOSE_IN_A_COROUTINE}\n  end\n  \
         msg.text = msg.text:match(\"^%s*(.-)%s*$\")\n  return msg\nend"
    );
    let dir = agent_with_hook(&model, &telegram, &on_message);
    model.push(Script::text("hello Bob"));
    let child = start(dir.path(), None);
    let (alice, bob) = (User::human(42, "Alice"), User::human(43, "Bob"));
    telegram.push_message(&Chat::private(&alice), &alice, "close");
    let long = format!("x{}y", " ".repeat(60_000));
    telegram.push_message(&Chat::private(&alice), &alice, &long);
    let sent = Instant::now();
    telegram.push_message(&Chat::private(&bob), &bob, "  hi  ");
    wait_until("Bob's answer", Duration::from_secs(60), || {
        !replies_to(&telegram, 43).is_empty()
    });
    assert!(
        sent.elapsed() < Duration::from_secs(15),
        "Bob waited {:?} behind Alice's messages",
        sent.elapsed()
    );
    assert_eq!(replies_to(&telegram, 43), vec!["hello Bob".to_owned()]);
    assert!(replies_to(&telegram, 42).is_empty());
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    let asked = requests[0].body.to_string();
    assert!(asked.contains("hi") && !asked.contains("  hi  "), "{asked}");
    let status = status_json(dir.path());
    let channel = &status["channel_health"][0];
    assert_eq!(channel["hook_failures_in_a_row"], 0, "{status}");
    stop(child);
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_hook_past_its_deadline_is_abandoned_then_the_channel_refuses_and_sigterm_still_stops_perch() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with_hook(&model, &telegram, "function(msg) return msg end");
    let child = start(dir.path(), Some("stall:hook"));
    let alice = User::human(42, "Alice");
    for text in ["one", "two", "three"] {
        telegram.push_message(&Chat::private(&alice), &alice, text);
    }
    wait_until(
        "the channel to refuse after two abandoned calls",
        Duration::from_secs(60),
        || {
            let status = status_json(dir.path());
            let channel = &status["channel_health"][0];
            channel["healthy"] == false
                && channel["hook_calls_running"] == 2
                && channel["last_hook_error"]
                    .as_str()
                    .is_some_and(|error| error.contains("still running"))
        },
    );
    let status = status_json(dir.path());
    let error = status["channel_health"][0]["last_hook_error"].to_string();
    assert!(
        error.contains("channels/tg.lua: 2 earlier hook calls overran their 3 s deadline"),
        "{error}"
    );
    let stopping = Instant::now();
    stop(child);
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "SIGTERM took {:?} with hooks stalled",
        stopping.elapsed()
    );
    assert!(telegram.sent().is_empty());
    assert!(model.requests().is_empty());
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_message_whose_hook_crashed_perch_is_rejected_at_restart_not_decided_again() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = agent_with_hook(&model, &telegram, "function(msg) return msg end");
    let (alice, bob) = (User::human(42, "Alice"), User::human(43, "Bob"));
    telegram.push_message(&Chat::private(&alice), &alice, "poison");
    let crashed = start(dir.path(), Some("during:on_message"));
    let crash = exits_within(crashed, Duration::from_secs(60), "the crashing run");
    assert!(
        !crash.status.success(),
        "the failpoint did not fire: {}",
        stderr(&crash)
    );

    model.push(Script::text("hello Bob"));
    let child = start(dir.path(), None);
    telegram.push_message(&Chat::private(&bob), &bob, "hi");
    wait_until("Bob's answer", Duration::from_secs(60), || {
        !replies_to(&telegram, 43).is_empty()
    });
    let status = status_json(dir.path());
    let error = status["channel_health"][0]["last_hook_error"].to_string();
    assert!(
        error.contains("perch stopped while the on_message hook of channels/tg.lua was deciding"),
        "{status}"
    );
    stop(child);
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    assert!(!requests[0].body.to_string().contains("poison"));
    assert!(replies_to(&telegram, 42).is_empty());

    // Once rejected, it stays rejected: a third start neither decides nor answers it.
    let child = start(dir.path(), None);
    wait_until(
        "the third start to be ready",
        Duration::from_secs(60),
        || status_json(dir.path())["channel_health"][0]["connection"] == "receiving",
    );
    stop(child);
    assert_eq!(model.requests().len(), 1);
}

fn at() -> perch_core::Timestamp {
    chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
}

fn event(id: &str) -> InboundEvent {
    InboundEvent {
        platform_id: id.into(),
        cursor: None,
        room: "1".into(),
        thread: None,
        sender: Sender {
            id: "42".into(),
            name: "Alice".into(),
            is_bot: false,
        },
        direct: true,
        addressed: true,
        text: format!("message {id}"),
        sent_at: at(),
        attachments: Vec::new(),
        replying_to: None,
        edit_of: None,
        refused: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deciding_mark_without_a_verdict_is_interrupted_and_old_journals_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let (inbox, _) = Inbox::open(dir.path(), Clock::new(at)).unwrap();
    let mut seqs = Vec::new();
    for id in ["old", "decided", "interrupted"] {
        let Recorded::New { seq } = inbox.record_event("tg", &event(id)).await.unwrap() else {
            panic!("new");
        };
        seqs.push(seq);
    }
    let decided_mark = inbox
        .record_deciding(seqs[1], "channels/tg.lua")
        .await
        .unwrap();
    inbox
        .record_disposition(seqs[1], Disposition::Dropped)
        .await
        .unwrap();
    let interrupted_mark = inbox
        .record_deciding(seqs[2], "channels/tg.lua")
        .await
        .unwrap();
    drop(inbox);

    let deadline = Instant::now() + Duration::from_secs(10);
    let backlog = loop {
        match Inbox::open(dir.path(), Clock::new(at)) {
            Ok((_, backlog)) => break backlog,
            Err(error) => {
                assert!(Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let undecided: Vec<u64> = backlog.undecided.iter().map(|(seq, _, _)| *seq).collect();
    assert_eq!(
        undecided,
        vec![seqs[0]],
        "an event without a mark is decided again"
    );
    assert_eq!(backlog.interrupted.len(), 1);
    assert_eq!(backlog.interrupted[0].event_seq, seqs[2]);
    assert_eq!(backlog.interrupted[0].mark_seq, interrupted_mark);
    assert_eq!(backlog.interrupted[0].hook, "channels/tg.lua");
    assert_eq!(backlog.settled_marks, vec![decided_mark]);
}
