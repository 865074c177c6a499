//! An Events API payload classified into what perch does with it ([`classify`]), and the
//! journaled [`InboundEvent`] of a message ([`Classified::inbound_event`]).
//!
//! A message's identity is `<channel>:<ts>`, whichever event brings it: the `message` and the
//! `app_mention` deliveries of one mention, and Slack's redeliveries of either, carry the same
//! key, so the inbox keeps one item. Only events that are not messages are known by their
//! `event_id`. An edit is known by the message and the edit's time, so each edit is kept once
//! and never taken for the message itself.

use crate::Timestamp;
use crate::attachment::Attachment;
use crate::journal::event::{InboundEvent, Sender};
use crate::slack::mrkdwn::readable;
use serde::Deserialize;

/// The most files of one message perch keeps (Slack's own limit per message).
pub const MAX_FILES: usize = 10;

/// Who perch is in the workspace, from `auth.test`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    /// The workspace (`team_id`): a user of another one is a Slack Connect guest.
    pub team_id: String,
    /// The bot's user id (`user_id`), which a mention names as `<@U…>`.
    pub user_id: String,
    /// The bot's id (`bot_id`), which its own messages carry.
    pub bot_id: Option<String>,
}

/// What kind of conversation a message is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationKind {
    /// A direct message with the bot.
    Im,
    /// A group direct message.
    Mpim,
    /// A public channel.
    Channel,
    /// A private channel.
    Group,
}

impl ConversationKind {
    /// From the event's `channel_type`, or, where the event has none (`app_mention`), from the
    /// channel id's first letter: `D` a DM, `G` a private channel, anything else a channel.
    fn of(channel_type: Option<&str>, channel: &str) -> ConversationKind {
        match channel_type {
            Some("im") => ConversationKind::Im,
            Some("mpim") => ConversationKind::Mpim,
            Some("group") => ConversationKind::Group,
            Some("channel") => ConversationKind::Channel,
            _ => match channel.chars().next() {
                Some('D') => ConversationKind::Im,
                Some('G') => ConversationKind::Group,
                _ => ConversationKind::Channel,
            },
        }
    }

    /// A direct message with the bot (a group DM is not one).
    pub fn is_direct(self) -> bool {
        self == ConversationKind::Im
    }
}

/// A file of a message, as a reference: the URL perch downloads it from with the bot token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackFile {
    pub id: String,
    pub name: Option<String>,
    pub mimetype: Option<String>,
    pub size: Option<u64>,
    /// `url_private_download`, or `url_private` when there is none.
    pub url: String,
}

/// A message as perch reads it, before anyone's name was looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackMessage {
    /// Its identity in the inbox: `<channel>:<ts>` (an edit's: see [`Classified::Edited`]).
    pub key: String,
    pub channel: String,
    pub ts: String,
    /// The thread it was posted in; `None` outside threads.
    pub thread_ts: Option<String>,
    pub kind: ConversationKind,
    /// The author's user id; a bot with no user id is named by its bot id.
    pub user: String,
    /// The app or integration that wrote it: a bot's message.
    pub bot_id: Option<String>,
    /// The name a bot message gave itself (`username`).
    pub username: Option<String>,
    /// As Slack sent it: mrkdwn, with its `<…>` sequences and `&amp;`, `&lt;`, `&gt;`.
    pub text: String,
    pub files: Vec<SlackFile>,
    /// `thread_broadcast`, `file_share`, `me_message`, `bot_message`; `None` for a plain one.
    pub subtype: Option<String>,
    /// It mentions the bot (`<@U…>`), came as an `app_mention`, or replies in a thread the
    /// bot started.
    pub addressed: bool,
    /// The workspace of an author from another organisation (Slack Connect); `None` for the
    /// bot's own workspace.
    pub other_team: Option<String>,
    pub sent_at: Timestamp,
}

