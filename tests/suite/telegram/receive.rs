//! Receiving from the Bot API: order, confirmation after the journal, cursors, files, polls.

use super::*;

// The connector.

#[tokio::test]
async fn receive_hands_events_in_order_and_confirms_only_after_the_ack() {
    let (fake, pushed, connector) = alice_wrote((1..=5).map(|n| format!("message {n}")));
    let mut receiving = receive(&connector, None);
    let first = receiving.arrival().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.poll_offsets(), vec![None], "no poll before the ack");
    first.journaled.send(()).unwrap();
    let mut events = vec![first.event];
    for _ in 1..5 {
        events.push(receiving.next_acked().await);
    }
    let last = pushed.last().unwrap().update_id;
    fake.wait_for_poll(last + 1).await;
    receiving.stop().await.unwrap();
    assert!(fake.pending_update_ids().is_empty());
    for (event, pushed) in events.iter().zip(&pushed) {
        assert_eq!(event.platform_id, pushed.platform_id());
        assert_eq!(event.cursor, Some(pushed.update_id.to_string()));
    }
    let texts: Vec<&str> = events.iter().map(|event| event.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "message 1",
            "message 2",
            "message 3",
            "message 4",
            "message 5"
        ]
    );
    let event = &events[0];
    assert_eq!(event.room, "1001");
    assert_eq!(event.thread, None);
    assert_eq!(event.sender.id, "1001");
    assert_eq!(event.sender.name, "Alice");
    assert!(!event.sender.is_bot);
    assert!(event.direct);
    assert!(!event.addressed);
    let age = chrono::Utc::now() - event.sent_at;
    assert!(age.num_seconds().abs() < 60, "{age}");
    let poll = fake.calls_of("GetUpdates").remove(0);
    assert_eq!(
        poll.body["allowed_updates"],
        json!(["message", "edited_message"])
    );
    assert_eq!(poll.body["timeout"], json!(50));
}

/// A fake Bot API holding Alice's private messages `texts`, what was pushed, and a connector
/// to the fake.
fn alice_wrote<S: ToString>(
    texts: impl IntoIterator<Item = S>,
) -> (FakeTelegram, Vec<Pushed>, Arc<TelegramConnector>) {
    let fake = FakeTelegram::start();
    let pushed = alice_said(&fake, texts.into_iter().map(|text| text.to_string()));
    let connector = connector(&fake);
    (fake, pushed, connector)
}

#[tokio::test]
async fn an_unacknowledged_update_comes_again_and_an_acknowledged_one_does_not() {
    let (fake, pushed, connector) = alice_wrote(["hello"]);
    let pushed = pushed[0];

    let mut first = receive(&connector, None);
    let unacked = first.arrival().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.stop().await.unwrap();
    drop(unacked);
    assert_eq!(fake.pending_update_ids(), vec![pushed.update_id]);

    let mut second = receive(&connector, None);
    let again = second.arrival().await;
    assert_eq!(again.event.platform_id, pushed.platform_id());
    again.journaled.send(()).unwrap();
    fake.wait_for_poll(pushed.update_id + 1).await;
    second.stop().await.unwrap();
    assert!(fake.pending_update_ids().is_empty());

    let mut third = receive(&connector, again.event.cursor.clone());
    third.quiet_for(Duration::from_millis(500)).await;
    third.stop().await.unwrap();
}

#[tokio::test]
async fn an_event_perch_drops_unjournaled_ends_receive_without_confirming_it() {
    let (fake, pushed, connector) = alice_wrote(["hello"]);
    let pushed = pushed[0];
    let mut receiving = receive(&connector, None);
    drop(receiving.arrival().await.journaled);
    let ended = receiving.ended().await.unwrap_err();
    assert!(
        matches!(&ended, ConnectorError::Disconnected { message } if message.contains("did not journal")),
        "{ended:?}"
    );
    assert_eq!(fake.pending_update_ids(), vec![pushed.update_id]);
}

