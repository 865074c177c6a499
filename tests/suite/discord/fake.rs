//! The fake Discord's own rules on the wire (REST and gateway), which the connector tests use.

use super::*;

#[tokio::test]
async fn the_fake_wants_the_bot_prefix_on_the_token() {
    let fake = FakeDiscord::start();
    let client = reqwest::Client::new();
    for header in [
        None,
        Some(TOKEN.to_owned()),
        Some(format!("Bearer {TOKEN}")),
    ] {
        let mut request = client.get(api(&fake, "users/@me"));
        if let Some(header) = header {
            request = request.header("authorization", header);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401);
        assert_eq!(
            body(response).await,
            json!({"code": 0, "message": "401: Unauthorized"})
        );
    }
    let response = client
        .get(api(&fake, "users/@me"))
        .header("authorization", format!("Bot {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(body(response).await["id"], BOT_ID.to_string());
}

#[tokio::test]
async fn the_fake_serves_the_gateway_url_without_auth() {
    let fake = FakeDiscord::start();
    let response = reqwest::get(api(&fake, "gateway")).await.unwrap();
    assert_eq!(response.status(), 200);
    let url = body(response).await["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with("ws://127.0.0.1:"), "{url}");
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn socket(fake: &FakeDiscord) -> Socket {
    let url = format!("{}/gw?v=10", fake.url().replace("http://", "ws://"));
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

async fn frame(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .unwrap();
        match message {
            WsMessage::Text(text) => return serde_json::from_str(&text).unwrap(),
            WsMessage::Close(frame) => {
                let frame = frame.expect("a close code");
                return json!({"close": u16::from(frame.code), "reason": frame.reason.to_string()});
            }
            _ => {}
        }
    }
}

async fn send(socket: &mut Socket, frame: Value) {
    socket
        .send(WsMessage::Text(frame.to_string()))
        .await
        .unwrap();
}

fn identify(token: &str) -> Value {
    json!({"op": 2, "d": {"token": token, "intents": 37376, "properties": {"os": "linux"}}})
}

async fn identified(fake: &FakeDiscord) -> (Socket, String) {
    let mut socket = socket(fake).await;
    assert_eq!(frame(&mut socket).await["op"], 10);
    send(&mut socket, identify(&format!("Bot {TOKEN}"))).await;
    let ready = frame(&mut socket).await;
    assert_eq!(
        (ready["t"].as_str(), ready["s"].as_u64()),
        (Some("READY"), Some(1))
    );
    let session = ready["d"]["session_id"].as_str().unwrap().to_owned();
    (socket, session)
}

#[tokio::test]
async fn the_fake_gateway_says_hello_identifies_and_acks_heartbeats() {
    let fake = FakeDiscord::start();
    let mut socket = socket(&fake).await;
    let hello = frame(&mut socket).await;
    assert_eq!(hello, json!({"op": 10, "d": {"heartbeat_interval": 1000}}));
    send(&mut socket, json!({"op": 1, "d": null})).await;
    assert_eq!(frame(&mut socket).await["op"], 11);
    send(&mut socket, identify(&format!("Bot {TOKEN}"))).await;
    let ready = frame(&mut socket).await;
    assert_eq!(ready["t"], "READY");
    assert_eq!(ready["d"]["user"]["id"], BOT_ID.to_string());
    assert!(ready["d"]["session_id"].is_string());
    send(&mut socket, json!({"op": 1, "d": 1})).await;
    assert_eq!(frame(&mut socket).await, json!({"op": 11, "d": null}));
    assert_eq!((fake.identifies(), fake.heartbeats()), (1, 2));
}

#[tokio::test]
async fn the_fake_gateway_closes_4004_on_a_token_without_the_bot_prefix() {
    let fake = FakeDiscord::start();
    let mut socket = socket(&fake).await;
    frame(&mut socket).await;
    send(&mut socket, identify(TOKEN)).await;
    assert_eq!(
        frame(&mut socket).await,
        json!({"close": 4004, "reason": "Authentication failed."})
    );
    assert_eq!(fake.identifies(), 0);
}

#[tokio::test]
async fn the_fake_gateway_dispatches_pushed_messages() {
    let fake = FakeDiscord::start();
    let (mut socket, _) = identified(&fake).await;
    let id = fake.push_message(ROOM, &alice(), "hello there");
    let event = frame(&mut socket).await;
    assert_eq!(
        (event["t"].as_str(), event["s"].as_u64()),
        (Some("MESSAGE_CREATE"), Some(2))
    );
    assert_eq!(event["d"]["id"], id.to_string());
    assert_eq!(event["d"]["content"], "hello there");
    assert_eq!(
        event["d"]["guild_id"],
        crate::suite::support::fake_discord::GUILD.to_string()
    );
}

#[tokio::test]
async fn the_fake_echoes_the_bots_own_posts_on_the_gateway() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let (mut socket, _) = identified(&fake).await;
    let response = post(&fake, ROOM, &json!({"content": "from the bot"})).await;
    assert_eq!(response.status(), 200);
    let posted = body(response).await;
    let event = frame(&mut socket).await;
    assert_eq!(event["t"], "MESSAGE_CREATE");
    assert_eq!(event["d"]["id"], posted["id"]);
    assert_eq!(event["d"]["author"]["id"], BOT_ID.to_string());
    assert_eq!(event["d"]["author"]["bot"], true);
}

#[tokio::test]
async fn the_fake_replays_missed_events_on_resume_after_op_7() {
    let fake = FakeDiscord::start();
    let (mut socket, session) = identified(&fake).await;
    fake.force_reconnect();
    assert_eq!(frame(&mut socket).await, json!({"op": 7, "d": null}));
    drop(socket);
    let missed = fake.push_message(ROOM, &alice(), "while you were away");
    let mut socket = self::socket(&fake).await;
    assert_eq!(frame(&mut socket).await["op"], 10);
    let resume =
        json!({"op": 6, "d": {"token": format!("Bot {TOKEN}"), "session_id": session, "seq": 1}});
    send(&mut socket, resume).await;
    let replayed = frame(&mut socket).await;
    assert_eq!(
        (replayed["t"].as_str(), replayed["s"].as_u64()),
        (Some("MESSAGE_CREATE"), Some(2))
    );
    assert_eq!(replayed["d"]["id"], missed.to_string());
    let resumed = frame(&mut socket).await;
    assert_eq!(
        (resumed["t"].as_str(), resumed["s"].as_u64()),
        (Some("RESUMED"), Some(3))
    );
    let unknown =
        json!({"op": 6, "d": {"token": format!("Bot {TOKEN}"), "session_id": "nope", "seq": 1}});
    let mut other = self::socket(&fake).await;
    frame(&mut other).await;
    send(&mut other, unknown).await;
    assert_eq!(frame(&mut other).await, json!({"op": 9, "d": false}));
    assert_eq!(fake.resumes(), 1);
}

#[tokio::test]
async fn the_fake_refuses_content_over_2000_characters_with_50035() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let response = post(&fake, ROOM, &json!({"content": "é".repeat(2001)})).await;
    assert_eq!(response.status(), 400);
    let refused = body(response).await;
    assert_eq!(
        (refused["code"].as_i64(), refused["message"].as_str()),
        (Some(50035), Some("Invalid Form Body"))
    );
    assert_eq!(
        refused["errors"]["content"]["_errors"][0]["code"],
        "BASE_TYPE_MAX_LENGTH"
    );
    let response = post(&fake, ROOM, &json!({"content": "é".repeat(2000)})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(fake.posted().len(), 1);
}

#[tokio::test]
async fn every_fake_error_body_has_a_code_and_a_message() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    fake.set_bucket(2, Duration::from_secs(30));
    let client = reqwest::Client::new();
    let auth = format!("Bot {TOKEN}");
    let authorized =
        |request: reqwest::RequestBuilder| request.header("authorization", &auth).send();
    let messages = api(&fake, &format!("channels/{ROOM}/messages"));
    let mut answers = vec![
        client.get(api(&fake, "users/@me")).send().await.unwrap(),
        authorized(client.get(api(&fake, "nowhere"))).await.unwrap(),
        authorized(client.delete(api(&fake, "users/@me")))
            .await
            .unwrap(),
        authorized(client.get(api(&fake, "channels/5")))
            .await
            .unwrap(),
        authorized(client.post(messages).body("{not json"))
            .await
            .unwrap(),
    ];
    answers.push(post(&fake, ROOM, &json!({"content": ""})).await);
    answers.push(post(&fake, ROOM, &json!({"content": "over the bucket"})).await);
    let statuses: Vec<u16> = answers
        .iter()
        .map(|answer| answer.status().as_u16())
        .collect();
    assert_eq!(statuses, [401, 404, 405, 404, 400, 400, 429]);
    for answer in answers {
        let refused = body(answer).await;
        assert!(refused["code"].is_i64(), "{refused}");
        assert!(refused["message"].is_string(), "{refused}");
    }
}

#[tokio::test]
async fn the_fake_rate_limits_a_channel_with_retry_after_and_bucket_headers() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    fake.set_bucket(2, Duration::from_secs(30));
    for remaining in ["1", "0"] {
        let response = post(&fake, ROOM, &json!({"content": "hi"})).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ratelimit-limit"], "2");
        assert_eq!(response.headers()["x-ratelimit-remaining"], remaining);
        assert!(response.headers().contains_key("x-ratelimit-reset-after"));
    }
    let response = post(&fake, ROOM, &json!({"content": "one too many"})).await;
    assert_eq!(response.status(), 429);
    let headers = response.headers().clone();
    for name in [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
        "x-ratelimit-bucket",
        "x-ratelimit-scope",
    ] {
        assert!(headers.contains_key(name), "{name} missing");
    }
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    let retry: f64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 0.0 && retry <= 30.0, "{retry}");
    let refused = body(response).await;
    assert!(refused["retry_after"].as_f64().unwrap() > 0.0);
    assert_eq!(refused["global"], false);
    assert_eq!(fake.posted().len(), 2);
}

