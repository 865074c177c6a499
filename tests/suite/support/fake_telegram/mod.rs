//! A fake Telegram Bot API: real HTTP/1.1 on loopback, enforcing the rules the real server
//! enforces, with the exact error descriptions teloxide maps onto its error variants.
//!
//! Requests go to `POST /bot<token>/<method>` with a JSON body (everything teloxide sends);
//! method names match case-insensitively (teloxide sends `GetUpdates`); answers use the
//! `{"ok": true, "result": ...}` / `{"ok": false, "error_code": N, "description": ...}`
//! envelope. The rules:
//! - a path without `/bot<token>/` is 404 `Not Found`, a wrong token 401 `Unauthorized`, an
//!   unknown method 404 `Not Found: method not found`;
//! - `getUpdates`: a positive `offset` confirms (forgets) every update below it, a negative one
//!   keeps only the last `-offset`; `limit` caps the batch; with nothing pending the call waits
//!   up to `timeout` seconds; `allowed_updates` is remembered, and updates of other kinds are
//!   dropped; a newer concurrent `getUpdates` makes the older one answer 409 `Conflict:
//!   terminated by other getUpdates request; ...`;
//! - `sendMessage`: unknown chat, empty text, text over 4,096 characters after entity parsing,
//!   MarkdownV2 that does not parse (reserved characters outside entities, unclosed entities),
//!   unknown reply target (unless `allow_sending_without_reply`) and unknown forum thread are
//!   refused with Telegram's descriptions;
//! - `getFile` answers a file's `file_path` (400 `invalid file_id` for an unknown one, `file is
//!   too big` over 20 MB), and `GET /file/bot<token>/<file_path>` serves its bytes;
//! - `sendDocument` takes `multipart/form-data` (fields as text, `reply_parameters` as JSON, the
//!   file as a part with a file name, named `document` or by `document=attach://<part>`), with
//!   the caption checked like `sendMessage`'s text (1,024 characters);
//! - `fail_next` forces one answer, such as 429 `Too Many Requests: retry after N` with
//!   `parameters.retry_after`; `rate_limit` answers every call of a method (to one chat or to
//!   all) that way until `lift_rate_limits`.
//!
//! The server runs on its own thread and runtime, so it works from `#[test]` and
//! `#[tokio::test]` alike; it stops when the `FakeTelegram` is dropped.
#![allow(
    dead_code,
    reason = "a harness shared by several suites, each using part of it"
)]

pub mod markdown;
mod server;

use super::http::{Request, ServerThread, parse_multipart, read_request};
use markdown::entities;
use serde_json::{Value, json};
use server::{accept, chat_id};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The token the fake accepts.
pub const TOKEN: &str = "7357001:AAFakeToken_0123456789-abcdefghijkl";
pub const BOT_ID: i64 = 7_357_001;
pub const BOT_USERNAME: &str = "perch_test_bot";
pub const BOT_NAME: &str = "Perch";
/// The longest text `sendMessage` accepts, in characters after entity parsing.
pub const MAX_TEXT: usize = 4096;
pub const CONFLICT: &str = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running";

/// A Telegram account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: i64,
    pub first_name: String,
    pub username: Option<String>,
    pub is_bot: bool,
}

impl User {
    pub fn human(id: i64, first_name: &str) -> User {
        User {
            id,
            first_name: first_name.to_owned(),
            username: None,
            is_bot: false,
        }
    }

    pub fn bot(id: i64, first_name: &str, username: &str) -> User {
        User {
            id,
            first_name: first_name.to_owned(),
            username: Some(username.to_owned()),
            is_bot: true,
        }
    }

    /// The fake's own bot.
    pub fn me() -> User {
        User::bot(BOT_ID, BOT_NAME, BOT_USERNAME)
    }

    pub fn with_username(mut self, username: &str) -> User {
        self.username = Some(username.to_owned());
        self
    }

