//! Socket Mode, perch's own loop: `apps.connections.open` for a URL, `hello`, then each
//! `events_api` envelope handed to perch and acknowledged only once perch journaled it.
//! What ends a connection is decided by `perch_core::slack::socket`.

use super::SlackConnector;
use super::web::CallError;
use crate::channel::{
    AttemptUp, ConnectorError, InboundEvent, ReceiveAttempt, Sender, Step, hand_over,
};
use futures_util::{SinkExt, StreamExt};
use perch_core::admission::OTHER_ORGANISATION;
use perch_core::connection::AttemptEnd;
use perch_core::slack::envelope::{EventsEnvelope, Frame, ack, read_frame};
use perch_core::slack::event::{Classified, Me, classify};
use perch_core::slack::socket::{Handovers, NextSocket, SocketEnd};
use perch_core::slack::web::{ConnectionsOpen, socket_url_allowed};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message as WsMessage;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How long opening the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How often perch pings a quiet socket.
const PING_EVERY: Duration = Duration::from_secs(30);
/// A socket that sent nothing (not even a pong) for this long is taken for lost.
const SILENCE_LIMIT: Duration = Duration::from_secs(90);
/// How long a `users.info` lookup may hold an envelope's acknowledgement (Slack waits 3 s).
const NAME_LOOKUP_TIMEOUT: Duration = Duration::from_millis(1500);
/// How many display names are kept.
const NAMES_KEPT: usize = 1000;
/// How long a display name is kept.
const NAME_LIFETIME: Duration = Duration::from_secs(3600);

/// Display names from `users.info`, bounded and forgotten after [`NAME_LIFETIME`].
#[derive(Debug, Default)]
pub(super) struct Names {
    known: HashMap<String, (String, Instant)>,
}

impl Names {
    fn get(&self, user: &str, now: Instant) -> Option<String> {
        self.known
            .get(user)
            .filter(|(_, at)| now.duration_since(*at) < NAME_LIFETIME)
            .map(|(name, _)| name.clone())
    }

    fn keep(&mut self, user: &str, name: String, now: Instant) {
        if self.known.len() >= NAMES_KEPT && !self.known.contains_key(user) {
            self.known
                .retain(|_, (_, at)| now.duration_since(*at) < NAME_LIFETIME);
            if self.known.len() >= NAMES_KEPT
                && let Some(oldest) = self
                    .known
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(user, _)| user.clone())
            {
                self.known.remove(&oldest);
            }
        }
        self.known.insert(user.to_owned(), (name, now));
    }
}

/// How one connection ended: its end and whether it said hello; `None` when perch stopped.
type Ended = Option<(SocketEnd, bool)>;

