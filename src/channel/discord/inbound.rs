//! A Discord message or edit as perch journals it: its text, files, author and the message it
//! replies to, and whether it addresses the bot.

use crate::channel::{Attachment, InboundEvent, Quote, Sender};
use chrono::{DateTime, Utc};
use serenity::all::{Message, MessageType, MessageUpdateEvent, UserId};

/// The event perch sees for `message`, or `None` for the bot's own messages and for system
/// messages (joins, pins, thread notices): only plain messages and replies are handed on.
/// A thread is a channel in Discord, so a message in a thread has the thread's channel id as
/// its room and no `thread`; replies go back to that channel. REST messages carry no `guild_id`,
/// so whether the room is a DM is passed in.
pub(super) fn inbound_event(message: &Message, me: UserId, direct: bool) -> Option<InboundEvent> {
    if message.author.id == me
        || !matches!(
            message.kind,
            MessageType::Regular | MessageType::InlineReply
        )
    {
        return None;
    }
    let addressed = message.mentions.iter().any(|user| user.id == me)
        || message
            .referenced_message
            .as_ref()
            .is_some_and(|original| original.author.id == me);
    Some(InboundEvent {
        platform_id: message.id.to_string(),
        cursor: None,
        room: message.channel_id.to_string(),
        thread: None,
        sender: sender(&message.author),
        direct,
        addressed,
        text: message.content.clone(),
        sent_at: sent_at(message),
        attachments: message
            .attachments
            .iter()
            .map(|attachment| Attachment {
                source: attachment.url.clone(),
                name: Some(attachment.filename.clone()),
                content_type: attachment.content_type.clone(),
                size: Some(u64::from(attachment.size)),
                encrypted: false,
            })
            .collect(),
        replying_to: message.referenced_message.as_ref().map(|original| {
            Box::new(Quote::bounded(
                &original.id.to_string(),
                Some(sender(&original.author)),
                &original.content,
            ))
        }),
        edit_of: None,
        refused: None,
    })
}

fn sender(author: &serenity::all::User) -> Sender {
    Sender {
        id: author.id.to_string(),
        name: author
            .global_name
            .clone()
            .unwrap_or_else(|| author.name.clone()),
        is_bot: author.bot,
    }
}

/// The event perch sees for a MESSAGE_UPDATE: an edit of someone else's message, with its new
/// text, named `<message id>:edited:<edit time>`; `None` for the bot's own messages and for
/// updates that are no edit (Discord also sends one when it adds a link preview).
pub(super) fn edit_event(update: &MessageUpdateEvent, me: UserId) -> Option<InboundEvent> {
    let author = update.author.as_ref().filter(|author| author.id != me)?;
    let edited = update.edited_timestamp?;
    let text = update.content.clone()?;
    let sent_at = DateTime::from_timestamp(edited.unix_timestamp(), 0).unwrap_or_default();
    Some(InboundEvent {
        platform_id: format!("{}:edited:{}", update.id, edited.unix_timestamp()),
        cursor: None,
        room: update.channel_id.to_string(),
        thread: None,
        sender: sender(author),
        direct: update.guild_id.is_none(),
        addressed: false,
        text,
        sent_at,
        attachments: Vec::new(),
        replying_to: None,
        edit_of: Some(update.id.to_string()),
        refused: None,
    })
}

fn sent_at(message: &Message) -> DateTime<Utc> {
    message
        .timestamp
        .to_rfc3339()
        .and_then(|text| DateTime::parse_from_rfc3339(&text).ok())
        .map(|at| at.with_timezone(&Utc))
        .or_else(|| DateTime::from_timestamp(message.timestamp.unix_timestamp(), 0))
        .unwrap_or_default()
}
