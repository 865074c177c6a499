//! The agent relay at `agent_sock`: what the crate's agent client dials for every exec, fs call
//! and shutdown. In the real runtime this relays to agentd inside the VM; here the relay is the
//! agent too, running each exec through [`Guest`].
//!
//! Per connection: the handshake `[id_start u32 BE][id_end u32 BE]` and a `core.ready` frame that
//! offers `exec_limits` (the crate then acknowledges output and stdin) and `exec_control` (the
//! crate then sends signals over `control.sock`, see [`crate::control`]); `local_transport` and
//! bulk transport are not offered. Frames are encoded and decoded with microsandbox-protocol's
//! own types and codec.

mod exec;
mod fs;

use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::io::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use microsandbox_protocol::codec::{self, RawFrame};
use microsandbox_protocol::core::{CoreError, CoreErrorKind, Pong, Ready, Touched};
use microsandbox_protocol::exec::{ExecLimits, ExecOutputAck, ExecRequest, ExecSignal, ExecStdin};
use microsandbox_protocol::exec_control::{
    EXEC_CONTROL_VERSION, ExecControlAdvertisement, ExecControlReady,
};
use microsandbox_protocol::fs::FsRequest;
use microsandbox_protocol::message::{FLAG_BULK, FLAG_SESSION_START, Message, MessageType};
use microsandbox_protocol::transport::relay_client_id_range;
use microsandbox_protocol::{AGENT_RELAY_MAX_CLIENTS, ProtocolError};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Notify, mpsc};

use crate::guest::{Guest, GuestCommand};

/// How long a signal waits for its exec to be started before the request is refused, as the
/// runtime's own exec-control registry does (`runner/exec_control.rs`).
const SIGNAL_DELIVERY_DEADLINE: Duration = Duration::from_secs(3);

/// Frames queued for one connection's socket before senders wait.
const OUTBOUND_FRAMES: usize = 64;

/// What the relay advertises beyond the socket itself.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The execution policy offered in `core.ready` (the launch config's
    /// `bootstrap.exec_limits`, or [`ExecLimits::default`] when it has none).
    pub exec_limits: ExecLimits,
    /// The `control.sock` path advertised for `exec_control` (see [`control_socket_path`]).
    pub control_endpoint: PathBuf,
}

/// The control socket that belongs to `agent_sock`, where the crate expects it.
pub fn control_socket_path(agent_sock: &Path) -> PathBuf {
    microsandbox_runtime::control::control_socket_path_for(agent_sock)
}

/// Serves the agent socket until the listener fails: one task per connection. A
/// `core.shutdown` frame sends one `()` on `shutdown`; the caller stops the sandbox.
pub async fn serve(
    listener: UnixListener,
    guest: Arc<Guest>,
    config: RelayConfig,
    execs: Execs,
    shutdown: mpsc::Sender<()>,
) {
    serve_guest(listener, guest, config, execs, shutdown).await;
}

/// What the relay needs from a guest; [`Guest`] is the one the binary uses.
pub(crate) trait GuestProcesses: Send + Sync + 'static {
    /// See [`Guest::spawn`].
    fn spawn(&self, command: &GuestCommand) -> std::io::Result<tokio::process::Child>;
    /// See [`Guest::root`].
    fn root(&self) -> PathBuf;
    /// See [`Guest::baseline_env`].
    fn baseline_env(&self) -> &[(String, String)];
}

impl GuestProcesses for Guest {
    fn spawn(&self, command: &GuestCommand) -> std::io::Result<tokio::process::Child> {
        Guest::spawn(self, command)
    }

    fn root(&self) -> PathBuf {
        Guest::root(self)
    }

    fn baseline_env(&self) -> &[(String, String)] {
        Guest::baseline_env(self)
    }
}

pub(crate) async fn serve_guest<G: GuestProcesses>(
    listener: UnixListener,
    guest: Arc<G>,
    config: RelayConfig,
    execs: Execs,
    shutdown: mpsc::Sender<()>,
) {
    let relay = Arc::new(Relay {
        guest,
        config,
        execs,
        shutdown,
        slots: Mutex::new(HashSet::new()),
    });
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                log(format_args!("agent relay: accept failed: {error}"));
                continue;
            }
        };
        let Some(slot) = relay.claim_slot() else {
            log("agent relay: every client slot is taken; refusing a connection");
            continue;
        };
        let relay = Arc::clone(&relay);
        tokio::spawn(async move {
            if let Err(error) = relay.run_connection(stream, slot).await {
                log(format_args!("agent relay: connection ended: {error}"));
            }
            relay.release_slot(slot);
        });
    }
}

/// Writes one diagnostic line to stderr (the runtime's log).
pub(crate) fn log(message: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "msb stand-in: {message}");
}

