//! How commands reach a running `perch run`: `.perch/control.sock`, a Unix socket with mode 0600
//! (never a network listener). One JSON request per connection, one JSON answer. When no runner
//! holds the directory, the commands act on `.perch/` directly, under the directory's lock.

use crate::agent::AgentDir;
use perch_core::pairing::Pairing;
use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// A request to the running service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum ControlRequest {
    PairApprove { code: String },
    Status,
    HeartbeatRun { task: String, dry_run: bool },
    HeartbeatResume { task: String },
    HeartbeatList,
}

pub fn socket_path(dir: &AgentDir) -> PathBuf {
    dir.state_dir().join("control.sock")
}

pub fn pairing_path(dir: &AgentDir) -> PathBuf {
    dir.state_dir().join("pairing.json")
}

/// The pairing state as `.perch/pairing.json` holds it (empty if there is none).
pub fn read_pairing(path: &Path) -> Result<Pairing, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|error| format!("{}: not a pairing file: {error}", path.display())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Pairing::default()),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

/// Writes the pairing state atomically (temporary file, fsync, rename).
pub fn write_pairing(path: &Path, pairing: &Pairing) -> Result<(), String> {
    let text = serde_json::to_string_pretty(pairing).map_err(|error| error.to_string())?;
    let temporary = path.with_extension("json.tmp");
    let written = std::fs::File::create(&temporary).and_then(|mut file| {
        io::Write::write_all(&mut file, text.as_bytes())?;
        file.sync_all()
    });
    written
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|error| format!("{}: {error}", path.display()))
}

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

/// Reads one request from a connection and writes the answer `handle` gives.
pub async fn answer_one<F, Fut>(stream: UnixStream, handle: F) -> Result<(), String>
where
    F: FnOnce(Result<ControlRequest, String>) -> Fut,
    Fut: std::future::Future<Output = serde_json::Value>,
{
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    BufReader::new(reader)
        .read_line(&mut line)
        .await
        .map_err(|error| error.to_string())?;
    let request = serde_json::from_str(&line).map_err(|error| format!("a bad request: {error}"));
    let mut answer = handle(request).await.to_string();
    answer.push('\n');
    writer
        .write_all(answer.as_bytes())
        .await
        .map_err(|error| error.to_string())
}

/// Sends `request` to the service running in `dir`; `None` when none is listening.
pub async fn ask(
    dir: &AgentDir,
    request: &ControlRequest,
) -> Option<Result<serde_json::Value, String>> {
    let stream = UnixStream::connect(socket_path(dir)).await.ok()?;
    Some(exchange(stream, request).await)
}

async fn exchange(
    stream: UnixStream,
    request: &ControlRequest,
) -> Result<serde_json::Value, String> {
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
    serde_json::from_str(&line).map_err(|error| format!("the service answered nonsense: {error}"))
}
