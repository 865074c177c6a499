//! A fake model server: real HTTP/1.1 on loopback, answering each wire API with the event
//! sequences the real services send, from a queue of scripted replies.
//!
//! The sequences follow recorded streams: OpenAI Chat Completions chunks (role chunk, content
//! deltas, `tool_calls` fragments keyed by `index` whose first fragment carries `id`, `type`
//! and `function.name` with empty `arguments`, a finish chunk, a usage chunk with no choices when
//! `stream_options.include_usage` is set, `data: [DONE]`); OpenAI Responses events
//! (`response.created`, `response.in_progress`, per item `response.output_item.added` ...
//! `.done` with reasoning summary parts, message content parts and function call argument
//! deltas, `response.completed` with usage; `error` then `response.failed`); Anthropic
//! Messages events (`message_start` with usage, `content_block_start`/`_delta`/`_stop` with
//! `thinking_delta` plus `signature_delta`, `text_delta`, `input_json_delta` starting with an
//! empty fragment, a `ping` after the first block starts, `message_delta`, `message_stop`).
//! Error bodies have each API's shape. Streams are sent with chunked transfer encoding, each
//! event split across two chunks, so the client meets chunk boundaries inside events.
//!
//! The server runs on its own thread and runtime, so it works from `#[test]` and
//! `#[tokio::test]` alike; it stops when the `FakeModel` is dropped.
#![allow(
    dead_code,
    reason = "a harness shared by several suites, each using part of it"
)]

use super::support::read_request;
use perch_core::config::Api;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// What the fake answers to one request.
#[derive(Debug, Clone)]
pub enum Script {
    /// A streamed reply.
    Reply(Reply),
    /// An HTTP error status with the API's error body (or `body` verbatim).
    Status {
        status: u16,
        message: String,
        retry_after: Option<String>,
        body: Option<String>,
    },
    /// The stream starts, then the API reports an error inside it (`code` is the API's error
    /// type, such as `overloaded_error` or `server_error`).
    StreamError { code: String, message: String },
    /// A tool call starts and part of its arguments arrive, then the connection is closed
    /// without ending the response.
    CutMidToolCall,
    /// Like [`Script::CutMidToolCall`], but the HTTP response ends properly: only the API's
    /// closing events are missing.
    EndMidToolCall,
    /// The stream starts, then a data line that is not JSON.
    Garbage,
    /// The stream starts and one text delta arrives, then nothing more, ever.
    Stall,
    /// `script`, answered only once the test opens `gate`; until then the request waits with
    /// no response at all.
    Held { script: Box<Script>, gate: Gate },
}

/// Holds back a [`Script::Held`] reply until the test calls [`Gate::open`].
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(tokio::sync::watch::Sender::new(false)))
    }

    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }
}

impl Script {
    /// A plain text reply, streamed in several deltas.
    pub fn text(text: &str) -> Script {
        Script::Reply(Reply::text(text))
    }

    /// An error status with the API's usual body around `message`.
    pub fn status(status: u16, message: &str) -> Script {
        Script::Status {
            status,
            message: message.to_owned(),
            retry_after: None,
            body: None,
        }
    }

    /// An error status with exactly this body.
    pub fn status_body(status: u16, body: &str) -> Script {
        Script::Status {
            status,
            message: String::new(),
            retry_after: None,
            body: Some(body.to_owned()),
        }
    }

    /// Adds a `Retry-After` header (seconds or an HTTP date) to a [`Script::Status`].
    pub fn retry_after(self, value: &str) -> Script {
        match self {
            Script::Status {
                status,
                message,
                body,
                ..
            } => Script::Status {
                status,
                message,
                retry_after: Some(value.to_owned()),
                body,
            },
            other => other,
        }
    }

    /// `script`, held until `gate` is opened.
    pub fn held(script: impl Into<Script>, gate: &Gate) -> Script {
        Script::Held {
            script: Box::new(script.into()),
            gate: gate.clone(),
        }
    }

    pub fn stream_error(code: &str, message: &str) -> Script {
        Script::StreamError {
            code: code.to_owned(),
            message: message.to_owned(),
        }
    }
}

impl From<Reply> for Script {
    fn from(reply: Reply) -> Script {
        Script::Reply(reply)
    }
}

