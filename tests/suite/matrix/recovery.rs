//! Crashes and bursts on Matrix through `perch run`: nothing lost, doubled or out of order.

use super::*;
use crate::suite::support::{conversations_in_order, journal_text};

/// `alice`, `bot`, an agent answering as `bot`, and a direct room `alice` opened with `bot`
/// while the agent's `perch run` ran, which has stopped since.
async fn a_dm_perch_knows() -> (Account, Account, Agent, String) {
    let (_, alice, bot) = alice_and_bot().await;
    let agent = matrix_agent(&bot, &alice);
    let service = agent.start();
    let room = alice.open_dm(&bot.user_id).await;
    service.stop();
    (alice, bot, agent, room)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
async fn a_crash_between_journal_and_sync_on_matrix_loses_and_doubles_nothing() {
    let (alice, bot, agent, room) = a_dm_perch_knows().await;
    let model = &agent.model;

    // The message arrives while perch is down; the next start journals it and dies before it
    // can acknowledge anything.
    alice.say(&room, "are you there?").await;
    let crashing = agent.start_at("after:inbox_journaled");
    tokio::task::spawn_blocking(move || crashing.crashed("after:inbox_journaled"))
        .await
        .unwrap();
    assert!(bot_replies(&alice, &room, &bot).await.is_empty());

    model.push(Script::text("yes, once"));
    let service = agent.start();
    replies_until(&alice, &room, &bot, "the answer", |n| n > 0).await;
    alice.say(&room, "thanks").await;
    replies_until(&alice, &room, &bot, "the second answer", |n| n == 2).await;
    service.stop();
    let asked = model.user_texts();
    assert_eq!(
        asked.len(),
        2,
        "each message reached the model once: {asked:?}"
    );
    assert!(asked[0].contains("are you there?"), "{asked:?}");
    assert_eq!(
        bot_replies(&alice, &room, &bot).await[0]["content"]["body"],
        "yes, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_ten_matrix_rooms_is_answered_once_each_in_order() {
    let (_, alice, bot) = alice_and_bot().await;
    let agent = matrix_agent(&bot, &alice);
    let model = &agent.model;
    let service = agent.start();
    let mut rooms = Vec::new();
    for _ in 0..10 {
        let room = alice.open_dm(&bot.user_id).await;
        rooms.push(room);
    }
    let per_room = 10;
    for round in 0..per_room {
        for (index, room) in rooms.iter().enumerate() {
            alice.say(room, &format!("r{index}-m{round}")).await;
        }
    }
    let total = rooms.len() * per_room;
    wait_until("every answer", || {
        let answered = model.requests().len();
        async move { answered >= total }
    })
    .await;
    for room in &rooms {
        replies_until(&alice, room, &bot, "the room's answers", |n| n >= per_room).await;
    }
    service.stop();
    assert_eq!(model.requests().len(), total, "answered once each");
    assert_eq!(conversations_in_order(&model.requests()), rooms.len());
    for room in &rooms {
        assert_eq!(bot_replies(&alice, room, &bot).await.len(), per_room);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
async fn a_crash_after_a_matrix_send_resends_with_the_same_transaction_and_posts_once() {
    let (alice, bot, agent, room) = a_dm_perch_knows().await;
    let model = &agent.model;

    model.push(Script::text("posted exactly once"));
    alice.say(&room, "hello").await;
    // The reply is posted, then perch dies before it records the receipt.
    let crashing = agent.start_at("after:delivery_sent");
    tokio::task::spawn_blocking(move || crashing.crashed("after:delivery_sent"))
        .await
        .unwrap();
    assert_eq!(bot_replies(&alice, &room, &bot).await.len(), 1);

    // Inside the window the restart sends it again under the same transaction id, from the
    // same device; the homeserver recognises it and nothing new appears.
    let service = agent.start();
    let outbox = agent.path().join(".perch/outbox");
    wait_until("the outbox to settle", || {
        std::future::ready(journal_text(&outbox).contains("\"receipt\""))
    })
    .await;
    alice.say(&room, "still there?").await;
    replies_until(&alice, &room, &bot, "the next answer", |n| n == 2).await;
    service.stop();
    let replies = bot_replies(&alice, &room, &bot).await;
    assert_eq!(
        replies.len(),
        2,
        "the first reply was not posted twice: {replies:#?}"
    );
    assert_eq!(replies[0]["content"]["body"], "posted exactly once");
    assert_eq!(model.requests().len(), 2);
}
