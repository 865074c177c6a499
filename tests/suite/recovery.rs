//! Crashes and restarts of `perch run`: nothing lost or doubled, interrupted runs resumed once.

use super::support::crash::{Seeded, restart, restart_past_resumptions, unknown_deliveries};
use super::support::fake_discord::{Author, BOT_ID};
use super::support::fake_model::{Received, Reply, Script};
use super::support::fake_telegram::{Chat, User};
use super::support::scenario::{Scenario, alice, crash_on_one_message};
use super::support::status::Report;
use super::support::wait::wait_until;
use std::path::Path;
use std::time::Duration;

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_crash_between_journal_and_acknowledgement_loses_and_doubles_nothing() {
    let agent = crash_on_one_message(None, "are you there?", "after:inbox_journaled");
    assert!(agent.telegram().sent().is_empty());

    agent.model.push(Script::text("yes, once"));
    let service = agent.start();
    agent.wait_for_a_reply();
    service.stop();
    assert_eq!(agent.telegram().sent().len(), 1);
    assert_eq!(agent.model.requests().len(), 1);
}

/// Whether a delivery in the outbox under `dir` is of unknown fate.
fn an_unknown_delivery(dir: &Path) -> bool {
    super::support::journal_text(&dir.join(".perch/outbox")).contains("\"unknown\"")
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_crash_after_an_attempt_began_is_reported_not_resent_on_telegram() {
    let reply = Some("this may or may not have been posted");
    let agent = crash_on_one_message(reply, "hello", "after:delivery_sending");

    let service = agent.start();
    wait_until("the outbox to settle", || an_unknown_delivery(agent.path()));
    let stderr = service.stop();
    assert!(
        agent.telegram().sent().is_empty(),
        "never resent on Telegram"
    );
    assert!(stderr.contains("unknown"), "{stderr}");
    assert_eq!(
        agent.model.requests().len(),
        1,
        "the message was not answered again"
    );
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_reply_recorded_but_never_attempted_before_a_crash_is_sent_once_after_it_on_telegram() {
    let agent = crash_on_one_message(
        Some("sent after the restart"),
        "hello",
        "after:delivery_intent",
    );
    assert!(agent.telegram().sent().is_empty());

    let service = agent.start();
    agent.wait_for_a_reply();
    wait_until("the outbox to settle", || {
        agent.status().outbox_pending == 0
    });
    service.stop();
    let sent = agent.telegram().sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].text.contains("sent after the restart"), "{sent:?}");
    assert!(!an_unknown_delivery(agent.path()));
    assert_eq!(
        agent.model.requests().len(),
        1,
        "the message was not answered again"
    );
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_crash_after_a_command_reply_is_recorded_neither_repeats_the_command_nor_sends_twice() {
    let agent = crash_on_one_message(None, "/new", "after:delivery_intent");
    let generation = agent
        .path()
        .join(".perch/generations/tg-42-a69b25403314d72a");
    assert_eq!(std::fs::read_to_string(&generation).unwrap(), "1");

    let service = agent.start();
    wait_until("the event to be settled and its reply with it", || {
        let status = agent.status();
        status.inbox_pending == 0 && status.outbox_pending == 0
    });
    service.stop();
    assert_eq!(
        std::fs::read_to_string(&generation).unwrap(),
        "1",
        "/new was not carried out a second time"
    );
    let sent = agent.telegram().sent();
    assert_eq!(
        sent.len(),
        1,
        "the reply recorded before the crash, never attempted, is sent once, and no second \
         reply is made: {sent:?}"
    );
    assert!(agent.model.requests().is_empty());
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_crash_after_posting_on_discord_resends_with_the_same_nonce_and_posts_once() {
    let agent = Scenario::discord(super::delivery::GENERAL).build();
    let discord = agent.discord();
    discord.guild_channel(555);
    agent.model.push(Script::text("posted exactly once"));
    let crashing = agent.start_at("after:delivery_sent");
    agent.wait_for_gateway();
    discord.push_message(
        555,
        &Author::user(77, "Dana"),
        &format!("<@{BOT_ID}> hello"),
    );
    crashing.crashed("after:delivery_sent");
    assert_eq!(discord.posted().len(), 1);

    let posts = || {
        discord
            .requests()
            .iter()
            .filter(|request| {
                request.starts_with("POST") && request.ends_with("/channels/555/messages")
            })
            .count()
    };
    let service = agent.start();
    wait_until("the resend", || posts() == 2);
    service.stop();
    assert_eq!(
        discord.posted().len(),
        1,
        "Discord kept one message: the resend carried the same nonce"
    );
    let from_bot = discord
        .messages(555)
        .iter()
        .filter(|message| message["author"]["id"].as_str() == Some(BOT_ID.to_string().as_str()))
        .count();
    assert_eq!(from_bot, 1);
    assert_eq!(
        agent.model.requests().len(),
        1,
        "the message was not answered again"
    );
}

#[test]
fn three_crashes_in_a_row_start_the_fourth_with_channels_paused() {
    let agent = Scenario::telegram_dm().build();
    let telegram = agent.telegram();
    for crash in 1..=3 {
        let polls = telegram.poll_offsets().len();
        let service = agent.start();
        wait_until("the channel to poll", || {
            telegram.poll_offsets().len() > polls
        });
        service.kill();
        assert_eq!(
            agent
                .status()
                .last_start
                .and_then(|start| start.channels_paused),
            None,
            "crash {crash} does not trip the breaker yet"
        );
    }
    let polls = telegram.poll_offsets().len();
    let service = agent.start();
    agent.wait_for_service();
    let status = agent.status();
    let reason = status.channels_paused.clone().unwrap();
    assert!(reason.contains("3 times in a row"), "{reason}");
    assert!(
        status.connection().starts_with("paused until"),
        "{status:?}"
    );
    assert_eq!(
        telegram.poll_offsets().len(),
        polls,
        "a paused channel is not polled"
    );
    let stderr = service.stop();
    assert!(stderr.contains("channels paused"), "{stderr}");

    // A clean stop resets it.
    let service = agent.start();
    wait_until("the channel to poll again", || {
        telegram.poll_offsets().len() > polls
    });
    service.stop();
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_reply_lost_between_the_run_and_the_outbox_is_delivered_after_a_restart() {
    let reply = Some("the answer, once");
    let agent = crash_on_one_message(reply, "what is it?", "before:delivery_intent");
    let telegram = agent.telegram();
    assert!(telegram.sent().is_empty());

    let service = agent.start();
    agent.wait_for_a_reply();
    let stderr = service.stop();
    assert_eq!(telegram.sent().len(), 1, "{stderr}");
    assert_eq!(telegram.sent()[0].shown, "the answer, once");
    assert_eq!(agent.model.requests().len(), 1, "the run was not repeated");

    // A third start sends nothing more.
    let service = agent.start();
    agent.wait_for_service();
    service.stop();
    assert_eq!(telegram.sent().len(), 1);
}

/// How many times `text` appears in the model request's body.
fn times_in_request(request: &Received, text: &str) -> usize {
    request.body.to_string().matches(text).count()
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_chat_run_interrupted_while_asking_the_model_is_resumed_and_answered() {
    for failpoint in [
        "after:attempt_started",
        "after:user_entry",
        "after:operation_started",
    ] {
        let agent = crash_on_one_message(None, "do the thing", failpoint);

        agent.model.push(Script::text("the thing is done"));
        let service = agent.start();
        agent.wait_for_a_reply();
        wait_until("the inbox to settle", || agent.status().inbox_pending == 0);
        service.stop();
        let sent = agent.telegram().sent();
        assert_eq!(sent.len(), 1, "{failpoint}: {sent:?}");
        assert_eq!(sent[0].shown, "the thing is done", "{failpoint}");
        let requests = agent.model.requests();
        assert_eq!(
            requests.len(),
            1,
            "{failpoint}: asked once, after the restart"
        );
        assert_eq!(
            times_in_request(&requests[0], "do the thing"),
            1,
            "{failpoint}: the message is in the conversation once: {}",
            requests[0].body
        );
    }
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_chat_run_interrupted_after_bash_started_gets_a_note_naming_it() {
    let agent = Scenario::telegram_dm().build();
    agent.model.push(Reply::bash("c1", "echo hi"));
    agent.send(&alice(), "run it");
    agent.crash_at("after:tool_started");

    let service = agent.start();
    agent.wait_for_a_reply();
    service.stop();
    let note = &agent.telegram().sent()[0];
    assert!(
        note.shown.starts_with("Sorry, I could not finish that") && note.shown.contains("bash"),
        "{}",
        note.shown
    );
    assert_eq!(agent.model.requests().len(), 1, "the run was not continued");
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_resumed_run_that_crashes_again_is_not_resumed_a_third_time() {
    let agent = crash_on_one_message(None, "do the thing", "after:attempt_started");
    let exited = agent
        .start_at("after:attempt_started")
        .exit_within(Duration::from_secs(30));
    assert!(
        exited.is_some_and(|status| !status.success()),
        "the run was resumed, and crashed again: {exited:?}"
    );
    assert!(agent.telegram().sent().is_empty());

    agent.model.push(Script::text("never asked"));
    let service = agent.start();
    agent.wait_for_a_reply();
    wait_until("the inbox to settle", || agent.status().inbox_pending == 0);
    service.stop();
    let sent = agent.telegram().sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].shown.starts_with("Sorry, I could not finish that")
            && sent[0].shown.contains("not tried a third time"),
        "{}",
        sent[0].shown
    );
    assert!(
        agent.model.requests().is_empty(),
        "the run was not tried again"
    );
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_burst_survives_repeated_sigkills_answered_once_each_by_the_model() {
    let mut random = Seeded::from_env();
    let seed = random.seed();
    let agent = Scenario::telegram_dm().build();
    let telegram = agent.telegram();
    agent.model.echo_after(Duration::from_millis(900));
    let people: Vec<User> = (0..6)
        .map(|n| User::human(2000 + n, &format!("Q{n}")))
        .collect();
    let mut pushed = std::collections::HashMap::new();
    for round in 0..5 {
        for person in &people {
            let text = format!("q{}-m{round}", person.id);
            let message = telegram.push_message(&Chat::private(person), person, &text);
            pushed.insert((person.id, message.message_id), text);
        }
    }
    let mut resumed = 0;
    for kill in 0..3 {
        let service = restart_past_resumptions(&agent, &mut resumed);
        let after = random.moment();
        eprintln!("kill {kill} after {after:?}");
        // The kill lands at a random moment of the work: this sleep is the schedule, not a wait.
        std::thread::sleep(after);
        service.kill();
    }
    eprintln!("{resumed} run(s) resumed");
    let service = restart(&agent);
    let unknown = || unknown_deliveries(agent.path()).len();
    wait_until("every message answered", || {
        let status = agent.status();
        status.inbox_pending == 0
            && status.outbox_pending == 0
            && telegram.sent().len() + unknown() >= pushed.len()
    });
    service.stop();
    let sent = telegram.sent();
    let mut answered = std::collections::HashSet::new();
    for reply in &sent {
        let to = (
            reply.chat_id,
            reply.reply_to.expect("every reply answers a message"),
        );
        assert!(
            answered.insert(to),
            "{to:?} answered twice (seed {seed}): {sent:#?}"
        );
        assert!(
            reply.shown.starts_with("echo: <origin ")
                && reply.shown.ends_with(&format!("/>\n{}", pushed[&to])),
            "answered by the model, not a note (seed {seed}): {:?} to {:?}",
            reply.shown,
            pushed[&to]
        );
    }
    // A delivery of unknown fate (perch died between recording it and its receipt) is never
    // resent; it may have been posted (then it is among `answered` too) or not.
    let missing = pushed.len() - answered.len();
    assert!(
        missing <= unknown(),
        "nothing lost (seed {seed}): {missing} message(s) unanswered, {} delivery(ies) of unknown fate",
        unknown()
    );
}