/// A reply: optional reasoning, optional text, tool calls, usage and how it stops.
#[derive(Debug, Clone)]
pub struct Reply {
    pub reasoning: Option<String>,
    pub text: Option<String>,
    /// `(call id, tool name, arguments)`; the arguments are streamed in small fragments.
    pub calls: Vec<(String, String, Value)>,
    /// `(input, output, cached)` tokens; `cached` is part of `input`.
    pub usage: (u64, u64, u64),
    /// The reply stops at the token limit instead of ending its turn.
    pub max_tokens: bool,
}

impl Reply {
    pub fn new() -> Reply {
        Reply {
            reasoning: None,
            text: None,
            calls: Vec::new(),
            usage: (20, 10, 0),
            max_tokens: false,
        }
    }

    pub fn text(text: &str) -> Reply {
        Reply::new().with_text(text)
    }

    pub fn with_text(mut self, text: &str) -> Reply {
        self.text = Some(text.to_owned());
        self
    }

    pub fn with_reasoning(mut self, reasoning: &str) -> Reply {
        self.reasoning = Some(reasoning.to_owned());
        self
    }

    pub fn with_call(mut self, call_id: &str, name: &str, arguments: Value) -> Reply {
        self.calls
            .push((call_id.to_owned(), name.to_owned(), arguments));
        self
    }

    pub fn with_usage(mut self, input: u64, output: u64, cached: u64) -> Reply {
        self.usage = (input, output, cached);
        self
    }

    pub fn cut_at_max_tokens(mut self) -> Reply {
        self.max_tokens = true;
        self
    }
}

impl Default for Reply {
    fn default() -> Reply {
        Reply::new()
    }
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }
}

#[derive(Debug, Default)]
struct State {
    scripts: VecDeque<Script>,
    received: Vec<Received>,
    responses: u64,
    /// The API key `GET /v1/models` accepts; any key (or none) when `None`.
    key: Option<String>,
    /// With the queue empty, answer each request with `echo: <its last user text>` after this
    /// long (OpenAI completions' shape), instead of `(no script)`.
    echo_after: Option<std::time::Duration>,
}

/// The fake server. Dropping it stops the server and closes every connection.
#[derive(Debug)]
pub struct FakeModel {
    api: Api,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeModel {
    /// Starts a server speaking `api` on a free loopback port.
    pub fn start(api: Api) -> FakeModel {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = stopped => {}
                    () = accept(listener, api, shared) => {}
                }
            });
        });
        FakeModel {
            api,
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// The base URL to put in `models.yml` (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues the answer to a later request; requests take scripts in order. With the queue
    /// empty, a request gets the text reply `(no script)`.
    pub fn push(&self, script: impl Into<Script>) {
        self.state.lock().unwrap().scripts.push_back(script.into());
    }

    /// With the queue empty, answers every request `echo: <its last user text>`, after `delay`:
    /// a model that takes its time, and whose replies say which message they answer.
    pub fn echo_after(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().echo_after = Some(delay);
    }

    /// Makes `GET /v1/models` (the key check of `perch doctor --online`) accept only `key`, sent
    /// as the API sends it (`Authorization: Bearer`, or `x-api-key` for Anthropic's); a wrong one
    /// is answered 401 with the API's error body quoting the key it was given, as OpenAI's does.
    pub fn require_key(&self, key: &str) {
        self.state.lock().unwrap().key = Some(key.to_owned());
    }

    /// How many scripts are still queued.
    pub fn pending(&self) -> usize {
        self.state.lock().unwrap().scripts.len()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// The latest request; panics if there was none.
    pub fn last_request(&self) -> Received {
        self.requests()
            .pop()
            .expect("the fake model received a request")
    }

    /// A `models.yml` with one provider pointing at this server and one model, no API key.
    pub fn models_yml(&self, provider: &str, model: &str) -> String {
        self.yml(provider, model, None)
    }

    /// Like [`FakeModel::models_yml`], with `apiKey: $VAR`.
    pub fn models_yml_with_key(&self, provider: &str, model: &str, var: &str) -> String {
        self.yml(provider, model, Some(var))
    }

    fn yml(&self, provider: &str, model: &str, var: Option<&str>) -> String {
        let key = var
            .map(|var| format!("    apiKey: ${var}\n"))
            .unwrap_or_default();
        format!(
            "providers:\n  {provider}:\n    baseUrl: {}\n    api: {}\n{key}    models:\n      - id: {model}\n        contextWindow: 128000\n        maxTokens: 4096\n        reasoning: true\n",
            self.base_url(),
            self.api.as_str()
        )
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(listener: TcpListener, api: Api, state: Arc<Mutex<State>>) {
    while let Ok((socket, _)) = listener.accept().await {
        socket.set_nodelay(true).ok();
        tokio::spawn(serve(socket, api, state.clone()));
    }
}

async fn serve(mut socket: TcpStream, api: Api, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut socket, &mut buffer).await {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut echo = None;
        let (script, n) = {
            let mut state = state.lock().unwrap();
            state.received.push(Received {
                method: request.method.clone(),
                path: request.path.clone(),
                headers: request.headers.clone(),
                body: body.clone(),
            });
            state.responses += 1;
            let script = if request.path == "/v1/models" && request.method == "GET" {
                list_models(api, &request, state.key.as_deref())
            } else if request.path == format!("/v1{}", path(api)) && request.method == "POST" {
                match (state.scripts.pop_front(), state.echo_after) {
                    (Some(script), _) => script,
                    (None, Some(delay)) => {
                        echo = Some(delay);
                        Script::text(&format!("echo: {}", last_user_text(&body)))
                    }
                    (None, None) => Script::text("(no script)"),
                }
            } else {
                Script::status(
                    404,
                    &format!("no route for {} {}", request.method, request.path),
                )
            };
            (script, state.responses)
        };
        let script = match script {
            Script::Held { script, gate } => {
                gate.opened().await;
                *script
            }
            script => script,
        };
        if let Some(delay) = echo {
            tokio::time::sleep(delay).await;
        }
        if !respond(&mut socket, api, n, &body, script).await {
            return;
        }
    }
}

/// The text of the last user message of an OpenAI completions request.
fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// `GET /v1/models`: a one-model list, or 401 for a key other than `required`.
fn list_models(api: Api, request: &super::support::Request, required: Option<&str>) -> Script {
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
    };
    let given = match api {
        Api::AnthropicMessages => header("x-api-key"),
        Api::OpenAiCompletions | Api::OpenAiResponses => {
            header("authorization").map(|value| value.trim_start_matches("Bearer ").to_owned())
        }
    };
    match required {
        Some(required) if given.as_deref() != Some(required) => Script::status(
            401,
            &format!("Incorrect API key provided: {}.", given.unwrap_or_default()),
        ),
        _ => Script::status_body(
            200,
            &json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                .to_string(),
        ),
    }
}

fn path(api: Api) -> &'static str {
    match api {
        Api::OpenAiCompletions => "/chat/completions",
        Api::OpenAiResponses => "/responses",
        Api::AnthropicMessages => "/messages",
    }
}

