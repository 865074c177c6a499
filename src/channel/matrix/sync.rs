//! Receiving: the sync loop from perch's cursor, invites, back-fill of what a crash or a cut
//! timeline left behind, and the undecryptable events kept and tried again.

use super::client::write_private;
use super::{
    MatrixConnector, UNDECRYPTABLE_FILE, Undecryptable, UndecryptableReport, disconnected, note,
};
use crate::channel::{Arrival, ConnectorError, InboundEvent, ReceiveAttempt, Step, hand_over};
use chrono::{DateTime, Utc};
use matrix_sdk::config::{SyncSettings, SyncToken};
use matrix_sdk::deserialized_responses::{TimelineEvent, TimelineEventKind};
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::api::client::filter::FilterDefinition;
use matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter;
use matrix_sdk::ruma::api::error::ErrorKind;
use matrix_sdk::ruma::events::room::encrypted::OriginalSyncRoomEncryptedEvent;
use matrix_sdk::ruma::events::room::message::SyncRoomMessageEvent;
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::ruma::serde::Raw;
use matrix_sdk::ruma::{
    EventId, MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedRoomId, OwnedUserId, RoomId, UInt,
    UserId,
};
use matrix_sdk::store::StateStoreDataKey;
use matrix_sdk::sync::SyncResponse;
use matrix_sdk::{Client, Room, RoomState};
use perch_core::admission::Precheck;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const SYNC_TIMEOUT: Duration = Duration::from_secs(30);
const TIMELINE_LIMIT: u32 = 100;
const BACKFILL_PAGE: u32 = 100;
const BACKFILL_CONTEXT: u32 = 10;
const BACKFILL_PAGES: usize = 50;
const JOIN_ATTEMPTS: u32 = 3;
const JOIN_RETRY: Duration = Duration::from_millis(500);
const UNDECRYPTABLE_KEPT: usize = 100;

impl MatrixConnector {
    pub(super) async fn follow(&self, attempt: ReceiveAttempt) -> Result<(), ConnectorError> {
        let ReceiveAttempt {
            resume,
            since,
            inbound,
            up,
            cancel,
        } = attempt;
        let client = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(()),
            client = self.client() => client?,
        };
        let me = client
            .user_id()
            .ok_or_else(|| disconnected("the Matrix client has no user after logging in"))?
            .to_owned();
        let account = me.to_string();
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
                up.mark_as(account.clone());
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
    pub(super) fn precheck(&self, sender: &UserId, sender_is_bot: bool, room: &RoomId) -> Precheck {
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
}

pub(super) struct Me {
    pub(super) id: OwnedUserId,
    pub(super) display_name: Option<String>,
}

struct Handoff<'a> {
    inbound: &'a mpsc::Sender<Arrival>,
    cancel: &'a CancellationToken,
}

impl Handoff<'_> {
    async fn hand(&self, event: InboundEvent) -> Result<Step, ConnectorError> {
        hand_over(self.inbound, self.cancel, event).await
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
pub(super) struct Session<'a> {
    pub(super) connector: &'a MatrixConnector,
    client: &'a Client,
    pub(super) me: Me,
    handoff: Handoff<'a>,
    marks: HashMap<OwnedRoomId, OwnedEventId>,
    pending: Vec<Pending>,
    /// The sync token the current batch was requested with: syncing from it again delivers
    /// every event of the batch again.
    pub(super) cursor: Option<String>,
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
}

fn sync_filter() -> Filter {
    let mut definition = FilterDefinition::default();
    definition.room.timeline.limit = Some(UInt::from(TIMELINE_LIMIT));
    Filter::FilterDefinition(definition)
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

pub(super) fn sent_at(timestamp: MilliSecondsSinceUnixEpoch) -> DateTime<Utc> {
    i64::try_from(u64::from(timestamp.0))
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or_default()
}
