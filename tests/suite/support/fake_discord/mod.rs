//! A fake of Discord's REST API (v10) and gateway on loopback, enforcing the platform's rules as
//! Discord documents and serenity 0.12.5 meets them.
//!
//! REST: `Authorization: Bot <token>` on everything but `GET /gateway` (401 otherwise); every
//! error body has a `code` and a `message`; `POST /channels/{id}/messages` refuses content over
//! 2,000 characters and nonces over 25 with 400 `50035 Invalid Form Body` and per-field
//! `errors`, an empty message with `50006`, a reply to an unknown message unless
//! `fail_if_not_exists` is false; a second POST with the same `nonce` and `enforce_nonce` inside
//! the window returns the first message and posts nothing; the channel's message bucket (5 per
//! 5 s by default) answers 429 with `retry-after` and `x-ratelimit-*` headers and
//! `retry_after` in the body, and successful posts carry the bucket's headers too;
//! `GET /channels/{id}/messages` pages with `after`/`before`/`limit`, newest first within a page,
//! and, like all REST message objects, without `guild_id`. A message with files is
//! `multipart/form-data`: the JSON body in `payload_json`, each file in a `files[n]` part with
//! its file name; an empty message is refused unless it has files. Attachments are served from
//! `GET /attachments/{channel}/{id}/{name}` (the CDN, which needs no token).
//!
//! Gateway (`ws://`, JSON text frames, `?v=10` required): HELLO, IDENTIFY whose token must carry
//! the `Bot ` prefix (close 4004 otherwise), READY, heartbeat ACKs, MESSAGE_CREATE dispatches for
//! every message (the bot's own posts included, as Discord echoes them) to each session whose
//! intents cover it, with the content blanked without the Message Content intent; op 7 on
//! request, then RESUME replays the events the client missed before RESUMED; an unknown session
//! gets op 9. Client frames out of order close with Discord's codes.
//!
//! [`FakeDiscord::intercept_tls`] adds an HTTPS proxy whose `CONNECT discord.com:443` tunnels
//! end in TLS with a test CA and lead to the fake, for serenity's production path (no API
//! proxy, ratelimiter on).
//!
//! The server runs on its own thread and runtime, so it works from `#[test]` and
//! `#[tokio::test]` alike; it stops when the `FakeDiscord` is dropped.
#![allow(
    dead_code,
    reason = "a harness shared by several suites, each using part of it"
)]

mod gateway;
mod rest;
mod tls;

use super::http::{ServerThread, parse_multipart};
use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use gateway::gateway;
use rest::{percent_encode, rest};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// The bot token the fake accepts.
pub const TOKEN: &str = "MTA5ODc2NTQzMjEwOTg3NjU0Mw.Gfake.perch-test-token-do-not-leak";
/// The bot's user id.
pub const BOT_ID: u64 = 1_098_765_432_109_876_543;
/// The guild that guild channels belong to.
pub const GUILD: u64 = 900_000_000_000_000_001;
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
const MESSAGE_CONTENT: u64 = 1 << 15;
const GUILD_MESSAGES: u64 = 1 << 9;
const DIRECT_MESSAGES: u64 = 1 << 12;

/// A user who sends messages.
#[derive(Debug, Clone)]
pub struct Author {
    pub id: u64,
    pub name: String,
    pub bot: bool,
}

impl Author {
    pub fn user(id: u64, name: &str) -> Author {
        Author {
            id,
            name: name.into(),
            bot: false,
        }
    }

    pub fn bot(id: u64, name: &str) -> Author {
        Author {
            id,
            name: name.into(),
            bot: true,
        }
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id.to_string(), "username": self.name, "discriminator": "0",
            "global_name": self.name, "avatar": null, "bot": self.bot,
        })
    }
}

/// A REST route that [`FakeDiscord::fail_next`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Gateway,
    CurrentUser,
    GetChannel,
    GetMessages,
    CreateMessage,
    Typing,
}

/// An error answer for one request.
#[derive(Debug, Clone)]
pub struct Failure {
    pub status: u16,
    pub code: i64,
    pub message: String,
    /// For 429: seconds, sent in `retry-after` (rounded up) and in the body (exact).
    pub retry_after: Option<f64>,
}