/// How a scripted stream ends.
enum End {
    /// The last chunk is sent; the connection stays open for the next request.
    Finish,
    /// The connection is closed mid-response.
    Cut,
    /// Nothing more is sent, ever.
    Stall,
}

/// Answers one request; returns whether the connection can take another.
async fn respond(
    socket: &mut TcpStream,
    api: Api,
    n: u64,
    request: &Value,
    script: Script,
) -> bool {
    let (events, end) = match script {
        Script::Status {
            status,
            message,
            retry_after,
            body,
        } => {
            let body = body.unwrap_or_else(|| error_body(api, status, &message).to_string());
            let retry = retry_after
                .map(|value| format!("retry-after: {value}\r\n"))
                .unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}\r\n",
                reason(status),
                body.len()
            );
            let sent = socket.write_all(head.as_bytes()).await.is_ok()
                && socket.write_all(body.as_bytes()).await.is_ok();
            return sent;
        }
        script => render(api, n, request, script),
    };
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\nconnection: keep-alive\r\n\r\n";
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for event in events {
        let middle = event.len() / 2;
        for piece in [&event[..middle], &event[middle..]] {
            if piece.is_empty() {
                continue;
            }
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(piece);
            chunk.extend_from_slice(b"\r\n");
            if socket.write_all(&chunk).await.is_err() {
                return false;
            }
        }
    }
    match end {
        End::Finish => socket.write_all(b"0\r\n\r\n").await.is_ok(),
        End::Cut => {
            let _ = socket.shutdown().await;
            false
        }
        End::Stall => std::future::pending().await,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Site Overloaded",
        _ => "Error",
    }
}

