//! Chat channels: connections to Discord, Telegram, Matrix and Slack behind one [`Connector`] trait
//! (the effect boundary for chat platforms), each in its own module, the only one that names its
//! SDK.
//!
//! Rust owns the sockets: a connector receives events and hands each to perch, waiting until perch
//! has journaled it before it confirms the event to the platform; it delivers replies perch has
//! recorded in its outbox, with the workspace files they attach. An event names its files as
//! [`Attachment`] references; the connector downloads one when perch asks ([`Connector::fetch`]).
//! Filtering, routing and formatting happen in the channel's Lua hooks, not here.

pub mod discord;
pub mod hooks;
pub mod matrix;
pub mod slack;
pub mod telegram;

pub use perch_core::admission::Gate;
pub use perch_core::attachment::{Attachment, OutboundFile};
pub use perch_core::journal::event::{
    InboundEvent, QUOTE_MAX_CHARS, QUOTE_NAME_MAX_CHARS, Quote, Sender, shortened,
};
pub use perch_core::journal::outbox::{Delivery, Receipt};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// A boxed future, so that [`Connector`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The bytes of one file a delivery attaches, read from the workspace.
#[derive(Clone, PartialEq, Eq)]
pub struct Upload {
    /// The file name shown on the platform.
    pub name: String,
    /// The MIME type, from the name's extension.
    pub content_type: String,
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Upload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upload")
            .field("name", &self.name)
            .field("content_type", &self.content_type)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Why an attachment could not be fetched. Never holds a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The file is larger than the limit asked for; its size when known.
    TooLarge { size: Option<u64> },
    /// The platform or the network failed, or the reference is no longer valid.
    Failed { message: String },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::TooLarge { size: Some(size) } => write!(f, "too large ({size} bytes)"),
            FetchError::TooLarge { size: None } => f.write_str("too large"),
            FetchError::Failed { message } => write!(f, "the download failed: {message}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryError {
    /// The platform asked to wait.
    RateLimited { retry_after: Duration },
    /// The platform refused this message for good (too long, no access, unknown room).
    Rejected { message: String },
    /// The request failed; whether the message was posted is unknown.
    Failed { message: String },
    /// The request never reached the platform (no connection could be made), so the message
    /// was certainly not posted and may be sent again, even where there is no idempotency.
    NotSent { message: String },
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryError::RateLimited { retry_after } => {
                write!(
                    f,
                    "rate limited; retry after {} s",
                    retry_after.as_secs_f64()
                )
            }
            DeliveryError::Rejected { message } => write!(f, "rejected: {message}"),
            DeliveryError::Failed { message } => write!(f, "failed: {message}"),
            DeliveryError::NotSent { message } => write!(f, "not sent: {message}"),
        }
    }
}

/// What [`Connector::check`] found when the platform answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// What answered and for which account; never a credential.
    pub detail: String,
    /// The credentials were verified; `false` when only the platform was (a Matrix account
    /// that has not logged in yet, whose password only a new login could test).
    pub verified: bool,
}

/// Why [`Connector::check`] failed. Never holds a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckError {
    /// The platform refused the credentials (401, 403, an unknown token).
    Refused { message: String },
    /// The platform could not be reached: no route, connection refused, DNS, TLS.
    Unreachable { message: String },
    /// The platform answered, but not as the check needs (a server error, not the platform's
    /// API at that URL).
    Failed { message: String },
    /// The credentials were accepted, but lack what perch needs (a Slack bot token without
    /// some of the manifest's scopes); `fix` is the platform's own remedy.
    Incomplete { message: String, fix: String },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Refused { message } => write!(f, "refused: {message}"),
            CheckError::Unreachable { message } => write!(f, "unreachable: {message}"),
            CheckError::Failed { message } => write!(f, "failed: {message}"),
            CheckError::Incomplete { message, .. } => write!(f, "incomplete: {message}"),
        }
    }
}

/// Why a connection stopped. Never holds a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectorError {
    /// The credentials were refused; reconnecting will not help.
    Unauthorized { message: String },
    /// The connection failed or dropped; reconnect with backoff.
    Disconnected { message: String },
}

impl fmt::Display for ConnectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectorError::Unauthorized { message } => write!(f, "unauthorized: {message}"),
            ConnectorError::Disconnected { message } => write!(f, "disconnected: {message}"),
        }
    }
}

/// A connector could not be built from its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupError {
    /// What is wrong, naming the setting and what to change; never holds a credential.
    pub message: String,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SetupError {}

/// What a platform allows, for splitting and resending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlatformLimits {
    /// The longest message, in characters (Discord 2,000, Telegram 4,096; Matrix counts bytes
    /// of the event, so its connector gives a safe character count).
    pub max_chars: usize,
    /// How long after a failed send the same delivery id may be sent again and the platform
    /// will drop a duplicate; `None` when the platform has no idempotency (Telegram).
    pub resend_window: Option<Duration>,
}