impl Failure {
    pub fn rate_limited(seconds: f64) -> Failure {
        Failure {
            status: 429,
            code: 0,
            message: "You are being rate limited.".into(),
            retry_after: Some(seconds),
        }
    }

    pub fn server_error() -> Failure {
        Failure {
            status: 500,
            code: 0,
            message: "500: Internal Server Error".into(),
            retry_after: None,
        }
    }

    pub fn status(status: u16, code: i64, message: &str) -> Failure {
        Failure {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// A message the bot posted: the request body it sent and the message Discord made of it.
#[derive(Debug, Clone)]
pub struct Posted {
    pub channel: u64,
    pub body: Value,
    pub message: Value,
    /// The files uploaded with it.
    pub files: Vec<FakeFile>,
}

/// A file attached to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeFile {
    pub name: String,
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
    /// The `size` announced, when it is not the real one.
    pub declared: Option<u64>,
}

impl FakeFile {
    pub fn new(name: &str, content_type: &str, bytes: &[u8]) -> FakeFile {
        FakeFile {
            name: name.to_owned(),
            content_type: Some(content_type.to_owned()),
            bytes: bytes.to_vec(),
            declared: None,
        }
    }
}

enum Out {
    Frame(Value),
    Close(u16, &'static str),
}

struct Connection {
    id: u64,
    sender: mpsc::UnboundedSender<Out>,
    session: Option<String>,
}

struct Session {
    seq: u64,
    intents: u64,
    events: Vec<Value>,
    connection: Option<u64>,
}

struct ChannelRecord {
    guild: Option<u64>,
    messages: Vec<Value>,
}

struct Bucket {
    started: Instant,
    used: u32,
}

struct Platform {
    addr: SocketAddr,
    heartbeat_interval: u64,
    last_id: u64,
    channels: BTreeMap<u64, ChannelRecord>,
    users: HashMap<u64, Author>,
    posted: Vec<Posted>,
    nonces: HashMap<(u64, String), (Value, Instant)>,
    nonce_window: Duration,
    failures: VecDeque<(Route, Failure)>,
    requests: Vec<String>,
    typing: Vec<u64>,
    connections: Vec<Connection>,
    next_connection: u64,
    sessions: HashMap<String, Session>,
    next_session: u64,
    frames: Vec<Value>,
    identifies: usize,
    resumes: usize,
    heartbeats: usize,
    frozen: bool,
    privileged_intents: bool,
    buckets: HashMap<u64, Bucket>,
    bucket_limit: u32,
    bucket_window: Duration,
    /// Attachment id → bytes.
    cdn: HashMap<u64, Vec<u8>>,
    /// Every CDN download: the path, and whether it carried an `Authorization` header.
    downloads: Vec<(String, bool)>,
}

type Shared = Arc<Mutex<Platform>>;

/// The fake; see the module docs.
pub struct FakeDiscord {
    addr: SocketAddr,
    state: Shared,
    server: ServerThread,
}

impl FakeDiscord {
    pub fn start() -> FakeDiscord {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut users = HashMap::new();
        users.insert(BOT_ID, Author::bot(BOT_ID, "perch-bot"));
        let state = Arc::new(Mutex::new(Platform {
            addr,
            heartbeat_interval: 1_000,
            last_id: 0,
            channels: BTreeMap::new(),
            users,
            posted: Vec::new(),
            nonces: HashMap::new(),
            nonce_window: Duration::from_secs(300),
            failures: VecDeque::new(),
            requests: Vec::new(),
            typing: Vec::new(),
            connections: Vec::new(),
            next_connection: 0,
            sessions: HashMap::new(),
            next_session: 0,
            frames: Vec::new(),
            identifies: 0,
            resumes: 0,
            heartbeats: 0,
            frozen: false,
            privileged_intents: true,
            buckets: HashMap::new(),
            bucket_limit: 5,
            bucket_window: Duration::from_secs(5),
            cdn: HashMap::new(),
            downloads: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        let server = ServerThread::spawn(listener, 2, move |listener| async move {
            let app = Router::new()
                .route("/gw", any(gateway))
                .fallback(rest)
                .with_state(shared);
            let _ = axum::serve(listener, app).await;
        });
        FakeDiscord {
            addr,
            state,
            server,
        }
    }

    fn state(&self) -> MutexGuard<'_, Platform> {
        self.state.lock().unwrap()
    }

    /// The base URL to give the connector (`http://127.0.0.1:P`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Registers a guild text channel (channels a message is pushed to are guild channels
    /// unless registered as DMs first).
    pub fn guild_channel(&self, id: u64) {
        self.state().channels.entry(id).or_insert(ChannelRecord {
            guild: Some(GUILD),
            messages: Vec::new(),
        });
    }

    /// Registers a DM channel.
    pub fn dm_channel(&self, id: u64) {
        self.state().channels.insert(
            id,
            ChannelRecord {
                guild: None,
                messages: Vec::new(),
            },
        );
    }

    /// A user sends `content` to `channel`; returns the message id. `<@id>` in the content
    /// mentions that user.
    pub fn push_message(&self, channel: u64, author: &Author, content: &str) -> u64 {
        self.push(channel, author, content, None)
    }

    /// A user replies to message `reply_to` in `channel`.
    pub fn push_reply(&self, channel: u64, author: &Author, content: &str, reply_to: u64) -> u64 {
        self.push(channel, author, content, Some(reply_to))
    }

    /// The author of message `id` in `channel` edits it to `content` (MESSAGE_UPDATE).
    pub fn push_edit(&self, channel: u64, id: u64, content: &str) {
        self.state().edit(channel, id, content);
    }

    /// A user sends `content` with `files` to `channel`; returns the message id.
    pub fn push_files(
        &self,
        channel: u64,
        author: &Author,
        content: &str,
        files: &[FakeFile],
    ) -> u64 {
        self.guild_channel(channel);
        let mut state = self.state();
        state.users.insert(author.id, author.clone());
        let message = state.create(channel, author, content, None, None, files);
        message["id"].as_str().unwrap().parse().unwrap()
    }

    /// Every CDN download: the path, and whether it carried an `Authorization` header.
    pub fn downloads(&self) -> Vec<(String, bool)> {
        self.state().downloads.clone()
    }

    fn push(&self, channel: u64, author: &Author, content: &str, reply_to: Option<u64>) -> u64 {
        self.guild_channel(channel);
        let mut state = self.state();
        state.users.insert(author.id, author.clone());
        let reference = reply_to.map(|id| {
            state
                .find(channel, id)
                .expect("the message replied to exists")
        });
        let message = state.create(channel, author, content, reference, None, &[]);
        message["id"].as_str().unwrap().parse().unwrap()
    }

    /// Messages the bot posted, in order.
    pub fn posted(&self) -> Vec<Posted> {
        self.state().posted.clone()
    }

    /// Every message in `channel`, oldest first, as REST returns them.
    pub fn messages(&self, channel: u64) -> Vec<Value> {
        self.state()
            .channels
            .get(&channel)
            .map(|record| record.messages.clone())
            .unwrap_or_default()
    }

    /// `METHOD /path` of every REST request, in order.
    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }

    /// Channels a typing indicator was sent to, in order.
    pub fn typing(&self) -> Vec<u64> {
        self.state().typing.clone()
    }

    /// Every frame a client sent on the gateway, in order.
    pub fn frames(&self) -> Vec<Value> {
        self.state().frames.clone()
    }

    /// The first frame a client sent with opcode `op`.
    pub fn first_frame(&self, op: u64) -> Option<Value> {
        self.frames().into_iter().find(|frame| frame["op"] == op)
    }

    pub fn identifies(&self) -> usize {
        self.state().identifies
    }

    pub fn resumes(&self) -> usize {
        self.state().resumes
    }

    pub fn heartbeats(&self) -> usize {
        self.state().heartbeats
    }

    /// Open gateway connections that have identified or resumed.
    pub fn live_sessions(&self) -> usize {
        let state = self.state();
        state
            .connections
            .iter()
            .filter(|connection| connection.session.is_some())
            .count()
    }

    /// Sends op 7 (Reconnect) on every open gateway connection.
    pub fn force_reconnect(&self) {
        let state = self.state();
        for connection in &state.connections {
            let _ = connection
                .sender
                .send(Out::Frame(json!({"op": 7, "d": null})));
        }
    }

    /// Sends op 9 (Invalid Session, not resumable) on every identified connection and forgets
    /// the sessions, so clients must identify afresh.
    pub fn invalidate_sessions(&self) {
        let mut state = self.state();
        state.sessions.clear();
        for connection in &mut state.connections {
            if connection.session.take().is_some() {
                let _ = connection
                    .sender
                    .send(Out::Frame(json!({"op": 9, "d": false})));
            }
        }
    }

    /// Answers the next request on `route` with `failure`.
    pub fn fail_next(&self, route: Route, failure: Failure) {
        self.state().failures.push_back((route, failure));
    }

    /// From now on the gateway answers nothing: no HELLO, no heartbeat ACK, no dispatch.
    pub fn freeze_gateway(&self) {
        self.state().frozen = true;
    }

    /// Undoes [`FakeDiscord::freeze_gateway`] for new frames and connections.
    pub fn thaw_gateway(&self) {
        self.state().frozen = false;
    }

    /// The bot has not been granted the privileged Message Content intent: IDENTIFY asking for
    /// it is closed with 4014.
    pub fn deny_privileged_intents(&self) {
        self.state().privileged_intents = false;
    }

    /// The heartbeat interval HELLO announces, in milliseconds (default 1,000).
    pub fn set_heartbeat_interval(&self, millis: u64) {
        self.state().heartbeat_interval = millis;
    }

    /// The per-channel message bucket (default 5 per 5 s).
    pub fn set_bucket(&self, limit: u32, window: Duration) {
        let mut state = self.state();
        state.bucket_limit = limit;
        state.bucket_window = window;
    }
}

impl Platform {
    fn next_id(&mut self) -> u64 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let millis = now.as_millis() as u64 - DISCORD_EPOCH_MS;
        let id = (millis << 22) | (1 << 17);
        self.last_id = id.max(self.last_id + 1);
        self.last_id
    }

    fn find(&self, channel: u64, id: u64) -> Option<Value> {
        let wanted = id.to_string();
        self.channels
            .get(&channel)?
            .messages
            .iter()
            .find(|message| message["id"] == wanted.as_str())
            .cloned()
    }

    fn user(&self, id: u64) -> Option<Value> {
        self.users.get(&id).map(Author::json)
    }

    fn mentions(&self, content: &str) -> Vec<Value> {
        let mut found = Vec::new();
        for piece in content.split("<@").skip(1) {
            let Some((id, _)) = piece.split_once('>') else {
                continue;
            };
            let id = id.trim_start_matches('!');
            if let Some(user) = id.parse().ok().and_then(|id| self.user(id))
                && !found.contains(&user)
            {
                found.push(user);
            }
        }
        found
    }

    fn create(
        &mut self,
        channel: u64,
        author: &Author,
        content: &str,
        reference: Option<Value>,
        nonce: Option<Value>,
        files: &[FakeFile],
    ) -> Value {
        let id = self.next_id();
        let mut attachments = Vec::new();
        for file in files {
            let file_id = self.next_id();
            let url = format!(
                "http://{}/attachments/{channel}/{file_id}/{}",
                self.addr,
                percent_encode(&file.name)
            );
            self.cdn.insert(file_id, file.bytes.clone());
            attachments.push(json!({
                "id": file_id.to_string(), "filename": file.name,
                "size": file.declared.unwrap_or(file.bytes.len() as u64),
                "url": url, "proxy_url": url, "content_type": file.content_type,
            }));
        }
        let millis = (id >> 22) + DISCORD_EPOCH_MS;
        let timestamp = chrono::DateTime::from_timestamp_millis(millis as i64)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, false);
        let mut message = json!({
            "id": id.to_string(),
            "channel_id": channel.to_string(),
            "author": author.json(),
            "content": content,
            "timestamp": timestamp,
            "edited_timestamp": null,
            "tts": false,
            "mention_everyone": false,
            "mentions": self.mentions(content),
            "mention_roles": [],
            "attachments": attachments,
            "embeds": [],
            "pinned": false,
            "type": if reference.is_some() { 19 } else { 0 },
            "flags": 0,
        });
        if let Some(original) = reference {
            message["message_reference"] = json!({
                "type": 0,
                "channel_id": channel.to_string(),
                "message_id": original["id"],
                "guild_id": self.channels[&channel].guild.map(|guild| guild.to_string()),
            });
            message["referenced_message"] = original;
        }
        if let Some(nonce) = nonce {
            message["nonce"] = nonce;
        }
        let record = self.channels.get_mut(&channel).unwrap();
        record.messages.push(message.clone());
        let guild = record.guild;
        self.dispatch_message("MESSAGE_CREATE", &message, guild, author.id);
        message
    }

    /// Changes the content of message `id` in `channel`, stamps `edited_timestamp` and sends
    /// MESSAGE_UPDATE with the whole message, as Discord does for an edit.
    fn edit(&mut self, channel: u64, id: u64, content: &str) {
        let record = self.channels.get_mut(&channel).unwrap();
        let message = record
            .messages
            .iter_mut()
            .find(|message| message["id"] == id.to_string().as_str())
            .expect("the message edited exists");
        message["content"] = json!(content);
        message["edited_timestamp"] =
            json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, false));
        let message = message.clone();
        let guild = record.guild;
        let author: u64 = message["author"]["id"].as_str().unwrap().parse().unwrap();
        self.dispatch_message("MESSAGE_UPDATE", &message, guild, author);
    }