fn error_body(api: Api, status: u16, message: &str) -> Value {
    match api {
        Api::AnthropicMessages => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake01"})
        }
        Api::OpenAiCompletions | Api::OpenAiResponses => {
            let (kind, code) = match status {
                401 => ("invalid_request_error", json!("invalid_api_key")),
                404 => ("invalid_request_error", json!("model_not_found")),
                429 => ("requests", json!("rate_limit_exceeded")),
                500..=599 => ("server_error", Value::Null),
                _ => ("invalid_request_error", Value::Null),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    }
}

/// `text` in pieces the way models stream it: a word at a time, with its leading space.
fn pieces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        if ch == ' ' && !current.trim().is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
        current.push(ch);
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// JSON text in fragments of a few characters, cut anywhere (inside keys and strings too).
fn fragments(arguments: &str) -> Vec<String> {
    let chars: Vec<char> = arguments.chars().collect();
    chars
        .chunks(7)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

fn render(api: Api, n: u64, request: &Value, script: Script) -> (Vec<Vec<u8>>, End) {
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake-model")
        .to_owned();
    let mut stream = match api {
        Api::OpenAiCompletions => Stream::Completions(Completions {
            id: format!("chatcmpl-fake{n}"),
            model,
            usage: request
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            events: Vec::new(),
        }),
        Api::OpenAiResponses => Stream::Responses(Responses {
            id: format!("resp_fake{n}"),
            model,
            sequence: 0,
            events: Vec::new(),
        }),
        Api::AnthropicMessages => Stream::Anthropic(Anthropic {
            id: format!("msg_fake{n}"),
            model,
            events: Vec::new(),
        }),
    };
    let end = match script {
        Script::Reply(reply) => {
            stream.reply(&reply);
            End::Finish
        }
        Script::StreamError { code, message } => {
            stream.error(&code, &message);
            End::Finish
        }
        Script::CutMidToolCall => {
            stream.cut_mid_call();
            End::Cut
        }
        Script::EndMidToolCall => {
            stream.cut_mid_call();
            End::Finish
        }
        Script::Garbage => {
            stream.garbage();
            End::Finish
        }
        Script::Stall => {
            stream.stall();
            End::Stall
        }
        Script::Status { .. } => unreachable!("statuses are answered without a stream"),
        Script::Held { .. } => unreachable!("a held script is released before it is answered"),
    };
    (stream.into_events(), end)
}

enum Stream {
    Completions(Completions),
    Responses(Responses),
    Anthropic(Anthropic),
}

impl Stream {
    fn reply(&mut self, reply: &Reply) {
        match self {
            Stream::Completions(stream) => stream.reply(reply),
            Stream::Responses(stream) => stream.reply(reply),
            Stream::Anthropic(stream) => stream.reply(reply),
        }
    }

    fn error(&mut self, code: &str, message: &str) {
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Partial"}), None);
                stream.data(&json!({"error": {"message": message, "type": code, "param": null, "code": null}}).to_string());
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.event("error", json!({"error": {"type": code, "code": code, "message": message, "param": null}}));
                let mut response = stream.response("failed");
                response["error"] = json!({"code": code, "message": message});
                stream.event("response.failed", json!({"response": response}));
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.event(
                    "error",
                    json!({"type": "error", "error": {"type": code, "message": message}}),
                );
            }
        }
    }

    fn cut_mid_call(&mut self) {
        let arguments = json!({"cmd": "ls -la /workspace"}).to_string();
        let fragments = fragments(&arguments);
        let sent = &fragments[..2];
        match self {
            Stream::Completions(stream) => {
                stream.start(true);
                stream.delta(
                    json!({"tool_calls": [{"index": 0, "id": "call_cut", "type": "function",
                    "function": {"name": "bash", "arguments": ""}}]}),
                    None,
                );
                for fragment in sent {
                    stream.delta(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
                        None,
                    );
                }
            }
            Stream::Responses(stream) => {
                stream.start();
                let item = json!({"id": "fc_cut", "type": "function_call", "status": "in_progress",
                    "arguments": "", "call_id": "call_cut", "name": "bash"});
                stream.event(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": item}),
                );
                for fragment in sent {
                    stream.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": "fc_cut", "output_index": 0, "delta": fragment}),
                    );
                }
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.event("content_block_start", json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_cut", "name": "bash", "input": {}}}));
                for fragment in sent {
                    stream.event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                    );
                }
            }
        }
    }

    fn garbage(&mut self) {
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Hel"}), None);
                stream.data("{\"choices\": [{\"delta\": {\"content\": \"lo\"");
                stream.data("[DONE]");
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.raw(
                    "response.output_text.delta",
                    "{\"type\":\"response.output_text.delta\",\"delta\":",
                );
            }
            Stream::Anthropic(stream) => {
                stream.start(&Reply::new());
                stream.raw("content_block_delta", "<html>502 Bad Gateway</html>");
            }
        }
    }

    fn stall(&mut self) {
        let reply = Reply::text("Thinking about it");
        match self {
            Stream::Completions(stream) => {
                stream.start(false);
                stream.delta(json!({"content": "Thinking"}), None);
            }
            Stream::Responses(stream) => {
                stream.start();
                stream.message_start(0, "msg_stall");
                stream.event(
                    "response.output_text.delta",
                    json!({"item_id": "msg_stall", "output_index": 0,
                    "content_index": 0, "delta": "Thinking", "logprobs": []}),
                );
            }
            Stream::Anthropic(stream) => {
                stream.start(&reply);
                stream.event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                );
                stream.event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": "Thinking"}}),
                );
            }
        }
    }

    fn into_events(self) -> Vec<Vec<u8>> {
        match self {
            Stream::Completions(stream) => stream.events,
            Stream::Responses(stream) => stream.events,
            Stream::Anthropic(stream) => stream.events,
        }
    }
}

