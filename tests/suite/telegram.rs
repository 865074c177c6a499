//! The Telegram connector against the fake Bot API over loopback HTTP, and the fake's own rules,
//! each checked with raw requests.

use super::fake_telegram::{
    BOT_ID, CONFLICT, Chat, Failure, FakeTelegram, Incoming, MAX_TEXT, Media, TOKEN, User,
    parse_markdown_v2,
};
use super::support::PostText;
use perch::channel::telegram::TelegramConnector;
use perch::channel::{
    Arrival, Attachment, AttemptUp, Connector, ConnectorError, Delivery, DeliveryError, FetchError,
    InboundEvent, OutboundFile, Upload,
};
use perch_core::markdown::to_telegram_markdown_v2;
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

fn secret(value: &str) -> Secret {
    EnvRef::new(EnvName::try_from("TELEGRAM_TOKEN").unwrap())
        .resolve(|_| Some(value.to_owned()))
        .unwrap()
}

fn connector(fake: &FakeTelegram) -> Arc<TelegramConnector> {
    Arc::new(TelegramConnector::new(secret(TOKEN), Some(fake.api_url())).unwrap())
}

/// A running `receive`, with perch's side of the inbox.
struct Receiving {
    arrivals: mpsc::Receiver<Arrival>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ConnectorError>>,
}

impl Receiving {
    fn start(connector: &Arc<TelegramConnector>, resume: Option<String>) -> Receiving {
        let (inbound, arrivals) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let connector = connector.clone();
            let cancel = cancel.clone();
            async move {
                connector
                    .receive(resume, Vec::new(), inbound, AttemptUp::pair().0, cancel)
                    .await
            }
        });
        Receiving {
            arrivals,
            cancel,
            task,
        }
    }

    async fn next(&mut self) -> Arrival {
        tokio::time::timeout(Duration::from_secs(10), self.arrivals.recv())
            .await
            .expect("an event arrives in time")
            .expect("receive is still running")
    }

    /// The next event, acknowledged as journaled.
    async fn next_acked(&mut self) -> InboundEvent {
        let arrival = self.next().await;
        arrival.journaled.send(()).unwrap();
        arrival.event
    }

    async fn quiet_for(&mut self, wait: Duration) {
        match tokio::time::timeout(wait, self.arrivals.recv()).await {
            Err(_) => {}
            Ok(None) => panic!("receive ended"),
            Ok(Some(arrival)) => panic!("unexpected event {:?}", arrival.event),
        }
    }

    /// Cancels and returns what `receive` returned; it must stop promptly.
    async fn stop(self) -> Result<(), ConnectorError> {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .expect("receive stops promptly when cancelled")
            .unwrap()
    }

    /// Waits for `receive` to end by itself.
    async fn ended(self) -> Result<(), ConnectorError> {
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("receive ends")
            .unwrap()
    }
}

fn delivery(room: &str, text: &str) -> Delivery {
    Delivery {
        id: "d-0001".into(),
        room: room.into(),
        thread: None,
        reply_to: None,
        text: text.into(),
        attachments: Vec::new(),
    }
}

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Posts an answer in `room` and returns the message id Telegram gave it.
async fn posted_message_id(connector: &TelegramConnector, room: &str) -> i64 {
    let receipt = connector
        .deliver(&delivery(room, "an answer"))
        .await
        .unwrap();
    receipt
        .platform_id
        .split(':')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn alice() -> User {
    User::human(1001, "Alice")
}

// The fake's rules, with raw requests.

#[tokio::test]
async fn fake_matches_method_names_in_any_case() {
    let fake = FakeTelegram::start();
    for method in ["getMe", "GetMe", "getme", "GETME"] {
        let (status, body) = post(&fake.method_url(TOKEN, method), &json!({})).await;
        assert_eq!(status, 200, "{method}");
        assert_eq!(body["ok"], json!(true));
        assert_eq!(body["result"]["id"], json!(BOT_ID));
        assert_eq!(body["result"]["username"], json!("perch_test_bot"));
    }
    let (status, body) = post(&fake.method_url(TOKEN, "getNothing"), &json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 404, "description": "Not Found: method not found"})
    );
}

