//! Slack over Socket Mode: the one module (this folder) that names Slack's wire. What each
//! frame, event and answer means is decided by the pure `perch_core::slack`; this module opens
//! the socket (over tokio-tungstenite) and makes the Web API calls (through perch's one HTTP
//! door, `src/model/http.rs`).
//!
//! The socket loop is perch's own, not a library's listener: each `events_api` envelope is
//! handed to perch and acknowledged only once perch has journaled it, an envelope perch cannot
//! read is journaled as a refusal and acknowledged, and every reconnect is decided by
//! `perch_core::slack::socket` inside the receive attempt the connection machine steps
//! (receive.rs). A message is known by `<channel>:<ts>`, so its `message` and `app_mention`
//! deliveries and Slack's redeliveries are one inbox item.
//!
//! Replies are posted with `chat.postMessage` as mrkdwn (`perch_core::slack::mrkdwn`, which
//! notifies no one the model names), in the thread of the message they answer. Calls are paced per
//! method across the workspace and per channel; a `429` holds the method for its `Retry-After`. A
//! wait before a reply's first call is handed back to the delivery worker as a rate limit, so the
//! outbox knows the reply is not sent while it waits. Slack has no idempotency key, so a post whose
//! answer was lost is `unknown` and never sent again. A reply's files are uploaded
//! (`files.getUploadURLExternal`, the bytes, `files.completeUploadExternal`) into the same room and
//! thread after its text. Both tokens travel only in an `Authorization` header, and every error
//! text is redacted before it leaves this module.

mod receive;
mod web;

use super::{
    Attachment, BoxFuture, CheckError, Checked, Connector, ConnectorError, Delivery, DeliveryError,
    FetchError, InboundEvent, PlatformLimits, Receipt, ReceiveAttempt, Upload,
};
use perch_core::secret::Secret;
use perch_core::slack::event::Me;
use perch_core::slack::mrkdwn::{MAX_CHARS, to_mrkdwn};
use perch_core::slack::scopes::{Scopes, bot_scopes, lacking, missing_scopes_fix};
use perch_core::slack::socket::open_refusal;
use perch_core::slack::web::sends_token_to;
use perch_core::slack::web::{
    AuthTest, CompletedUpload, Posted, UploadUrl, WebFailure, bot_token_refusal,
};
use std::fmt;
use std::sync::Mutex;
use tokio::sync::OnceCell;
use web::{CallError, WebApi};

/// How many redirects a file's download follows.
const MAX_REDIRECTS: usize = 3;

/// A connection to one Slack app in one workspace.
pub struct SlackConnector {
    app_token: Secret,
    bot_token: Secret,
    /// The variables the tokens come from, for fixes.
    app_variable: String,
    bot_variable: String,
    web: WebApi,
    /// Who the bot is (from `auth.test`), and the account as `perch status` shows it.
    identity: OnceCell<(Me, String)>,
    names: Mutex<receive::Names>,
    /// `allow.users`: the people of another organisation (Slack Connect) perch takes.
    allowed_users: Vec<String>,
}

impl fmt::Debug for SlackConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlackConnector")
            .field("api_url", &self.web.base())
            .field("identity", &self.identity.get().map(|(_, account)| account))
            .finish_non_exhaustive()
    }
}

/// The tokens of a Slack channel and the variables they come from.
#[derive(Debug)]
pub struct SlackTokens {
    pub app_token: Secret,
    pub app_variable: String,
    pub bot_token: Secret,
    pub bot_variable: String,
}

impl SlackConnector {
    /// A connector for the app with `tokens`, calling the Web API at `api_url` (Slack's own
    /// when `None`); `allowed_users` are `allow.users`. Nothing is sent until the first call.
    pub fn new(
        tokens: SlackTokens,
        api_url: Option<&str>,
        allowed_users: Vec<String>,
    ) -> SlackConnector {
        SlackConnector {
            app_token: tokens.app_token,
            bot_token: tokens.bot_token,
            app_variable: tokens.app_variable,
            bot_variable: tokens.bot_variable,
            web: WebApi::new(api_url),
            identity: OnceCell::new(),
            names: Mutex::new(receive::Names::default()),
            allowed_users,
        }
    }

