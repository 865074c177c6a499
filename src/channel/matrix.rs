//! Matrix through matrix-sdk 0.18: the one module that names it.
//!
//! Session. The account logs in once; the session (user, device id, access token) is saved as
//! `session.json` (mode 0600) in the channel's store directory (mode 0700), next to matrix-sdk's
//! SQLite state and crypto stores, which are encrypted with the store passphrase. Every later
//! start restores that session instead of logging in again: a new login is a new device, which
//! would lose the encryption keys and Synapse's transaction-id deduplication. A store without
//! its session is useless (its crypto identity belongs to a device whose token is gone), so it
//! is cleared before a fresh login. The access token and the password never appear in an error.
//!
//! Inbound. `receive` drives `sync_once` in its own loop (`Client::sync` sleeps up to a second
//! between syncs) and reads each response's timelines in order; messages (`m.room.message`, not
//! the account's own) are handed to perch one at a time, each waiting until perch has journaled
//! it. Before anything about a message is asked of the homeserver, the channel's [`Gate`] (its
//! allowlists and the senders pairing approved, which the service hands over at start and after
//! each approval) pre-checks its room and sender: a message that admission would refuse whatever
//! a lookup found is handed on at once, with the reason in `refused` and only what the event
//! itself holds (no quote, the sender's localpart for a name, not direct), and perch journals it
//! refused. Only a message that may be admitted has the event it replies to fetched, its
//! sender's display name and its room's members looked up (an unknown sender's message in a room
//! that is not allowed is looked at only if the room turns out to be direct, for pairing). An
//! edit (`m.replace`) by the sender of the message it replaces (fetched, bounded like a quote) is
//! handed on with its new content and `edit_of` naming that message; perch journals it and does
//! not answer it; an edit by anyone else is refused, not recorded as an edit. A reply
//! (`m.in_reply_to`) has its plain reply fallback stripped and quotes the event it replies to,
//! fetched within 3 seconds (its id alone when the fetch fails or the event is over 64 KiB); the
//! quote is journaled with the message, so perch never fetches it again.
//!
//! matrix-sdk stores its sync token before the events are read, so a crash can leave events
//! behind that token which perch never journaled. Two things cover that: each
//! event carries as its cursor the sync token its batch was requested with, and the first sync
//! after a start or reconnect starts from perch's journaled cursor (`resume`), not from
//! matrix-sdk's (matrix-sdk ignores a response ending where its own token already is, so when
//! nothing newer has happened the rooms are read from that cursor with `/messages` instead);
//! and each room in `since` is back-filled from perch's last journaled event
//! (`/context`, then `/messages` forwards) instead of trusting the first sync's timeline. A
//! later timeline that the server cut short (`limited`) is back-filled the same way. With no
//! cursor anywhere (a fresh store, nothing journaled), the first sync is backlog and is
//! skipped, except for rooms perch has marks for. A room joined while running arrives with its
//! recent timeline, which is handed on (a direct message sent before the invite was accepted
//! gets its answer; perch's `max_age` marks old ones stale). perch deduplicates by event id, so
//! back-fill may repeat events.
//!
//! Files. An `m.file`, `m.image`, `m.audio` or `m.video` message is handed on with an
//! [`Attachment`] (its `mxc://` URI, name, type and size; its caption, if any, is the text). An
//! encrypted file's key is not put in the attachment, so it never reaches perch's journal:
//! [`Connector::fetch`] fetches the event again, reads the file's key from it, downloads the
//! file (capped at the limit as it arrives: a declared size is not trusted) and decrypts it.
//!
//! A message is `direct` in a room marked as a DM or with two joined members (counted from the
//! room summary or the stored members; asked of the homeserver only when neither knows), and
//! `addressed` when it mentions the account (`m.mentions`, its user id, or its display name as a
//! word) or replies to one of its events; an `m.notice` counts as sent by a bot, and perch posts
//! `m.notice`s.
//!
//! Encryption. matrix-sdk decrypts timeline events with the keys in the crypto store. An event
//! it cannot decrypt is not dropped: it is logged, kept in a report
//! ([`MatrixConnector::undecryptable`], also saved as `undecryptable.json` for `perch status`),
//! and, while the same `receive` runs, decrypted again when later syncs bring new keys, at
//! which point it is handed on and leaves the report.
//!
//! Invites are accepted only from users in the channel's `allow.users`; other invites stay
//! pending (noted once) and are looked at again on the next start.
//!
//! Outbound. Replies are `m.text` with an HTML body rendered from the Markdown (plain only when
//! the HTML would not fit in one event), an `m.in_reply_to` relation (inside the thread when
//! there is one), and an empty `m.mentions`, so no reply pings anyone or the room. The transaction
//! id is the delivery id: the restored device makes the homeserver return the first event for a
//! resend instead of posting again. A reply's files are uploaded (encrypted in an encrypted room)
//! and each is posted as an `m.file` event after the text, with the same relations, under the
//! transaction id `<delivery id>-<n>`.
//!
//! Checking. [`Connector::check`] (`perch doctor --online`) asks the homeserver's
//! `/_matrix/client/versions` and, when a session is saved, `whoami` with its access token,
//! through the HTTP client matrix-sdk re-exports: restoring the session into a matrix-sdk client
//! would start its encryption tasks, and a login would be a new device. It reads the store
//! directory and changes nothing in it.

use super::{
    Arrival, Attachment, BoxFuture, CheckError, Checked, Connector, ConnectorError, Delivery,
    DeliveryError, FetchError, Gate, InboundEvent, PlatformLimits, Quote, Receipt, Sender, Upload,
};
use chrono::{DateTime, Utc};
use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::config::{RequestConfig, SyncSettings, SyncToken};
use matrix_sdk::deserialized_responses::{TimelineEvent, TimelineEventKind};
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::api::client::filter::FilterDefinition;
use matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter;
use matrix_sdk::ruma::api::error::{ErrorKind, RetryAfter};
use matrix_sdk::ruma::events::relation::{InReplyTo, Reply, Thread};
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::encrypted::OriginalSyncRoomEncryptedEvent;
use matrix_sdk::ruma::events::room::message::sanitize::remove_plain_reply_fallback;
use matrix_sdk::ruma::events::room::message::{FileInfo, FileMessageEventContent, FormattedBody};
use matrix_sdk::ruma::events::room::message::{
    MessageType, OriginalSyncRoomMessageEvent, Relation, RoomMessageEventContent,
    RoomMessageEventContentWithoutRelation, SyncRoomMessageEvent,
};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent, Mentions};
use matrix_sdk::ruma::serde::Raw;
use matrix_sdk::ruma::{
    EventId, MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedMxcUri, OwnedRoomId,
    OwnedTransactionId, OwnedUserId, RoomId, UInt, UserId,
};
use matrix_sdk::store::{RoomLoadSettings, StateStoreDataKey};
use matrix_sdk::sync::SyncResponse;
use matrix_sdk::{Client, Room, RoomState};
use perch_core::admission::Precheck;
use perch_core::redact::{REDACTED, redact_value};
use perch_core::secret::Secret;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{OnceCell, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// The longest reply piece, in characters. Synapse refuses events over 65,536 bytes; a piece
/// carries its text twice (plain and HTML), up to 4 bytes per character, and encryption adds a
/// third in base64. 10,000 characters fit in every case once the HTML is dropped for a piece
/// that would not fit with it (see [`CONTENT_BUDGET`]).
pub const MAX_CHARS: usize = 10_000;

/// How long a resend with the same transaction id is deduplicated. Synapse answers a repeated
/// `PUT /rooms/{room}/send/{type}/{txn}` from its HTTP transaction cache for at least 30 minutes
/// (`synapse/rest/client/transactions.py`, `CLEANUP_PERIOD`), and before creating an event it
/// looks the transaction id up per device in the `event_txn_id_device_id` table, which keeps
/// entries for 24 hours and survives a homeserver restart
/// (`synapse/handlers/message.py`, `get_event_id_from_transaction`;
/// `synapse/storage/databases/main/events_worker.py`, `_cleanup_old_transaction_ids`). The
/// shorter of the two, which other homeservers are likelier to match, is used.
pub const RESEND_WINDOW: Duration = Duration::from_secs(30 * 60);

/// The largest serialized message content sent with its HTML body, in bytes: encrypted, it
/// grows by a third and still fits in Synapse's 65,536-byte event limit with room for the
/// envelope. A bigger piece is sent as plain text; one that does not fit even so is refused.
pub const CONTENT_BUDGET: usize = 44_000;

const SESSION_FILE: &str = "session.json";
const UNDECRYPTABLE_FILE: &str = "undecryptable.json";
const STORE_FILE_PREFIX: &str = "matrix-sdk-";
const DEVICE_NAME: &str = "perch";
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const REQUEST_RETRIES: usize = 2;
const TIMELINE_LIMIT: u32 = 100;
const BACKFILL_PAGE: u32 = 100;
const BACKFILL_CONTEXT: u32 = 10;
const BACKFILL_PAGES: usize = 50;
const JOIN_ATTEMPTS: u32 = 3;
const JOIN_RETRY: Duration = Duration::from_millis(500);
const TYPING_TIMEOUT: Duration = Duration::from_secs(5);
const UNDECRYPTABLE_KEPT: usize = 100;
const OWN_EVENTS_KEPT: usize = 1000;
/// The longest error text passed on, in characters.
const MESSAGE_LIMIT: usize = 400;

/// The connector could not be built from its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupError {
    /// What is wrong, naming the setting.
    pub message: String,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SetupError {}

/// An event the account could not decrypt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undecryptable {
    /// The room id.
    pub room: String,
    pub event_id: String,
    /// The sender's user id.
    pub sender: String,
    /// matrix-sdk's reason, such as `MissingMegolmSession`.
    pub reason: String,
    /// When the homeserver says the event was sent.
    pub sent_at: DateTime<Utc>,
}

