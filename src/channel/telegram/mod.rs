//! Telegram through the Bot API, with teloxide: the one module (this folder) that names it;
//! inbound.rs reads an update as perch journals it.
//!
//! Receiving does not use teloxide's dispatcher or polling, which confirm updates by themselves.
//! It calls `getUpdates` directly, starting at the update after the cursor perch journaled last,
//! hands each message to perch and moves its offset past an update only once perch has
//! journaled it. Telegram confirms an update when a later `getUpdates` names a higher offset, so
//! nothing perch has not journaled is ever confirmed, and a restart from perch's cursor neither
//! replays nor loses a message.
//!
//! Only `message` and `edited_message` updates are requested. An edit is handed on with its new
//! text, named `<chat id>:<message id>:edited:<edit date>`, with `edit_of` naming the message;
//! perch journals it and does not answer it. A reply quotes `reply_to_message` (its author and
//! text, bounded). Channel posts and every other kind of update are not received; an update
//! teloxide cannot parse is skipped. A message with neither
//! text, caption nor file (a sticker, a service message) is skipped too.
//!
//! Files. A document, a photo (its largest size), an audio file, a video or a voice note is
//! handed on as an [`Attachment`] whose source is the Telegram file id; the caption is the
//! text. [`Connector::fetch`] asks `getFile` for the file's path and downloads it, refusing a
//! file whose size says it is too large before downloading and stopping a download that runs
//! past the limit. The download URL holds the bot token, so it is never kept or shown.
//!
//! Replies are converted from Markdown to MarkdownV2 and sent again as plain text if Telegram
//! cannot parse the entities. A reply with files sends each with `sendDocument`, replying like
//! the text would; the text is the first file's caption when it fits Telegram's 1,024
//! characters, and a message of its own before the files otherwise. The bot token is part of
//! every request URL, and teloxide's errors can quote that URL, so every error text is redacted
//! before it leaves this module.

mod inbound;

pub use inbound::BotIdentity;

use super::{
    Arrival, Attachment, BoxFuture, CheckError, Checked, Connector, ConnectorError, Delivery,
    DeliveryError, FetchError, InboundEvent, PlatformLimits, Receipt, ReceiveAttempt, SetupError,
    Upload,
};
use inbound::{message_event, platform_id};
use perch_core::markdown::to_telegram_markdown_v2;
use perch_core::secret::Secret;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use teloxide::net::Download;
use teloxide::payloads::{
    GetUpdatesSetters, SendChatActionSetters, SendDocumentSetters, SendMessageSetters,
};
use teloxide::requests::{Request, Requester};
use teloxide::types::{
    AllowedUpdate, ChatAction, ChatId, FileId, InputFile, Message, MessageId, ParseMode, Recipient,
    ReplyParameters, ThreadId,
};
use teloxide::{ApiError, Bot, DownloadError, RequestError};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// How long one `getUpdates` call waits for an update before it returns empty, in seconds:
/// Telegram's longest, so an idle bot asks 1.2 times a minute.
const POLL_TIMEOUT_SECS: u32 = 50;
/// The HTTP client's timeout, which bounds a long poll: the poll with room for a slow network.
const POLL_HTTP_TIMEOUT: Duration = Duration::from_secs(65);
/// How long any other request (`getMe`, a send, a download) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(40);
/// How long a typing indicator request may take before it is given up.
const TYPING_TIMEOUT: Duration = Duration::from_secs(5);
/// Telegram's limit on a message's text, in characters after entity parsing.
const MAX_CHARS: usize = 4096;
/// Telegram's limit on a caption, in characters after entity parsing.
const MAX_CAPTION: usize = 1024;
/// The longest error text passed on, in characters (a server's error page can be huge).
const MESSAGE_LIMIT: usize = 400;

/// A connection to one Telegram bot.
pub struct TelegramConnector {
    bot: Bot,
    identity: OnceCell<BotIdentity>,
}

impl fmt::Debug for TelegramConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelegramConnector")
            .field("api_url", &self.bot.api_url().as_str())
            .field("identity", &self.identity.get())
            .finish_non_exhaustive()
    }
}