struct Relay<G> {
    guest: Arc<G>,
    config: RelayConfig,
    execs: Execs,
    shutdown: mpsc::Sender<()>,
    slots: Mutex<HashSet<u32>>,
}

/// Input the connection routes to one running exec.
#[derive(Debug)]
enum ExecInput {
    Stdin(Vec<u8>),
    OutputAck(u64),
    Signal(i32),
}

/// Sends frames to one connection's socket, in order.
#[derive(Debug, Clone)]
struct Outbound(mpsc::Sender<Message>);

impl Outbound {
    /// Queues one frame; false once the connection is gone.
    async fn send<T: Serialize>(&self, t: MessageType, id: u32, payload: &T) -> bool {
        match Message::with_payload(t, id, payload) {
            Ok(message) => self.0.send(message).await.is_ok(),
            Err(error) => {
                log(format_args!(
                    "agent relay: could not encode {}: {error}",
                    t.as_str()
                ));
                false
            }
        }
    }

    async fn core_error(
        &self,
        id: u32,
        kind: CoreErrorKind,
        offending: Option<MessageType>,
        message: &str,
    ) {
        let error = CoreError {
            kind,
            message: message.into(),
            offending_type: offending.map(|t| t.as_str().to_owned()),
            init_failure: None,
            workload_failure: None,
        };
        self.send(MessageType::CoreError, id, &error).await;
    }
}

impl<G: GuestProcesses> Relay<G> {
    fn claim_slot(&self) -> Option<u32> {
        let mut slots = lock(&self.slots);
        let slot = (0..AGENT_RELAY_MAX_CLIENTS).find(|slot| !slots.contains(slot))?;
        slots.insert(slot);
        Some(slot)
    }

    fn release_slot(&self, slot: u32) {
        lock(&self.slots).remove(&slot);
    }

    async fn run_connection(
        self: &Arc<Self>,
        stream: tokio::net::UnixStream,
        slot: u32,
    ) -> Result<(), ProtocolError> {
        let (id_start, id_end) = relay_client_id_range(slot).ok_or_else(|| {
            ProtocolError::from(std::io::Error::other("client slot out of range"))
        })?;
        let token = connection_token()?;
        let registration = self.execs.connect(token, id_start..id_end);
        let (mut reader, mut writer) = stream.into_split();
        self.handshake(&mut writer, id_start, id_end, token).await?;

        let (frames, queued) = mpsc::channel(OUTBOUND_FRAMES);
        tokio::spawn(write_frames(writer, queued));
        let outbound = Outbound(frames);
        let mut sessions: HashMap<u32, mpsc::UnboundedSender<ExecInput>> = HashMap::new();
        loop {
            let frame = match codec::read_raw_frame(&mut reader).await {
                Ok(frame) => frame,
                Err(ProtocolError::UnexpectedEof) => return Ok(()),
                Err(error) => return Err(error),
            };
            self.dispatch(
                frame,
                id_start..id_end,
                &registration,
                &outbound,
                &mut sessions,
            )
            .await;
        }
    }

    async fn handshake(
        &self,
        writer: &mut OwnedWriteHalf,
        id_start: u32,
        id_end: u32,
        token: ConnectionToken,
    ) -> Result<(), ProtocolError> {
        let ready = Ready {
            agent_version: "0.7.11".into(),
            exec_limits: Some(self.config.exec_limits),
            ..Ready::default()
        };
        let capability = ExecControlReady {
            version: EXEC_CONTROL_VERSION,
            endpoint: self.config.control_endpoint.to_string_lossy().into_owned(),
            connection: token,
        };
        let advertisement = ExecControlAdvertisement {
            ready: &ready,
            exec_control: &capability,
        };
        let ready = Message::with_payload(MessageType::Ready, 0, &advertisement)?;
        let mut handshake = Vec::new();
        handshake.extend_from_slice(&id_start.to_be_bytes());
        handshake.extend_from_slice(&id_end.to_be_bytes());
        codec::encode_to_buf(&ready, &mut handshake)?;
        writer.write_all(&handshake).await?;
        writer.flush().await?;
        Ok(())
    }

