//! The fake's Web API, its upload URLs and its file downloads.

use super::*;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

pub(super) async fn web(
    axum::extract::State(state): axum::extract::State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    if let Some(name) = path.strip_prefix("/api/") {
        let arguments = arguments(uri.query(), &headers, &body);
        return api(&state, name, &headers, arguments);
    }
    if let Some(file_id) = path.strip_prefix("/upload/v1/") {
        return upload(&state, file_id, &headers, &body);
    }
    if path.starts_with("/files-pri/") && method == Method::GET {
        return download(&state, &path, &headers);
    }
    if path == "/signin" {
        return html(StatusCode::OK, "<html><body>Sign in to Slack</body></html>");
    }
    html(StatusCode::NOT_FOUND, "<html><body>Not Found</body></html>")
}

fn html(status: StatusCode, body: &'static str) -> Response {
    (status, [("content-type", "text/html")], body).into_response()
}

fn answer(body: Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

fn error(error: &str) -> Response {
    answer(json!({"ok": false, "error": error}))
}

fn failure(failure: &Failure) -> Response {
    match failure {
        Failure::RateLimited { seconds } => {
            let body = fixture_body!("web-chat.postMessage-ratelimited.json");
            (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    ("content-type", "application/json; charset=utf-8".to_owned()),
                    ("retry-after", seconds.to_string()),
                ],
                body.to_string(),
            )
                .into_response()
        }
        Failure::Error(name) => error(name),
        Failure::Status(status) => html(
            StatusCode::from_u16(*status).unwrap(),
            "<html><body>upstream error</body></html>",
        ),
    }
}

/// The call's arguments from its query and its body (a form, or JSON).
fn arguments(query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Value {
    let mut arguments = serde_json::Map::new();
    let form = |text: &[u8], into: &mut serde_json::Map<String, Value>| {
        for (key, value) in url::form_urlencoded::parse(text) {
            into.insert(key.into_owned(), Value::String(value.into_owned()));
        }
    };
    if let Some(query) = query {
        form(query.as_bytes(), &mut arguments);
    }
    let content_type = headers
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if content_type.starts_with("application/json") {
        if let Ok(Value::Object(map)) = serde_json::from_slice(body) {
            arguments.extend(map);
        }
    } else {
        form(body, &mut arguments);
    }
    Value::Object(arguments)
}

fn token_kind(headers: &HeaderMap) -> &'static str {
    let Some(value) = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
    else {
        return "none";
    };
    match value.strip_prefix("Bearer ") {
        Some(BOT_TOKEN) => "bot",
        Some(APP_TOKEN) => "app",
        _ => "unknown",
    }
}