    fn json(&self) -> Value {
        let mut user = json!({"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name});
        if let Some(username) = &self.username {
            user["username"] = json!(username);
        }
        user
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChatKind {
    Private,
    Group,
    Forum,
}

/// A chat: a private chat with one user, a group, or a supergroup with forum topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chat {
    pub id: i64,
    kind: ChatKind,
    title: String,
}

impl Chat {
    /// The private chat between `user` and the bot (its id is the user's).
    pub fn private(user: &User) -> Chat {
        Chat {
            id: user.id,
            kind: ChatKind::Private,
            title: user.first_name.clone(),
        }
    }

    pub fn group(id: i64, title: &str) -> Chat {
        Chat {
            id,
            kind: ChatKind::Group,
            title: title.to_owned(),
        }
    }

    /// A supergroup with topics (`is_forum`).
    pub fn forum(id: i64, title: &str) -> Chat {
        Chat {
            id,
            kind: ChatKind::Forum,
            title: title.to_owned(),
        }
    }

    fn json(&self) -> Value {
        match self.kind {
            ChatKind::Private => {
                json!({"id": self.id, "type": "private", "first_name": self.title})
            }
            ChatKind::Group => json!({"id": self.id, "type": "group", "title": self.title}),
            ChatKind::Forum => {
                json!({"id": self.id, "type": "supergroup", "title": self.title, "is_forum": true})
            }
        }
    }
}

/// The longest caption, in characters after entity parsing.
pub const MAX_CAPTION: usize = 1024;
/// The largest file `getFile` hands to a bot.
pub const MAX_DOWNLOAD: u64 = 20 * 1024 * 1024;

/// The kind of file a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Media {
    /// A photo, in two sizes (a thumbnail and the file's bytes as the largest).
    Photo,
    Document {
        name: Option<String>,
        mime: Option<String>,
    },
    Voice,
}

/// A file attached to an incoming message.
#[derive(Debug, Clone)]
struct IncomingFile {
    media: Media,
    bytes: Vec<u8>,
    /// The `file_size` announced, when it is not the real one.
    declared: Option<u64>,
}

/// A message someone sends to the bot. Mention and command entities are computed from the
/// text the way Telegram does; text mentions (of users without a username) are added by hand.
#[derive(Debug, Clone)]
pub struct Incoming {
    chat: Chat,
    from: User,
    text: Option<String>,
    caption: bool,
    file: Option<IncomingFile>,
    reply_to: Option<i64>,
    thread: Option<i64>,
    text_mentions: Vec<(String, User)>,
}

impl Incoming {
    pub fn new(chat: &Chat, from: &User, text: &str) -> Incoming {
        Incoming {
            chat: chat.clone(),
            from: from.clone(),
            text: Some(text.to_owned()),
            caption: false,
            file: None,
            reply_to: None,
            thread: None,
            text_mentions: Vec::new(),
        }
    }

    /// A photo, captioned with the text (or without caption for `None`).
    pub fn photo(chat: &Chat, from: &User, caption: Option<&str>) -> Incoming {
        Incoming::media(chat, from, Media::Photo, b"\xff\xd8fake jpeg", caption)
    }

    /// A file of `media` kind with `bytes`, captioned with the text (or without caption for
    /// `None`).
    pub fn media(
        chat: &Chat,
        from: &User,
        media: Media,
        bytes: &[u8],
        caption: Option<&str>,
    ) -> Incoming {
        Incoming {
            text: caption.map(str::to_owned),
            caption: true,
            file: Some(IncomingFile {
                media,
                bytes: bytes.to_vec(),
                declared: None,
            }),
            ..Incoming::new(chat, from, "")
        }
    }

    /// A document named `name` of type `mime`.
    pub fn document(
        chat: &Chat,
        from: &User,
        name: &str,
        mime: &str,
        bytes: &[u8],
        caption: Option<&str>,
    ) -> Incoming {
        let media = Media::Document {
            name: Some(name.to_owned()),
            mime: Some(mime.to_owned()),
        };
        Incoming::media(chat, from, media, bytes, caption)
    }

    /// Announces `size` as the file's `file_size` instead of its real size.
    pub fn declared_size(mut self, size: u64) -> Incoming {
        if let Some(file) = &mut self.file {
            file.declared = Some(size);
        }
        self
    }

    /// A reply to the message with this id in the same chat.
    pub fn reply_to(mut self, message_id: i64) -> Incoming {
        self.reply_to = Some(message_id);
        self
    }

    /// Sent in the forum topic with this thread id.
    pub fn in_thread(mut self, thread: i64) -> Incoming {
        self.thread = Some(thread);
        self
    }

    /// Marks the first occurrence of `span` as a mention of `user`.
    pub fn text_mention(mut self, span: &str, user: &User) -> Incoming {
        self.text_mentions.push((span.to_owned(), user.clone()));
        self
    }
}

/// What `push` queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    pub update_id: i64,
    pub chat_id: i64,
    pub message_id: i64,
}

impl Pushed {
    /// perch's id for the message: `<chat id>:<message id>`.
    pub fn platform_id(&self) -> String {
        format!("{}:{}", self.chat_id, self.message_id)
    }
}

/// A message the bot sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub chat_id: i64,
    pub message_id: i64,
    /// The text exactly as sent.
    pub text: String,
    pub parse_mode: Option<String>,
    /// The text as users see it, after entity parsing.
    pub shown: String,
    pub reply_to: Option<i64>,
    pub thread: Option<i64>,
    /// Every parameter of the call (for `sendDocument`, the form's text fields).
    pub params: Value,
    /// `sendDocument`: the file's name and bytes.
    pub document: Option<(String, Vec<u8>)>,
}

