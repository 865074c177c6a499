//! The relay and control socket driven by the crate's own agent client
//! (`microsandbox-agent-client`, the client `microsandbox` 0.7.11 uses), over real Unix sockets
//! in a temporary directory, with commands run on the host.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use microsandbox_agent_client::OptimizedAgentClient as AgentClient;
use microsandbox_protocol::exec::{
    EXEC_OUTPUT_EVENT_OVERHEAD, ExecExited, ExecFailed, ExecFailureKind, ExecLimits, ExecOutputAck,
    ExecRequest, ExecSignal, ExecStarted, ExecStdin, ExecStdinAck, ExecStdout,
};
use microsandbox_protocol::fs::{FsOp, FsRequest, FsResponse, FsResponseData};
use microsandbox_protocol::message::{Message, MessageType};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use super::{Execs, GuestProcesses, RelayConfig, control_socket_path, serve_guest};
use crate::guest::GuestCommand;

/// Bounds every wait in these tests; a hang fails instead of blocking the suite.
const PATIENCE: Duration = Duration::from_secs(20);

/// Commands on the host, as the guest stub does; the tests keep their own so they survive
/// the real guest replacing the stub.
struct HostGuest;

impl GuestProcesses for HostGuest {
    fn spawn(&self, command: &GuestCommand) -> std::io::Result<tokio::process::Child> {
        tokio::process::Command::new(&command.program)
            .args(&command.args)
            .env_clear()
            .envs(command.env.iter().map(|(key, value)| (key, value)))
            .current_dir(command.cwd.as_deref().unwrap_or("/"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }

    fn root(&self) -> PathBuf {
        PathBuf::from("/")
    }

    fn baseline_env(&self) -> &[(String, String)] {
        &[]
    }
}

struct Runtime {
    dir: tempfile::TempDir,
    agent_sock: PathBuf,
    shutdowns: mpsc::Receiver<()>,
}

impl Runtime {
    async fn start(limits: ExecLimits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let agent_sock = dir.path().join("agent.sock");
        let control_sock = control_socket_path(&agent_sock);
        let execs = Execs::default();
        let (shutdown, shutdowns) = mpsc::channel(1);
        let agent = UnixListener::bind(&agent_sock).unwrap();
        let control = UnixListener::bind(&control_sock).unwrap();
        let config = RelayConfig {
            exec_limits: limits,
            control_endpoint: control_sock,
        };
        tokio::spawn(serve_guest(
            agent,
            Arc::new(HostGuest),
            config,
            execs.clone(),
            shutdown,
        ));
        tokio::spawn(crate::control::serve_control(control, execs));
        Self {
            dir,
            agent_sock,
            shutdowns,
        }
    }

    async fn client(&self) -> AgentClient {
        within(AgentClient::connect(&self.agent_sock))
            .await
            .unwrap()
    }
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("the relay answered in time")
}

fn request(cmd: &str, args: &[&str]) -> ExecRequest {
    ExecRequest {
        cmd: cmd.into(),
        args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".into()],
        cwd: Some("/".into()),
        user: None,
        tty: false,
        rows: 24,
        cols: 80,
        rlimits: Vec::new(),
    }
}

/// Everything one exec produced, acknowledging output as it arrives (as the crate does).
#[derive(Debug, Default)]
struct Transcript {
    started: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdin_acks: Vec<u64>,
    exit: Option<i32>,
    failure: Option<ExecFailed>,
}

async fn collect(
    client: &AgentClient,
    id: u32,
    frames: &mut mpsc::Receiver<Message>,
) -> Transcript {
    collect_after(client, id, frames, ExecOutputAck::default()).await
}

/// [`collect`] when `consumed` was already acknowledged.
async fn collect_after(
    client: &AgentClient,
    id: u32,
    frames: &mut mpsc::Receiver<Message>,
    mut consumed: ExecOutputAck,
) -> Transcript {
    let mut transcript = Transcript::default();
    while let Some(message) = within(frames.recv()).await {
        match message.t {
            MessageType::ExecStarted => {
                message.payload::<ExecStarted>().unwrap();
                transcript.started = true;
            }
            MessageType::ExecStdout | MessageType::ExecStderr => {
                let data = message.payload::<ExecStdout>().unwrap().data;
                consumed.consume(data.len()).unwrap();
                client
                    .send(id, MessageType::ExecOutputAck, &consumed)
                    .await
                    .unwrap();
                let sink = if message.t == MessageType::ExecStdout {
                    &mut transcript.stdout
                } else {
                    &mut transcript.stderr
                };
                sink.extend_from_slice(&data);
            }
            MessageType::ExecStdinAck => {
                transcript
                    .stdin_acks
                    .push(message.payload::<ExecStdinAck>().unwrap().consumed);
            }
            MessageType::ExecExited => {
                transcript.exit = Some(message.payload::<ExecExited>().unwrap().code);
                break;
            }
            MessageType::ExecFailed => {
                transcript.failure = Some(message.payload::<ExecFailed>().unwrap());
                break;
            }
            _ => {}
        }
    }
    transcript
}

async fn close_stdin(client: &AgentClient, id: u32) {
    client
        .send(id, MessageType::ExecStdin, &ExecStdin { data: Vec::new() })
        .await
        .unwrap();
}

/// Waits for `ExecStarted`, which the crate also waits for before signalling.
async fn started(frames: &mut mpsc::Receiver<Message>) {
    let message = within(frames.recv()).await.unwrap();
    assert_eq!(message.t, MessageType::ExecStarted);
}

#[tokio::test]
async fn the_handshake_offers_exec_limits_and_the_control_route_but_no_local_transport() {
    let limits = ExecLimits {
        output_limit: 64 * 1024,
        ..ExecLimits::default()
    };
    let runtime = Runtime::start(limits).await;
    let client = runtime.client().await;
    let ready = client.ready().unwrap();
    assert_eq!(ready.exec_limits, Some(limits));
    assert!(ready.local_transport.is_none());
    assert!(client.supports(MessageType::ExecOutputAck));
    let controller =
        microsandbox_agent_client::ExecController::from_ready_body(client.ready_bytes())
            .unwrap()
            .expect("exec_control is advertised");
    assert!(format!("{controller:?}").contains("control.sock"));
}

#[tokio::test]
async fn an_exec_streams_both_outputs_and_ends_with_its_exit_code() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let exec = request("sh", &["-c", "echo out; echo err >&2; exit 3"]);
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &exec)
        .await
        .unwrap();
    close_stdin(&client, id).await;
    let transcript = collect(&client, id, &mut frames).await;
    assert!(transcript.started);
    assert_eq!(transcript.stdout, b"out\n");
    assert_eq!(transcript.stderr, b"err\n");
    assert_eq!(transcript.exit, Some(3));
}