impl TelegramConnector {
    /// A connector for the bot with `token`, talking to `api_url` (a Bot API server such as
    /// `http://127.0.0.1:8081`; Telegram's own when `None`). Nothing is sent until the first
    /// call; the bot's identity is fetched with `getMe` once and cached.
    pub fn new(token: Secret, api_url: Option<String>) -> Result<TelegramConnector, SetupError> {
        let client = teloxide::net::default_reqwest_settings()
            .timeout(POLL_HTTP_TIMEOUT)
            .build()
            .map_err(|error| SetupError {
                message: format!("cannot build the HTTP client for Telegram: {error}"),
            })?;
        let mut bot = Bot::with_client(token.expose().trim(), client);
        if let Some(api_url) = api_url {
            bot = bot.set_api_url(parse_api_url(&api_url)?);
        }
        Ok(TelegramConnector {
            bot,
            identity: OnceCell::new(),
        })
    }

    /// The bot's account, from `getMe` on the first call and cached after it.
    pub async fn identity(&self) -> Result<BotIdentity, ConnectorError> {
        self.identity
            .get_or_try_init(|| async {
                let me = within_request_timeout(self.bot.get_me().send())
                    .await
                    .map_err(|error| self.connector_error(error))?;
                Ok(BotIdentity {
                    id: me.user.id.0,
                    username: me.user.username.clone(),
                    name: me.user.full_name(),
                })
            })
            .await
            .cloned()
    }

