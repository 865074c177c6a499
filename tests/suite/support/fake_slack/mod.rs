//! A fake of Slack's Socket Mode and of the Web API methods perch calls, on loopback, answering
//! with Slack's documented examples (`tests/fixtures/slack/`) as its templates.
//!
//! Web API (`POST /api/<method>`, arguments as a query, a form or a JSON body; every answer is
//! `{"ok": …}`, HTTP 200 unless rate limited): the token goes in `Authorization: Bearer`; none
//! is `not_authed`, an unknown one `invalid_auth`, the wrong kind (the bot token on
//! `apps.connections.open`, the app-level token elsewhere) `not_allowed_token_type`.
//! `apps.connections.open` hands out a single-use `ws://` URL with a `ticket`;
//! `auth.test` answers as `web-auth.test-bot.json`; `chat.postMessage` needs a known `channel`
//! (`channel_not_found`) and `text` (`no_text`) of at most 40,000 characters (`msg_too_long`),
//! posts into `thread_ts` when given, and echoes the post as a `message` event with the bot's
//! `bot_id`, as Slack does to an app subscribed to the channel; `users.info` knows the bot and
//! the users the test added or who wrote (`user_not_found` otherwise);
//! `files.getUploadURLExternal` (`filename`, `length`) gives an upload URL on the fake and
//! `files.completeUploadExternal` (`files` as JSON, `channel_id`, `thread_ts`,
//! `initial_comment`) shares what was uploaded there, refusing a file never uploaded or uploaded
//! at another length. Shared files download only with the bot token (without it, a redirect to
//! a sign-in page). [`FakeSlack::fail_next`] makes the next call of a method fail:
//! a `429` with `Retry-After`, an error, an HTTP status. Every answer to a known token of the
//! right kind lists the token's scopes in `x-oauth-scopes`, comma-separated, as Slack does: the
//! app-level token's `connections:write`; the bot token's, those of perch's app manifest
//! ([`MANIFEST_SCOPES`]) unless [`FakeSlack::remove_scopes`] took some away or
//! [`FakeSlack::list_no_scopes`] dropped the header.
//!
//! Socket Mode (`ws://…/link/?ticket=…`; an unknown or used ticket is refused with 401): `hello`,
//! then `events_api` envelopes, each held until the client acknowledges its `envelope_id`; one
//! not acknowledged within the ack timeout (3 s, as Slack's) is sent again with `retry_attempt`
//! one higher and `retry_reason` `timeout`, on the newest connection, up to three retries (then
//! Slack gives up on it, and so does the fake); envelopes waiting when a connection opens (none
//! was open, or theirs closed) are sent on it after `hello`. A redelivery keeps its envelope id.
//! The client's WebSocket pings are answered with pongs and counted ([`FakeSlack::pings`]).
//! A message mentioning the bot outside a DM comes twice, as `message` and as `app_mention`,
//! with different event ids. `disconnect` frames on request: `refresh_requested` and `warning`
//! (the connection closes after a grace period), `link_disabled` (it closes at once, and so does
//! every later connection, without `hello`).
//!
//! The server runs on its own thread and runtime, so it works from `#[test]` and
//! `#[tokio::test]` alike; it stops when the `FakeSlack` is dropped.
#![allow(
    dead_code,
    reason = "a harness shared by several suites, each using part of it"
)]

mod socket;
mod web;

use super::http::ServerThread;
use axum::Router;
use axum::routing::any;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// The bot token (`xoxb-…`) the fake accepts for the Web API.
pub const BOT_TOKEN: &str = "xoxb-17653672481-19874698323-perchFakeBotTokenDoNotLeak";
/// The app-level token (`xapp-…`) the fake accepts for `apps.connections.open`.
pub const APP_TOKEN: &str = "xapp-1-A123ABC456-1234567890123-perchfakeapptokendonotleak";
/// The workspace, the bot's user and bot ids, and the app: those of the fixtures.
pub const TEAM: &str = "T123ABC456";
pub const BOT_USER: &str = "U0LAN0Z89";
pub const BOT_ID: &str = "B123ABC456";
pub const APP_ID: &str = "A123ABC456";
/// Slack truncates a message's text past this many characters; the fake refuses it.
pub const MAX_TEXT: usize = 40_000;
/// How many times an envelope that is never acknowledged is sent again.
pub const MAX_RETRIES: u32 = 3;
/// The bot scopes of perch's app manifest (docs/channels.md), which the bot token holds unless
/// a test takes some away ([`FakeSlack::remove_scopes`]).
pub const MANIFEST_SCOPES: &[&str] = &[
    "app_mentions:read",
    "channels:history",
    "groups:history",
    "im:history",
    "mpim:history",
    "chat:write",
    "users:read",
    "files:read",
    "files:write",
];
/// The app-level token's one scope.
pub const APP_SCOPE: &str = "connections:write";

