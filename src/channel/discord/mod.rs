//! Discord through serenity 0.12: the gateway for inbound messages, REST for replies, typing and
//! back-fill. The only module (this folder) that names serenity; inbound.rs reads a message as
//! perch journals it, errors.rs says what Discord's failures become.
//!
//! Inbound. One serenity client per connector owns the websocket and the heartbeats; it lives
//! across `receive` calls. serenity resumes after an op 7 or a dropped socket, and when a session
//! is lost its shard runner is replaced and identifies afresh; `receive` then re-attaches.
//! Events leave the runner through a collector, which the runner calls inline and in gateway
//! order (its event handlers run as spawned tasks and may overtake each other), so per-room order
//! holds. Each message is handed to perch and the next one waits until perch has journaled it.
//! A MESSAGE_UPDATE that edits someone else's message (it has `edited_timestamp` and content;
//! link previews send updates without) is handed on with the new text, named `<message
//! id>:edited:<edit time>`, with `edit_of` naming the message; perch journals it and does not
//! answer it. A reply quotes `referenced_message` (its author and text, bounded).
//!
//! After every READY and RESUMED (and on attaching to a runner that is already connected, or once a
//! runner attached to before it connected says it is, since it may have handled READY before it
//! added perch's collector), each room in `since`, plus each room seen during the call, is
//! back-filled with `GET /channels/{id}/messages?after=` from its last message, oldest first; perch
//! drops the duplicates by `platform_id`. A message in a room perch has never seen, sent while no
//! runner was connected, cannot be back-filled.
//!
//! Liveness: the gateway counts as alive when a dispatch arrives or the shard records a new
//! heartbeat round trip (serenity updates the shard's latency on every heartbeat ACK); REST
//! traffic never counts. After [`DEFAULT_LIVENESS`] (or [`DiscordConnector::with_liveness`])
//! without either, `receive` returns [`ConnectorError::Disconnected`] so perch backs off and
//! shows it; the client keeps reconnecting, and the next call attaches to it and back-fills.
//! Cancelling closes the client; a refused token or refused intents end it as
//! [`ConnectorError::Unauthorized`].
//!
//! Outbound. Every message carries the delivery id as its `nonce` with `enforce_nonce`, so a
//! resend inside Discord's deduplication window returns the first message instead of posting
//! twice, and an empty `allowed_mentions`, so no text can ping `@everyone`, `@here`, a role or
//! a user. A reply references the message it answers with `fail_if_not_exists: false`, so a
//! deleted original still gets its answer. Files go in the same message, as a multipart upload.
//!
//! Files. A message's attachments are handed on as [`Attachment`]s whose source is the
//! attachment's CDN URL; [`Connector::fetch`] downloads it without the bot token (the CDN needs
//! none), refusing a file whose size says it is too large and stopping a download that runs past
//! the limit.

mod errors;
mod inbound;

pub use errors::FALLBACK_RETRY_AFTER;

use super::{
    Arrival, Attachment, BoxFuture, CheckError, Checked, Connector, ConnectorError, Delivery,
    DeliveryError, FetchError, InboundEvent, PlatformLimits, Receipt, ReceiveAttempt, Step, Upload,
    hand_over,
};
use errors::{
    check_error, client_ended, connect_error, delivery_error, describe_download, disconnected,
};
use inbound::{edit_event, inbound_event};
use perch_core::secret::Secret;
use serenity::all::{
    Channel, ChannelId, ClientBuilder, CollectorCallback, ConnectionStage, CreateAllowedMentions,
    CreateAttachment, CreateMessage, Event, GatewayIntents, Http, HttpBuilder, HttpError,
    LightMethod, Message, MessageId, MessagePagination, MessageReference, MessageUpdateEvent,
    Nonce, ShardId, ShardManager, ShardRunnerMessage, UserId,
};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Discord's longest message content, in characters.
pub const MAX_CHARS: usize = 2000;