    /// The bot, from `auth.test` on the first call and cached after it.
    async fn identity(&self) -> Result<(Me, String), ConnectorError> {
        self.identity
            .get_or_try_init(|| async {
                let (auth, _) = self.auth_test().await.map_err(|error| match error {
                    CallError::Web(failure) => match bot_token_refusal(&failure) {
                        Some(refusal) => ConnectorError::Unauthorized {
                            message: format!("{refusal} ({})", self.bot_variable),
                        },
                        None => ConnectorError::Disconnected {
                            message: format!("auth.test: {failure}"),
                        },
                    },
                    CallError::Unanswered(failure) => ConnectorError::Disconnected {
                        message: format!("auth.test: {failure}"),
                    },
                })?;
                Ok((auth.me(), account(&auth)))
            })
            .await
            .cloned()
    }

    /// `auth.test` with the bot token: who it is, and its scopes when Slack listed them.
    async fn auth_test(&self) -> Result<(AuthTest, Option<String>), CallError> {
        let called = self
            .web
            .call_listing_scopes(&self.bot_token, "auth.test", &[], None)
            .await?;
        let auth = serde_json::from_value(called.body).map_err(|error| {
            CallError::Web(WebFailure::Unreadable {
                reason: error.to_string(),
            })
        })?;
        Ok((auth, called.scopes))
    }

    async fn send(&self, delivery: &Delivery, files: &[Upload]) -> Result<Receipt, DeliveryError> {
        let text = to_mrkdwn(&delivery.text);
        let text_first = !text.trim().is_empty() || files.is_empty();
        // A wait the pace asks for before anything is sent is the worker's to take, as a rate
        // limit: the outbox then records the delivery as not sent while it waits, and a crash
        // during the wait resends it instead of leaving it unknown.
        let first_wait = if text_first {
            self.web
                .wait_before("chat.postMessage", Some(&delivery.room))
        } else {
            self.web.wait_before("files.getUploadURLExternal", None)
        };
        if !first_wait.is_zero() {
            return Err(DeliveryError::RateLimited {
                retry_after: first_wait,
            });
        }
        let receipt = if !text_first {
            None
        } else {
            Some(self.post_text(delivery, &text).await?)
        };
        if files.is_empty() {
            return receipt.ok_or_else(|| DeliveryError::Rejected {
                message: "nothing to send".to_owned(),
            });
        }
        let shared = self.share_files(delivery, files).await;
        match (receipt, shared) {
            (Some(receipt), Ok(_)) => Ok(receipt),
            (None, Ok(first)) => Ok(Receipt {
                platform_id: format!("{}:file:{first}", delivery.room),
            }),
            (None, Err(error)) => Err(error),
            (Some(_), Err(error)) => Err(DeliveryError::Failed {
                message: format!("the reply was posted, but not its files: {error}"),
            }),
        }
    }

    async fn post_text(&self, delivery: &Delivery, text: &str) -> Result<Receipt, DeliveryError> {
        let mut arguments = vec![("channel", delivery.room.as_str()), ("text", text)];
        if let Some(thread) = &delivery.thread {
            arguments.push(("thread_ts", thread.as_str()));
        }
        let posted = self
            .web
            .call(
                &self.bot_token,
                "chat.postMessage",
                &arguments,
                Some(&delivery.room),
            )
            .await
            .map_err(|error| self.delivery_error(error))?;
        let posted: Posted =
            serde_json::from_value(posted).map_err(|error| DeliveryError::Failed {
                message: format!("chat.postMessage answered, but not as documented: {error}"),
            })?;
        Ok(Receipt {
            platform_id: posted.platform_id(),
        })
    }

