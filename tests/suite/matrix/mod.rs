//! The Matrix connector's contract against a real Synapse, and Matrix through `perch run`.

mod connector;
mod encryption;
mod gate;
mod perch_run;
mod recovery;

use super::support::counting_proxy::CountingProxy;
use super::support::fake_model::Script;
use super::support::receiving::{Receiving, Within};
use super::support::scenario::{Agent, Scenario};
use super::support::synapse::{Account, Synapse};
use super::support::wait::Poll;
use super::support::{PostText, write};
use matrix_sdk::config::SyncSettings;
use matrix_sdk::deserialized_responses::TimelineEventKind;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{EventId, RoomId};
use perch::channel::matrix::{MatrixConnector, read_undecryptable};
use perch::channel::{Connector, ConnectorError, Delivery, InboundEvent};
use perch_core::config::Api;
use perch_core::name::EnvName;
use perch_core::secret::{EnvRef, Secret};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PASSPHRASE: &str = "store-passphrase-for-tests";

const WAIT: Duration = Duration::from_secs(30);

fn secret(value: &str) -> Secret {
    EnvRef::new(EnvName::try_from("MATRIX_SECRET").unwrap())
        .resolve(|_| Some(value.to_owned()))
        .unwrap()
}

fn connector(bot: &Account, store: &Path, allowed: &[&Account]) -> Arc<MatrixConnector> {
    connector_at(&bot.url, bot, store, allowed)
}

/// [`connector`] on the homeserver at `url` (a proxy in front of it).
fn connector_at(
    url: &str,
    bot: &Account,
    store: &Path,
    allowed: &[&Account],
) -> Arc<MatrixConnector> {
    Arc::new(
        MatrixConnector::new(
            url,
            &bot.user_id,
            secret(&bot.password),
            secret(PASSPHRASE),
            store.to_path_buf(),
            allowed.iter().map(|user| user.user_id.clone()).collect(),
        )
        .unwrap(),
    )
}

/// The homeserver, `alice` and `bot`, registered in that order.
async fn alice_and_bot() -> (Synapse, Account, Account) {
    let synapse = Synapse::from_env();
    let alice = synapse.register("alice").await;
    let bot = synapse.register("bot").await;
    (synapse, alice, bot)
}

/// A connector for `bot` on the homeserver at `url` (its store in a temporary directory) that
/// lets `allowed` talk anywhere, behind `gate` if given, and its `receive`; `ready` waits for its
/// first sync.
async fn listening(
    url: &str,
    bot: &Account,
    allowed: &[&Account],
    gate: Option<perch::channel::Gate>,
    ready: bool,
) -> (tempfile::TempDir, Arc<MatrixConnector>, Receiving) {
    let store = tempfile::tempdir().unwrap();
    let connector = connector_at(url, bot, store.path(), allowed);
    if let Some(gate) = gate {
        connector.gate(gate);
    }
    let receiving = receive(&connector, Vec::new());
    if ready {
        tokio::time::timeout(WAIT, connector.ready()).await.unwrap();
    }
    (store, connector, receiving)
}

/// Sends `content` as an `m.room.message` from `from` in `room`, and takes the next event
/// (acknowledged), which must be it; its id and the event.
async fn sent_and_taken(
    from: &Account,
    room: &str,
    content: Value,
    receiving: &mut Receiving,
) -> (String, InboundEvent) {
    let sent = from.send(room, "m.room.message", content).await;
    let event = receiving.next_acked().await;
    assert_eq!(event.platform_id, sent);
    (sent, event)
}

/// A quote of `platform_id` with nothing fetched: no author, no text.
fn bare_quote(platform_id: &str) -> perch::channel::Quote {
    perch::channel::Quote {
        platform_id: platform_id.to_owned(),
        author: None,
        text: String::new(),
    }
}