/// How long a resend with the same nonce is deduplicated. Discord documents `enforce_nonce` as
/// checking uniqueness "in the past few minutes" (Create Message, `enforce_nonce`) without a
/// figure; two minutes stays inside that with margin.
pub const RESEND_WINDOW: Duration = Duration::from_secs(120);

/// The default liveness timeout: about three of Discord's 41.25 s heartbeat intervals, so that
/// serenity's own missed-ACK check (one interval) and a resume get their chance first.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(120);

const PAGE: u8 = 100;
const ATTACH_POLL: Duration = Duration::from_millis(5);
/// How often a collector attached before its runner connected checks whether it has, in case
/// the runner handled READY before it added the collector.
const CATCH_UP_POLL: Duration = Duration::from_millis(50);
/// The longest wait between two liveness checks; a short liveness timeout is checked four times
/// as often as it lasts.
const WATCH_TICK_MAX: Duration = Duration::from_secs(5);
const SHARD: ShardId = ShardId(0);
const CLOSE_WAIT: Duration = Duration::from_secs(6);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a file download or a message with files may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(300);

/// A Discord bot connection.
pub struct DiscordConnector {
    token: Secret,
    api_url: Option<String>,
    client: Option<reqwest012::Client>,
    /// Downloads attachments from the CDN; it never carries the token.
    downloads: reqwest012::Client,
    http: Arc<Http>,
    notices: broadcast::Sender<RateNotice>,
    liveness: Duration,
    gateway: tokio::sync::Mutex<Option<Gateway>>,
}

impl fmt::Debug for DiscordConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordConnector")
            .field("api_url", &self.api_url)
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct RateNotice {
    path: String,
    post: bool,
    timeout: Duration,
}