/// A forced answer for the next call of one method.
#[derive(Debug, Clone)]
pub enum Failure {
    /// 429 `Too Many Requests: retry after N` with `parameters.retry_after = N`.
    RetryAfter(u32),
    /// Any error status with this description.
    Api { code: u16, description: String },
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method name as sent (teloxide sends PascalCase).
    pub method: String,
    pub body: Value,
}

#[derive(Debug, Default)]
struct ChatState {
    json: Value,
    next_message_id: i64,
    messages: HashMap<i64, Value>,
    threads: HashSet<i64>,
}

#[derive(Debug)]
struct Pending {
    update_id: i64,
    kind: &'static str,
    message: Value,
}

#[derive(Debug)]
struct State {
    next_update_id: i64,
    pending: VecDeque<Pending>,
    allowed: Option<Vec<String>>,
    generation: u64,
    chats: HashMap<i64, ChatState>,
    sent: Vec<Sent>,
    actions: Vec<(i64, String, Option<i64>)>,
    failures: VecDeque<(String, Failure)>,
    /// `(method, chat, retry_after)`: every call of the method to the chat (any chat when
    /// `None`) answers 429 until the limits are lifted.
    rate_limits: Vec<(String, Option<i64>, u32)>,
    calls: Vec<Call>,
    next_file: u64,
    /// File id → (file path, bytes, the size `getFile` announces).
    files: HashMap<String, (String, Vec<u8>, u64)>,
    /// The paths of every file download, in order.
    downloads: Vec<String>,
    /// Every download answers 404.
    downloads_broken: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

/// The fake server. Dropping it stops the server and closes every connection.
#[derive(Debug)]
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _server: ServerThread,
}

