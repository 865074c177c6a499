//! The only module that names the HTTP client crate (reqwest): one JSON POST whose response is
//! read as a stream of byte chunks, and one GET (`perch doctor --online`'s key check), with every
//! failure turned into a [`ModelErrorKind`]; and, for a chat platform's Web API (Slack's), one
//! call answered whole ([`Http::exchange`]), which follows no redirect by itself.
//!
//! The API key is handed in as a [`Secret`] and exposed only into the one header it belongs in.
//! Error text from the server is cut short and has the key removed before anything keeps it.

use super::{ModelErrorKind, SetupProblem};
use perch_core::error_chain::on_one_line;
use perch_core::secret::Secret;
use std::sync::OnceLock;
use std::time::Duration;

/// How the API key travels.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Auth<'a> {
    /// A local server that needs no key.
    None,
    /// `Authorization: Bearer <key>` (OpenAI's APIs and the servers compatible with them).
    Bearer(&'a Secret),
    /// `x-api-key: <key>` and `anthropic-version` (Anthropic's Messages API).
    Anthropic(&'a Secret),
}

impl Auth<'_> {
    fn secret(&self) -> Option<&Secret> {
        match self {
            Auth::None => None,
            Auth::Bearer(secret) | Auth::Anthropic(secret) => Some(secret),
        }
    }
}

/// The `anthropic-version` header every Messages API request carries.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The most characters of a server's error text kept in an error.
const MESSAGE_LIMIT: usize = 400;
/// The most bytes of an error response body read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The HTTP clients shared by every request an endpoint makes, one per way of reaching a
/// server: through the proxy settings in the environment or directly (a server on this machine,
/// which no proxy can reach), and over TLS or plain `http://`. A plain client loads no trust
/// store, so a model on `http://127.0.0.1` answers on a machine without CA certificates. Each is
/// built on its first request: an agent that has not called its model yet holds no TLS
/// configuration or root store. A client that cannot be built is not kept, so installing the
/// missing certificates helps without a restart.
#[derive(Debug, Default)]
pub(crate) struct Http {
    clients: [OnceLock<reqwest::Client>; 4],
    /// The same four, following no redirect: a platform's caller decides where its token goes.
    unredirected: [OnceLock<reqwest::Client>; 4],
}

/// What a platform call sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// Nothing (a GET, or a POST with no arguments).
    Empty,
    /// `application/x-www-form-urlencoded` arguments.
    Form(&'a [(&'a str, &'a str)]),
    /// Raw bytes (a file's upload).
    Bytes(&'a [u8]),
}

/// A platform's answer, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// `Retry-After`, as written.
    pub(crate) retry_after: Option<String>,
    /// `Location`, for a redirect.
    pub(crate) location: Option<String>,
    /// `X-OAuth-Scopes`: the scopes of the token sent, as Slack lists them with every answer.
    pub(crate) oauth_scopes: Option<String>,
    pub(crate) body: Vec<u8>,
}

/// Why a platform call got no answer. Never holds the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoAnswer {
    /// No connection could be made (or no client built): nothing reached the platform.
    NotSent { detail: String },
    /// The request went out, or may have; no whole answer came back.
    Failed { detail: String },
    /// The answer's body is longer than the limit asked for; its declared size when known.
    TooLarge { size: Option<u64> },
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoAnswer::NotSent { detail } | NoAnswer::Failed { detail } => f.write_str(detail),
            NoAnswer::TooLarge { size: Some(size) } => write!(f, "too large ({size} bytes)"),
            NoAnswer::TooLarge { size: None } => f.write_str("too large"),
        }
    }
}

impl Http {
    pub(crate) fn new() -> Http {
        Http::default()
    }

    fn client_for(&self, url: &str) -> Result<&reqwest::Client, ModelErrorKind> {
        let direct = is_loopback(url);
        let tls = !is_plain_http(url);
        let cell = &self.clients[usize::from(direct) * 2 + usize::from(tls)];
        if let Some(client) = cell.get() {
            return Ok(client);
        }
        let client = build_client(direct, tls).map_err(ModelErrorKind::Misconfigured)?;
        Ok(cell.get_or_init(|| client))
    }