macro_rules! fixture_body {
    ($name:literal) => {{
        let file: serde_json::Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slack/",
            $name
        )))
        .unwrap();
        file["body"].clone()
    }};
}
use fixture_body;

/// Someone who writes in the workspace, or in another one over Slack Connect.
#[derive(Debug, Clone)]
pub struct SlackUser {
    pub id: String,
    /// The user name (`name`).
    pub name: String,
    /// The profile's display name.
    pub display_name: String,
    /// The user's workspace.
    pub team: String,
    pub is_bot: bool,
    /// The bot id (`B…`) an app's bot user writes with; `None` for a person.
    pub bot_id: Option<String>,
}

impl SlackUser {
    /// A person of the bot's workspace.
    pub fn person(id: &str, display_name: &str) -> SlackUser {
        SlackUser {
            id: id.into(),
            name: display_name.to_lowercase(),
            display_name: display_name.into(),
            team: TEAM.into(),
            is_bot: false,
            bot_id: None,
        }
    }

    /// Another app's bot user in the bot's workspace: its messages carry `bot_id` and
    /// `bot_profile`, as Slack sends them.
    pub fn bot(id: &str, bot_id: &str, name: &str) -> SlackUser {
        SlackUser {
            is_bot: true,
            bot_id: Some(bot_id.into()),
            ..SlackUser::person(id, name)
        }
    }

    /// A person of another organisation, in a shared channel.
    pub fn connect_guest(id: &str, display_name: &str, team: &str) -> SlackUser {
        SlackUser {
            team: team.into(),
            ..SlackUser::person(id, display_name)
        }
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id, "team_id": self.team, "name": self.name, "deleted": false,
            "real_name": self.display_name, "is_bot": self.is_bot,
            "profile": {
                "real_name": self.display_name, "display_name": self.display_name,
                "real_name_normalized": self.display_name,
                "display_name_normalized": self.display_name, "team": self.team,
            },
        })
    }
}

/// What kind of conversation a channel is (its `channel_type` in events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Im,
    Mpim,
    Channel,
    Group,
}

impl Kind {
    fn channel_type(self) -> &'static str {
        match self {
            Kind::Im => "im",
            Kind::Mpim => "mpim",
            Kind::Channel => "channel",
            Kind::Group => "group",
        }
    }
}

/// A failing answer for the next call of a method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `429` with `Retry-After: <seconds>` and `{"ok":false,"error":"ratelimited"}`.
    RateLimited { seconds: u64 },
    /// `200` with `{"ok":false,"error":…}`.
    Error(String),
    /// This HTTP status with an HTML body, as a proxy in the way answers.
    Status(u16),
}

/// A message the bot posted, with the arguments it was posted with.
#[derive(Debug, Clone)]
pub struct Posted {
    pub method: String,
    pub channel: String,
    pub ts: String,
    pub thread_ts: Option<String>,
    pub text: String,
    pub arguments: Value,
    /// The files shared with it (`files.completeUploadExternal`): name and bytes.
    pub files: Vec<(String, Vec<u8>)>,
}

/// A Web API call as the fake saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    /// The token's kind: `bot`, `app`, `unknown` or `none`.
    pub token: &'static str,
    pub arguments: Value,
}

enum Out {
    Frame(String),
    Close,
}

struct Connection {
    id: u64,
    sender: mpsc::UnboundedSender<Out>,
    said_hello: bool,
}

struct Envelope {
    envelope_id: String,
    payload: Value,
    retry_attempt: u32,
    /// The connection it was last sent on, and when.
    sent: Option<(u64, Instant)>,
}

struct UploadSlot {
    name: String,
    length: usize,
    bytes: Option<Vec<u8>>,
}

