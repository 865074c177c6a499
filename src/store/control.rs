//! How commands reach a running `perch run`: `.perch/control.sock`, a Unix socket (never a
//! network listener). One JSON request per connection, one JSON answer, in the types of
//! `perch_core::control`. When no runner holds the directory, the commands act on `.perch/`
//! directly, under the directory's lock.
//!
//! Who may ask is checked twice: by the file system (the socket is 0600, or, when the agent
//! directory names an operators' group, reachable through `.perch/` by that group alone) and by
//! the kernel's word on each connection's peer (`SO_PEERCRED`, `SO_PEERGROUPS`), judged by
//! [`ControlAccess::admits`].

use crate::agent::AgentDir;
use perch_core::control::{ControlAccess, Peer, encode_reply, read_reply};
use serde::de::DeserializeOwned;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

pub use perch_core::control::ControlRequest;

/// Who may use the control socket of the agent directory `root`: root, the user perch runs as,
/// and, when `root` is set-group-id and its group is not perch's own, the members of that group
/// (deploy/install.sh makes each agent's directory so, for the group `perch`).
pub fn access(root: &Path) -> ControlAccess {
    let operators = std::fs::metadata(root).ok().and_then(|meta| {
        let set_group_id = meta.mode() & 0o2000 != 0;
        (set_group_id && meta.gid() != nix::unistd::getegid().as_raw()).then_some(meta.gid())
    });
    ControlAccess {
        own_uid: nix::unistd::geteuid().as_raw(),
        operators,
    }
}

/// Listens on `path` (replacing a stale socket file). Without operators the socket is 0600.
/// With them it is 0666 and its directory gets the group's search bit: the directory (its
/// group the operators', from the set-group-id agent directory) keeps everyone else out, and
/// [`serve`] checks every peer.
pub fn listen(path: &Path, access: ControlAccess) -> Result<UnixListener, String> {
    let failed = |path: &Path, error: io::Error| format!("{}: {error}", path.display());
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(failed(path, error)),
        _ => {}
    }
    let listener = UnixListener::bind(path).map_err(|error| failed(path, error))?;
    let mode = if access.operators.is_some() {
        0o666
    } else {
        0o600
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|error| failed(path, error))?;
    if let (Some(operators), Some(parent)) = (access.operators, path.parent()) {
        let meta = std::fs::metadata(parent).map_err(|error| failed(parent, error))?;
        if meta.mode() & 0o010 == 0 {
            // Without the set-id bits: the unit's RestrictSUIDSGID= refuses a chmod that names
            // them, and the socket's own group does not matter behind this directory.
            std::fs::set_permissions(
                parent,
                std::fs::Permissions::from_mode((meta.mode() & 0o777) | 0o010),
            )
            .map_err(|error| failed(parent, error))?;
        }
        if meta.gid() != operators {
            tracing::warn!(
                "control socket: the operators' group (gid {operators}) cannot reach it: {} belongs to gid {}; fix: chgrp {operators} {} (as root)",
                parent.display(),
                meta.gid(),
                parent.display()
            );
        }
    }
    Ok(listener)
}

/// The peer of a connection, as the kernel says.
fn peer(stream: &UnixStream) -> Result<Peer, String> {
    let credentials = stream.peer_cred().map_err(|error| error.to_string())?;
    Ok(Peer {
        uid: credentials.uid(),
        gid: credentials.gid(),
        groups: peer_groups(stream)?,
    })
}

/// `SO_PEERGROUPS` (Linux 4.13), which the libc crate does not name for this target.
const SO_PEERGROUPS: libc::c_int = 59;

/// The supplementary groups of a connection's peer, as they were when it connected.
fn peer_groups(stream: &UnixStream) -> Result<Vec<u32>, String> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut length = libc::socklen_t::try_from(groups.len() * size_of::<libc::gid_t>())
            .map_err(|error| error.to_string())?;
        // SAFETY: the buffer holds `length` bytes of `gid_t`s, and the kernel writes at most
        // `length` bytes, setting `length` to what it wrote or, with ERANGE, to what it needs.
        #[allow(unsafe_code)]
        let result = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &raw mut length,
            )
        };
        let needed = length as usize / size_of::<libc::gid_t>();
        if result == 0 {
            groups.truncate(needed);
            return Ok(groups);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ERANGE) && needed > groups.len() {
            groups.resize(needed, 0);
            continue;
        }
        return Err(format!("SO_PEERGROUPS: {error}"));
    }
}

/// The longest request line read; a request is a few dozen bytes.
const REQUEST_LIMIT: u64 = 64 * 1024;

/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop pauses after a failed accept (`EMFILE`, `ENFILE`, `ENOMEM`) before
/// it tries again: a spinning loop would take a core and flood the log while the descriptors
/// stay gone.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Accepts connections on `listener` until `shutdown` and answers each one `access` admits with
/// `handle` ([`answer_one`]) in its own task; any other is refused, in its answer and in the
/// log. A failed accept is logged once per run of failures and retried after
/// [`ACCEPT_BACKOFF`].
pub async fn serve<H, Fut>(
    listener: UnixListener,
    access: ControlAccess,
    shutdown: CancellationToken,
    handle: H,
) where
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
                let admitted = peer(&stream).and_then(|peer| access.admits(&peer));
                if let Err(reason) = admitted {
                    tracing::warn!("control socket: refused a connection: {reason}");
                    tokio::spawn(refuse(stream, reason));
                    continue;
                }
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

/// Answers a connection that was not admitted with why, once it has sent its request (a
/// client still writing would otherwise see the connection reset instead of the reason).
async fn refuse(stream: UnixStream, reason: String) {
    let refusal = encode_reply::<()>(&Err(format!("refused: {reason}")));
    let _ = answer_one(stream, |_| async move { refusal }).await;
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
