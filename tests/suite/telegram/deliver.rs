//! Delivering on Telegram: threads, MarkdownV2 or plain text, documents, refusals, no token.

use super::*;

/// Alice's `text` in topic 77 of the forum `-100200`.
fn asked_in_topic_77(fake: &FakeTelegram, text: &str) -> Pushed {
    let forum = Chat::forum(-100_200, "Team");
    fake.push(Incoming::new(&forum, &alice(), text).in_thread(77))
}

#[tokio::test]
async fn deliver_replies_in_the_thread_with_markdown_v2() {
    let fake = FakeTelegram::start();
    let question = asked_in_topic_77(&fake, "how?");
    let connector = connector(&fake);
    let receipt = connector
        .deliver(&Delivery {
            id: "d-0002".into(),
            room: "-100200".into(),
            thread: Some("77".into()),
            reply_to: Some(question.platform_id()),
            text: "**Answer:** call `a.b()` (see [docs](https://e.com/x)).".into(),
            attachments: Vec::new(),
        })
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    let sent = &sent[0];
    assert_eq!(receipt.platform_id, format!("-100200:{}", sent.message_id));
    assert_eq!(sent.chat_id, -100_200);
    assert_eq!(sent.thread, Some(77));
    assert_eq!(sent.reply_to, Some(question.message_id));
    assert_eq!(
        sent.params["reply_parameters"]["message_id"],
        json!(question.message_id)
    );
    assert_eq!(sent.parse_mode.as_deref(), Some("MarkdownV2"));
    assert_eq!(sent.shown, "Answer: call a.b() (see docs).");
}

#[tokio::test]
async fn deliver_resends_as_plain_text_when_telegram_cannot_parse_the_entities() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    fake.fail_next(
        "sendMessage",
        Failure::Api {
            code: 400,
            description:
                "Bad Request: can't parse entities: Can't find end of Bold entity at byte offset 0"
                    .into(),
        },
    );
    let connector = connector(&fake);
    let text = "**odd** markdown_here";
    let receipt = connector.deliver(&delivery("1001", text)).await.unwrap();
    let sends: Vec<Value> = fake
        .calls()
        .into_iter()
        .filter(|call| call.method == "SendMessage")
        .map(|call| call.body)
        .collect();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0]["parse_mode"], json!("MarkdownV2"));
    assert_eq!(sends[1].get("parse_mode"), None);
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, text);
    assert_eq!(sent[0].shown, text);
    assert_eq!(receipt.platform_id, format!("1001:{}", sent[0].message_id));
}

#[tokio::test]
async fn deliver_reports_rate_limits_and_refusals() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let connector = connector(&fake);

    fake.fail_next("sendMessage", Failure::RetryAfter(7));
    assert_eq!(
        connector.deliver(&delivery("1001", "x")).await,
        Err(DeliveryError::RateLimited {
            retry_after: Duration::from_secs(7)
        })
    );

    let too_long = connector
        .deliver(&delivery("1001", &"a".repeat(MAX_TEXT + 1)))
        .await;
    assert!(
        matches!(&too_long, Err(DeliveryError::Rejected { message }) if message.contains("too long")),
        "{too_long:?}"
    );
    connector
        .deliver(&delivery("1001", &"a.".repeat(MAX_TEXT / 2)))
        .await
        .unwrap();

    let unknown_chat = connector.deliver(&delivery("555", "x")).await;
    assert!(
        matches!(&unknown_chat, Err(DeliveryError::Rejected { message }) if message.contains("chat not found")),
        "{unknown_chat:?}"
    );
    let not_a_chat = connector.deliver(&delivery("general", "x")).await;
    assert!(matches!(not_a_chat, Err(DeliveryError::Rejected { .. })));

    fake.fail_next(
        "sendMessage",
        Failure::Api {
            code: 400,
            description: "Bad Request: something teloxide does not know".into(),
        },
    );
    let unknown = connector.deliver(&delivery("1001", "x")).await;
    assert!(
        matches!(&unknown, Err(DeliveryError::Failed { .. })),
        "{unknown:?}"
    );
    assert_eq!(fake.sent().len(), 1);
}

/// What `receive` and a delivery through `connector` fail with; the text and debug form of
/// each error, and of the connector, are added to `texts`.
async fn failures(
    connector: &Arc<TelegramConnector>,
    texts: &mut Vec<String>,
) -> (ConnectorError, DeliveryError) {
    let received = receive(connector, None).ended().await.unwrap_err();
    texts.push(format!("{received} {received:?}"));
    let delivered = connector.deliver(&delivery("1001", "x")).await.unwrap_err();
    texts.push(format!("{delivered} {delivered:?}"));
    texts.push(format!("{connector:?}"));
    (received, delivered)
}