    async fn poll(
        &self,
        resume: Option<String>,
        inbound: mpsc::Sender<Arrival>,
        up: super::AttemptUp,
        cancel: CancellationToken,
    ) -> Result<(), ConnectorError> {
        let mut offset = start_offset(resume.as_deref())?;
        let mut answered = self.identity.get().is_none();
        let me = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(()),
            me = self.identity() => me?,
        };
        // When `getMe` answered just now, the token works and the Bot API answers. With the
        // identity cached from an earlier attempt, the first `getUpdates` is a short poll, so
        // that its answer says the same at once.
        let account = me.account();
        if answered {
            up.mark_as(account.clone());
        }
        loop {
            let mut request = self
                .bot
                .get_updates()
                .timeout(if answered { POLL_TIMEOUT_SECS } else { 0 })
                .allowed_updates([AllowedUpdate::Message, AllowedUpdate::EditedMessage]);
            if let Some(offset) = offset {
                request = request.offset(offset);
            }
            // A long poll is bounded by the client's timeout; a short one, like any request.
            let sent = async {
                if answered {
                    request.send().await
                } else {
                    within_request_timeout(request.send()).await
                }
            };
            let result = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                result = sent => result,
            };
            let updates = match result {
                Ok(updates) => {
                    if !answered {
                        answered = true;
                        up.mark_as(account.clone());
                    }
                    updates
                }
                Err(RequestError::RetryAfter(wait)) => {
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => return Ok(()),
                        () = tokio::time::sleep(wait.duration()) => continue,
                    }
                }
                Err(error) => return Err(self.connector_error(error)),
            };
            let mut handed = Vec::with_capacity(updates.len());
            for update in &updates {
                let journaled = match message_event(update, &me) {
                    Some(event) => {
                        let (journaled, ack) = oneshot::channel();
                        let sent = tokio::select! {
                            biased;
                            () = cancel.cancelled() => return Ok(()),
                            sent = inbound.send(Arrival { event, journaled }) => sent,
                        };
                        if sent.is_err() {
                            return Ok(());
                        }
                        Some(ack)
                    }
                    None => None,
                };
                handed.push((update.id.0, journaled));
            }
            for (update_id, journaled) in handed {
                if let Some(ack) = journaled {
                    let acked = tokio::select! {
                        biased;
                        () = cancel.cancelled() => return Ok(()),
                        acked = ack => acked,
                    };
                    if acked.is_err() {
                        return Err(ConnectorError::Disconnected {
                            message: format!(
                                "perch did not journal Telegram update {update_id}; it will be received again"
                            ),
                        });
                    }
                }
                offset = Some(next_offset(update_id)?);
            }
        }
    }

    async fn send(&self, delivery: &Delivery, files: &[Upload]) -> Result<Receipt, DeliveryError> {
        let chat = parse_chat(&delivery.room)?;
        let thread = delivery.thread.as_deref().map(parse_thread).transpose()?;
        let reply = delivery
            .reply_to
            .as_deref()
            .map(|platform_id| reply_parameters(platform_id, chat))
            .transpose()?;
        if files.is_empty() {
            return self.send_text(chat, thread, reply, &delivery.text).await;
        }
        let caption = delivery.text.trim();
        let as_caption = caption.chars().count() <= MAX_CAPTION;
        let mut first = None;
        if !as_caption {
            first = Some(
                self.send_text(chat, thread, reply.clone(), &delivery.text)
                    .await?,
            );
        }
        for (index, file) in files.iter().enumerate() {
            let caption = (as_caption && index == 0 && !caption.is_empty()).then_some(caption);
            let sent = self
                .send_document(chat, thread, reply.clone(), file, caption)
                .await
                .map_err(|error| match (&first, error) {
                    (None, error) => error,
                    (Some(_), error) => DeliveryError::Failed {
                        message: format!(
                            "the reply was posted in part; then sending {}: {error}",
                            file.name
                        ),
                    },
                })?;
            first.get_or_insert(sent);
        }
        first.ok_or_else(|| DeliveryError::Rejected {
            message: "nothing to send".into(),
        })
    }

    async fn send_document(
        &self,
        chat: ChatId,
        thread: Option<ThreadId>,
        reply: Option<ReplyParameters>,
        file: &Upload,
        caption: Option<&str>,
    ) -> Result<Receipt, DeliveryError> {
        let request = |caption: Option<(String, Option<ParseMode>)>| {
            let document = InputFile::memory(file.bytes.clone()).file_name(file.name.clone());
            let mut request = self.bot.send_document(chat, document);
            if let Some((caption, parse_mode)) = caption {
                request = request.caption(caption);
                if let Some(parse_mode) = parse_mode {
                    request = request.parse_mode(parse_mode);
                }
            }
            if let Some(thread) = thread {
                request = request.message_thread_id(thread);
            }
            if let Some(reply) = reply.clone() {
                request = request.reply_parameters(reply);
            }
            within_request_timeout(request.send())
        };
        let formatted =
            caption.map(|text| (to_telegram_markdown_v2(text), Some(ParseMode::MarkdownV2)));
        let sent = match request(formatted).await {
            Err(RequestError::Api(ApiError::CantParseEntities(_))) => {
                request(caption.map(|text| (text.to_owned(), None))).await
            }
            other => other,
        };
        self.receipt(sent)
    }

    async fn send_text(
        &self,
        chat: ChatId,
        thread: Option<ThreadId>,
        reply: Option<ReplyParameters>,
        text: &str,
    ) -> Result<Receipt, DeliveryError> {
        let formatted = to_telegram_markdown_v2(text);
        let sent = match self
            .send_message(
                chat,
                formatted,
                Some(ParseMode::MarkdownV2),
                thread,
                reply.clone(),
            )
            .await
        {
            Err(RequestError::Api(ApiError::CantParseEntities(_))) => {
                self.send_message(chat, text.to_owned(), None, thread, reply)
                    .await
            }
            other => other,
        };
        self.receipt(sent)
    }

    async fn send_message(
        &self,
        chat: ChatId,
        text: String,
        parse_mode: Option<ParseMode>,
        thread: Option<ThreadId>,
        reply: Option<ReplyParameters>,
    ) -> Result<Message, RequestError> {
        let mut request = self.bot.send_message(chat, text);
        if let Some(parse_mode) = parse_mode {
            request = request.parse_mode(parse_mode);
        }
        if let Some(thread) = thread {
            request = request.message_thread_id(thread);
        }
        if let Some(reply) = reply {
            request = request.reply_parameters(reply);
        }
        within_request_timeout(request.send()).await
    }

    /// Downloads the file `attachment` names: `getFile` for its path, then the file itself,
    /// stopping past `limit` bytes.
    async fn download(&self, attachment: &Attachment, limit: u64) -> Result<Vec<u8>, FetchError> {
        if let Some(size) = attachment.size.filter(|size| *size > limit) {
            return Err(FetchError::TooLarge { size: Some(size) });
        }
        let file =
            within_request_timeout(self.bot.get_file(FileId(attachment.source.clone())).send())
                .await
                .map_err(|error| match error {
                    RequestError::Api(ApiError::Unknown(text)) if text.contains("too big") => {
                        FetchError::Failed {
                            message: "Telegram lets bots download files of up to 20 MB only".into(),
                        }
                    }
                    other => FetchError::Failed {
                        message: self.describe(&other),
                    },
                })?;
        if u64::from(file.meta.size) > limit {
            return Err(FetchError::TooLarge {
                size: Some(u64::from(file.meta.size)),
            });
        }
        let mut capped = Capped {
            bytes: Vec::new(),
            limit,
        };
        match within_request_timeout(self.bot.download_file(&file.path, &mut capped)).await {
            Ok(()) => Ok(capped.bytes),
            Err(DownloadError::Io(error)) if error.kind() == std::io::ErrorKind::FileTooLarge => {
                Err(FetchError::TooLarge { size: None })
            }
            Err(error) => Err(FetchError::Failed {
                message: self.describe(&error),
            }),
        }
    }

    async fn show_typing(&self, room: &str, thread: Option<&str>) {
        let Ok(chat) = parse_chat(room) else {
            return;
        };
        let mut request = self.bot.send_chat_action(chat, ChatAction::Typing);
        if let Some(Ok(thread)) = thread.map(parse_thread) {
            request = request.message_thread_id(thread);
        }
        let _ = tokio::time::timeout(TYPING_TIMEOUT, request.send()).await;
    }

    /// `getMe` with the token: Telegram answers with the bot's account only for a valid one.
    async fn check_token(&self) -> Result<Checked, CheckError> {
        let me = within_request_timeout(self.bot.get_me().send())
            .await
            .map_err(|error| self.check_error(error))?;
        let username = me
            .user
            .username
            .as_deref()
            .map_or_else(String::new, |name| format!("@{name} "));
        Ok(Checked {
            detail: format!(
                "getMe: the token is accepted for {username}({})",
                me.user.full_name()
            ),
            verified: true,
        })
    }

    fn check_error(&self, error: RequestError) -> CheckError {
        match error {
            RequestError::Api(ApiError::InvalidToken) => CheckError::Refused {
                message: "Telegram refused the bot token (getMe); check it with @BotFather"
                    .to_owned(),
            },
            RequestError::Network(error) => CheckError::Unreachable {
                message: self.describe(&*error),
            },
            other => CheckError::Failed {
                message: self.describe(&other),
            },
        }
    }

    fn connector_error(&self, error: RequestError) -> ConnectorError {
        match error {
            RequestError::Api(ApiError::InvalidToken) => ConnectorError::Unauthorized {
                message: "Telegram refused the bot token; check it with @BotFather".to_owned(),
            },
            RequestError::Api(ApiError::TerminatedByOtherGetUpdates) => {
                ConnectorError::Disconnected {
                    message: "another getUpdates request for this bot took over: Telegram allows \
                              one poller per bot token, so stop the other program using it"
                        .to_owned(),
                }
            }
            RequestError::Api(ApiError::CantGetUpdates) => webhook_active(),
            RequestError::Api(ApiError::Unknown(text)) if text.contains("webhook is active") => {
                webhook_active()
            }
            other => ConnectorError::Disconnected {
                message: self.describe(&other),
            },
        }
    }

    /// The receipt of a message Telegram took, or what its refusal means.
    fn receipt(&self, sent: Result<Message, RequestError>) -> Result<Receipt, DeliveryError> {
        sent.map(|message| Receipt {
            platform_id: platform_id(&message),
        })
        .map_err(|error| self.delivery_error(error))
    }

    fn delivery_error(&self, error: RequestError) -> DeliveryError {
        match error {
            RequestError::RetryAfter(wait) => DeliveryError::RateLimited {
                retry_after: wait.duration(),
            },
            RequestError::MigrateToChatId(chat) => DeliveryError::Rejected {
                message: format!(
                    "the group became a supergroup with chat id {chat}; use that room id"
                ),
            },
            RequestError::Api(ApiError::Unknown(text)) => DeliveryError::Failed {
                message: self.redact(&text),
            },
            RequestError::Api(api) => DeliveryError::Rejected {
                message: self.redact(&api.to_string()),
            },
            RequestError::Network(error) if error.is_connect() => DeliveryError::NotSent {
                message: self.describe(&*error),
            },
            other => DeliveryError::Failed {
                message: self.describe(&other),
            },
        }
    }

    /// The error and its causes on one line, with the token removed.
    fn describe(&self, error: &(dyn std::error::Error + 'static)) -> String {
        self.redact(&perch_core::error_chain::on_one_line(error))
    }

    /// `text` without the token (or anything shaped like one), cut to [`MESSAGE_LIMIT`]
    /// characters.
    fn redact(&self, text: &str) -> String {
        let text = perch_core::redact::redact_telegram_token(text.trim(), self.bot.token());
        match text.char_indices().nth(MESSAGE_LIMIT) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text,
        }
    }
}