/// What perch does with one Events API payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// A message to journal under its key and admit as on every platform (a person's, or
    /// another bot's under `allow_bots`).
    Message(SlackMessage),
    /// An edit (`message_changed` with an `edited` stamp): journaled under
    /// `<channel>:<ts>:edited:<edit ts>`, never answered; `edit_of` is the edited message's key.
    Edited {
        edit_of: String,
        message: SlackMessage,
    },
    /// A message of a subtype perch does not take: journaled and refused with `reason`.
    Refused {
        reason: String,
        message: SlackMessage,
    },
    /// A message was deleted (`message_deleted`): nothing to journal or answer.
    Deleted { channel: String, deleted_ts: String },
    /// Someone joined the channel (`channel_join`, `group_join`); `own` when it is the bot.
    Joined {
        channel: String,
        user: String,
        own: bool,
    },
    /// The bot's own message (or an update of one): never journaled, never answered.
    Own { channel: String, ts: String },
    /// A channel notice (topic, purpose, name, archive, a member leaving, a pin, an unfurl's
    /// `message_changed` with no edit): nothing to answer.
    Notice { channel: String, subtype: String },
    /// An event that is not a message, known by `event:<event_id>`.
    Event { key: String, kind: String },
    /// A payload perch cannot read: journaled as such, known by `event:<event_id>` when it has
    /// one.
    Unreadable { key: Option<String>, reason: String },
}

impl Classified {
    /// The event to journal for a message, an edit or a refused message, with `sender_name`
    /// (from `users.info`, or a bot's `username`; the user id when neither is known) and the
    /// text as a person reads it ([`readable`]); `None` for everything else.
    pub fn inbound_event(&self, sender_name: Option<&str>) -> Option<InboundEvent> {
        let (message, edit_of, refused) = match self {
            Classified::Message(message) => (message, None, None),
            Classified::Edited { edit_of, message } => (message, Some(edit_of.clone()), None),
            Classified::Refused { reason, message } => (message, None, Some(reason.clone())),
            _ => return None,
        };
        let name = sender_name
            .or(message.username.as_deref())
            .unwrap_or(&message.user);
        Some(InboundEvent {
            platform_id: message.key.clone(),
            cursor: None,
            room: message.channel.clone(),
            thread: message.thread_ts.clone(),
            sender: Sender {
                id: message.user.clone(),
                name: name.to_owned(),
                is_bot: message.bot_id.is_some(),
            },
            direct: message.kind.is_direct(),
            addressed: message.addressed && edit_of.is_none(),
            text: readable(&message.text),
            sent_at: message.sent_at,
            attachments: message
                .files
                .iter()
                .map(|file| Attachment {
                    source: file.url.clone(),
                    name: file.name.clone(),
                    content_type: file.mimetype.clone(),
                    size: file.size,
                    encrypted: false,
                })
                .collect(),
            replying_to: None,
            edit_of,
            refused,
        })
    }
}

/// Subtypes a person writes: admitted like a plain message.
const HUMAN_SUBTYPES: &[&str] = &["thread_broadcast", "file_share", "me_message"];

/// Documented subtypes that are channel notices, not messages to answer.
const NOTICE_SUBTYPES: &[&str] = &[
    "channel_leave",
    "group_leave",
    "channel_topic",
    "group_topic",
    "channel_purpose",
    "group_purpose",
    "channel_name",
    "group_name",
    "channel_archive",
    "group_archive",
    "channel_unarchive",
    "group_unarchive",
    "channel_posting_permissions",
    "channel_convert_to_private",
    "channel_convert_to_public",
    "pinned_item",
    "unpinned_item",
    "reminder_add",
    "message_replied",
    "bot_add",
    "bot_remove",
    "ekm_access_denied",
];

#[derive(Deserialize)]
struct Callback {
    #[serde(rename = "type")]
    kind: Option<String>,
    event_id: Option<String>,
    event: Option<serde_json::Value>,
}

#[derive(Deserialize, Clone)]
struct RawMessage {
    #[serde(rename = "type")]
    kind: Option<String>,
    subtype: Option<String>,
    channel: Option<String>,
    channel_type: Option<String>,
    user: Option<String>,
    bot_id: Option<String>,
    username: Option<String>,
    text: Option<String>,
    ts: Option<String>,
    thread_ts: Option<String>,
    parent_user_id: Option<String>,
    user_team: Option<String>,
    team: Option<String>,
    #[serde(default)]
    files: Vec<RawFile>,
    hidden: Option<bool>,
    deleted_ts: Option<String>,
    message: Option<Box<RawMessage>>,
    edited: Option<Edited>,
}

#[derive(Deserialize, Clone)]
struct Edited {
    ts: Option<String>,
}

#[derive(Deserialize, Clone)]
struct RawFile {
    id: Option<String>,
    name: Option<String>,
    mimetype: Option<String>,
    size: Option<u64>,
    url_private: Option<String>,
    url_private_download: Option<String>,
}

