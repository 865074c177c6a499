//! The fake's REST API: authentication, errors, rate limit buckets, messages and files.

use super::*;

pub(super) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_') {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

fn error(status: u16, code: i64, message: &str) -> Response {
    error_with(status, json!({"code": code, "message": message}))
}

fn error_with(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn failure_response(failure: &Failure, bucket: Option<(u32, f64)>) -> Response {
    let Some(retry_after) = failure.retry_after else {
        return error(failure.status, failure.code, &failure.message);
    };
    let body = json!({
        "message": failure.message, "retry_after": retry_after, "global": false,
        "code": failure.code,
    });
    let mut response = error_with(failure.status, body);
    let (limit, _) = bucket.unwrap_or((5, retry_after));
    let headers = response.headers_mut();
    insert(headers, "retry-after", retry_after.ceil().to_string());
    rate_headers(headers, limit, 0, retry_after);
    insert(headers, "x-ratelimit-scope", "user".into());
    response
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: String) {
    headers.insert(name, HeaderValue::from_str(&value).unwrap());
}

fn rate_headers(headers: &mut HeaderMap, limit: u32, remaining: u32, reset_after: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    insert(headers, "x-ratelimit-limit", limit.to_string());
    insert(headers, "x-ratelimit-remaining", remaining.to_string());
    insert(
        headers,
        "x-ratelimit-reset",
        format!("{:.3}", now.as_secs_f64() + reset_after),
    );
    insert(
        headers,
        "x-ratelimit-reset-after",
        format!("{reset_after:.3}"),
    );
    insert(
        headers,
        "x-ratelimit-bucket",
        "fake-channel-messages".into(),
    );
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) async fn rest(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query: HashMap<String, String> = uri
        .query()
        .map(|query| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let mut state = state.lock().unwrap();
    state.requests.push(format!("{method} {path}"));
    if let Some(rest) = path.strip_prefix("/attachments/") {
        let authorized = headers.contains_key("authorization");
        state.downloads.push((path.clone(), authorized));
        let id = rest.split('/').nth(1).and_then(|id| id.parse::<u64>().ok());
        return match id.and_then(|id| state.cdn.get(&id)) {
            Some(bytes) if method == Method::GET => (
                StatusCode::OK,
                [("content-type", "application/octet-stream")],
                bytes.clone(),
            )
                .into_response(),
            _ => (StatusCode::NOT_FOUND, "Not Found").into_response(),
        };
    }
    let Some(rest) = path.strip_prefix("/api/v10/") else {
        return error(404, 0, "404: Not Found");
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let route = match (&method, segments.as_slice()) {
        (&Method::GET, ["gateway"]) => Route::Gateway,
        (&Method::GET, ["users", "@me"]) => Route::CurrentUser,
        (&Method::GET, ["channels", _]) => Route::GetChannel,
        (&Method::GET, ["channels", _, "messages"]) => Route::GetMessages,
        (&Method::POST, ["channels", _, "messages"]) => Route::CreateMessage,
        (&Method::POST, ["channels", _, "typing"]) => Route::Typing,
        (_, ["gateway"] | ["users", "@me"] | ["channels", _, "messages" | "typing"]) => {
            return error(405, 0, "405: Method Not Allowed");
        }
        _ => return error(404, 0, "404: Not Found"),
    };
    let authorized = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        == Some(format!("Bot {TOKEN}").as_str());
    if route != Route::Gateway && !authorized {
        return error(401, 0, "401: Unauthorized");
    }
    let channel = segments
        .get(1)
        .and_then(|id| id.parse::<u64>().ok())
        .unwrap_or(0);
    let bucket = if route == Route::CreateMessage {
        let limit = state.bucket_limit;
        let window = state.bucket_window;
        let bucket = state.buckets.entry(channel).or_insert(Bucket {
            started: Instant::now(),
            used: 0,
        });
        if bucket.started.elapsed() >= window {
            *bucket = Bucket {
                started: Instant::now(),
                used: 0,
            };
        }
        let reset_after = (window.saturating_sub(bucket.started.elapsed())).as_secs_f64();
        if bucket.used >= limit {
            let failure = Failure::rate_limited((reset_after * 1000.0).ceil() / 1000.0);
            return failure_response(&failure, Some((limit, reset_after)));
        }
        bucket.used += 1;
        Some((limit, limit - bucket.used, reset_after))
    } else {
        None
    };
    if let Some(failure) = state.take_failure(route) {
        return failure_response(&failure, bucket.map(|(limit, _, reset)| (limit, reset)));
    }
    let mut response = match route {
        Route::Gateway => json_response(
            StatusCode::OK,
            &json!({"url": format!("ws://{}/gw", state.addr)}),
        ),
        Route::CurrentUser => json_response(
            StatusCode::OK,
            &json!({"id": BOT_ID.to_string(), "username": "perch-bot", "discriminator": "0",
                    "global_name": null, "avatar": null, "bot": true, "verified": true,
                    "mfa_enabled": false, "flags": 0}),
        ),
        Route::GetChannel => match state.channel_json(channel) {
            Some(found) => json_response(StatusCode::OK, &found),
            None => error(404, 10003, "Unknown Channel"),
        },
        Route::GetMessages => get_messages(&state, channel, &query),
        Route::Typing => {
            if !state.channels.contains_key(&channel) {
                return error(404, 10003, "Unknown Channel");
            }
            state.typing.push(channel);
            StatusCode::NO_CONTENT.into_response()
        }
        Route::CreateMessage => {
            let content_type = headers
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            create_message(&mut state, channel, &content_type, &body)
        }
    };
    if let Some((limit, remaining, reset_after)) = bucket {
        rate_headers(response.headers_mut(), limit, remaining, reset_after);
    }
    response
}

fn get_messages(state: &Platform, channel: u64, query: &HashMap<String, String>) -> Response {
    let Some(record) = state.channels.get(&channel) else {
        return error(404, 10003, "Unknown Channel");
    };
    let limit = match query.get("limit").map(|limit| limit.parse::<usize>()) {
        None => 50,
        Some(Ok(limit)) if (1..=100).contains(&limit) => limit,
        Some(_) => {
            return error_with(
                400,
                json!({"code": 50035, "message": "Invalid Form Body",
                       "errors": {"limit": {"_errors": [{"code": "NUMBER_TYPE_MAX", "message": "int value should be less than or equal to 100."}]}}}),
            );
        }
    };
    let id = |message: &Value| -> u64 { message["id"].as_str().unwrap().parse().unwrap() };
    let mut page: Vec<Value> =
        if let Some(after) = query.get("after").and_then(|v| v.parse::<u64>().ok()) {
            record
                .messages
                .iter()
                .filter(|message| id(message) > after)
                .take(limit)
                .cloned()
                .collect()
        } else {
            let before = query
                .get("before")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(u64::MAX);
            let older: Vec<&Value> = record
                .messages
                .iter()
                .filter(|message| id(message) < before)
                .collect();
            older[older.len().saturating_sub(limit)..]
                .iter()
                .map(|message| (*message).clone())
                .collect()
        };
    page.reverse();
    json_response(StatusCode::OK, &Value::Array(page))
}

fn create_message(
    state: &mut Platform,
    channel: u64,
    content_type: &str,
    body: &Bytes,
) -> Response {
    let mut files = Vec::new();
    let json = if content_type.starts_with("multipart/form-data") {
        let Some(parts) = parse_multipart(content_type, body) else {
            return error(400, 50035, "Invalid Form Body");
        };
        let mut json = None;
        for part in parts {
            if part.name == "payload_json" {
                json = Some(part.body);
            } else if part.name.starts_with("files[") {
                files.push(FakeFile {
                    name: part.filename.unwrap_or_default(),
                    content_type: part.content_type,
                    bytes: part.body,
                    declared: None,
                });
            }
        }
        json.unwrap_or_default()
    } else {
        body.to_vec()
    };
    let Ok(body) = serde_json::from_slice::<Value>(&json) else {
        return error(400, 50109, "The request body contains invalid JSON.");
    };
    if !state.channels.contains_key(&channel) {
        return error(404, 10003, "Unknown Channel");
    }
    let content = body["content"].as_str().unwrap_or_default().to_owned();
    let mut errors = Map::new();
    let too_long = |limit: usize| json!({"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": format!("Must be {limit} or fewer in length.")}]});
    if content.chars().count() > 2000 {
        errors.insert("content".into(), too_long(2000));
    }
    let nonce = match &body["nonce"] {
        Value::Null => None,
        Value::String(text) if text.chars().count() > 25 => {
            errors.insert("nonce".into(), too_long(25));
            None
        }
        other => Some(other.clone()),
    };
    let mut reference = None;
    if let Some(wanted) = body.get("message_reference").filter(|r| !r.is_null()) {
        let found = wanted["message_id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .and_then(|id| state.find(channel, id));
        match found {
            Some(original) => reference = Some(original),
            None if wanted["fail_if_not_exists"] == json!(false) => {}
            None => {
                errors.insert(
                    "message_reference".into(),
                    json!({"_errors": [{"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}]}),
                );
            }
        }
    }
    if !errors.is_empty() {
        return error_with(
            400,
            json!({"code": 50035, "message": "Invalid Form Body", "errors": errors}),
        );
    }
    if content.is_empty() && files.is_empty() && body["embeds"].as_array().is_none_or(Vec::is_empty)
    {
        return error(400, 50006, "Cannot send an empty message");
    }
    let enforce = body["enforce_nonce"] == json!(true);
    let key = nonce.as_ref().map(|nonce| (BOT_ID, nonce.to_string()));
    if enforce
        && let Some((first, at)) = key.as_ref().and_then(|key| state.nonces.get(key))
        && at.elapsed() < state.nonce_window
    {
        return json_response(StatusCode::OK, first);
    }
    let bot = state.users[&BOT_ID].clone();
    let message = state.create(channel, &bot, &content, reference, nonce, &files);
    if let Some(key) = key {
        state.nonces.insert(key, (message.clone(), Instant::now()));
    }
    state.posted.push(Posted {
        channel,
        body,
        message: message.clone(),
        files,
    });
    json_response(StatusCode::OK, &message)
}