#[tokio::test]
async fn the_fake_returns_the_first_message_for_a_repeated_enforced_nonce() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let once = json!({"content": "once", "nonce": "d-1", "enforce_nonce": true});
    let first = body(post(&fake, ROOM, &once).await).await;
    let again = body(post(&fake, ROOM, &once).await).await;
    assert_eq!(first["id"], again["id"]);
    assert_eq!(fake.messages(ROOM).len(), 1);
    let loose = body(post(&fake, ROOM, &json!({"content": "twice", "nonce": "d-2"})).await).await;
    let loose_again =
        body(post(&fake, ROOM, &json!({"content": "twice", "nonce": "d-2"})).await).await;
    assert_ne!(loose["id"], loose_again["id"]);
    let response = post(
        &fake,
        ROOM,
        &json!({"content": "x", "nonce": "n".repeat(26)}),
    )
    .await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        body(response).await["errors"]["nonce"]["_errors"][0]["code"],
        "BASE_TYPE_MAX_LENGTH"
    );
}

#[tokio::test]
async fn the_fake_pages_history_after_an_id_newest_first_without_guild_id() {
    let fake = FakeDiscord::start();
    let ids: Vec<u64> = (0..5)
        .map(|n| fake.push_message(ROOM, &alice(), &format!("m{n}")))
        .collect();
    let response = reqwest::Client::new()
        .get(api(
            &fake,
            &format!("channels/{ROOM}/messages?after={}&limit=2", ids[0]),
        ))
        .header("authorization", format!("Bot {TOKEN}"))
        .send()
        .await
        .unwrap();
    let page = body(response).await;
    let got: Vec<&str> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[2].to_string(), ids[1].to_string()]);
    assert!(page[0].get("guild_id").is_none());
}
