//! Files: the attachment a file, image, audio or video message carries, and its download,
//! capped as it arrives and decrypted when encrypted.

use super::MatrixConnector;
use super::client::{REQUEST_TIMEOUT, http_client};
use crate::channel::{Attachment, FetchError, InboundEvent};
use matrix_sdk::Client;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::FormattedBody;
use matrix_sdk::ruma::events::room::message::{MessageType, SyncRoomMessageEvent};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::ruma::{EventId, OwnedMxcUri, RoomId};

impl MatrixConnector {
    /// Downloads (and, if encrypted, decrypts) the file of `attachment`, refusing it past
    /// `limit` bytes.
    pub(super) async fn download(
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
}

/// The caption, formatted caption and attachment of a file, image, audio or video message;
/// `None` for every other kind.
pub(super) fn media_attachment(
    msgtype: &MessageType,
) -> Option<(&str, Option<&FormattedBody>, Attachment)> {
    // The four contents are different types with the same fields and methods.
    macro_rules! described {
        ($content:expr) => {
            (
                $content.caption(),
                $content.formatted_caption(),
                $content.filename(),
                $content
                    .info
                    .as_ref()
                    .and_then(|info| info.mimetype.clone()),
                $content.info.as_ref().and_then(|info| info.size),
            )
        };
    }
    let (caption, formatted, name, mimetype, size) = match msgtype {
        MessageType::File(file) => described!(file),
        MessageType::Image(image) => described!(image),
        MessageType::Audio(audio) => described!(audio),
        MessageType::Video(video) => described!(video),
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

/// GETs the media `uri` from `homeserver` (the authenticated endpoint, then the legacy one),
/// refusing it when its declared length is over `limit` and aborting as soon as more than
/// `limit` bytes arrive, so a file without an honest size is never held whole. Each read waits
/// at most [`REQUEST_TIMEOUT`].
pub(super) async fn download_capped(
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
