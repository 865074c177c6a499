//! The fake's gateway: HELLO, IDENTIFY and RESUME, heartbeats, dispatches and op 7.

use super::*;

pub(super) async fn gateway(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let version = query.get("v").cloned();
    upgrade.on_upgrade(move |socket| connection(socket, state, version))
}

async fn connection(mut socket: WebSocket, state: Shared, version: Option<String>) {
    if version.as_deref() != Some("10") {
        let _ = socket.send(close(4012, "Invalid API version")).await;
        return;
    }
    let (sender, mut outgoing) = mpsc::unbounded_channel();
    let (id, hello) = {
        let mut state = state.lock().unwrap();
        state.next_connection += 1;
        let id = state.next_connection;
        state.connections.push(Connection {
            id,
            sender,
            session: None,
        });
        let hello = (!state.frozen)
            .then(|| json!({"op": 10, "d": {"heartbeat_interval": state.heartbeat_interval}}));
        (id, hello)
    };
    if let Some(hello) = hello {
        let _ = socket.send(WsMessage::Text(hello.to_string().into())).await;
    }
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(WsMessage::Text(text))) => {
                    let answers = match serde_json::from_str::<Value>(text.as_str()) {
                        Ok(frame) => handle_frame(&state, id, frame),
                        Err(_) => vec![Out::Close(4002, "Error while decoding payload.")],
                    };
                    let mut closed = false;
                    for answer in answers {
                        match answer {
                            Out::Frame(frame) => {
                                let _ = socket.send(WsMessage::Text(frame.to_string().into())).await;
                            }
                            Out::Close(code, reason) => {
                                let _ = socket.send(close(code, reason)).await;
                                closed = true;
                            }
                        }
                    }
                    if closed {
                        break;
                    }
                }
                Some(Ok(WsMessage::Binary(_))) => {
                    let _ = socket.send(close(4002, "Error while decoding payload.")).await;
                    break;
                }
                Some(Ok(WsMessage::Close(_))) => {
                    let _ = socket.send(close(1000, "")).await;
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
            out = outgoing.recv() => match out {
                Some(Out::Frame(frame)) => {
                    if socket.send(WsMessage::Text(frame.to_string().into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code, reason)) => {
                    let _ = socket.send(close(code, reason)).await;
                    break;
                }
                None => break,
            },
        }
    }
    let mut state = state.lock().unwrap();
    state.connections.retain(|connection| connection.id != id);
    for session in state.sessions.values_mut() {
        if session.connection == Some(id) {
            session.connection = None;
        }
    }
}

fn close(code: u16, reason: &'static str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn handle_frame(state: &Shared, connection: u64, frame: Value) -> Vec<Out> {
    let mut state = state.lock().unwrap();
    state.frames.push(frame.clone());
    if state.frozen {
        return Vec::new();
    }
    let session = state
        .connections
        .iter()
        .find(|c| c.id == connection)
        .and_then(|c| c.session.clone());
    let token_ok = |data: &Value| data["token"] == json!(format!("Bot {TOKEN}"));
    match frame["op"].as_u64() {
        Some(1) => {
            state.heartbeats += 1;
            vec![Out::Frame(json!({"op": 11, "d": null}))]
        }
        Some(2) => {
            let data = &frame["d"];
            if session.is_some() {
                return vec![Out::Close(4005, "Already authenticated.")];
            }
            if !token_ok(data) {
                return vec![Out::Close(4004, "Authentication failed.")];
            }
            let Some(intents) = data["intents"].as_u64() else {
                return vec![Out::Close(4013, "Invalid intent(s).")];
            };
            if intents & MESSAGE_CONTENT != 0 && !state.privileged_intents {
                return vec![Out::Close(4014, "Disallowed intent(s).")];
            }
            state.identifies += 1;
            state.next_session += 1;
            let name = format!("fake-session-{}", state.next_session);
            state.sessions.insert(
                name.clone(),
                Session {
                    seq: 0,
                    intents,
                    events: Vec::new(),
                    connection: Some(connection),
                },
            );
            if let Some(live) = state.connections.iter_mut().find(|c| c.id == connection) {
                live.session = Some(name.clone());
            }
            let ready = state.ready(&name);
            let record = state.sessions.get_mut(&name).unwrap();
            record.seq += 1;
            let payload = json!({"op": 0, "t": "READY", "s": record.seq, "d": ready});
            record.events.push(payload.clone());
            vec![Out::Frame(payload)]
        }
        Some(6) => {
            let data = &frame["d"];
            if !token_ok(data) {
                return vec![Out::Close(4004, "Authentication failed.")];
            }
            let name = data["session_id"].as_str().unwrap_or_default().to_owned();
            let seq = data["seq"].as_u64().unwrap_or(0);
            let Some(record) = state.sessions.get_mut(&name) else {
                return vec![Out::Frame(json!({"op": 9, "d": false}))];
            };
            let mut answers: Vec<Out> = record
                .events
                .iter()
                .filter(|event| event["s"].as_u64().unwrap_or(0) > seq)
                .cloned()
                .map(Out::Frame)
                .collect();
            record.seq += 1;
            let resumed = json!({"op": 0, "t": "RESUMED", "s": record.seq, "d": {}});
            record.events.push(resumed.clone());
            record.connection = Some(connection);
            answers.push(Out::Frame(resumed));
            state.resumes += 1;
            if let Some(live) = state.connections.iter_mut().find(|c| c.id == connection) {
                live.session = Some(name);
            }
            answers
        }
        Some(3 | 4 | 8) if session.is_none() => vec![Out::Close(4003, "Not authenticated.")],
        Some(3 | 4 | 8) => Vec::new(),
        _ => vec![Out::Close(4001, "Unknown opcode.")],
    }
}
