//! The fake model's HTTP server: each request recorded, then answered from the queue of scripts.

use super::stream::{End, render};
use super::*;

pub(super) async fn accept(listener: TcpListener, api: Api, state: Arc<Mutex<State>>) {
    while let Ok((socket, _)) = listener.accept().await {
        socket.set_nodelay(true).ok();
        tokio::spawn(serve(socket, api, state.clone()));
    }
}

async fn serve(mut socket: TcpStream, api: Api, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut socket, &mut buffer).await {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut echo = None;
        let (script, n) = {
            let mut state = state.lock().unwrap();
            state.received.push(Received {
                method: request.method.clone(),
                path: request.path.clone(),
                headers: request.headers.clone(),
                body: body.clone(),
            });
            state.responses += 1;
            let script = if request.path == "/v1/models" && request.method == "GET" {
                list_models(api, &request, state.key.as_deref())
            } else if request.path == format!("/v1{}", path(api)) && request.method == "POST" {
                match (state.scripts.pop_front(), state.echo_after) {
                    (Some(script), _) => script,
                    (None, Some(delay)) => {
                        echo = Some(delay);
                        Script::text(&format!("echo: {}", last_user_content(&body)))
                    }
                    (None, None) => Script::text("(no script)"),
                }
            } else {
                Script::status(
                    404,
                    &format!("no route for {} {}", request.method, request.path),
                )
            };
            (script, state.responses)
        };
        let script = match script {
            Script::Held { script, gate } => {
                gate.opened().await;
                *script
            }
            script => script,
        };
        if let Some(delay) = echo {
            tokio::time::sleep(delay).await;
        }
        if !respond(&mut socket, api, n, &body, script).await {
            return;
        }
    }
}

/// `GET /v1/models`: a one-model list, or 401 for a key other than `required`.
fn list_models(api: Api, request: &super::super::http::Request, required: Option<&str>) -> Script {
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
    };
    let given = match api {
        Api::AnthropicMessages => header("x-api-key"),
        Api::OpenAiCompletions | Api::OpenAiResponses => {
            header("authorization").map(|value| value.trim_start_matches("Bearer ").to_owned())
        }
    };
    match required {
        Some(required) if given.as_deref() != Some(required) => Script::status(
            401,
            &format!("Incorrect API key provided: {}.", given.unwrap_or_default()),
        ),
        _ => Script::status_body(
            200,
            &json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                .to_string(),
        ),
    }
}

fn path(api: Api) -> &'static str {
    match api {
        Api::OpenAiCompletions => "/chat/completions",
        Api::OpenAiResponses => "/responses",
        Api::AnthropicMessages => "/messages",
    }
}

/// Answers one request; returns whether the connection can take another.
async fn respond(
    socket: &mut TcpStream,
    api: Api,
    n: u64,
    request: &Value,
    script: Script,
) -> bool {
    let (events, end) = match script {
        Script::Status {
            status,
            message,
            retry_after,
            body,
        } => {
            let body = body.unwrap_or_else(|| error_body(api, status, &message).to_string());
            let retry = retry_after
                .map(|value| format!("retry-after: {value}\r\n"))
                .unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}\r\n",
                reason(status),
                body.len()
            );
            let sent = socket.write_all(head.as_bytes()).await.is_ok()
                && socket.write_all(body.as_bytes()).await.is_ok();
            return sent;
        }
        script => render(api, n, request, script),
    };
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\nconnection: keep-alive\r\n\r\n";
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for event in events {
        let middle = event.len() / 2;
        for piece in [&event[..middle], &event[middle..]] {
            if piece.is_empty() {
                continue;
            }
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(piece);
            chunk.extend_from_slice(b"\r\n");
            if socket.write_all(&chunk).await.is_err() {
                return false;
            }
        }
    }
    match end {
        End::Finish => socket.write_all(b"0\r\n\r\n").await.is_ok(),
        End::Cut => {
            let _ = socket.shutdown().await;
            false
        }
        End::Stall => std::future::pending().await,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Site Overloaded",
        _ => "Error",
    }
}

fn error_body(api: Api, status: u16, message: &str) -> Value {
    match api {
        Api::AnthropicMessages => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake01"})
        }
        Api::OpenAiCompletions | Api::OpenAiResponses => {
            let (kind, code) = match status {
                401 => ("invalid_request_error", json!("invalid_api_key")),
                404 => ("invalid_request_error", json!("model_not_found")),
                429 => ("requests", json!("rate_limit_exceeded")),
                500..=599 => ("server_error", Value::Null),
                _ => ("invalid_request_error", Value::Null),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    }
}