/// The undecryptable events of one Matrix channel.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UndecryptableReport {
    /// Every undecryptable event met since the store was created, including those decrypted
    /// later.
    pub total: u64,
    /// Those still undecryptable, newest last; at most the last 100.
    pub events: Vec<Undecryptable>,
}

/// The report a Matrix channel saved in `store_dir`, for `perch status`; empty when there is
/// none.
pub fn read_undecryptable(store_dir: &Path) -> UndecryptableReport {
    std::fs::read(store_dir.join(UNDECRYPTABLE_FILE))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// A connection to one Matrix account.
pub struct MatrixConnector {
    homeserver: String,
    user: OwnedUserId,
    password: Secret,
    store_passphrase: Secret,
    store_dir: PathBuf,
    allowed_inviters: HashSet<OwnedUserId>,
    client: OnceCell<Client>,
    state: Mutex<Shared>,
    synced: watch::Sender<bool>,
}

impl fmt::Debug for MatrixConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatrixConnector")
            .field("homeserver", &self.homeserver)
            .field("user", &self.user.as_str())
            .field("store_dir", &self.store_dir)
            .finish_non_exhaustive()
    }
}

/// What `receive` calls and `deliver` share: the account's recent events, for recognising
/// replies to it; the undecryptable report; the last event perch has per room, so that a
/// reconnect back-fills from there rather than from the marks perch passed at start.
#[derive(Default)]
struct Shared {
    own: VecDeque<OwnedEventId>,
    own_set: HashSet<OwnedEventId>,
    report: UndecryptableReport,
    noted_invites: HashSet<OwnedRoomId>,
    marks: HashMap<OwnedRoomId, OwnedEventId>,
    /// The part of admission applied before a message is looked up; until the service gives
    /// one, every message is looked up.
    gate: Option<Gate>,
}

impl Shared {
    fn remember_own(&mut self, event_id: OwnedEventId) {
        if self.own_set.insert(event_id.clone()) {
            self.own.push_back(event_id);
            while self.own.len() > OWN_EVENTS_KEPT {
                if let Some(old) = self.own.pop_front() {
                    self.own_set.remove(&old);
                }
            }
        }
    }
}