#[tokio::test]
async fn stdin_reaches_the_command_acknowledged_and_ends_with_eof() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &request("cat", &[]))
        .await
        .unwrap();
    started(&mut frames).await;
    let first = vec![b'a'; 10_000];
    let second = b"tail\n".to_vec();
    for data in [first.clone(), second.clone()] {
        client
            .send(id, MessageType::ExecStdin, &ExecStdin { data })
            .await
            .unwrap();
    }
    close_stdin(&client, id).await;
    let transcript = collect(&client, id, &mut frames).await;
    assert_eq!(
        transcript.stdout,
        [first.as_slice(), second.as_slice()].concat()
    );
    assert_eq!(transcript.stdin_acks, vec![10_000, 10_005]);
    assert_eq!(transcript.exit, Some(0));
}

#[tokio::test]
async fn unacknowledged_output_stops_at_the_window_and_resumes_with_acks() {
    let limits = ExecLimits {
        output_limit: 8 * 1024,
        output_chunk_size: 1024,
        ..ExecLimits::default()
    };
    let total = 200_000;
    let runtime = Runtime::start(limits).await;
    let client = runtime.client().await;
    let exec = request("head", &["-c", &total.to_string(), "/dev/zero"]);
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &exec)
        .await
        .unwrap();
    close_stdin(&client, id).await;
    started(&mut frames).await;

    // Without acknowledgements the relay sends at most one window, then waits.
    let mut charged = 0_u64;
    let mut received = 0_usize;
    let window = u64::from(limits.output_limit);
    let smallest_chunk = u64::from(EXEC_OUTPUT_EVENT_OVERHEAD) + 1;
    while window - charged >= smallest_chunk + u64::from(limits.output_chunk_size) {
        let message = within(frames.recv()).await.unwrap();
        assert_eq!(message.t, MessageType::ExecStdout);
        let data = message.payload::<ExecStdout>().unwrap().data;
        assert!(data.len() <= limits.output_chunk_size as usize);
        charged += data.len() as u64 + u64::from(EXEC_OUTPUT_EVENT_OVERHEAD);
        received += data.len();
        assert!(
            charged <= window,
            "unacknowledged output exceeded the window"
        );
    }
    let stalled = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            let message = frames.recv().await.unwrap();
            let data = message.payload::<ExecStdout>().unwrap().data;
            charged += data.len() as u64 + u64::from(EXEC_OUTPUT_EVENT_OVERHEAD);
            received += data.len();
            assert!(
                charged <= window,
                "unacknowledged output exceeded the window"
            );
        }
    })
    .await;
    assert!(
        stalled.is_err(),
        "the relay kept sending without acknowledgements"
    );

    let consumed = ExecOutputAck { consumed: charged };
    client
        .send(id, MessageType::ExecOutputAck, &consumed)
        .await
        .unwrap();
    let rest = collect_after(&client, id, &mut frames, consumed).await;
    assert_eq!(received + rest.stdout.len(), total);
    assert_eq!(rest.exit, Some(0));
}

