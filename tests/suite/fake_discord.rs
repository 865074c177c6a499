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

use super::support::parse_multipart;
use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

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
    runtime: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeDiscord {
    pub fn start() -> FakeDiscord {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
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
        let (stop, stopped) = oneshot::channel::<()>();
        let shared = Arc::clone(&state);
        let (handle_sender, handle) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            handle_sender.send(runtime.handle().clone()).unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = Router::new()
                    .route("/gw", any(gateway))
                    .fallback(rest)
                    .with_state(shared);
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
            runtime.shutdown_timeout(Duration::from_millis(100));
        });
        FakeDiscord {
            addr,
            state,
            runtime: handle.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
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

/// What a client sees when its HTTPS proxy is the fake: `CONNECT discord.com:443` tunnels end in
/// TLS with a certificate for `discord.com` signed by a test CA, and the requests inside go on to
/// the fake. serenity's production path (no `proxy()`, ratelimiter on) can then be tested.
pub struct TlsInterceptor {
    /// `http://127.0.0.1:P`, for `reqwest::Proxy::https`.
    pub proxy_url: String,
    /// The test CA, PEM.
    pub root_pem: String,
    tunnels: Arc<Mutex<Vec<String>>>,
}

impl TlsInterceptor {
    /// The request line of every CONNECT, in order.
    pub fn tunnels(&self) -> Vec<String> {
        self.tunnels.lock().unwrap().clone()
    }
}

impl FakeDiscord {
    /// Starts a [`TlsInterceptor`] in front of this fake.
    pub fn intercept_tls(&self) -> TlsInterceptor {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        use tokio_rustls::rustls;

        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["discord.com".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let proxy_url = format!("http://{}", listener.local_addr().unwrap());
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&tunnels);
        let upstream = self.addr;
        self.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let _ = tunnel(client, acceptor, upstream, seen).await;
                });
            }
        });
        TlsInterceptor {
            proxy_url,
            root_pem: ca.pem(),
            tunnels,
        }
    }
}

