//! The Web API's answers read ([`read_answer`], [`read`]) into the typed answers of the methods
//! perch calls, a failure's meaning for a delivery ([`WebFailure::delivery`]) and for the
//! credentials ([`WebFailure::refuses_credentials`], with the fix: [`bot_token_refusal`]), and
//! where a URL Slack hands out may lead ([`socket_url_allowed`], [`sends_token_to`]).

use crate::delivery::AttemptFailure;
use crate::slack::event::Me;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::Duration;

/// The Web API's base in production.
pub const API_URL: &str = "https://slack.com/api/";

/// How long a `429` without a readable `Retry-After` is waited out.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Why a Web API call did not succeed. Never holds a credential: only Slack's error code, an
/// HTTP status, or what could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebFailure {
    /// `429`: the method's rate limit; wait this long.
    RateLimited { retry_after: Duration },
    /// Slack answered `"ok": false` with `error`; `needed` is the scope a `missing_scope`
    /// names.
    Error {
        error: String,
        needed: Option<String>,
    },
    /// An HTTP status that is no answer of Slack's (a proxy, a wrong `api_url`).
    Status { status: u16 },
    /// The body is not a Slack answer, or not the one the method gives.
    Unreadable { reason: String },
}

/// Errors after which Slack may have done part of what was asked: a message may be posted.
const UNKNOWN_FATE: &[&str] = &[
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

/// Errors that say the token is wrong, gone, or lacks what perch needs.
const CREDENTIAL_ERRORS: &[&str] = &[
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
    "missing_scope",
    "no_permission",
    "forbidden_team",
    "team_access_not_granted",
    "ekm_access_denied",
    "two_factor_setup_required",
    "access_denied",
];

impl WebFailure {
    /// The token was refused or lacks a scope: trying again will not help until it is fixed.
    pub fn refuses_credentials(&self) -> bool {
        match self {
            WebFailure::Error { error, .. } => CREDENTIAL_ERRORS.contains(&error.as_str()),
            WebFailure::Status { status } => matches!(status, 401 | 403),
            WebFailure::RateLimited { .. } | WebFailure::Unreadable { .. } => false,
        }
    }

    /// What the failure of a call that posts (`chat.postMessage`,
    /// `files.completeUploadExternal`) means for the delivery: a `429` is waited out; an error
    /// after which Slack may have posted, a server error, or an answer that cannot be read
    /// leaves the fate unknown; any other error means it was not posted.
    pub fn delivery(&self) -> AttemptFailure {
        match self {
            WebFailure::RateLimited { retry_after } => AttemptFailure::RateLimited {
                retry_after: *retry_after,
            },
            WebFailure::Error { error, .. } if UNKNOWN_FATE.contains(&error.as_str()) => {
                AttemptFailure::Failed
            }
            WebFailure::Error { .. } => AttemptFailure::Rejected,
            WebFailure::Status { status } if *status == 408 || *status >= 500 => {
                AttemptFailure::Failed
            }
            WebFailure::Status { .. } => AttemptFailure::Rejected,
            WebFailure::Unreadable { .. } => AttemptFailure::Failed,
        }
    }
}

impl fmt::Display for WebFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WebFailure::RateLimited { retry_after } => {
                write!(f, "rate limited; retry after {} s", retry_after.as_secs())
            }
            WebFailure::Error {
                error,
                needed: Some(needed),
            } => write!(f, "Slack answered {error} (needed: {needed})"),
            WebFailure::Error { error, .. } => write!(f, "Slack answered {error}"),
            WebFailure::Status { status } => write!(f, "HTTP {status}, not a Slack answer"),
            WebFailure::Unreadable { reason } => write!(f, "an answer perch cannot read: {reason}"),
        }
    }
}

/// Why the bot token (`xoxb-…`) was refused, with the fix; `None` when the failure says
/// nothing against the token. For `auth.test` and every call made with the bot token.
pub fn bot_token_refusal(failure: &WebFailure) -> Option<String> {
    if !failure.refuses_credentials() {
        return None;
    }
    let WebFailure::Error { error, needed } = failure else {
        return Some(format!("Slack refused the bot token ({failure})"));
    };
    Some(match (error.as_str(), needed) {
        ("missing_scope", Some(needed)) => format!(
            "the bot token lacks the {needed} scope (missing_scope): add it under OAuth & \
             Permissions, Bot Token Scopes, and reinstall the app"
        ),
        ("invalid_auth" | "not_authed", _) => format!(
            "Slack refused the bot token ({error}): set it to the app's xoxb-… token (OAuth & \
             Permissions, Bot User OAuth Token)"
        ),
        ("account_inactive" | "token_revoked" | "token_expired", _) => format!(
            "the bot token no longer works ({error}): reinstall the app to the workspace and \
             use its new xoxb-… token"
        ),
        ("not_allowed_token_type", _) => format!(
            "the Web API needs the bot token (xoxb-…), not an app-level or user token ({error})"
        ),
        _ => format!("Slack refused the bot token ({error})"),
    })
}