/// Classifies an `events_api` envelope's payload for the bot `me`.
pub fn classify(payload: &serde_json::Value, me: &Me) -> Classified {
    let callback = match Callback::deserialize(payload) {
        Ok(callback) => callback,
        Err(error) => return unreadable(None, format!("not an event callback: {error}")),
    };
    let key = callback
        .event_id
        .filter(|id| !id.is_empty())
        .map(|id| format!("event:{id}"));
    if callback.kind.as_deref() != Some("event_callback") {
        let kind = callback.kind.unwrap_or_default();
        return match key {
            Some(key) => Classified::Event { key, kind },
            None => unreadable(None, format!("a payload of type `{kind}` with no event id")),
        };
    }
    let Some(event) = callback.event else {
        return unreadable(key, "an event callback with no event".to_owned());
    };
    let raw = match RawMessage::deserialize(&event) {
        Ok(raw) => raw,
        Err(error) => return unreadable(key, format!("an event perch cannot read: {error}")),
    };
    match raw.kind.as_deref() {
        Some("message") => message_event(raw, me).unwrap_or_else(|reason| unreadable(key, reason)),
        Some("app_mention") => match read_message(&raw, None, me) {
            Ok(mut message) => {
                message.addressed = true;
                own_or(message, me, Classified::Message)
            }
            Err(reason) => unreadable(key, reason),
        },
        kind => match key {
            Some(key) => Classified::Event {
                key,
                kind: kind.unwrap_or_default().to_owned(),
            },
            None => unreadable(None, "an event with no type and no event id".to_owned()),
        },
    }
}

fn unreadable(key: Option<String>, reason: String) -> Classified {
    Classified::Unreadable { key, reason }
}

fn message_event(raw: RawMessage, me: &Me) -> Result<Classified, String> {
    let channel = required(&raw.channel, "channel")?;
    let Some(subtype) = raw.subtype.clone() else {
        return Ok(own_or(
            read_message(&raw, None, me)?,
            me,
            Classified::Message,
        ));
    };
    match subtype.as_str() {
        "message_changed" => {
            let inner = raw
                .message
                .as_deref()
                .ok_or("a message_changed event with no message")?;
            let mut inner = inner.clone();
            inner.channel = inner.channel.or_else(|| raw.channel.clone());
            inner.channel_type = inner.channel_type.or_else(|| raw.channel_type.clone());
            let mut message = read_message(&inner, None, me)?;
            if is_own(&message, me) {
                return Ok(Classified::Own {
                    channel,
                    ts: message.ts,
                });
            }
            let Some(edit_ts) = inner.edited.as_ref().and_then(|edited| edited.ts.clone()) else {
                return Ok(Classified::Notice { channel, subtype });
            };
            let edit_of = std::mem::replace(
                &mut message.key,
                format!("{channel}:{}:edited:{edit_ts}", message.ts),
            );
            if let Some(at) = sent_at(&edit_ts) {
                message.sent_at = at;
            }
            message.addressed = false;
            Ok(Classified::Edited { edit_of, message })
        }
        "message_deleted" => Ok(Classified::Deleted {
            channel,
            deleted_ts: required(&raw.deleted_ts, "deleted_ts")?,
        }),
        "channel_join" | "group_join" => {
            let user = required(&raw.user, "user")?;
            Ok(Classified::Joined {
                own: user == me.user_id,
                channel,
                user,
            })
        }
        "bot_message" => Ok(own_or(
            read_message(&raw, Some(subtype), me)?,
            me,
            Classified::Message,
        )),
        human if HUMAN_SUBTYPES.contains(&human) => Ok(own_or(
            read_message(&raw, Some(subtype), me)?,
            me,
            Classified::Message,
        )),
        notice if NOTICE_SUBTYPES.contains(&notice) || raw.hidden == Some(true) => {
            Ok(Classified::Notice { channel, subtype })
        }
        _ => {
            let message = read_message(&raw, Some(subtype.clone()), me)?;
            Ok(own_or(message, me, |message| Classified::Refused {
                reason: format!("a message of subtype `{subtype}`, which perch does not take"),
                message,
            }))
        }
    }
}

