//! The fake's Socket Mode: tickets, `hello`, envelopes held until acknowledged, redelivery.

use super::*;
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub(super) async fn link(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let ticket = query.get("ticket").cloned().unwrap_or_default();
    if !state.lock().unwrap().tickets.remove(&ticket) {
        return (StatusCode::UNAUTHORIZED, "invalid ticket").into_response();
    }
    upgrade.on_upgrade(move |socket| connection(socket, state))
}

async fn connection(mut socket: WebSocket, state: Shared) {
    let (sender, mut outgoing) = mpsc::unbounded_channel();
    let (id, first) = {
        let mut state = state.lock().unwrap();
        state.opened += 1;
        state.next_connection += 1;
        let id = state.next_connection;
        if state.socket_disabled {
            (id, Err(disconnect_frame("link_disabled")))
        } else {
            let mut hello = fixture_body!("socket-hello.json");
            let live = state.connections.len() + 1;
            hello["num_connections"] = json!(live);
            hello["connection_info"]["app_id"] = json!(APP_ID);
            state.connections.push(Connection {
                id,
                sender,
                said_hello: true,
            });
            (id, Ok(hello.to_string()))
        }
    };
    match first {
        Err(disabled) => {
            let _ = socket.send(WsMessage::Text(disabled.into())).await;
            let _ = socket.send(WsMessage::Close(None)).await;
            return;
        }
        Ok(hello) => {
            if socket.send(WsMessage::Text(hello.into())).await.is_err() {
                forget(&state, id);
                return;
            }
        }
    }
    state.lock().unwrap().flush();
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(WsMessage::Text(text))) => received(&state, text.as_str()),
                Some(Ok(WsMessage::Ping(_))) => state.lock().unwrap().pings += 1,
                Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            out = outgoing.recv() => match out {
                Some(Out::Frame(frame)) => {
                    if socket.send(WsMessage::Text(frame.into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close) | None => {
                    let _ = socket.send(WsMessage::Close(None)).await;
                    break;
                }
            },
        }
    }
    forget(&state, id);
}

/// The connection is gone: what it held goes to the newest open one.
fn forget(state: &Shared, id: u64) {
    let mut state = state.lock().unwrap();
    state.connections.retain(|connection| connection.id != id);
    state.flush();
}

fn received(state: &Shared, text: &str) {
    let mut state = state.lock().unwrap();
    let frame: Value = serde_json::from_str(text).unwrap_or_else(|_| json!({ "unreadable": text }));
    state.client_frames.push(frame.clone());
    let Some(envelope_id) = frame["envelope_id"].as_str() else {
        return;
    };
    if let Some(at) = state
        .pending
        .iter()
        .position(|envelope| envelope.envelope_id == envelope_id)
    {
        state.pending.remove(at);
    }
    state.acked.push(envelope_id.to_owned());
}

/// Sends again, on the newest open connection, every envelope not acknowledged within the ack
/// timeout; gives up on one after [`MAX_RETRIES`] retries.
pub(super) async fn redeliver(state: Shared) {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut state = state.lock().unwrap();
        let timeout = state.ack_timeout;
        let mut overdue = false;
        let mut abandoned = Vec::new();
        state.pending.retain(|envelope| match envelope.sent {
            Some((_, at)) if at.elapsed() >= timeout => {
                if envelope.retry_attempt >= MAX_RETRIES {
                    abandoned.push(envelope.envelope_id.clone());
                    false
                } else {
                    overdue = true;
                    true
                }
            }
            _ => true,
        });
        state.abandoned.extend(abandoned);
        if overdue {
            for envelope in &mut state.pending {
                if envelope.sent.is_some_and(|(_, at)| at.elapsed() >= timeout) {
                    envelope.sent = Some((0, Instant::now()));
                }
            }
            state.flush();
        }
    }
}