#[tokio::test]
async fn a_signal_over_the_control_socket_kills_the_process_group_and_exits_minus_one() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    // The shell waits for its child, so only a signal to the whole group ends both at once.
    let exec = request("sh", &["-c", "sleep 60; echo survived"]);
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &exec)
        .await
        .unwrap();
    close_stdin(&client, id).await;
    started(&mut frames).await;
    // With exec_control offered, the crate's client routes ExecSignal to control.sock.
    within(client.send(id, MessageType::ExecSignal, &ExecSignal { signal: 9 }))
        .await
        .unwrap();
    let transcript = collect(&client, id, &mut frames).await;
    assert_eq!(transcript.exit, Some(-1));
    assert!(transcript.stdout.is_empty());

    // The route refuses an exec that has ended.
    let refused = within(client.send(id, MessageType::ExecSignal, &ExecSignal { signal: 9 })).await;
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("execution_closed")
    );
}

#[tokio::test]
async fn a_signal_sent_right_after_the_request_waits_for_the_exec_to_start() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &request("sleep", &["60"]))
        .await
        .unwrap();
    within(client.send(id, MessageType::ExecSignal, &ExecSignal { signal: 15 }))
        .await
        .unwrap();
    let transcript = collect(&client, id, &mut frames).await;
    assert_eq!(transcript.exit, Some(-1));
}

#[tokio::test]
async fn an_in_band_signal_reaches_the_process_group_too() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let exec = request("sh", &["-c", "sleep 60; echo survived"]);
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &exec)
        .await
        .unwrap();
    close_stdin(&client, id).await;
    started(&mut frames).await;
    // A raw send bypasses the control route, as the crate does for a relay without it.
    let signal =
        Message::with_payload(MessageType::ExecSignal, id, &ExecSignal { signal: 15 }).unwrap();
    let mut encoded = Vec::new();
    microsandbox_protocol::codec::encode_to_buf(&signal, &mut encoded).unwrap();
    client
        .send_raw(id, signal.flags, &encoded[9..])
        .await
        .unwrap();
    let transcript = collect(&client, id, &mut frames).await;
    assert_eq!(transcript.exit, Some(-1));
}