impl DiscordConnector {
    /// A connection for the bot `token`. `api_url` replaces `https://discord.com` in every REST
    /// URL (an API proxy, or a local fake in tests); serenity's ratelimiter is then disabled,
    /// because it would send to discord.com regardless, and a 429 is reported with
    /// [`FALLBACK_RETRY_AFTER`]. Without it, requests go to Discord and serenity's ratelimiter
    /// tracks the buckets; whenever it would make a delivery wait (an exhausted bucket, a 429),
    /// the delivery returns [`DeliveryError::RateLimited`] with that wait instead.
    pub fn new(token: Secret, api_url: Option<String>) -> Self {
        let (notices, _) = broadcast::channel(64);
        let api_url = api_url.map(|url| url.trim_end_matches('/').to_owned());
        // One client, so one TLS configuration and root store, for REST and attachment
        // downloads: serenity's own default is this same client.
        let downloads = reqwest012::Client::builder()
            .use_rustls_tls()
            .build()
            .unwrap_or_default();
        let http = rest_http(&token, api_url.as_deref(), Some(&downloads), &notices);
        DiscordConnector {
            token,
            api_url,
            client: None,
            downloads,
            http: Arc::new(http),
            notices,
            liveness: DEFAULT_LIVENESS,
            gateway: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends REST requests through the HTTPS proxy at `proxy_url` (HTTP CONNECT), trusting the
    /// PEM certificates in `root_pem` besides the built-in roots. serenity's ratelimiter stays
    /// on; the gateway websocket still connects directly. Only in test builds (feature
    /// `discord-rest-proxy`): the tests reach a fake discord.com this way.
    #[cfg(feature = "discord-rest-proxy")]
    pub fn with_rest_proxy(mut self, proxy_url: &str, root_pem: &[u8]) -> Result<Self, String> {
        let proxy = reqwest012::Proxy::https(proxy_url)
            .map_err(|error| format!("the REST proxy URL is unusable: {error}"))?;
        let roots = reqwest012::Certificate::from_pem_bundle(root_pem)
            .map_err(|error| format!("the root certificates are not PEM: {error}"))?;
        let mut builder = reqwest012::Client::builder().use_rustls_tls().proxy(proxy);
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
        let client = builder
            .build()
            .map_err(|error| format!("the HTTP client could not be built: {error}"))?;
        self.http = Arc::new(rest_http(
            &self.token,
            self.api_url.as_deref(),
            Some(&client),
            &self.notices,
        ));
        self.downloads = client.clone();
        self.client = Some(client);
        Ok(self)
    }

    /// Replaces [`DEFAULT_LIVENESS`]: how long the gateway may go without a dispatch or a
    /// heartbeat ACK before the session counts as dead.
    pub fn with_liveness(mut self, liveness: Duration) -> Self {
        self.liveness = liveness;
        self
    }

    async fn session(
        &self,
        since: Vec<(String, String)>,
        inbound: mpsc::Sender<Arrival>,
        up: super::AttemptUp,
        cancel: CancellationToken,
    ) -> Result<(), ConnectorError> {
        let mut slot = tokio::select! {
            slot = self.gateway.lock() => slot,
            () = cancel.cancelled() => return Ok(()),
        };
        if slot
            .as_ref()
            .is_none_or(|gateway| gateway.started.is_finished())
        {
            if let Some(old) = slot.take() {
                old.stop();
            }
            let connected = tokio::select! {
                connected = tokio::time::timeout(REQUEST_TIMEOUT, self.connect()) => match connected {
                    Ok(connected) => connected?,
                    Err(_) => return Err(disconnected("Discord did not answer within 30 s")),
                },
                () = cancel.cancelled() => return Ok(()),
            };
            *slot = Some(connected);
        }
        let Some(gateway) = slot.as_mut() else {
            return Err(disconnected("the gateway client is missing"));
        };
        match self.follow(gateway, since, &inbound, &up, &cancel).await {
            Ok(()) => {
                if let Some(gateway) = slot.take() {
                    let _ = tokio::time::timeout(CLOSE_WAIT, gateway.stop()).await;
                }
                Ok(())
            }
            Err(Ended::Client(error)) => {
                if let Some(gateway) = slot.take() {
                    gateway.stop();
                }
                Err(error)
            }
            Err(Ended::Quiet(error)) => Err(error),
        }
    }

    async fn connect(&self) -> Result<Gateway, ConnectorError> {
        let user = self.http.get_current_user().await.map_err(connect_error)?;
        let (me, account) = (user.id, user.tag());
        let url = self.http.get_gateway().await.map_err(connect_error)?.url;
        let http = build_http(&self.token, self.api_url.as_deref(), self.client.as_ref());
        let mut client = ClientBuilder::new_with_http(http, intents())
            .await
            .map_err(connect_error)?;
        *client.ws_url.lock().await = url;
        let manager = Arc::clone(&client.shard_manager);
        let started = tokio::spawn(async move { client.start().await });
        Ok(Gateway {
            me,
            account,
            manager,
            started,
        })
    }

    /// Follows the client's current shard runner, re-attaching when serenity replaces it, until
    /// `cancel` fires, the client ends, or the watchdog finds the gateway silent.
    async fn follow(
        &self,
        gateway: &mut Gateway,
        since: Vec<(String, String)>,
        inbound: &mpsc::Sender<Arrival>,
        up: &super::AttemptUp,
        cancel: &CancellationToken,
    ) -> Result<(), Ended> {
        let mut rooms = Rooms::new(since);
        let handoff = Handoff {
            me: gateway.me,
            inbound,
            cancel,
        };
        let mut events: Option<mpsc::UnboundedReceiver<GatewayItem>> = None;
        let mut last_latency = None;
        let mut alive = Instant::now();
        let tick = (self.liveness / 4).clamp(Duration::from_millis(10), WATCH_TICK_MAX);
        let mut watch = tokio::time::interval(tick);
        watch.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut attach = tokio::time::interval(ATTACH_POLL);
        attach.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Whether the rooms were back-filled since the collector was attached with the runner
        // connected. A collector is added through the runner's queue, so a READY the runner
        // handles first is never seen; the runner's stage then says it is connected.
        let mut caught_up = false;
        let mut catch_up = tokio::time::interval(CATCH_UP_POLL);
        catch_up.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                ended = &mut gateway.started => return Err(Ended::Client(client_ended(ended))),
                item = next_item(&mut events) => match item {
                    None => {
                        events = None;
                        Ok(Step::Go)
                    }
                    Some(item) => {
                        alive = Instant::now();
                        match item {
                            GatewayItem::Ready | GatewayItem::Resumed => {
                                up.mark_as(gateway.account.clone());
                                caught_up = true;
                                self.backfill(&mut rooms, &handoff).await
                            }
                            GatewayItem::Message(message) => {
                                let direct = message.guild_id.is_none();
                                rooms.saw(&message, direct);
                                handoff.hand(&message, direct).await
                            }
                            GatewayItem::Edit(update) => match edit_event(&update, handoff.me) {
                                Some(event) => handoff.hand_event(event).await,
                                None => Ok(Step::Go),
                            },
                            GatewayItem::Other => Ok(Step::Go),
                        }
                    }
                },
                _ = attach.tick(), if events.is_none() => {
                    match attach_collector(&gateway.manager).await {
                        Some((receiver, true)) => {
                            events = Some(receiver);
                            up.mark_as(gateway.account.clone());
                            caught_up = true;
                            self.backfill(&mut rooms, &handoff).await
                        }
                        Some((receiver, false)) => {
                            events = Some(receiver);
                            caught_up = false;
                            Ok(Step::Go)
                        }
                        None => Ok(Step::Go),
                    }
                }
                _ = catch_up.tick(), if events.is_some() && !caught_up => {
                    let connected = gateway
                        .manager
                        .runners
                        .lock()
                        .await
                        .get(&SHARD)
                        .is_some_and(|runner| matches!(runner.stage, ConnectionStage::Connected));
                    if connected {
                        up.mark_as(gateway.account.clone());
                        caught_up = true;
                        self.backfill(&mut rooms, &handoff).await
                    } else {
                        Ok(Step::Go)
                    }
                }
                _ = watch.tick() => {
                    let latency = gateway
                        .manager
                        .runners
                        .lock()
                        .await
                        .get(&SHARD)
                        .and_then(|runner| runner.latency);
                    if latency.is_some() && latency != last_latency {
                        alive = Instant::now();
                    }
                    last_latency = latency;
                    if alive.elapsed() > self.liveness {
                        return Err(Ended::Quiet(disconnected(&format!(
                            "no gateway event or heartbeat ACK for {} s",
                            self.liveness.as_secs_f64()
                        ))));
                    }
                    Ok(Step::Go)
                }
            };
            match step {
                Ok(Step::Go) => {}
                Ok(Step::Stop) => return Ok(()),
                Err(error) => return Err(Ended::Client(error)),
            }
        }
    }