#[tokio::test]
async fn a_restart_resumes_from_the_cursor_perch_gives() {
    let (fake, pushed, connector) = alice_wrote((1..=3).map(|n| format!("m{n}")));
    let mut first = receive(&connector, None);
    first.next_acked().await;
    let journaled = first.next_acked().await.cursor;
    let in_flight = first.arrival().await;
    first.stop().await.unwrap();
    drop(in_flight);
    assert_eq!(journaled, Some(pushed[1].update_id.to_string()));

    let mut second = receive(&connector, journaled);
    let resumed = second.next_acked().await;
    assert_eq!(resumed.platform_id, pushed[2].platform_id());
    assert_eq!(fake.poll_offsets().last(), Some(&Some(pushed[2].update_id)));
    let later = alice_said(&fake, ["m4".to_owned()].into_iter()).remove(0);
    assert_eq!(second.next_acked().await.platform_id, later.platform_id());
    second.quiet_for(Duration::from_millis(300)).await;
    second.stop().await.unwrap();
}

#[tokio::test]
async fn receive_skips_what_is_not_a_message_hands_on_edits_and_confirms_it() {
    let fake = FakeTelegram::start();
    let chat = Chat::group(-300, "Team");
    fake.push_raw_message(
        json!({"message_id": 1, "chat": {"id": -300, "type": "group",
        "title": "Team"}, "date": 1, "from": {"id": 1001, "is_bot": false, "first_name": "A"},
        "sticker": {"file_id": "s", "file_unique_id": "s", "type": "regular", "width": 1,
        "height": 1, "is_animated": false, "is_video": false}}),
    );
    let text = fake.push_message(&chat, &alice(), "first");
    fake.push_edit(text, "first, edited");
    let broken = fake.push_raw_message(json!({"message_id": "not a number", "chat": 7}));
    let captioned = fake.push(Incoming::photo(&chat, &alice(), Some("look at this")));
    let connector = connector(&fake);
    let mut receiving = receive(&connector, None);
    assert_eq!(receiving.next_acked().await.text, "first");
    let edit = receiving.next_acked().await;
    assert_eq!(edit.text, "first, edited");
    assert_eq!(edit.edit_of, Some(text.platform_id()));
    assert!(
        edit.platform_id
            .starts_with(&format!("{}:edited:", text.platform_id())),
        "{edit:?}"
    );
    let caption = receiving.next_acked().await;
    assert_eq!(caption.text, "look at this");
    assert_eq!(caption.platform_id, captioned.platform_id());
    fake.wait_for_poll(captioned.update_id + 1).await;
    receiving.quiet_for(Duration::from_millis(200)).await;
    receiving.stop().await.unwrap();
    assert!(fake.pending_update_ids().is_empty());
    assert!(broken < captioned.update_id);
}

#[tokio::test]
async fn a_reply_carries_the_quoted_author_and_shortened_text() {
    let fake = FakeTelegram::start();
    let group = Chat::group(-300, "Team");
    let forum = Chat::forum(-100_777, "Forum");
    let connector = connector(&fake);
    let long = format!("{}{}", "é".repeat(300), "tail");
    let original = fake.push_message(&group, &User::human(1002, &"B".repeat(200)), &long);
    let bot_message = posted_message_id(&connector, "-300").await;
    fake.push(Incoming::new(&group, &alice(), "so long").reply_to(original.message_id));
    fake.push(Incoming::new(&group, &alice(), "ok").reply_to(bot_message));
    fake.push(Incoming::new(&forum, &alice(), "in a topic").in_thread(5));
    let mut receiving = receive(&connector, None);
    assert_eq!(receiving.next_acked().await.replying_to, None);
    let long_reply = receiving.next_acked().await;
    let bot_reply = receiving.next_acked().await;
    let topic = receiving.next_acked().await;
    receiving.stop().await.unwrap();
    let quote = shortened_quote(long_reply, &original.platform_id());
    assert!(quote.text.starts_with("ééé"), "{quote:?}");
    let author = quote.author.expect("the quoted author");
    assert_eq!(author.id, "1002");
    assert!(!author.is_bot);
    assert!(author.name.starts_with("BBB"));
    assert_eq!(
        author.name.chars().count(),
        perch::channel::QUOTE_NAME_MAX_CHARS
    );
    let quote = bot_reply
        .replying_to
        .expect("the reply quotes the bot's message");
    assert_eq!(quote.platform_id, format!("-300:{bot_message}"));
    assert_eq!(quote.text, "an answer");
    assert!(quote.author.expect("the bot").is_bot);
    assert_eq!(topic.replying_to, None, "a topic message replies to nobody");
}

