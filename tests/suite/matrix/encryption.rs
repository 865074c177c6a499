//! Encrypted Matrix rooms, a second client as the human: both ways, restarts, files, failures.

use super::*;

/// Logs a second matrix-sdk client in as `account`: the human's own device.
async fn human_client(account: &Account) -> matrix_sdk::Client {
    let client = matrix_sdk::Client::builder()
        .homeserver_url(&account.url)
        .build()
        .await
        .unwrap();
    client
        .matrix_auth()
        .login_username(&account.user_id, &account.password)
        .initial_device_display_name("human")
        .send()
        .await
        .unwrap();
    client
        .sync_once(SyncSettings::default().timeout(Duration::ZERO))
        .await
        .unwrap();
    client
}

async fn human_sync(client: &matrix_sdk::Client) {
    client
        .sync_once(SyncSettings::default().timeout(Duration::from_millis(200)))
        .await
        .unwrap();
}

/// The text of `event_id` as the human's client decrypts it, once its keys have arrived.
async fn human_reads(client: &matrix_sdk::Client, room: &str, event_id: &str) -> String {
    let room = client.get_room(&RoomId::parse(room).unwrap()).unwrap();
    let event_id = EventId::parse(event_id).unwrap();
    let content = human_decrypts(client, &room, &event_id).await;
    content["body"].as_str().unwrap().to_owned()
}

/// The content of `event_id` as the human's client decrypts it, syncing until its keys have
/// arrived (each sync waits up to 200 ms for news).
async fn human_decrypts(
    client: &matrix_sdk::Client,
    room: &matrix_sdk::Room,
    event_id: &EventId,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        human_sync(client).await;
        let event = room.event(event_id, None).await.unwrap();
        if let TimelineEventKind::Decrypted(decrypted) = &event.kind {
            let json: Value = serde_json::from_str(decrypted.event.json().get()).unwrap();
            return json["content"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the human never decrypted {event_id}"
        );
    }
}

/// A well-formed Megolm message (version 3, message index 0, one AES block, MAC and signature)
/// for a session nobody has the key of, in unpadded base64.
fn megolm_message_for_no_session() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes: Vec<u8> = vec![3, 0x08, 0x00, 0x12, 16];
    bytes.extend([7; 16]);
    bytes.extend([1; 8 + 64]);
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let group = chunk.iter().enumerate().fold(0u32, |group, (index, byte)| {
            group | u32::from(*byte) << (16 - 8 * index)
        });
        for index in 0..=chunk.len() {
            text.push(char::from(
                ALPHABET[(group >> (18 - 6 * index) & 63) as usize],
            ));
        }
    }
    text
}

/// An encrypted room `alice` made, with the bot `bot` in it (a direct one if `direct`); the
/// human's client `human` has synced it, when one is given.
async fn encrypted_room_with(
    alice: &Account,
    bot: &Account,
    direct: bool,
    human: Option<&matrix_sdk::Client>,
) -> String {
    let mut create = encrypted_room();
    create["invite"] = json!([bot.user_id]);
    if direct {
        create["is_direct"] = json!(true);
    }
    let room_id = alice.create_room(create).await;
    alice.wait_joined(&room_id, &bot.user_id).await;
    if let Some(human) = human {
        human_sync(human).await;
    }
    room_id
}

/// Sends `text` as the human into the encrypted `room`; the event's id.
async fn say_encrypted(room: &matrix_sdk::Room, text: &str) -> matrix_sdk::ruma::OwnedEventId {
    room.send(RoomMessageEventContent::text_plain(text))
        .await
        .unwrap()
        .response
        .event_id
}

