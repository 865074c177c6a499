//! The fake Bot API's HTTP server: one task per connection, each request answered by the rules
//! the module documentation lists.

use super::markdown::parse_markdown_v2;
use super::*;

pub(super) async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((socket, _)) = listener.accept().await {
        socket.set_nodelay(true).ok();
        tokio::spawn(serve(socket, shared.clone()));
    }
}

/// An answer: the HTTP status and the JSON body.
struct Answer(u16, Value);

fn ok(result: Value) -> Answer {
    Answer(200, json!({"ok": true, "result": result}))
}

fn error(code: u16, description: &str) -> Answer {
    Answer(
        code,
        json!({"ok": false, "error_code": code, "description": description}),
    )
}

fn bad_request(description: &str) -> Answer {
    error(400, &format!("Bad Request: {description}"))
}

async fn serve(mut socket: TcpStream, shared: Arc<Shared>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut socket, &mut buffer).await {
        let (status, content_type, body) = if request.path.starts_with("/file/") {
            download(&shared, &request)
        } else {
            let Answer(status, body) = answer(&shared, request).await;
            (status, "application/json", body.to_string().into_bytes())
        };
        let head = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            reason(status),
            body.len()
        );
        if socket.write_all(head.as_bytes()).await.is_err()
            || socket.write_all(&body).await.is_err()
        {
            return;
        }
    }
}

/// `%XX` escapes decoded, as the Bot API server decodes a file path.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `GET /file/bot<token>/<file_path>`: the file's bytes.
fn download(shared: &Shared, request: &Request) -> (u16, &'static str, Vec<u8>) {
    let not_found = (404, "text/plain", b"Not Found".to_vec());
    let Some((token, path)) = request
        .path
        .strip_prefix("/file/bot")
        .and_then(|rest| rest.split_once('/'))
    else {
        return not_found;
    };
    if token != TOKEN || request.method != "GET" {
        return not_found;
    }
    let path = percent_decode(path);
    let mut state = shared.state.lock().unwrap();
    state.downloads.push(path.clone());
    if state.downloads_broken {
        return not_found;
    }
    match state.files.values().find(|(known, _, _)| *known == path) {
        Some((_, bytes, _)) => (200, "application/octet-stream", bytes.clone()),
        None => not_found,
    }
}

async fn answer(shared: &Shared, request: Request) -> Answer {
    let Some((token, method)) = request
        .path
        .strip_prefix("/bot")
        .and_then(|rest| rest.split_once('/'))
    else {
        return error(404, "Not Found");
    };
    if token != TOKEN {
        return error(401, "Unauthorized");
    }
    let name = method.to_ascii_lowercase();
    if !matches!(
        name.as_str(),
        "getme"
            | "getupdates"
            | "sendmessage"
            | "sendchataction"
            | "getwebhookinfo"
            | "deletewebhook"
            | "getfile"
            | "senddocument"
    ) {
        return error(404, "Not Found: method not found");
    }
    let content_type = request
        .headers
        .iter()
        .find(|(name, _)| name == "content-type")
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    let json_body = content_type
        .to_ascii_lowercase()
        .starts_with("application/json");
    let mut uploaded = Vec::new();
    let params: Option<Value> = if json_body {
        serde_json::from_slice(&request.body).ok()
    } else {
        parse_multipart(&content_type, &request.body).map(|parts| {
            let mut fields = serde_json::Map::new();
            for part in parts {
                match part.filename {
                    Some(filename) => uploaded.push((part.name, filename, part.body)),
                    None => {
                        let text = String::from_utf8_lossy(&part.body).into_owned();
                        let value = match part.name.as_str() {
                            "chat_id" | "message_thread_id" | "reply_parameters" => {
                                serde_json::from_str(&text).unwrap_or(Value::String(text))
                            }
                            _ => Value::String(text),
                        };
                        fields.insert(part.name, value);
                    }
                }
            }
            Value::Object(fields)
        })
    };
    let params = match params {
        Some(params @ Value::Object(_)) if request.method == "POST" => params,
        _ => {
            return bad_request(
                "the fake Bot API accepts only POST with a JSON object or multipart body",
            );
        }
    };
    let forced = {
        let mut state = shared.state.lock().unwrap();
        state.calls.push(Call {
            method: method.to_owned(),
            body: params.clone(),
        });
        let position = state
            .failures
            .iter()
            .position(|(method, _)| *method == name);
        let chat = chat_id(&params);
        position
            .and_then(|index| state.failures.remove(index))
            .or_else(|| {
                state
                    .rate_limits
                    .iter()
                    .find(|(method, limited, _)| {
                        *method == name && limited.is_none_or(|limited| Some(limited) == chat)
                    })
                    .map(|(method, _, seconds)| (method.clone(), Failure::RetryAfter(*seconds)))
            })
    };
    if let Some((_, failure)) = forced {
        return match failure {
            Failure::RetryAfter(seconds) => Answer(
                429,
                json!({"ok": false, "error_code": 429,
                    "description": format!("Too Many Requests: retry after {seconds}"),
                    "parameters": {"retry_after": seconds}}),
            ),
            Failure::Api { code, description } => error(code, &description),
        };
    }
    match name.as_str() {
        "getme" => ok(json!({
            "id": BOT_ID, "is_bot": true, "first_name": BOT_NAME, "username": BOT_USERNAME,
            "can_join_groups": true, "can_read_all_group_messages": false,
            "supports_inline_queries": false, "can_connect_to_business": false,
            "has_main_web_app": false,
        })),
        "getwebhookinfo" => {
            let pending = shared.state.lock().unwrap().pending.len();
            ok(json!({"url": "", "has_custom_certificate": false, "pending_update_count": pending}))
        }
        "deletewebhook" => ok(json!(true)),
        "getupdates" => get_updates(shared, &params).await,
        "sendmessage" => send_message(&mut shared.state.lock().unwrap(), &params, None),
        "getfile" => get_file(&shared.state.lock().unwrap(), &params),
        "senddocument" => send_document(&mut shared.state.lock().unwrap(), &params, uploaded),
        _ => send_chat_action(&mut shared.state.lock().unwrap(), &params),
    }
}