#[tokio::test]
async fn receive_detects_mentions_replies_and_threads() {
    let fake = FakeTelegram::start();
    let group = Chat::group(-300, "Team");
    let forum = Chat::forum(-100_777, "Forum");
    let helper = User::bot(2002, "Helper", "helper_bot");
    let connector = connector(&fake);
    let from_alice = fake.push_message(&group, &alice(), "context");
    let bot_message = posted_message_id(&connector, "-300").await;
    let cases: Vec<(Incoming, bool)> = vec![
        (Incoming::new(&group, &alice(), "hello all"), false),
        (
            Incoming::new(&group, &alice(), "hey @perch_test_bot, help"),
            true,
        ),
        (Incoming::new(&group, &alice(), "HEY @PERCH_TEST_BOT"), true),
        (
            Incoming::new(&group, &alice(), "🎉🎉 @perch_test_bot"),
            true,
        ),
        (Incoming::new(&group, &alice(), "ping @someone_else"), false),
        (
            Incoming::new(&group, &alice(), "mail me at a@perch_test_bot.com"),
            false,
        ),
        (
            Incoming::new(&group, &alice(), "/status@perch_test_bot"),
            true,
        ),
        (Incoming::new(&group, &alice(), "/status@helper_bot"), false),
        (
            Incoming::new(&group, &alice(), "thanks Perch").text_mention("Perch", &User::me()),
            true,
        ),
        (
            Incoming::new(&group, &alice(), "thanks Helper").text_mention("Helper", &helper),
            false,
        ),
        (
            Incoming::new(&group, &alice(), "ok").reply_to(bot_message),
            true,
        ),
        (
            Incoming::new(&group, &alice(), "me too").reply_to(from_alice.message_id),
            false,
        ),
        (Incoming::new(&group, &helper, "beep @perch_test_bot"), true),
        (
            Incoming::new(&forum, &alice(), "in a topic").in_thread(5),
            false,
        ),
    ];
    let expected: Vec<bool> = cases.iter().map(|(_, addressed)| *addressed).collect();
    for (incoming, _) in cases {
        fake.push(incoming);
    }
    let mut receiving = receive(&connector, None);
    assert_eq!(receiving.next_acked().await.text, "context");
    let mut events = Vec::new();
    for _ in &expected {
        events.push(receiving.next_acked().await);
    }
    receiving.stop().await.unwrap();
    let addressed: Vec<bool> = events.iter().map(|event| event.addressed).collect();
    assert_eq!(addressed, expected, "{events:#?}");
    assert!(events.iter().all(|event| !event.direct));
    let beep = &events[12];
    assert_eq!(beep.sender.id, "2002");
    assert!(beep.sender.is_bot);
    let topic = &events[13];
    assert_eq!(topic.room, "-100777");
    assert_eq!(topic.thread.as_deref(), Some("5"));
    assert_eq!(events[0].thread, None);
}

#[tokio::test]
async fn receive_waits_out_retry_after() {
    let fake = FakeTelegram::start();
    fake.fail_next("getUpdates", Failure::RetryAfter(1));
    let pushed = fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let connector = connector(&fake);
    let started = Instant::now();
    let mut receiving = receive(&connector, None);
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, pushed.platform_id());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    receiving.stop().await.unwrap();
}

/// A fake Bot API and a `receive` on it that has made its first poll.
async fn polling() -> (FakeTelegram, Receiving) {
    let fake = FakeTelegram::start();
    let receiving = receive(&connector(&fake), None);
    fake.wait_for_poll_count(1).await;
    (fake, receiving)
}