#[tokio::test]
async fn the_token_never_appears_in_errors() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let mut texts = Vec::new();

    let wrong_token = "7357001:WrongToken_zyxwvutsrqponmlkjih-0987";
    let refused =
        Arc::new(TelegramConnector::new(secret(wrong_token), Some(fake.api_url())).unwrap());
    let (error, _) = failures(&refused, &mut texts).await;
    assert!(
        matches!(error, ConnectorError::Unauthorized { .. }),
        "{error:?}"
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let offline = Arc::new(TelegramConnector::new(secret(TOKEN), Some(url)).unwrap());
    let (error, delivery_error) = failures(&offline, &mut texts).await;
    assert!(
        matches!(error, ConnectorError::Disconnected { .. }),
        "{error:?}"
    );
    assert!(
        matches!(delivery_error, DeliveryError::NotSent { .. }),
        "{delivery_error:?}"
    );

    let joined = texts.join("\n");
    assert!(joined.contains("Connection refused"), "{joined}");
    for token in [TOKEN, wrong_token] {
        let secret_part = token.split_once(':').unwrap().1;
        assert!(!joined.contains(secret_part), "{joined}");
    }
}

#[tokio::test]
async fn typing_sends_a_chat_action_in_the_thread() {
    let fake = FakeTelegram::start();
    asked_in_topic_77(&fake, "q");
    let connector = connector(&fake);
    connector.typing("-100200", Some("77")).await;
    connector.typing("not a chat", None).await;
    assert_eq!(
        fake.chat_actions(),
        vec![(-100_200, "typing".to_owned(), Some(77))]
    );
    let limits = connector.limits();
    assert_eq!(limits.max_chars, 4096);
    assert_eq!(limits.resend_window, None);
}

fn upload(name: &str, bytes: &[u8]) -> Upload {
    Upload {
        name: name.into(),
        content_type: "text/plain".into(),
        bytes: bytes.to_vec(),
    }
}

#[tokio::test]
async fn deliver_sends_files_as_documents_replying_with_the_caption() {
    let fake = FakeTelegram::start();
    let question = asked_in_topic_77(&fake, "the notes?");
    let connector = connector(&fake);
    let delivery = Delivery {
        id: "d-0003".into(),
        room: "-100200".into(),
        thread: Some("77".into()),
        reply_to: Some(question.platform_id()),
        text: "Here they are. **Both**.".into(),
        attachments: vec![OutboundFile {
            path: "notes/a.txt".into(),
            name: "a.txt".into(),
        }],
    };
    let receipt = connector
        .post(&delivery, &[upload("a.txt", b"alpha")])
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 1, "the text is the document's caption");
    assert_eq!(
        sent[0].document,
        Some(("a.txt".to_owned(), b"alpha".to_vec()))
    );
    assert_eq!(sent[0].shown, "Here they are. Both.");
    assert_eq!(sent[0].parse_mode.as_deref(), Some("MarkdownV2"));
    assert_eq!(sent[0].reply_to, Some(question.message_id));
    assert_eq!(sent[0].thread, Some(77));
    assert_eq!(
        receipt.platform_id,
        format!("-100200:{}", sent[0].message_id)
    );

    let long = Delivery {
        text: "word ".repeat(400),
        ..delivery.clone()
    };
    let receipt = connector
        .post(
            &long,
            &[upload("b.txt", b"beta"), upload("c.txt", b"gamma")],
        )
        .await
        .unwrap();
    let sent = fake.sent();
    assert_eq!(sent.len(), 4, "a long text goes first, then each file");
    assert!(sent[1].document.is_none());
    assert_eq!(
        receipt.platform_id,
        format!("-100200:{}", sent[1].message_id)
    );
    let names: Vec<_> = sent[2..]
        .iter()
        .map(|sent| sent.document.clone().unwrap().0)
        .collect();
    assert_eq!(names, ["b.txt", "c.txt"]);
    assert!(sent[2..].iter().all(|sent| sent.shown.is_empty()));
    assert!(
        sent[1..]
            .iter()
            .all(|sent| sent.reply_to == Some(question.message_id))
    );

    let empty = connector.post(&delivery, &[upload("empty.txt", b"")]).await;
    assert!(
        matches!(&empty, Err(DeliveryError::Failed { message }) if message.contains("non-empty")),
        "{empty:?}"
    );
}

#[tokio::test]
async fn a_delivery_that_cannot_connect_is_known_not_sent_and_names_no_token() {
    let connector = TelegramConnector::new(secret(TOKEN), Some(closed_port_url())).unwrap();
    let error = connector
        .deliver(&delivery("42", "hello"))
        .await
        .unwrap_err();
    match &error {
        DeliveryError::NotSent { message } => assert!(!message.contains(TOKEN), "{message}"),
        other => panic!("expected NotSent, got {other:?}"),
    }
}