    fn unredirected_client_for(&self, url: &str) -> Result<&reqwest::Client, SetupProblem> {
        let direct = is_loopback(url);
        let tls = !is_plain_http(url);
        let cell = &self.unredirected[usize::from(direct) * 2 + usize::from(tls)];
        if let Some(client) = cell.get() {
            return Ok(client);
        }
        let client = build_platform_client(direct, tls)?;
        Ok(cell.get_or_init(|| client))
    }

    /// Calls a platform's `url` (POST when `post`, else GET) with `bearer` as
    /// `Authorization: Bearer`, within `timeout`, and reads the answer whole, refusing a body
    /// over `limit` bytes. A redirect is returned as it is, never followed.
    pub(crate) async fn exchange(
        &self,
        post: bool,
        url: &str,
        bearer: Option<&Secret>,
        payload: Payload<'_>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Answer, NoAnswer> {
        let client = self
            .unredirected_client_for(url)
            .map_err(|problem| NoAnswer::NotSent {
                detail: format!("{} ({})", problem.problem, problem.fix),
            })?;
        let mut request = if post {
            client.post(url)
        } else {
            client.get(url)
        }
        .timeout(timeout);
        match payload {
            Payload::Empty => {}
            Payload::Form(arguments) => {
                let body = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(arguments)
                    .finish();
                request = request
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(body);
            }
            Payload::Bytes(bytes) => {
                request = request
                    .header("content-type", "application/octet-stream")
                    .body(bytes.to_vec());
            }
        }
        if let Some(secret) = bearer {
            request = request.header("authorization", format!("Bearer {}", secret.expose()));
        }
        let fail = |error: &reqwest::Error| {
            let detail = redact(&on_one_line(error), bearer);
            if error.is_connect() {
                NoAnswer::NotSent {
                    detail: format!("cannot connect: {detail}"),
                }
            } else if error.is_timeout() {
                NoAnswer::Failed {
                    detail: format!("no answer within {} s", timeout.as_secs()),
                }
            } else {
                NoAnswer::Failed { detail }
            }
        };
        let mut response = request.send().await.map_err(|error| fail(&error))?;
        let declared = response.content_length();
        if declared.is_some_and(|size| size > limit as u64) {
            return Err(NoAnswer::TooLarge { size: declared });
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > limit {
                        return Err(NoAnswer::TooLarge { size: declared });
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(error) => return Err(fail(&error)),
            }
        }
        Ok(Answer {
            status: response.status().as_u16(),
            retry_after: header(&response, "retry-after"),
            location: header(&response, "location"),
            oauth_scopes: header(&response, "x-oauth-scopes"),
            body,
        })
    }
    /// POSTs `body` (JSON) to `url` and returns the response body as a stream, once the status
    /// says it is a reply; an error status becomes the matching [`ModelErrorKind`].
    pub(crate) async fn post(
        &self,
        url: &str,
        auth: Auth<'_>,
        body: Vec<u8>,
    ) -> Result<ByteStream, ModelErrorKind> {
        let request = self
            .client_for(url)?
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body);
        let secret = auth.secret();
        let (mut response, status) = send(authorize(request, auth), secret).await?;
        if (200..300).contains(&status) {
            let content_type = header(&response, "content-type");
            if let Some(content_type) = content_type
                && !content_type.contains("event-stream")
            {
                let text = read_error_body(&mut response).await;
                return Err(ModelErrorKind::Garbage {
                    detail: redact(
                        &format!(
                            "expected an event stream, got {content_type}: {}",
                            excerpt(&text)
                        ),
                        secret,
                    ),
                });
            }
            return Ok(ByteStream {
                response,
                secret: secret.cloned(),
            });
        }
        Err(failure(response, status, secret).await)
    }
}

impl Http {
    /// GETs `url` and returns its body (at most [`ERROR_BODY_LIMIT`] bytes) once the status
    /// says it succeeded; an error status becomes the matching [`ModelErrorKind`].
    pub(crate) async fn get(&self, url: &str, auth: Auth<'_>) -> Result<String, ModelErrorKind> {
        let client = self.client_for(url)?;
        let request = authorize(client.get(url).header("accept", "application/json"), auth);
        let secret = auth.secret();
        let (mut response, status) = send(request, secret).await?;
        if (200..300).contains(&status) {
            return Ok(read_error_body(&mut response).await);
        }
        Err(failure(response, status, secret).await)
    }
}