impl SlackConnector {
    /// One receive attempt: connections opened one after the other as long as Slack hands
    /// them over, until one ends the attempt.
    pub(super) async fn receive_attempt(
        &self,
        attempt: ReceiveAttempt,
    ) -> Result<(), ConnectorError> {
        let cancel = attempt.cancel.clone();
        let me = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(()),
            me = self.identity() => me?,
        };
        let mut handovers = Handovers::new();
        loop {
            let Some((end, said_hello)) = self.connection(&me, &attempt, &mut handovers).await?
            else {
                return Ok(());
            };
            tracing::info!("slack: a connection ended: {end:?}");
            match handovers.after(&end, said_hello) {
                NextSocket::ReconnectNow => continue,
                NextSocket::End(AttemptEnd::Clean) => return Ok(()),
                NextSocket::End(AttemptEnd::Refused { reason }) => {
                    return Err(ConnectorError::Unauthorized { message: reason });
                }
                NextSocket::End(AttemptEnd::Dropped { reason }) => {
                    return Err(ConnectorError::Disconnected { message: reason });
                }
            }
        }
    }

    /// Opens one connection and reads it until it ends.
    async fn connection(
        &self,
        me: &(Me, String),
        attempt: &ReceiveAttempt,
        handovers: &mut Handovers,
    ) -> Result<Ended, ConnectorError> {
        let cancel = &attempt.cancel;
        let opened = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(None),
            opened = self.web.call(&self.app_token, "apps.connections.open", &[], None) => opened,
        };
        let url = match opened.and_then(|value| {
            serde_json::from_value::<ConnectionsOpen>(value).map_err(|error| {
                CallError::Web(perch_core::slack::web::WebFailure::Unreadable {
                    reason: error.to_string(),
                })
            })
        }) {
            Ok(open) => open.url,
            Err(CallError::Web(failure)) => {
                return Ok(Some((SocketEnd::OpenFailed(failure), false)));
            }
            Err(CallError::Unanswered(failure)) => {
                return Ok(Some((
                    SocketEnd::Lost {
                        reason: format!("apps.connections.open: {failure}"),
                    },
                    false,
                )));
            }
        };
        if let Err(why) = socket_url_allowed(self.web.base(), &url) {
            return Err(ConnectorError::Disconnected { message: why });
        }
        let connected = tokio::select! {
            biased;
            () = cancel.cancelled() => return Ok(None),
            connected = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url.as_str())) => connected,
        };
        let mut socket = match connected {
            Ok(Ok((socket, _))) => socket,
            Ok(Err(error)) => {
                return Ok(Some((
                    lost(format!(
                        "cannot open Slack's socket: {}",
                        self.clean(&error.to_string())
                    )),
                    false,
                )));
            }
            Err(_) => {
                return Ok(Some((
                    lost(format!(
                        "Slack's socket did not open within {} s",
                        CONNECT_TIMEOUT.as_secs()
                    )),
                    false,
                )));
            }
        };
        let ended = self
            .read_socket(&mut socket, me, attempt, &attempt.up, handovers)
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
        ended
    }

    async fn read_socket(
        &self,
        socket: &mut Socket,
        (me, account): &(Me, String),
        attempt: &ReceiveAttempt,
        up: &AttemptUp,
        handovers: &mut Handovers,
    ) -> Result<Ended, ConnectorError> {
        let cancel = &attempt.cancel;
        let mut said_hello = false;
        let mut heard = Instant::now();
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        loop {
            let message = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(None),
                _ = ping.tick() => {
                    if heard.elapsed() > SILENCE_LIMIT {
                        return Ok(Some((lost(format!("Slack's socket was silent for {} s", SILENCE_LIMIT.as_secs())), said_hello)));
                    }
                    if socket.send(WsMessage::Ping(Vec::new())).await.is_err() {
                        return Ok(Some((lost("the socket failed while pinging".to_owned()), said_hello)));
                    }
                    continue;
                }
                message = socket.next() => message,
            };
            heard = Instant::now();
            let text = match message {
                None => return Ok(Some((lost("Slack's socket closed".to_owned()), said_hello))),
                Some(Err(error)) => {
                    return Ok(Some((
                        lost(format!(
                            "Slack's socket failed: {}",
                            self.clean(&error.to_string())
                        )),
                        said_hello,
                    )));
                }
                Some(Ok(WsMessage::Close(_))) => {
                    return Ok(Some((
                        lost("Slack closed the socket".to_owned()),
                        said_hello,
                    )));
                }
                Some(Ok(WsMessage::Text(text))) => text,
                Some(Ok(_)) => continue,
            };
            let acknowledge = match read_frame(&text) {
                Frame::Hello { .. } => {
                    said_hello = true;
                    up.mark_as(account.clone());
                    None
                }
                Frame::Disconnect { reason } => {
                    return Ok(Some((SocketEnd::Disconnect(reason), said_hello)));
                }
                Frame::Other { kind, envelope_id } => {
                    tracing::debug!("slack: a {kind} frame, which perch does not take");
                    envelope_id
                }
                Frame::Events(envelope) => {
                    handovers.envelope_received();
                    let event = self.event_of(&envelope, me).await;
                    if let Some(event) = event
                        && hand_over(&attempt.inbound, cancel, event).await? == Step::Stop
                    {
                        return Ok(None);
                    }
                    Some(envelope.envelope_id)
                }
                Frame::Unreadable {
                    envelope_id,
                    reason,
                    excerpt,
                } => {
                    let platform_id = match &envelope_id {
                        Some(id) => format!("envelope:{id}"),
                        None => format!("frame:{}", uuid::Uuid::new_v4().simple()),
                    };
                    let event = refused_event(
                        platform_id,
                        None,
                        format!("Slack sent a frame perch cannot read: {reason}"),
                        excerpt,
                    );
                    if hand_over(&attempt.inbound, cancel, event).await? == Step::Stop {
                        return Ok(None);
                    }
                    envelope_id
                }
            };
            if let Some(envelope_id) = acknowledge
                && socket
                    .send(WsMessage::Text(ack(&envelope_id)))
                    .await
                    .is_err()
            {
                return Ok(Some((
                    lost("the socket failed while acknowledging".to_owned()),
                    said_hello,
                )));
            }
        }
    }

    /// The event to journal for `envelope`; `None` for what perch neither journals nor answers
    /// (its own messages, deletions, joins, channel notices).
    async fn event_of(&self, envelope: &EventsEnvelope, me: &Me) -> Option<InboundEvent> {
        let classified = classify(&envelope.payload, me);
        match &classified {
            Classified::Message(message)
            | Classified::Edited { message, .. }
            | Classified::Refused { message, .. } => {
                let name = match (&message.bot_id, &message.username) {
                    (Some(_), Some(username)) => Some(username.clone()),
                    _ => self.display_name(&message.user).await,
                };
                let mut event = classified.inbound_event(name.as_deref())?;
                if let Some(team) = &message.other_team
                    && event.refused.is_none()
                    && !self.allowed_users.contains(&message.user)
                {
                    event.refused = Some(format!(
                        "{OTHER_ORGANISATION} (Slack Connect, workspace {team}) not in allow.users"
                    ));
                }
                Some(event)
            }
            Classified::Event { key, kind } => Some(refused_event(
                key.clone(),
                Some(&envelope.payload),
                format!("a Slack event of type `{kind}`, which perch does not take"),
                String::new(),
            )),
            Classified::Unreadable { key, reason } => Some(refused_event(
                key.clone()
                    .unwrap_or_else(|| format!("envelope:{}", envelope.envelope_id)),
                Some(&envelope.payload),
                format!("a Slack event perch cannot read: {reason}"),
                String::new(),
            )),
            Classified::Deleted { channel, .. }
            | Classified::Own { channel, .. }
            | Classified::Joined { channel, .. }
            | Classified::Notice { channel, .. } => {
                tracing::debug!("slack: in {channel}, nothing to answer: {classified:?}");
                None
            }
        }
    }

    /// `user`'s display name, from the cache or a short `users.info`; `None` when it cannot be
    /// had at once (the method is rate limited, Slack is slow or refuses).
    async fn display_name(&self, user: &str) -> Option<String> {
        let now = Instant::now();
        if let Some(name) = self.lock_names().get(user, now) {
            return Some(name);
        }
        if !self.web.wait_before("users.info", None).is_zero() {
            return None;
        }
        let looked_up = tokio::time::timeout(
            NAME_LOOKUP_TIMEOUT,
            self.web
                .call(&self.bot_token, "users.info", &[("user", user)], None),
        )
        .await
        .ok()?
        .ok()?;
        let info: perch_core::slack::web::UserInfo = serde_json::from_value(looked_up).ok()?;
        let name = info.user.display_name().to_owned();
        self.lock_names().keep(user, name.clone(), Instant::now());
        Some(name)
    }

    fn lock_names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn lost(reason: String) -> SocketEnd {
    SocketEnd::Lost { reason }
}