struct Platform {
    addr: SocketAddr,
    counter: u64,
    last_ts: u128,
    users: HashMap<String, SlackUser>,
    channels: HashMap<String, Kind>,
    tickets: HashSet<String>,
    opened: usize,
    connections: Vec<Connection>,
    next_connection: u64,
    pending: VecDeque<Envelope>,
    acked: Vec<String>,
    delivered: Vec<Value>,
    abandoned: Vec<String>,
    client_frames: Vec<Value>,
    pings: usize,
    ack_timeout: Duration,
    refresh_grace: Duration,
    socket_disabled: bool,
    open_error: Option<String>,
    failures: VecDeque<(String, Failure)>,
    calls: Vec<Call>,
    posted: Vec<Posted>,
    echo_own_posts: bool,
    uploads: HashMap<String, UploadSlot>,
    files: HashMap<String, (String, Vec<u8>)>,
    downloads: Vec<(String, bool)>,
    redirect_downloads: Option<String>,
    /// The bot token's scopes, sent as `x-oauth-scopes`; `None` sends no header.
    bot_scopes: Option<Vec<String>>,
}

type Shared = Arc<Mutex<Platform>>;

/// The fake; see the module docs.
pub struct FakeSlack {
    addr: SocketAddr,
    state: Shared,
    server: ServerThread,
}

impl FakeSlack {
    pub fn start() -> FakeSlack {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let bot = SlackUser {
            is_bot: true,
            ..SlackUser::person(BOT_USER, "perch")
        };
        let state = Arc::new(Mutex::new(Platform {
            addr,
            counter: 0,
            last_ts: 0,
            users: HashMap::from([(BOT_USER.to_owned(), bot)]),
            channels: HashMap::new(),
            tickets: HashSet::new(),
            opened: 0,
            connections: Vec::new(),
            next_connection: 0,
            pending: VecDeque::new(),
            acked: Vec::new(),
            delivered: Vec::new(),
            abandoned: Vec::new(),
            client_frames: Vec::new(),
            pings: 0,
            ack_timeout: Duration::from_secs(3),
            refresh_grace: Duration::from_secs(10),
            socket_disabled: false,
            open_error: None,
            failures: VecDeque::new(),
            calls: Vec::new(),
            posted: Vec::new(),
            echo_own_posts: true,
            uploads: HashMap::new(),
            files: HashMap::new(),
            downloads: Vec::new(),
            redirect_downloads: None,
            bot_scopes: Some(
                MANIFEST_SCOPES
                    .iter()
                    .map(|scope| (*scope).to_owned())
                    .collect(),
            ),
        }));
        let shared = Arc::clone(&state);
        let server = ServerThread::spawn(listener, 2, move |listener| async move {
            let app = Router::new()
                .route("/link/", any(socket::link))
                .fallback(web::web)
                .with_state(Arc::clone(&shared));
            tokio::join!(
                async {
                    let _ = axum::serve(listener, app).await;
                },
                socket::redeliver(shared),
            );
        });
        FakeSlack {
            addr,
            state,
            server,
        }
    }

