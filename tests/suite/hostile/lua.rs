//! Lua that tries to escape its budget: `__close` handlers, huge pattern subjects, endless hooks.

use super::super::support::fake_model::Script;
use super::super::support::fake_telegram::{FakeTelegram, User};
use super::super::support::scenario::{Agent, Perch, Scenario, alice};
use super::super::support::status::{Report, StatusReport};
use super::super::support::wait::Poll;
use super::super::support::{new_agent, stderr, stdout, write};
use super::{exits_within, perch_on_the_double};
use std::path::Path;
use std::time::{Duration, Instant};

/// A `__close` handler that never returns, added to the metatable after `setmetatable` (which
/// refuses `__close`), then a `<close>` variable in a coroutine the budget stops. Lua runs such a
/// handler with hooks off, so before perch copied metatables this never returned.
const CLOSE_IN_A_COROUTINE: &str = "local mt = {}\n  local forever = setmetatable({}, mt)\n  \
    mt.__close = function() while true do end end\n  \
    coroutine.wrap(function()\n    local x <close> = forever\n    while true do end\n  end)()";

/// SIGTERM, then at most ten seconds to exit cleanly.
fn stop(service: Perch) -> String {
    service.stop_within(Duration::from_secs(10))
}

/// `perch status --json`, which must end within 20 s though hooks are stalled.
fn status(dir: &Path) -> StatusReport {
    let child = perch_on_the_double(&["status", dir.to_str().unwrap(), "--json"])
        .spawn()
        .unwrap();
    let output = exits_within(child, Duration::from_secs(20), "perch status");
    super::super::support::status::read(&stdout(&output))
}

/// An agent with a Telegram channel whose `on_message` is `on_message`.
fn agent_with_hook(on_message: &str) -> Agent {
    Scenario::telegram(&format!("dm = \"allow\",\n  on_message = {on_message}")).build()
}

/// The first channel's last hook error, as `perch status --json` printed it (`null` for none).
fn last_hook_error(status: &StatusReport) -> String {
    serde_json::to_string(&status.channel(0).unwrap().last_hook_error).unwrap()
}

/// Waits at most a minute for an answer to Bob (43).
fn bob_is_answered(telegram: &FakeTelegram) {
    Poll::within(Duration::from_secs(60))
        .until("Bob's answer", || !replies_to(telegram, 43).is_empty());
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
    let on_message = format!(
        "function(msg)\n  if msg.text == \"close\" then\n  {CLOSE_IN_A_COROUTINE}\n  end\n  \
         msg.text = msg.text:match(\"^%s*(.-)%s*$\")\n  return msg\nend"
    );
    let agent = agent_with_hook(&on_message);
    let (model, telegram) = (&agent.model, agent.telegram());
    model.push(Script::text("hello Bob"));
    let service = agent.start();
    agent.send(&alice(), "close");
    let long = format!("x{}y", " ".repeat(60_000));
    agent.send(&alice(), &long);
    let sent = Instant::now();
    agent.send(&User::human(43, "Bob"), "  hi  ");
    bob_is_answered(telegram);
    assert!(
        sent.elapsed() < Duration::from_secs(15),
        "Bob waited {:?} behind Alice's messages",
        sent.elapsed()
    );
    assert_eq!(replies_to(telegram, 43), vec!["hello Bob".to_owned()]);
    assert!(replies_to(telegram, 42).is_empty());
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    let asked = requests[0].body.to_string();
    assert!(asked.contains("hi") && !asked.contains("  hi  "), "{asked}");
    let status = status(agent.path());
    let channel = status.channel(0).unwrap();
    assert_eq!(channel.hook_failures_in_a_row, 0, "{status:?}");
    stop(service);
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_hook_past_its_deadline_is_abandoned_then_the_channel_refuses_and_sigterm_still_stops_perch() {
    let agent = agent_with_hook("function(msg) return msg end");
    let service = agent.start_at("stall:hook");
    for text in ["one", "two", "three"] {
        agent.send(&alice(), text);
    }
    Poll::within(Duration::from_secs(60)).until(
        "the channel to refuse after two abandoned calls",
        || {
            status(agent.path()).channel(0).is_some_and(|channel| {
                !channel.healthy
                    && channel.hook_calls_running == 2
                    && channel
                        .last_hook_error
                        .as_ref()
                        .is_some_and(|error| error.contains("still running"))
            })
        },
    );
    let error = last_hook_error(&status(agent.path()));
    assert!(
        error.contains("channels/tg.lua: 2 earlier hook calls overran their 3 s deadline"),
        "{error}"
    );
    let stopping = Instant::now();
    stop(service);
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "SIGTERM took {:?} with hooks stalled",
        stopping.elapsed()
    );
    assert!(agent.telegram().sent().is_empty());
    assert!(agent.model.requests().is_empty());
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_message_whose_hook_crashed_perch_is_rejected_at_restart_not_decided_again() {
    let agent = agent_with_hook("function(msg) return msg end");
    let (model, telegram) = (&agent.model, agent.telegram());
    agent.send(&alice(), "poison");
    let crash = agent
        .start_at("during:on_message")
        .wait_within(Duration::from_secs(60), "the crashing run");
    assert!(
        !crash.status.success(),
        "the failpoint did not fire: {}",
        stderr(&crash)
    );

    model.push(Script::text("hello Bob"));
    let service = agent.start();
    agent.send(&User::human(43, "Bob"), "hi");
    bob_is_answered(telegram);
    let error = last_hook_error(&status(agent.path()));
    assert!(
        error.contains("perch stopped while the on_message hook of channels/tg.lua was deciding"),
        "{error}"
    );
    stop(service);
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    assert!(!requests[0].body.to_string().contains("poison"));
    assert!(replies_to(telegram, 42).is_empty());

    // Once rejected, it stays rejected: a third start neither decides nor answers it.
    let service = agent.start();
    Poll::within(Duration::from_secs(60)).until("the third start to be ready", || {
        status(agent.path()).connection() == "receiving"
    });
    stop(service);
    assert_eq!(model.requests().len(), 1);
}