#[tokio::test]
async fn programs_that_cannot_start_fail_as_agentd_reports_them() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let script = runtime.dir.path().join("not-executable.sh");
    std::fs::write(&script, "echo hi\n").unwrap();
    let cases = [
        ("surely-no-such-command-here", ExecFailureKind::NotFound),
        ("/surely/no/such/path", ExecFailureKind::NotFound),
        (script.to_str().unwrap(), ExecFailureKind::PermissionDenied),
    ];
    for (cmd, kind) in cases {
        let (id, mut frames) = client
            .stream(MessageType::ExecRequest, &request(cmd, &[]))
            .await
            .unwrap();
        let transcript = collect(&client, id, &mut frames).await;
        let failure = transcript
            .failure
            .unwrap_or_else(|| panic!("{cmd} should not start"));
        assert_eq!(failure.kind, kind, "{cmd}: {}", failure.message);
        assert!(failure.message.contains(cmd));
    }

    let mut bad_cwd = request("true", &[]);
    bad_cwd.cwd = Some("/surely/no/such/dir".into());
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &bad_cwd)
        .await
        .unwrap();
    let failure = collect(&client, id, &mut frames).await.failure.unwrap();
    assert_eq!(failure.kind, ExecFailureKind::BadCwd);
}

#[tokio::test]
async fn the_workdir_stat_answers_with_the_entry_kind() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let stat = |path: &Path| FsRequest {
        op: FsOp::Stat {
            path: path.to_string_lossy().into_owned(),
            follow_symlink: true,
        },
        bulk: None,
    };
    let reply = within(client.request(MessageType::FsRequest, &stat(runtime.dir.path())))
        .await
        .unwrap();
    assert_eq!(reply.t, MessageType::FsResponse);
    let response = reply.payload::<FsResponse>().unwrap();
    assert!(matches!(response.data, Some(FsResponseData::Stat(info)) if info.kind == "dir"));

    let missing = runtime.dir.path().join("missing");
    let reply = within(client.request(MessageType::FsRequest, &stat(&missing)))
        .await
        .unwrap();
    assert!(!reply.payload::<FsResponse>().unwrap().ok);
}

#[tokio::test]
async fn a_shutdown_frame_on_id_zero_asks_the_runtime_to_stop() {
    let mut runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    client.send(0, MessageType::Shutdown, &()).await.unwrap();
    assert_eq!(within(runtime.shutdowns.recv()).await, Some(()));
}

#[tokio::test]
async fn many_connections_each_get_their_own_id_range() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(runtime.client().await);
    }
    for client in &clients {
        let (id, mut frames) = client
            .stream(MessageType::ExecRequest, &request("echo", &["hi"]))
            .await
            .unwrap();
        close_stdin(client, id).await;
        let transcript = collect(client, id, &mut frames).await;
        assert_eq!(
            (transcript.stdout.as_slice(), transcript.exit),
            (&b"hi\n"[..], Some(0))
        );
    }
}

#[tokio::test]
async fn a_background_process_holding_stdout_does_not_keep_the_exec_open() {
    let runtime = Runtime::start(ExecLimits::default()).await;
    let client = runtime.client().await;
    let exec = request("sh", &["-c", "sleep 5 & echo started"]);
    let (id, mut frames) = client
        .stream(MessageType::ExecRequest, &exec)
        .await
        .unwrap();
    close_stdin(&client, id).await;
    let transcript = collect(&client, id, &mut frames).await;
    assert_eq!(
        (transcript.stdout.as_slice(), transcript.exit),
        (&b"started\n"[..], Some(0))
    );
}