    async fn backfill(
        &self,
        rooms: &mut Rooms,
        handoff: &Handoff<'_>,
    ) -> Result<Step, ConnectorError> {
        for (room, mut after) in rooms.marks() {
            let direct = match rooms.direct.get(&room) {
                Some(direct) => *direct,
                None => match ask(handoff.cancel, self.http.get_channel(room)).await? {
                    Asked::Got(channel) => {
                        let direct = matches!(channel, Channel::Private(_));
                        rooms.direct.insert(room, direct);
                        direct
                    }
                    Asked::Gone => continue,
                    Asked::Stop => return Ok(Step::Stop),
                },
            };
            loop {
                let after_mark = Some(MessagePagination::After(after));
                let mut page = match ask(
                    handoff.cancel,
                    self.http.get_messages(room, after_mark, Some(PAGE)),
                )
                .await?
                {
                    Asked::Got(page) => page,
                    Asked::Gone => break,
                    Asked::Stop => return Ok(Step::Stop),
                };
                let full = page.len() >= usize::from(PAGE);
                page.sort_by_key(|message| message.id);
                for message in page {
                    after = after.max(message.id);
                    rooms.saw(&message, direct);
                    if let Step::Stop = handoff.hand(&message, direct).await? {
                        return Ok(Step::Stop);
                    }
                }
                if !full {
                    break;
                }
            }
        }
        Ok(Step::Go)
    }

