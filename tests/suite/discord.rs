//! The Discord connector against the fake REST API and gateway, and the fake's own rules, each
//! checked on the wire.

use super::fake_discord::{Author, BOT_ID, Failure, FakeDiscord, FakeFile, Route, TOKEN};
use super::support::PostText;
use futures_util::{SinkExt, StreamExt};
use perch::channel::discord::{DiscordConnector, FALLBACK_RETRY_AFTER, RESEND_WINDOW};
use perch::channel::{
    Arrival, AttemptUp, Connector, ConnectorError, Delivery, DeliveryError, FetchError,
    InboundEvent, OutboundFile, Upload,
};
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

const ROOM: u64 = 700_000_000_000_000_001;
const OTHER_ROOM: u64 = 700_000_000_000_000_002;
const DM: u64 = 700_000_000_000_000_003;
const WAIT: Duration = Duration::from_secs(15);

fn secret(value: &str) -> Secret {
    EnvRef::new(EnvName::try_from("DISCORD_TOKEN").unwrap())
        .resolve(|_| Some(value.into()))
        .unwrap()
}

fn connector(fake: &FakeDiscord) -> Arc<DiscordConnector> {
    Arc::new(DiscordConnector::new(secret(TOKEN), Some(fake.url())))
}

fn alice() -> Author {
    Author::user(111_111_111_111_111_111, "alice")
}

fn delivery(id: &str, room: u64, reply_to: Option<u64>, text: &str) -> Delivery {
    Delivery {
        id: id.into(),
        room: room.to_string(),
        thread: None,
        reply_to: reply_to.map(|id| id.to_string()),
        text: text.into(),
        attachments: Vec::new(),
    }
}

struct Receiving {
    arrivals: mpsc::Receiver<Arrival>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ConnectorError>>,
}

fn receive(connector: &Arc<DiscordConnector>, since: Vec<(String, String)>) -> Receiving {
    let (sender, arrivals) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let connector = Arc::clone(connector);
    let token = cancel.clone();
    let task = tokio::spawn(async move {
        connector
            .receive(None, since, sender, AttemptUp::pair().0, token)
            .await
    });
    Receiving {
        arrivals,
        cancel,
        task,
    }
}

impl Receiving {
    async fn arrival(&mut self) -> Arrival {
        tokio::time::timeout(WAIT, self.arrivals.recv())
            .await
            .expect("an event arrives in time")
            .expect("the connector is still receiving")
    }

    async fn next(&mut self) -> InboundEvent {
        let arrival = self.arrival().await;
        arrival.journaled.send(()).unwrap();
        arrival.event
    }

    async fn nothing_for(&mut self, quiet: Duration) {
        if let Ok(Some(arrival)) = tokio::time::timeout(quiet, self.arrivals.recv()).await {
            panic!("unexpected event {:?}", arrival.event);
        }
    }

    async fn stop(self) -> Result<(), ConnectorError> {
        self.cancel.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("receive stops when cancelled")
            .unwrap()
    }

