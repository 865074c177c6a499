//! How a message gets in through `perch run`: pairing, allow lists, groups, edits, hooks, bursts.

use super::support::fake_discord::Author;
use super::support::fake_model::{Reply, Script};
use super::support::fake_telegram::{Chat, User};
use super::support::scenario::{Scenario, Watched, alice};
use super::support::status::Report;
use super::support::wait::wait_until;
use super::support::{conversations_in_order, journal_text, pairing_code};

/// The group `-100`, aliased `team`, where the bot answers when addressed.
pub(super) const TEAM: &str = "rooms = { team = \"-100\" }, allow = { rooms = { \"team\" } }";

#[test]
fn an_edit_on_telegram_is_journaled_and_not_answered() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    model.push(Script::text("first answer"));
    model.push(Script::text("second answer"));
    let service = agent.start();
    let pushed = agent.send(&alice(), "hi there");
    agent.wait_for_replies(1);
    telegram.push_edit(pushed, "hi there, reworded");
    agent.send(&alice(), "and then");
    agent.wait_for_replies(2);
    service.stop();
    assert_eq!(model.requests().len(), 2, "the edit started no run");
    assert!(
        model
            .requests()
            .iter()
            .all(|request| !request.body.to_string().contains("reworded")),
        "the model never saw the edit"
    );
    assert_eq!(telegram.sent()[1].shown, "second answer");
    let journal = journal_text(&agent.path().join(".perch/inbox"));
    assert!(
        journal.contains(&format!("\"edit_of\":\"{}\"", pushed.platform_id()))
            && journal.contains("hi there, reworded")
            && journal.contains("\"verdict\":\"edited\""),
        "the edit is journaled with its verdict: {journal}"
    );
}

#[test]
fn an_unknown_sender_is_paired_by_the_owner_then_answered() {
    let agent = Scenario::telegram("").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let bob = User::human(7, "Bob");
    agent.send(&bob, "hello?");
    agent.wait_for_a_reply();
    let code = pairing_code(&telegram.sent()[0].text);
    agent.send(&bob, "hello??");
    assert_eq!(
        model.requests().len(),
        0,
        "an unknown sender reaches no model"
    );

    let status = agent.status();
    assert!(status.running);
    assert_eq!(status.pairings_pending.len(), 1);
    assert_eq!(status.connection(), "receiving");
    assert!(status.channel(0).unwrap().healthy);

    let approved = agent.perch(&["pair", "approve", &code]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    assert!(String::from_utf8_lossy(&approved.stdout).contains("approved Bob (7) on channel tg"));
    let again = agent.perch(&["pair", "approve", &code]);
    assert!(!again.status.success());

    model.push(Script::text("nice to meet you"));
    agent.send(&bob, "now?");
    wait_until("the answer", || telegram.has_shown("nice to meet you"));
    assert_eq!(
        telegram.sent().len(),
        3,
        "one code offer, the notice of approval, one answer; the second hello got no second code"
    );
    assert!(telegram.sent()[1].shown.starts_with("You are in"));
    service.stop();
    let status = agent.status();
    assert!(!status.running);
    assert_eq!(status.approved_senders, 1);
}

/// A pairing code that cannot be recorded is never offered (it could never be approved), the
/// event is refused with the reason, and the service goes on: the next sender is answered and,
/// once the file can be written again, the same sender gets a code.
#[test]
fn a_pairing_write_that_fails_refuses_that_event_and_the_service_goes_on() {
    let agent = Scenario::telegram("allow = { users = { \"8\" } }").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    wait_until("perch listening", || {
        agent.path().join(".perch/control.sock").exists()
    });
    // A directory where the file must go: replacing it fails.
    let pairing = agent.path().join(".perch/pairing.json");
    let _ = std::fs::remove_file(&pairing);
    std::fs::create_dir(&pairing).unwrap();
    let bob = User::human(7, "Bob");
    agent.send(&bob, "hello?");
    model.push(Script::text("hi Alice"));
    agent.send(&User::human(8, "Alice"), "are you there?");
    wait_until("Alice's answer", || telegram.has_shown("hi Alice"));
    assert_eq!(
        telegram.sent().len(),
        1,
        "no code was offered to Bob: {:?}",
        telegram.sent()
    );
    std::fs::remove_dir(&pairing).unwrap();
    agent.send(&bob, "hello again?");
    wait_until("Bob's pairing code", || {
        telegram
            .sent()
            .iter()
            .any(|sent| sent.text.contains("perch pair approve"))
    });
    let stderr = service.stop();
    assert!(
        stderr.contains("could not be recorded, so none was offered"),
        "the owner is told (here: the log, as there is no owner): {stderr}"
    );
}

#[test]
fn groups_bots_and_chat_commands() {
    let agent = Scenario::telegram(TEAM).build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let team = Chat::group(-100, "Team");
    let carol = User::human(9, "Carol");
    let other_bot = User::bot(11, "Other", "otherbot");
    telegram.push_message(&team, &carol, "just chatting among ourselves");
    telegram.push_message(&team, &other_bot, "beep");
    let username = User::me().username.unwrap();
    telegram.push_message(&team, &carol, &format!("/status@{username}"));
    agent.wait_for_a_reply();
    assert!(
        telegram.sent()[0].shown.starts_with("perch is running"),
        "{}",
        telegram.sent()[0].shown
    );
    assert_eq!(
        model.requests().len(),
        0,
        "neither the chatter nor the bot started a run"
    );

    model.push(Script::text("first conversation"));
    telegram.push_message(&team, &carol, &format!("@{username} remember the number 7"));
    agent.wait_for_replies(2);
    let first = model.requests()[0].body.to_string();
    assert!(
        first.contains("- Carol (id 9): just chatting among ourselves"),
        "context is offered: {first}"
    );
    assert!(!first.contains("beep"), "a bot's message is not context");
    telegram.push_message(&team, &carol, &format!("/new@{username}"));
    agent.wait_for_replies(3);
    model.push(Script::text("second conversation"));
    telegram.push_message(&team, &carol, &format!("@{username} what number?"));
    agent.wait_for_replies(4);
    let last = model.last_request().body.to_string();
    assert!(
        !last.contains("remember the number 7"),
        "/new starts afresh: {last}"
    );
    service.stop();
}

#[test]
fn a_burst_over_fifty_conversations_is_answered_once_each_in_order() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let chats = 50;
    let per_chat = 20;
    let people: Vec<User> = (0..chats)
        .map(|n| User::human(1000 + n, &format!("P{n}")))
        .collect();
    for round in 0..per_chat {
        for person in &people {
            agent.send(person, &format!("c{}-m{round}", person.id));
        }
    }
    let total = usize::try_from(chats * per_chat).unwrap();
    wait_until("every answer", || telegram.sent().len() >= total);
    service.stop();
    assert_eq!(telegram.sent().len(), total, "answered once each");
    assert_eq!(model.requests().len(), total);
    assert_eq!(
        conversations_in_order(&model.requests()),
        usize::try_from(chats).unwrap()
    );
}