    /// Downloads an attachment from its URL, stopping past `limit` bytes.
    async fn download(&self, attachment: &Attachment, limit: u64) -> Result<Vec<u8>, FetchError> {
        if let Some(size) = attachment.size.filter(|size| *size > limit) {
            return Err(FetchError::TooLarge { size: Some(size) });
        }
        let failed = |message: String| FetchError::Failed { message };
        let url = url::Url::parse(&attachment.source)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| failed("the attachment's URL is not an http(s) URL".into()))?;
        let fetched = async {
            let mut response = self
                .downloads
                .get(url)
                .send()
                .await
                .and_then(reqwest012::Response::error_for_status)
                .map_err(|error| failed(describe_download(error)))?;
            if let Some(size) = response.content_length().filter(|size| *size > limit) {
                return Err(FetchError::TooLarge { size: Some(size) });
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|error| failed(describe_download(error)))?
            {
                if (bytes.len() + chunk.len()) as u64 > limit {
                    return Err(FetchError::TooLarge { size: None });
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        };
        tokio::time::timeout(FILE_TIMEOUT, fetched)
            .await
            .unwrap_or_else(|_| {
                Err(failed(format!(
                    "the CDN did not send the file within {} s",
                    FILE_TIMEOUT.as_secs()
                )))
            })
    }

    async fn send(&self, delivery: &Delivery, files: &[Upload]) -> Result<Receipt, DeliveryError> {
        let room = delivery.thread.as_deref().unwrap_or(&delivery.room);
        let channel: ChannelId = room.parse().map_err(|_| DeliveryError::Rejected {
            message: format!("{room:?} is not a Discord channel id"),
        })?;
        let mut message = CreateMessage::new()
            .content(delivery.text.as_str())
            .allowed_mentions(CreateAllowedMentions::new())
            .nonce(Nonce::String(delivery.id.clone()))
            .enforce_nonce(true);
        if let Some(reply_to) = &delivery.reply_to {
            let original: MessageId = reply_to.parse().map_err(|_| DeliveryError::Rejected {
                message: format!("{reply_to:?} is not a Discord message id"),
            })?;
            let mut reference = MessageReference::from((channel, original));
            reference.fail_if_not_exists = Some(false);
            message = message.reference_message(reference);
        }
        let route = format!("/channels/{channel}/messages");
        let mut notices = self.notices.subscribe();
        let (post, timeout): (BoxFuture<'_, serenity::Result<Message>>, _) = if files.is_empty() {
            (
                Box::pin(self.http.send_message(channel, Vec::new(), &message)),
                REQUEST_TIMEOUT,
            )
        } else {
            let attachments = files
                .iter()
                .map(|file| CreateAttachment::bytes(file.bytes.clone(), file.name.clone()));
            (
                Box::pin(channel.send_message(self.http.as_ref(), message.files(attachments))),
                FILE_TIMEOUT,
            )
        };
        tokio::select! {
            posted = tokio::time::timeout(timeout, post) => match posted {
                Ok(Ok(posted)) => Ok(Receipt { platform_id: posted.id.to_string() }),
                Ok(Err(error)) => Err(delivery_error(error)),
                Err(_) => Err(DeliveryError::Failed {
                    message: format!("Discord did not answer within {} s; whether the message was posted is unknown", timeout.as_secs()),
                }),
            },
            retry_after = rate_notice(&mut notices, &route) => {
                Err(DeliveryError::RateLimited { retry_after })
            }
        }
    }
}

fn build_http(token: &Secret, api_url: Option<&str>, client: Option<&reqwest012::Client>) -> Http {
    let mut builder =
        HttpBuilder::new(token.expose()).default_allowed_mentions(CreateAllowedMentions::new());
    if let Some(client) = client {
        builder = builder.client(client.clone());
    }
    match api_url {
        Some(url) => builder.proxy(url).ratelimiter_disabled(true).build(),
        None => builder.build(),
    }
}

/// The REST client: [`build_http`] whose ratelimiter (when on) reports every wait it imposes, so
/// that a delivery can give up and say how long to wait.
fn rest_http(
    token: &Secret,
    api_url: Option<&str>,
    client: Option<&reqwest012::Client>,
    notices: &broadcast::Sender<RateNotice>,
) -> Http {
    let mut http = build_http(token, api_url, client);
    if let Some(ratelimiter) = http.ratelimiter.as_mut() {
        let sender = notices.clone();
        ratelimiter.set_ratelimit_callback(Box::new(move |info| {
            let _ = sender.send(RateNotice {
                path: info.path,
                post: matches!(info.method, LightMethod::Post),
                timeout: info.timeout,
            });
        }));
    }
    http
}

fn intents() -> GatewayIntents {
    GatewayIntents::GUILD_MESSAGES
        | GatewayIntents::DIRECT_MESSAGES
        | GatewayIntents::MESSAGE_CONTENT
}

impl Connector for DiscordConnector {
    fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(self.session(attempt.since, attempt.inbound, attempt.up, attempt.cancel))
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
        Box::pin(async move {
            if let Ok(channel) = thread.unwrap_or(room).parse::<ChannelId>() {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, self.http.broadcast_typing(channel))
                    .await;
            }
        })
    }

    fn limits(&self) -> PlatformLimits {
        PlatformLimits {
            max_chars: MAX_CHARS,
            resend_window: Some(RESEND_WINDOW),
        }
    }

    fn check(&self) -> BoxFuture<'_, Result<Checked, CheckError>> {
        Box::pin(async move {
            let me = self.http.get_current_user().await.map_err(check_error)?;
            Ok(Checked {
                detail: format!(
                    "GET /users/@me: the token is accepted for {} ({})",
                    me.name, me.id
                ),
                verified: true,
            })
        })
    }
}