impl Connector for TelegramConnector {
    fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(self.poll(attempt.resume, attempt.inbound, attempt.up, attempt.cancel))
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

    fn typing<'a>(&'a self, room: &'a str, thread: Option<&'a str>) -> BoxFuture<'a, ()> {
        Box::pin(self.show_typing(room, thread))
    }

    fn limits(&self) -> PlatformLimits {
        PlatformLimits {
            max_chars: MAX_CHARS,
            resend_window: None,
        }
    }

    fn check(&self) -> BoxFuture<'_, Result<Checked, CheckError>> {
        Box::pin(self.check_token())
    }
}

/// A download's destination that refuses to grow past `limit` bytes.
struct Capped {
    bytes: Vec<u8>,
    limit: u64,
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        chunk: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let size = (self.bytes.len() + chunk.len()) as u64;
        if size > self.limit {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("the file is larger than {} bytes", self.limit),
            )));
        }
        self.bytes.extend_from_slice(chunk);
        Poll::Ready(Ok(chunk.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn webhook_active() -> ConnectorError {
    ConnectorError::Disconnected {
        message: "a webhook is set for this bot, and Telegram refuses getUpdates while one is; \
                  delete it with the deleteWebhook method"
            .to_owned(),
    }
}

fn parse_api_url(api_url: &str) -> Result<url::Url, SetupError> {
    let trimmed = api_url.trim().trim_end_matches('/');
    let invalid = |why: &str| SetupError {
        message: format!("the Telegram API URL {trimmed:?} is not usable: {why}"),
    };
    let url = url::Url::parse(trimmed).map_err(|error| invalid(&error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(invalid("it must be an http:// or https:// URL"));
    }
    Ok(url)
}

/// The offset of the first `getUpdates` call: the update after perch's cursor.
fn start_offset(resume: Option<&str>) -> Result<Option<i32>, ConnectorError> {
    let Some(cursor) = resume else {
        return Ok(None);
    };
    let update_id: u32 = cursor
        .trim()
        .parse()
        .map_err(|_| ConnectorError::Disconnected {
            message: format!("the resume cursor {cursor:?} is not a Telegram update id"),
        })?;
    next_offset(update_id).map(Some)
}

fn next_offset(update_id: u32) -> Result<i32, ConnectorError> {
    i32::try_from(u64::from(update_id) + 1).map_err(|_| ConnectorError::Disconnected {
        message: format!("Telegram update id {update_id} is out of range"),
    })
}

fn parse_chat(room: &str) -> Result<ChatId, DeliveryError> {
    room.trim()
        .parse()
        .map(ChatId)
        .map_err(|_| DeliveryError::Rejected {
            message: format!("{room:?} is not a Telegram chat id"),
        })
}

fn parse_thread(thread: &str) -> Result<ThreadId, DeliveryError> {
    thread
        .trim()
        .parse()
        .map(|id| ThreadId(MessageId(id)))
        .map_err(|_| DeliveryError::Rejected {
            message: format!("{thread:?} is not a Telegram message thread id"),
        })
}

/// Reply parameters for a `<chat id>:<message id>` platform id, naming the chat when it is not
/// the one the reply goes to.
fn reply_parameters(platform_id: &str, chat: ChatId) -> Result<ReplyParameters, DeliveryError> {
    let invalid = || DeliveryError::Rejected {
        message: format!("{platform_id:?} is not a Telegram message id (<chat id>:<message id>)"),
    };
    let (reply_chat, message) = platform_id.rsplit_once(':').ok_or_else(invalid)?;
    let reply_chat = ChatId(reply_chat.parse().map_err(|_| invalid())?);
    let message = MessageId(message.parse().map_err(|_| invalid())?);
    let mut parameters = ReplyParameters::new(message).allow_sending_without_reply();
    if reply_chat != chat {
        parameters = parameters.chat_id(Recipient::Id(reply_chat));
    }
    Ok(parameters)
}

/// `request`, given up after [`REQUEST_TIMEOUT`] with an I/O error that says so. The client's
/// own timeout is the long poll's, so every other request is bounded here.
async fn within_request_timeout<T, E: From<Arc<std::io::Error>>>(
    request: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .unwrap_or_else(|_| {
            Err(E::from(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "Telegram did not answer within {} s",
                    REQUEST_TIMEOUT.as_secs()
                ),
            ))))
        })
}

#[cfg(test)]
mod tests;