/// Sends `request`: the response and its status, or what a failure to send means.
async fn send(
    request: reqwest::RequestBuilder,
    secret: Option<&Secret>,
) -> Result<(reqwest::Response, u16), ModelErrorKind> {
    let response = request
        .send()
        .await
        .map_err(|error| send_error(&error, secret))?;
    let status = response.status().as_u16();
    Ok((response, status))
}

/// What a response with the unsuccessful `status` means, its wait and its body read.
async fn failure(
    mut response: reqwest::Response,
    status: u16,
    secret: Option<&Secret>,
) -> ModelErrorKind {
    let retry_after = retry_after(
        header(&response, "retry-after-ms").as_deref(),
        header(&response, "retry-after").as_deref(),
        chrono::Utc::now(),
    );
    let text = read_error_body(&mut response).await;
    status_error(status, retry_after, &text, secret)
}

fn authorize(request: reqwest::RequestBuilder, auth: Auth<'_>) -> reqwest::RequestBuilder {
    match auth {
        Auth::None => request,
        Auth::Bearer(secret) => {
            request.header("authorization", format!("Bearer {}", secret.expose()))
        }
        Auth::Anthropic(secret) => request
            .header("x-api-key", secret.expose())
            .header("anthropic-version", ANTHROPIC_VERSION),
    }
}

/// A reply's body, chunk by chunk as it arrives.
#[derive(Debug)]
pub(crate) struct ByteStream {
    response: reqwest::Response,
    secret: Option<Secret>,
}

impl ByteStream {
    /// The next chunk, or `None` at the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<u8>>, ModelErrorKind> {
        match self.response.chunk().await {
            Ok(chunk) => Ok(chunk.map(|bytes| bytes.to_vec())),
            Err(error) if error.is_timeout() => Err(ModelErrorKind::Timeout),
            Err(error) => Err(ModelErrorKind::Disconnected {
                detail: redact(
                    &format!("the reply broke off: {}", on_one_line(&error)),
                    self.secret.as_ref(),
                ),
            }),
        }
    }
}

fn build_client(direct: bool, tls: bool) -> Result<reqwest::Client, SetupProblem> {
    let mut builder = reqwest::Client::builder();
    if direct {
        builder = builder.no_proxy();
    }
    if !tls {
        builder = builder.tls_certs_only(Vec::new());
    }
    builder.build().map_err(|error| setup_problem(&error))
}

fn build_platform_client(direct: bool, tls: bool) -> Result<reqwest::Client, SetupProblem> {
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if direct {
        builder = builder.no_proxy();
    }
    if !tls {
        builder = builder.tls_certs_only(Vec::new());
    }
    builder.build().map_err(|error| setup_problem(&error))
}

/// Whether this machine has a trust store perch's `https://` requests can use (for
/// `perch doctor`).
pub fn check_trust_store() -> Result<(), SetupProblem> {
    build_client(true, true).map(drop)
}

/// What stops a client from being built, in words an operator can act on. The one cause seen in
/// practice is a machine without CA certificates (a minimal image without the distribution's
/// package), which the platform verifier reports only as text.
fn setup_problem(error: &reqwest::Error) -> SetupProblem {
    let detail = on_one_line(error);
    if detail.contains("No CA certificates") {
        SetupProblem {
            problem: format!(
                "this machine has no CA certificates, so no https:// server can be verified \
                 ({detail})"
            ),
            fix: "install the distribution's CA certificates package (Debian and Ubuntu: \
                  apt-get install ca-certificates; Fedora: dnf install ca-certificates; Alpine: \
                  apk add ca-certificates), or point SSL_CERT_FILE at a PEM bundle",
        }
    } else {
        SetupProblem {
            problem: format!("cannot set up the HTTP client: {detail}"),
            fix: "check the TLS settings in the environment (SSL_CERT_FILE, SSL_CERT_DIR)",
        }
    }
}

fn is_plain_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

