//! Slack: the fake Socket Mode and Web API's own rules, read with perch's core, as the wiring's
//! tests will meet them.

mod crash;
mod fake;
mod rooms;
mod run;

use super::support::fake_slack::{
    APP_TOKEN, BOT_TOKEN, BOT_USER, Failure, FakeSlack, Kind, SlackUser, TEAM,
};
use super::support::wait::Poll;
use futures_util::{SinkExt, StreamExt};
use perch_core::slack::envelope::{DisconnectReason, EventsEnvelope, Frame, ack, read_frame};
use perch_core::slack::event::{Classified, Me, classify};
use perch_core::slack::web::{
    AuthTest, CompletedUpload, ConnectionsOpen, Posted, UploadUrl, UserInfo, WebFailure, read,
    read_answer, socket_url_allowed,
};
use serde_json::json;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const WAIT: Duration = Duration::from_secs(15);

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn me() -> Me {
    Me {
        team_id: TEAM.into(),
        user_id: BOT_USER.into(),
        bot_id: Some(super::support::fake_slack::BOT_ID.into()),
    }
}

fn ada() -> SlackUser {
    SlackUser::person("U061F7AUR", "Ada")
}

/// Calls `method` with `token` and a form of `arguments`; the answer's status, `Retry-After`
/// and body.
async fn call(
    fake: &FakeSlack,
    token: Option<&str>,
    method: &str,
    arguments: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{}{method}", fake.api_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(arguments)
                .finish(),
        );
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    (status, retry_after, response.text().await.unwrap())
}

/// Calls `method` with the bot token and reads the answer as `T`.
async fn bot_call<T: serde::de::DeserializeOwned>(
    fake: &FakeSlack,
    method: &str,
    arguments: &[(&str, &str)],
) -> Result<T, WebFailure> {
    let (status, retry_after, body) = call(fake, Some(BOT_TOKEN), method, arguments).await;
    read(status, retry_after.as_deref(), &body)
}

/// Opens a Socket Mode connection as perch will: `apps.connections.open`, then its URL.
async fn open_socket(fake: &FakeSlack) -> Socket {
    let open: ConnectionsOpen = {
        let (status, retry_after, body) =
            call(fake, Some(APP_TOKEN), "apps.connections.open", &[]).await;
        read(status, retry_after.as_deref(), &body).unwrap()
    };
    socket_url_allowed(&fake.api_url(), &open.url).unwrap();
    tokio_tungstenite::connect_async(open.url).await.unwrap().0
}

/// The next text frame, read by perch's core; `None` once the socket closes.
async fn next_frame(socket: &mut Socket) -> Option<Frame> {
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("a frame in time")?;
        match message {
            Ok(WsMessage::Text(text)) => return Some(read_frame(&text)),
            Ok(WsMessage::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

async fn next_envelope(socket: &mut Socket) -> EventsEnvelope {
    match next_frame(socket).await {
        Some(Frame::Events(envelope)) => envelope,
        other => panic!("not an events envelope: {other:?}"),
    }
}

async fn hello(socket: &mut Socket) {
    let frame = next_frame(socket).await;
    assert!(matches!(frame, Some(Frame::Hello { .. })), "{frame:?}");
}

async fn acknowledge(socket: &mut Socket, envelope: &EventsEnvelope) {
    socket
        .send(WsMessage::Text(ack(&envelope.envelope_id)))
        .await
        .unwrap();
}

async fn until(what: &str, done: impl Fn() -> bool) {
    Poll::within(WAIT)
        .until_async(what, || std::future::ready(done()))
        .await;
}
