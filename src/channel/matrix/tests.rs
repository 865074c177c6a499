use super::client::{MESSAGE_LIMIT, prepare_store, write_private};
use super::inbound::{contains_word, mentions_user};
use super::media::download_capped;
use super::send::message_content;
use super::sync::Me;
use super::*;
use matrix_sdk::ruma::{OwnedMxcUri, UserId};
use std::os::unix::fs::PermissionsExt;

/// A homeserver that answers every media download with `head` then, unless `body` is
/// `None`, `body`; with `None` it streams bytes until the client goes away. It answers 404
/// on the authenticated endpoint when `legacy_only`. Returns its URL.
async fn media_server(
    head: &'static str,
    body: Option<&'static [u8]>,
    legacy_only: bool,
) -> url::Url {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0; 4096];
                let read = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..read]).into_owned();
                if legacy_only && request.contains("/client/v1/media/") {
                    let _ = stream
                        .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                match body {
                    Some(body) => {
                        let _ = stream.write_all(body).await;
                    }
                    None => {
                        let chunk = vec![b'x'; 64 * 1024];
                        while stream.write_all(&chunk).await.is_ok() {}
                    }
                }
            });
        }
    });
    url::Url::parse(&format!("http://{address}")).unwrap()
}

#[tokio::test]
async fn a_download_is_capped_whatever_size_the_server_declares() {
    let uri = OwnedMxcUri::from("mxc://example.org/abcdef");
    let endless = media_server("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", None, false).await;
    let refused = download_capped(endless, None, &uri, 1 << 20).await;
    assert!(
        matches!(refused, Err(FetchError::TooLarge { size: None })),
        "{refused:?}"
    );

    let declared = media_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 9999999999\r\n\r\n",
        Some(b"tiny"),
        false,
    )
    .await;
    let refused = download_capped(declared, None, &uri, 1 << 20).await;
    assert!(
        matches!(
            refused,
            Err(FetchError::TooLarge {
                size: Some(9_999_999_999)
            })
        ),
        "{refused:?}"
    );

    let small = media_server(
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
        Some(b"hello"),
        true,
    )
    .await;
    let fetched = download_capped(small, Some("secret".into()), &uri, 5).await;
    assert_eq!(
        fetched.unwrap(),
        b"hello",
        "the legacy endpoint after a 404"
    );
}

fn me(display_name: Option<&str>) -> Me {
    Me {
        id: UserId::parse("@perch:example.org").unwrap(),
        display_name: display_name.map(str::to_owned),
    }
}

#[test]
fn mentions_by_id_link_or_whole_display_name() {
    let me = me(Some("Perch"));
    assert!(mentions_user("hey @perch:example.org", &me));
    assert!(mentions_user(
        "<a href=\"https://matrix.to/#/%40perch:example.org\">Perch</a>",
        &me
    ));
    assert!(mentions_user("perch, what time is it?", &me));
    assert!(!mentions_user("perched on a branch", &me));
    assert!(!mentions_user("hello", &self::me(None)));
}

#[test]
fn words_match_on_boundaries_only() {
    assert!(contains_word("Hi Bot!", "bot"));
    assert!(!contains_word("robot", "bot"));
    assert!(!contains_word("anything", " "));
    assert!(contains_word("ünïcode bot", "BOT"));
}

fn delivery(thread: Option<&str>, reply_to: Option<&str>, text: &str) -> Delivery {
    Delivery {
        id: "d1".into(),
        room: "!room:example.org".into(),
        thread: thread.map(str::to_owned),
        reply_to: reply_to.map(str::to_owned),
        text: text.into(),
        attachments: Vec::new(),
    }
}

#[test]
fn replies_keep_their_thread_and_mention_nobody() {
    let reply = message_content(&delivery(None, Some("$a:example.org"), "**hi**")).unwrap();
    let json = serde_json::to_value(&reply).unwrap();
    assert_eq!(
        json["m.relates_to"]["m.in_reply_to"]["event_id"],
        "$a:example.org"
    );
    assert_eq!(json["m.mentions"], serde_json::json!({}));
    assert_eq!(json["formatted_body"], "<strong>hi</strong>");
    assert_eq!(json["body"], "**hi**");

    let threaded = message_content(&delivery(Some("$root:x"), Some("$a:x"), "plain")).unwrap();
    let json = serde_json::to_value(&threaded).unwrap();
    assert_eq!(json["m.relates_to"]["rel_type"], "m.thread");
    assert_eq!(json["m.relates_to"]["event_id"], "$root:x");
    assert_eq!(json["m.relates_to"]["m.in_reply_to"]["event_id"], "$a:x");
    assert!(json.get("formatted_body").is_none());

    assert!(message_content(&delivery(None, Some("not an id"), "x")).is_err());
}

#[test]
fn a_piece_that_does_not_fit_with_html_goes_plain() {
    let text = "**é** ".repeat(MAX_CHARS / 6);
    let content = message_content(&delivery(None, None, &text)).unwrap();
    let json = serde_json::to_value(&content).unwrap();
    assert!(json.get("formatted_body").is_none());
    let worst = "😀".repeat(MAX_CHARS);
    let content = message_content(&delivery(None, None, &worst)).unwrap();
    assert!(serde_json::to_vec(&content).unwrap().len() <= CONTENT_BUDGET);
    let huge = "x".repeat(CONTENT_BUDGET + 1);
    assert!(message_content(&delivery(None, None, &huge)).is_err());
}

#[test]
fn settings_are_checked() {
    let secret = || {
        perch_core::secret::EnvRef::new(
            perch_core::name::EnvName::try_from("MATRIX_PASSWORD").unwrap(),
        )
        .resolve(|_| Some("hunter2".into()))
        .unwrap()
    };
    let dir = PathBuf::from("/nonexistent/perch-test");
    assert!(
        MatrixConnector::new("ftp://x", "@a:b", secret(), secret(), dir.clone(), vec![]).is_err()
    );
    assert!(
        MatrixConnector::new("http://x", "alice", secret(), secret(), dir.clone(), vec![]).is_err()
    );
    assert!(
        MatrixConnector::new(
            "http://x",
            "@a:b",
            secret(),
            secret(),
            dir.clone(),
            vec!["bob".into()]
        )
        .is_err()
    );
    let connector =
        MatrixConnector::new("http://x/", "@a:b", secret(), secret(), dir, vec![]).unwrap();
    assert!(!format!("{connector:?}").contains("hunter2"));
    let long = connector.redact(&"x".repeat(1000));
    assert_eq!(long.chars().count(), MESSAGE_LIMIT + 1);
}

#[test]
fn a_store_without_its_session_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("matrix").join("ops");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("matrix-sdk-crypto.sqlite3"), b"old").unwrap();
    assert_eq!(prepare_store(&store).unwrap(), None);
    assert!(!store.join("matrix-sdk-crypto.sqlite3").exists());
    let mode = std::fs::metadata(&store).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    write_private(&store.join("x.json"), &serde_json::json!({"a": 1})).unwrap();
    let mode = std::fs::metadata(store.join("x.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
