//! One Matrix message as perch journals it: its text, files, reply and thread, whether it is
//! direct and addressed, the event it quotes and the editor of an edit, looked up only when the
//! gate's pre-check lets it through.

use super::media::media_attachment;
use super::sync::{Me, Session, sent_at};
use crate::channel::{InboundEvent, Quote, Sender};
use matrix_sdk::Room;
use matrix_sdk::config::RequestConfig;
use matrix_sdk::deserialized_responses::TimelineEvent;
use matrix_sdk::ruma::events::room::message::FormattedBody;
use matrix_sdk::ruma::events::room::message::sanitize::remove_plain_reply_fallback;
use matrix_sdk::ruma::events::room::message::{
    MessageType, OriginalSyncRoomMessageEvent, Relation, SyncRoomMessageEvent,
};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedUserId};
use perch_core::admission::Precheck;
use std::time::Duration;

impl Session<'_> {
    /// The message as perch journals it. What the event holds is read first; then the gate's
    /// pre-check: only a message that may be admitted has the event it replies to fetched, its
    /// sender's display name looked up, whether its room is direct decided (unless that alone
    /// decides it) and, for an edit, the edited message's sender checked. One that is refused is
    /// handed on with the reason and nothing looked up.
    pub(super) async fn inbound_event(
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
                    crate::channel::shortened(
                        remove_plain_reply_fallback(text),
                        crate::channel::QUOTE_MAX_CHARS,
                    ),
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
            name: crate::channel::shortened(&name, crate::channel::QUOTE_NAME_MAX_CHARS),
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

/// Whether `text` names the account: its user id (also inside a matrix.to link), or its display
/// name as a whole word.
pub(super) fn mentions_user(text: &str, me: &Me) -> bool {
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
pub(super) fn contains_word(haystack: &str, needle: &str) -> bool {
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