    async fn ended(self) -> Result<(), ConnectorError> {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("receive ends by itself")
            .unwrap()
    }
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn connected(fake: &FakeDiscord) {
    until("the gateway session", || fake.live_sessions() == 1).await;
}

// The fake's rules, on the wire.

fn api(fake: &FakeDiscord, path: &str) -> String {
    format!("{}/api/v10/{path}", fake.url())
}

async fn body(response: reqwest::Response) -> Value {
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

async fn post(fake: &FakeDiscord, channel: u64, payload: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(api(fake, &format!("channels/{channel}/messages")))
        .header("authorization", format!("Bot {TOKEN}"))
        .header("content-type", "application/json")
        .body(payload.to_string())
        .send()
        .await
        .unwrap()
}

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
        super::fake_discord::GUILD.to_string()
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
    let mut answers = vec![
        client.get(api(&fake, "users/@me")).send().await.unwrap(),
        client
            .get(api(&fake, "nowhere"))
            .header("authorization", &auth)
            .send()
            .await
            .unwrap(),
        client
            .delete(api(&fake, "users/@me"))
            .header("authorization", &auth)
            .send()
            .await
            .unwrap(),
        client
            .get(api(&fake, "channels/5"))
            .header("authorization", &auth)
            .send()
            .await
            .unwrap(),
        client
            .post(api(&fake, &format!("channels/{ROOM}/messages")))
            .header("authorization", &auth)
            .body("{not json")
            .send()
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
    let first = body(
        post(
            &fake,
            ROOM,
            &json!({"content": "once", "nonce": "d-1", "enforce_nonce": true}),
        )
        .await,
    )
    .await;
    let again = body(
        post(
            &fake,
            ROOM,
            &json!({"content": "once", "nonce": "d-1", "enforce_nonce": true}),
        )
        .await,
    )
    .await;
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

// The connector.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_in_order_and_each_waits_for_the_journal() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let first = fake.push_message(ROOM, &alice(), "one");
    let second = fake.push_message(ROOM, &alice(), "two");
    let arrival = receiving.arrival().await;
    assert_eq!(arrival.event.platform_id, first.to_string());
    receiving.nothing_for(Duration::from_millis(400)).await;
    arrival.journaled.send(()).unwrap();
    let event = receiving.next().await;
    assert_eq!(event.platform_id, second.to_string());
    assert_eq!(event.room, ROOM.to_string());
    assert_eq!(event.thread, None);
    assert_eq!(event.cursor, None);
    assert_eq!(event.sender.id, alice().id.to_string());
    assert_eq!(event.sender.name, "alice");
    assert!(!event.sender.is_bot && !event.direct && !event.addressed);
    assert_eq!(event.text, "two");
    let age = chrono::Utc::now() - event.sent_at;
    assert!(age.num_seconds().abs() < 30, "{}", event.sent_at);
    assert_eq!(receiving.stop().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bots_own_messages_are_not_handed_on() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    connector
        .deliver(&delivery("own-1", ROOM, None, "I said this"))
        .await
        .unwrap();
    let from_alice = fake.push_message(ROOM, &alice(), "and I said this");
    assert_eq!(receiving.next().await.platform_id, from_alice.to_string());
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_messages_sent_while_down_are_back_filled() {
    let fake = FakeDiscord::start();
    fake.dm_channel(DM);
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let seen_room = fake.push_message(ROOM, &alice(), "before");
    let seen_dm = fake.push_message(DM, &alice(), "dm before");
    assert_eq!(receiving.next().await.platform_id, seen_room.to_string());
    assert!(receiving.next().await.direct);
    receiving.stop().await.unwrap();
    until("the old session to close", || fake.live_sessions() == 0).await;

    let missed: Vec<u64> = (0..3)
        .map(|n| fake.push_message(ROOM, &alice(), &format!("while down {n}")))
        .collect();
    let missed_dm = fake.push_message(DM, &alice(), "dm while down");
    fake.push_message(OTHER_ROOM, &alice(), "a room perch never saw");
    let since = vec![
        (ROOM.to_string(), seen_room.to_string()),
        (DM.to_string(), seen_dm.to_string()),
    ];
    let mut receiving = receive(&connector, since);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(receiving.next().await);
    }
    let rooms: Vec<(String, bool)> = got
        .iter()
        .map(|e| (e.platform_id.clone(), e.direct))
        .collect();
    let mut expected: Vec<(String, bool)> =
        missed.iter().map(|id| (id.to_string(), false)).collect();
    expected.push((missed_dm.to_string(), true));
    expected.sort();
    let mut sorted = rooms.clone();
    sorted.sort();
    assert_eq!(sorted, expected);
    let in_room: Vec<&String> = got
        .iter()
        .filter(|e| e.room == ROOM.to_string())
        .map(|e| &e.platform_id)
        .collect();
    let missed_text: Vec<String> = missed.iter().map(u64::to_string).collect();
    assert_eq!(in_room, missed_text.iter().collect::<Vec<_>>());
    let live = fake.push_message(ROOM, &alice(), "live again");
    let mut next = receiving.next().await;
    while next.platform_id != live.to_string() {
        assert!(
            missed.iter().any(|id| id.to_string() == next.platform_id),
            "{next:?}"
        );
        next = receiving.next().await;
    }
    receiving.stop().await.unwrap();
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_rate_limited() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    fake.fail_next(Route::CreateMessage, Failure::rate_limited(3.0));
    let refused = connector
        .deliver(&delivery("d-429", ROOM, None, "hi"))
        .await;
    assert_eq!(
        refused,
        Err(DeliveryError::RateLimited {
            retry_after: FALLBACK_RETRY_AFTER
        })
    );
    fake.set_bucket(1, Duration::from_secs(30));
    fake.guild_channel(OTHER_ROOM);
    connector
        .deliver(&delivery("d-429-c", OTHER_ROOM, None, "first"))
        .await
        .unwrap();
    let refused = connector
        .deliver(&delivery("d-429-d", OTHER_ROOM, None, "second"))
        .await;
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
async fn the_session_resumes_after_op_7_without_identifying_again() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let before = fake.push_message(ROOM, &alice(), "before");
    assert_eq!(receiving.next().await.platform_id, before.to_string());
    fake.force_reconnect();
    until("the resume", || fake.resumes() == 1).await;
    let after = fake.push_message(ROOM, &alice(), "after");
    let mut next = receiving.next().await;
    while next.platform_id == before.to_string() {
        next = receiving.next().await;
    }
    assert_eq!(next.platform_id, after.to_string());
    assert_eq!(fake.identifies(), 1);
    let resume = fake
        .frames()
        .into_iter()
        .find(|frame| frame["op"] == 6)
        .unwrap();
    assert_eq!(resume["d"]["token"], format!("Bot {TOKEN}"));
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mentions_and_replies_to_the_bot_address_it() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    fake.dm_channel(DM);
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let bob = Author::user(222_222_222_222_222_222, "bob");
    let mine = connector
        .deliver(&delivery("d-mine", ROOM, None, "a bot message"))
        .await
        .unwrap();
    let plain = fake.push_message(ROOM, &alice(), "just chatting");
    fake.push_message(ROOM, &alice(), &format!("<@{BOT_ID}> are you there?"));
    fake.push_message(ROOM, &alice(), &format!("<@!{BOT_ID}> nickname mention"));
    fake.push_reply(
        ROOM,
        &alice(),
        "replying to the bot",
        mine.platform_id.parse().unwrap(),
    );
    fake.push_reply(ROOM, &bob, "replying to alice", plain);
    fake.push_message(ROOM, &alice(), "<@222222222222222222> only bob");
    fake.push_message(DM, &alice(), "a direct message");
    let mut got = Vec::new();
    for _ in 0..7 {
        let event = receiving.next().await;
        got.push((event.text, event.addressed, event.direct));
    }
    assert_eq!(
        got,
        [
            ("just chatting".to_owned(), false, false),
            (format!("<@{BOT_ID}> are you there?"), true, false),
            (format!("<@!{BOT_ID}> nickname mention"), true, false),
            ("replying to the bot".to_owned(), true, false),
            ("replying to alice".to_owned(), false, false),
            ("<@222222222222222222> only bob".to_owned(), false, false),
            ("a direct message".to_owned(), false, true),
        ]
    );
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_quotes_its_original_shortened_and_an_edit_is_handed_on_as_one() {
    let fake = FakeDiscord::start();
    fake.guild_channel(ROOM);
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let mine = connector
        .deliver(&delivery("d-mine", ROOM, None, "a bot message"))
        .await
        .unwrap();
    let long = "ß".repeat(400);
    let bob = Author::user(222_222_222_222_222_222, &"b".repeat(32));
    let original = fake.push_message(ROOM, &bob, &long);
    fake.push_reply(ROOM, &alice(), "too long", original);
    fake.push_reply(
        ROOM,
        &alice(),
        "replying to the bot",
        mine.platform_id.parse().unwrap(),
    );
    fake.push_edit(ROOM, original, "shorter now");
    fake.push_message(ROOM, &alice(), "after the edit");
    assert_eq!(receiving.next().await.replying_to, None);
    let long_reply = receiving.next().await;
    let bot_reply = receiving.next().await;
    let edit = receiving.next().await;
    let after = receiving.next().await;
    receiving.stop().await.unwrap();
    let quote = long_reply
        .replying_to
        .expect("the reply quotes its original");
    assert_eq!(quote.platform_id, original.to_string());
    assert_eq!(quote.text.chars().count(), perch::channel::QUOTE_MAX_CHARS);
    assert!(quote.text.starts_with("ßßß") && quote.text.ends_with('…'));
    let author = quote.author.expect("the quoted author");
    assert_eq!(author.id, "222222222222222222");
    assert_eq!(author.name, "b".repeat(32));
    assert!(!author.is_bot);
    let quote = bot_reply.replying_to.expect("the reply quotes the bot");
    assert_eq!(quote.platform_id, mine.platform_id);
    assert_eq!(quote.text, "a bot message");
    assert!(quote.author.expect("the bot").is_bot);
    assert_eq!(edit.text, "shorter now");
    assert_eq!(edit.edit_of, Some(original.to_string()));
    assert!(edit.platform_id.starts_with(&format!("{original}:edited:")));
    assert_eq!(edit.sender.id, "222222222222222222");
    assert_eq!(after.text, "after the edit");
    assert_eq!(after.edit_of, None);
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
async fn a_wrong_token_is_unauthorized() {
    let fake = FakeDiscord::start();
    let connector = Arc::new(DiscordConnector::new(
        secret("not-the-token"),
        Some(fake.url()),
    ));
    let ended = receive(&connector, Vec::new()).ended().await;
    assert!(
        matches!(ended, Err(ConnectorError::Unauthorized { .. })),
        "{ended:?}"
    );
    assert_eq!(fake.identifies(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_message_content_intent_is_unauthorized_and_says_what_to_do() {
    let fake = FakeDiscord::start();
    fake.deny_privileged_intents();
    let connector = connector(&fake);
    let ended = receive(&connector, Vec::new()).ended().await;
    let Err(ConnectorError::Unauthorized { message }) = &ended else {
        panic!("{ended:?}");
    };
    assert!(message.contains("Message Content intent"), "{message}");
    let identify = fake
        .frames()
        .into_iter()
        .find(|frame| frame["op"] == 2)
        .unwrap();
    assert_eq!(identify["d"]["token"], format!("Bot {TOKEN}"));
    assert_eq!(identify["d"]["intents"], 37376);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_gateway_trips_the_watchdog() {
    let fake = FakeDiscord::start();
    let connector = Arc::new(
        DiscordConnector::new(secret(TOKEN), Some(fake.url()))
            .with_liveness(Duration::from_secs(2)),
    );
    let receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    until("a heartbeat", || fake.heartbeats() >= 1).await;
    fake.freeze_gateway();
    let started = std::time::Instant::now();
    let ended = receiving.ended().await;
    let Err(ConnectorError::Disconnected { message }) = &ended else {
        panic!("{ended:?}");
    };
    assert!(message.contains("heartbeat ACK"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_watchdog_fires_the_next_receive_picks_the_recovered_client_up() {
    let fake = FakeDiscord::start();
    let connector = Arc::new(
        DiscordConnector::new(secret(TOKEN), Some(fake.url()))
            .with_liveness(Duration::from_secs(2)),
    );
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let seen = fake.push_message(ROOM, &alice(), "before the silence");
    assert_eq!(receiving.next().await.platform_id, seen.to_string());
    fake.freeze_gateway();
    assert!(matches!(
        receiving.ended().await,
        Err(ConnectorError::Disconnected { .. })
    ));
    let missed = fake.push_message(ROOM, &alice(), "during the silence");
    fake.thaw_gateway();
    let connector = Arc::new(
        Arc::into_inner(connector)
            .unwrap()
            .with_liveness(Duration::from_secs(60)),
    );
    let mut receiving = receive(&connector, vec![(ROOM.to_string(), seen.to_string())]);
    let event = tokio::time::timeout(Duration::from_secs(40), receiving.next())
        .await
        .expect("the client recovers and back-fills");
    assert_eq!(event.platform_id, missed.to_string());
    let live = fake.push_message(ROOM, &alice(), "after the silence");
    let mut next = receiving.next().await;
    while next.platform_id == missed.to_string() {
        next = receiving.next().await;
    }
    assert_eq!(next.platform_id, live.to_string());
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_is_identified_afresh_and_the_gap_back_filled() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let seen = fake.push_message(ROOM, &alice(), "before");
    assert_eq!(receiving.next().await.platform_id, seen.to_string());
    fake.invalidate_sessions();
    let missed = fake.push_message(ROOM, &alice(), "while no session was live");
    until("a second identify", || fake.identifies() == 2).await;
    let event = receiving.next().await;
    assert_eq!(event.platform_id, missed.to_string());
    let live = fake.push_message(ROOM, &alice(), "on the new session");
    let mut next = receiving.next().await;
    while next.platform_id == missed.to_string() {
        next = receiving.next().await;
    }
    assert_eq!(next.platform_id, live.to_string());
    receiving.stop().await.unwrap();
    until("the session to close", || fake.live_sessions() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_but_healthy_gateway_does_not_trip_the_watchdog() {
    let fake = FakeDiscord::start();
    let connector = Arc::new(
        DiscordConnector::new(secret(TOKEN), Some(fake.url()))
            .with_liveness(Duration::from_secs(3)),
    );
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    receiving.nothing_for(Duration::from_secs(6)).await;
    assert!(!receiving.task.is_finished());
    assert!(fake.heartbeats() >= 3);
    receiving.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_closes_the_gateway_session() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    assert_eq!(receiving.stop().await, Ok(()));
    until("the session to close", || fake.live_sessions() == 0).await;
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

    fake.fail_next(Route::CreateMessage, Failure::rate_limited(7.0));
    let limited = connector
        .deliver(&delivery("p-429", ROOM, None, "hi"))
        .await;
    assert_eq!(
        limited,
        Err(DeliveryError::RateLimited {
            retry_after: Duration::from_secs(7)
        })
    );

    fake.set_bucket(1, Duration::from_secs(30));
    connector
        .deliver(&delivery("p-first", OTHER_ROOM, None, "first"))
        .await
        .unwrap();
    let held = connector
        .deliver(&delivery("p-second", OTHER_ROOM, None, "second"))
        .await;
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
    assert_eq!(receiving.next().await.platform_id, id.to_string());
    receiving.stop().await.unwrap();
    assert!(
        tls.tunnels()
            .iter()
            .all(|line| line.starts_with("CONNECT discord.com:443 "))
    );
    assert!(!tls.tunnels().is_empty());
}

// Files.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_are_handed_on_and_fetched_without_the_token() {
    let fake = FakeDiscord::start();
    let connector = connector(&fake);
    let mut receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    let mut big = FakeFile::new("big.zip", "application/zip", b"zip");
    big.declared = Some(30_000_000);
    let mut liar = FakeFile::new("liar.bin", "application/octet-stream", &[9u8; 4000]);
    liar.declared = Some(10);
    fake.push_files(
        ROOM,
        &alice(),
        "",
        &[
            FakeFile::new("notes v2.txt", "text/plain", b"the notes"),
            big,
            liar,
        ],
    );
    let event = receiving.next().await;
    receiving.stop().await.unwrap();
    assert_eq!(event.text, "", "a message with only files still arrives");
    let names: Vec<_> = event
        .attachments
        .iter()
        .map(|attachment| attachment.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["notes v2.txt", "big.zip", "liar.bin"]);
    let notes = &event.attachments[0];
    assert_eq!(notes.content_type.as_deref(), Some("text/plain"));
    assert_eq!(notes.size, Some(9));
    assert_eq!(
        connector.fetch(&event, notes, 100).await.unwrap(),
        b"the notes"
    );
    assert_eq!(
        connector
            .fetch(&event, &event.attachments[1], 25_000_000)
            .await,
        Err(FetchError::TooLarge {
            size: Some(30_000_000)
        })
    );
    assert_eq!(
        connector.fetch(&event, &event.attachments[2], 1000).await,
        Err(FetchError::TooLarge { size: Some(4000) }),
        "the CDN's content-length gives a liar away"
    );
    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    assert!(
        downloads.iter().all(|(_, authorized)| !authorized),
        "the bot token never goes to the CDN: {downloads:?}"
    );
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