impl MatrixConnector {
    /// A connector for `user` (such as `@perch:example.org`) on `homeserver` (such as
    /// `https://matrix.example.org`), keeping its session and stores in `store_dir`
    /// (`.perch/matrix/<channel>`, see [`AgentDir::matrix_store_dir`](crate::agent::AgentDir::matrix_store_dir)). It joins rooms only when invited by one of
    /// `allowed_inviters` (Matrix user ids). Nothing is sent until the first call.
    pub fn new(
        homeserver: &str,
        user: &str,
        password: Secret,
        store_passphrase: Secret,
        store_dir: PathBuf,
        allowed_inviters: Vec<String>,
    ) -> Result<MatrixConnector, SetupError> {
        let homeserver = homeserver.trim().trim_end_matches('/').to_owned();
        let url = url::Url::parse(&homeserver).map_err(|error| SetupError {
            message: format!("the Matrix homeserver {homeserver:?} is not a URL: {error}"),
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(SetupError {
                message: format!(
                    "the Matrix homeserver {homeserver:?} must be an http:// or https:// URL"
                ),
            });
        }
        let user = parse_user(user).map_err(|message| SetupError { message })?;
        let allowed_inviters = allowed_inviters
            .iter()
            .map(|inviter| {
                parse_user(inviter).map_err(|message| SetupError {
                    message: format!("allow.users: {message}"),
                })
            })
            .collect::<Result<_, _>>()?;
        let report = read_undecryptable(&store_dir);
        Ok(MatrixConnector {
            homeserver,
            user,
            password,
            store_passphrase,
            store_dir,
            allowed_inviters,
            client: OnceCell::new(),
            state: Mutex::new(Shared {
                report,
                ..Shared::default()
            }),
            synced: watch::channel(false).0,
        })
    }

    /// The device this connector uses: the saved one, or a new one from a first login.
    pub async fn device_id(&self) -> Result<String, ConnectorError> {
        let client = self.client().await?;
        client
            .device_id()
            .map(ToString::to_string)
            .ok_or_else(|| disconnected("the Matrix client has no device after logging in"))
    }

    /// Resolves once the running `receive` has finished its first sync and back-fill: from then
    /// on every new message is handed on.
    pub async fn ready(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// The undecryptable events met so far, for `perch status`.
    pub fn undecryptable(&self) -> UndecryptableReport {
        self.shared().report.clone()
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn client(&self) -> Result<&Client, ConnectorError> {
        self.client.get_or_try_init(|| self.open()).await
    }

    async fn open(&self) -> Result<Client, ConnectorError> {
        let store = self.store_dir.clone();
        let saved = tokio::task::spawn_blocking(move || prepare_store(&store))
            .await
            .map_err(|error| disconnected(&format!("preparing the Matrix store failed: {error}")))?
            .map_err(|message| ConnectorError::Unauthorized { message })?;
        if let Some(session) = &saved
            && session.meta.user_id != self.user
        {
            return Err(ConnectorError::Unauthorized {
                message: format!(
                    "the session saved in {} is for {}, but the channel names {}; remove that \
                     directory to log in as {} with a new device",
                    self.store_dir.display(),
                    session.meta.user_id,
                    self.user,
                    self.user
                ),
            });
        }
        let mut builder = Client::builder();
        if plain_http(&self.homeserver) {
            builder = builder.disable_built_in_root_certificates();
        }
        let client = builder
            .homeserver_url(&self.homeserver)
            .sqlite_store_with_config_and_cache_path(
                store_config(&self.store_dir, self.store_passphrase.expose()),
                None::<&Path>,
            )
            .request_config(
                RequestConfig::new()
                    .retry_limit(REQUEST_RETRIES)
                    .timeout(REQUEST_TIMEOUT),
            )
            .build()
            .await
            .map_err(|error| ConnectorError::Unauthorized {
                message: self.redact(&format!(
                    "cannot open the Matrix store in {} (a different store_passphrase than the \
                     one it was created with?): {error}",
                    self.store_dir.display()
                )),
            })?;
        match saved {
            Some(session) => client
                .matrix_auth()
                .restore_session(session, RoomLoadSettings::default())
                .await
                .map_err(|error| {
                    disconnected(
                        &self.redact(&format!("cannot restore the saved Matrix session: {error}")),
                    )
                })?,
            None => {
                client
                    .matrix_auth()
                    .login_username(self.user.as_str(), self.password.expose())
                    .initial_device_display_name(DEVICE_NAME)
                    .send()
                    .await
                    .map_err(|error| self.login_error(&error))?;
                let session = client
                    .matrix_auth()
                    .session()
                    .ok_or_else(|| disconnected("the Matrix login returned no session"))?;
                let path = self.store_dir.join(SESSION_FILE);
                tokio::task::spawn_blocking(move || write_private(&path, &session))
                    .await
                    .map_err(|error| disconnected(&format!("saving the session failed: {error}")))?
                    .map_err(|message| ConnectorError::Unauthorized { message })?;
            }
        }
        let store = self.store_dir.clone();
        let _ = tokio::task::spawn_blocking(move || restrict_files(&store)).await;
        Ok(client)
    }

    fn login_error(&self, error: &matrix_sdk::Error) -> ConnectorError {
        match error.client_api_error_kind() {
            Some(
                ErrorKind::Forbidden | ErrorKind::UserDeactivated | ErrorKind::InvalidUsername,
            ) => ConnectorError::Unauthorized {
                message: format!(
                    "the homeserver refused the login for {}; check the password the \
                         channel's env reference names",
                    self.user
                ),
            },
            _ => disconnected(&self.redact(&format!("the Matrix login failed: {error}"))),
        }
    }

    fn sync_error(&self, error: &matrix_sdk::Error) -> ConnectorError {
        match error.client_api_error_kind() {
            Some(ErrorKind::UnknownToken(_) | ErrorKind::MissingToken) => {
                ConnectorError::Unauthorized {
                    message: format!(
                        "the homeserver no longer accepts the saved session of {} (logged out, or \
                         its device was deleted); remove {} to log in again as a new device",
                        self.user,
                        self.store_dir.display()
                    ),
                }
            }
            Some(ErrorKind::UserDeactivated) => ConnectorError::Unauthorized {
                message: format!("the account {} is deactivated", self.user),
            },
            _ => disconnected(&self.redact(&format!("Matrix sync failed: {error}"))),
        }
    }

    /// `text` without the access token (the password travels only in the login body, which no
    /// error quotes), cut to [`MESSAGE_LIMIT`] characters.
    fn redact(&self, text: &str) -> String {
        let mut text = text.trim().to_owned();
        if let Some(token) = self.client.get().and_then(Client::access_token) {
            text = redact_value(&text, &token, REDACTED);
        }
        match text.char_indices().nth(MESSAGE_LIMIT) {
            Some((end, _)) => format!("{}…", &text[..end]),
            None => text,
        }
    }

    /// The homeserver's `/_matrix/client/versions`, then, when a session is saved, `whoami`
    /// with its access token. Never a login: a new login is a new device. The store directory
    /// is read, never changed, and matrix-sdk's stores are not opened.
    async fn check_account(&self) -> Result<Checked, CheckError> {
        let http = http_client(&self.homeserver)
            .build()
            .map_err(|error| CheckError::Failed {
                message: format!("cannot set up the HTTP client: {error}"),
            })?;
        let url = format!("{}/_matrix/client/versions", self.homeserver);
        let (status, versions) = check_get(&http, &url, None).await?;
        let newest = versions
            .get("versions")
            .and_then(serde_json::Value::as_array)
            .and_then(|versions| versions.iter().rev().find_map(serde_json::Value::as_str))
            .map(str::to_owned);
        let Some(newest) = newest.filter(|_| (200..300).contains(&status)) else {
            return Err(CheckError::Failed {
                message: format!(
                    "{url} answered {status} without a list of versions: is {} the homeserver's \
                     client-server API?",
                    self.homeserver
                ),
            });
        };
        let answers = format!("the homeserver answers (Matrix up to {newest})");
        let path = self.store_dir.join(SESSION_FILE);
        let session = match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice::<MatrixSession>(&bytes).map_err(|error| {
                CheckError::Failed {
                    message: format!(
                        "the saved Matrix session {} is unreadable ({error}); remove {} to log in \
                         again",
                        path.display(),
                        self.store_dir.display()
                    ),
                }
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checked {
                    detail: format!(
                        "{answers}; {} is not logged in yet: perch run logs in once and keeps \
                         the session",
                        self.user
                    ),
                    verified: false,
                });
            }
            Err(error) => {
                return Err(CheckError::Failed {
                    message: format!("cannot read {}: {error}", path.display()),
                });
            }
        };
        if session.meta.user_id != self.user {
            return Err(CheckError::Refused {
                message: format!(
                    "the session saved in {} is for {}, but the channel names {}",
                    self.store_dir.display(),
                    session.meta.user_id,
                    self.user
                ),
            });
        }
        let token = session.tokens.access_token.as_str();
        let scrub = |error: CheckError| match error {
            CheckError::Unreachable { message } => CheckError::Unreachable {
                message: redact_value(&message, token, REDACTED),
            },
            other => other,
        };
        let url = format!("{}/_matrix/client/v3/account/whoami", self.homeserver);
        let (status, whoami) = check_get(&http, &url, Some(token)).await.map_err(scrub)?;
        let text = |key: &str| {
            let value = whoami
                .get(key)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            redact_value(value, token, REDACTED)
        };
        match status {
            200..=299 if text("user_id") == self.user.as_str() => Ok(Checked {
                detail: format!(
                    "{answers}; whoami accepts the saved session of {} (device {})",
                    self.user, session.meta.device_id
                ),
                verified: true,
            }),
            200..=299 => Err(CheckError::Refused {
                message: format!(
                    "the saved session's access token belongs to {:?}, not {}",
                    text("user_id"),
                    self.user
                ),
            }),
            401 | 403 => Err(CheckError::Refused {
                message: format!(
                    "the homeserver no longer accepts the saved session of {} ({} {}: {}); \
                     remove {} to log in again as a new device",
                    self.user,
                    status,
                    text("errcode"),
                    text("error"),
                    self.store_dir.display()
                ),
            }),
            _ => Err(CheckError::Failed {
                message: format!(
                    "whoami answered {status}: {} {}",
                    text("errcode"),
                    text("error")
                ),
            }),
        }
    }

    async fn follow(
        &self,
        resume: Option<String>,
        since: Vec<(String, String)>,
        inbound: mpsc::Sender<Arrival>,
        up: super::AttemptUp,
        cancel: CancellationToken,
    ) -> Result<(), ConnectorError> {
        let client = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(()),
            client = self.client() => client?,
        };
        let me = client
            .user_id()
            .ok_or_else(|| disconnected("the Matrix client has no user after logging in"))?
            .to_owned();
        let stored = client
            .state_store()
            .get_kv_data(StateStoreDataKey::SyncToken)
            .await
            .ok()
            .flatten()
            .and_then(|value| value.into_sync_token());
        let mut session = Session {
            connector: self,
            client,
            me: Me {
                id: me,
                display_name: None,
            },
            handoff: Handoff {
                inbound: &inbound,
                cancel: &cancel,
            },
            marks: since
                .into_iter()
                .filter_map(|(room, event)| {
                    Some((RoomId::parse(room).ok()?, EventId::parse(event).ok()?))
                })
                .chain(self.shared().marks.clone())
                .collect(),
            pending: Vec::new(),
            cursor: None,
        };
        let settings = SyncSettings::new()
            .timeout(SYNC_TIMEOUT)
            .filter(sync_filter());
        self.synced.send_replace(false);
        let mut from = resume.clone().or_else(|| stored.clone());
        let mut first = true;
        loop {
            let request = match &from {
                Some(token) => settings.clone().token(token.clone()),
                None => settings.clone().token(SyncToken::NoToken),
            };
            let request = if first {
                request.timeout(Duration::ZERO)
            } else {
                request
            };
            let response = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                response = client.sync_once(request) => response,
            };
            let response = match response {
                Ok(response) => response,
                Err(error) if first && from == resume && resume.is_some() && is_refused(&error) => {
                    note(&format!(
                        "matrix: the homeserver refused perch's saved sync position ({}); \
                         continuing from the store's",
                        self.redact(&error.to_string())
                    ));
                    from = stored.clone();
                    continue;
                }
                Err(error) => return Err(self.sync_error(&error)),
            };
            session.cursor = from.clone();
            let batch = Batch {
                first,
                initial: from.is_none(),
                catch_up: from.clone().filter(|from| {
                    first
                        && stored.as_ref() == Some(&response.next_batch)
                        && stored.as_ref() != Some(from)
                }),
            };
            from = Some(response.next_batch.clone());
            let step = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                step = session.process(response, batch) => step?,
            };
            if let Step::Stop = step {
                return Ok(());
            }
            if first {
                self.synced.send_replace(true);
                up.mark();
                first = false;
            }
        }
    }

    /// Joins `room` if the invite came from an allowed user; notes other invites once.
    async fn consider_invite(&self, room: &Room) {
        let Ok(invite) = room.invite_details().await else {
            return;
        };
        if !self.allowed_inviters.contains(&invite.inviter_id) {
            let first_time = self
                .shared()
                .noted_invites
                .insert(room.room_id().to_owned());
            if first_time {
                note(&format!(
                    "matrix: not joining {}: invited by {}, who is not in the channel's allow.users",
                    room.room_id(),
                    invite.inviter_id
                ));
            }
            return;
        }
        for attempt in 1..=JOIN_ATTEMPTS {
            match room.join().await {
                Ok(()) => return,
                Err(error) if attempt == JOIN_ATTEMPTS => {
                    note(&self.redact(&format!(
                        "matrix: could not join {} (invited by {}): {error}",
                        room.room_id(),
                        invite.inviter_id
                    )));
                }
                Err(_) => tokio::time::sleep(JOIN_RETRY * attempt).await,
            }
        }
    }

    /// The gate's pre-check of a message from `sender` in `room`; with no gate yet, look.
    fn precheck(&self, sender: &UserId, sender_is_bot: bool, room: &RoomId) -> Precheck {
        self.shared().gate.as_ref().map_or(Precheck::Look, |gate| {
            gate.precheck(sender.as_str(), sender_is_bot, room.as_str())
        })
    }

    fn report_undecryptable(&self, entry: Undecryptable) {
        let (report, added) = {
            let mut shared = self.shared();
            let report = &mut shared.report;
            if report
                .events
                .iter()
                .any(|known| known.event_id == entry.event_id)
            {
                (report.clone(), false)
            } else {
                report.total += 1;
                report.events.push(entry.clone());
                let excess = report.events.len().saturating_sub(UNDECRYPTABLE_KEPT);
                report.events.drain(..excess);
                (report.clone(), true)
            }
        };
        if added {
            note(&format!(
                "matrix: cannot decrypt event {} in {} from {} ({}); reported in status",
                entry.event_id, entry.room, entry.sender, entry.reason
            ));
            self.save_report(&report);
        }
    }

    fn resolve_undecryptable(&self, event_id: &EventId) {
        let report = {
            let mut shared = self.shared();
            let before = shared.report.events.len();
            shared
                .report
                .events
                .retain(|known| known.event_id != event_id.as_str());
            (shared.report.events.len() != before).then(|| shared.report.clone())
        };
        if let Some(report) = report {
            self.save_report(&report);
        }
    }

    fn save_report(&self, report: &UndecryptableReport) {
        if let Err(message) = write_private(&self.store_dir.join(UNDECRYPTABLE_FILE), report) {
            note(&format!("matrix: {message}"));
        }
    }

    async fn send(&self, delivery: &Delivery, files: &[Upload]) -> Result<Receipt, DeliveryError> {
        let client = self.client().await.map_err(|error| DeliveryError::Failed {
            message: error.to_string(),
        })?;
        let room_id = RoomId::parse(&delivery.room).map_err(|_| DeliveryError::Rejected {
            message: format!("{:?} is not a Matrix room id", delivery.room),
        })?;
        let room = client
            .get_room(&room_id)
            .filter(|room| room.state() == RoomState::Joined)
            .ok_or_else(|| DeliveryError::Rejected {
                message: format!("{} has not joined the room {room_id}", self.user),
            })?;
        let mut first = None;
        if files.is_empty() || !delivery.text.trim().is_empty() {
            let content = message_content(delivery)?;
            first = Some(self.send_event(&room, content, &delivery.id).await?);
        }
        for (index, file) in files.iter().enumerate() {
            let content = self.file_content(client, &room, delivery, file).await?;
            let transaction = format!("{}-{}", delivery.id, index + 1);
            let sent = self.send_event(&room, content, &transaction).await?;
            first.get_or_insert(sent);
        }
        first.ok_or_else(|| DeliveryError::Rejected {
            message: "nothing to send".into(),
        })
    }

    async fn send_event(
        &self,
        room: &Room,
        content: RoomMessageEventContent,
        transaction: &str,
    ) -> Result<Receipt, DeliveryError> {
        let transaction = OwnedTransactionId::from(transaction);
        match room.send(content).with_transaction_id(transaction).await {
            Ok(sent) => {
                let event_id = sent.response.event_id;
                self.shared().remember_own(event_id.clone());
                Ok(Receipt {
                    platform_id: event_id.to_string(),
                })
            }
            Err(error) => Err(self.delivery_error(&error)),
        }
    }

    /// Uploads `file` (encrypted in an encrypted room) and makes its `m.file` event, with the
    /// delivery's relations and no mentions.
    async fn file_content(
        &self,
        client: &Client,
        room: &Room,
        delivery: &Delivery,
        file: &Upload,
    ) -> Result<RoomMessageEventContent, DeliveryError> {
        let relation = relation(delivery)?;
        let encrypted = room
            .latest_encryption_state()
            .await
            .map_err(|error| self.delivery_error(&error))?
            .is_encrypted();
        let source = if encrypted {
            let mut reader = std::io::Cursor::new(file.bytes.as_slice());
            let uploaded = client
                .upload_encrypted_file(&mut reader)
                .await
                .map_err(|error| self.delivery_error(&error))?;
            MediaSource::Encrypted(Box::new(uploaded))
        } else {
            let kind: mime::Mime = file
                .content_type
                .parse()
                .unwrap_or(mime::APPLICATION_OCTET_STREAM);
            let uploaded = client
                .media()
                .upload(&kind, file.bytes.clone(), None)
                .await
                .map_err(|error| self.delivery_error(&error))?;
            MediaSource::Plain(uploaded.content_uri)
        };
        let mut info = FileInfo::new();
        info.mimetype = Some(file.content_type.clone());
        info.size = UInt::new(file.bytes.len() as u64);
        let mut content = FileMessageEventContent::new(file.name.clone(), source);
        content.info = Some(Box::new(info));
        let mut content = RoomMessageEventContent::new(MessageType::File(content));
        content.mentions = Some(Mentions::new());
        content.relates_to = relation;
        Ok(content)
    }

    /// Downloads (and, if encrypted, decrypts) the file of `attachment`, refusing it past
    /// `limit` bytes.
    async fn download(
        &self,
        event: &InboundEvent,
        attachment: &Attachment,
        limit: u64,
    ) -> Result<Vec<u8>, FetchError> {
        if let Some(size) = attachment.size.filter(|size| *size > limit) {
            return Err(FetchError::TooLarge { size: Some(size) });
        }
        let failed = |message: String| FetchError::Failed { message };
        let client = self
            .client()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let source = if attachment.encrypted {
            let room = RoomId::parse(&event.room)
                .ok()
                .and_then(|room| client.get_room(&room))
                .ok_or_else(|| failed(format!("{} is not a room of this account", event.room)))?;
            let event_id = EventId::parse(&event.platform_id)
                .map_err(|_| failed(format!("{} is not an event id", event.platform_id)))?;
            let fetched = room
                .event(&event_id, None)
                .await
                .map_err(|error| failed(self.redact(&error.to_string())))?;
            let Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(
                SyncRoomMessageEvent::Original(message),
            ))) = fetched.raw().deserialize()
            else {
                return Err(failed(
                    "the message could not be decrypted again to read the file's key".into(),
                ));
            };
            media_source(&message.content.msgtype)
                .filter(|source| match source {
                    MediaSource::Encrypted(file) => file.url.as_str() == attachment.source,
                    MediaSource::Plain(_) => false,
                })
                .ok_or_else(|| failed("the message no longer names this file".into()))?
        } else {
            MediaSource::Plain(OwnedMxcUri::from(attachment.source.as_str()))
        };
        match source {
            MediaSource::Plain(uri) => self.download_capped(client, &uri, limit).await,
            MediaSource::Encrypted(file) => {
                let ciphertext = self.download_capped(client, &file.url, limit).await?;
                let info = matrix_sdk_base::crypto::MediaEncryptionInfo::from(*file);
                let mut plain = Vec::with_capacity(ciphertext.len());
                let mut cursor = std::io::Cursor::new(ciphertext);
                let decrypted =
                    matrix_sdk_base::crypto::AttachmentDecryptor::new(&mut cursor, info)
                        .map_err(|error| failed(format!("the file cannot be decrypted: {error}")))
                        .and_then(|decryptor| {
                            std::io::Read::read_to_end(
                                &mut std::io::Read::take(decryptor, limit + 1),
                                &mut plain,
                            )
                            .map_err(|error| {
                                failed(format!("the file cannot be decrypted: {error}"))
                            })
                        })?;
                if decrypted as u64 > limit {
                    return Err(FetchError::TooLarge { size: None });
                }
                Ok(plain)
            }
        }
    }

    /// [`download_capped`] with this account's homeserver and access token; errors redacted.
    async fn download_capped(
        &self,
        client: &Client,
        uri: &matrix_sdk::ruma::MxcUri,
        limit: u64,
    ) -> Result<Vec<u8>, FetchError> {
        download_capped(client.homeserver(), client.access_token(), uri, limit)
            .await
            .map_err(|error| match error {
                FetchError::Failed { message } => FetchError::Failed {
                    message: self.redact(&message),
                },
                other => other,
            })
    }

    fn delivery_error(&self, error: &matrix_sdk::Error) -> DeliveryError {
        let status = error
            .as_client_api_error()
            .map(|api| api.status_code.as_u16());
        match error.client_api_error_kind() {
            Some(ErrorKind::LimitExceeded(data)) => DeliveryError::RateLimited {
                retry_after: match &data.retry_after {
                    Some(RetryAfter::Delay(delay)) => *delay,
                    Some(RetryAfter::DateTime(at)) => at
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or(Duration::ZERO),
                    _ => Duration::from_secs(1),
                },
            },
            Some(ErrorKind::UnknownToken(_) | ErrorKind::MissingToken) | None => {
                DeliveryError::Failed {
                    message: self.redact(&error.to_string()),
                }
            }
            Some(_) if status.is_some_and(|status| (400..500).contains(&status)) => {
                DeliveryError::Rejected {
                    message: self.redact(&error.to_string()),
                }
            }
            Some(_) => DeliveryError::Failed {
                message: self.redact(&error.to_string()),
            },
        }
    }

    async fn show_typing(&self, room: &str) {
        let Some(client) = self.client.get() else {
            return;
        };
        let Ok(room_id) = RoomId::parse(room) else {
            return;
        };
        if let Some(room) = client.get_room(&room_id) {
            let _ = tokio::time::timeout(TYPING_TIMEOUT, room.typing_notice(true)).await;
        }
    }
}