#[derive(Deserialize)]
struct Envelope {
    ok: bool,
    error: Option<String>,
    needed: Option<String>,
}

/// Reads a Web API answer: its HTTP `status`, its `Retry-After` header, its body. `Ok` holds
/// the body of an `"ok": true` answer.
pub fn read_answer(
    status: u16,
    retry_after: Option<&str>,
    body: &str,
) -> Result<serde_json::Value, WebFailure> {
    if status == 429 {
        let retry_after = retry_after
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs);
        return Err(WebFailure::RateLimited { retry_after });
    }
    let value: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let envelope = value
        .as_ref()
        .and_then(|value| Envelope::deserialize(value).ok());
    match (status, envelope, value) {
        (_, Some(envelope), _) if !envelope.ok => Err(WebFailure::Error {
            error: envelope.error.unwrap_or_else(|| "unknown_error".to_owned()),
            needed: envelope.needed,
        }),
        (200, Some(_), Some(value)) => Ok(value),
        (200, _, _) => Err(WebFailure::Unreadable {
            reason: "no `ok` in the answer".to_owned(),
        }),
        (status, _, _) => Err(WebFailure::Status { status }),
    }
}

/// Reads a Web API answer as the method's answer `T`.
pub fn read<T: DeserializeOwned>(
    status: u16,
    retry_after: Option<&str>,
    body: &str,
) -> Result<T, WebFailure> {
    let value = read_answer(status, retry_after, body)?;
    T::deserialize(value).map_err(|error| WebFailure::Unreadable {
        reason: error.to_string(),
    })
}

/// `auth.test`'s answer: who the token is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AuthTest {
    pub team_id: String,
    pub user_id: String,
    #[serde(default)]
    pub bot_id: Option<String>,
    /// The workspace's name.
    #[serde(default)]
    pub team: Option<String>,
    /// The bot user's name.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
}

impl AuthTest {
    /// The bot as events are classified for.
    pub fn me(&self) -> Me {
        Me {
            team_id: self.team_id.clone(),
            user_id: self.user_id.clone(),
            bot_id: self.bot_id.clone(),
        }
    }
}

/// `apps.connections.open`'s answer: the socket's URL, for one connection only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConnectionsOpen {
    pub url: String,
}

/// `chat.postMessage`'s answer: where the message is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Posted {
    pub channel: String,
    pub ts: String,
}

impl Posted {
    /// The posted message's identity, as an inbound message's: `<channel>:<ts>`.
    pub fn platform_id(&self) -> String {
        format!("{}:{}", self.channel, self.ts)
    }
}

/// `users.info`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UserInfo {
    pub user: User,
}

/// A user as `users.info` describes them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct User {
    pub id: String,
    #[serde(default)]
    pub team_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub real_name: Option<String>,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub is_bot: bool,
    #[serde(default)]
    pub profile: Profile,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Profile {
    #[serde(default)]
    pub display_name: Option<String>,
    #[serde(default)]
    pub real_name: Option<String>,
}

impl User {
    /// The name Slack shows: the display name, else the real name, else the user name, else
    /// the id.
    pub fn display_name(&self) -> &str {
        [
            &self.profile.display_name,
            &self.profile.real_name,
            &self.real_name,
            &self.name,
        ]
        .into_iter()
        .flatten()
        .map(|name| name.trim())
        .find(|name| !name.is_empty())
        .unwrap_or(&self.id)
    }
}

/// `files.getUploadURLExternal`'s answer: where to send the file's bytes, and its id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UploadUrl {
    pub upload_url: String,
    pub file_id: String,
}

/// `files.completeUploadExternal`'s answer: the files shared.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CompletedUpload {
    pub files: Vec<UploadedFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UploadedFile {
    pub id: String,
    #[serde(default)]
    pub title: Option<String>,
}