fn own_or(
    message: SlackMessage,
    me: &Me,
    other: impl FnOnce(SlackMessage) -> Classified,
) -> Classified {
    if is_own(&message, me) {
        Classified::Own {
            channel: message.channel,
            ts: message.ts,
        }
    } else {
        other(message)
    }
}

fn is_own(message: &SlackMessage, me: &Me) -> bool {
    message.user == me.user_id || (message.bot_id.is_some() && message.bot_id == me.bot_id)
}

fn required(field: &Option<String>, name: &str) -> Result<String, String> {
    field
        .clone()
        .filter(|value| !value.is_empty())
        .ok_or_else(|| format!("a message event with no `{name}`"))
}

fn read_message(
    raw: &RawMessage,
    subtype: Option<String>,
    me: &Me,
) -> Result<SlackMessage, String> {
    let channel = required(&raw.channel, "channel")?;
    let ts = required(&raw.ts, "ts")?;
    let sent_at =
        sent_at(&ts).ok_or_else(|| format!("a message whose ts `{ts}` is no Slack time"))?;
    let bot_id = raw.bot_id.clone().filter(|bot_id| !bot_id.is_empty());
    let user = raw
        .user
        .clone()
        .filter(|user| !user.is_empty())
        .or_else(|| bot_id.clone())
        .ok_or("a message with neither `user` nor `bot_id`")?;
    let text = raw.text.clone().unwrap_or_default();
    let mention = format!("<@{}>", me.user_id);
    let mention_with_name = format!("<@{}|", me.user_id);
    let addressed = text.contains(&mention)
        || text.contains(&mention_with_name)
        || raw.parent_user_id.as_deref() == Some(me.user_id.as_str());
    let other_team = raw
        .user_team
        .as_ref()
        .or(raw.team.as_ref())
        .filter(|team| !team.is_empty() && **team != me.team_id)
        .cloned();
    Ok(SlackMessage {
        key: format!("{channel}:{ts}"),
        kind: ConversationKind::of(raw.channel_type.as_deref(), &channel),
        thread_ts: raw.thread_ts.clone().filter(|thread| !thread.is_empty()),
        channel,
        ts,
        user,
        bot_id,
        username: raw.username.clone().filter(|name| !name.is_empty()),
        text,
        files: raw.files.iter().filter_map(file).take(MAX_FILES).collect(),
        subtype,
        addressed,
        other_team,
        sent_at,
    })
}

fn file(raw: &RawFile) -> Option<SlackFile> {
    let url = raw
        .url_private_download
        .as_ref()
        .or(raw.url_private.as_ref())
        .filter(|url| !url.is_empty())?;
    Some(SlackFile {
        id: raw.id.clone().unwrap_or_default(),
        name: raw.name.clone(),
        mimetype: raw.mimetype.clone(),
        size: raw.size,
        url: url.clone(),
    })
}