#[tokio::test]
async fn a_second_poller_disconnects_the_first_with_a_clear_message() {
    let (fake, first) = polling().await;
    let second_connector = connector(&fake);
    let mut second = receive(&second_connector, None);
    let error = first.ended().await.unwrap_err();
    match &error {
        ConnectorError::Disconnected { message } => {
            assert!(message.contains("another getUpdates request"), "{message}");
            assert!(message.contains("one poller per bot token"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let pushed = fake.push_message(&Chat::private(&alice()), &alice(), "still here");
    assert_eq!(second.next_acked().await.platform_id, pushed.platform_id());
    second.stop().await.unwrap();
}

#[tokio::test]
async fn receive_stops_promptly_during_a_long_poll() {
    let (_fake, receiving) = polling().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    receiving.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn identity_is_fetched_once() {
    let fake = FakeTelegram::start();
    let connector = connector(&fake);
    let me = connector.identity().await.unwrap();
    assert_eq!(me.id, BOT_ID as u64);
    assert_eq!(me.username.as_deref(), Some("perch_test_bot"));
    assert_eq!(me.name, "Perch");
    connector.identity().await.unwrap();
    let calls = fake
        .calls()
        .into_iter()
        .filter(|call| call.method == "GetMe")
        .count();
    assert_eq!(calls, 1);
    assert!(format!("{connector:?}").contains("perch_test_bot"));
}

#[tokio::test]
async fn receive_hands_on_files_with_their_captions() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let document = |name, mime, bytes: &[u8], caption| {
        Incoming::document(&chat, &alice(), name, mime, bytes, caption)
    };
    fake.push(document(
        "report.pdf",
        "application/pdf",
        b"%PDF-1.7 report",
        Some("the report"),
    ));
    fake.push(Incoming::media(
        &chat,
        &alice(),
        Media::Photo,
        b"large photo bytes",
        None,
    ));
    fake.push(Incoming::media(
        &chat,
        &alice(),
        Media::Voice,
        b"OggS",
        None,
    ));
    let connector = connector(&fake);
    let mut receiving = receive(&connector, None);
    let document = receiving.next_acked().await;
    let photo = receiving.next_acked().await;
    let voice = receiving.next_acked().await;
    receiving.stop().await.unwrap();

    assert_eq!(document.text, "the report");
    let [attachment] = document.attachments.as_slice() else {
        panic!("{document:?}");
    };
    assert_eq!(attachment.name.as_deref(), Some("report.pdf"));
    assert_eq!(attachment.content_type.as_deref(), Some("application/pdf"));
    assert_eq!(attachment.size, Some(15));
    assert!(!attachment.encrypted);

    assert_eq!(photo.text, "", "a photo without caption still arrives");
    let [largest] = photo.attachments.as_slice() else {
        panic!("{photo:?}");
    };
    assert_eq!(largest.name, None);
    assert_eq!(largest.content_type.as_deref(), Some("image/jpeg"));
    assert_eq!(
        largest.size,
        Some(17),
        "the largest size, not the thumbnail"
    );
    assert_eq!(
        connector.fetch(&photo, largest, 1000).await.unwrap(),
        b"large photo bytes"
    );

    assert_eq!(
        voice.attachments[0].content_type.as_deref(),
        Some("audio/ogg")
    );
    let journaled = serde_json::to_string(&document).unwrap();
    assert!(!journaled.contains(TOKEN.split_once(':').unwrap().1));
    let old: InboundEvent = serde_json::from_str(
        &serde_json::to_string(&InboundEvent {
            attachments: Vec::new(),
            replying_to: None,
            edit_of: None,
            refused: None,
            ..document.clone()
        })
        .unwrap(),
    )
    .unwrap();
    assert!(old.attachments.is_empty());
}

#[tokio::test]
async fn fetch_downloads_a_file_and_stops_at_the_limit() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let connector = connector(&fake);
    fake.push(Incoming::document(
        &chat,
        &alice(),
        "a.bin",
        "application/octet-stream",
        &[7u8; 100],
        None,
    ));
    fake.push(
        Incoming::document(&chat, &alice(), "big.bin", "application/zip", b"x", None)
            .declared_size(30_000_000),
    );
    fake.push(
        Incoming::document(
            &chat,
            &alice(),
            "liar.bin",
            "application/zip",
            &[1u8; 5000],
            None,
        )
        .declared_size(10),
    );
    fake.push(
        Incoming::document(
            &chat,
            &alice(),
            "bot-limit.bin",
            "application/zip",
            b"x",
            None,
        )
        .declared_size(21_000_000),
    );
    let mut receiving = receive(&connector, None);
    let small = receiving.next_acked().await;
    let big = receiving.next_acked().await;
    let liar = receiving.next_acked().await;
    let over_bot_limit = receiving.next_acked().await;
    receiving.stop().await.unwrap();

    let error = connector
        .fetch(&over_bot_limit, &over_bot_limit.attachments[0], 25_000_000)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Failed { message } if message.contains("up to 20 MB")),
        "{error:?}"
    );

    let bytes = connector
        .fetch(&small, &small.attachments[0], 100)
        .await
        .unwrap();
    assert_eq!(bytes, vec![7u8; 100]);
    assert_eq!(
        connector.fetch(&small, &small.attachments[0], 99).await,
        Err(FetchError::TooLarge { size: Some(100) })
    );

    let gets = || {
        fake.calls()
            .iter()
            .filter(|call| call.method == "GetFile")
            .count()
    };
    let before = gets();
    assert_eq!(
        connector.fetch(&big, &big.attachments[0], 25_000_000).await,
        Err(FetchError::TooLarge {
            size: Some(30_000_000)
        })
    );
    assert_eq!(
        gets(),
        before,
        "refused by its declared size, not asked for"
    );

    let downloads = fake.downloads().len();
    assert_eq!(
        connector.fetch(&liar, &liar.attachments[0], 1000).await,
        Err(FetchError::TooLarge { size: None }),
        "a file larger than it said is stopped while downloading"
    );
    assert_eq!(fake.downloads().len(), downloads + 1);

    let unknown = Attachment {
        source: "no-such-file".into(),
        name: None,
        content_type: None,
        size: None,
        encrypted: false,
    };
    let error = connector.fetch(&small, &unknown, 1000).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::Failed { message } if message.contains("invalid file_id")),
        "{error:?}"
    );
    fake.break_downloads();
    let error = connector
        .fetch(&small, &small.attachments[0], 1000)
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(text.contains("404"), "{text}");
    assert!(
        !text.contains(TOKEN.split_once(':').unwrap().1),
        "the download URL holds the token: {text}"
    );
}

