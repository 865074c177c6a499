//! The Matrix connector alone: sessions, hand-over and acks, quotes, replies, threads, invites.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_in_once_and_restores_the_session_on_every_start() {
    let synapse = Synapse::from_env();
    let bot = synapse.register("bot").await;
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("matrix").join("mx");

    let first = connector(&bot, &store, &[]);
    let device = first.device_id().await.unwrap();
    drop(first);
    assert_eq!(mode(&store), 0o700);
    assert_eq!(mode(&store.join("session.json")), 0o600);
    for entry in std::fs::read_dir(&store).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }

    let second = connector(&bot, &store, &[]);
    assert_eq!(
        second.device_id().await.unwrap(),
        device,
        "the saved device"
    );
    let perch_devices: Vec<Value> = bot
        .devices()
        .await
        .into_iter()
        .filter(|found| found["display_name"] == "perch")
        .collect();
    assert_eq!(perch_devices.len(), 1, "{perch_devices:?}");
    assert_eq!(perch_devices[0]["device_id"], device.as_str());

    let session = std::fs::read_to_string(store.join("session.json")).unwrap();
    let token: Value = serde_json::from_str(&session).unwrap();
    let token = token["access_token"].as_str().unwrap();
    assert!(!format!("{second:?}").contains(token));

    let wrong = MatrixConnector::new(
        &bot.url,
        &bot.user_id,
        secret("not the password"),
        secret(PASSPHRASE),
        state.path().join("other"),
        vec![],
    )
    .unwrap();
    let refused = wrong.device_id().await.unwrap_err();
    assert!(
        matches!(&refused, ConnectorError::Unauthorized { message } if !message.contains("not the password")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_a_fresh_room_is_handed_over_after_the_backlog_and_acknowledged() {
    let synapse = Synapse::from_env();
    let alice = synapse.register("alice").await;
    let bob = synapse.register("bob").await;
    let bot = synapse.register_named("bot", Some("Perchy")).await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bot.join(&room).await;
    bob.join(&room).await;
    alice.say(&room, "said before perch started").await;

    let (_store, _connector, mut receiving) = listening(&bot.url, &bot, &[], None, true).await;

    let said = json!({
        "msgtype": "m.text",
        "body": "hello Perchy-bot, are you there?",
        "m.mentions": { "user_ids": [bot.user_id] },
    });
    let (_, event) = sent_and_taken(&alice, &room, said, &mut receiving).await;
    assert_eq!(event.room, room);
    assert_eq!(event.thread, None);
    assert_eq!(event.sender.id, alice.user_id);
    assert_eq!(event.sender.name, alice.localpart);
    assert!(!event.sender.is_bot);
    assert!(!event.direct, "four members");
    assert!(event.addressed);
    assert_eq!(event.text, "hello Perchy-bot, are you there?");
    let age = chrono::Utc::now() - event.sent_at;
    assert!(age < chrono::Duration::seconds(60), "{age}");

    bob.say(&room, "Perchy, a question").await;
    let by_name = receiving.next_acked().await;
    assert!(by_name.addressed, "the display name as a word");
    bob.say(&room, "just chatting").await;
    let chatter = receiving.next_acked().await;
    assert!(!chatter.addressed);
    bob.send(
        &room,
        "m.room.message",
        json!({ "msgtype": "m.notice", "body": "a bot's notice" }),
    )
    .await;
    assert!(receiving.next_acked().await.sender.is_bot);
    receiving.quiet_for(Duration::from_millis(500)).await;
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_quotes_the_fetched_original_and_an_edit_is_handed_on_as_one() {
    let synapse = Synapse::from_env();
    let long_name = "A".repeat(100);
    let alice = synapse.register_named("alice", Some(&long_name)).await;
    let bot = synapse.register("bot").await;
    let (_store, _connector, mut receiving) =
        listening(&bot.url, &bot, &[&alice], None, false).await;
    let room = alice.open_dm(&bot.user_id).await;

    let long = format!("{}tail", "ø".repeat(400));
    let original = alice.say(&room, &long).await;
    assert_eq!(receiving.next_acked().await.replying_to, None);
    let said = reply_to("> <@alice> øøø\n\nso long", &original);
    let (quoting, event) = sent_and_taken(&alice, &room, said, &mut receiving).await;
    assert_eq!(event.text, "so long", "the reply fallback is stripped");
    let quote = event.replying_to.expect("the reply quotes its original");
    assert_eq!(quote.platform_id, original);
    assert_eq!(quote.text.chars().count(), perch::channel::QUOTE_MAX_CHARS);
    assert!(
        quote.text.starts_with("øøø") && quote.text.ends_with('…'),
        "{quote:?}"
    );
    let author = quote.author.expect("the quoted author");
    assert_eq!(author.id, alice.user_id);
    assert!(!author.is_bot);
    assert_eq!(
        author.name,
        format!("{}…", "A".repeat(perch::channel::QUOTE_NAME_MAX_CHARS - 1))
    );

    let said = reply_to(
        &format!("> <{}> so long\n\nand more", alice.user_id),
        &quoting,
    );
    let (_, event) = sent_and_taken(&alice, &room, said, &mut receiving).await;
    let quote = event.replying_to.expect("a quote of a reply");
    assert_eq!(
        quote.text, "so long",
        "the quoted reply's fallback is stripped"
    );

    let missing = format!("$missing{}", quoting.trim_start_matches('$'));
    let said = reply_to("to nothing", &missing);
    let (_, event) = sent_and_taken(&alice, &room, said, &mut receiving).await;
    assert_eq!(
        event.replying_to.as_deref(),
        Some(&bare_quote(&missing)),
        "a target that cannot be fetched gets the plain fallback"
    );

    let said = json!({
        "msgtype": "m.text",
        "body": "* shorter now",
        "m.new_content": { "msgtype": "m.text", "body": "shorter now" },
        "m.relates_to": { "rel_type": "m.replace", "event_id": original },
    });
    let (_, event) = sent_and_taken(&alice, &room, said, &mut receiving).await;
    assert_eq!(event.edit_of.as_deref(), Some(original.as_str()));
    assert_eq!(event.text, "shorter now");
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_carry_in_reply_to_keep_threads_mention_nobody_and_resend_once() {
    let (_, alice, bot) = alice_and_bot().await;
    let (_store, connector, mut receiving) =
        listening(&bot.url, &bot, &[&alice], None, false).await;
    let room = alice.open_dm(&bot.user_id).await;

    let question = alice.say(&room, "what is 2 + 2?").await;
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, question);
    assert!(event.direct, "two members");
    assert!(!event.addressed);

    let delivery = Delivery {
        id: "01jreply0000000000000001".into(),
        room: room.clone(),
        thread: None,
        reply_to: Some(question.clone()),
        text: "It is **4**. @room".into(),
        attachments: Vec::new(),
    };
    let receipt = connector.deliver(&delivery).await.unwrap();
    let posted = alice.event(&room, &receipt.platform_id).await;
    assert_eq!(posted["sender"], bot.user_id.as_str());
    let content = &posted["content"];
    assert_eq!(content["msgtype"], "m.notice", "perch posts as a bot");
    assert_eq!(content["body"], "It is **4**. @room");
    assert_eq!(content["format"], "org.matrix.custom.html");
    assert!(formatted(content).contains("<strong>4</strong>"));
    assert_eq!(
        content["m.relates_to"]["m.in_reply_to"]["event_id"],
        question
    );
    assert_eq!(content["m.mentions"], json!({}));

    let again = connector.deliver(&delivery).await.unwrap();
    assert_eq!(again, receipt, "the same transaction id is deduplicated");
    let replies = alice
        .messages(&room, 20)
        .await
        .into_iter()
        .filter(|event| {
            event["sender"] == bot.user_id.as_str() && event["type"] == "m.room.message"
        })
        .count();
    assert_eq!(replies, 1);

    let follow_up = alice
        .send(
            &room,
            "m.room.message",
            json!({
                "msgtype": "m.text",
                "body": "> <@bot> It is 4.\n\nthanks!",
                "m.relates_to": { "m.in_reply_to": { "event_id": receipt.platform_id } },
            }),
        )
        .await;
    let reply = receiving.next_acked().await;
    assert_eq!(reply.platform_id, follow_up);
    assert!(reply.addressed, "a reply to the bot addresses it");
    assert_eq!(reply.text, "thanks!");

    let root = alice.say(&room, "thread root").await;
    receiving.next_acked().await;
    let in_thread = alice
        .send(
            &room,
            "m.room.message",
            json!({
                "msgtype": "m.text",
                "body": "inside the thread",
                "m.relates_to": {
                    "rel_type": "m.thread",
                    "event_id": root,
                    "is_falling_back": true,
                    "m.in_reply_to": { "event_id": root },
                },
            }),
        )
        .await;
    let threaded = receiving.next_acked().await;
    assert_eq!(threaded.platform_id, in_thread);
    assert_eq!(threaded.thread.as_deref(), Some(root.as_str()));
    let receipt = connector
        .deliver(&Delivery {
            id: "01jreply0000000000000002".into(),
            room: room.clone(),
            thread: threaded.thread.clone(),
            reply_to: Some(in_thread.clone()),
            text: "answered in the thread".into(),
            attachments: Vec::new(),
        })
        .await
        .unwrap();
    let posted = alice.event(&room, &receipt.platform_id).await;
    let relation = &posted["content"]["m.relates_to"];
    assert_eq!(relation["rel_type"], "m.thread");
    assert_eq!(relation["event_id"], root);
    assert_eq!(relation["m.in_reply_to"]["event_id"], in_thread);

    connector.typing(&room, None).await;
    receiving.quiet_for(Duration::from_millis(500)).await;
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_handed_over_but_never_journaled_comes_again_after_a_restart() {
    let (_, alice, bot) = alice_and_bot().await;
    let store = tempfile::tempdir().unwrap();
    let first = connector(&bot, store.path(), &[&alice]);
    let mut receiving = receive(&first, Vec::new());
    let room = alice.open_dm(&bot.user_id).await;
    let journaled = alice.say(&room, "journaled").await;
    let journaled = receiving.until(&journaled).await;
    assert!(journaled.cursor.is_some(), "Matrix events carry a cursor");
    let lost = alice.say(&room, "handed over, then perch crashed").await;
    let arrival = receiving.arrival().await;
    assert_eq!(arrival.event.platform_id, lost);
    drop(arrival);
    receiving.ends_within(Duration::from_secs(5)).await;
    drop(first);

    // From perch's journaled cursor alone.
    let restarted = connector(&bot, store.path(), &[&alice]);
    let mut receiving = receiving_from(&restarted, journaled.cursor.clone(), Vec::new());
    assert_eq!(
        receiving.until(&lost).await.text,
        "handed over, then perch crashed"
    );
    assert_eq!(receiving.stop().await, Ok(()));
    drop(restarted);

    // From perch's last journaled event in the room alone (back-fill).
    let restarted = connector(&bot, store.path(), &[&alice]);
    let mut receiving = receive(
        &restarted,
        vec![(room.clone(), journaled.platform_id.clone())],
    );
    assert_eq!(
        receiving.until(&lost).await.text,
        "handed over, then perch crashed"
    );
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invites_are_accepted_only_from_allowed_users() {
    let synapse = Synapse::from_env();
    let alice = synapse.register("alice").await;
    let mallory = synapse.register("mallory").await;
    let bot = synapse.register("bot").await;
    let store = tempfile::tempdir().unwrap();
    let connector = connector(&bot, store.path(), &[&alice]);
    let stranger_room = mallory.create_dm(&bot.user_id).await;
    let mut receiving = receive(&connector, Vec::new());
    tokio::time::timeout(WAIT, connector.ready()).await.unwrap();
    alice.open_dm(&bot.user_id).await;
    mallory.say(&stranger_room, "let me in").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        mallory
            .membership(&stranger_room, &bot.user_id)
            .await
            .as_deref(),
        Some("invite"),
        "the stranger's invite is left pending"
    );
    receiving.quiet_for(Duration::from_millis(200)).await;
    assert_eq!(receiving.stop().await, Ok(()));
}