    fn dispatch_message(&mut self, kind: &str, message: &Value, guild: Option<u64>, author: u64) {
        let mut event = message.clone();
        if let Some(guild) = guild {
            event["guild_id"] = json!(guild.to_string());
            event["member"] = json!({"roles": [], "joined_at": message["timestamp"], "deaf": false, "mute": false, "flags": 0});
        }
        let mentions_bot = message["mentions"].as_array().is_some_and(|users| {
            users
                .iter()
                .any(|user| user["id"] == BOT_ID.to_string().as_str())
        });
        let names: Vec<String> = self.sessions.keys().cloned().collect();
        for name in names {
            let intents = self.sessions[&name].intents;
            let wanted = if guild.is_some() {
                GUILD_MESSAGES
            } else {
                DIRECT_MESSAGES
            };
            if intents & wanted == 0 {
                continue;
            }
            let mut event = event.clone();
            if guild.is_some()
                && intents & MESSAGE_CONTENT == 0
                && !mentions_bot
                && author != BOT_ID
            {
                event["content"] = json!("");
            }
            self.dispatch(&name, kind, event);
        }
    }

    fn dispatch(&mut self, session: &str, kind: &str, data: Value) {
        let Some(record) = self.sessions.get_mut(session) else {
            return;
        };
        record.seq += 1;
        let payload = json!({"op": 0, "t": kind, "s": record.seq, "d": data});
        record.events.push(payload.clone());
        if self.frozen {
            return;
        }
        if let Some(connection) = record.connection
            && let Some(live) = self.connections.iter().find(|c| c.id == connection)
        {
            let _ = live.sender.send(Out::Frame(payload));
        }
    }

