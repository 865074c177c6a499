//! How replies go out through `perch run`: as replies, mentioning nobody, in order, rate-limited.

use super::support::fake_discord::{Author, BOT_ID, TOKEN as DISCORD_TOKEN};
use super::support::fake_model::Script;
use super::support::fake_telegram::User;
use super::support::scenario::{Agent, Perch, Scenario, alice};
use super::support::wait::wait_until;
use perch_core::config::Api;

/// The general channel `555` on Discord, open to everyone who mentions the bot.
pub(super) const GENERAL: &str =
    "rooms = { general = \"555\" }, allow = { rooms = { \"general\" } }";

#[test]
fn a_discord_message_is_answered_in_its_channel_as_a_reply_without_pings() {
    let agent = Scenario::discord(GENERAL)
        .model(Api::AnthropicMessages)
        .build();
    let discord = agent.discord();
    discord.guild_channel(555);
    agent
        .model
        .push(Script::text("Hi @everyone, the answer is 42."));
    let service = agent.start();
    agent.wait_for_gateway();
    let asked = discord.push_message(
        555,
        &Author::user(77, "Dana"),
        &format!("<@{BOT_ID}> what is the answer?"),
    );
    agent.wait_for_a_reply();
    let stderr = service.stop();
    let posted = &discord.posted()[0];
    assert_eq!(posted.channel, 555);
    assert_eq!(posted.body["content"], "Hi @everyone, the answer is 42.");
    assert_eq!(
        posted.body["message_reference"]["message_id"],
        asked.to_string()
    );
    assert_eq!(
        posted.body["allowed_mentions"]["parse"],
        serde_json::json!([])
    );
    assert!(
        posted.body["nonce"]
            .as_str()
            .is_some_and(|nonce| nonce.len() <= 25)
    );
    assert!(!stderr.contains(DISCORD_TOKEN));
}

/// A Telegram agent asked by Alice to "write a lot", its reply of two pieces (each too long for
/// one Telegram message) held by a rate limit of `retry_after` seconds on her chat: the agent,
/// its `perch run`, and the two pieces.
fn a_long_reply_rate_limited(retry_after: u32) -> (Agent, Perch, String, String) {
    let agent = Scenario::telegram_dm().build();
    let first = "one ".repeat(700).trim_end().to_owned();
    let second = "two ".repeat(700).trim_end().to_owned();
    agent
        .model
        .push(Script::text(&format!("{first}\n\n{second}")));
    let telegram = agent.telegram();
    telegram.rate_limit("sendMessage", Some(42), retry_after);
    let service = agent.start();
    agent.send(&alice(), "write a lot");
    wait_until("the long reply to be rate-limited", || {
        telegram.calls_to("sendMessage").contains(&42)
    });
    (agent, service, first, second)
}

#[test]
fn a_rooms_replies_keep_their_order_and_its_rate_limit_does_not_delay_another_room() {
    let (agent, service, first, second) = a_long_reply_rate_limited(1);
    let telegram = agent.telegram();
    agent.send(&alice(), "/status");
    wait_until("the command's reply to queue behind the long one", || {
        let status = agent.status();
        status.inbox_pending == 0 && status.outbox_pending == 3
    });

    agent.send(&User::human(43, "Bob"), "/status");
    wait_until("Bob's reply", || {
        telegram.sent().iter().any(|sent| sent.chat_id == 43)
    });
    assert!(
        telegram.sent().iter().all(|sent| sent.chat_id == 43),
        "Alice's room is still rate-limited"
    );

    telegram.lift_rate_limits();
    let to_alice = || -> Vec<String> {
        telegram
            .sent()
            .into_iter()
            .filter(|sent| sent.chat_id == 42)
            .map(|sent| sent.shown)
            .collect()
    };
    wait_until("Alice's three messages", || to_alice().len() == 3);
    service.stop();
    let shown = to_alice();
    assert_eq!(shown[0], first, "the reply's first piece first");
    assert_eq!(shown[1], second, "then its second");
    let command_reply = &shown[2];
    assert!(
        command_reply.starts_with("perch is running: "),
        "the command's reply after them: {command_reply}"
    );
}

#[test]
fn a_reply_waiting_out_a_rate_limit_when_perch_is_killed_is_sent_after_the_restart_even_on_telegram()
 {
    let (agent, service, _, _) = a_long_reply_rate_limited(120);
    let outbox = agent.path().join(".perch/outbox");
    wait_until(
        "the outbox to say the rate-limited piece was not taken",
        || super::support::journal_text(&outbox).contains(r#""type":"unsent""#),
    );
    service.kill();
    // The first piece was refused and the second never tried: neither is unknown.
    each_piece_is_sent_once_after_the_restart(&agent);
}

#[test]
fn a_reply_waiting_out_a_rate_limit_at_shutdown_is_sent_after_the_restart_even_on_telegram() {
    let (agent, service, _, _) = a_long_reply_rate_limited(120);
    service.stop();
    each_piece_is_sent_once_after_the_restart(&agent);
}

/// With the long reply of [`a_long_reply_rate_limited`] unsent and perch stopped: the rate limit
/// lifted and perch started again, each piece is sent once, in order, and neither is reported
/// unknown.
fn each_piece_is_sent_once_after_the_restart(agent: &Agent) {
    let telegram = agent.telegram();
    assert!(telegram.sent().is_empty());
    telegram.lift_rate_limits();
    let service = agent.start();
    wait_until("both pieces of the reply", || telegram.sent().len() >= 2);
    wait_until("the outbox to be empty", || {
        agent.status().outbox_pending == 0
    });
    let stderr = service.stop();
    let shown: Vec<String> = telegram.sent().into_iter().map(|sent| sent.shown).collect();
    assert_eq!(shown.len(), 2, "each piece once: {shown:?}");
    assert!(shown[0].starts_with("one one"), "in order: {shown:?}");
    assert!(shown[1].starts_with("two two"), "in order: {shown:?}");
    assert!(
        !stderr.contains(": unknown") && !stderr.contains("unknown fate"),
        "certainly unsent, so never reported unknown: {stderr}"
    );
    assert_eq!(agent.model.requests().len(), 1, "not answered again");
}