    fn state(&self) -> MutexGuard<'_, Platform> {
        self.state.lock().unwrap()
    }

    /// The Web API's base, for the channel file's `api_url`: `http://127.0.0.1:P/api/`.
    pub fn api_url(&self) -> String {
        format!("http://{}/api/", self.addr)
    }

    /// How long an envelope waits for its acknowledgement before it is sent again.
    pub fn set_ack_timeout(&self, timeout: Duration) {
        self.state().ack_timeout = timeout;
    }

    /// How long a connection stays open after `refresh_requested` or `warning`.
    pub fn set_refresh_grace(&self, grace: Duration) {
        self.state().refresh_grace = grace;
    }

    /// Whether the bot's own posts come back as `message` events (they do by default).
    pub fn echo_own_posts(&self, echo: bool) {
        self.state().echo_own_posts = echo;
    }

    /// Adds a user, whom `users.info` then knows.
    pub fn user(&self, user: &SlackUser) {
        self.state().users.insert(user.id.clone(), user.clone());
    }

    /// Adds a channel of `kind`, which `chat.postMessage` then knows.
    pub fn channel(&self, id: &str, kind: Kind) {
        self.state().channels.insert(id.into(), kind);
    }

    /// `user` writes `text` in `channel` (added as a channel when unknown); returns the
    /// message's `ts`.
    pub fn push_message(&self, channel: &str, user: &SlackUser, text: &str) -> String {
        self.push(channel, user, text, None, None, Vec::new())
    }

    /// `user` replies in the thread of `thread_ts`.
    pub fn push_in_thread(
        &self,
        channel: &str,
        user: &SlackUser,
        text: &str,
        thread_ts: &str,
    ) -> String {
        self.push(channel, user, text, Some(thread_ts), None, Vec::new())
    }

    /// `user` writes a message of `subtype` (`thread_broadcast`, `me_message`, or one Slack
    /// has not documented).
    pub fn push_subtype(
        &self,
        channel: &str,
        user: &SlackUser,
        text: &str,
        subtype: &str,
    ) -> String {
        self.push(channel, user, text, None, Some(subtype), Vec::new())
    }

    /// `user` shares a file (`file_share`) with `text`; the file downloads from the fake with
    /// the bot token.
    pub fn push_file(
        &self,
        channel: &str,
        user: &SlackUser,
        text: &str,
        name: &str,
        mimetype: &str,
        bytes: &[u8],
    ) -> String {
        let file = {
            let mut state = self.state();
            let id = format!("F{:09}", state.next());
            state
                .files
                .insert(id.clone(), (name.to_owned(), bytes.to_vec()));
            state.file_json(&id, name, mimetype, bytes.len(), &user.id)
        };
        self.push(channel, user, text, None, Some("file_share"), vec![file])
    }

    /// The author of the message `ts` in `channel` changes its text to `text`
    /// (`message_changed`, shaped as `events-message-changed.json`).
    pub fn push_edit(&self, channel: &str, user: &SlackUser, ts: &str, text: &str) {
        let mut state = self.state();
        let edit_ts = state.ts();
        let kind = state.kind(channel);
        let event = json!({
            "type": "message", "subtype": "message_changed", "hidden": true,
            "channel": channel, "channel_type": kind.channel_type(), "ts": edit_ts,
            "event_ts": edit_ts,
            "message": {
                "type": "message", "user": user.id, "text": text, "ts": ts,
                "edited": {"user": user.id, "ts": edit_ts},
            },
        });
        state.enqueue(event);
    }

    /// Delivers `event` in an `event_callback` of its own; returns the envelope id.
    pub fn push_event(&self, event: Value) -> String {
        self.state().enqueue(event)
    }

    /// Sends `text` as a frame on every open connection, as it is.
    pub fn push_frame(&self, text: &str) {
        self.state().broadcast(text);
    }

    /// Sends `disconnect` with `refresh_requested` on every open connection, each of which
    /// closes after the refresh grace period.
    pub fn request_refresh(&self) {
        self.disconnect_after_grace("refresh_requested");
    }

    /// Sends `disconnect` with `warning` on every open connection, each of which closes after
    /// the refresh grace period.
    pub fn warn(&self) {
        self.disconnect_after_grace("warning");
    }

    fn disconnect_after_grace(&self, reason: &str) {
        let (frame, grace, senders) = {
            let state = self.state();
            let frame = disconnect_frame(reason);
            let senders: Vec<_> = state
                .connections
                .iter()
                .map(|connection| connection.sender.clone())
                .collect();
            (frame, state.refresh_grace, senders)
        };
        for sender in senders {
            let _ = sender.send(Out::Frame(frame.clone()));
            self.server.runtime.spawn(async move {
                tokio::time::sleep(grace).await;
                let _ = sender.send(Out::Close);
            });
        }
    }

    /// Turns Socket Mode off: `disconnect` with `link_disabled` on every open connection, which
    /// closes, and on every later one, without `hello`.
    pub fn disable_socket_mode(&self) {
        let mut state = self.state();
        state.socket_disabled = true;
        let frame = disconnect_frame("link_disabled");
        for connection in &state.connections {
            let _ = connection.sender.send(Out::Frame(frame.clone()));
            let _ = connection.sender.send(Out::Close);
        }
        state.connections.clear();
    }

    /// Closes every open connection with no `disconnect` first, as a lost network does.
    pub fn drop_connections(&self) {
        let mut state = self.state();
        for connection in &state.connections {
            let _ = connection.sender.send(Out::Close);
        }
        state.connections.clear();
    }

    /// `apps.connections.open` answers `error` from now on (`invalid_auth`,
    /// `account_inactive`); `None` lets it open connections again.
    pub fn refuse_connections(&self, error: Option<&str>) {
        self.state().open_error = error.map(str::to_owned);
    }

    /// Answers the next call of `method` with `failure`.
    pub fn fail_next(&self, method: &str, failure: Failure) {
        self.state()
            .failures
            .push_back((method.to_owned(), failure));
    }

    /// The bot token loses `scopes`: the answers to it list the others in `x-oauth-scopes`.
    pub fn remove_scopes(&self, scopes: &[&str]) {
        if let Some(held) = self.state().bot_scopes.as_mut() {
            held.retain(|scope| !scopes.contains(&scope.as_str()));
        }
    }

    /// The answers to the bot token list no scopes (no `x-oauth-scopes`), as a proxy that
    /// drops the header would leave them.
    pub fn list_no_scopes(&self) {
        self.state().bot_scopes = None;
    }

    /// Downloads of shared files answer with a redirect to `url` (another host).
    pub fn redirect_downloads_to(&self, url: &str) {
        self.state().redirect_downloads = Some(url.to_owned());
    }

    /// Open connections that have said `hello`.
    pub fn live_connections(&self) -> usize {
        self.state()
            .connections
            .iter()
            .filter(|connection| connection.said_hello)
            .count()
    }

    /// How many connections were opened, refused ones aside.
    pub fn connections_opened(&self) -> usize {
        self.state().opened
    }

    /// WebSocket pings the client sent, over every connection (each answered with a pong).
    pub fn pings(&self) -> usize {
        self.state().pings
    }

    /// Envelope ids acknowledged, in order.
    pub fn acked(&self) -> Vec<String> {
        self.state().acked.clone()
    }

    /// Envelopes not acknowledged yet.
    pub fn unacked(&self) -> usize {
        self.state().pending.len()
    }

    /// Every envelope sent, redeliveries included, in order.
    pub fn delivered(&self) -> Vec<Value> {
        self.state().delivered.clone()
    }

    /// Envelopes given up on after [`MAX_RETRIES`] retries.
    pub fn abandoned(&self) -> Vec<String> {
        self.state().abandoned.clone()
    }

    /// Every frame a client sent, in order.
    pub fn client_frames(&self) -> Vec<Value> {
        self.state().client_frames.clone()
    }

    /// Every Web API call, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Calls of `method`.
    pub fn calls_of(&self, method: &str) -> usize {
        self.state()
            .calls
            .iter()
            .filter(|call| call.method == method)
            .count()
    }

    /// What the bot posted, in order.
    pub fn posted(&self) -> Vec<Posted> {
        self.state().posted.clone()
    }

    /// Every download of a shared file: its path, and whether it carried the bot token.
    pub fn downloads(&self) -> Vec<(String, bool)> {
        self.state().downloads.clone()
    }
}