/// A call's `chat_id`, sent as a number or as a string.
pub(super) fn chat_id(params: &Value) -> Option<i64> {
    let chat = params.get("chat_id")?;
    chat.as_i64()
        .or_else(|| chat.as_str().and_then(|text| text.parse().ok()))
}

async fn get_updates(shared: &Shared, params: &Value) -> Answer {
    let offset = params.get("offset").and_then(Value::as_i64).unwrap_or(0);
    let limit = params
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(100)
        .clamp(1, 100) as usize;
    let timeout = params
        .get("timeout")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(50);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let generation = {
        let mut state = shared.state.lock().unwrap();
        state.generation += 1;
        if let Some(allowed) = params.get("allowed_updates").and_then(Value::as_array) {
            state.allowed = Some(
                allowed
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            );
        }
        if offset > 0 {
            state.pending.retain(|pending| pending.update_id >= offset);
        } else if offset < 0 {
            let keep = offset.unsigned_abs() as usize;
            let drop = state.pending.len().saturating_sub(keep);
            state.pending.drain(..drop);
        }
        state.generation
    };
    shared.changed.notify_waiters();
    loop {
        let notified = shared.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut state = shared.state.lock().unwrap();
            if state.generation != generation {
                return error(409, CONFLICT);
            }
            if let Some(allowed) = state.allowed.clone()
                && !allowed.is_empty()
            {
                state
                    .pending
                    .retain(|pending| allowed.iter().any(|kind| kind == pending.kind));
            }
            if !state.pending.is_empty() || tokio::time::Instant::now() >= deadline {
                let updates: Vec<Value> = state
                    .pending
                    .iter()
                    .take(limit)
                    .map(|pending| {
                        let mut update = json!({"update_id": pending.update_id});
                        update[pending.kind] = pending.message.clone();
                        update
                    })
                    .collect();
                return ok(Value::Array(updates));
            }
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

fn get_file(state: &State, params: &Value) -> Answer {
    let id = params.get("file_id").and_then(Value::as_str).unwrap_or("");
    let Some((path, _, size)) = state.files.get(id) else {
        return bad_request("invalid file_id");
    };
    if *size > MAX_DOWNLOAD {
        return bad_request("file is too big");
    }
    ok(json!({"file_id": id, "file_unique_id": format!("u-{id}"),
        "file_size": size, "file_path": path}))
}

fn send_document(
    state: &mut State,
    params: &Value,
    uploaded: Vec<(String, String, Vec<u8>)>,
) -> Answer {
    let field = match params.get("document").and_then(Value::as_str) {
        Some(value) => value.strip_prefix("attach://").unwrap_or(value).to_owned(),
        None => "document".to_owned(),
    };
    let Some((_, name, bytes)) = uploaded.into_iter().find(|(name, _, _)| *name == field) else {
        return bad_request("there is no document in the request");
    };
    if bytes.is_empty() {
        return bad_request("file must be non-empty");
    }
    send_message(state, params, Some((name, bytes)))
}

fn send_message(state: &mut State, params: &Value, document: Option<(String, Vec<u8>)>) -> Answer {
    let Some(chat_id) = params.get("chat_id").and_then(Value::as_i64) else {
        return bad_request("chat not found");
    };
    let text = match (&document, params.get("text"), params.get("caption")) {
        (None, Some(Value::String(text)), _) => text.as_str(),
        (Some(_), _, Some(Value::String(caption))) => caption.as_str(),
        (Some(_), _, None) => "",
        _ => return bad_request("message text is empty"),
    };
    let parse_mode = params
        .get("parse_mode")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let shown = match parse_mode.as_deref() {
        None => text.to_owned(),
        Some("MarkdownV2") => match parse_markdown_v2(text) {
            Ok(shown) => shown,
            Err(why) => return bad_request(&format!("can't parse entities: {why}")),
        },
        Some(_) => return bad_request("unsupported parse_mode"),
    };
    if document.is_none() && shown.trim().is_empty() {
        return bad_request("message text is empty");
    }
    if document.is_none() && shown.chars().count() > MAX_TEXT {
        return bad_request("message is too long");
    }
    if document.is_some() && shown.chars().count() > MAX_CAPTION {
        return bad_request("message caption is too long");
    }
    let Some(chat) = state.chats.get_mut(&chat_id) else {
        return bad_request("chat not found");
    };
    let thread = params.get("message_thread_id").and_then(Value::as_i64);
    if let Some(thread) = thread
        && !chat.threads.contains(&thread)
    {
        return bad_request("message thread not found");
    }
    let mut reply_to = None;
    if let Some(reply) = params.get("reply_parameters") {
        let message_id = reply.get("message_id").and_then(Value::as_i64);
        let other_chat = reply
            .get("chat_id")
            .and_then(Value::as_i64)
            .filter(|id| *id != chat_id);
        let allow = reply
            .get("allow_sending_without_reply")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let exists = match (message_id, other_chat) {
            (Some(message_id), None) => chat.messages.contains_key(&message_id),
            (Some(_), Some(_)) => true,
            (None, _) => false,
        };
        if !exists && !allow {
            return bad_request("message to be replied not found");
        }
        if exists && other_chat.is_none() {
            reply_to = message_id;
        }
    }
    let message_id = chat.next_message_id;
    chat.next_message_id += 1;
    let mut message = json!({
        "message_id": message_id,
        "from": User::me().json(),
        "chat": chat.json,
        "date": now(),
    });
    match &document {
        None => message["text"] = json!(shown),
        Some((name, bytes)) => {
            message["document"] = json!({"file_id": format!("sent-{message_id}"),
                "file_unique_id": format!("s{message_id}"), "file_name": name,
                "file_size": bytes.len()});
            if !shown.is_empty() {
                message["caption"] = json!(shown);
            }
        }
    }
    if let Some(thread) = thread {
        message["message_thread_id"] = json!(thread);
        message["is_topic_message"] = json!(true);
    }
    if let Some(original) = reply_to.and_then(|id| chat.messages.get(&id)) {
        let mut original = original.clone();
        if let Some(object) = original.as_object_mut() {
            object.remove("reply_to_message");
        }
        message["reply_to_message"] = original;
    }
    chat.messages.insert(message_id, message.clone());
    state.sent.push(Sent {
        chat_id,
        message_id,
        text: text.to_owned(),
        parse_mode,
        shown,
        reply_to,
        thread,
        params: params.clone(),
        document,
    });
    ok(message)
}

fn send_chat_action(state: &mut State, params: &Value) -> Answer {
    let Some(chat_id) = params.get("chat_id").and_then(Value::as_i64) else {
        return bad_request("chat not found");
    };
    if !state.chats.contains_key(&chat_id) {
        return bad_request("chat not found");
    }
    let action = params.get("action").and_then(Value::as_str).unwrap_or("");
    let known = [
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    ];
    if !known.contains(&action) {
        return bad_request("wrong parameter action in request");
    }
    let thread = params.get("message_thread_id").and_then(Value::as_i64);
    state.actions.push((chat_id, action.to_owned(), thread));
    ok(json!(true))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        429 => "Too Many Requests",
        _ => "Error",
    }
}
