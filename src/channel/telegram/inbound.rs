//! A Telegram update as perch journals it: the message or edit, its text or caption, its files,
//! the message it replies to, and whether it addresses the bot.

use crate::channel::{Attachment, InboundEvent, Quote, Sender};
use teloxide::types::{
    FileMeta, Message, MessageEntity, MessageEntityKind, MessageId, ThreadId, Update, UpdateKind,
};

/// The bot's own account, as `getMe` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's user id.
    pub id: u64,
    /// The username without `@`; every bot has one, so `None` only from a broken server.
    pub username: Option<String>,
    /// The display name (first and last name).
    pub name: String,
}

impl BotIdentity {
    /// The bot as the operator knows it: `@username`, or its name and id without one.
    pub fn account(&self) -> String {
        match &self.username {
            Some(username) => format!("@{username}"),
            None => format!("{} ({})", self.name, self.id),
        }
    }
}

pub(super) fn platform_id(message: &Message) -> String {
    format!("{}:{}", message.chat.id.0, message.id.0)
}

/// The event for a message or edited-message update; `None` for every other update and for
/// messages without text or caption. An edit is named `<chat id>:<message id>:edited:<edit
/// date>`, with `edit_of` naming the message it edits.
pub(super) fn message_event(update: &Update, me: &BotIdentity) -> Option<InboundEvent> {
    let (message, edit_of) = match &update.kind {
        UpdateKind::Message(message) => (message, None),
        UpdateKind::EditedMessage(message) => (message, Some(platform_id(message))),
        _ => return None,
    };
    let attachments = attachments(message);
    let (text, entities) = match (message.text(), message.caption()) {
        (Some(text), _) => (text, message.entities().unwrap_or_default()),
        (None, Some(caption)) => (caption, message.caption_entities().unwrap_or_default()),
        (None, None) if !attachments.is_empty() => ("", &[][..]),
        (None, None) => return None,
    };
    let sender = sender(message)?;
    let thread = message
        .thread_id
        .filter(|_| message.is_topic_message)
        .map(|ThreadId(MessageId(id))| id);
    let addressed = mentions(text, entities, me) || replies_to(message, thread, me);
    let platform_id = match (&edit_of, message.edit_date()) {
        (Some(original), Some(edited)) => format!("{original}:edited:{}", edited.timestamp()),
        (Some(original), None) => format!("{original}:edited:{}", update.id.0),
        (None, _) => platform_id(message),
    };
    Some(InboundEvent {
        platform_id,
        cursor: Some(update.id.0.to_string()),
        room: message.chat.id.0.to_string(),
        thread: thread.map(|id| id.to_string()),
        sender,
        direct: message.chat.is_private(),
        addressed,
        text: text.to_owned(),
        sent_at: match &edit_of {
            Some(_) => message.edit_date().copied().unwrap_or(message.date),
            None => message.date,
        },
        attachments,
        replying_to: quote(message, thread).map(Box::new),
        edit_of,
        refused: None,
    })
}

/// The message `message` replies to, bounded; `None` when it replies to nothing, or only to
/// its forum topic's first message (which every message in a topic points at).
fn quote(message: &Message, thread: Option<i32>) -> Option<Quote> {
    let original = message
        .reply_to_message()
        .filter(|original| Some(original.id.0) != thread)?;
    let text = original
        .text()
        .or_else(|| original.caption())
        .unwrap_or_default();
    Some(Quote::bounded(
        &platform_id(original),
        sender(original),
        text,
    ))
}

/// The file of a message: a document, the largest size of a photo, an audio file, a video or a
/// voice note.
fn attachments(message: &Message) -> Vec<Attachment> {
    let file = |meta: &FileMeta, name: Option<&str>, content_type: Option<String>| Attachment {
        source: meta.id.0.clone(),
        name: name.map(str::to_owned),
        content_type,
        size: Some(u64::from(meta.size)),
        encrypted: false,
    };
    if let Some(document) = message.document() {
        return vec![file(
            &document.file,
            document.file_name.as_deref(),
            document.mime_type.as_ref().map(ToString::to_string),
        )];
    }
    if let Some(largest) = message.photo().and_then(|sizes| {
        sizes.iter().max_by_key(|size| {
            (
                u64::from(size.width) * u64::from(size.height),
                size.file.size,
            )
        })
    }) {
        return vec![file(&largest.file, None, Some("image/jpeg".to_owned()))];
    }
    if let Some(audio) = message.audio() {
        return vec![file(
            &audio.file,
            audio.file_name.as_deref(),
            audio.mime_type.as_ref().map(ToString::to_string),
        )];
    }
    if let Some(video) = message.video() {
        return vec![file(
            &video.file,
            video.file_name.as_deref(),
            video.mime_type.as_ref().map(ToString::to_string),
        )];
    }
    if let Some(voice) = message.voice() {
        return vec![file(
            &voice.file,
            None,
            voice.mime_type.as_ref().map(ToString::to_string),
        )];
    }
    Vec::new()
}

/// Who sent the message: the chat it was sent on behalf of (an anonymous group admin, a linked
/// channel) or else the user.
fn sender(message: &Message) -> Option<Sender> {
    if let Some(chat) = &message.sender_chat {
        let name = chat
            .title()
            .or_else(|| chat.username())
            .or_else(|| chat.first_name())
            .unwrap_or_default();
        return Some(Sender {
            id: chat.id.0.to_string(),
            name: name.to_owned(),
            is_bot: false,
        });
    }
    message.from.as_ref().map(|user| Sender {
        id: user.id.0.to_string(),
        name: user.full_name(),
        is_bot: user.is_bot,
    })
}

/// The text mentions the bot: `@username`, a mention of its account without a username, or a
/// command addressed to it (`/cmd@username`).
fn mentions(text: &str, entities: &[MessageEntity], me: &BotIdentity) -> bool {
    let named = |handle: &str| {
        me.username
            .as_deref()
            .is_some_and(|username| handle.eq_ignore_ascii_case(username))
    };
    entities.iter().any(|entity| match &entity.kind {
        MessageEntityKind::Mention => entity_text(text, entity)
            .and_then(|mention| mention.strip_prefix('@'))
            .is_some_and(named),
        MessageEntityKind::TextMention { user } => user.id.0 == me.id,
        MessageEntityKind::BotCommand => entity_text(text, entity)
            .and_then(|command| command.split_once('@'))
            .is_some_and(|(_, handle)| named(handle)),
        _ => false,
    })
}

/// The message replies to one of the bot's messages. In a forum topic every message without an
/// explicit reply points at the topic's first message, which is not a reply to anyone.
fn replies_to(message: &Message, thread: Option<i32>, me: &BotIdentity) -> bool {
    message.reply_to_message().is_some_and(|original| {
        Some(original.id.0) != thread
            && original
                .from
                .as_ref()
                .is_some_and(|from| from.id.0 == me.id)
    })
}

/// The text an entity covers. Telegram counts offsets in UTF-16 code units; an entity that does
/// not fall on character boundaries inside the text covers nothing.
pub(super) fn entity_text<'a>(text: &'a str, entity: &MessageEntity) -> Option<&'a str> {
    let end_units = entity.offset.checked_add(entity.length)?;
    let mut units = 0;
    let mut start = None;
    for (index, ch) in text.char_indices() {
        if units == entity.offset {
            start = Some(index);
        }
        if units == end_units {
            return start.map(|start| &text[start..index]);
        }
        units += ch.len_utf16();
    }
    if units == entity.offset {
        start = Some(text.len());
    }
    if units == end_units {
        return start.map(|start| &text[start..]);
    }
    None
}