fn disconnect_frame(reason: &str) -> String {
    let mut frame = match reason {
        "refresh_requested" => fixture_body!("socket-disconnect-refresh-requested.json"),
        "link_disabled" => fixture_body!("socket-disconnect-link-disabled.json"),
        _ => fixture_body!("socket-disconnect-warning.json"),
    };
    frame["reason"] = json!(reason);
    frame.to_string()
}

impl Platform {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// A new message time, after every earlier one: `<seconds>.<microseconds>`.
    fn ts(&mut self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros();
        self.last_ts = now.max(self.last_ts + 1);
        format!(
            "{}.{:06}",
            self.last_ts / 1_000_000,
            self.last_ts % 1_000_000
        )
    }

    fn kind(&mut self, channel: &str) -> Kind {
        *self
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| match channel.chars().next() {
                Some('D') => Kind::Im,
                Some('G') => Kind::Group,
                _ => Kind::Channel,
            })
    }

    fn file_json(&self, id: &str, name: &str, mimetype: &str, size: usize, user: &str) -> Value {
        let base = format!("http://{}/files-pri/{TEAM}-{id}", self.addr);
        json!({
            "id": id, "name": name, "title": name, "mimetype": mimetype,
            "filetype": name.rsplit('.').next().unwrap_or(""), "user": user, "size": size,
            "mode": "hosted", "is_external": false, "is_public": false,
            "url_private": format!("{base}/{name}"),
            "url_private_download": format!("{base}/download/{name}"),
        })
    }

    /// Wraps `event` in an `event_callback` and an envelope, queues it and sends it on the
    /// newest open connection; returns the envelope id.
    fn enqueue(&mut self, event: Value) -> String {
        let n = self.next();
        let envelope_id = format!("{n:08x}-1543-4f94-bfb4-133d0e6c1545");
        let payload = json!({
            "token": "XXYYZZ", "team_id": TEAM, "api_app_id": APP_ID, "event": event,
            "type": "event_callback", "event_id": format!("Ev{n:08}"),
            "event_time": SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs(),
            "authorizations": [{"team_id": TEAM, "user_id": BOT_USER, "is_bot": true,
                                "is_enterprise_install": false}],
        });
        self.pending.push_back(Envelope {
            envelope_id: envelope_id.clone(),
            payload,
            retry_attempt: 0,
            sent: None,
        });
        self.flush();
        envelope_id
    }

    /// Sends every envelope that is not on an open connection on the newest one.
    fn flush(&mut self) {
        let Some((connection, sender)) = self
            .connections
            .iter()
            .rev()
            .find(|connection| connection.said_hello)
            .map(|connection| (connection.id, connection.sender.clone()))
        else {
            return;
        };
        let open: HashSet<u64> = self.connections.iter().map(|c| c.id).collect();
        let mut frames = Vec::new();
        for envelope in &mut self.pending {
            match envelope.sent {
                Some((on, _)) if open.contains(&on) => continue,
                Some(_) => envelope.retry_attempt += 1,
                None => {}
            }
            envelope.sent = Some((connection, Instant::now()));
            frames.push(envelope_frame(envelope));
        }
        for frame in frames {
            let _ = sender.send(Out::Frame(frame.to_string()));
            self.delivered.push(frame);
        }
    }

    fn broadcast(&self, text: &str) {
        for connection in &self.connections {
            let _ = connection.sender.send(Out::Frame(text.to_owned()));
        }
    }
}