    fn take_failure(&mut self, route: Route) -> Option<Failure> {
        let index = self.failures.iter().position(|(r, _)| *r == route)?;
        self.failures.remove(index).map(|(_, failure)| failure)
    }

    fn ready(&self, session: &str) -> Value {
        json!({
            "v": 10,
            "user": {"id": BOT_ID.to_string(), "username": "perch-bot", "discriminator": "0",
                     "global_name": null, "avatar": null, "bot": true, "verified": true,
                     "mfa_enabled": false, "flags": 0},
            "guilds": [{"id": GUILD.to_string(), "unavailable": true}],
            "session_id": session,
            "resume_gateway_url": format!("ws://{}/gw", self.addr),
            "shard": [0, 1],
            "application": {"id": BOT_ID.to_string(), "flags": 0},
        })
    }

    fn channel_json(&self, id: u64) -> Option<Value> {
        let record = self.channels.get(&id)?;
        Some(match record.guild {
            Some(guild) => json!({
                "id": id.to_string(), "type": 0, "guild_id": guild.to_string(),
                "name": format!("room-{id}"), "position": 0, "permission_overwrites": [],
                "nsfw": false, "parent_id": null, "topic": null, "last_message_id": null,
                "rate_limit_per_user": 0, "flags": 0,
            }),
            None => json!({
                "id": id.to_string(), "type": 1, "last_message_id": null, "flags": 0,
                "recipients": [{"id": "1", "username": "someone", "discriminator": "0",
                                "global_name": null, "avatar": null}],
            }),
        })
    }
}