enum GatewayItem {
    Ready,
    Resumed,
    Message(Box<Message>),
    Edit(Box<MessageUpdateEvent>),
    Other,
}

/// The last message id per room (the back-fill marks) and which rooms are direct messages.
struct Rooms {
    marks: BTreeMap<ChannelId, MessageId>,
    direct: HashMap<ChannelId, bool>,
}

impl Rooms {
    fn new(since: Vec<(String, String)>) -> Self {
        let marks = since
            .into_iter()
            .filter_map(|(room, last)| Some((room.parse().ok()?, last.parse().ok()?)))
            .collect();
        Rooms {
            marks,
            direct: HashMap::new(),
        }
    }

    fn marks(&self) -> Vec<(ChannelId, MessageId)> {
        self.marks
            .iter()
            .map(|(room, last)| (*room, *last))
            .collect()
    }

    fn saw(&mut self, message: &Message, direct: bool) {
        let mark = self.marks.entry(message.channel_id).or_insert(message.id);
        *mark = (*mark).max(message.id);
        self.direct.insert(message.channel_id, direct);
    }
}

struct Handoff<'a> {
    me: UserId,
    inbound: &'a mpsc::Sender<Arrival>,
    cancel: &'a CancellationToken,
}

impl Handoff<'_> {
    async fn hand(&self, message: &Message, direct: bool) -> Result<Step, ConnectorError> {
        let Some(event) = inbound_event(message, self.me, direct) else {
            return Ok(Step::Go);
        };
        self.hand_event(event).await
    }

    async fn hand_event(&self, event: InboundEvent) -> Result<Step, ConnectorError> {
        hand_over(self.inbound, self.cancel, event).await
    }
}