#[tokio::test]
async fn fake_accepts_only_post_with_json() {
    let fake = FakeTelegram::start();
    let client = reqwest::Client::new();
    let url = fake.method_url(TOKEN, "getMe");
    let get = client.get(&url).send().await.unwrap();
    assert_eq!(get.status().as_u16(), 400);
    let form = client
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("a=1")
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 400);
    let body: Value = serde_json::from_slice(&form.bytes().await.unwrap()).unwrap();
    assert_eq!(body["ok"], json!(false));
    assert_eq!(body["error_code"], json!(400));
}

#[tokio::test]
async fn fake_refuses_a_wrong_token_and_a_path_without_one() {
    let fake = FakeTelegram::start();
    let (status, body) = post(&fake.method_url("7357001:wrong", "getMe"), &json!({})).await;
    assert_eq!(status, 401);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 401, "description": "Unauthorized"})
    );
    let (status, body) = post(&format!("{}/getMe", fake.api_url()), &json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(body["description"], json!("Not Found"));
}

#[tokio::test]
async fn fake_get_updates_confirms_below_the_offset() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let ids: Vec<i64> = (0..4)
        .map(|n| {
            fake.push_message(&chat, &alice(), &format!("m{n}"))
                .update_id
        })
        .collect();
    let url = fake.method_url(TOKEN, "getUpdates");
    let update_ids = |body: &Value| -> Vec<i64> {
        body["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|update| update["update_id"].as_i64().unwrap())
            .collect()
    };
    let (_, body) = post(&url, &json!({})).await;
    assert_eq!(update_ids(&body), ids);
    assert_eq!(body["result"][0]["message"]["text"], json!("m0"));
    let (_, body) = post(&url, &json!({"offset": ids[0], "limit": 2})).await;
    assert_eq!(update_ids(&body), ids[..2]);
    let (_, body) = post(&url, &json!({"offset": ids[2]})).await;
    assert_eq!(update_ids(&body), ids[2..]);
    assert_eq!(fake.pending_update_ids(), ids[2..]);
    let (_, body) = post(&url, &json!({"offset": -1})).await;
    assert_eq!(update_ids(&body), ids[3..]);
    assert_eq!(fake.pending_update_ids(), ids[3..]);
    let (_, body) = post(&url, &json!({"offset": ids[3] + 1})).await;
    assert_eq!(update_ids(&body), Vec::<i64>::new());
    assert!(fake.pending_update_ids().is_empty());
}

