//! Delivering on Discord: references, no mentions, nonces, files, rate limits, no token shown.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_references_the_message_mentions_nobody_and_carries_the_nonce() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let question = fake.push_message(ROOM, &alice(), "@everyone what time is it?");
    let receipt = connector
        .deliver(&delivery(
            "d-reply-1",
            ROOM,
            Some(question),
            "@everyone it is noon <@111111111111111111>",
        ))
        .await
        .unwrap();
    let posted = fake.posted();
    assert_eq!(posted.len(), 1);
    let sent = &posted[0].body;
    assert_eq!(posted[0].channel, ROOM);
    assert_eq!(
        sent["content"],
        "@everyone it is noon <@111111111111111111>"
    );
    assert_eq!(
        sent["message_reference"]["message_id"],
        question.to_string()
    );
    assert_eq!(sent["message_reference"]["fail_if_not_exists"], false);
    assert_eq!(
        sent["allowed_mentions"],
        json!({"parse": [], "users": [], "roles": []})
    );
    assert_eq!(sent["nonce"], "d-reply-1");
    assert_eq!(sent["enforce_nonce"], true);
    assert_eq!(
        receipt.platform_id,
        posted[0].message["id"].as_str().unwrap()
    );
    assert_eq!(posted[0].message["type"], 19);
    assert_eq!(
        posted[0].message["referenced_message"]["id"],
        question.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_deleted_message_is_still_sent() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    let receipt = connector
        .deliver(&delivery("d-gone-1", ROOM, Some(123_456_789), "answer"))
        .await
        .unwrap();
    assert_eq!(
        fake.posted()[0].message["id"].as_str().unwrap(),
        receipt.platform_id
    );
    assert_eq!(fake.posted()[0].message["type"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_with_the_same_delivery_id_posts_once() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    let once = delivery("d-resend-1", ROOM, None, "exactly once");
    let first = connector.deliver(&once).await.unwrap();
    let again = connector.deliver(&once).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(fake.posted().len(), 1);
    assert_eq!(fake.messages(ROOM).len(), 1);
    let posts = fake
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST") && r.ends_with("/messages"))
        .count();
    assert_eq!(posts, 2);
}

/// A delivery to [`ROOM`] answered 429 with `retry_after` seconds is rate-limited for `wait`.
async fn held_by_one_429(
    fake: &FakeDiscord,
    connector: &DiscordConnector,
    retry_after: f64,
    wait: Duration,
) {
    fake.fail_next(Route::CreateMessage, Failure::rate_limited(retry_after));
    let held = connector
        .deliver(&delivery("d-429", ROOM, None, "hi"))
        .await;
    assert_eq!(held, Err(DeliveryError::RateLimited { retry_after: wait }));
}

/// Two deliveries in a row to [`OTHER_ROOM`] (ids `<prefix>-first` and `<prefix>-second`): the
/// first must be sent; what the second came to.
async fn second_of_two(
    connector: &DiscordConnector,
    prefix: &str,
) -> Result<perch::channel::Receipt, DeliveryError> {
    let first = delivery(&format!("{prefix}-first"), OTHER_ROOM, None, "first");
    connector.deliver(&first).await.unwrap();
    let second = delivery(&format!("{prefix}-second"), OTHER_ROOM, None, "second");
    connector.deliver(&second).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_rate_limited() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    held_by_one_429(&fake, &connector, 3.0, FALLBACK_RETRY_AFTER).await;
    fake.set_bucket(1, Duration::from_secs(30));
    fake.guild_channel(OTHER_ROOM);
    let refused = second_of_two(&connector, "d-429").await;
    assert!(
        matches!(refused, Err(DeliveryError::RateLimited { .. })),
        "{refused:?}"
    );
    assert_eq!(fake.posted().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_over_the_limit_is_rejected_and_a_server_error_is_a_failure() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    assert_eq!(connector.limits().max_chars, 2000);
    let refused = connector
        .deliver(&delivery("d-long", ROOM, None, &"x".repeat(2001)))
        .await
        .unwrap_err();
    let DeliveryError::Rejected { message } = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        message.contains("50035") && message.contains("content"),
        "{message}"
    );
    fake.fail_next(Route::CreateMessage, Failure::server_error());
    let failed = connector
        .deliver(&delivery("d-500", ROOM, None, "hi"))
        .await;
    assert!(
        matches!(failed, Err(DeliveryError::Failed { .. })),
        "{failed:?}"
    );
    let unknown = connector.deliver(&delivery("d-404", 5, None, "hi")).await;
    assert!(
        matches!(unknown, Err(DeliveryError::Rejected { .. })),
        "{unknown:?}"
    );
    assert!(fake.posted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_posts_to_the_channel() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    connector.typing(&ROOM.to_string(), None).await;
    connector.typing("not-a-channel", None).await;
    assert_eq!(fake.typing(), [ROOM]);
}

#[test]
fn the_resend_window_is_minutes_and_the_limit_is_discords() {
    let fake = FakeDiscord::start();
    let limits = DiscordConnector::new(secret(TOKEN), Some(fake.url())).limits();
    assert_eq!(limits.max_chars, 2000);
    assert_eq!(limits.resend_window, Some(RESEND_WINDOW));
    assert!(RESEND_WINDOW >= Duration::from_secs(60) && RESEND_WINDOW <= Duration::from_secs(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_never_appears_in_error_text() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    let mut texts = Vec::new();
    let mut record = |error: &dyn std::fmt::Debug, shown: String| {
        texts.push(format!("{error:?}"));
        texts.push(shown);
    };
    let long = connector
        .deliver(&delivery("t-1", ROOM, None, &"x".repeat(2001)))
        .await
        .unwrap_err();
    record(&long, long.to_string());
    fake.fail_next(Route::CreateMessage, Failure::rate_limited(1.0));
    let limited = connector
        .deliver(&delivery("t-2", ROOM, None, "hi"))
        .await
        .unwrap_err();
    record(&limited, limited.to_string());
    fake.fail_next(
        Route::CreateMessage,
        Failure::status(403, 50013, "Missing Permissions"),
    );
    let denied = connector
        .deliver(&delivery("t-3", ROOM, None, "hi"))
        .await
        .unwrap_err();
    record(&denied, denied.to_string());
    fake.fail_next(Route::CreateMessage, Failure::server_error());
    let failed = connector
        .deliver(&delivery("t-4", ROOM, None, "hi"))
        .await
        .unwrap_err();
    record(&failed, failed.to_string());

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = Arc::new(DiscordConnector::new(secret(TOKEN), Some(nowhere)));
    let lost = unreachable
        .deliver(&delivery("t-5", ROOM, None, "hi"))
        .await
        .unwrap_err();
    record(&lost, lost.to_string());
    let down = receive(&unreachable, Vec::new()).ended().await.unwrap_err();
    record(&down, down.to_string());

    fake.fail_next(Route::CurrentUser, Failure::server_error());
    let refused = receive(&connector, Vec::new()).ended().await.unwrap_err();
    record(&refused, refused.to_string());
    let wrong = Arc::new(DiscordConnector::new(
        secret(&format!("{TOKEN}x")),
        Some(fake.url()),
    ));
    let unauthorized = receive(&wrong, Vec::new()).ended().await.unwrap_err();
    record(&unauthorized, unauthorized.to_string());
    record(&connector, String::new());
    record(&wrong, String::new());

    assert_eq!(texts.len(), 20);
    let secret_part = TOKEN.rsplit('.').next().unwrap();
    for text in &texts {
        assert!(
            !text.contains(TOKEN) && !text.contains(secret_part),
            "{text}"
        );
    }
}

#[cfg(feature = "discord-rest-proxy")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_serenitys_ratelimiter_on_a_wait_becomes_rate_limited_with_its_length() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    fake.guild_channel(OTHER_ROOM);
    let tls = fake.intercept_tls();
    let connector = Arc::new(
        DiscordConnector::new(secret(TOKEN), None)
            .with_rest_proxy(&tls.proxy_url, tls.root_pem.as_bytes())
            .unwrap(),
    );

    held_by_one_429(&fake, &connector, 7.0, Duration::from_secs(7)).await;

    fake.set_bucket(1, Duration::from_secs(30));
    let held = second_of_two(&connector, "p").await;
    let Err(DeliveryError::RateLimited { retry_after }) = held else {
        panic!("{held:?}");
    };
    assert!(
        retry_after > Duration::from_secs(20) && retry_after <= Duration::from_secs(30),
        "{retry_after:?}"
    );
    let to_other = format!("POST /api/v10/channels/{OTHER_ROOM}/messages");
    let posts = fake.requests().iter().filter(|r| **r == to_other).count();
    assert_eq!(posts, 1, "the ratelimiter held the second post back");

    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let id = fake.push_message(ROOM, &alice(), "over the real path");
    assert_eq!(receiving.next_acked().await.platform_id, id.to_string());
    receiving.stop().await.unwrap();
    assert!(
        tls.tunnels()
            .iter()
            .all(|line| line.starts_with("CONNECT discord.com:443 "))
    );
    assert!(!tls.tunnels().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_carries_files_as_a_multipart_upload_with_its_nonce() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let question = fake.push_message(ROOM, &alice(), "send me the files");
    let mut reply = delivery("d-files-1", ROOM, Some(question), "Here you go.");
    reply.attachments = vec![
        OutboundFile {
            path: "out/a.txt".into(),
            name: "a.txt".into(),
        },
        OutboundFile {
            path: "out/b.png".into(),
            name: "b.png".into(),
        },
    ];
    let uploads = [
        Upload {
            name: "a.txt".into(),
            content_type: "text/plain".into(),
            bytes: b"alpha".to_vec(),
        },
        Upload {
            name: "b.png".into(),
            content_type: "image/png".into(),
            bytes: vec![0x89, b'P', b'N', b'G', 0, 255],
        },
    ];
    let receipt = connector.post(&reply, &uploads).await.unwrap();
    let posted = fake.posted();
    assert_eq!(posted.len(), 1);
    let sent = &posted[0];
    assert_eq!(sent.body["content"], "Here you go.");
    assert_eq!(sent.body["nonce"], "d-files-1");
    assert_eq!(sent.body["enforce_nonce"], true);
    assert_eq!(
        sent.body["message_reference"]["message_id"],
        question.to_string()
    );
    assert_eq!(
        sent.body["allowed_mentions"],
        json!({"parse": [], "users": [], "roles": []})
    );
    let files: Vec<(String, Vec<u8>)> = sent
        .files
        .iter()
        .map(|file| (file.name.clone(), file.bytes.clone()))
        .collect();
    assert_eq!(
        files,
        [
            ("a.txt".to_owned(), b"alpha".to_vec()),
            ("b.png".to_owned(), vec![0x89, b'P', b'N', b'G', 0, 255])
        ]
    );
    assert_eq!(sent.message["attachments"].as_array().unwrap().len(), 2);
    assert_eq!(receipt.platform_id, sent.message["id"].as_str().unwrap());

    let only_files = delivery("d-files-2", ROOM, None, "");
    connector.post(&only_files, &uploads[..1]).await.unwrap();
    assert_eq!(
        fake.posted().len(),
        2,
        "a message of files alone is allowed"
    );
    connector.post(&reply, &uploads).await.unwrap();
    assert_eq!(
        fake.posted().len(),
        2,
        "a resend with the same nonce posts nothing new"
    );
}

#[tokio::test]
async fn a_delivery_that_cannot_connect_is_known_not_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    drop(listener);
    let connector = DiscordConnector::new(secret(TOKEN), Some(url));
    let error = connector
        .deliver(&delivery("d-1", ROOM, None, "hello"))
        .await
        .unwrap_err();
    match &error {
        DeliveryError::NotSent { message } => assert!(!message.contains(TOKEN), "{message}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
}