fn encrypted_room() -> Value {
    json!({
        "initial_state": [{
            "type": "m.room.encryption",
            "state_key": "",
            "content": { "algorithm": "m.megolm.v1.aes-sha2" },
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_room_works_both_ways_and_keys_survive_a_restart() {
    let (_, alice, bot) = alice_and_bot().await;
    let human = human_client(&alice).await;
    let store = tempfile::tempdir().unwrap();
    let first = connector(&bot, store.path(), &[&alice]);
    let device = first.device_id().await.unwrap();
    let mut receiving = receive(&first, Vec::new());
    tokio::time::timeout(WAIT, first.ready()).await.unwrap();

    let room_id = encrypted_room_with(&alice, &bot, true, Some(&human)).await;
    let room = human
        .get_room(&RoomId::parse(&room_id).unwrap())
        .expect("the human's client knows the room");
    let sent = say_encrypted(&room, "a secret question").await;
    let on_server = alice.event(&room_id, sent.as_str()).await;
    assert_eq!(on_server["type"], "m.room.encrypted", "sent encrypted");
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, sent.as_str());
    assert_eq!(event.text, "a secret question", "decrypted by perch");

    let receipt = first
        .deliver(&Delivery {
            id: "01jsecret000000000000001".into(),
            room: room_id.clone(),
            thread: None,
            reply_to: Some(event.platform_id.clone()),
            text: "a secret answer".into(),
            attachments: Vec::new(),
        })
        .await
        .unwrap();
    let on_server = alice.event(&room_id, &receipt.platform_id).await;
    assert_eq!(on_server["type"], "m.room.encrypted", "answered encrypted");
    assert_eq!(
        human_reads(&human, &room_id, &receipt.platform_id).await,
        "a secret answer"
    );
    assert_eq!(receiving.stop().await, Ok(()));
    drop(first);

    let restarted = connector(&bot, store.path(), &[&alice]);
    assert_eq!(restarted.device_id().await.unwrap(), device);
    let mut receiving = receive(&restarted, vec![(room_id.clone(), event.platform_id)]);
    tokio::time::timeout(WAIT, restarted.ready()).await.unwrap();
    let second = say_encrypted(&room, "another secret").await;
    let mut seen = receiving.next_acked().await;
    while seen.platform_id != second.as_str() {
        seen = receiving.next_acked().await;
    }
    assert_eq!(seen.text, "another secret", "the restored keys decrypt it");
    assert!(restarted.undecryptable().events.is_empty());
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecryptable_event_is_reported_not_dropped_silently() {
    let (_, alice, bot) = alice_and_bot().await;
    // The store of channel `mx` of an agent, so `perch status` reads the report too.
    let agent = matrix_agent(&bot, &alice);
    let store_path = agent.path().join(".perch/matrix/mx");
    let connector = connector(&bot, &store_path, &[&alice]);
    let mut receiving = receive(&connector, Vec::new());
    let room = encrypted_room_with(&alice, &bot, false, None).await;

    let garbled = alice
        .send(
            &room,
            "m.room.encrypted",
            json!({
                "algorithm": "m.megolm.v1.aes-sha2",
                "sender_key": "nWFCfpaHzZQqpodd4C6JA9y5ML3CjxjjDWbpPkBvylI",
                "device_id": "NOSUCHDEVICE",
                "session_id": "vU4bJ3CgHQuKU3hSjH2Q1Hw3y4rPnXmYQ9KhR1F4xN8",
                "ciphertext": megolm_message_for_no_session(),
            }),
        )
        .await;
    wait_until("the report", || {
        let connector = connector.clone();
        let garbled = garbled.clone();
        async move {
            connector
                .undecryptable()
                .events
                .iter()
                .any(|event| event.event_id == garbled)
        }
    })
    .await;
    let report = connector.undecryptable();
    let entry = report
        .events
        .iter()
        .find(|event| event.event_id == garbled)
        .unwrap();
    assert_eq!(entry.room, room);
    assert_eq!(entry.sender, alice.user_id);
    assert_eq!(entry.reason, "MissingMegolmSession");
    assert_eq!(report.total, 1);
    wait_until("the saved report", || {
        let (store, report) = (store_path.clone(), report.clone());
        async move { read_undecryptable(&store) == report }
    })
    .await;
    receiving.quiet_for(Duration::from_millis(300)).await;
    assert_eq!(receiving.stop().await, Ok(()));
    let status = agent.status();
    assert_eq!(
        status.undecryptable.get("mx"),
        Some(&1),
        "perch status shows it: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_file_is_fetched_and_a_file_is_sent_encrypted() {
    use matrix_sdk::attachment::{AttachmentConfig, AttachmentInfo, BaseFileInfo};
    use matrix_sdk::media::{MediaFormat, MediaRequestParameters};
    use matrix_sdk::ruma::events::room::message::MessageType;

    let (_, alice, bot) = alice_and_bot().await;
    let human = human_client(&alice).await;
    let (_store, connector, mut receiving) = listening(&bot.url, &bot, &[&alice], None, true).await;

    let room_id = encrypted_room_with(&alice, &bot, true, Some(&human)).await;
    let room = human.get_room(&RoomId::parse(&room_id).unwrap()).unwrap();
    let secret = b"a secret file's bytes".to_vec();
    let sent = room
        .send_attachment(
            "secret.txt",
            &mime::TEXT_PLAIN,
            secret.clone(),
            AttachmentConfig::new().info(AttachmentInfo::File(BaseFileInfo {
                size: matrix_sdk::ruma::UInt::new(secret.len() as u64),
            })),
        )
        .await
        .unwrap()
        .event_id;
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, sent.as_str());
    assert_eq!(event.text, "", "a file without caption");
    let [attachment] = event.attachments.as_slice() else {
        panic!("{event:?}");
    };
    assert!(attachment.encrypted);
    assert!(attachment.source.starts_with("mxc://"), "{attachment:?}");
    assert_eq!(attachment.name.as_deref(), Some("secret.txt"));
    assert_eq!(attachment.content_type.as_deref(), Some("text/plain"));
    assert_eq!(attachment.size, Some(secret.len() as u64));
    let journaled = serde_json::to_string(&event).unwrap();
    assert!(
        !journaled.contains("\"key\"") && !journaled.contains("\"iv\""),
        "the file's key stays out of the journal: {journaled}"
    );
    let on_server = download_media(&alice, &attachment.source).await;
    assert_ne!(on_server, secret, "the homeserver holds it encrypted");
    assert_eq!(
        connector.fetch(&event, attachment, 1000).await.unwrap(),
        secret
    );
    assert_eq!(
        connector.fetch(&event, attachment, 5).await,
        Err(perch::channel::FetchError::TooLarge {
            size: Some(secret.len() as u64)
        })
    );

    let reply = Delivery {
        id: "d0000000000000000files001".into(),
        room: room_id.clone(),
        thread: None,
        reply_to: Some(event.platform_id.clone()),
        text: String::new(),
        attachments: vec![perch::channel::OutboundFile {
            path: "out/answer.txt".into(),
            name: "answer.txt".into(),
        }],
    };
    let upload = perch::channel::Upload {
        name: "answer.txt".into(),
        content_type: "text/plain".into(),
        bytes: b"an encrypted answer".to_vec(),
    };
    let receipt = connector
        .post(&reply, std::slice::from_ref(&upload))
        .await
        .unwrap();
    let on_server = alice.event(&room_id, &receipt.platform_id).await;
    assert_eq!(on_server["type"], "m.room.encrypted", "posted encrypted");
    let event_id = EventId::parse(&receipt.platform_id).unwrap();
    let content = human_decrypts(&human, &room, &event_id).await;
    assert_eq!(content["msgtype"], "m.file");
    assert_eq!(content["body"], "answer.txt");
    assert_eq!(
        content["m.relates_to"]["m.in_reply_to"]["event_id"],
        event.platform_id
    );
    let file: matrix_sdk::ruma::events::room::message::RoomMessageEventContent =
        serde_json::from_value(content).unwrap();
    let MessageType::File(file) = file.msgtype else {
        panic!("not a file");
    };
    let bytes = human
        .media()
        .get_media_content(
            &MediaRequestParameters {
                source: file.source,
                format: MediaFormat::File,
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(bytes, b"an encrypted answer");
    assert_eq!(receiving.stop().await, Ok(()));
}