/// A URL's scheme and host (lower-cased, an IPv6 address with its brackets); `None` when it
/// has no `//` authority or names a user (`https://slack.com@elsewhere/`).
fn scheme_and_host(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let host = if authority.starts_with('[') {
        authority.split_inclusive(']').next().unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default()
    };
    Some((scheme.to_ascii_lowercase(), host.to_ascii_lowercase()))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host == "[::1]" || host.starts_with("127.")
}

/// The Web API's base is a test server on this machine (`http://127.0.0.1:…`).
pub fn api_is_loopback(api_url: &str) -> bool {
    scheme_and_host(api_url).is_some_and(|(scheme, host)| scheme == "http" && is_loopback(&host))
}

/// Whether perch connects to the socket URL `apps.connections.open` gave: a `wss://` one
/// always, a `ws://` one only on this machine and only when the Web API's base is a loopback
/// `http://` address (a test server). Otherwise why not.
pub fn socket_url_allowed(api_url: &str, socket_url: &str) -> Result<(), String> {
    match scheme_and_host(socket_url) {
        Some((scheme, _)) if scheme == "wss" => Ok(()),
        Some((scheme, host)) if scheme == "ws" => {
            if is_loopback(&host) && api_is_loopback(api_url) {
                Ok(())
            } else {
                Err(format!(
                    "Slack's socket URL `{host}` is not encrypted (ws://); perch accepts that only \
                     from a test server on this machine"
                ))
            }
        }
        _ => Err("Slack's socket URL is not a wss:// URL".to_owned()),
    }
}

