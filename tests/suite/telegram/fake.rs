//! The fake Bot API's own rules, each checked with raw requests, which the connector tests use.

use super::*;

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
        let (status, body) = post_markdown(&url, text).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(
            body["description"],
            json!(format!("Bad Request: can't parse entities: {why}")),
            "{text}"
        );
    }
    assert!(fake.sent().is_empty());
    let text = "*bold* _it_ ~s~ __u__ ||sp|| `a.b` [l](https://e.com/x\\)) \\. \\!\n>quote\n```rust\nx.y\n```";
    let (status, body) = post_markdown(&url, text).await;
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