impl Connector for MatrixConnector {
    fn receive<'a>(
        &'a self,
        resume: Option<String>,
        since: Vec<(String, String)>,
        inbound: mpsc::Sender<Arrival>,
        up: super::AttemptUp,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(self.follow(resume, since, inbound, up, cancel))
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
        event: &'a InboundEvent,
        attachment: &'a Attachment,
        limit: u64,
    ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
        Box::pin(self.download(event, attachment, limit))
    }

    fn typing<'a>(&'a self, room: &'a str, _thread: Option<&'a str>) -> BoxFuture<'a, ()> {
        Box::pin(self.show_typing(room))
    }

    fn limits(&self) -> PlatformLimits {
        PlatformLimits {
            max_chars: MAX_CHARS,
            resend_window: Some(RESEND_WINDOW),
        }
    }

    fn gate(&self, gate: Gate) {
        self.shared().gate = Some(gate);
    }

    fn check(&self) -> BoxFuture<'_, Result<Checked, CheckError>> {
        Box::pin(self.check_account())
    }
}

enum Step {
    Go,
    Stop,
}

struct Me {
    id: OwnedUserId,
    display_name: Option<String>,
}

struct Handoff<'a> {
    inbound: &'a mpsc::Sender<Arrival>,
    cancel: &'a CancellationToken,
}