    async fn dispatch(
        self: &Arc<Self>,
        frame: RawFrame,
        ids: Range<u32>,
        registration: &ConnectionExecs,
        outbound: &Outbound,
        sessions: &mut HashMap<u32, mpsc::UnboundedSender<ExecInput>>,
    ) {
        if frame.flags & FLAG_BULK != 0 {
            return;
        }
        let (id, opens_session) = (frame.id, frame.flags & FLAG_SESSION_START != 0);
        let message = match codec::raw_frame_to_message(frame) {
            Ok(message) => message,
            Err(error) => {
                if opens_session {
                    let text = format!("the stand-in relay cannot decode this frame: {error}");
                    outbound
                        .core_error(id, CoreErrorKind::UnsupportedMessageType, None, &text)
                        .await;
                }
                return;
            }
        };
        let t = message.t;
        match t {
            MessageType::Shutdown => {
                // A full channel means a shutdown is already on its way.
                let _ = self.shutdown.try_send(());
            }
            MessageType::Ping => {
                outbound.send(MessageType::Pong, id, &Pong {}).await;
            }
            MessageType::Touch => {
                outbound
                    .send(MessageType::Touched, id, &Touched { activity_seq: 0 })
                    .await;
            }
            MessageType::ExecRequest => {
                self.open_exec(message, ids, registration, outbound, sessions)
                    .await;
            }
            MessageType::ExecStdin => {
                if let Ok(stdin) = message.payload::<ExecStdin>() {
                    route(sessions, id, ExecInput::Stdin(stdin.data));
                }
            }
            MessageType::ExecOutputAck => {
                if let Ok(ack) = message.payload::<ExecOutputAck>() {
                    route(sessions, id, ExecInput::OutputAck(ack.consumed));
                }
            }
            MessageType::ExecSignal => {
                if let Ok(signal) = message.payload::<ExecSignal>() {
                    route(sessions, id, ExecInput::Signal(signal.signal));
                }
            }
            MessageType::FsRequest => match message.payload::<FsRequest>() {
                Ok(request) => {
                    let (root, outbound) = (self.guest.root(), outbound.clone());
                    tokio::spawn(async move {
                        let response =
                            tokio::task::spawn_blocking(move || fs::respond(&root, request.op))
                                .await
                                .unwrap_or_else(|_| fs::failure("the filesystem request failed"));
                        outbound.send(MessageType::FsResponse, id, &response).await;
                    });
                }
                Err(error) => {
                    let text = format!("invalid filesystem request: {error}");
                    outbound
                        .core_error(id, CoreErrorKind::InvalidPayload, Some(t), &text)
                        .await;
                }
            },
            // No PTY, so nothing to resize.
            MessageType::ExecResize => {}
            other if opens_session => {
                let text = format!("the stand-in runtime does not provide {}", other.as_str());
                outbound
                    .core_error(id, CoreErrorKind::CapabilityUnavailable, Some(other), &text)
                    .await;
            }
            _ => {}
        }
    }

    async fn open_exec(
        self: &Arc<Self>,
        message: Message,
        ids: Range<u32>,
        registration: &ConnectionExecs,
        outbound: &Outbound,
        sessions: &mut HashMap<u32, mpsc::UnboundedSender<ExecInput>>,
    ) {
        let id = message.id;
        if !ids.contains(&id) || sessions.contains_key(&id) || !registration.register(id) {
            let text = "this correlation id does not belong to a new exec on this connection";
            outbound
                .core_error(id, CoreErrorKind::InvalidSession, Some(message.t), text)
                .await;
            return;
        }
        let request = match message.payload::<ExecRequest>() {
            Ok(request) => request,
            Err(error) => {
                registration.finished(id);
                let text = format!("invalid exec request: {error}");
                outbound
                    .core_error(id, CoreErrorKind::InvalidPayload, Some(message.t), &text)
                    .await;
                return;
            }
        };
        let (inputs, received) = mpsc::unbounded_channel();
        sessions.insert(id, inputs);
        let session = exec::Session {
            id,
            guest: Arc::clone(&self.guest),
            limits: self.config.exec_limits,
            outbound: outbound.clone(),
            inputs: received,
            registration: registration.clone(),
        };
        tokio::spawn(session.run(request));
    }
}

/// Hands `input` to the exec `id`, forgetting execs that have ended.
fn route(sessions: &mut HashMap<u32, mpsc::UnboundedSender<ExecInput>>, id: u32, input: ExecInput) {
    if let Some(session) = sessions.get(&id)
        && session.send(input).is_err()
    {
        sessions.remove(&id);
    }
}

