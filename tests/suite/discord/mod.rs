//! The Discord connector's contract on the fake: the fake's rules, receiving and delivering.

mod deliver;
mod fake;
mod receive;

use super::support::PostText;
use super::support::fake_discord::{Author, BOT_ID, Failure, FakeDiscord, FakeFile, Route, TOKEN};
use super::support::receiving::{Receiving, Within, shortened_quote};
use super::support::wait::Poll;
use futures_util::{SinkExt, StreamExt};
use perch::channel::discord::{DiscordConnector, FALLBACK_RETRY_AFTER, RESEND_WINDOW};
use perch::channel::{
    Connector, ConnectorError, Delivery, DeliveryError, FetchError, OutboundFile, Upload,
};
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as WsMessage;

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

/// A connector to `fake` whose watchdog gives up on a gateway silent for `secs` seconds.
fn watched_connector(fake: &FakeDiscord, secs: u64) -> Arc<DiscordConnector> {
    Arc::new(
        DiscordConnector::new(secret(TOKEN), Some(fake.url()))
            .with_liveness(Duration::from_secs(secs)),
    )
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

fn receive(connector: &Arc<DiscordConnector>, since: Vec<(String, String)>) -> Receiving {
    let within = Within {
        event: WAIT,
        stop: WAIT,
    };
    Receiving::start(connector, None, since, within)
}

/// A fake Discord set up by `setup`, a connector to it, and its `receive` once the gateway
/// session is up.
async fn receiving_from(
    setup: impl FnOnce(&FakeDiscord),
) -> (FakeDiscord, Arc<DiscordConnector>, Receiving) {
    let fake = FakeDiscord::start();
    setup(&fake);
    let connector = connector(&fake);
    let receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    (fake, connector, receiving)
}

/// Alice's message `text` in [`ROOM`], pushed and taken (acknowledged) from `receiving`; its id.
async fn pushed_and_taken(fake: &FakeDiscord, receiving: &mut Receiving, text: &str) -> u64 {
    let id = fake.push_message(ROOM, &alice(), text);
    assert_eq!(receiving.next_acked().await.platform_id, id.to_string());
    id
}

/// [`receiving_from`] a fake with no set-up, through [`watched_connector`]`(secs)`.
async fn receiving_watched(secs: u64) -> (FakeDiscord, Arc<DiscordConnector>, Receiving) {
    let fake = FakeDiscord::start();
    let connector = watched_connector(&fake, secs);
    let receiving = receive(&connector, Vec::new());
    connected(&fake).await;
    (fake, connector, receiving)
}

/// Waits, yielding, until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    Poll::within(WAIT)
        .until_async(what, || std::future::ready(done()))
        .await;
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