#[test]
fn a_burst_over_fifty_discord_channels_is_answered_once_each_in_order() {
    let agent = Scenario::discord("dm = \"allow\"").build();
    let (model, discord) = (&agent.model, agent.discord());
    let channels: Vec<u64> = (0..50).map(|n| 7_000 + n).collect();
    for channel in &channels {
        discord.dm_channel(*channel);
    }
    let watched = Watched::spawn(agent.command());
    agent.wait_for_gateway();
    let rounds = 6;
    for round in 0..rounds {
        for channel in &channels {
            let author = Author::user(*channel + 100_000, "someone");
            discord.push_message(*channel, &author, &format!("c{channel}-m{round}"));
        }
    }
    let total = channels.len() * rounds;
    super::support::wait::Poll::within(super::support::wait::WAIT)
        .holds(|| discord.posted().len() >= total);
    let lines = watched.stop();
    assert_eq!(
        discord.posted().len(),
        total,
        "answered once each; perch said: {lines:#?}"
    );
    assert_eq!(conversations_in_order(&model.requests()), channels.len());
}

#[test]
fn a_full_conversation_queue_is_answered_with_a_message_not_dropped() {
    let agent = Scenario::telegram("dm = \"allow\", queue_limit = 2").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let workspace = agent.path().join("workspace");
    model.push(Reply::bash(
        "hold",
        "touch started; while [ ! -e go ]; do sleep 0.02; done",
    ));
    model.push(Script::text("first done"));
    let service = agent.start();
    agent.send(&alice(), "first");
    wait_until("the first run to hold", || {
        workspace.join("started").exists()
    });
    for n in 2..=6 {
        agent.send(&alice(), &format!("message {n}"));
    }
    wait_until("three overflow answers", || {
        telegram
            .sent()
            .iter()
            .filter(|sent| sent.shown.contains("cannot queue more"))
            .count()
            == 3
    });
    std::fs::write(workspace.join("go"), "").unwrap();
    agent.wait_for_replies(6);
    service.stop();
    let answered = model.user_texts();
    assert!(
        answered.contains(&"message 2".to_owned()) && answered.contains(&"message 3".to_owned()),
        "{answered:?}"
    );
    assert!(
        !answered.iter().any(|text| text == "message 6"),
        "{answered:?}"
    );
}

#[test]
fn a_hook_that_keeps_failing_marks_its_channel_unhealthy() {
    let agent =
        Scenario::telegram("dm = \"allow\", on_message = function(msg, store) error(\"boom\") end")
            .build();
    let service = agent.start();
    for n in 0..5 {
        agent.send(&alice(), &format!("try {n}"));
    }
    wait_until("the channel to be reported unhealthy", || {
        let status = agent.status();
        status.connection() == "receiving" && !status.channel(0).unwrap().healthy
    });
    let text = agent.status_text();
    assert!(
        text.contains("UNHEALTHY: channels/tg.lua:2: boom"),
        "{text}"
    );
    service.stop();
    assert!(agent.telegram().sent().is_empty());
    assert_eq!(agent.model.requests().len(), 0);
}