fn text_of(arguments: &Value, key: &str) -> Option<String> {
    match &arguments[key] {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn api(state: &Shared, name: &str, headers: &HeaderMap, arguments: Value) -> Response {
    let mut state = state.lock().unwrap();
    let token = token_kind(headers);
    state.calls.push(Call {
        method: name.to_owned(),
        token,
        arguments: arguments.clone(),
    });
    let wants = if name == "apps.connections.open" {
        "app"
    } else {
        "bot"
    };
    match token {
        "none" => return error("not_authed"),
        "unknown" => return error("invalid_auth"),
        kind if kind != wants => return error("not_allowed_token_type"),
        _ => {}
    }
    let scopes = match token {
        "app" => Some(APP_SCOPE.to_owned()),
        _ => state.bot_scopes.as_ref().map(|scopes| scopes.join(",")),
    };
    let mut response = respond(&mut state, name, &arguments);
    if let Some(scopes) = scopes {
        response
            .headers_mut()
            .insert("x-oauth-scopes", scopes.parse().unwrap());
    }
    response
}

/// The answer of `name` to a token of the kind it wants.
fn respond(state: &mut Platform, name: &str, arguments: &Value) -> Response {
    if let Some(at) = state.failures.iter().position(|(method, _)| method == name) {
        let (_, scripted) = state.failures.remove(at).unwrap();
        return failure(&scripted);
    }
    match name {
        "apps.connections.open" => {
            if let Some(refusal) = state.open_error.clone() {
                return error(&refusal);
            }
            let ticket = format!("{:016x}", state.next().wrapping_mul(0x9e37_79b9_7f4a_7c15));
            state.tickets.insert(ticket.clone());
            let mut body = fixture_body!("web-apps.connections.open.json");
            body["url"] = json!(format!(
                "ws://{}/link/?ticket={ticket}&app_id={APP_ID}",
                state.addr
            ));
            answer(body)
        }
        "auth.test" => answer(fixture_body!("web-auth.test-bot.json")),
        "chat.postMessage" => post_message(state, arguments),
        "users.info" => {
            let id = text_of(arguments, "user").unwrap_or_default();
            match state.users.get(&id) {
                Some(user) => answer(json!({"ok": true, "user": user.json()})),
                None => error("user_not_found"),
            }
        }
        "files.getUploadURLExternal" => {
            let filename = text_of(arguments, "filename").unwrap_or_default();
            let Some(length) = text_of(arguments, "length").and_then(|n| n.parse().ok()) else {
                return error("invalid_arguments");
            };
            if filename.is_empty() {
                return error("invalid_arguments");
            }
            let file_id = format!("F{:09}", state.next());
            state.uploads.insert(
                file_id.clone(),
                UploadSlot {
                    name: filename,
                    length,
                    bytes: None,
                },
            );
            let mut body = fixture_body!("web-files.getUploadURLExternal.json");
            body["upload_url"] = json!(format!("http://{}/upload/v1/{file_id}", state.addr));
            body["file_id"] = json!(file_id);
            answer(body)
        }
        "files.completeUploadExternal" => complete_upload(state, arguments),
        _ => error("unknown_method"),
    }
}

fn post_message(state: &mut Platform, arguments: &Value) -> Response {
    let channel = text_of(arguments, "channel").unwrap_or_default();
    if !state.channels.contains_key(&channel) {
        return error("channel_not_found");
    }
    let text = text_of(arguments, "text").unwrap_or_default();
    if text.is_empty() {
        return error("no_text");
    }
    if text.chars().count() > MAX_TEXT {
        return error("msg_too_long");
    }
    let thread_ts = text_of(arguments, "thread_ts").filter(|ts| !ts.is_empty());
    let ts = state.ts();
    let message = posted_message(state, &channel, &ts, thread_ts.as_deref(), &text, None);
    state.posted.push(Posted {
        method: "chat.postMessage".into(),
        channel: channel.clone(),
        ts: ts.clone(),
        thread_ts,
        text,
        arguments: arguments.clone(),
        files: Vec::new(),
    });
    let mut body = fixture_body!("web-chat.postMessage.json");
    body["channel"] = json!(channel);
    body["ts"] = json!(ts);
    body["message"] = message;
    answer(body)
}

/// The bot's message as Slack keeps it, echoed as a `message` event when the fake does.
fn posted_message(
    state: &mut Platform,
    channel: &str,
    ts: &str,
    thread_ts: Option<&str>,
    text: &str,
    files: Option<Value>,
) -> Value {
    let mut message = json!({
        "type": "message", "user": BOT_USER, "bot_id": BOT_ID, "app_id": APP_ID,
        "text": text, "ts": ts, "team": TEAM,
    });
    if let Some(thread_ts) = thread_ts {
        message["thread_ts"] = json!(thread_ts);
    }
    if let Some(files) = files {
        message["files"] = files;
        message["subtype"] = json!("file_share");
    }
    if state.echo_own_posts {
        let mut event = message.clone();
        let kind = state.kind(channel);
        event["channel"] = json!(channel);
        event["channel_type"] = json!(kind.channel_type());
        event["event_ts"] = json!(ts);
        state.enqueue(event);
    }
    message
}

fn complete_upload(state: &mut Platform, arguments: &Value) -> Response {
    let files: Vec<Value> = match &arguments["files"] {
        Value::String(text) => serde_json::from_str(text).unwrap_or_default(),
        Value::Array(files) => files.clone(),
        _ => Vec::new(),
    };
    if files.is_empty() {
        return error("invalid_arguments");
    }
    let channel = text_of(arguments, "channel_id");
    if let Some(channel) = &channel
        && !state.channels.contains_key(channel)
    {
        return error("channel_not_found");
    }
    let mut shared = Vec::new();
    let mut completed = Vec::new();
    for file in &files {
        let id = file["id"].as_str().unwrap_or_default().to_owned();
        let Some(slot) = state.uploads.get(&id) else {
            return error("file_not_found");
        };
        let Some(bytes) = slot.bytes.clone() else {
            return error("file_not_found");
        };
        if bytes.len() != slot.length {
            return error("file_upload_size_mismatch");
        }
        let title = file["title"].as_str().unwrap_or(&slot.name).to_owned();
        completed.push(json!({"id": id, "title": title}));
        shared.push((slot.name.clone(), bytes));
    }
    for file in &files {
        if let Some(id) = file["id"].as_str() {
            state.uploads.remove(id);
        }
    }
    if let Some(channel) = channel {
        let thread_ts = text_of(arguments, "thread_ts").filter(|ts| !ts.is_empty());
        let text = text_of(arguments, "initial_comment").unwrap_or_default();
        let ts = state.ts();
        let file_objects: Vec<Value> = completed
            .iter()
            .zip(&shared)
            .map(|(file, (name, bytes))| {
                state.file_json(
                    file["id"].as_str().unwrap(),
                    name,
                    "application/octet-stream",
                    bytes.len(),
                    BOT_USER,
                )
            })
            .collect();
        posted_message(
            state,
            &channel,
            &ts,
            thread_ts.as_deref(),
            &text,
            Some(json!(file_objects)),
        );
        state.posted.push(Posted {
            method: "files.completeUploadExternal".into(),
            channel,
            ts,
            thread_ts,
            text,
            arguments: arguments.clone(),
            files: shared,
        });
    }
    let mut body = fixture_body!("web-files.completeUploadExternal.json");
    body["files"] = json!(completed);
    answer(body)
}

/// The bytes of a file, sent raw or as the `file` part of a multipart form.
fn upload(state: &Shared, file_id: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let content_type = headers
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let bytes = super::super::http::parse_multipart(content_type, body)
        .and_then(|parts| parts.into_iter().find(|part| part.name == "file"))
        .map_or_else(|| body.to_vec(), |part| part.body);
    let mut state = state.lock().unwrap();
    let Some(slot) = state.uploads.get_mut(file_id) else {
        return html(StatusCode::NOT_FOUND, "<html><body>Not Found</body></html>");
    };
    let length = bytes.len();
    slot.bytes = Some(bytes);
    (StatusCode::OK, format!("OK - {length}")).into_response()
}

/// A shared file, for the bot token only; without it Slack sends the browser to sign in.
fn download(state: &Shared, path: &str, headers: &HeaderMap) -> Response {
    let authorized = token_kind(headers) == "bot";
    let mut state = state.lock().unwrap();
    state.downloads.push((path.to_owned(), authorized));
    if let Some(elsewhere) = state.redirect_downloads.clone() {
        return (StatusCode::FOUND, [("location", elsewhere)]).into_response();
    }
    if !authorized {
        return (StatusCode::FOUND, [("location", "/signin".to_owned())]).into_response();
    }
    let id = path
        .trim_start_matches("/files-pri/")
        .split('/')
        .next()
        .and_then(|team_and_id| team_and_id.rsplit('-').next())
        .unwrap_or_default();
    match state.files.get(id) {
        Some((_, bytes)) => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            bytes.clone(),
        )
            .into_response(),
        None => html(StatusCode::NOT_FOUND, "<html><body>Not Found</body></html>"),
    }
}