#[tokio::test]
async fn every_receive_attempt_is_up_once_the_bot_api_answered_it_even_with_the_identity_cached() {
    let fake = FakeTelegram::start();
    let connector = connector(&fake);
    for attempt in 0..2 {
        let (inbound, _arrivals) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let (up, mut came_up) = AttemptUp::pair();
        let task = tokio::spawn({
            let connector = connector.clone();
            let cancel = cancel.clone();
            async move {
                let attempt = ReceiveAttempt {
                    resume: None,
                    since: Vec::new(),
                    inbound,
                    up,
                    cancel,
                };
                connector.receive(attempt).await
            }
        });
        let account = tokio::time::timeout(Duration::from_secs(5), came_up.wait())
            .await
            .unwrap_or_else(|_| panic!("attempt {attempt} is up within 5 s"));
        assert_eq!(
            account,
            Some(format!(
                "@{}",
                super::super::support::fake_telegram::BOT_USERNAME
            )),
            "attempt {attempt} is up as the bot getMe named"
        );
        cancel.cancel();
        task.await.unwrap().unwrap();
    }
    let calls = fake.calls();
    let asked = |method: &str| {
        calls
            .iter()
            .filter(|call| call.method.eq_ignore_ascii_case(method))
            .count()
    };
    assert_eq!(asked("getMe"), 1, "the identity is cached");
    assert!(
        calls
            .iter()
            .any(|call| call.method.eq_ignore_ascii_case("getUpdates")
                && call.body["timeout"] == 0),
        "the second attempt's first poll is short: {calls:?}"
    );
}