async fn write_frames(mut writer: OwnedWriteHalf, mut queued: mpsc::Receiver<Message>) {
    while let Some(message) = queued.recv().await {
        if codec::write_message(&mut writer, &message).await.is_err() {
            return;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The random capability that names one agent connection on the control socket.
pub(crate) type ConnectionToken = [u8; 16];

fn connection_token() -> std::io::Result<ConnectionToken> {
    use std::io::Read as _;
    let mut token = [0; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut token)?;
    Ok(token)
}

/// Running execs by agent connection and correlation id, shared by the relay (which registers
/// them) and the control socket (which signals them).
#[derive(Debug, Clone, Default)]
pub struct Execs(Arc<ExecsInner>);

#[derive(Debug, Default)]
struct ExecsInner {
    connections: Mutex<HashMap<ConnectionToken, ConnectionState>>,
    changed: Notify,
}

#[derive(Debug)]
struct ConnectionState {
    ids: Range<u32>,
    execs: HashMap<u32, ExecState>,
}

#[derive(Debug, Clone, Copy)]
enum ExecState {
    Starting,
    Running(Pid),
    Finished,
}

/// Why a signal was not delivered: the control protocol's stable code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignalRefusal {
    pub code: &'static str,
    pub message: String,
}

impl SignalRefusal {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl Execs {
    fn connect(&self, token: ConnectionToken, ids: Range<u32>) -> ConnectionExecs {
        let state = ConnectionState {
            ids,
            execs: HashMap::new(),
        };
        lock(&self.0.connections).insert(token, state);
        ConnectionExecs(Arc::new(Registration {
            execs: self.clone(),
            token,
        }))
    }

    fn update(&self, token: ConnectionToken, id: u32, state: ExecState) {
        if let Some(connection) = lock(&self.0.connections).get_mut(&token) {
            connection.execs.insert(id, state);
        }
        self.0.changed.notify_waiters();
    }

    /// Delivers `signal` to the process group of exec `id` on the connection `token`, waiting
    /// up to three seconds for an exec that is not started yet (the control socket can overtake
    /// the agent socket). Signal 0 only checks that the group exists.
    pub(crate) async fn signal(
        &self,
        token: ConnectionToken,
        id: u32,
        signal: i32,
    ) -> Result<(), SignalRefusal> {
        if !(0..=64).contains(&signal) {
            return Err(SignalRefusal::new(
                "invalid_signal",
                "signal must be between 0 and 64",
            ));
        }
        let deadline = tokio::time::Instant::now() + SIGNAL_DELIVERY_DEADLINE;
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.state(token, id)? {
                Some(ExecState::Running(group)) => return signal_group(group, signal),
                Some(ExecState::Finished) => {
                    return Err(SignalRefusal::new(
                        "execution_closed",
                        "execution has ended",
                    ));
                }
                Some(ExecState::Starting) | None => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(SignalRefusal::new(
                    "delivery_unconfirmed",
                    "signal delivery deadline expired; the signal was not queued and will not be delivered",
                ));
            }
        }
    }

    fn state(&self, token: ConnectionToken, id: u32) -> Result<Option<ExecState>, SignalRefusal> {
        let connections = lock(&self.0.connections);
        let Some(connection) = connections.get(&token) else {
            return Err(SignalRefusal::new(
                "execution_closed",
                "the owning agent connection has ended",
            ));
        };
        if !connection.ids.contains(&id) {
            return Err(SignalRefusal::new(
                "execution_closed",
                "execution does not belong to this connection",
            ));
        }
        Ok(connection.execs.get(&id).copied())
    }
}

/// Sends `signal` (0 = existence check) to the process group led by `group`.
fn signal_group(group: Pid, signal: i32) -> Result<(), SignalRefusal> {
    let signal = match signal {
        0 => None,
        number => Some(Signal::try_from(number).map_err(|_| {
            SignalRefusal::new(
                "invalid_signal",
                format!("signal {number} is not supported here"),
            )
        })?),
    };
    nix::sys::signal::killpg(group, signal)
        .map_err(|errno| SignalRefusal::new("delivery_unconfirmed", format!("killpg: {errno}")))
}

/// One agent connection's entry in [`Execs`]; dropping the last clone revokes it, so the
/// control socket refuses its execs from then on.
#[derive(Debug, Clone)]
struct ConnectionExecs(Arc<Registration>);

#[derive(Debug)]
struct Registration {
    execs: Execs,
    token: ConnectionToken,
}

impl ConnectionExecs {
    /// Records a new exec; false when the id was used before on this connection.
    fn register(&self, id: u32) -> bool {
        let Registration { execs, token } = &*self.0;
        let mut connections = lock(&execs.0.connections);
        let Some(connection) = connections.get_mut(token) else {
            return false;
        };
        if connection.execs.contains_key(&id) {
            return false;
        }
        connection.execs.insert(id, ExecState::Starting);
        drop(connections);
        execs.0.changed.notify_waiters();
        true
    }

    fn started(&self, id: u32, group: Pid) {
        self.0
            .execs
            .update(self.0.token, id, ExecState::Running(group));
    }

    fn finished(&self, id: u32) {
        self.0.execs.update(self.0.token, id, ExecState::Finished);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.execs.0.connections).remove(&self.token);
        self.execs.0.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
