//! The Telegram connector's contract on the fake Bot API: its rules, receiving, delivering.

mod deliver;
mod fake;
mod receive;

use super::support::PostText;
use super::support::fake_telegram::markdown::parse_markdown_v2;
use super::support::fake_telegram::{
    BOT_ID, CONFLICT, Chat, Failure, FakeTelegram, Incoming, MAX_TEXT, Media, Pushed, TOKEN, User,
};
use super::support::receiving::{Receiving, Within, shortened_quote};
use perch::channel::telegram::TelegramConnector;
use perch::channel::{
    Attachment, AttemptUp, Connector, ConnectorError, Delivery, DeliveryError, FetchError,
    InboundEvent, OutboundFile, ReceiveAttempt, Upload,
};
use perch_core::markdown::to_telegram_markdown_v2;
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn secret(value: &str) -> Secret {
    EnvRef::new(EnvName::try_from("TELEGRAM_TOKEN").unwrap())
        .resolve(|_| Some(value.to_owned()))
        .unwrap()
}

fn connector(fake: &FakeTelegram) -> Arc<TelegramConnector> {
    Arc::new(TelegramConnector::new(secret(TOKEN), Some(fake.api_url())).unwrap())
}

/// `receive` from `resume`: each event within 10 s, stopped within 2 s.
fn receive(connector: &Arc<TelegramConnector>, resume: Option<String>) -> Receiving {
    let within = Within {
        event: Duration::from_secs(10),
        stop: Duration::from_secs(2),
    };
    Receiving::start(connector, resume, Vec::new(), within)
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

/// Alice's private messages `texts`, pushed in order.
fn alice_said(fake: &FakeTelegram, texts: impl Iterator<Item = String>) -> Vec<Pushed> {
    let chat = Chat::private(&alice());
    texts
        .map(|text| fake.push_message(&chat, &alice(), &text))
        .collect()
}

/// Posts `text` as MarkdownV2 to chat 1001 at `url` (a `sendMessage` URL).
async fn post_markdown(url: &str, text: &str) -> (u16, Value) {
    post(
        url,
        &json!({"chat_id": 1001, "text": text, "parse_mode": "MarkdownV2"}),
    )
    .await
}

fn alice() -> User {
    User::human(1001, "Alice")
}

/// A loopback address nothing listens on.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}