impl Handoff<'_> {
    async fn hand(&self, event: InboundEvent) -> Result<Step, ConnectorError> {
        let (journaled, ack) = oneshot::channel();
        let arrival = Arrival { event, journaled };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Ok(Step::Stop),
            handed = async {
                self.inbound.send(arrival).await.map_err(|_| ())?;
                ack.await.map_err(|_| ())
            } => match handed {
                Ok(()) => Ok(Step::Go),
                Err(()) if self.cancel.is_cancelled() => Ok(Step::Stop),
                Err(()) => Err(disconnected(
                    "perch stopped taking events before journaling this one",
                )),
            },
        }
    }
}

/// How to read one sync response.
struct Batch {
    /// The first sync of this `receive` call.
    first: bool,
    /// Requested without a token: the backlog.
    initial: bool,
    /// matrix-sdk drops a response whose `next_batch` is the token it already has, so a first
    /// sync from perch's older cursor that brings nothing newer comes back empty: the joined
    /// rooms are then read from this token with `/messages` instead.
    catch_up: Option<String>,
}

/// An event that could not be decrypted yet, kept to try again when keys arrive.
struct Pending {
    room: OwnedRoomId,
    event_id: OwnedEventId,
    raw: Raw<AnySyncTimelineEvent>,
}

/// One `receive` call: the client, the back-fill marks, and the events waiting for keys.
struct Session<'a> {
    connector: &'a MatrixConnector,
    client: &'a Client,
    me: Me,
    handoff: Handoff<'a>,
    marks: HashMap<OwnedRoomId, OwnedEventId>,
    pending: Vec<Pending>,
    /// The sync token the current batch was requested with: syncing from it again delivers
    /// every event of the batch again.
    cursor: Option<String>,
}

