//! Slack's Web API through perch's one HTTP door: a method called with a token, paced as
//! `perch_core::slack::pace` says, its answer read by `perch_core::slack::web`.

use crate::model::{Http, NoAnswer, Payload};
use perch_core::secret::Secret;
use perch_core::slack::pace::{Call, Pace};
use perch_core::slack::web::{WebFailure, read_answer};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one Web API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes of a Web API answer read.
const ANSWER_LIMIT: usize = 1024 * 1024;

/// Why a call did not succeed. Never holds a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CallError {
    /// Slack answered, and not with success.
    Web(WebFailure),
    /// No answer came.
    Unanswered(NoAnswer),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Web(failure) => write!(f, "{failure}"),
            CallError::Unanswered(failure) => write!(f, "{failure}"),
        }
    }
}

/// A call's `"ok": true` answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Called {
    pub(super) body: serde_json::Value,
    /// `x-oauth-scopes`: the scopes of the token the call was made with, when Slack listed
    /// them.
    pub(super) scopes: Option<String>,
}

/// One workspace's Web API: its base, the HTTP clients and the calls' pace.
#[derive(Debug)]
pub(super) struct WebApi {
    /// The base every method is appended to, ending in `/`.
    base: String,
    http: Http,
    pace: Mutex<Pace>,
    started: Instant,
}

impl WebApi {
    /// The Web API at `api_url` (Slack's own when `None`).
    pub(super) fn new(api_url: Option<&str>) -> WebApi {
        let base = api_url.unwrap_or(perch_core::slack::web::API_URL);
        WebApi {
            base: format!("{}/", base.trim().trim_end_matches('/')),
            http: Http::new(),
            pace: Mutex::new(Pace::new()),
            started: Instant::now(),
        }
    }

    /// The base, as `socket_url_allowed` and `sends_token_to` take it.
    pub(super) fn base(&self) -> &str {
        &self.base
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn with_pace<T>(&self, use_pace: impl FnOnce(&mut Pace) -> T) -> T {
        let mut pace = self
            .pace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        use_pace(&mut pace)
    }

    /// How long a call of `method` (posting in `channel`) would wait now.
    pub(super) fn wait_before(&self, method: &str, channel: Option<&str>) -> Duration {
        let now = self.now();
        self.with_pace(|pace| pace.wait_before(Call { method, channel }, now))
    }

    /// Calls `method` with `token` and `arguments`, after the wait its pace asks for; the body
    /// of an `"ok": true` answer.
    pub(super) async fn call(
        &self,
        token: &Secret,
        method: &str,
        arguments: &[(&str, &str)],
        channel: Option<&str>,
    ) -> Result<serde_json::Value, CallError> {
        self.call_listing_scopes(token, method, arguments, channel)
            .await
            .map(|called| called.body)
    }

    /// [`WebApi::call`], with the token's scopes Slack listed in the answer.
    pub(super) async fn call_listing_scopes(
        &self,
        token: &Secret,
        method: &str,
        arguments: &[(&str, &str)],
        channel: Option<&str>,
    ) -> Result<Called, CallError> {
        loop {
            let wait = self.wait_before(method, channel);
            if wait.is_zero() {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        let now = self.now();
        self.with_pace(|pace| pace.called(Call { method, channel }, now));
        let payload = if arguments.is_empty() {
            Payload::Empty
        } else {
            Payload::Form(arguments)
        };
        let url = format!("{}{method}", self.base);
        let answer = self
            .http
            .exchange(true, &url, Some(token), payload, ANSWER_LIMIT, CALL_TIMEOUT)
            .await
            .map_err(|failure| CallError::Unanswered(self.redacted(failure, token)))?;
        let body = String::from_utf8_lossy(&answer.body);
        let read = read_answer(answer.status, answer.retry_after.as_deref(), &body);
        if let Err(WebFailure::RateLimited { retry_after }) = &read {
            let now = self.now();
            self.with_pace(|pace| pace.rate_limited(method, now, *retry_after));
        }
        read.map(|body| Called {
            body,
            scopes: answer.oauth_scopes,
        })
        .map_err(CallError::Web)
    }

    /// GETs `url` with `token` (or none), reading at most `limit` bytes; a redirect is returned,
    /// not followed.
    pub(super) async fn get(
        &self,
        url: &str,
        token: Option<&Secret>,
        limit: usize,
    ) -> Result<crate::model::Answer, NoAnswer> {
        self.http
            .exchange(false, url, token, Payload::Empty, limit, CALL_TIMEOUT)
            .await
            .map_err(|failure| match token {
                Some(token) => self.redacted(failure, token),
                None => failure,
            })
    }

    /// POSTs a file's `bytes` to its upload URL, with no token; the answer's HTTP status.
    pub(super) async fn upload(&self, url: &str, bytes: &[u8]) -> Result<u16, NoAnswer> {
        self.http
            .exchange(
                true,
                url,
                None,
                Payload::Bytes(bytes),
                ANSWER_LIMIT,
                CALL_TIMEOUT,
            )
            .await
            .map(|answer| answer.status)
    }

    fn redacted(&self, failure: NoAnswer, token: &Secret) -> NoAnswer {
        let clean =
            |detail: String| perch_core::redact::redact_slack_token(&detail, token.expose());
        match failure {
            NoAnswer::NotSent { detail } => NoAnswer::NotSent {
                detail: clean(detail),
            },
            NoAnswer::Failed { detail } => NoAnswer::Failed {
                detail: clean(detail),
            },
            other @ NoAnswer::TooLarge { .. } => other,
        }
    }
}