/// An envelope journaled only to be refused: an event perch does not take, or cannot read.
fn refused_event(
    platform_id: String,
    payload: Option<&serde_json::Value>,
    reason: String,
    text: String,
) -> InboundEvent {
    let field = |key: &str| {
        payload
            .and_then(|payload| payload.get("event"))
            .and_then(|event| event.get(key))
            .and_then(serde_json::Value::as_str)
            .filter(|value| !value.is_empty())
            .map(|value| perch_core::journal::event::shortened(value, 64))
    };
    let sender = field("user").unwrap_or_else(|| "slack".to_owned());
    InboundEvent {
        platform_id,
        cursor: None,
        room: field("channel").unwrap_or_else(|| "-".to_owned()),
        thread: None,
        sender: Sender {
            name: sender.clone(),
            id: sender,
            is_bot: false,
        },
        direct: false,
        addressed: false,
        text,
        sent_at: chrono::Utc::now(),
        attachments: Vec::new(),
        replying_to: None,
        edit_of: None,
        refused: Some(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_expire() {
        let start = Instant::now();
        let mut names = Names::default();
        for index in 0..NAMES_KEPT + 10 {
            names.keep(&format!("U{index}"), format!("n{index}"), start);
        }
        assert_eq!(names.known.len(), NAMES_KEPT);
        names.keep("U1", "Ada".into(), start);
        assert_eq!(names.get("U1", start).as_deref(), Some("Ada"));
        assert_eq!(names.get("U1", start + NAME_LIFETIME), None);
    }

    #[test]
    fn an_unreadable_envelope_is_journaled_as_a_refusal_with_where_it_came_from() {
        let payload = serde_json::json!({"event": {"channel": "C1", "user": "U1"}});
        let event = refused_event(
            "envelope:e1".into(),
            Some(&payload),
            "why".into(),
            String::new(),
        );
        assert_eq!(
            (event.room.as_str(), event.sender.id.as_str()),
            ("C1", "U1")
        );
        assert_eq!(event.refused.as_deref(), Some("why"));
        let event = refused_event("frame:x".into(), None, "why".into(), "{".into());
        assert_eq!((event.room.as_str(), event.text.as_str()), ("-", "{"));
    }
}