async fn tunnel(
    mut client: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    upstream: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let request_line = head.lines().next().unwrap_or_default().to_owned();
    seen.lock().unwrap().push(request_line.clone());
    if !request_line.starts_with("CONNECT discord.com:443 ") {
        client
            .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            .await?;
        return Ok(());
    }
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    let mut tls = acceptor.accept(client).await?;
    let mut plain = tokio::net::TcpStream::connect(upstream).await?;
    tokio::io::copy_bidirectional(&mut tls, &mut plain).await?;
    Ok(())
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_') {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

fn error(status: u16, code: i64, message: &str) -> Response {
    error_with(status, json!({"code": code, "message": message}))
}

fn error_with(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn failure_response(failure: &Failure, bucket: Option<(u32, f64)>) -> Response {
    let Some(retry_after) = failure.retry_after else {
        return error(failure.status, failure.code, &failure.message);
    };
    let body = json!({
        "message": failure.message, "retry_after": retry_after, "global": false,
        "code": failure.code,
    });
    let mut response = error_with(failure.status, body);
    let (limit, _) = bucket.unwrap_or((5, retry_after));
    let headers = response.headers_mut();
    insert(headers, "retry-after", retry_after.ceil().to_string());
    rate_headers(headers, limit, 0, retry_after);
    insert(headers, "x-ratelimit-scope", "user".into());
    response
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: String) {
    headers.insert(name, HeaderValue::from_str(&value).unwrap());
}

fn rate_headers(headers: &mut HeaderMap, limit: u32, remaining: u32, reset_after: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    insert(headers, "x-ratelimit-limit", limit.to_string());
    insert(headers, "x-ratelimit-remaining", remaining.to_string());
    insert(
        headers,
        "x-ratelimit-reset",
        format!("{:.3}", now.as_secs_f64() + reset_after),
    );
    insert(
        headers,
        "x-ratelimit-reset-after",
        format!("{reset_after:.3}"),
    );
    insert(
        headers,
        "x-ratelimit-bucket",
        "fake-channel-messages".into(),
    );
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn rest(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query: HashMap<String, String> = uri
        .query()
        .map(|query| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let mut state = state.lock().unwrap();
    state.requests.push(format!("{method} {path}"));
    if let Some(rest) = path.strip_prefix("/attachments/") {
        let authorized = headers.contains_key("authorization");
        state.downloads.push((path.clone(), authorized));
        let id = rest.split('/').nth(1).and_then(|id| id.parse::<u64>().ok());
        return match id.and_then(|id| state.cdn.get(&id)) {
            Some(bytes) if method == Method::GET => (
                StatusCode::OK,
                [("content-type", "application/octet-stream")],
                bytes.clone(),
            )
                .into_response(),
            _ => (StatusCode::NOT_FOUND, "Not Found").into_response(),
        };
    }
    let Some(rest) = path.strip_prefix("/api/v10/") else {
        return error(404, 0, "404: Not Found");
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let route = match (&method, segments.as_slice()) {
        (&Method::GET, ["gateway"]) => Route::Gateway,
        (&Method::GET, ["users", "@me"]) => Route::CurrentUser,
        (&Method::GET, ["channels", _]) => Route::GetChannel,
        (&Method::GET, ["channels", _, "messages"]) => Route::GetMessages,
        (&Method::POST, ["channels", _, "messages"]) => Route::CreateMessage,
        (&Method::POST, ["channels", _, "typing"]) => Route::Typing,
        (_, ["gateway"] | ["users", "@me"] | ["channels", _, "messages" | "typing"]) => {
            return error(405, 0, "405: Method Not Allowed");
        }
        _ => return error(404, 0, "404: Not Found"),
    };
    let authorized = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        == Some(format!("Bot {TOKEN}").as_str());
    if route != Route::Gateway && !authorized {
        return error(401, 0, "401: Unauthorized");
    }
    let channel = segments
        .get(1)
        .and_then(|id| id.parse::<u64>().ok())
        .unwrap_or(0);
    let bucket = if route == Route::CreateMessage {
        let limit = state.bucket_limit;
        let window = state.bucket_window;
        let bucket = state.buckets.entry(channel).or_insert(Bucket {
            started: Instant::now(),
            used: 0,
        });
        if bucket.started.elapsed() >= window {
            *bucket = Bucket {
                started: Instant::now(),
                used: 0,
            };
        }
        let reset_after = (window.saturating_sub(bucket.started.elapsed())).as_secs_f64();
        if bucket.used >= limit {
            let failure = Failure::rate_limited((reset_after * 1000.0).ceil() / 1000.0);
            return failure_response(&failure, Some((limit, reset_after)));
        }
        bucket.used += 1;
        Some((limit, limit - bucket.used, reset_after))
    } else {
        None
    };
    if let Some(failure) = state.take_failure(route) {
        return failure_response(&failure, bucket.map(|(limit, _, reset)| (limit, reset)));
    }
    let mut response = match route {
        Route::Gateway => json_response(
            StatusCode::OK,
            &json!({"url": format!("ws://{}/gw", state.addr)}),
        ),
        Route::CurrentUser => json_response(
            StatusCode::OK,
            &json!({"id": BOT_ID.to_string(), "username": "perch-bot", "discriminator": "0",
                    "global_name": null, "avatar": null, "bot": true, "verified": true,
                    "mfa_enabled": false, "flags": 0}),
        ),
        Route::GetChannel => match state.channel_json(channel) {
            Some(found) => json_response(StatusCode::OK, &found),
            None => error(404, 10003, "Unknown Channel"),
        },
        Route::GetMessages => get_messages(&state, channel, &query),
        Route::Typing => {
            if !state.channels.contains_key(&channel) {
                return error(404, 10003, "Unknown Channel");
            }
            state.typing.push(channel);
            StatusCode::NO_CONTENT.into_response()
        }
        Route::CreateMessage => {
            let content_type = headers
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            create_message(&mut state, channel, &content_type, &body)
        }
    };
    if let Some((limit, remaining, reset_after)) = bucket {
        rate_headers(response.headers_mut(), limit, remaining, reset_after);
    }
    response
}

fn get_messages(state: &Platform, channel: u64, query: &HashMap<String, String>) -> Response {
    let Some(record) = state.channels.get(&channel) else {
        return error(404, 10003, "Unknown Channel");
    };
    let limit = match query.get("limit").map(|limit| limit.parse::<usize>()) {
        None => 50,
        Some(Ok(limit)) if (1..=100).contains(&limit) => limit,
        Some(_) => {
            return error_with(
                400,
                json!({"code": 50035, "message": "Invalid Form Body",
                       "errors": {"limit": {"_errors": [{"code": "NUMBER_TYPE_MAX", "message": "int value should be less than or equal to 100."}]}}}),
            );
        }
    };
    let id = |message: &Value| -> u64 { message["id"].as_str().unwrap().parse().unwrap() };
    let mut page: Vec<Value> =
        if let Some(after) = query.get("after").and_then(|v| v.parse::<u64>().ok()) {
            record
                .messages
                .iter()
                .filter(|message| id(message) > after)
                .take(limit)
                .cloned()
                .collect()
        } else {
            let before = query
                .get("before")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(u64::MAX);
            let older: Vec<&Value> = record
                .messages
                .iter()
                .filter(|message| id(message) < before)
                .collect();
            older[older.len().saturating_sub(limit)..]
                .iter()
                .map(|message| (*message).clone())
                .collect()
        };
    page.reverse();
    json_response(StatusCode::OK, &Value::Array(page))
}

fn create_message(
    state: &mut Platform,
    channel: u64,
    content_type: &str,
    body: &Bytes,
) -> Response {
    let mut files = Vec::new();
    let json = if content_type.starts_with("multipart/form-data") {
        let Some(parts) = parse_multipart(content_type, body) else {
            return error(400, 50035, "Invalid Form Body");
        };
        let mut json = None;
        for part in parts {
            if part.name == "payload_json" {
                json = Some(part.body);
            } else if part.name.starts_with("files[") {
                files.push(FakeFile {
                    name: part.filename.unwrap_or_default(),
                    content_type: part.content_type,
                    bytes: part.body,
                    declared: None,
                });
            }
        }
        json.unwrap_or_default()
    } else {
        body.to_vec()
    };
    let Ok(body) = serde_json::from_slice::<Value>(&json) else {
        return error(400, 50109, "The request body contains invalid JSON.");
    };
    if !state.channels.contains_key(&channel) {
        return error(404, 10003, "Unknown Channel");
    }
    let content = body["content"].as_str().unwrap_or_default().to_owned();
    let mut errors = Map::new();
    let too_long = |limit: usize| json!({"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": format!("Must be {limit} or fewer in length.")}]});
    if content.chars().count() > 2000 {
        errors.insert("content".into(), too_long(2000));
    }
    let nonce = match &body["nonce"] {
        Value::Null => None,
        Value::String(text) if text.chars().count() > 25 => {
            errors.insert("nonce".into(), too_long(25));
            None
        }
        other => Some(other.clone()),
    };
    let mut reference = None;
    if let Some(wanted) = body.get("message_reference").filter(|r| !r.is_null()) {
        let found = wanted["message_id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .and_then(|id| state.find(channel, id));
        match found {
            Some(original) => reference = Some(original),
            None if wanted["fail_if_not_exists"] == json!(false) => {}
            None => {
                errors.insert(
                    "message_reference".into(),
                    json!({"_errors": [{"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}]}),
                );
            }
        }
    }
    if !errors.is_empty() {
        return error_with(
            400,
            json!({"code": 50035, "message": "Invalid Form Body", "errors": errors}),
        );
    }
    if content.is_empty() && files.is_empty() && body["embeds"].as_array().is_none_or(Vec::is_empty)
    {
        return error(400, 50006, "Cannot send an empty message");
    }
    let enforce = body["enforce_nonce"] == json!(true);
    let key = nonce.as_ref().map(|nonce| (BOT_ID, nonce.to_string()));
    if enforce
        && let Some((first, at)) = key.as_ref().and_then(|key| state.nonces.get(key))
        && at.elapsed() < state.nonce_window
    {
        return json_response(StatusCode::OK, first);
    }
    let bot = state.users[&BOT_ID].clone();
    let message = state.create(channel, &bot, &content, reference, nonce, &files);
    if let Some(key) = key {
        state.nonces.insert(key, (message.clone(), Instant::now()));
    }
    state.posted.push(Posted {
        channel,
        body,
        message: message.clone(),
        files,
    });
    json_response(StatusCode::OK, &message)
}

async fn gateway(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let version = query.get("v").cloned();
    upgrade.on_upgrade(move |socket| connection(socket, state, version))
}

async fn connection(mut socket: WebSocket, state: Shared, version: Option<String>) {
    if version.as_deref() != Some("10") {
        let _ = socket.send(close(4012, "Invalid API version")).await;
        return;
    }
    let (sender, mut outgoing) = mpsc::unbounded_channel();
    let (id, hello) = {
        let mut state = state.lock().unwrap();
        state.next_connection += 1;
        let id = state.next_connection;
        state.connections.push(Connection {
            id,
            sender,
            session: None,
        });
        let hello = (!state.frozen)
            .then(|| json!({"op": 10, "d": {"heartbeat_interval": state.heartbeat_interval}}));
        (id, hello)
    };
    if let Some(hello) = hello {
        let _ = socket.send(WsMessage::Text(hello.to_string().into())).await;
    }
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(WsMessage::Text(text))) => {
                    let answers = match serde_json::from_str::<Value>(text.as_str()) {
                        Ok(frame) => handle_frame(&state, id, frame),
                        Err(_) => vec![Out::Close(4002, "Error while decoding payload.")],
                    };
                    let mut closed = false;
                    for answer in answers {
                        match answer {
                            Out::Frame(frame) => {
                                let _ = socket.send(WsMessage::Text(frame.to_string().into())).await;
                            }
                            Out::Close(code, reason) => {
                                let _ = socket.send(close(code, reason)).await;
                                closed = true;
                            }
                        }
                    }
                    if closed {
                        break;
                    }
                }
                Some(Ok(WsMessage::Binary(_))) => {
                    let _ = socket.send(close(4002, "Error while decoding payload.")).await;
                    break;
                }
                Some(Ok(WsMessage::Close(_))) => {
                    let _ = socket.send(close(1000, "")).await;
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
            out = outgoing.recv() => match out {
                Some(Out::Frame(frame)) => {
                    if socket.send(WsMessage::Text(frame.to_string().into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code, reason)) => {
                    let _ = socket.send(close(code, reason)).await;
                    break;
                }
                None => break,
            },
        }
    }
    let mut state = state.lock().unwrap();
    state.connections.retain(|connection| connection.id != id);
    for session in state.sessions.values_mut() {
        if session.connection == Some(id) {
            session.connection = None;
        }
    }
}

fn close(code: u16, reason: &'static str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn handle_frame(state: &Shared, connection: u64, frame: Value) -> Vec<Out> {
    let mut state = state.lock().unwrap();
    state.frames.push(frame.clone());
    if state.frozen {
        return Vec::new();
    }
    let session = state
        .connections
        .iter()
        .find(|c| c.id == connection)
        .and_then(|c| c.session.clone());
    let token_ok = |data: &Value| data["token"] == json!(format!("Bot {TOKEN}"));
    match frame["op"].as_u64() {
        Some(1) => {
            state.heartbeats += 1;
            vec![Out::Frame(json!({"op": 11, "d": null}))]
        }
        Some(2) => {
            let data = &frame["d"];
            if session.is_some() {
                return vec![Out::Close(4005, "Already authenticated.")];
            }
            if !token_ok(data) {
                return vec![Out::Close(4004, "Authentication failed.")];
            }
            let Some(intents) = data["intents"].as_u64() else {
                return vec![Out::Close(4013, "Invalid intent(s).")];
            };
            if intents & MESSAGE_CONTENT != 0 && !state.privileged_intents {
                return vec![Out::Close(4014, "Disallowed intent(s).")];
            }
            state.identifies += 1;
            state.next_session += 1;
            let name = format!("fake-session-{}", state.next_session);
            state.sessions.insert(
                name.clone(),
                Session {
                    seq: 0,
                    intents,
                    events: Vec::new(),
                    connection: Some(connection),
                },
            );
            if let Some(live) = state.connections.iter_mut().find(|c| c.id == connection) {
                live.session = Some(name.clone());
            }
            let ready = state.ready(&name);
            let record = state.sessions.get_mut(&name).unwrap();
            record.seq += 1;
            let payload = json!({"op": 0, "t": "READY", "s": record.seq, "d": ready});
            record.events.push(payload.clone());
            vec![Out::Frame(payload)]
        }
        Some(6) => {
            let data = &frame["d"];
            if !token_ok(data) {
                return vec![Out::Close(4004, "Authentication failed.")];
            }
            let name = data["session_id"].as_str().unwrap_or_default().to_owned();
            let seq = data["seq"].as_u64().unwrap_or(0);
            let Some(record) = state.sessions.get_mut(&name) else {
                return vec![Out::Frame(json!({"op": 9, "d": false}))];
            };
            let mut answers: Vec<Out> = record
                .events
                .iter()
                .filter(|event| event["s"].as_u64().unwrap_or(0) > seq)
                .cloned()
                .map(Out::Frame)
                .collect();
            record.seq += 1;
            let resumed = json!({"op": 0, "t": "RESUMED", "s": record.seq, "d": {}});
            record.events.push(resumed.clone());
            record.connection = Some(connection);
            answers.push(Out::Frame(resumed));
            state.resumes += 1;
            if let Some(live) = state.connections.iter_mut().find(|c| c.id == connection) {
                live.session = Some(name);
            }
            answers
        }
        Some(3 | 4 | 8) if session.is_none() => vec![Out::Close(4003, "Not authenticated.")],
        Some(3 | 4 | 8) => Vec::new(),
        _ => vec![Out::Close(4001, "Unknown opcode.")],
    }
}