fn is_loopback(url: &str) -> bool {
    let Some(host) = reqwest::Url::parse(url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
    else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

async fn read_error_body(response: &mut reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(ERROR_BODY_LIMIT);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn send_error(error: &reqwest::Error, secret: Option<&Secret>) -> ModelErrorKind {
    if error.is_timeout() {
        return ModelErrorKind::Timeout;
    }
    let what = if error.is_connect() {
        "cannot connect"
    } else {
        "the request failed"
    };
    ModelErrorKind::Disconnected {
        detail: redact(&format!("{what}: {}", on_one_line(error)), secret),
    }
}

/// The kind of error an HTTP status and its body mean.
pub(crate) fn status_error(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
    secret: Option<&Secret>,
) -> ModelErrorKind {
    let (message, code) = error_message(body);
    let message = redact(
        &if message.is_empty() {
            format!("HTTP {status}")
        } else {
            message
        },
        secret,
    );
    match status {
        402 => ModelErrorKind::OutOfCredit { status, message },
        400..=499 if out_of_credit(code.as_deref(), &message) => {
            ModelErrorKind::OutOfCredit { status, message }
        }
        429 => ModelErrorKind::RateLimited { retry_after },
        408 => ModelErrorKind::Timeout,
        500..=599 => ModelErrorKind::Server { status, message },
        400..=499 => ModelErrorKind::Rejected { status, message },
        _ => ModelErrorKind::Garbage {
            detail: format!("unexpected HTTP status {status}: {message}"),
        },
    }
}

/// Whether a provider's refusal says the account has no quota or credit left. OpenAI says so
/// with a code; Anthropic only in words, with a 400 `invalid_request_error` ("Your credit
/// balance is too low to access the Anthropic API"), so its words are read here, once.
fn out_of_credit(code: Option<&str>, message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    matches!(code, Some("insufficient_quota" | "billing_error"))
        || message.contains("credit balance")
        || message.contains("billing")
}

/// The human part of an API's error body (`{"error": {"message": ...}}` for OpenAI's APIs,
/// `{"type": "error", "error": {"type": ..., "message": ...}}` for Anthropic's), shortened; and
/// its machine-readable code, when it has one.
fn error_message(body: &str) -> (String, Option<String>) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
        return (excerpt(body), None);
    };
    let error = value.get("error").unwrap_or(&value);
    let text = |value: &serde_json::Value, key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let message = text(error, "message")
        .or_else(|| error.as_str().map(str::to_owned))
        .or_else(|| text(&value, "message"))
        .or_else(|| text(&value, "detail"))
        .unwrap_or_else(|| body.to_owned());
    let code = text(error, "code").or_else(|| text(error, "type"));
    let message = match &code {
        Some(code) if !message.contains(code.as_str()) => format!("{message} ({code})"),
        _ => message,
    };
    (excerpt(&message), code)
}

/// `text` trimmed and cut to at most [`MESSAGE_LIMIT`] characters.
pub(crate) fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MESSAGE_LIMIT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// `text` without the key ([`Secret::redact`]).
pub(crate) fn redact(text: &str, secret: Option<&Secret>) -> String {
    match secret {
        Some(secret) => secret.redact(text),
        None => text.to_owned(),
    }
}

/// How long the server asked us to wait: `retry-after-ms` (milliseconds, sent by OpenAI) or
/// `Retry-After` (seconds, or an HTTP date compared with `now`).
pub(crate) fn retry_after(
    millis: Option<&str>,
    header: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    if let Some(millis) = millis.and_then(|text| text.trim().parse::<f64>().ok())
        && millis.is_finite()
        && millis >= 0.0
    {
        return Some(Duration::from_secs_f64(millis / 1000.0));
    }
    let header = header?.trim();
    if let Ok(seconds) = header.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = header.parse::<f64>()
        && seconds.is_finite()
        && seconds >= 0.0
    {
        return Some(Duration::from_secs_f64(seconds));
    }
    let date = chrono::DateTime::parse_from_rfc2822(header).ok()?;
    let wait = date.with_timezone(&chrono::Utc) - now;
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use perch_core::name::EnvName;
    use perch_core::secret::EnvRef;

    fn key() -> Secret {
        EnvRef::new(EnvName::try_from("KEY").unwrap())
            .resolve(|_| Some("sk-test-0123456789".into()))
            .unwrap()
    }

    #[test]
    fn retry_after_in_seconds_milliseconds_or_a_date() {
        let now = chrono::Utc
            .with_ymd_and_hms(2015, 10, 21, 7, 27, 30)
            .unwrap();
        assert_eq!(
            retry_after(None, Some("7"), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(None, Some(" 1.5 "), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(Some("250"), Some("7"), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            retry_after(None, Some("Wed, 21 Oct 2015 07:28:00 GMT"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(None, Some("Wed, 21 Oct 2015 07:00:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(None, Some("soon"), now), None);
        assert_eq!(retry_after(None, None, now), None);
    }

    #[test]
    fn statuses_become_kinds() {
        let openai = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            status_error(429, Some(Duration::from_secs(2)), openai, None),
            ModelErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(2))
            }
        );
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
        let anthropic = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
        let out_of_credit = |status, message: &str| ModelErrorKind::OutOfCredit {
            status,
            message: message.into(),
        };
        let server = |status, message: &str| ModelErrorKind::Server {
            status,
            message: message.into(),
        };
        let table = [
            (
                429,
                quota,
                out_of_credit(429, "You exceeded your current quota (insufficient_quota)"),
            ),
            (
                400,
                credit,
                out_of_credit(
                    400,
                    "Your credit balance is too low to access the Anthropic API. (invalid_request_error)",
                ),
            ),
            (402, "", out_of_credit(402, "HTTP 402")),
            (529, anthropic, server(529, "Overloaded (overloaded_error)")),
            (
                502,
                "<html>Bad gateway</html>",
                server(502, "<html>Bad gateway</html>"),
            ),
            (
                404,
                "",
                ModelErrorKind::Rejected {
                    status: 404,
                    message: "HTTP 404".into(),
                },
            ),
        ];
        for (status, body, kind) in table {
            assert_eq!(
                status_error(status, None, body, None),
                kind,
                "{status} {body}"
            );
        }
    }

    #[test]
    fn a_spent_account_stops_heartbeats_and_other_refusals_do_not() {
        use perch_core::heartbeat::ModelFailure;
        let anthropic_credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#;
        let unknown_model =
            r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-nope"}}"#;
        let table = [
            (400, anthropic_credit, ModelFailure::QuotaExhausted),
            (402, "", ModelFailure::QuotaExhausted),
            (401, "", ModelFailure::AuthRejected),
            (403, "", ModelFailure::AuthRejected),
            (404, unknown_model, ModelFailure::RequestRejected),
            (400, "", ModelFailure::RequestRejected),
            (529, "", ModelFailure::Transient),
        ];
        for (status, body, failure) in table {
            assert_eq!(
                status_error(status, None, body, None).failure(),
                failure,
                "HTTP {status} {body}"
            );
        }
    }

    #[test]
    fn the_key_never_survives_in_an_error() {
        let body = r#"{"error":{"message":"Incorrect API key provided: sk-test-0123456789.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
        let kind = status_error(401, None, body, Some(&key()));
        let ModelErrorKind::Rejected {
            status: 401,
            message,
        } = kind
        else {
            panic!("{kind:?}");
        };
        assert!(!message.contains("sk-test-0123456789"), "{message}");
        assert!(
            message.contains("Incorrect API key provided: <redacted>"),
            "{message}"
        );
    }

    #[test]
    fn servers_on_this_machine_bypass_proxies() {
        assert!(is_loopback("http://127.0.0.1:8080/v1/responses"));
        assert!(is_loopback("http://localhost:11434/v1/chat/completions"));
        assert!(is_loopback("http://[::1]:8000/v1/messages"));
        assert!(!is_loopback("https://api.openai.com/v1/responses"));
        assert!(!is_loopback("http://10.0.0.2:8000/v1"));
    }

    #[test]
    fn long_messages_are_cut() {
        let long = "x".repeat(5000);
        let ModelErrorKind::Server { message, .. } = status_error(500, None, &long, None) else {
            panic!();
        };
        assert_eq!(message.chars().count(), MESSAGE_LIMIT + 1);
        assert!(message.ends_with('…'));
    }
}
