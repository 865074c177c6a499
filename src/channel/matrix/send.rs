//! Sending: a reply's text as an `m.notice` with its relations and no mentions, its files
//! uploaded (encrypted in an encrypted room), the errors a send becomes, and typing.

use super::{CONTENT_BUDGET, MatrixConnector};
use crate::channel::{Delivery, DeliveryError, Receipt, Upload};
use matrix_sdk::ruma::api::error::{ErrorKind, RetryAfter};
use matrix_sdk::ruma::events::Mentions;
use matrix_sdk::ruma::events::relation::{InReplyTo, Reply, Thread};
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::{FileInfo, FileMessageEventContent};
use matrix_sdk::ruma::events::room::message::{
    MessageType, Relation, RoomMessageEventContent, RoomMessageEventContentWithoutRelation,
};
use matrix_sdk::ruma::{EventId, OwnedTransactionId, RoomId, UInt};
use matrix_sdk::{Client, Room, RoomState};
use std::time::Duration;

const TYPING_TIMEOUT: Duration = Duration::from_secs(5);

impl MatrixConnector {
    pub(super) async fn send(
        &self,
        delivery: &Delivery,
        files: &[Upload],
    ) -> Result<Receipt, DeliveryError> {
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

    pub(super) async fn show_typing(&self, room: &str) {
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

/// The content of one delivery: an `m.notice` (perch is a bot: another agent counts its
/// messages as a bot's, so the bot-loop guard applies), Markdown rendered to HTML when it fits
/// in [`CONTENT_BUDGET`], plain text otherwise; the reply and thread relations; an empty
/// `m.mentions`.
pub(super) fn message_content(
    delivery: &Delivery,
) -> Result<RoomMessageEventContent, DeliveryError> {
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