/// The time a Slack `ts` (`<seconds>.<microseconds>`) names.
pub fn sent_at(ts: &str) -> Option<Timestamp> {
    let (seconds, fraction) = ts.split_once('.').unwrap_or((ts, ""));
    if seconds.is_empty()
        || !seconds.bytes().all(|byte| byte.is_ascii_digit())
        || fraction.len() > 9
        || !fraction.bytes().all(|byte| byte.is_ascii_digit())
    {
        return None;
    }
    let seconds: i64 = seconds.parse().ok()?;
    let nanos = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<9}").parse().ok()?
    };
    Timestamp::from_timestamp(seconds, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slack::envelope::{Frame, read_frame};
    use crate::slack::fixture;
    use serde_json::json;

    fn me() -> Me {
        Me {
            team_id: "T123ABC456".into(),
            user_id: "U0LAN0Z89".into(),
            bot_id: Some("B123ABC456".into()),
        }
    }

    fn payload_of(frame: &str) -> serde_json::Value {
        match read_frame(frame) {
            Frame::Events(envelope) => envelope.payload,
            other => panic!("not an events envelope: {other:?}"),
        }
    }

    fn callback(event: serde_json::Value) -> serde_json::Value {
        json!({"type": "event_callback", "team_id": "T123ABC456", "event_id": "Ev1", "event": event})
    }

    fn classified(event: serde_json::Value) -> Classified {
        classify(&callback(event), &me())
    }

    fn message(classified: &Classified) -> &SlackMessage {
        match classified {
            Classified::Message(message)
            | Classified::Edited { message, .. }
            | Classified::Refused { message, .. } => message,
            other => panic!("no message: {other:?}"),
        }
    }

    #[test]
    fn a_mention_delivered_as_message_and_as_app_mention_is_one_item() {
        let mention = classify(
            &payload_of(&fixture!("events-app-mention.json").text()),
            &me(),
        );
        let plain = classify(
            &payload_of(&fixture!("events-message-channel.json").text()),
            &me(),
        );
        let (mention, plain) = (
            mention.inbound_event(Some("Ada")).unwrap(),
            plain.inbound_event(Some("Ada")).unwrap(),
        );
        assert_eq!(mention, plain);
        assert_eq!(mention.platform_id, "C123ABC456:1515449522.000016");
        assert_eq!(
            mention.text,
            "@U0LAN0Z89 is it everything a river should be?"
        );
        assert!(mention.addressed && !mention.direct);
        assert_eq!(mention.room, "C123ABC456");
        assert_eq!(mention.sender.id, "U061F7AUR");
        assert_eq!(mention.sent_at.timestamp(), 1_515_449_522);
        assert_eq!(mention.sent_at.timestamp_subsec_micros(), 16);
    }

    #[test]
    fn a_redelivered_dm_keeps_its_identity() {
        let dm = classify(
            &payload_of(&fixture!("events-message-im-retry.json").text()),
            &me(),
        );
        let event = dm.inbound_event(None).unwrap();
        assert_eq!(event.platform_id, "D024BE91L:1355517523.000005");
        assert!(event.direct);
        assert!(!event.addressed);
        assert_eq!(event.sender.name, "U2147483697");
        assert_eq!(event.text, "Hello hello can you hear me?");
    }

    #[test]
    fn an_edit_is_journaled_under_its_own_key_and_not_addressed() {
        let edit = classify(
            &payload_of(&fixture!("events-message-changed.json").text()),
            &me(),
        );
        let Classified::Edited { edit_of, message } = &edit else {
            panic!("not an edit: {edit:?}");
        };
        assert_eq!(edit_of, "C123ABC456:1355517523.000005");
        assert_eq!(
            message.key,
            "C123ABC456:1355517523.000005:edited:1358878755.000001"
        );
        let event = edit.inbound_event(None).unwrap();
        assert_eq!(
            event.edit_of.as_deref(),
            Some("C123ABC456:1355517523.000005")
        );
        assert_eq!(event.text, "Hello, world!");
        assert!(!event.addressed);
        assert_eq!(event.sent_at.timestamp(), 1_358_878_755);
    }

    #[test]
    fn a_shared_file_is_an_attachment_to_download() {
        let shared = classify(
            &payload_of(&fixture!("events-message-file-share.json").text()),
            &me(),
        );
        assert_eq!(message(&shared).subtype.as_deref(), Some("file_share"));
        let event = shared.inbound_event(None).unwrap();
        assert!(event.direct);
        assert_eq!(
            event.attachments,
            vec![Attachment {
                source: "https://files.slack.com/files-pri/T0T8QAQ6T-F0S43PZDF/download/tedair.gif"
                    .into(),
                name: Some("tedair.gif".into()),
                content_type: Some("image/gif".into()),
                size: Some(137_531),
                encrypted: false,
            }]
        );
    }

    #[test]
    fn every_subtype_has_its_fate() {
        let base = json!({"type": "message", "channel": "C1", "user": "U1", "text": "hi", "ts": "1700000000.000100"});
        let with = |extra: serde_json::Value| {
            let mut event = base.clone();
            for (key, value) in extra.as_object().unwrap() {
                event[key] = value.clone();
            }
            classified(event)
        };
        for human in ["thread_broadcast", "file_share", "me_message"] {
            let outcome = with(json!({"subtype": human, "thread_ts": "1700000000.000001"}));
            let Classified::Message(message) = &outcome else {
                panic!("{human}: {outcome:?}");
            };
            assert_eq!(message.subtype.as_deref(), Some(human));
            assert_eq!(message.thread_ts.as_deref(), Some("1700000000.000001"));
        }
        assert_eq!(
            with(json!({"subtype": "message_deleted", "hidden": true, "deleted_ts": "1699.1"})),
            Classified::Deleted {
                channel: "C1".into(),
                deleted_ts: "1699.1".into()
            }
        );
        assert_eq!(
            with(json!({"subtype": "channel_join", "text": "<@U1|ada> has joined the channel"})),
            Classified::Joined {
                channel: "C1".into(),
                user: "U1".into(),
                own: false
            }
        );
        assert_eq!(
            with(json!({"subtype": "group_join", "user": "U0LAN0Z89"})),
            Classified::Joined {
                channel: "C1".into(),
                user: "U0LAN0Z89".into(),
                own: true
            }
        );
        for notice in [
            "channel_topic",
            "channel_leave",
            "pinned_item",
            "message_replied",
        ] {
            assert_eq!(
                with(json!({"subtype": notice})),
                Classified::Notice {
                    channel: "C1".into(),
                    subtype: notice.into()
                }
            );
        }
        let unknown = with(json!({"subtype": "huddle_thread_v9"}));
        let Classified::Refused { reason, message } = &unknown else {
            panic!("{unknown:?}");
        };
        assert!(reason.contains("`huddle_thread_v9`"), "{reason}");
        assert_eq!(message.key, "C1:1700000000.000100");
        let event = unknown.inbound_event(None).unwrap();
        assert_eq!(event.refused.as_deref(), Some(reason.as_str()));
    }

    #[test]
    fn bots_are_named_and_the_bots_own_messages_are_its_own() {
        let own_cases = [
            json!({"type": "message", "channel": "C1", "user": "U0LAN0Z89", "text": "hi", "ts": "1.2"}),
            json!({"type": "message", "channel": "C1", "bot_id": "B123ABC456", "text": "hi", "ts": "1.2"}),
            json!({"type": "message", "subtype": "bot_message", "channel": "C1", "bot_id": "B123ABC456", "username": "perch", "text": "hi", "ts": "1.2"}),
            json!({"type": "message", "subtype": "file_share", "channel": "C1", "user": "U0LAN0Z89", "bot_id": "B123ABC456", "text": "", "ts": "1.2"}),
            json!({"type": "message", "subtype": "message_changed", "channel": "C1", "ts": "3.0",
                   "message": {"type": "message", "user": "U0LAN0Z89", "text": "x", "ts": "1.2", "edited": {"ts": "3.0"}}}),
        ];
        for event in own_cases {
            assert_eq!(
                classified(event.clone()),
                Classified::Own {
                    channel: "C1".into(),
                    ts: "1.2".into()
                },
                "{event}"
            );
        }
        let github = classified(
            json!({"type": "message", "subtype": "bot_message", "channel": "C1",
            "bot_id": "BB12033", "username": "github", "text": "Pushing is the answer", "ts": "1358877455.000010"}),
        );
        let event = github.inbound_event(None).unwrap();
        assert_eq!(
            event.sender,
            Sender {
                id: "BB12033".into(),
                name: "github".into(),
                is_bot: true
            }
        );
        let app_user = classified(json!({"type": "message", "channel": "C1", "user": "U9",
            "bot_id": "B9", "text": "hello <@U0LAN0Z89>", "ts": "1.3"}));
        let event = app_user.inbound_event(Some("Deploy bot")).unwrap();
        assert_eq!(
            (event.sender.id.as_str(), event.sender.is_bot),
            ("U9", true)
        );
        assert!(event.addressed);
    }

    #[test]
    fn kinds_threads_mentions_and_other_teams() {
        let cases: Vec<(serde_json::Value, ConversationKind, bool, Option<&str>)> = vec![
            (
                json!({"channel": "D1", "channel_type": "im", "text": "hi"}),
                ConversationKind::Im,
                false,
                None,
            ),
            (
                json!({"channel": "G1", "channel_type": "mpim", "text": "hi"}),
                ConversationKind::Mpim,
                false,
                None,
            ),
            (
                json!({"channel": "C1", "channel_type": "group", "text": "<@U0LAN0Z89|perch> hi"}),
                ConversationKind::Group,
                true,
                None,
            ),
            (
                json!({"channel": "C1", "channel_type": "channel", "text": "<@U0LAN0Z8> hi"}),
                ConversationKind::Channel,
                false,
                None,
            ),
            (
                json!({"channel": "D2", "text": "hi"}),
                ConversationKind::Im,
                false,
                None,
            ),
            (
                json!({"channel": "G2", "text": "hi"}),
                ConversationKind::Group,
                false,
                None,
            ),
            (
                json!({"channel": "C3", "text": "hi", "thread_ts": "1.0", "parent_user_id": "U0LAN0Z89"}),
                ConversationKind::Channel,
                true,
                None,
            ),
            (
                json!({"channel": "C4", "text": "hi", "user_team": "T0THEIRS", "team": "T0THEIRS"}),
                ConversationKind::Channel,
                false,
                Some("T0THEIRS"),
            ),
            (
                json!({"channel": "C5", "text": "hi", "user_team": "T123ABC456", "team": "T123ABC456"}),
                ConversationKind::Channel,
                false,
                None,
            ),
        ];
        for (fields, kind, addressed, other_team) in cases {
            let mut event = json!({"type": "message", "user": "U1", "ts": "1700000000.5"});
            for (key, value) in fields.as_object().unwrap() {
                event[key] = value.clone();
            }
            let outcome = classified(event.clone());
            let message = message(&outcome);
            assert_eq!(message.kind, kind, "{event}");
            assert_eq!(message.addressed, addressed, "{event}");
            assert_eq!(message.other_team.as_deref(), other_team, "{event}");
            assert_eq!(
                outcome.inbound_event(None).unwrap().direct,
                kind == ConversationKind::Im,
                "only a DM is direct; a group DM is a group chat: {event}"
            );
        }
    }

    #[test]
    fn an_unfurl_is_no_edit() {
        let unfurl = classified(
            json!({"type": "message", "subtype": "message_changed", "hidden": true,
            "channel": "C1", "ts": "5.0",
            "message": {"type": "message", "user": "U1", "text": "see https://x.example", "ts": "4.0",
                        "attachments": [{"title": "x"}]}}),
        );
        assert_eq!(
            unfurl,
            Classified::Notice {
                channel: "C1".into(),
                subtype: "message_changed".into()
            }
        );
    }

    #[test]
    fn what_is_not_a_message_goes_by_event_id_and_what_cannot_be_read_says_why() {
        assert_eq!(
            classified(json!({"type": "member_joined_channel", "user": "U1", "channel": "C1"})),
            Classified::Event {
                key: "event:Ev1".into(),
                kind: "member_joined_channel".into()
            }
        );
        assert_eq!(
            classify(
                &json!({"type": "app_rate_limited", "team_id": "T1", "minute_rate_limited": 1518467820}),
                &me()
            ),
            Classified::Unreadable {
                key: None,
                reason: "a payload of type `app_rate_limited` with no event id".into()
            }
        );
        let unreadable: Vec<(serde_json::Value, &str)> = vec![
            (
                json!({"type": "message", "user": "U1", "ts": "1.0"}),
                "no `channel`",
            ),
            (
                json!({"type": "message", "channel": "C1", "user": "U1"}),
                "no `ts`",
            ),
            (
                json!({"type": "message", "channel": "C1", "user": "U1", "ts": "yesterday"}),
                "no Slack time",
            ),
            (
                json!({"type": "message", "channel": "C1", "ts": "1.0"}),
                "neither `user` nor `bot_id`",
            ),
            (
                json!({"type": "message", "channel": "C1", "subtype": "message_changed", "ts": "1.0"}),
                "no message",
            ),
            (
                json!({"type": "message", "channel": 7, "ts": "1.0"}),
                "cannot read",
            ),
        ];
        for (event, why) in unreadable {
            let outcome = classified(event.clone());
            let Classified::Unreadable { key, reason } = &outcome else {
                panic!("{event}: {outcome:?}");
            };
            assert_eq!(key.as_deref(), Some("event:Ev1"));
            assert!(reason.contains(why), "{event}: {reason}");
        }
        assert!(matches!(
            classify(&json!("text"), &me()),
            Classified::Unreadable { key: None, .. }
        ));
    }

    #[test]
    fn slack_times_read() {
        let cases: &[(&str, Option<(i64, u32)>)] = &[
            ("1355517523.000005", Some((1_355_517_523, 5_000))),
            ("1355517523", Some((1_355_517_523, 0))),
            ("1.5", Some((1, 500_000_000))),
            ("", None),
            (".5", None),
            ("1.x", None),
            ("-1.0", None),
            ("1.0000000001", None),
        ];
        for (ts, expected) in cases {
            let read = sent_at(ts).map(|at| (at.timestamp(), at.timestamp_subsec_nanos()));
            assert_eq!(read, *expected, "{ts}");
        }
    }
}