#[tokio::test]
async fn fake_long_poll_returns_within_its_timeout_or_on_an_update() {
    let fake = FakeTelegram::start();
    let url = fake.method_url(TOKEN, "getUpdates");
    let started = Instant::now();
    let (status, body) = post(&url, &json!({"timeout": 1})).await;
    let waited = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(body["result"], json!([]));
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let poll = tokio::spawn(async move { post(&url, &json!({"timeout": 20})).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let pushed = fake.push_message(&Chat::private(&alice()), &alice(), "wake up");
    let (status, body) = poll.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["result"][0]["update_id"], json!(pushed.update_id));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn fake_answers_409_to_the_older_of_two_concurrent_polls() {
    let fake = FakeTelegram::start();
    let url = fake.method_url(TOKEN, "getUpdates");
    let older = tokio::spawn({
        let url = url.clone();
        async move { post(&url, &json!({"timeout": 5})).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let newer = tokio::spawn(async move { post(&url, &json!({"timeout": 1})).await });
    let (status, body) = older.await.unwrap();
    assert_eq!(status, 409);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 409, "description": CONFLICT})
    );
    let (status, _) = newer.await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn fake_limits_text_to_4096_characters_after_entity_parsing() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let url = fake.method_url(TOKEN, "sendMessage");
    let (status, body) = post(
        &url,
        &json!({"chat_id": 1001, "text": "é".repeat(MAX_TEXT + 1)}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 400, "description": "Bad Request: message is too long"})
    );
    let (status, _) = post(
        &url,
        &json!({"chat_id": 1001, "text": "é".repeat(MAX_TEXT)}),
    )
    .await;
    assert_eq!(status, 200);
    let escaped = "\\.".repeat(MAX_TEXT);
    let (status, body) = post(
        &url,
        &json!({"chat_id": 1001, "text": escaped, "parse_mode": "MarkdownV2"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fake.sent()[1].shown, ".".repeat(MAX_TEXT));
}

#[tokio::test]
async fn fake_refuses_markdown_v2_that_does_not_parse() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let url = fake.method_url(TOKEN, "sendMessage");
    let refused = [
        (
            "Done.",
            "Character '.' is reserved and must be escaped with the preceding '\\'",
        ),
        (
            "1+1",
            "Character '+' is reserved and must be escaped with the preceding '\\'",
        ),
        ("*bold", "Can't find end of Bold entity at byte offset 0"),
        ("x `code", "Can't find end of Code entity at byte offset 2"),
        ("_a__b_", "Can't find end of Italic entity at byte offset 0"),
    ];
    for (text, why) in refused {
        let (status, body) = post(
            &url,
            &json!({"chat_id": 1001, "text": text, "parse_mode": "MarkdownV2"}),
        )
        .await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(
            body["description"],
            json!(format!("Bad Request: can't parse entities: {why}")),
            "{text}"
        );
    }
    assert!(fake.sent().is_empty());
    let text = "*bold* _it_ ~s~ __u__ ||sp|| `a.b` [l](https://e.com/x\\)) \\. \\!\n>quote\n```rust\nx.y\n```";
    let (status, body) = post(
        &url,
        &json!({"chat_id": 1001, "text": text, "parse_mode": "MarkdownV2"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["text"],
        json!("bold it s u sp a.b l . !\nquote\nx.y\n")
    );
}

#[tokio::test]
async fn fake_forces_429_with_retry_after() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    fake.fail_next("sendMessage", Failure::RetryAfter(3));
    let url = fake.method_url(TOKEN, "SendMessage");
    let (status, body) = post(&url, &json!({"chat_id": 1001, "text": "x"})).await;
    assert_eq!(status, 429);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 3",
            "parameters": {"retry_after": 3}})
    );
    let (status, _) = post(&url, &json!({"chat_id": 1001, "text": "x"})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn fake_checks_the_chat_the_reply_and_the_thread() {
    let fake = FakeTelegram::start();
    let forum = Chat::forum(-100_500, "Team");
    let pushed = fake.push(Incoming::new(&forum, &alice(), "q").in_thread(9));
    let url = fake.method_url(TOKEN, "sendMessage");
    let description = |body: Value| body["description"].as_str().unwrap().to_owned();
    let (_, body) = post(&url, &json!({"chat_id": 42, "text": "x"})).await;
    assert_eq!(description(body), "Bad Request: chat not found");
    let (_, body) = post(
        &url,
        &json!({"chat_id": -100_500, "text": "x", "reply_parameters": {"message_id": 99}}),
    )
    .await;
    assert_eq!(
        description(body),
        "Bad Request: message to be replied not found"
    );
    let (_, body) = post(
        &url,
        &json!({"chat_id": -100_500, "text": "x", "message_thread_id": 10}),
    )
    .await;
    assert_eq!(description(body), "Bad Request: message thread not found");
    let (_, body) = post(&url, &json!({"chat_id": -100_500, "text": "  "})).await;
    assert_eq!(description(body), "Bad Request: message text is empty");
    let (status, body) = post(
        &url,
        &json!({"chat_id": -100_500, "text": "x", "message_thread_id": 9,
            "reply_parameters": {"message_id": pushed.message_id}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body["result"]["reply_to_message"]["message_id"],
        json!(pushed.message_id)
    );
    assert_eq!(body["result"]["message_thread_id"], json!(9));
}

#[test]
fn converted_markdown_always_parses_in_the_fake() {
    let samples = [
        "plain. text! with (every) [reserved] {char} #+-=|~>`",
        "**bold** and *italic* and ~~strike~~ and `code.x` and [link](https://e.com/a_(b))",
        "*a*_b_ then ***both*** and **outer **inner** outer**",
        "# Heading with `code` and **bold**\n> a quote.\n- item 1.\n  * nested_item\n1. first",
        "```python\nprint('a.b') # `tick` \\\n```\nafter.",
        "unbalanced ** and __ and ` and [ and ]( and _snake_case_ 2*3*4",
        "[relative](./a.md) [empty]() []() [**bold _it_**](https://e.com)",
        "emoji 🎉 *ünïcödé* _ok_ ~~x~~",
        "```\nunclosed fence.",
    ];
    for sample in samples {
        let converted = to_telegram_markdown_v2(sample);
        if let Err(why) = parse_markdown_v2(&converted) {
            panic!("{sample:?} -> {converted:?}: {why}");
        }
    }
}

// The connector.

#[tokio::test]
async fn receive_hands_events_in_order_and_confirms_only_after_the_ack() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let pushed: Vec<_> = (1..=5)
        .map(|n| fake.push_message(&chat, &alice(), &format!("message {n}")))
        .collect();
    let connector = connector(&fake);
    let mut receiving = Receiving::start(&connector, None);
    let first = receiving.next().await;
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
    let poll = fake
        .calls()
        .into_iter()
        .find(|call| call.method == "GetUpdates")
        .unwrap();
    assert_eq!(
        poll.body["allowed_updates"],
        json!(["message", "edited_message"])
    );
    assert_eq!(poll.body["timeout"], json!(50));
}

#[tokio::test]
async fn an_unacknowledged_update_comes_again_and_an_acknowledged_one_does_not() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let pushed = fake.push_message(&chat, &alice(), "hello");
    let connector = connector(&fake);

    let mut first = Receiving::start(&connector, None);
    let unacked = first.next().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.stop().await.unwrap();
    drop(unacked);
    assert_eq!(fake.pending_update_ids(), vec![pushed.update_id]);

    let mut second = Receiving::start(&connector, None);
    let again = second.next().await;
    assert_eq!(again.event.platform_id, pushed.platform_id());
    again.journaled.send(()).unwrap();
    fake.wait_for_poll(pushed.update_id + 1).await;
    second.stop().await.unwrap();
    assert!(fake.pending_update_ids().is_empty());

    let mut third = Receiving::start(&connector, again.event.cursor.clone());
    third.quiet_for(Duration::from_millis(500)).await;
    third.stop().await.unwrap();
}

#[tokio::test]
async fn an_event_perch_drops_unjournaled_ends_receive_without_confirming_it() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let pushed = fake.push_message(&chat, &alice(), "hello");
    let connector = connector(&fake);
    let mut receiving = Receiving::start(&connector, None);
    drop(receiving.next().await.journaled);
    let ended = receiving.ended().await.unwrap_err();
    assert!(
        matches!(&ended, ConnectorError::Disconnected { message } if message.contains("did not journal")),
        "{ended:?}"
    );
    assert_eq!(fake.pending_update_ids(), vec![pushed.update_id]);
}

#[tokio::test]
async fn a_restart_resumes_from_the_cursor_perch_gives() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    let pushed: Vec<_> = (1..=3)
        .map(|n| fake.push_message(&chat, &alice(), &format!("m{n}")))
        .collect();
    let connector = connector(&fake);
    let mut first = Receiving::start(&connector, None);
    first.next_acked().await;
    let journaled = first.next_acked().await.cursor;
    let in_flight = first.next().await;
    first.stop().await.unwrap();
    drop(in_flight);
    assert_eq!(journaled, Some(pushed[1].update_id.to_string()));

    let mut second = Receiving::start(&connector, journaled);
    let resumed = second.next_acked().await;
    assert_eq!(resumed.platform_id, pushed[2].platform_id());
    assert_eq!(fake.poll_offsets().last(), Some(&Some(pushed[2].update_id)));
    let later = fake.push_message(&chat, &alice(), "m4");
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
    let mut receiving = Receiving::start(&connector, None);
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
    let mut receiving = Receiving::start(&connector, None);
    assert_eq!(receiving.next_acked().await.replying_to, None);
    let long_reply = receiving.next_acked().await;
    let bot_reply = receiving.next_acked().await;
    let topic = receiving.next_acked().await;
    receiving.stop().await.unwrap();
    let quote = long_reply
        .replying_to
        .expect("the reply quotes its original");
    assert_eq!(quote.platform_id, original.platform_id());
    assert_eq!(quote.text.chars().count(), perch::channel::QUOTE_MAX_CHARS);
    assert!(
        quote.text.starts_with("ééé") && quote.text.ends_with('…'),
        "{quote:?}"
    );
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
    let mut receiving = Receiving::start(&connector, None);
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
    let mut receiving = Receiving::start(&connector, None);
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, pushed.platform_id());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    receiving.stop().await.unwrap();
}