/// An event handed to perch, and the signal that it is journaled: the connector confirms the
/// event to the platform (or advances its cursor) only after `journaled` fires.
#[derive(Debug)]
pub struct Arrival {
    pub event: InboundEvent,
    pub journaled: oneshot::Sender<()>,
}

/// Whether a connector's receive loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Go,
    Stop,
}

/// Hands `event` to perch through `inbound` and waits until it is journaled: [`Step::Go`] once
/// it is, [`Step::Stop`] when `cancel` fires first; an error when perch stopped taking events
/// before journaling it.
async fn hand_over(
    inbound: &mpsc::Sender<Arrival>,
    cancel: &CancellationToken,
    event: InboundEvent,
) -> Result<Step, ConnectorError> {
    let (journaled, ack) = oneshot::channel();
    let arrival = Arrival { event, journaled };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Ok(Step::Stop),
        handed = async {
            inbound.send(arrival).await.map_err(|_| ())?;
            ack.await.map_err(|_| ())
        } => match handed {
            Ok(()) => Ok(Step::Go),
            Err(()) if cancel.is_cancelled() => Ok(Step::Stop),
            Err(()) => Err(ConnectorError::Disconnected {
                message: "perch stopped taking events before journaling this one".to_owned(),
            }),
        },
    }
}

/// The connector's side of one receive attempt's "up" signal: marked when the platform first
/// answered in this attempt (Telegram's `getMe` or first `getUpdates`, Discord's gateway READY,
/// Matrix's first sync), with the account the platform says perch is when it said. Marking
/// again does nothing.
#[derive(Debug, Clone)]
pub struct AttemptUp(std::sync::Arc<tokio::sync::watch::Sender<Option<Option<String>>>>);

/// The service's side of [`AttemptUp`].
#[derive(Debug)]
pub struct AttemptUpWait(tokio::sync::watch::Receiver<Option<Option<String>>>);

impl AttemptUp {
    /// A fresh signal for one receive attempt, and its waiting side.
    pub fn pair() -> (AttemptUp, AttemptUpWait) {
        let (up, wait) = tokio::sync::watch::channel(None);
        (AttemptUp(std::sync::Arc::new(up)), AttemptUpWait(wait))
    }

    pub fn mark(&self) {
        self.up(None);
    }

    /// Marks the attempt up, as `account` (the bot's `@username`, the user id): what the
    /// platform itself answered, never a credential.
    pub fn mark_as(&self, account: String) {
        self.up(Some(account));
    }

    fn up(&self, account: Option<String>) {
        self.0.send_if_modified(|up| {
            let first = up.is_none();
            if first {
                *up = Some(account);
            }
            first
        });
    }
}

impl AttemptUpWait {
    /// Resolves once the attempt is up, with the account it was marked as; never, when it
    /// ended without coming up.
    pub async fn wait(&mut self) -> Option<String> {
        let up = self
            .0
            .wait_for(Option::is_some)
            .await
            .map(|up| up.clone().flatten());
        match up {
            Ok(account) => account,
            Err(_) => std::future::pending().await,
        }
    }
}

/// What one receive attempt is given.
#[derive(Debug)]
pub struct ReceiveAttempt {
    /// The cursor of the last event perch journaled (see [`InboundEvent::cursor`]).
    pub resume: Option<String>,
    /// The `platform_id` of the last journaled event per room, for platforms that back-fill
    /// history after a start or reconnect.
    pub since: Vec<(String, String)>,
    /// Where every event goes.
    pub inbound: mpsc::Sender<Arrival>,
    /// Marked once the platform has answered in this attempt.
    pub up: AttemptUp,
    /// Ends the attempt.
    pub cancel: CancellationToken,
}

/// The one effect boundary for chat platforms.
pub trait Connector: Send + Sync + fmt::Debug {
    /// Receives until the attempt's `cancel` fires or the connection fails, handing every event
    /// to its `inbound`. Events may repeat; perch deduplicates by `platform_id`.
    fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>>;

    /// Posts one message with `files` (the delivery's attachments, read from the workspace)
    /// attached. With files, the platform may need several messages (text, then each file); the
    /// receipt names the first.
    fn post<'a>(
        &'a self,
        delivery: &'a Delivery,
        files: &'a [Upload],
    ) -> BoxFuture<'a, Result<Receipt, DeliveryError>>;

    /// Downloads `attachment` of `event`, refusing with [`FetchError::TooLarge`] as soon as it
    /// is known to be over `limit` bytes.
    fn fetch<'a>(
        &'a self,
        event: &'a InboundEvent,
        attachment: &'a Attachment,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>>;

    /// Shows a typing indicator in the room for the platform's usual few seconds.
    fn typing<'a>(&'a self, room: &'a str, thread: Option<&'a str>) -> BoxFuture<'a, ()>;

    fn limits(&self) -> PlatformLimits;

    /// Gives the connector the part of admission it applies itself before it asks its platform
    /// anything more about a message (see [`Gate`]): called when the service starts and
    /// whenever pairing approves a sender. Connectors whose platforms deliver everything with
    /// the message (Telegram, Discord) have no use for it.
    fn gate(&self, _gate: Gate) {}

    /// Checks that the platform answers and accepts the credentials, with one authenticated
    /// read and nothing else: no receiving, no posting, no new login (`perch doctor --online`).
    fn check(&self) -> BoxFuture<'_, Result<Checked, CheckError>> {
        Box::pin(async {
            Err(CheckError::Failed {
                message: "this connector has no online check".to_owned(),
            })
        })
    }
}