    /// Uploads `files` (`files.getUploadURLExternal`, then each file's bytes) and shares them
    /// in the delivery's room and thread with `files.completeUploadExternal`; the first file's
    /// id.
    async fn share_files(
        &self,
        delivery: &Delivery,
        files: &[Upload],
    ) -> Result<String, DeliveryError> {
        let mut uploaded = Vec::with_capacity(files.len());
        for file in files {
            let length = file.bytes.len().to_string();
            let slot = self
                .web
                .call(
                    &self.bot_token,
                    "files.getUploadURLExternal",
                    &[
                        ("filename", file.name.as_str()),
                        ("length", length.as_str()),
                    ],
                    None,
                )
                .await
                .map_err(|error| self.delivery_error(error))?;
            let slot: UploadUrl =
                serde_json::from_value(slot).map_err(|error| DeliveryError::Rejected {
                    message: format!(
                        "files.getUploadURLExternal answered, but not as documented: {error}"
                    ),
                })?;
            if !sends_token_to(self.web.base(), &slot.upload_url) {
                return Err(DeliveryError::Rejected {
                    message: "Slack's upload URL is not one of Slack's hosts".to_owned(),
                });
            }
            match self.web.upload(&slot.upload_url, &file.bytes).await {
                Ok(200..=299) => {}
                Ok(status) => {
                    return Err(DeliveryError::Rejected {
                        message: format!("uploading {} was answered with HTTP {status}", file.name),
                    });
                }
                Err(crate::model::NoAnswer::NotSent { detail }) => {
                    return Err(DeliveryError::NotSent { message: detail });
                }
                Err(error) => {
                    return Err(DeliveryError::Rejected {
                        message: format!("uploading {}: {error}", file.name),
                    });
                }
            }
            uploaded.push(serde_json::json!({"id": slot.file_id, "title": file.name}));
        }
        let listed = serde_json::Value::Array(uploaded).to_string();
        let mut arguments = vec![
            ("files", listed.as_str()),
            ("channel_id", delivery.room.as_str()),
        ];
        if let Some(thread) = &delivery.thread {
            arguments.push(("thread_ts", thread.as_str()));
        }
        let completed = self
            .web
            .call(
                &self.bot_token,
                "files.completeUploadExternal",
                &arguments,
                Some(&delivery.room),
            )
            .await
            .map_err(|error| self.delivery_error(error))?;
        let completed: CompletedUpload =
            serde_json::from_value(completed).map_err(|error| DeliveryError::Failed {
                message: format!(
                    "files.completeUploadExternal answered, but not as documented: {error}"
                ),
            })?;
        completed
            .files
            .into_iter()
            .next()
            .map(|file| file.id)
            .ok_or_else(|| DeliveryError::Failed {
                message: "files.completeUploadExternal shared no file".to_owned(),
            })
    }

    fn delivery_error(&self, error: CallError) -> DeliveryError {
        use perch_core::delivery::AttemptFailure;
        match error {
            CallError::Web(failure) => {
                let message = match bot_token_refusal(&failure) {
                    Some(refusal) => format!("{refusal} ({})", self.bot_variable),
                    None => failure.to_string(),
                };
                match failure.delivery() {
                    AttemptFailure::RateLimited { retry_after } => {
                        DeliveryError::RateLimited { retry_after }
                    }
                    AttemptFailure::Rejected => DeliveryError::Rejected { message },
                    AttemptFailure::Failed => DeliveryError::Failed { message },
                    AttemptFailure::NotSent => DeliveryError::NotSent { message },
                }
            }
            CallError::Unanswered(crate::model::NoAnswer::NotSent { detail }) => {
                DeliveryError::NotSent { message: detail }
            }
            CallError::Unanswered(failure) => DeliveryError::Failed {
                message: failure.to_string(),
            },
        }
    }

    /// `auth.test` with the bot token, then `apps.connections.open` with the app-level token,
    /// whose URL is never connected to (Slack would hand that connection some of a running
    /// agent's events); then the bot token's scopes, as `auth.test`'s answer listed them,
    /// against the app manifest's.
    async fn check_tokens(&self) -> Result<Checked, CheckError> {
        let (auth, scopes) = self.auth_test().await.map_err(|error| {
            check_error(error, "auth.test", &self.bot_variable, bot_token_refusal)
        })?;
        self.web
            .call(&self.app_token, "apps.connections.open", &[], None)
            .await
            .map_err(|error| {
                check_error(
                    error,
                    "apps.connections.open",
                    &self.app_variable,
                    open_refusal,
                )
            })?;
        let scopes = match bot_scopes(scopes.as_deref()) {
            Scopes::Missing(missing) => {
                return Err(CheckError::Incomplete {
                    message: format!(
                        "auth.test: {} (the token in {})",
                        lacking(&missing),
                        self.bot_variable
                    ),
                    fix: missing_scopes_fix(&missing),
                });
            }
            Scopes::Complete => "it holds every bot scope of the app manifest",
            Scopes::Unseen => "could not see the token's scopes (Slack listed none)",
        };
        Ok(Checked {
            detail: format!(
                "auth.test: {} accepts the bot token for {}; {scopes}; apps.connections.open: \
                 {} is accepted for Socket Mode",
                self.bot_variable,
                account(&auth),
                self.app_variable
            ),
            verified: true,
        })
    }