async fn next_item(
    events: &mut Option<mpsc::UnboundedReceiver<GatewayItem>>,
) -> Option<GatewayItem> {
    match events.as_mut() {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

/// Attaches a collector to the shard's current runner: the runner calls it inline for every
/// dispatch, in order. Also says whether READY has already gone past (the runner is connected).
async fn attach_collector(
    manager: &ShardManager,
) -> Option<(mpsc::UnboundedReceiver<GatewayItem>, bool)> {
    let runners = manager.runners.lock().await;
    let runner = runners.get(&SHARD)?;
    let (sender, receiver) = mpsc::unbounded_channel();
    runner
        .runner_tx
        .add_collector(CollectorCallback(Box::new(move |event| {
            let item = match event {
                Event::Ready(_) => GatewayItem::Ready,
                Event::Resumed(_) => GatewayItem::Resumed,
                Event::MessageCreate(created) => {
                    GatewayItem::Message(Box::new(created.message.clone()))
                }
                Event::MessageUpdate(updated) => GatewayItem::Edit(Box::new(updated.clone())),
                _ => GatewayItem::Other,
            };
            sender.send(item).is_ok()
        })));
    let connected = matches!(runner.stage, ConnectionStage::Connected);
    Some((receiver, connected))
}

/// A running serenity client: one per connector, kept across `receive` calls while serenity
/// reconnects by itself, replaced only once it has ended.
struct Gateway {
    me: UserId,
    /// The bot's account as Discord named it (`name#1234`, or `name` without a discriminator).
    account: String,
    manager: Arc<ShardManager>,
    started: JoinHandle<serenity::Result<()>>,
}

impl Gateway {
    /// Starts shutting the client down in the background; the handle finishes once it is down.
    fn stop(self) -> JoinHandle<()> {
        tokio::spawn(shut_down(self.manager))
    }
}

/// Why following the gateway stopped: the client is finished with (replace it), or the gateway
/// went quiet while serenity keeps reconnecting (keep it).
enum Ended {
    Client(ConnectorError),
    Quiet(ConnectorError),
}

impl Drop for DiscordConnector {
    fn drop(&mut self) {
        if let (Some(gateway), Ok(runtime)) = (
            self.gateway.get_mut().take(),
            tokio::runtime::Handle::try_current(),
        ) {
            runtime.spawn(shut_down(gateway.manager));
        }
    }
}

/// Shuts the shard manager down. `shutdown_all` does nothing while no runner is registered (a
/// restart in progress, a start being retried) and the shard queuer would then go on to start
/// one, so wait for a runner to appear, or for every other holder of the manager to be gone.
/// The runner is also told directly: after serenity restarts a runner, a stale "shutdown
/// finished" signal can make the manager forget the next runner without stopping it.
async fn shut_down(manager: Arc<ShardManager>) {
    loop {
        let runner = manager
            .runners
            .lock()
            .await
            .get(&SHARD)
            .map(|runner| runner.runner_tx.clone());
        if let Some(runner) = runner {
            runner.send_to_shard(ShardRunnerMessage::Shutdown(SHARD, 1000));
            manager.shutdown_all().await;
            return;
        }
        if Arc::strong_count(&manager) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn rate_notice(notices: &mut broadcast::Receiver<RateNotice>, route: &str) -> Duration {
    loop {
        match notices.recv().await {
            Ok(notice) if notice.post && notice.path.ends_with(route) => return notice.timeout,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// The outcome of one history request during back-fill.
enum Asked<T> {
    Got(T),
    /// The room is gone or no longer readable (403, 404): skip it.
    Gone,
    /// `receive` was cancelled meanwhile.
    Stop,
}

async fn ask<T>(
    cancel: &CancellationToken,
    request: impl std::future::Future<Output = serenity::Result<T>>,
) -> Result<Asked<T>, ConnectorError> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Ok(Asked::Stop),
        answer = tokio::time::timeout(REQUEST_TIMEOUT, request) => match answer {
            Ok(Ok(value)) => Ok(Asked::Got(value)),
            Ok(Err(serenity::Error::Http(HttpError::UnsuccessfulRequest(response))))
                if matches!(response.status_code.as_u16(), 403 | 404) =>
            {
                Ok(Asked::Gone)
            }
            Ok(Err(error)) => Err(connect_error(error)),
            Err(_) => Err(disconnected("Discord did not answer a history request within 30 s")),
        },
    }
}