fn envelope_frame(envelope: &Envelope) -> Value {
    let retry_reason = if envelope.retry_attempt == 0 {
        ""
    } else {
        "timeout"
    };
    json!({
        "envelope_id": envelope.envelope_id, "payload": envelope.payload,
        "type": "events_api", "accepts_response_payload": false,
        "retry_attempt": envelope.retry_attempt, "retry_reason": retry_reason,
    })
}

impl FakeSlack {
    fn push(
        &self,
        channel: &str,
        user: &SlackUser,
        text: &str,
        thread_ts: Option<&str>,
        subtype: Option<&str>,
        files: Vec<Value>,
    ) -> String {
        let mut state = self.state();
        state.users.insert(user.id.clone(), user.clone());
        let kind = state.kind(channel);
        let ts = state.ts();
        let mut event = json!({
            "type": "message", "channel": channel, "user": user.id, "text": text, "ts": ts,
            "event_ts": ts, "channel_type": kind.channel_type(), "team": user.team,
            "user_team": user.team, "source_team": user.team,
        });
        if let Some(thread_ts) = thread_ts {
            event["thread_ts"] = json!(thread_ts);
        }
        if let Some(subtype) = subtype {
            event["subtype"] = json!(subtype);
        }
        if !files.is_empty() {
            event["files"] = json!(files);
            event["upload"] = json!(false);
        }
        if let Some(bot_id) = &user.bot_id {
            event["bot_id"] = json!(bot_id);
            event["bot_profile"] = json!({
                "id": bot_id, "name": user.name, "deleted": false, "team_id": user.team,
            });
        }
        state.enqueue(event.clone());
        if kind != Kind::Im && text.contains(&format!("<@{BOT_USER}")) {
            let mut mention = json!({
                "type": "app_mention", "channel": channel, "user": user.id, "text": text,
                "ts": ts, "event_ts": ts, "team": user.team,
            });
            if let Some(thread_ts) = thread_ts {
                mention["thread_ts"] = json!(thread_ts);
            }
            if let Some(files) = event.get("files") {
                mention["files"] = files.clone();
            }
            if let Some(bot_id) = event.get("bot_id") {
                mention["bot_id"] = bot_id.clone();
            }
            state.enqueue(mention);
        }
        ts
    }
}