/// What to check when a platform refuses a channel's credentials: `check TELEGRAM_TOKEN, which
/// channels/tg.lua names`.
pub fn credentials_fix(channel: &crate::agent::LoadedChannel) -> String {
    format!(
        "check {}, which {} names",
        credential_variables(channel),
        channel.file
    )
}

/// The environment variables a channel's credentials come from: `TELEGRAM_TOKEN`, or
/// `MATRIX_PASSWORD and MATRIX_STORE_PASSPHRASE`.
pub fn credential_variables(channel: &crate::agent::LoadedChannel) -> String {
    channel
        .config
        .platform
        .credentials()
        .iter()
        .map(|(_, reference)| reference.name().to_string())
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Where a channel connects: its `api_url` or the platform's own (Telegram, Discord, Slack), or its
/// homeserver (Matrix). Never holds a credential.
pub fn endpoint(config: &perch_core::config::ChannelConfig) -> String {
    use perch_core::config::Platform;
    match &config.platform {
        Platform::Matrix { homeserver, .. } => homeserver.clone(),
        Platform::Telegram { .. } => config
            .api_url
            .clone()
            .unwrap_or_else(|| "https://api.telegram.org".to_owned()),
        Platform::Discord { .. } => config
            .api_url
            .clone()
            .unwrap_or_else(|| "https://discord.com".to_owned()),
        Platform::Slack { .. } => config
            .api_url
            .clone()
            .unwrap_or_else(|| perch_core::slack::web::API_URL.to_owned()),
    }
}

/// The connector for a channel file, with its credentials read from the host environment.
/// A Matrix channel keeps its session and stores in the agent's
/// [`matrix_store_dir`](crate::agent::AgentDir::matrix_store_dir).
pub fn connect(
    channel: &crate::agent::LoadedChannel,
    agent: &crate::agent::AgentDir,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<std::sync::Arc<dyn Connector>, String> {
    use perch_core::config::Platform;
    let config = &channel.config;
    let missing = |error: perch_core::secret::MissingEnv| format!("{}: {error}", channel.file);
    match &config.platform {
        Platform::Telegram { token } => {
            let token = token.resolve(&lookup).map_err(missing)?;
            let connector = telegram::TelegramConnector::new(token, config.api_url.clone())
                .map_err(|error| format!("{}: {error}", channel.file))?;
            Ok(std::sync::Arc::new(connector))
        }
        Platform::Discord { token } => {
            let token = token.resolve(&lookup).map_err(missing)?;
            Ok(std::sync::Arc::new(discord::DiscordConnector::new(
                token,
                config.api_url.clone(),
            )))
        }
        Platform::Slack {
            app_token,
            bot_token,
        } => {
            let tokens = slack::SlackTokens {
                app_token: app_token.resolve(&lookup).map_err(missing)?,
                app_variable: app_token.name().to_string(),
                bot_token: bot_token.resolve(&lookup).map_err(missing)?,
                bot_variable: bot_token.name().to_string(),
            };
            Ok(std::sync::Arc::new(slack::SlackConnector::new(
                tokens,
                config.api_url.as_deref(),
                config.allow.users.clone(),
            )))
        }
        Platform::Matrix {
            homeserver,
            user,
            password,
            store_passphrase,
        } => {
            let password = password.resolve(&lookup).map_err(missing)?;
            let store_passphrase = store_passphrase.resolve(&lookup).map_err(missing)?;
            let connector = matrix::MatrixConnector::new(
                homeserver,
                user,
                password,
                store_passphrase,
                agent.matrix_store_dir(config.name.as_str()),
                config.allow.users.clone(),
            )
            .map_err(|error| format!("{}: {error}", channel.file))?;
            Ok(std::sync::Arc::new(connector))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortening_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(shortened("hello", 5), "hello");
        assert_eq!(shortened("hello!", 5), "hell…");
        assert_eq!(shortened("ééééé", 3), "éé…");
        assert_eq!(shortened("", 3), "");
        let long = "ü".repeat(1000);
        let quote = Quote::bounded(
            "1:2",
            Some(Sender {
                id: "7".into(),
                name: "n".repeat(500),
                is_bot: false,
            }),
            &long,
        );
        assert_eq!(quote.text.chars().count(), QUOTE_MAX_CHARS);
        assert!(quote.text.ends_with('…'));
        let author = quote.author.unwrap();
        assert_eq!(author.name.chars().count(), QUOTE_NAME_MAX_CHARS);
    }
}