#[tokio::test]
async fn a_second_poller_disconnects_the_first_with_a_clear_message() {
    let fake = FakeTelegram::start();
    let first = Receiving::start(&connector(&fake), None);
    fake.wait_for_poll_count(1).await;
    let second_connector = connector(&fake);
    let mut second = Receiving::start(&second_connector, None);
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
    let fake = FakeTelegram::start();
    let receiving = Receiving::start(&connector(&fake), None);
    fake.wait_for_poll_count(1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    receiving.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn deliver_replies_in_the_thread_with_markdown_v2() {
    let fake = FakeTelegram::start();
    let forum = Chat::forum(-100_200, "Team");
    let question = fake.push(Incoming::new(&forum, &alice(), "how?").in_thread(77));
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

#[tokio::test]
async fn the_token_never_appears_in_errors() {
    let fake = FakeTelegram::start();
    fake.push_message(&Chat::private(&alice()), &alice(), "hi");
    let mut texts = Vec::new();

    let wrong_token = "7357001:WrongToken_zyxwvutsrqponmlkjih-0987";
    let refused =
        Arc::new(TelegramConnector::new(secret(wrong_token), Some(fake.api_url())).unwrap());
    let error = Receiving::start(&refused, None).ended().await.unwrap_err();
    assert!(
        matches!(error, ConnectorError::Unauthorized { .. }),
        "{error:?}"
    );
    texts.push(format!("{error} {error:?}"));
    let error = refused.deliver(&delivery("1001", "x")).await.unwrap_err();
    texts.push(format!("{error} {error:?}"));
    texts.push(format!("{refused:?}"));

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let offline = Arc::new(TelegramConnector::new(secret(TOKEN), Some(url)).unwrap());
    let error = Receiving::start(&offline, None).ended().await.unwrap_err();
    assert!(
        matches!(error, ConnectorError::Disconnected { .. }),
        "{error:?}"
    );
    texts.push(format!("{error} {error:?}"));
    let error = offline.deliver(&delivery("1001", "x")).await.unwrap_err();
    assert!(matches!(error, DeliveryError::NotSent { .. }), "{error:?}");
    texts.push(format!("{error} {error:?}"));
    texts.push(format!("{offline:?}"));

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
    let forum = Chat::forum(-100_200, "Team");
    fake.push(Incoming::new(&forum, &alice(), "q").in_thread(77));
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

// Files.

#[tokio::test]
async fn fake_serves_files_by_their_path() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    fake.push(Incoming::document(
        &chat,
        &alice(),
        "a.txt",
        "text/plain",
        b"file bytes",
        None,
    ));
    let (_, updates) = post(&fake.method_url(TOKEN, "getUpdates"), &json!({})).await;
    let document = &updates["result"][0]["message"]["document"];
    assert_eq!(document["file_name"], json!("a.txt"));
    assert_eq!(document["file_size"], json!(10));
    let (status, file) = post(
        &fake.method_url(TOKEN, "getFile"),
        &json!({"file_id": document["file_id"]}),
    )
    .await;
    assert_eq!(status, 200);
    let path = file["result"]["file_path"].as_str().unwrap();
    let bytes = reqwest::get(fake.file_url(TOKEN, path))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"file bytes");
    let wrong = reqwest::get(fake.file_url("7357001:wrong", path))
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 404);
    let (status, body) = post(
        &fake.method_url(TOKEN, "getFile"),
        &json!({"file_id": "nope"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["description"], json!("Bad Request: invalid file_id"));
}

#[tokio::test]
async fn receive_hands_on_files_with_their_captions() {
    let fake = FakeTelegram::start();
    let chat = Chat::private(&alice());
    fake.push(Incoming::document(
        &chat,
        &alice(),
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
    let mut receiving = Receiving::start(&connector, None);
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
    let mut receiving = Receiving::start(&connector, None);
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
    let forum = Chat::forum(-100_200, "Team");
    let question = fake.push(Incoming::new(&forum, &alice(), "the notes?").in_thread(77));
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

/// A loopback address nothing listens on.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
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
                connector
                    .receive(None, Vec::new(), inbound, up, cancel)
                    .await
            }
        });
        tokio::time::timeout(Duration::from_secs(5), came_up.wait())
            .await
            .unwrap_or_else(|_| panic!("attempt {attempt} is up within 5 s"));
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
