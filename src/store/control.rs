//! How commands reach a running `perch run`: `.perch/control.sock`, a Unix socket with mode 0600
//! (never a network listener). One JSON request per connection, one JSON answer, in the types of
//! `perch_core::control`. When no runner holds the directory, the commands act on `.perch/`
//! directly, under the directory's lock.

use crate::agent::AgentDir;
use perch_core::control::read_reply;
use serde::de::DeserializeOwned;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

pub use perch_core::control::ControlRequest;

/// Listens on `path` (replacing a stale socket file), mode 0600.
pub fn listen(path: &Path) -> Result<UnixListener, String> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            return Err(format!("{}: {error}", path.display()));
        }
        _ => {}
    }
    let listener =
        UnixListener::bind(path).map_err(|error| format!("{}: {error}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(listener)
}

/// The longest request line read; a request is a few dozen bytes.
const REQUEST_LIMIT: u64 = 64 * 1024;

/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop pauses after a failed accept (`EMFILE`, `ENFILE`, `ENOMEM`) before
/// it tries again: a spinning loop would take a core and flood the log while the descriptors
/// stay gone.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Accepts connections on `listener` until `shutdown` and answers each one with `handle`
/// ([`answer_one`]) in its own task. A failed accept is logged once per run of failures and
/// retried after [`ACCEPT_BACKOFF`].
pub async fn serve<H, Fut>(listener: UnixListener, shutdown: CancellationToken, handle: H)
where
    H: Fn(Result<ControlRequest, String>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = serde_json::Value> + Send + 'static,
{
    let mut failing = false;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                failing = false;
                let handle = handle.clone();
                tokio::spawn(async move {
                    let _ = answer_one(stream, handle).await;
                });
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(
                        "control socket: cannot accept a connection: {error}; retrying every {} ms",
                        ACCEPT_BACKOFF.as_millis()
                    );
                    failing = true;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

/// Reads one request from a connection (at most [`REQUEST_LIMIT`] bytes, within
/// [`REQUEST_TIMEOUT`]) and writes the answer `handle` gives.
pub async fn answer_one<F, Fut>(stream: UnixStream, handle: F) -> Result<(), String>
where
    F: FnOnce(Result<ControlRequest, String>) -> Fut,
    Fut: std::future::Future<Output = serde_json::Value>,
{
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        BufReader::new(reader.take(REQUEST_LIMIT)).read_line(&mut line),
    )
    .await
    .map_err(|_| "no request within the timeout".to_owned())?
    .map_err(|error| error.to_string())?;
    let request = ControlRequest::read(&line);
    let mut answer = handle(request).await.to_string();
    answer.push('\n');
    writer
        .write_all(answer.as_bytes())
        .await
        .map_err(|error| error.to_string())
}

/// Sends `request` to the service running in `dir` and reads its reply as a `T`; `None` when
/// none is listening, an error when it does not answer within `timeout`, refuses, or answers
/// something else.
pub async fn ask_within<T: DeserializeOwned>(
    dir: &AgentDir,
    request: &ControlRequest,
    timeout: Duration,
) -> Option<Result<T, String>> {
    match tokio::time::timeout(timeout, ask(dir, request)).await {
        Ok(answer) => answer,
        Err(_) => Some(Err(format!(
            "the running service did not answer within {} s",
            timeout.as_secs_f64()
        ))),
    }
}

/// Sends `request` to the service running in `dir` and reads its reply as a `T`; `None` when
/// none is listening, an error when it refuses or answers something else.
pub async fn ask<T: DeserializeOwned>(
    dir: &AgentDir,
    request: &ControlRequest,
) -> Option<Result<T, String>> {
    let stream = UnixStream::connect(dir.control_socket()).await.ok()?;
    Some(exchange(stream, request).await)
}

async fn exchange<T: DeserializeOwned>(
    stream: UnixStream,
    request: &ControlRequest,
) -> Result<T, String> {
    let (reader, mut writer) = stream.into_split();
    let mut text = serde_json::to_string(request).map_err(|error| error.to_string())?;
    text.push('\n');
    writer
        .write_all(text.as_bytes())
        .await
        .map_err(|error| error.to_string())?;
    let mut line = String::new();
    BufReader::new(reader)
        .read_line(&mut line)
        .await
        .map_err(|error| error.to_string())?;
    read_reply(&line)?
}