struct Completions {
    id: String,
    model: String,
    usage: bool,
    events: Vec<Vec<u8>>,
}

impl Completions {
    fn data(&mut self, data: &str) {
        self.events.push(format!("data: {data}\n\n").into_bytes());
    }

    fn chunk(&mut self, choices: Value, usage: Option<Value>) {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": 1_770_000_000,
            "model": self.model, "service_tier": "default", "system_fingerprint": "fp_fake",
            "choices": choices,
        });
        if self.usage {
            chunk["usage"] = usage.unwrap_or(Value::Null);
        }
        self.data(&chunk.to_string());
    }

    fn delta(&mut self, delta: Value, finish: Option<&str>) {
        self.chunk(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]),
            None,
        );
    }

    fn start(&mut self, calls_only: bool) {
        let content = if calls_only { Value::Null } else { json!("") };
        self.delta(
            json!({"role": "assistant", "content": content, "refusal": null}),
            None,
        );
    }

    fn reply(&mut self, reply: &Reply) {
        self.start(reply.text.is_none() && !reply.calls.is_empty());
        for piece in pieces(reply.reasoning.as_deref().unwrap_or("")) {
            self.delta(json!({"reasoning_content": piece}), None);
        }
        for piece in pieces(reply.text.as_deref().unwrap_or("")) {
            self.delta(json!({"content": piece}), None);
        }
        for (index, (call_id, name, arguments)) in reply.calls.iter().enumerate() {
            self.delta(
                json!({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
                None,
            );
            for fragment in fragments(&arguments.to_string()) {
                self.delta(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                    None,
                );
            }
        }
        let finish = if reply.max_tokens {
            "length"
        } else if reply.calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        self.delta(json!({}), Some(finish));
        if self.usage {
            let (input, output, cached) = reply.usage;
            self.chunk(json!([]), Some(json!({
                "prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                    "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            })));
        }
        self.data("[DONE]");
    }
}

struct Responses {
    id: String,
    model: String,
    sequence: u64,
    events: Vec<Vec<u8>>,
}

impl Responses {
    fn raw(&mut self, name: &str, data: &str) {
        self.events
            .push(format!("event: {name}\ndata: {data}\n\n").into_bytes());
    }

    fn event(&mut self, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.raw(name, &data.to_string());
    }

    fn response(&self, status: &str) -> Value {
        json!({
            "id": self.id, "object": "response", "created_at": 1_770_000_000, "status": status,
            "background": false, "error": null, "incomplete_details": null, "instructions": null,
            "max_output_tokens": null, "model": self.model, "output": [], "parallel_tool_calls": true,
            "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": false, "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": null, "user": null, "metadata": {},
        })
    }

    fn start(&mut self) {
        let response = self.response("in_progress");
        self.event("response.created", json!({"response": response}));
        self.event("response.in_progress", json!({"response": response}));
    }

    fn message_start(&mut self, index: usize, id: &str) {
        self.event("response.output_item.added", json!({"output_index": index,
            "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}));
        self.event("response.content_part.added", json!({"item_id": id, "output_index": index,
            "content_index": 0, "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}));
    }

    fn reply(&mut self, reply: &Reply) {
        self.start();
        let mut output = Vec::new();
        if let Some(reasoning) = &reply.reasoning {
            let index = output.len();
            let id = "rs_fake0";
            self.event(
                "response.output_item.added",
                json!({"output_index": index,
                "item": {"id": id, "type": "reasoning", "summary": []}}),
            );
            self.event(
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
            );
            for piece in pieces(reasoning) {
                self.event(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": id, "output_index": index,
                    "summary_index": 0, "delta": piece}),
                );
            }
            self.event(
                "response.reasoning_summary_text.done",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "text": reasoning}),
            );
            let part = json!({"type": "summary_text", "text": reasoning});
            self.event(
                "response.reasoning_summary_part.done",
                json!({"item_id": id, "output_index": index,
                "summary_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "reasoning", "summary": [part]});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        if let Some(text) = &reply.text {
            let index = output.len();
            let id = "msg_fake0";
            self.message_start(index, id);
            for piece in pieces(text) {
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index,
                    "content_index": 0, "delta": piece, "logprobs": []}),
                );
            }
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index,
                "content_index": 0, "text": text, "logprobs": []}),
            );
            let part =
                json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index,
                "content_index": 0, "part": part}),
            );
            let item = json!({"id": id, "type": "message", "status": "completed", "content": [part], "role": "assistant"});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        for (number, (call_id, name, arguments)) in reply.calls.iter().enumerate() {
            let index = output.len();
            let id = format!("fc_fake{number}");
            let arguments = arguments.to_string();
            self.event("response.output_item.added", json!({"output_index": index,
                "item": {"id": id, "type": "function_call", "status": "in_progress", "arguments": "",
                         "call_id": call_id, "name": name}}));
            for fragment in fragments(&arguments) {
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id,
                    "output_index": index, "delta": fragment}),
                );
            }
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id,
                "output_index": index, "arguments": arguments}),
            );
            let item = json!({"id": id, "type": "function_call", "status": "completed",
                "arguments": arguments, "call_id": call_id, "name": name});
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            output.push(item);
        }
        let (input, output_tokens, cached) = reply.usage;
        let (name, status) = if reply.max_tokens {
            ("response.incomplete", "incomplete")
        } else {
            ("response.completed", "completed")
        };
        let mut response = self.response(status);
        response["output"] = Value::Array(output);
        if reply.max_tokens {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        response["usage"] = json!({
            "input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output_tokens,
        });
        self.event(name, json!({"response": response}));
    }
}

