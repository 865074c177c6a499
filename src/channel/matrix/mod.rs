//! Matrix through matrix-sdk 0.18: this folder is the one module that names it. mod.rs holds the
//! connector and what its parts share; client.rs the client and session, sync.rs receiving,
//! inbound.rs a message as perch journals it, send.rs sending and uploading, media.rs files.
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

mod client;
mod inbound;
mod media;
mod send;
mod sync;
#[cfg(test)]
mod tests;
use super::{
    Attachment, BoxFuture, CheckError, Checked, Connector, ConnectorError, Delivery, DeliveryError,
    FetchError, Gate, InboundEvent, PlatformLimits, Receipt, ReceiveAttempt, SetupError, Upload,
};
use chrono::{DateTime, Utc};
use matrix_sdk::Client;
use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, OwnedUserId};
use perch_core::secret::Secret;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{OnceCell, watch};

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
const UNDECRYPTABLE_FILE: &str = "undecryptable.json";
const OWN_EVENTS_KEPT: usize = 1000;

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

impl Connector for MatrixConnector {
    fn receive(&self, attempt: ReceiveAttempt) -> BoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(self.follow(attempt))
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

fn disconnected(message: &str) -> ConnectorError {
    ConnectorError::Disconnected {
        message: message.to_owned(),
    }
}

/// A warning for the service's log.
fn note(line: &str) {
    tracing::warn!(kind = "matrix", "{line}");
}
