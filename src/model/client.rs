//! From an [`Endpoint`] to a working [`Model`]: the request body of its wire API, one HTTP POST,
//! the server-sent events parsed as they arrive and decoded into a reply, under the endpoint's
//! timeout and the caller's cancellation.

use super::anthropic::{self, AnthropicDecoder};
use super::draft::Decoder;
use super::http::{self, Auth, Http};
use super::openai_completions::{self, CompletionsDecoder};
use super::openai_responses::{self, ResponsesDecoder};
use super::{
    BoxFuture, Endpoint, Model, ModelError, ModelErrorKind, ModelReply, ModelRequest, SetupProblem,
    StreamEvent,
};
use crate::agent::LoadedAgent;
use perch_core::config::{Api, Provider};
use perch_core::secret::Secret;
use perch_core::sse::SseParser;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The model behind `endpoint`, speaking the wire API its provider names.
pub fn connect(endpoint: Endpoint) -> Arc<dyn Model> {
    Arc::new(HttpModel {
        endpoint,
        http: Http::new(),
    })
}

/// The endpoint of the agent's model (`agent.lua`'s `model`, looked up in `models.yml`), with
/// the provider's `apiKey` read through `lookup` (the shell passes the process environment).
/// A provider without `apiKey` (a local server) gets no key; a key variable that is unset is an
/// error naming it.
pub fn endpoint_for(
    agent: &LoadedAgent,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Endpoint, String> {
    endpoint_for_model(agent, &agent.definition.agent.model, lookup)
}

/// The endpoint of `model`, one of the models `models.yml` declares (a heartbeat task's own
/// model, say), with its provider's key read through `lookup`.
pub fn endpoint_for_model(
    agent: &LoadedAgent,
    model: &perch_core::name::ModelRef,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Endpoint, String> {
    let (provider, spec) = agent
        .definition
        .models
        .model(model)
        .ok_or_else(|| format!("models.yml does not declare the model {model}"))?;
    let name = model.provider.as_str();
    let api_key = match &provider.api_key {
        None => None,
        Some(reference) => Some(
            reference
                .resolve(&lookup)
                .map_err(|missing| format!("models.yml: providers.{name}.apiKey: {missing}"))?,
        ),
    };
    Ok(Endpoint::new(name, provider, spec, api_key))
}

/// Lists the provider's models with its key, `GET {baseUrl}/models` (every API perch speaks has
/// it): a cheap authenticated read that tells a refused key (401, 403) from a server that cannot
/// be reached, for `perch doctor --online`. Errors never hold the key.
pub async fn check_provider(
    provider: &Provider,
    api_key: Option<&Secret>,
) -> Result<String, ModelErrorKind> {
    let auth = match (api_key, provider.api) {
        (None, _) => Auth::None,
        (Some(key), Api::AnthropicMessages) => Auth::Anthropic(key),
        (Some(key), Api::OpenAiCompletions | Api::OpenAiResponses) => Auth::Bearer(key),
    };
    let url = format!("{}/models", provider.base_url.trim_end_matches('/'));
    let body = Http::new().get(&url, auth).await?;
    let listed = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|value| value.get("data")?.as_array().map(Vec::len));
    let listed = listed.map_or_else(String::new, |count| format!(", {count} models listed"));
    Ok(match api_key {
        Some(_) => format!("GET /models: the key is accepted{listed}"),
        None => format!("GET /models answers without a key{listed}"),
    })
}

#[derive(Debug)]
struct HttpModel {
    endpoint: Endpoint,
    http: Http,
}

impl Model for HttpModel {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        events: mpsc::UnboundedSender<StreamEvent>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(ModelErrorKind::Cancelled),
                result = tokio::time::timeout(self.endpoint.timeout, self.run(request, &events)) => {
                    result.unwrap_or(Err(ModelErrorKind::Timeout))
                }
            };
            outcome.map_err(|kind| self.error(kind))
        })
    }
}

impl HttpModel {
    async fn run(
        &self,
        request: &ModelRequest,
        events: &mpsc::UnboundedSender<StreamEvent>,
    ) -> Result<ModelReply, ModelErrorKind> {
        let endpoint = &self.endpoint;
        let (path, body, mut decoder): (_, _, Box<dyn Decoder>) = match endpoint.api {
            Api::OpenAiCompletions => (
                openai_completions::PATH,
                openai_completions::body(endpoint, request),
                Box::new(CompletionsDecoder::default()),
            ),
            Api::OpenAiResponses => (
                openai_responses::PATH,
                openai_responses::body(endpoint, request),
                Box::new(ResponsesDecoder::default()),
            ),
            Api::AnthropicMessages => (
                anthropic::PATH,
                anthropic::body(endpoint, request),
                Box::new(AnthropicDecoder::default()),
            ),
        };
        let auth = match (&endpoint.api_key, endpoint.api) {
            (None, _) => Auth::None,
            (Some(key), Api::AnthropicMessages) => Auth::Anthropic(key),
            (Some(key), Api::OpenAiCompletions | Api::OpenAiResponses) => Auth::Bearer(key),
        };
        let url = format!("{}{path}", endpoint.base_url.trim_end_matches('/'));
        let mut stream = self
            .http
            .post(&url, auth, body.to_string().into_bytes())
            .await?;
        let mut parser = SseParser::new();
        let mut shown = Vec::new();
        while let Some(chunk) = stream.next().await? {
            for event in parser.feed(&chunk) {
                let reply = decoder.event(&event, &mut shown);
                for item in shown.drain(..) {
                    let _ = events.send(item);
                }
                if let Some(reply) = reply? {
                    return Ok(reply);
                }
            }
        }
        Err(ModelErrorKind::Disconnected {
            detail: "the stream ended before the reply was complete".into(),
        })
    }

    fn error(&self, kind: ModelErrorKind) -> ModelError {
        let key = self.endpoint.api_key.as_ref();
        let scrub = |text: String| http::redact(&text, key);
        let kind = match kind {
            ModelErrorKind::Server { status, message } => ModelErrorKind::Server {
                status,
                message: scrub(message),
            },
            ModelErrorKind::Rejected { status, message } => ModelErrorKind::Rejected {
                status,
                message: scrub(message),
            },
            ModelErrorKind::OutOfCredit { status, message } => ModelErrorKind::OutOfCredit {
                status,
                message: scrub(message),
            },
            ModelErrorKind::Disconnected { detail } => ModelErrorKind::Disconnected {
                detail: scrub(detail),
            },
            ModelErrorKind::Garbage { detail } => ModelErrorKind::Garbage {
                detail: scrub(detail),
            },
            ModelErrorKind::Misconfigured(setup) => ModelErrorKind::Misconfigured(SetupProblem {
                problem: scrub(setup.problem),
                fix: setup.fix,
            }),
            kind @ (ModelErrorKind::RateLimited { .. }
            | ModelErrorKind::Timeout
            | ModelErrorKind::Cancelled) => kind,
        };
        ModelError {
            provider: self.endpoint.provider.clone(),
            model: self.endpoint.model.id.clone(),
            kind,
        }
    }
}
