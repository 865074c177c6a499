//! Model providers: one [`Model`] trait (the effect boundary for talking to a model), three wire
//! APIs behind it, and the types a turn is made of.

mod anthropic;
mod body;
mod client;
mod draft;
mod http;
mod openai_completions;
mod openai_responses;
#[cfg(test)]
mod test_support;

pub use client::{check_provider, connect, endpoint_for, endpoint_for_model};
pub use http::check_trust_store;
pub(crate) use http::{Answer, Http, NoAnswer, Payload};

use perch_core::config::{Api, ModelSpec, Provider, Thinking};
use perch_core::heartbeat::ModelFailure;
use perch_core::log::Message;
use perch_core::secret::Secret;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A boxed future, so that [`Model`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The one effect boundary for models: one request, streamed, assembled into a reply.
///
/// One call is one HTTP request. It does not retry: the caller records each attempt and decides,
/// from [`ModelErrorKind::retry`], whether and when to try again.
pub trait Model: Send + Sync + fmt::Debug {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: mpsc::UnboundedSender<StreamEvent>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>>;
}

/// Which model, where, and how to authenticate: `models.yml`'s provider and model, with the key
/// read from the host environment.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The provider's name in `models.yml` (`openai`), for error messages.
    pub provider: String,
    pub api: Api,
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub model: ModelSpec,
    /// Per request: a response not finished by then is a [`ModelErrorKind::Timeout`].
    pub timeout: Duration,
}

impl Endpoint {
    pub fn new(
        provider_name: &str,
        provider: &Provider,
        model: &ModelSpec,
        api_key: Option<Secret>,
    ) -> Endpoint {
        Endpoint {
            provider: provider_name.to_owned(),
            api: provider.api,
            base_url: provider.base_url.clone(),
            api_key,
            model: model.clone(),
            timeout: Duration::from_secs(600),
        }
    }
}

/// One request: the conversation so far, in perch's own message types.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub system: String,
    /// User, assistant and tool messages, oldest first. Tool results are `Role::Tool` messages
    /// holding `Part::ToolResult`s that answer the previous assistant message's calls.
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub thinking: Thinking,
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// What streams while a reply is being produced, for display only; the reply itself is the
/// return value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    Text(String),
    Reasoning(String),
    ToolCall { call_id: String, name: String },
}

/// A finished reply: the assistant message's parts (text, reasoning, complete tool calls with
/// parsed JSON arguments), usage and why it stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelReply {
    pub parts: Vec<perch_core::log::Part>,
    pub usage: Usage,
    pub stop: StopReason,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    /// Input tokens served from the provider's prompt cache (counted in `input` too).
    pub cached: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model finished its turn.
    End,
    /// The model wants its tool calls run.
    ToolUse,
    /// The reply hit `maxTokens`.
    MaxTokens,
    /// Refusal, content filter, or anything else the API names.
    Other(String),
}

/// A failed request. Its text names the provider and model and never holds the API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    pub provider: String,
    pub model: String,
    pub kind: ModelErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelErrorKind {
    /// 429; `retry_after` from the `Retry-After` header when it has one.
    RateLimited { retry_after: Option<Duration> },
    /// 5xx, or an error event in the stream that says the server failed.
    Server { status: u16, message: String },
    /// The connection failed or dropped before the reply was complete; partial output discarded.
    Disconnected { detail: String },
    /// No complete reply within the endpoint's timeout.
    Timeout,
    /// 4xx other than 429: the request itself is wrong (bad key, unknown model, too long).
    Rejected { status: u16, message: String },
    /// The account has no quota or credit left, as the provider said it (HTTP 402, OpenAI's
    /// `insufficient_quota`, Anthropic's 400 saying the credit balance is too low): decided once,
    /// where the response is read.
    OutOfCredit { status: u16, message: String },
    /// The response is not what the API promises (unparseable JSON, events out of order, tool
    /// call arguments that are not JSON).
    Garbage { detail: String },
    /// perch cannot make the request on this machine (its HTTP client cannot be built: no CA
    /// certificates for an `https://` model). Nothing reached the provider; trying again does
    /// not help until the machine is fixed.
    Misconfigured(SetupProblem),
    /// The caller cancelled.
    Cancelled,
}

/// Why perch cannot make requests on this machine, and what fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupProblem {
    pub problem: String,
    pub fix: &'static str,
}

impl ModelErrorKind {
    /// What kind of failure this is for a run it ends, as the pure decisions take it.
    pub fn failure(&self) -> ModelFailure {
        match self {
            ModelErrorKind::Rejected { status, .. } => {
                perch_core::heartbeat::stop::refusal(*status)
            }
            ModelErrorKind::OutOfCredit { .. } => ModelFailure::QuotaExhausted,
            ModelErrorKind::RateLimited { .. }
            | ModelErrorKind::Server { .. }
            | ModelErrorKind::Disconnected { .. }
            | ModelErrorKind::Timeout
            | ModelErrorKind::Cancelled => ModelFailure::Transient,
            ModelErrorKind::Garbage { .. } => ModelFailure::Unusable,
            ModelErrorKind::Misconfigured(_) => ModelFailure::Misconfigured,
        }
    }

    /// Whether trying again may help, and how long to wait first if the server said so.
    pub fn retry(&self) -> Option<Option<Duration>> {
        match self {
            ModelErrorKind::RateLimited { retry_after } => Some(*retry_after),
            ModelErrorKind::Server { .. }
            | ModelErrorKind::Disconnected { .. }
            | ModelErrorKind::Timeout => Some(None),
            ModelErrorKind::Rejected { .. }
            | ModelErrorKind::OutOfCredit { .. }
            | ModelErrorKind::Garbage { .. }
            | ModelErrorKind::Misconfigured(_)
            | ModelErrorKind::Cancelled => None,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}: ", self.provider, self.model)?;
        match &self.kind {
            ModelErrorKind::RateLimited {
                retry_after: Some(after),
            } => {
                write!(f, "rate limited (retry after {} s)", after.as_secs())
            }
            ModelErrorKind::RateLimited { retry_after: None } => write!(f, "rate limited"),
            ModelErrorKind::Server { status, message } => {
                write!(f, "server error {status}: {message}")
            }
            ModelErrorKind::Disconnected { detail } => write!(f, "connection lost: {detail}"),
            ModelErrorKind::Timeout => write!(f, "no complete reply before the request timeout"),
            ModelErrorKind::Rejected { status, message } => {
                write!(f, "request rejected ({status}): {message}")
            }
            ModelErrorKind::OutOfCredit { status, message } => {
                write!(f, "out of quota or credit ({status}): {message}")
            }
            ModelErrorKind::Garbage { detail } => write!(f, "unusable response: {detail}"),
            ModelErrorKind::Misconfigured(setup) => {
                write!(
                    f,
                    "cannot make the request: {}; {}",
                    setup.problem, setup.fix
                )
            }
            ModelErrorKind::Cancelled => write!(f, "cancelled"),
        }
    }
}

impl std::error::Error for ModelError {}