/// Whether the bot token may go with a request to `url` (a file's `url_private_download`, or
/// where a download was redirected): only to Slack's own hosts over HTTPS, or to this machine
/// when the Web API's base is a test server on it.
pub fn sends_token_to(api_url: &str, url: &str) -> bool {
    match scheme_and_host(url) {
        Some((scheme, host)) if scheme == "https" => {
            host == "slack.com" || host.ends_with(".slack.com")
        }
        Some((scheme, host)) if scheme == "http" => is_loopback(&host) && api_is_loopback(api_url),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slack::fixture;

    #[test]
    fn the_documented_answers_read() {
        let auth = fixture!("web-auth.test.json");
        let auth: AuthTest = read(auth.status.unwrap(), None, &auth.text()).unwrap();
        assert_eq!(
            (auth.team_id.as_str(), auth.user_id.as_str(), auth.bot_id),
            ("T12345678", "W12345678", None)
        );
        let bot = fixture!("web-auth.test-bot.json");
        let bot: AuthTest = read(200, None, &bot.text()).unwrap();
        assert_eq!(
            bot.me(),
            Me {
                team_id: "T123ABC456".into(),
                user_id: "U0LAN0Z89".into(),
                bot_id: Some("B123ABC456".into())
            }
        );
        let open: ConnectionsOpen = read(
            200,
            None,
            &fixture!("web-apps.connections.open.json").text(),
        )
        .unwrap();
        assert!(open.url.starts_with("wss://"));
        let posted: Posted =
            read(200, None, &fixture!("web-chat.postMessage.json").text()).unwrap();
        assert_eq!(posted.platform_id(), "C123ABC456:1503435956.000247");
        let info: UserInfo = read(200, None, &fixture!("web-users.info.json").text()).unwrap();
        assert_eq!(info.user.display_name(), "spengler");
        assert_eq!(info.user.team_id.as_deref(), Some("T012AB3C4"));
        let upload: UploadUrl = read(
            200,
            None,
            &fixture!("web-files.getUploadURLExternal.json").text(),
        )
        .unwrap();
        assert_eq!(upload.file_id, "F123ABC456");
        let done: CompletedUpload = read(
            200,
            None,
            &fixture!("web-files.completeUploadExternal.json").text(),
        )
        .unwrap();
        assert_eq!(done.files[0].id, "F123ABC456");
    }

    #[test]
    fn the_documented_failures_read() {
        let limited = fixture!("web-chat.postMessage-ratelimited.json");
        let failure = read_answer(
            limited.status.unwrap(),
            limited.retry_after.as_deref(),
            &limited.text(),
        )
        .unwrap_err();
        assert_eq!(
            failure,
            WebFailure::RateLimited {
                retry_after: Duration::from_secs(30)
            }
        );
        let refused = fixture!("web-apps.connections.open-invalid_auth.json");
        let failure = read_answer(200, None, &refused.text()).unwrap_err();
        assert!(failure.refuses_credentials());
        assert_eq!(failure.to_string(), "Slack answered invalid_auth");
    }

    #[test]
    fn every_answer_has_one_meaning() {
        let error = |error: &str| WebFailure::Error {
            error: error.into(),
            needed: None,
        };
        let cases: Vec<(u16, Option<&str>, &str, WebFailure)> = vec![
            (
                429,
                Some("7"),
                "",
                WebFailure::RateLimited {
                    retry_after: Duration::from_secs(7),
                },
            ),
            (
                429,
                Some("soon"),
                "",
                WebFailure::RateLimited {
                    retry_after: DEFAULT_RETRY_AFTER,
                },
            ),
            (
                429,
                None,
                r#"{"ok":false,"error":"ratelimited"}"#,
                WebFailure::RateLimited {
                    retry_after: DEFAULT_RETRY_AFTER,
                },
            ),
            (
                200,
                None,
                r#"{"ok":false,"error":"channel_not_found"}"#,
                error("channel_not_found"),
            ),
            (200, None, r#"{"ok":false}"#, error("unknown_error")),
            (
                200,
                None,
                r#"{"ok":false,"error":"missing_scope","needed":"chat:write","provided":"users:read"}"#,
                WebFailure::Error {
                    error: "missing_scope".into(),
                    needed: Some("chat:write".into()),
                },
            ),
            (
                500,
                None,
                "<html>oops</html>",
                WebFailure::Status { status: 500 },
            ),
            (
                404,
                None,
                r#"{"ok":false,"error":"unknown_method"}"#,
                error("unknown_method"),
            ),
            (
                200,
                None,
                "<html>",
                WebFailure::Unreadable {
                    reason: "no `ok` in the answer".into(),
                },
            ),
            (
                200,
                None,
                r#"{"channel":"C1"}"#,
                WebFailure::Unreadable {
                    reason: "no `ok` in the answer".into(),
                },
            ),
        ];
        for (status, retry_after, body, expected) in cases {
            assert_eq!(
                read_answer(status, retry_after, body),
                Err(expected),
                "{status} {body}"
            );
        }
        assert_eq!(
            read_answer(200, None, r#"{"ok":true,"warning":"x"}"#),
            Ok(serde_json::json!({"ok": true, "warning": "x"}))
        );
        assert!(matches!(
            read::<Posted>(200, None, r#"{"ok":true}"#),
            Err(WebFailure::Unreadable { .. })
        ));
    }

    #[test]
    fn a_failed_post_is_waited_out_refused_or_of_unknown_fate() {
        let error = |error: &str| WebFailure::Error {
            error: error.into(),
            needed: None,
        };
        let cases: Vec<(WebFailure, AttemptFailure, bool)> = vec![
            (
                WebFailure::RateLimited {
                    retry_after: Duration::from_secs(3),
                },
                AttemptFailure::RateLimited {
                    retry_after: Duration::from_secs(3),
                },
                false,
            ),
            (error("channel_not_found"), AttemptFailure::Rejected, false),
            (error("msg_too_long"), AttemptFailure::Rejected, false),
            (error("not_in_channel"), AttemptFailure::Rejected, false),
            (error("invalid_auth"), AttemptFailure::Rejected, true),
            (error("account_inactive"), AttemptFailure::Rejected, true),
            (error("not_authed"), AttemptFailure::Rejected, true),
            (error("missing_scope"), AttemptFailure::Rejected, true),
            (error("internal_error"), AttemptFailure::Failed, false),
            (error("fatal_error"), AttemptFailure::Failed, false),
            (error("service_unavailable"), AttemptFailure::Failed, false),
            (error("request_timeout"), AttemptFailure::Failed, false),
            (
                WebFailure::Status { status: 502 },
                AttemptFailure::Failed,
                false,
            ),
            (
                WebFailure::Status { status: 408 },
                AttemptFailure::Failed,
                false,
            ),
            (
                WebFailure::Status { status: 404 },
                AttemptFailure::Rejected,
                false,
            ),
            (
                WebFailure::Status { status: 401 },
                AttemptFailure::Rejected,
                true,
            ),
            (
                WebFailure::Unreadable { reason: "x".into() },
                AttemptFailure::Failed,
                false,
            ),
        ];
        for (failure, delivery, credentials) in cases {
            assert_eq!(failure.delivery(), delivery, "{failure}");
            assert_eq!(failure.refuses_credentials(), credentials, "{failure}");
        }
    }

    #[test]
    fn a_refused_bot_token_says_what_to_fix() {
        let error = |error: &str, needed: Option<&str>| WebFailure::Error {
            error: error.into(),
            needed: needed.map(Into::into),
        };
        let cases: Vec<(WebFailure, Option<&str>)> = vec![
            (
                error("missing_scope", Some("chat:write")),
                Some("lacks the chat:write scope"),
            ),
            (
                error("invalid_auth", None),
                Some("xoxb-… token (OAuth & Permissions"),
            ),
            (error("not_authed", None), Some("(not_authed)")),
            (error("token_revoked", None), Some("reinstall the app")),
            (
                error("not_allowed_token_type", None),
                Some("not an app-level or user token"),
            ),
            (
                error("team_access_not_granted", None),
                Some("(team_access_not_granted)"),
            ),
            (WebFailure::Status { status: 403 }, Some("HTTP 403")),
            (error("channel_not_found", None), None),
            (
                WebFailure::RateLimited {
                    retry_after: Duration::from_secs(1),
                },
                None,
            ),
        ];
        for (failure, says) in cases {
            let refusal = bot_token_refusal(&failure);
            match says {
                Some(says) => assert!(
                    refusal
                        .as_deref()
                        .is_some_and(|refusal| refusal.contains(says)),
                    "{failure}: {refusal:?}"
                ),
                None => assert_eq!(refusal, None, "{failure}"),
            }
        }
    }

    #[test]
    fn names_fall_back_in_order() {
        let user = |display: Option<&str>,
                    profile_real: Option<&str>,
                    real: Option<&str>,
                    name: Option<&str>| User {
            id: "U1".into(),
            team_id: None,
            name: name.map(Into::into),
            real_name: real.map(Into::into),
            deleted: false,
            is_bot: false,
            profile: Profile {
                display_name: display.map(Into::into),
                real_name: profile_real.map(Into::into),
            },
        };
        assert_eq!(
            user(Some("ada"), Some("Ada L"), None, None).display_name(),
            "ada"
        );
        assert_eq!(
            user(Some(" "), Some("Ada L"), None, None).display_name(),
            "Ada L"
        );
        assert_eq!(
            user(None, None, Some("Ada R"), Some("ada1")).display_name(),
            "Ada R"
        );
        assert_eq!(user(None, None, None, Some("ada1")).display_name(), "ada1");
        assert_eq!(user(None, None, None, None).display_name(), "U1");
    }

    #[test]
    fn urls_are_followed_only_where_they_may_lead() {
        let slack = API_URL;
        let local = "http://127.0.0.1:8123/api/";
        let sockets: &[(&str, &str, bool)] = &[
            (
                slack,
                "wss://wss-primary.slack.com/link/?ticket=1&app_id=2",
                true,
            ),
            (local, "wss://wss-primary.slack.com/link/", true),
            (local, "ws://127.0.0.1:8123/link/?ticket=1", true),
            (local, "ws://localhost:9/link", true),
            ("http://[::1]:80/api/", "ws://[::1]:81/link", true),
            (slack, "ws://127.0.0.1:8123/link/", false),
            (local, "ws://wss-primary.slack.com/link/", false),
            ("http://example.org/api/", "ws://127.0.0.1/link", false),
            (local, "ws://127.0.0.1@evil.example/link", false),
            (local, "https://wss-primary.slack.com/link/", false),
            (local, "not a url", false),
        ];
        for (api, socket, allowed) in sockets {
            assert_eq!(
                socket_url_allowed(api, socket).is_ok(),
                *allowed,
                "{api} {socket}"
            );
        }
        let downloads: &[(&str, &str, bool)] = &[
            (
                slack,
                "https://files.slack.com/files-pri/T0-F0/download/a.gif",
                true,
            ),
            (slack, "https://slack.com/x", true),
            (slack, "https://FILES.SLACK.COM/x", true),
            (slack, "https://slack.com.evil.example/x", false),
            (slack, "https://evilslack.com/x", false),
            (slack, "https://files.slack.com@evil.example/x", false),
            (slack, "http://files.slack.com/x", false),
            (slack, "https://s3.amazonaws.com/x", false),
            (slack, "http://127.0.0.1:8123/files/x", false),
            (local, "http://127.0.0.1:8123/files/x", true),
            (local, "http://10.0.0.1/files/x", false),
        ];
        for (api, url, sends) in downloads {
            assert_eq!(sends_token_to(api, url), *sends, "{api} {url}");
        }
    }
}