impl Session<'_> {
    /// Reads one sync response: invites, then each joined room's timeline (or its back-fill),
    /// then another try at the events that could not be decrypted when keys have arrived.
    async fn process(
        &mut self,
        response: SyncResponse,
        batch: Batch,
    ) -> Result<Step, ConnectorError> {
        let Batch {
            first,
            initial,
            catch_up,
        } = batch;
        if first {
            self.me.display_name = self
                .client
                .account()
                .get_display_name()
                .await
                .ok()
                .flatten();
            for room in self.client.invited_rooms() {
                self.connector.consider_invite(&room).await;
            }
        } else {
            for room_id in response.rooms.invited.keys() {
                if let Some(room) = self.client.get_room(room_id) {
                    self.connector.consider_invite(&room).await;
                }
            }
        }
        let mut seen = HashSet::new();
        for (room_id, update) in response.rooms.joined {
            seen.insert(room_id.clone());
            let Some(room) = self.client.get_room(&room_id) else {
                continue;
            };
            let mark = self.marks.get(&room_id).cloned();
            let step = match mark {
                Some(after) if first || update.timeline.limited => {
                    self.backfill(&room, &after).await?
                }
                _ if initial => Step::Go,
                _ => self.take_all(&room, update.timeline.events).await?,
            };
            if let Step::Stop = step {
                return Ok(Step::Stop);
            }
        }
        if first {
            let unseen: Vec<(OwnedRoomId, OwnedEventId)> = self
                .marks
                .iter()
                .filter(|(room, _)| !seen.contains(*room))
                .map(|(room, event)| (room.clone(), event.clone()))
                .collect();
            for (room_id, after) in unseen {
                let Some(room) = self.client.get_room(&room_id) else {
                    continue;
                };
                if room.state() != RoomState::Joined {
                    continue;
                }
                if let Step::Stop = self.backfill(&room, &after).await? {
                    return Ok(Step::Stop);
                }
            }
        }
        if let Some(from) = catch_up {
            for room in self.client.joined_rooms() {
                if self.marks.contains_key(room.room_id()) || seen.contains(room.room_id()) {
                    continue;
                }
                if let Step::Stop = self.paginate(&room, Some(from.clone())).await? {
                    return Ok(Step::Stop);
                }
            }
        }
        if !response.to_device.is_empty()
            && let Step::Stop = self.retry_undecryptable().await?
        {
            return Ok(Step::Stop);
        }
        Ok(Step::Go)
    }

    async fn take_all(
        &mut self,
        room: &Room,
        events: Vec<TimelineEvent>,
    ) -> Result<Step, ConnectorError> {
        for event in events {
            if let Step::Stop = self.take(room, event).await? {
                return Ok(Step::Stop);
            }
        }
        Ok(Step::Go)
    }

    /// Hands one timeline event on if it is a message for perch; reports it if it cannot be
    /// decrypted.
    async fn take(&mut self, room: &Room, event: TimelineEvent) -> Result<Step, ConnectorError> {
        let timestamp = event.timestamp_raw();
        if let TimelineEventKind::UnableToDecrypt { event, utd_info } = event.kind {
            let reason = format!("{:?}", utd_info.reason);
            let name: String = reason
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            self.undecryptable(room, event, &name, timestamp);
            return Ok(Step::Go);
        }
        let Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(
            SyncRoomMessageEvent::Original(message),
        ))) = event.raw().deserialize()
        else {
            return Ok(Step::Go);
        };
        let step = if message.sender == self.me.id {
            self.connector
                .shared()
                .remember_own(message.event_id.clone());
            Step::Go
        } else {
            match self.inbound_event(room, &message).await {
                Some(inbound) => self.handoff.hand(inbound).await?,
                None => Step::Go,
            }
        };
        if let Step::Go = step {
            self.mark(room.room_id(), &message.event_id);
        }
        Ok(step)
    }

    /// Records `event_id` as the last event of `room` that perch has (or need not have): the
    /// next back-fill of the room, in this call or after a reconnect, starts after it.
    fn mark(&mut self, room: &RoomId, event_id: &EventId) {
        self.marks.insert(room.to_owned(), event_id.to_owned());
        self.connector
            .shared()
            .marks
            .insert(room.to_owned(), event_id.to_owned());
    }

    fn undecryptable(
        &mut self,
        room: &Room,
        raw: Raw<AnySyncTimelineEvent>,
        reason: &str,
        timestamp: Option<MilliSecondsSinceUnixEpoch>,
    ) {
        let Ok(Some(event_id)) = raw.get_field::<OwnedEventId>("event_id") else {
            return;
        };
        let sender = raw
            .get_field::<String>("sender")
            .ok()
            .flatten()
            .unwrap_or_default();
        let sent_at = timestamp
            .or_else(|| {
                raw.get_field::<MilliSecondsSinceUnixEpoch>("origin_server_ts")
                    .ok()
                    .flatten()
            })
            .map(sent_at)
            .unwrap_or_default();
        self.connector.report_undecryptable(Undecryptable {
            room: room.room_id().to_string(),
            event_id: event_id.to_string(),
            sender,
            reason: reason.to_owned(),
            sent_at,
        });
        if !self.pending.iter().any(|known| known.event_id == event_id) {
            self.pending.push(Pending {
                room: room.room_id().to_owned(),
                event_id,
                raw,
            });
            let excess = self.pending.len().saturating_sub(UNDECRYPTABLE_KEPT);
            self.pending.drain(..excess);
        }
    }

    /// Tries the events that could not be decrypted again; hands on those that now can be.
    async fn retry_undecryptable(&mut self) -> Result<Step, ConnectorError> {
        let waiting = std::mem::take(&mut self.pending);
        let mut still = Vec::new();
        let mut decrypted = Vec::new();
        for pending in waiting {
            let Some(room) = self.client.get_room(&pending.room) else {
                continue;
            };
            let raw = pending
                .raw
                .cast_ref_unchecked::<OriginalSyncRoomEncryptedEvent>();
            match room.decrypt_event(raw, None).await {
                Ok(event) if matches!(event.kind, TimelineEventKind::Decrypted(_)) => {
                    self.connector.resolve_undecryptable(&pending.event_id);
                    decrypted.push((room, event));
                }
                _ => still.push(pending),
            }
        }
        self.pending = still;
        for (room, event) in decrypted {
            if let Step::Stop = self.take(&room, event).await? {
                return Ok(Step::Stop);
            }
        }
        Ok(Step::Go)
    }

    /// Hands on every message after `after` in `room`, oldest first.
    async fn backfill(&mut self, room: &Room, after: &EventId) -> Result<Step, ConnectorError> {
        let context = match room
            .event_with_context(after, false, UInt::from(BACKFILL_CONTEXT), None)
            .await
        {
            Ok(context) => context,
            Err(error) if is_gone(&error) => {
                note(&self.connector.redact(&format!(
                    "matrix: cannot back-fill {} after {after}: {error}",
                    room.room_id()
                )));
                return Ok(Step::Go);
            }
            Err(error) => return Err(self.connector.sync_error(&error)),
        };
        if let Step::Stop = self.take_all(room, context.events_after).await? {
            return Ok(Step::Stop);
        }
        self.paginate(room, context.next_batch_token).await
    }

    /// Hands on every message in `room` after the pagination or sync token `from`, oldest
    /// first.
    async fn paginate(
        &mut self,
        room: &Room,
        from: Option<String>,
    ) -> Result<Step, ConnectorError> {
        let mut from = from;
        for _ in 0..BACKFILL_PAGES {
            let Some(token) = from.take() else {
                break;
            };
            let mut options = MessagesOptions::forward().from(Some(token.as_str()));
            options.limit = UInt::from(BACKFILL_PAGE);
            let page = room
                .messages(options)
                .await
                .map_err(|error| self.connector.sync_error(&error))?;
            if page.chunk.is_empty() {
                break;
            }
            if let Step::Stop = self.take_all(room, page.chunk).await? {
                return Ok(Step::Stop);
            }
            from = page.end;
        }
        Ok(Step::Go)
    }

    /// The message as perch journals it. What the event holds is read first; then the gate's
    /// pre-check: only a message that may be admitted has the event it replies to fetched, its
    /// sender's display name looked up, whether its room is direct decided (unless that alone
    /// decides it) and, for an edit, the edited message's sender checked. One that is refused is
    /// handed on with the reason and nothing looked up.
    async fn inbound_event(
        &self,
        room: &Room,
        message: &OriginalSyncRoomMessageEvent,
    ) -> Option<InboundEvent> {
        let content = &message.content;
        let (msgtype, edit_of) = match &content.relates_to {
            Some(Relation::Replacement(replacement)) => (
                &replacement.new_content.msgtype,
                Some(&replacement.event_id),
            ),
            _ => (&content.msgtype, None),
        };
        let (body, formatted, is_notice, attachments): (&str, Option<&FormattedBody>, bool, _) =
            match msgtype {
                MessageType::Text(text) => (&text.body, text.formatted.as_ref(), false, vec![]),
                MessageType::Notice(notice) => {
                    (&notice.body, notice.formatted.as_ref(), true, vec![])
                }
                MessageType::Emote(emote) => (&emote.body, emote.formatted.as_ref(), false, vec![]),
                other => {
                    let (caption, formatted, attachment) = media_attachment(other)?;
                    (caption, formatted, false, vec![attachment])
                }
            };
        let (thread, replied) = match &content.relates_to {
            Some(Relation::Reply(reply)) => (None, Some(&reply.in_reply_to.event_id)),
            Some(Relation::Thread(thread)) => (
                Some(thread.event_id.to_string()),
                thread
                    .in_reply_to
                    .as_ref()
                    .filter(|_| !thread.is_falling_back)
                    .map(|reply| &reply.event_id),
            ),
            _ => (None, None),
        };
        let text = if replied.is_some() {
            remove_plain_reply_fallback(body).to_owned()
        } else {
            body.to_owned()
        };
        let mentioned = content
            .mentions
            .as_ref()
            .is_some_and(|mentions| mentions.user_ids.contains(&self.me.id))
            || mentions_user(body, &self.me)
            || formatted.is_some_and(|formatted| mentions_user(&formatted.body, &self.me));
        let replies_to_me = |id: &OwnedEventId| self.connector.shared().own_set.contains(id);
        let mut event = InboundEvent {
            platform_id: message.event_id.to_string(),
            cursor: self.cursor.clone(),
            room: room.room_id().to_string(),
            thread,
            sender: Sender {
                id: message.sender.to_string(),
                name: message.sender.localpart().to_owned(),
                is_bot: is_notice,
            },
            direct: false,
            addressed: mentioned || replied.is_some_and(replies_to_me),
            text,
            sent_at: sent_at(message.origin_server_ts),
            attachments,
            replying_to: replied.map(|id| Box::new(Quote::bounded(id.as_str(), None, ""))),
            edit_of: None,
            refused: None,
        };
        let precheck = self
            .connector
            .precheck(&message.sender, is_notice, room.room_id());
        let refused = match precheck {
            Precheck::Look => None,
            Precheck::LookIfDirect { otherwise } => {
                event.direct = is_direct(room).await;
                (!event.direct).then_some(otherwise)
            }
            Precheck::Refuse { reason } => Some(reason),
        };
        if let Some(reason) = refused {
            event.refused = Some(reason);
            return Some(event);
        }
        if let Some(original) = replied {
            let found = self.replied_to(room, original).await;
            event.addressed |= found
                .as_ref()
                .is_some_and(|found| found.sender == self.me.id);
            if let Some(found) = found {
                event.replying_to = Some(Box::new(Quote::bounded(
                    original.as_str(),
                    Some(Sender {
                        id: found.sender.to_string(),
                        name: found.name,
                        is_bot: found.is_notice,
                    }),
                    &found.text,
                )));
            }
        }
        if let Ok(Some(member)) = room.get_member_no_sync(&message.sender).await {
            event.sender.name = member.name().to_owned();
        }
        if !event.direct {
            event.direct = is_direct(room).await;
        }
        if let Some(original) = edit_of {
            match self.sender_of(room, original).await {
                Some(sender) if sender == message.sender => {
                    event.edit_of = Some(original.to_string());
                }
                Some(_) => {
                    event.refused = Some(format!(
                        "an edit of {original}, which someone else sent; not recorded as an edit"
                    ));
                }
                None => {
                    event.refused = Some(format!(
                        "an edit of {original}, whose sender could not be had to check it is the \
                         editor; not recorded as an edit"
                    ));
                }
            }
        }
        Some(event)
    }

    /// The sender of `event_id` in `room`, fetched from the homeserver within
    /// [`QUOTE_FETCH_TIMEOUT`]; `None` when it cannot be had in time or is larger than
    /// [`QUOTE_EVENT_MAX_BYTES`].
    async fn sender_of(&self, room: &Room, event_id: &EventId) -> Option<OwnedUserId> {
        if self.connector.shared().own_set.contains(event_id) {
            return Some(self.me.id.clone());
        }
        let event = self.fetch_bounded(room, event_id).await?;
        event.sender()
    }

    /// The event `event_id` of `room` from the homeserver, within [`QUOTE_FETCH_TIMEOUT`] and
    /// [`QUOTE_EVENT_MAX_BYTES`].
    async fn fetch_bounded(&self, room: &Room, event_id: &EventId) -> Option<TimelineEvent> {
        let config = RequestConfig::default()
            .timeout(QUOTE_FETCH_TIMEOUT)
            .retry_limit(0);
        let event = tokio::time::timeout(QUOTE_FETCH_TIMEOUT, room.event(event_id, Some(config)))
            .await
            .ok()?
            .ok()?;
        (event.raw().json().get().len() <= QUOTE_EVENT_MAX_BYTES).then_some(event)
    }

    /// The event `event_id` a message replies to, fetched from the homeserver within
    /// [`QUOTE_FETCH_TIMEOUT`]; `None` when it cannot be had in time, is larger than
    /// [`QUOTE_EVENT_MAX_BYTES`], or cannot be read.
    async fn replied_to(&self, room: &Room, event_id: &EventId) -> Option<RepliedTo> {
        let event = self.fetch_bounded(room, event_id).await?;
        let sender = event.sender()?;
        let (text, is_notice) = match event.raw().deserialize() {
            Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(
                SyncRoomMessageEvent::Original(message),
            ))) => {
                let content = match message.content.relates_to {
                    Some(Relation::Replacement(replacement)) => replacement.new_content.msgtype,
                    _ => message.content.msgtype,
                };
                let is_notice = matches!(content, MessageType::Notice(_));
                let text = match &content {
                    MessageType::Text(text) => text.body.as_str(),
                    MessageType::Notice(notice) => notice.body.as_str(),
                    MessageType::Emote(emote) => emote.body.as_str(),
                    other => media_attachment(other).map_or("", |(caption, _, _)| caption),
                };
                (
                    super::shortened(remove_plain_reply_fallback(text), super::QUOTE_MAX_CHARS),
                    is_notice,
                )
            }
            _ => (String::new(), false),
        };
        let name = match tokio::time::timeout(QUOTE_FETCH_TIMEOUT, room.get_member_no_sync(&sender))
            .await
        {
            Ok(Ok(Some(member))) => member.name().to_owned(),
            _ => sender.localpart().to_owned(),
        };
        Some(RepliedTo {
            sender,
            name: super::shortened(&name, super::QUOTE_NAME_MAX_CHARS),
            text,
            is_notice,
        })
    }
}

/// How long the event a message replies to may take to fetch before the quote falls back to
/// its id alone.
const QUOTE_FETCH_TIMEOUT: Duration = Duration::from_secs(3);

/// The largest replied-to event read for a quote (Synapse's own event limit).
const QUOTE_EVENT_MAX_BYTES: usize = 65_536;

/// What a fetch found of the event a message replies to.
struct RepliedTo {
    sender: OwnedUserId,
    /// Its display name in the room (or localpart), bounded.
    name: String,
    /// Its text without any reply fallback, bounded.
    text: String,
    /// An `m.notice`, which perch counts as sent by a bot.
    is_notice: bool,
}

