//! Receiving over the gateway: order, journal acks, back-fill, mentions, edits, files, watchdog.

use super::*;

// The connector.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_in_order_and_each_waits_for_the_journal() {
    let (fake, _connector, mut receiving) = receiving_from(|_| {}).await;
    let first = fake.push_message(ROOM, &alice(), "one");
    let second = fake.push_message(ROOM, &alice(), "two");
    let arrival = receiving.arrival().await;
    assert_eq!(arrival.event.platform_id, first.to_string());
    receiving.quiet_for(Duration::from_millis(400)).await;
    arrival.journaled.send(()).unwrap();
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, second.to_string());
    assert_eq!(event.room, ROOM.to_string());
    assert_eq!(event.thread, None);
    assert_eq!(event.cursor, None);
    assert_eq!(event.sender.id, alice().id.to_string());
    assert_eq!(event.sender.name, "alice");
    assert!(!event.sender.is_bot && !event.direct && !event.addressed);
    assert_eq!(event.text, "two");
    let age = chrono::Utc::now() - event.sent_at;
    assert!(age.num_seconds().abs() < 30, "{}", event.sent_at);
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bots_own_messages_are_not_handed_on() {
    let (fake, connector, mut receiving) = receiving_from(|fake| fake.guild_channel(ROOM)).await;
    connector
        .deliver(&delivery("own-1", ROOM, None, "I said this"))
        .await
        .unwrap();
    let from_alice = fake.push_message(ROOM, &alice(), "and I said this");
    assert_eq!(
        receiving.next_acked().await.platform_id,
        from_alice.to_string()
    );
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_messages_sent_while_down_are_back_filled() {
    let (fake, connector, mut receiving) = receiving_from(|fake| fake.dm_channel(DM)).await;
    let seen_room = fake.push_message(ROOM, &alice(), "before");
    let seen_dm = fake.push_message(DM, &alice(), "dm before");
    assert_eq!(
        receiving.next_acked().await.platform_id,
        seen_room.to_string()
    );
    assert!(receiving.next_acked().await.direct);
    receiving.stop().await.unwrap();
    until("the old session to close", || fake.live_sessions() == 0).await;

    let missed: Vec<u64> = (0..3)
        .map(|n| fake.push_message(ROOM, &alice(), &format!("while down {n}")))
        .collect();
    let missed_dm = fake.push_message(DM, &alice(), "dm while down");
    fake.push_message(OTHER_ROOM, &alice(), "a room perch never saw");
    let since = vec![
        (ROOM.to_string(), seen_room.to_string()),
        (DM.to_string(), seen_dm.to_string()),
    ];
    let mut receiving = receive(&connector, since);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(receiving.next_acked().await);
    }
    let rooms: Vec<(String, bool)> = got
        .iter()
        .map(|e| (e.platform_id.clone(), e.direct))
        .collect();
    let mut expected: Vec<(String, bool)> =
        missed.iter().map(|id| (id.to_string(), false)).collect();
    expected.push((missed_dm.to_string(), true));
    expected.sort();
    let mut sorted = rooms.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
    let in_room: Vec<&String> = got
        .iter()
        .filter(|e| e.room == ROOM.to_string())
        .map(|e| &e.platform_id)
        .collect();
    let missed_text: Vec<String> = missed.iter().map(u64::to_string).collect();
    assert_eq!(in_room, missed_text.iter().collect::<Vec<_>>());
    let live = fake.push_message(ROOM, &alice(), "live again");
    let mut next = receiving.next_acked().await;
    while next.platform_id != live.to_string() {
        assert!(
            missed.iter().any(|id| id.to_string() == next.platform_id),
            "{next:?}"
        );
        next = receiving.next_acked().await;
    }
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_resumes_after_op_7_without_identifying_again() {
    let (fake, _connector, mut receiving) = receiving_from(|_| {}).await;
    let before = pushed_and_taken(&fake, &mut receiving, "before").await;
    fake.force_reconnect();
    until("the resume", || fake.resumes() == 1).await;
    let after = fake.push_message(ROOM, &alice(), "after");
    let next = receiving.next_besides(&before.to_string()).await;
    assert_eq!(next.platform_id, after.to_string());
    assert_eq!(fake.identifies(), 1);
    let resume = fake.first_frame(6).unwrap();
    assert_eq!(resume["d"]["token"], format!("Bot {TOKEN}"));
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mentions_and_replies_to_the_bot_address_it() {
    let (fake, connector, mut receiving) = receiving_from(|fake| {
        fake.guild_channel(ROOM);
        fake.dm_channel(DM);
    })
    .await;
    let bob = Author::user(222_222_222_222_222_222, "bob");
    let mine = connector
        .deliver(&delivery("d-mine", ROOM, None, "a bot message"))
        .await
        .unwrap();
    let plain = fake.push_message(ROOM, &alice(), "just chatting");
    fake.push_message(ROOM, &alice(), &format!("<@{BOT_ID}> are you there?"));
    fake.push_message(ROOM, &alice(), &format!("<@!{BOT_ID}> nickname mention"));
    fake.push_reply(
        ROOM,
        &alice(),
        "replying to the bot",
        mine.platform_id.parse().unwrap(),
    );
    fake.push_reply(ROOM, &bob, "replying to alice", plain);
    fake.push_message(ROOM, &alice(), "<@222222222222222222> only bob");
    fake.push_message(DM, &alice(), "a direct message");
    let mut got = Vec::new();
    for _ in 0..7 {
        let event = receiving.next_acked().await;
        got.push((event.text, event.addressed, event.direct));
    }
    assert_eq!(
        got,
        [
            ("just chatting".to_owned(), false, false),
            (format!("<@{BOT_ID}> are you there?"), true, false),
            (format!("<@!{BOT_ID}> nickname mention"), true, false),
            ("replying to the bot".to_owned(), true, false),
            ("replying to alice".to_owned(), false, false),
            ("<@222222222222222222> only bob".to_owned(), false, false),
            ("a direct message".to_owned(), false, true),
        ]
    );
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_quotes_its_original_shortened_and_an_edit_is_handed_on_as_one() {
    let (fake, connector, mut receiving) = receiving_from(|fake| fake.guild_channel(ROOM)).await;
    let mine = connector
        .deliver(&delivery("d-mine", ROOM, None, "a bot message"))
        .await
        .unwrap();
    let long = "ß".repeat(400);
    let bob = Author::user(222_222_222_222_222_222, &"b".repeat(32));
    let original = fake.push_message(ROOM, &bob, &long);
    fake.push_reply(ROOM, &alice(), "too long", original);
    fake.push_reply(
        ROOM,
        &alice(),
        "replying to the bot",
        mine.platform_id.parse().unwrap(),
    );
    fake.push_edit(ROOM, original, "shorter now");
    fake.push_message(ROOM, &alice(), "after the edit");
    assert_eq!(receiving.next_acked().await.replying_to, None);
    let long_reply = receiving.next_acked().await;
    let bot_reply = receiving.next_acked().await;
    let edit = receiving.next_acked().await;
    let after = receiving.next_acked().await;
    receiving.stop().await.unwrap();
    let quote = shortened_quote(long_reply, &original.to_string());
    assert!(quote.text.starts_with("ßßß"));
    let author = quote.author.expect("the quoted author");
    assert_eq!(author.id, "222222222222222222");
    assert_eq!(author.name, "b".repeat(32));
    assert!(!author.is_bot);
    let quote = bot_reply.replying_to.expect("the reply quotes the bot");
    assert_eq!(quote.platform_id, mine.platform_id);
    assert_eq!(quote.text, "a bot message");
    assert!(quote.author.expect("the bot").is_bot);
    assert_eq!(edit.text, "shorter now");
    assert_eq!(edit.edit_of, Some(original.to_string()));
    assert!(edit.platform_id.starts_with(&format!("{original}:edited:")));
    assert_eq!(edit.sender.id, "222222222222222222");
    assert_eq!(after.text, "after the edit");
    assert_eq!(after.edit_of, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_unauthorized() {
    let fake = FakeDiscord::start();
    let connector = Arc::new(DiscordConnector::new(
        secret("not-the-token"),
        Some(fake.url()),
    ));
    let ended = receive(&connector, Vec::new()).ended().await;
    assert!(
        matches!(ended, Err(ConnectorError::Unauthorized { .. })),
        "{ended:?}"
    );
    assert_eq!(fake.identifies(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_message_content_intent_is_unauthorized_and_says_what_to_do() {
    let fake = FakeDiscord::start();
    fake.deny_privileged_intents();
    let connector = connector(&fake);
    let ended = receive(&connector, Vec::new()).ended().await;
    let Err(ConnectorError::Unauthorized { message }) = &ended else {
        panic!("{ended:?}");
    };
    assert!(message.contains("Message Content intent"), "{message}");
    let identify = fake.first_frame(2).unwrap();
    assert_eq!(identify["d"]["token"], format!("Bot {TOKEN}"));
    assert_eq!(identify["d"]["intents"], 37376);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_gateway_trips_the_watchdog() {
    let (fake, _connector, receiving) = receiving_watched(2).await;
    until("a heartbeat", || fake.heartbeats() >= 1).await;
    fake.freeze_gateway();
    let started = std::time::Instant::now();
    let ended = receiving.ended().await;
    let Err(ConnectorError::Disconnected { message }) = &ended else {
        panic!("{ended:?}");
    };
    assert!(message.contains("heartbeat ACK"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_watchdog_fires_the_next_receive_picks_the_recovered_client_up() {
    let (fake, connector, mut receiving) = receiving_watched(2).await;
    let seen = pushed_and_taken(&fake, &mut receiving, "before the silence").await;
    fake.freeze_gateway();
    assert!(matches!(
        receiving.ended().await,
        Err(ConnectorError::Disconnected { .. })
    ));
    let missed = fake.push_message(ROOM, &alice(), "during the silence");
    fake.thaw_gateway();
    let connector = Arc::new(
        Arc::into_inner(connector)
            .unwrap()
            .with_liveness(Duration::from_secs(60)),
    );
    let mut receiving = receive(&connector, vec![(ROOM.to_string(), seen.to_string())]);
    let event = tokio::time::timeout(Duration::from_secs(40), receiving.next_acked())
        .await
        .expect("the client recovers and back-fills");
    assert_eq!(event.platform_id, missed.to_string());
    let live = fake.push_message(ROOM, &alice(), "after the silence");
    let next = receiving.next_besides(&missed.to_string()).await;
    assert_eq!(next.platform_id, live.to_string());
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_is_identified_afresh_and_the_gap_back_filled() {
    let (fake, _connector, mut receiving) = receiving_from(|_| {}).await;
    pushed_and_taken(&fake, &mut receiving, "before").await;
    fake.invalidate_sessions();
    let missed = fake.push_message(ROOM, &alice(), "while no session was live");
    until("a second identify", || fake.identifies() == 2).await;
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, missed.to_string());
    let live = fake.push_message(ROOM, &alice(), "on the new session");
    let next = receiving.next_besides(&missed.to_string()).await;
    assert_eq!(next.platform_id, live.to_string());
    receiving.stop().await.unwrap();
    until("the session to close", || fake.live_sessions() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_but_healthy_gateway_does_not_trip_the_watchdog() {
    let (fake, _connector, mut receiving) = receiving_watched(3).await;
    receiving.quiet_for(Duration::from_secs(6)).await;
    assert!(!receiving.is_finished());
    assert!(fake.heartbeats() >= 3);
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_closes_the_gateway_session() {
    let (fake, _connector, receiving) = receiving_from(|_| {}).await;
    assert_eq!(receiving.stop().await, Ok(()));
    until("the session to close", || fake.live_sessions() == 0).await;
}

// Files.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_are_handed_on_and_fetched_without_the_token() {
    let (fake, connector, mut receiving) = receiving_from(|_| {}).await;
    let mut big = FakeFile::new("big.zip", "application/zip", b"zip");
    big.declared = Some(30_000_000);
    let mut liar = FakeFile::new("liar.bin", "application/octet-stream", &[9u8; 4000]);
    liar.declared = Some(10);
    fake.push_files(
        ROOM,
        &alice(),
        "",
        &[
            FakeFile::new("notes v2.txt", "text/plain", b"the notes"),
            big,
            liar,
        ],
    );
    let event = receiving.next_acked().await;
    receiving.stop().await.unwrap();
    assert_eq!(event.text, "", "a message with only files still arrives");
    let names: Vec<_> = event
        .attachments
        .iter()
        .map(|attachment| attachment.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["notes v2.txt", "big.zip", "liar.bin"]);
    let notes = &event.attachments[0];
    assert_eq!(notes.content_type.as_deref(), Some("text/plain"));
    assert_eq!(notes.size, Some(9));
    assert_eq!(
        connector.fetch(&event, notes, 100).await.unwrap(),
        b"the notes"
    );
    assert_eq!(
        connector
            .fetch(&event, &event.attachments[1], 25_000_000)
            .await,
        Err(FetchError::TooLarge {
            size: Some(30_000_000)
        })
    );
    assert_eq!(
        connector.fetch(&event, &event.attachments[2], 1000).await,
        Err(FetchError::TooLarge { size: Some(4000) }),
        "the CDN's content-length gives a liar away"
    );
    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    assert!(
        downloads.iter().all(|(_, authorized)| !authorized),
        "the bot token never goes to the CDN: {downloads:?}"
    );
}