    /// Downloads a file from its `url_private_download`, with the bot token only to Slack's
    /// hosts (a redirect elsewhere is followed without it), refusing past `limit` bytes.
    async fn download(&self, attachment: &Attachment, limit: u64) -> Result<Vec<u8>, FetchError> {
        if let Some(size) = attachment.size.filter(|size| *size > limit) {
            return Err(FetchError::TooLarge { size: Some(size) });
        }
        let failed = |message: String| FetchError::Failed { message };
        let mut url = attachment.source.clone();
        for _ in 0..=MAX_REDIRECTS {
            let token = sends_token_to(self.web.base(), &url).then_some(&self.bot_token);
            let answer = self
                .web
                .get(&url, token, usize::try_from(limit).unwrap_or(usize::MAX))
                .await
                .map_err(|error| match error {
                    crate::model::NoAnswer::TooLarge { size } => FetchError::TooLarge { size },
                    other => failed(self.clean(&other.to_string())),
                })?;
            match (answer.status, answer.location) {
                (200..=299, _) => return Ok(answer.body),
                (300..=399, Some(location)) => {
                    url = url::Url::parse(&url)
                        .and_then(|base| base.join(&location))
                        .map_err(|_| failed("Slack redirected the download nowhere".to_owned()))?
                        .to_string();
                }
                (status, _) => {
                    return Err(failed(format!("Slack answered HTTP {status} for the file")));
                }
            }
        }
        Err(failed(format!(
            "the download was redirected more than {MAX_REDIRECTS} times"
        )))
    }

    fn clean(&self, text: &str) -> String {
        let text = perch_core::redact::redact_slack_token(text, self.app_token.expose());
        perch_core::redact::redact_slack_token(&text, self.bot_token.expose())
    }
}

/// The bot as `perch status` shows it: `@name in Team (T…)`.
fn account(auth: &AuthTest) -> String {
    let user = auth.user.as_deref().unwrap_or(&auth.user_id);
    match &auth.team {
        Some(team) => format!("@{user} in {team} ({})", auth.team_id),
        None => format!("@{user} in {}", auth.team_id),
    }
}

fn check_error(
    error: CallError,
    method: &str,
    variable: &str,
    refusal: fn(&WebFailure) -> Option<String>,
) -> CheckError {
    match error {
        CallError::Web(failure) => match refusal(&failure) {
            Some(refusal) => CheckError::Refused {
                message: format!("{method}: {refusal} (the token in {variable})"),
            },
            None => CheckError::Failed {
                message: format!("{method}: {failure}"),
            },
        },
        CallError::Unanswered(crate::model::NoAnswer::NotSent { detail }) => {
            CheckError::Unreachable {
                message: format!("{method}: {detail}"),
            }
        }
        CallError::Unanswered(failure) => CheckError::Failed {
            message: format!("{method}: {failure}"),
        },
    }
}

impl Connector for SlackConnector {
    fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(self.receive_attempt(attempt))
    }

    fn post<'a>(
        &'a self,
        delivery: &'a Delivery,
        files: &'a [Upload],
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>> {
        Box::pin(self.send(delivery, files))
    }

    fn fetch<'a>(
        &'a self,
        _event: &'a InboundEvent,
        attachment: &'a Attachment,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(self.download(attachment, limit))
    }

    fn typing<'a>(&'a self, _room: &'a str, _thread: Option<&'a str>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn limits(&self) -> PlatformLimits {
        PlatformLimits {
            max_chars: MAX_CHARS,
            resend_window: None,
        }
    }

    fn check(&self) -> BoxFuture<'_, Result<Checked, CheckError>> {
        Box::pin(self.check_tokens())
    }
}