/// The caption, formatted caption and attachment of a file, image, audio or video message;
/// `None` for every other kind.
fn media_attachment(msgtype: &MessageType) -> Option<(&str, Option<&FormattedBody>, Attachment)> {
    let (caption, formatted, name, mimetype, size) = match msgtype {
        MessageType::File(file) => (
            file.caption(),
            file.formatted_caption(),
            file.filename(),
            file.info.as_ref().and_then(|info| info.mimetype.clone()),
            file.info.as_ref().and_then(|info| info.size),
        ),
        MessageType::Image(image) => (
            image.caption(),
            image.formatted_caption(),
            image.filename(),
            image.info.as_ref().and_then(|info| info.mimetype.clone()),
            image.info.as_ref().and_then(|info| info.size),
        ),
        MessageType::Audio(audio) => (
            audio.caption(),
            audio.formatted_caption(),
            audio.filename(),
            audio.info.as_ref().and_then(|info| info.mimetype.clone()),
            audio.info.as_ref().and_then(|info| info.size),
        ),
        MessageType::Video(video) => (
            video.caption(),
            video.formatted_caption(),
            video.filename(),
            video.info.as_ref().and_then(|info| info.mimetype.clone()),
            video.info.as_ref().and_then(|info| info.size),
        ),
        _ => return None,
    };
    let (source, encrypted) = match media_source(msgtype)? {
        MediaSource::Plain(uri) => (uri.to_string(), false),
        MediaSource::Encrypted(file) => (file.url.to_string(), true),
    };
    let attachment = Attachment {
        source,
        name: Some(name.to_owned()),
        content_type: mimetype,
        size: size.map(u64::from),
        encrypted,
    };
    Some((caption.unwrap_or_default(), formatted, attachment))
}

fn media_source(msgtype: &MessageType) -> Option<MediaSource> {
    match msgtype {
        MessageType::File(file) => Some(file.source.clone()),
        MessageType::Image(image) => Some(image.source.clone()),
        MessageType::Audio(audio) => Some(audio.source.clone()),
        MessageType::Video(video) => Some(video.source.clone()),
        _ => None,
    }
}

/// Whether `text` names the account: its user id (also inside a matrix.to link), or its display
/// name as a whole word.
fn mentions_user(text: &str, me: &Me) -> bool {
    let id = me.id.as_str();
    if text.contains(id) || text.contains(&id.replacen('@', "%40", 1)) {
        return true;
    }
    me.display_name
        .as_deref()
        .is_some_and(|name| contains_word(text, name))
}

/// Whether `needle` occurs in `haystack`, ignoring case, with no letter or digit right before
/// or after it.
fn contains_word(haystack: &str, needle: &str) -> bool {
    let needle = needle.trim().to_lowercase();
    if needle.is_empty() {
        return false;
    }
    let haystack = haystack.to_lowercase();
    haystack.match_indices(&needle).any(|(start, found)| {
        let before = haystack[..start].chars().next_back();
        let after = haystack[start + found.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Whether `homeserver` is a plain `http://` URL, which needs no certificates: its clients load
/// no trust store, so a homeserver on this machine works where the system has no CA
/// certificates.
fn plain_http(homeserver: &str) -> bool {
    homeserver
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

/// A builder of perch's own requests to `homeserver` (the check, media downloads).
fn http_client(homeserver: &str) -> matrix_sdk::reqwest::ClientBuilder {
    let builder = matrix_sdk::reqwest::Client::builder();
    if plain_http(homeserver) {
        builder.tls_certs_only(Vec::new())
    } else {
        builder
    }
}

/// GETs the media `uri` from `homeserver` (the authenticated endpoint, then the legacy one),
/// refusing it when its declared length is over `limit` and aborting as soon as more than
/// `limit` bytes arrive, so a file without an honest size is never held whole. Each read waits
/// at most [`REQUEST_TIMEOUT`].
async fn download_capped(
    homeserver: url::Url,
    token: Option<String>,
    uri: &matrix_sdk::ruma::MxcUri,
    limit: u64,
) -> Result<Vec<u8>, FetchError> {
    let failed = |message: String| FetchError::Failed { message };
    let (server, media) = uri
        .parts()
        .map_err(|_| failed(format!("{uri} is not a media URI")))?;
    let http = http_client(homeserver.as_str())
        .connect_timeout(REQUEST_TIMEOUT)
        .read_timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|error| failed(format!("cannot set up the HTTP client: {error}")))?;
    let mut refused = None;
    for prefix in [
        "_matrix/client/v1/media/download",
        "_matrix/media/v3/download",
    ] {
        let mut url = homeserver.clone();
        url.path_segments_mut()
            .map_err(|()| failed("the homeserver URL cannot take a path".into()))?
            .pop_if_empty()
            .extend(prefix.split('/'))
            .push(server.as_str())
            .push(media);
        let mut request = http.get(url);
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let mut response = request
            .send()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let status = response.status();
        if matches!(status.as_u16(), 400 | 404 | 405) && refused.is_none() {
            refused = Some(status);
            continue;
        }
        if !status.is_success() {
            return Err(failed(format!("the homeserver answered {status}")));
        }
        if let Some(length) = response.content_length().filter(|length| *length > limit) {
            return Err(FetchError::TooLarge { size: Some(length) });
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| failed(error.to_string()))?
        {
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Err(FetchError::TooLarge { size: None });
            }
            bytes.extend_from_slice(&chunk);
        }
        return Ok(bytes);
    }
    Err(failed(format!(
        "the homeserver answered {} for the file",
        refused.map_or_else(String::new, |status| status.to_string())
    )))
}

/// The content of one delivery: an `m.notice` (perch is a bot: another agent counts its
/// messages as a bot's, so the bot-loop guard applies), Markdown rendered to HTML when it fits
/// in [`CONTENT_BUDGET`], plain text otherwise; the reply and thread relations; an empty
/// `m.mentions`.
fn message_content(delivery: &Delivery) -> Result<RoomMessageEventContent, DeliveryError> {
    let relation = relation(delivery)?;
    let mut fitted = None;
    for content in [
        RoomMessageEventContent::notice_markdown(&delivery.text),
        RoomMessageEventContent::notice_plain(&delivery.text),
    ] {
        let mut content = content;
        content.mentions = Some(Mentions::new());
        content.relates_to = relation.clone();
        let size = serde_json::to_vec(&content).map_or(usize::MAX, |bytes| bytes.len());
        if size <= CONTENT_BUDGET {
            fitted = Some(content);
            break;
        }
    }
    fitted.ok_or_else(|| DeliveryError::Rejected {
        message: format!(
            "the message is too large for one Matrix event (over {CONTENT_BUDGET} bytes as plain text)"
        ),
    })
}

type MessageRelation = Relation<RoomMessageEventContentWithoutRelation>;

fn relation(delivery: &Delivery) -> Result<Option<MessageRelation>, DeliveryError> {
    let event_id = |id: &str| {
        EventId::parse(id).map_err(|_| DeliveryError::Rejected {
            message: format!("{id:?} is not a Matrix event id"),
        })
    };
    let reply_to = delivery.reply_to.as_deref().map(event_id).transpose()?;
    let thread = delivery.thread.as_deref().map(event_id).transpose()?;
    Ok(match (thread, reply_to) {
        (Some(root), Some(reply_to)) => Some(Relation::Thread(Thread::reply(root, reply_to))),
        (Some(root), None) => Some(Relation::Thread(Thread::without_fallback(root))),
        (None, Some(reply_to)) => Some(Relation::Reply(Reply::new(InReplyTo::new(reply_to)))),
        (None, None) => None,
    })
}

/// One GET for [`MatrixConnector::check_account`]: the status and the body as JSON (`null`
/// when it is not JSON).
async fn check_get(
    http: &matrix_sdk::reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Result<(u16, serde_json::Value), CheckError> {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|error| CheckError::Unreachable {
            message: describe_error(&error.without_url()),
        })?;
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .map_err(|error| CheckError::Unreachable {
            message: describe_error(&error.without_url()),
        })?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// The error and its causes on one line.
fn describe_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn sync_filter() -> Filter {
    let mut definition = FilterDefinition::default();
    definition.room.timeline.limit = Some(UInt::from(TIMELINE_LIMIT));
    Filter::FilterDefinition(definition)
}

fn parse_user(user: &str) -> Result<OwnedUserId, String> {
    UserId::parse(user.trim()).map_err(|error| {
        format!("{user:?} is not a Matrix user id (such as @perch:example.org): {error}")
    })
}

/// The homeserver answered the request with a client error other than a rate limit or a
/// refused access token.
fn is_refused(error: &matrix_sdk::Error) -> bool {
    error.as_client_api_error().is_some_and(|api| {
        api.status_code.as_u16() == 400
            && !matches!(
                api.error_kind(),
                Some(ErrorKind::LimitExceeded(_) | ErrorKind::UnknownToken(_))
            )
    })
}

fn is_gone(error: &matrix_sdk::Error) -> bool {
    error
        .as_client_api_error()
        .is_some_and(|api| matches!(api.status_code.as_u16(), 403 | 404))
}

fn sent_at(timestamp: MilliSecondsSinceUnixEpoch) -> DateTime<Utc> {
    i64::try_from(u64::from(timestamp.0))
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or_default()
}

fn disconnected(message: &str) -> ConnectorError {
    ConnectorError::Disconnected {
        message: message.to_owned(),
    }
}

/// A warning for the service's log.
fn note(line: &str) {
    tracing::warn!(kind = "matrix", "{line}");
}

/// Creates the store directory (mode 0700) and reads the saved session. A store without a
/// session cannot be used, so its files are removed.
fn prepare_store(dir: &Path) -> Result<Option<MatrixSession>, String> {
    let cannot =
        |what: &str, error: std::io::Error| format!("cannot {what} {}: {error}", dir.display());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|error| cannot("create the Matrix store directory", error))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| cannot("restrict the Matrix store directory", error))?;
    let path = dir.join(SESSION_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            format!(
                "the saved Matrix session {} is unreadable ({error}); remove {} to log in again",
                path.display(),
                dir.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let entries = std::fs::read_dir(dir).map_err(|error| cannot("list", error))?;
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(STORE_FILE_PREFIX)
                {
                    std::fs::remove_file(entry.path())
                        .map_err(|error| cannot("clear the session-less store in", error))?;
                }
            }
            Ok(None)
        }
        Err(error) => Err(cannot("read the session in", error)),
    }
}

/// Writes `value` as JSON to `path` with mode 0600, replacing it atomically.
fn write_private(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let failed = |error: &dyn fmt::Display| format!("cannot write {}: {error}", path.display());
    let bytes = serde_json::to_vec_pretty(value).map_err(|error| failed(&error))?;
    crate::store::atomic_file::replace(path, &bytes, Some(0o600)).map_err(|error| failed(&error))
}

/// Makes every file in the store directory private to the owner (matrix-sdk creates its
/// databases with the process umask).
fn restrict_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_file()) {
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600));
        }
    }
}