impl FakeTelegram {
    /// Starts a server on a free loopback port.
    pub fn start() -> FakeTelegram {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_update_id: 830_000_001,
                pending: VecDeque::new(),
                allowed: None,
                generation: 0,
                chats: HashMap::new(),
                sent: Vec::new(),
                actions: Vec::new(),
                failures: VecDeque::new(),
                rate_limits: Vec::new(),
                calls: Vec::new(),
                next_file: 0,
                files: HashMap::new(),
                downloads: Vec::new(),
                downloads_broken: false,
            }),
            changed: Notify::new(),
        });
        let server = shared.clone();
        FakeTelegram {
            addr,
            shared,
            _server: ServerThread::spawn(listener, 0, move |listener| accept(listener, server)),
        }
    }

    /// The API URL to hand the connector (`http://127.0.0.1:PORT`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of one method, for raw requests.
    pub fn method_url(&self, token: &str, method: &str) -> String {
        format!("http://{}/bot{token}/{method}", self.addr)
    }

    /// Queues a text message from `from` in `chat`.
    pub fn push_message(&self, chat: &Chat, from: &User, text: &str) -> Pushed {
        self.push(Incoming::new(chat, from, text))
    }

    /// Queues a message as a `message` update.
    pub fn push(&self, incoming: Incoming) -> Pushed {
        let mut state = self.shared.state.lock().unwrap();
        let media = incoming
            .file
            .as_ref()
            .map(|file| state.media_json(file))
            .unwrap_or_default();
        let chat = state.chat(&incoming.chat);
        let message_id = chat.next_message_id;
        chat.next_message_id += 1;
        let mut message = json!({
            "message_id": message_id,
            "from": incoming.from.json(),
            "chat": chat.json,
            "date": now(),
        });
        match (&incoming.text, incoming.caption) {
            (Some(text), false) => {
                message["text"] = json!(text);
                let entities = entities(text, &incoming.text_mentions);
                if !entities.is_empty() {
                    message["entities"] = Value::Array(entities);
                }
            }
            (caption, _) => {
                if let Value::Object(fields) = media {
                    message.as_object_mut().unwrap().extend(fields);
                }
                if let Some(caption) = caption {
                    message["caption"] = json!(caption);
                    let entities = entities(caption, &incoming.text_mentions);
                    if !entities.is_empty() {
                        message["caption_entities"] = Value::Array(entities);
                    }
                }
            }
        }
        if let Some(thread) = incoming.thread {
            message["message_thread_id"] = json!(thread);
            message["is_topic_message"] = json!(true);
            chat.threads.insert(thread);
        }
        if let Some(original) = incoming.reply_to {
            let original = chat
                .messages
                .get(&original)
                .cloned()
                .expect("the message replied to exists in the fake");
            message["reply_to_message"] = original;
        }
        chat.messages.insert(message_id, message.clone());
        let update_id = state.queue("message", message);
        drop(state);
        self.shared.changed.notify_waiters();
        Pushed {
            update_id,
            chat_id: incoming.chat.id,
            message_id,
        }
    }

    /// The path of every file downloaded, in order.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().downloads.clone()
    }

    /// From now on every file download answers 404.
    pub fn break_downloads(&self) {
        self.shared.state.lock().unwrap().downloads_broken = true;
    }

    /// The URL of a file's bytes, for raw requests (`path` as `getFile` gives it).
    pub fn file_url(&self, token: &str, path: &str) -> String {
        format!("http://{}/file/bot{token}/{path}", self.addr)
    }

    /// Queues an `edited_message` update changing a pushed message's text.
    pub fn push_edit(&self, pushed: Pushed, text: &str) -> i64 {
        let mut state = self.shared.state.lock().unwrap();
        let chat = state.chats.get_mut(&pushed.chat_id).unwrap();
        let message = chat.messages.get_mut(&pushed.message_id).unwrap();
        message["text"] = json!(text);
        message["edit_date"] = json!(now());
        let message = message.clone();
        let update_id = state.queue("edited_message", message);
        drop(state);
        self.shared.changed.notify_waiters();
        update_id
    }

    /// Queues a `message` update whose message is exactly `message` (for malformed payloads).
    pub fn push_raw_message(&self, message: Value) -> i64 {
        let update_id = self.shared.state.lock().unwrap().queue("message", message);
        self.shared.changed.notify_waiters();
        update_id
    }

    /// Messages the bot sent, oldest first.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.state.lock().unwrap().sent.clone()
    }

    /// How many messages the bot sent: `sent().len()` without copying them, for polling.
    pub fn sent_count(&self) -> usize {
        self.shared.state.lock().unwrap().sent.len()
    }

    /// `sendChatAction` calls: `(chat id, action, thread)`.
    pub fn chat_actions(&self) -> Vec<(i64, String, Option<i64>)> {
        self.shared.state.lock().unwrap().actions.clone()
    }

    /// Answers the next call of `method` (any case) with `failure`.
    pub fn fail_next(&self, method: &str, failure: Failure) {
        self.shared
            .state
            .lock()
            .unwrap()
            .failures
            .push_back((method.to_ascii_lowercase(), failure));
    }

    /// Answers every call of `method` (any case) to `chat` (to any chat when `None`) with 429
    /// `Too Many Requests: retry after {retry_after}` until [`FakeTelegram::lift_rate_limits`].
    pub fn rate_limit(&self, method: &str, chat: Option<i64>, retry_after: u32) {
        self.shared.state.lock().unwrap().rate_limits.push((
            method.to_ascii_lowercase(),
            chat,
            retry_after,
        ));
    }

    /// Ends every [`FakeTelegram::rate_limit`].
    pub fn lift_rate_limits(&self) {
        self.shared.state.lock().unwrap().rate_limits.clear();
    }

    /// The `chat_id` of every call of `method` (any case) so far, answered or refused.
    pub fn calls_to(&self, method: &str) -> Vec<i64> {
        self.shared
            .state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|call| call.method.eq_ignore_ascii_case(method))
            .filter_map(|call| chat_id(&call.body))
            .collect()
    }

    /// Every request with a valid token, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.state.lock().unwrap().calls.clone()
    }

    /// The calls of `method`, spelled exactly so, with a valid token.
    pub fn calls_of(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|call| call.method == method)
            .collect()
    }

    /// Whether `method` (any case) was called with a valid token.
    pub fn was_called(&self, method: &str) -> bool {
        self.calls()
            .iter()
            .any(|call| call.method.eq_ignore_ascii_case(method))
    }

    /// Whether the bot has replied to the message `pushed`.
    pub fn answered(&self, pushed: Pushed) -> bool {
        self.sent()
            .iter()
            .any(|sent| sent.reply_to == Some(pushed.message_id))
    }

    /// Whether the bot sent a message users see as `shown`.
    pub fn has_shown(&self, shown: &str) -> bool {
        self.sent().iter().any(|sent| sent.shown == shown)
    }

    /// The `offset` of every `getUpdates` call so far (`None` when it had none).
    pub fn poll_offsets(&self) -> Vec<Option<i64>> {
        self.calls()
            .into_iter()
            .filter(|call| call.method.eq_ignore_ascii_case("getUpdates"))
            .map(|call| call.body.get("offset").and_then(Value::as_i64))
            .collect()
    }

    /// Waits until a `getUpdates` call named `offset`; panics after five seconds.
    pub async fn wait_for_poll(&self, offset: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.poll_offsets().contains(&Some(offset)) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no getUpdates with offset {offset}; offsets: {:?}",
                self.poll_offsets()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `count` `getUpdates` calls arrived; panics after five seconds.
    pub async fn wait_for_poll_count(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.poll_offsets().len() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fewer than {count} getUpdates calls"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The ids of updates not yet confirmed.
    pub fn pending_update_ids(&self) -> Vec<i64> {
        self.shared
            .state
            .lock()
            .unwrap()
            .pending
            .iter()
            .map(|pending| pending.update_id)
            .collect()
    }
}

impl State {
    fn chat(&mut self, chat: &Chat) -> &mut ChatState {
        self.chats.entry(chat.id).or_insert_with(|| ChatState {
            json: chat.json(),
            next_message_id: 1,
            ..ChatState::default()
        })
    }

    /// Registers a file with `bytes`; returns its `file_id`, `file_unique_id` and size fields.
    fn register_file(&mut self, bytes: &[u8], declared: Option<u64>) -> Value {
        self.next_file += 1;
        let id = format!("AgADfile{}", self.next_file);
        let path = format!("documents/file_{}.bin", self.next_file);
        let size = declared.unwrap_or(bytes.len() as u64);
        self.files.insert(id.clone(), (path, bytes.to_vec(), size));
        json!({"file_id": id, "file_unique_id": format!("u{}", self.next_file), "file_size": size})
    }

    /// The message fields of a file: `photo`, `document` or `voice`.
    fn media_json(&mut self, file: &IncomingFile) -> Value {
        let mut meta = self.register_file(&file.bytes, file.declared);
        match &file.media {
            Media::Photo => {
                let mut thumbnail = self.register_file(b"thumb", None);
                thumbnail["width"] = json!(90);
                thumbnail["height"] = json!(60);
                meta["width"] = json!(1280);
                meta["height"] = json!(853);
                json!({"photo": [thumbnail, meta]})
            }
            Media::Document { name, mime } => {
                if let Some(name) = name {
                    meta["file_name"] = json!(name);
                }
                if let Some(mime) = mime {
                    meta["mime_type"] = json!(mime);
                }
                json!({"document": meta})
            }
            Media::Voice => {
                meta["duration"] = json!(3);
                meta["mime_type"] = json!("audio/ogg");
                json!({"voice": meta})
            }
        }
    }

    fn queue(&mut self, kind: &'static str, message: Value) -> i64 {
        let update_id = self.next_update_id;
        self.next_update_id += 1;
        self.pending.push_back(Pending {
            update_id,
            kind,
            message,
        });
        update_id
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