struct Anthropic {
    id: String,
    model: String,
    events: Vec<Vec<u8>>,
}

impl Anthropic {
    fn raw(&mut self, name: &str, data: &str) {
        self.events
            .push(format!("event: {name}\ndata: {data}\n\n").into_bytes());
    }

    fn event(&mut self, name: &str, data: Value) {
        self.raw(name, &data.to_string());
    }

    fn start(&mut self, reply: &Reply) {
        let (input, _, cached) = reply.usage;
        self.event("message_start", json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input - cached, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": cached, "output_tokens": 1, "service_tier": "standard"},
        }}));
    }

    fn block(&mut self, index: usize, block: Value, deltas: Vec<Value>) {
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        if index == 0 {
            self.event("ping", json!({"type": "ping"}));
        }
        for delta in deltas {
            self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        self.event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        );
    }

    fn reply(&mut self, reply: &Reply) {
        self.start(reply);
        let mut index = 0;
        if let Some(reasoning) = &reply.reasoning {
            let mut deltas: Vec<Value> = pieces(reasoning)
                .into_iter()
                .map(|piece| json!({"type": "thinking_delta", "thinking": piece}))
                .collect();
            deltas.push(
                json!({"type": "signature_delta", "signature": "EqQBCkYIARgCKkBfakesignature"}),
            );
            self.block(
                index,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                deltas,
            );
            index += 1;
        }
        if let Some(text) = &reply.text {
            let deltas = pieces(text)
                .into_iter()
                .map(|piece| json!({"type": "text_delta", "text": piece}))
                .collect();
            self.block(index, json!({"type": "text", "text": ""}), deltas);
            index += 1;
        }
        for (call_id, name, arguments) in &reply.calls {
            let mut deltas = vec![json!({"type": "input_json_delta", "partial_json": ""})];
            deltas.extend(
                fragments(&arguments.to_string())
                    .into_iter()
                    .map(|fragment| json!({"type": "input_json_delta", "partial_json": fragment})),
            );
            self.block(
                index,
                json!({"type": "tool_use", "id": call_id, "name": name, "input": {}}),
                deltas,
            );
            index += 1;
        }
        let stop = if reply.max_tokens {
            "max_tokens"
        } else if reply.calls.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        self.event(
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": reply.usage.1}}),
        );
        self.event("message_stop", json!({"type": "message_stop"}));
    }
}
