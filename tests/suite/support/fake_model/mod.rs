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

mod server;
mod stream;

use super::http::{ServerThread, read_request};
use perch_core::config::Api;
use serde_json::{Value, json};
use server::accept;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
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

    /// A reply that calls `bash` with `command`.
    pub fn bash(call_id: &str, command: &str) -> Reply {
        Reply::new().with_call(call_id, "bash", json!({ "command": command }))
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
    _server: ServerThread,
}

/// A user message's text as the model sees it without perch's `<origin .../>` header lines:
/// what the people wrote, the messages of a collected turn separated by blank lines.
pub fn without_origins(text: &str) -> String {
    text.split('\n')
        .filter(|line| !(line.starts_with("<origin ") && line.ends_with("/>")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The content of the last user message of a model request (the OpenAI completions shape).
pub fn last_user_content(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// [`last_user_content`] without perch's `<origin .../>` header lines.
pub fn user_text(body: &serde_json::Value) -> String {
    without_origins(&last_user_content(body))
}

impl FakeModel {
    /// Starts a server speaking `api` on a free loopback port.
    pub fn start(api: Api) -> FakeModel {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        FakeModel {
            api,
            addr,
            state,
            _server: ServerThread::spawn(listener, 0, move |listener| {
                accept(listener, api, shared)
            }),
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
    /// The last user message of every request, without perch's `<origin .../>` lines.
    pub fn user_texts(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|request| user_text(&request.body))
            .collect()
    }

    pub fn last_request(&self) -> Received {
        self.requests()
            .pop()
            .expect("the fake model received a request")
    }

    /// A `models.yml` with one provider pointing at this server and one model, no API key.
    pub fn models_yml(&self, provider: &str, model: &str) -> String {
        self.yml(provider, model, None)
    }

    /// `models.yml` naming `fake/m1` at 1.25 per million input tokens and 10 per million output.
    pub fn priced_models_yml(&self) -> String {
        self.models_yml("fake", "m1").replace(
            "reasoning: true",
            "reasoning: true\n        price: { input: 1.25, output: 10 }",
        )
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
