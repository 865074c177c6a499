use super::inbound::entity_text;
use super::*;
use teloxide::types::{MessageEntity, MessageEntityKind};

#[tokio::test(start_paused = true)]
async fn a_request_without_an_answer_fails_after_the_request_timeout_as_an_unknown_delivery() {
    assert!(
        POLL_HTTP_TIMEOUT > Duration::from_secs(u64::from(POLL_TIMEOUT_SECS)),
        "the client's timeout must outlast a long poll"
    );
    let started = tokio::time::Instant::now();
    let result: Result<(), RequestError> = within_request_timeout(std::future::pending()).await;
    assert_eq!(started.elapsed(), REQUEST_TIMEOUT);
    let Err(error) = result else {
        panic!("a request without an answer succeeded");
    };
    assert!(matches!(&error, RequestError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut));
    let token = perch_core::secret::EnvRef::new(
        perch_core::name::EnvName::try_from("TELEGRAM_TOKEN").unwrap(),
    )
    .resolve(|_| Some("123:abc".into()))
    .unwrap();
    let connector = TelegramConnector::new(token, None).unwrap();
    match connector.delivery_error(error) {
        DeliveryError::Failed { message } => {
            assert!(message.contains("did not answer within 40 s"), "{message}");
        }
        other => panic!("a send without an answer may have been made: {other:?}"),
    }
}

fn entity(kind: MessageEntityKind, offset: usize, length: usize) -> MessageEntity {
    MessageEntity::new(kind, offset, length)
}

#[test]
fn entity_offsets_count_utf16_units() {
    let text = "🎉 hi @perch_bot!";
    let mention = entity(MessageEntityKind::Mention, 6, 10);
    assert_eq!(entity_text(text, &mention), Some("@perch_bot"));
    let whole = entity(MessageEntityKind::Bold, 0, 17);
    assert_eq!(entity_text(text, &whole), Some(text));
    let inside_surrogate = entity(MessageEntityKind::Bold, 1, 2);
    assert_eq!(entity_text(text, &inside_surrogate), None);
    let past_the_end = entity(MessageEntityKind::Bold, 10, 40);
    assert_eq!(entity_text(text, &past_the_end), None);
    let huge = entity(MessageEntityKind::Bold, usize::MAX, 2);
    assert_eq!(entity_text(text, &huge), None);
}

#[test]
fn cursors_and_offsets() {
    assert_eq!(start_offset(None), Ok(None));
    assert_eq!(start_offset(Some("41")), Ok(Some(42)));
    assert!(start_offset(Some("x")).is_err());
    assert!(next_offset(u32::MAX).is_err());
}

#[test]
fn reply_parameters_name_a_foreign_chat_only() {
    let same = reply_parameters("-100123:45", ChatId(-100123)).unwrap();
    assert_eq!(same.message_id, MessageId(45));
    assert_eq!(same.chat_id, None);
    let other = reply_parameters("7:8", ChatId(9)).unwrap();
    assert_eq!(other.chat_id, Some(Recipient::Id(ChatId(7))));
    assert!(reply_parameters("45", ChatId(1)).is_err());
    assert!(reply_parameters("a:b", ChatId(1)).is_err());
}

#[test]
fn redaction_removes_the_token_wherever_it_appears() {
    let token = "123:secret-token";
    let secret = perch_core::secret::EnvRef::new(
        perch_core::name::EnvName::try_from("TELEGRAM_TOKEN").unwrap(),
    )
    .resolve(|_| Some(token.to_owned()))
    .unwrap();
    let connector = TelegramConnector::new(secret, None).unwrap();
    let text = format!("error for url (https://api.telegram.org/bot{token}/GetMe): {token}");
    let redacted = connector.redact(&text);
    assert_eq!(
        redacted,
        "error for url (https://api.telegram.org/bot<token>/GetMe): <token>"
    );
    assert!(!format!("{connector:?}").contains(token));
    let long = connector.redact(&"x".repeat(1000));
    assert_eq!(long.chars().count(), MESSAGE_LIMIT + 1);

    for stray in [" ", "\t", "\r", "\r\n"] {
        let mangled = format!("{token}{stray}");
        let secret = perch_core::secret::EnvRef::new(
            perch_core::name::EnvName::try_from("TELEGRAM_TOKEN").unwrap(),
        )
        .resolve(|_| Some(mangled.clone()))
        .unwrap();
        let connector = TelegramConnector::new(secret, None).unwrap();
        for echoed in [
            format!("url (https://api.telegram.org/bot{mangled}/GetMe)"),
            format!("url (https://api.telegram.org/bot{token}%0D/GetMe)"),
            format!("url (https://api.telegram.org/bot{token}%20/GetMe)"),
        ] {
            let redacted = connector.redact(&echoed);
            assert!(!redacted.contains("secret-token"), "{stray:?}: {redacted}");
        }
    }
}

#[test]
fn api_urls() {
    assert_eq!(
        parse_api_url("http://127.0.0.1:9/tg/").unwrap().as_str(),
        "http://127.0.0.1:9/tg"
    );
    assert!(parse_api_url("ftp://example.com").is_err());
    assert!(parse_api_url("not a url").is_err());
}