/// The HTML body of a message's content.
fn formatted(content: &Value) -> &str {
    content["formatted_body"].as_str().unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `receive` from the rooms' last journaled events `since`: each event within 30 s, stopped
/// within 5 s.
fn receive(connector: &Arc<MatrixConnector>, since: Vec<(String, String)>) -> Receiving {
    receiving_from(connector, None, since)
}

/// [`receiving`] from the cursor `resume` too.
fn receiving_from(
    connector: &Arc<MatrixConnector>,
    resume: Option<String>,
    since: Vec<(String, String)>,
) -> Receiving {
    let within = Within {
        event: WAIT,
        stop: Duration::from_secs(5),
    };
    Receiving::start(connector, resume, since, within)
}

/// Polls `done` every 50 ms (each look asks the homeserver) for at most [`WAIT`].
async fn wait_until<F, Fut>(what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    Poll::within(WAIT)
        .every(Duration::from_millis(50))
        .until_async(what, done)
        .await;
}

/// A channel `mx` logged in as `bot` on `homeserver`; `options` (each ending in a comma) go
/// inside `channel { ... }` after the credentials.
fn matrix_scenario(homeserver: &str, bot: &Account, options: &str) -> Scenario {
    Scenario::channel_lua(
        "channels/mx.lua",
        &format!(
            "channel {{\n  kind = \"matrix\",\n  homeserver = {homeserver:?},\n  user = {:?},\n  \
             password = env \"MATRIX_PASSWORD\",\n  store_passphrase = env \"MATRIX_STORE_PASSPHRASE\",\n  \
             {options}\n}}\n",
            bot.user_id
        ),
    )
    .env("MATRIX_PASSWORD", &bot.password)
    .env("MATRIX_STORE_PASSPHRASE", PASSPHRASE)
}

/// An agent whose channel `mx` answers direct messages and lets `alice` talk anywhere.
fn matrix_agent(bot: &Account, alice: &Account) -> Agent {
    matrix_scenario(
        &bot.url,
        bot,
        &format!(
            "dm = \"allow\",\n  allow = {{ users = {{ {:?} }} }},",
            alice.user_id
        ),
    )
    .build()
}

async fn bot_replies(alice: &Account, room: &str, bot: &Account) -> Vec<Value> {
    let mut replies: Vec<Value> = alice
        .messages(room, 50)
        .await
        .into_iter()
        .filter(|event| {
            event["sender"] == bot.user_id.as_str() && event["type"] == "m.room.message"
        })
        .collect();
    replies.reverse();
    replies
}

/// Waits until `bot`'s replies in `room`, as `reader` sees them, are `enough`.
async fn replies_until(
    reader: &Account,
    room: &str,
    bot: &Account,
    what: &str,
    enough: impl Fn(usize) -> bool,
) {
    let enough = &enough;
    wait_until(what, move || async move {
        enough(bot_replies(reader, room, bot).await.len())
    })
    .await;
}

/// Waits until `bot` has answered `count` times in `room`, as seen by `reader`.
async fn wait_replies(reader: &Account, room: &str, bot: &Account, count: usize) {
    replies_until(reader, room, bot, "the bot's replies", |n| n >= count).await;
}

/// The bytes of an `mxc://` URI, through the authenticated media API, as `account`.
async fn download_media(account: &Account, mxc: &str) -> Vec<u8> {
    let path = mxc.strip_prefix("mxc://").unwrap();
    let response = reqwest::Client::new()
        .get(format!(
            "{}/_matrix/client/v1/media/download/{path}",
            account.url
        ))
        .bearer_auth(&account.access_token)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    response.bytes().await.unwrap().to_vec()
}

fn path_segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn reply_to(body: &str, to: &str) -> Value {
    json!({
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": { "m.in_reply_to": { "event_id": to } },
    })
}

fn edit_of(body: &str, of: &str) -> Value {
    json!({
        "msgtype": "m.text",
        "body": format!("* {body}"),
        "m.new_content": { "msgtype": "m.text", "body": body },
        "m.relates_to": { "rel_type": "m.replace", "event_id": of },
    })
}