/// Whether the room is a direct message: marked as one (`m.direct`), or with exactly two joined
/// members. The count comes from the room summary, else from the members the store holds (perch
/// does not lazy-load members, so every sync brings them); only when neither knows (right after
/// a start, when a message that waited during the downtime arrives in the first sync) is the
/// member list asked of the homeserver.
async fn is_direct(room: &Room) -> bool {
    if room.is_direct().await.unwrap_or(false) {
        return true;
    }
    match room.joined_members_count() {
        0 => match room
            .members_no_sync(matrix_sdk::RoomMemberships::JOIN)
            .await
        {
            Ok(members) if !members.is_empty() => members.len() == 2,
            _ => room
                .members(matrix_sdk::RoomMemberships::JOIN)
                .await
                .is_ok_and(|members| members.len() == 2),
        },
        count => count == 2,
    }
}

/// The SQLite stores sized for one account: a small page cache and journal, and two pooled
/// connections per store (matrix-sdk's default is four per physical core).
fn store_config(dir: &Path, passphrase: &str) -> matrix_sdk::SqliteStoreConfig {
    matrix_sdk::SqliteStoreConfig::with_low_memory_config(dir)
        .passphrase(Some(passphrase))
        .pool_max_size(STORE_CONNECTIONS)
}

/// Pooled connections per SQLite store: one sync and one send at a time.
const STORE_CONNECTIONS: usize = 2;

#[cfg(test)]
mod tests {
    use super::*;

    /// A homeserver that answers every media download with `head` then, unless `body` is
    /// `None`, `body`; with `None` it streams bytes until the client goes away. It answers 404
    /// on the authenticated endpoint when `legacy_only`. Returns its URL.
    async fn media_server(
        head: &'static str,
        body: Option<&'static [u8]>,
        legacy_only: bool,
    ) -> url::Url {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let read = stream.read(&mut request).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&request[..read]).into_owned();
                    if legacy_only && request.contains("/client/v1/media/") {
                        let _ = stream
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    match body {
                        Some(body) => {
                            let _ = stream.write_all(body).await;
                        }
                        None => {
                            let chunk = vec![b'x'; 64 * 1024];
                            while stream.write_all(&chunk).await.is_ok() {}
                        }
                    }
                });
            }
        });
        url::Url::parse(&format!("http://{address}")).unwrap()
    }

    #[tokio::test]
    async fn a_download_is_capped_whatever_size_the_server_declares() {
        let uri = OwnedMxcUri::from("mxc://example.org/abcdef");
        let endless =
            media_server("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", None, false).await;
        let refused = download_capped(endless, None, &uri, 1 << 20).await;
        assert!(
            matches!(refused, Err(FetchError::TooLarge { size: None })),
            "{refused:?}"
        );

        let declared = media_server(
            "HTTP/1.1 200 OK\r\ncontent-length: 9999999999\r\n\r\n",
            Some(b"tiny"),
            false,
        )
        .await;
        let refused = download_capped(declared, None, &uri, 1 << 20).await;
        assert!(
            matches!(
                refused,
                Err(FetchError::TooLarge {
                    size: Some(9_999_999_999)
                })
            ),
            "{refused:?}"
        );

        let small = media_server(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            Some(b"hello"),
            true,
        )
        .await;
        let fetched = download_capped(small, Some("secret".into()), &uri, 5).await;
        assert_eq!(
            fetched.unwrap(),
            b"hello",
            "the legacy endpoint after a 404"
        );
    }

    fn me(display_name: Option<&str>) -> Me {
        Me {
            id: UserId::parse("@perch:example.org").unwrap(),
            display_name: display_name.map(str::to_owned),
        }
    }

    #[test]
    fn mentions_by_id_link_or_whole_display_name() {
        let me = me(Some("Perch"));
        assert!(mentions_user("hey @perch:example.org", &me));
        assert!(mentions_user(
            "<a href=\"https://matrix.to/#/%40perch:example.org\">Perch</a>",
            &me
        ));
        assert!(mentions_user("perch, what time is it?", &me));
        assert!(!mentions_user("perched on a branch", &me));
        assert!(!mentions_user("hello", &self::me(None)));
    }

    #[test]
    fn words_match_on_boundaries_only() {
        assert!(contains_word("Hi Bot!", "bot"));
        assert!(!contains_word("robot", "bot"));
        assert!(!contains_word("anything", " "));
        assert!(contains_word("ünïcode bot", "BOT"));
    }

    fn delivery(thread: Option<&str>, reply_to: Option<&str>, text: &str) -> Delivery {
        Delivery {
            id: "d1".into(),
            room: "!room:example.org".into(),
            thread: thread.map(str::to_owned),
            reply_to: reply_to.map(str::to_owned),
            text: text.into(),
            attachments: Vec::new(),
        }
    }

    #[test]
    fn replies_keep_their_thread_and_mention_nobody() {
        let reply = message_content(&delivery(None, Some("$a:example.org"), "**hi**")).unwrap();
        let json = serde_json::to_value(&reply).unwrap();
        assert_eq!(
            json["m.relates_to"]["m.in_reply_to"]["event_id"],
            "$a:example.org"
        );
        assert_eq!(json["m.mentions"], serde_json::json!({}));
        assert_eq!(json["formatted_body"], "<strong>hi</strong>");
        assert_eq!(json["body"], "**hi**");

        let threaded = message_content(&delivery(Some("$root:x"), Some("$a:x"), "plain")).unwrap();
        let json = serde_json::to_value(&threaded).unwrap();
        assert_eq!(json["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(json["m.relates_to"]["event_id"], "$root:x");
        assert_eq!(json["m.relates_to"]["m.in_reply_to"]["event_id"], "$a:x");
        assert!(json.get("formatted_body").is_none());

        assert!(message_content(&delivery(None, Some("not an id"), "x")).is_err());
    }

    #[test]
    fn a_piece_that_does_not_fit_with_html_goes_plain() {
        let text = "**é** ".repeat(MAX_CHARS / 6);
        let content = message_content(&delivery(None, None, &text)).unwrap();
        let json = serde_json::to_value(&content).unwrap();
        assert!(json.get("formatted_body").is_none());
        let worst = "😀".repeat(MAX_CHARS);
        let content = message_content(&delivery(None, None, &worst)).unwrap();
        assert!(serde_json::to_vec(&content).unwrap().len() <= CONTENT_BUDGET);
        let huge = "x".repeat(CONTENT_BUDGET + 1);
        assert!(message_content(&delivery(None, None, &huge)).is_err());
    }

    #[test]
    fn settings_are_checked() {
        let secret = || {
            perch_core::secret::EnvRef::new(
                perch_core::name::EnvName::try_from("MATRIX_PASSWORD").unwrap(),
            )
            .resolve(|_| Some("hunter2".into()))
            .unwrap()
        };
        let dir = PathBuf::from("/nonexistent/perch-test");
        assert!(
            MatrixConnector::new("ftp://x", "@a:b", secret(), secret(), dir.clone(), vec![])
                .is_err()
        );
        assert!(
            MatrixConnector::new("http://x", "alice", secret(), secret(), dir.clone(), vec![])
                .is_err()
        );
        assert!(
            MatrixConnector::new(
                "http://x",
                "@a:b",
                secret(),
                secret(),
                dir.clone(),
                vec!["bob".into()]
            )
            .is_err()
        );
        let connector =
            MatrixConnector::new("http://x/", "@a:b", secret(), secret(), dir, vec![]).unwrap();
        assert!(!format!("{connector:?}").contains("hunter2"));
        let long = connector.redact(&"x".repeat(1000));
        assert_eq!(long.chars().count(), MESSAGE_LIMIT + 1);
    }

    #[test]
    fn a_store_without_its_session_is_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("matrix").join("ops");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("matrix-sdk-crypto.sqlite3"), b"old").unwrap();
        assert_eq!(prepare_store(&store).unwrap(), None);
        assert!(!store.join("matrix-sdk-crypto.sqlite3").exists());
        let mode = std::fs::metadata(&store).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        write_private(&store.join("x.json"), &serde_json::json!({"a": 1})).unwrap();
        let mode = std::fs::metadata(store.join("x.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
