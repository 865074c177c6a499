//! One exec session: resolve and spawn the program, stream its output within the host's
//! acknowledged window, feed its stdin with acknowledgements, deliver in-band signals, and end
//! with `core.exec.exited` or `core.exec.failed`.

use std::sync::Arc;
use std::time::Duration;

use microsandbox_protocol::exec::{
    EXEC_OUTPUT_EVENT_OVERHEAD, ExecExited, ExecFailed, ExecFailureKind, ExecLimits, ExecRequest,
    ExecStarted, ExecStderr, ExecStdinAck, ExecStdinError, ExecStdout,
};
use microsandbox_protocol::message::MessageType;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use super::fs::{self, ProgramError};
use super::{ConnectionExecs, ExecInput, GuestProcesses, Outbound, signal_group};
use crate::guest::GuestCommand;

/// agentd's PATH when the request's environment has none (a guess: the usual Linux default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// After the command exits, output still arriving from processes it left behind is forwarded
/// until the pipes stay quiet this long; then the exec ends. (A guess at agentd, which cannot
/// wait forever for a background process that inherited stdout.)
const LINGERING_OUTPUT_GRACE: Duration = Duration::from_millis(250);

pub(super) struct Session<G> {
    pub id: u32,
    pub guest: Arc<G>,
    pub limits: ExecLimits,
    pub outbound: Outbound,
    pub inputs: mpsc::UnboundedReceiver<ExecInput>,
    pub registration: ConnectionExecs,
}

impl<G: GuestProcesses> Session<G> {
    pub async fn run(mut self, request: ExecRequest) {
        let id = self.id;
        let end = match prepare(&*self.guest, request) {
            Ok(command) => match self.guest.spawn(&command) {
                Ok(child) => self.supervise(child).await,
                Err(error) => Some(Err(spawn_failure(&command.program, &error))),
            },
            Err(failure) => Some(Err(failure)),
        };
        // Before the terminal frame, so a signal sent after it is refused as "ended".
        self.registration.finished(id);
        match end {
            Some(Ok(code)) => {
                self.outbound
                    .send(MessageType::ExecExited, id, &ExecExited { code })
                    .await;
            }
            Some(Err(failure)) => {
                self.outbound
                    .send(MessageType::ExecFailed, id, &failure)
                    .await;
            }
            None => {}
        }
    }

    /// Runs the spawned command to its end: its exit code (-1 when signalled), a failure, or
    /// None when the connection went away first (the command is then killed).
    async fn supervise(&mut self, mut child: Child) -> Option<Result<i32, ExecFailed>> {
        let id = self.id;
        let Some(group) = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
        else {
            let message = "the process ended before it was watched".into();
            return Some(Err(failed(ExecFailureKind::Other, None, message)));
        };
        let pid = u32::try_from(group.as_raw()).unwrap_or_default();
        if !self
            .outbound
            .send(MessageType::ExecStarted, id, &ExecStarted { pid })
            .await
        {
            let _ = signal_group(group, Signal::SIGKILL as i32);
            return None;
        }
        self.registration.started(id, group);

        let (stdin_chunks, chunks) = mpsc::unbounded_channel();
        tokio::spawn(feed_stdin(
            child.stdin.take(),
            chunks,
            self.outbound.clone(),
            id,
        ));
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let mut window = OutputWindow::new(self.limits);
        let chunk = window.chunk_size();
        let (mut stdout_buffer, mut stderr_buffer) = (vec![0; chunk], vec![0; chunk]);
        let mut status = None;
        let lingering = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(lingering);

        while status.is_none() || stdout.is_some() || stderr.is_some() {
            let room = window.room();
            tokio::select! {
                read = read_some(&mut stdout, &mut stdout_buffer[..room]), if room > 0 && stdout.is_some() => {
                    match read {
                        Some(data) => {
                            window.charge(data.len());
                            if !self.outbound.send(MessageType::ExecStdout, id, &ExecStdout { data }).await {
                                let _ = signal_group(group, Signal::SIGKILL as i32);
                                return None;
                            }
                        }
                        None => stdout = None,
                    }
                    lingering.as_mut().reset(tokio::time::Instant::now() + LINGERING_OUTPUT_GRACE);
                }
                read = read_some(&mut stderr, &mut stderr_buffer[..room]), if room > 0 && stderr.is_some() => {
                    match read {
                        Some(data) => {
                            window.charge(data.len());
                            if !self.outbound.send(MessageType::ExecStderr, id, &ExecStderr { data }).await {
                                let _ = signal_group(group, Signal::SIGKILL as i32);
                                return None;
                            }
                        }
                        None => stderr = None,
                    }
                    lingering.as_mut().reset(tokio::time::Instant::now() + LINGERING_OUTPUT_GRACE);
                }
                exited = child.wait(), if status.is_none() => {
                    status = Some(exited.ok().and_then(|status| status.code()).unwrap_or(-1));
                    lingering.as_mut().reset(tokio::time::Instant::now() + LINGERING_OUTPUT_GRACE);
                }
                input = self.inputs.recv() => match input {
                    Some(ExecInput::Stdin(data)) => {
                        let _ = stdin_chunks.send(data);
                    }
                    Some(ExecInput::OutputAck(consumed)) => {
                        window.acknowledge(consumed);
                        lingering.as_mut().reset(tokio::time::Instant::now() + LINGERING_OUTPUT_GRACE);
                    }
                    Some(ExecInput::Signal(signal)) => {
                        let _ = signal_group(group, signal);
                    }
                    // The host hung up: nobody will read the result (agentd likewise cleans up
                    // a disconnected client's work; a guess).
                    None => {
                        let _ = signal_group(group, Signal::SIGKILL as i32);
                        return None;
                    }
                },
                () = &mut lingering, if status.is_some() => break,
            }
        }
        // A signalled process has no exit code; agentd reports it as -1.
        Some(Ok(status.unwrap_or(-1)))
    }
}

/// The stdout/stderr allowance the host granted: every chunk costs its length plus
/// [`EXEC_OUTPUT_EVENT_OVERHEAD`], and the unacknowledged total stays within `output_limit`
/// (the crate fails the exec when it is exceeded). Reading stops while the window is full, so
/// the command blocks on its pipe instead of the relay buffering its output.
#[derive(Debug)]
struct OutputWindow {
    limit: u64,
    chunk_size: usize,
    sent: u64,
    acknowledged: u64,
}

impl OutputWindow {
    fn new(limits: ExecLimits) -> Self {
        Self {
            limit: u64::from(limits.output_limit),
            chunk_size: usize::try_from(limits.output_chunk_size)
                .unwrap_or(usize::MAX)
                .max(1),
            sent: 0,
            acknowledged: 0,
        }
    }

    fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The most payload bytes the next chunk may carry; 0 while the window is full.
    fn room(&self) -> usize {
        let unacknowledged = self.sent - self.acknowledged;
        let free = self.limit.saturating_sub(unacknowledged);
        let payload = free.saturating_sub(u64::from(EXEC_OUTPUT_EVENT_OVERHEAD));
        usize::try_from(payload)
            .unwrap_or(usize::MAX)
            .min(self.chunk_size)
    }

    fn charge(&mut self, payload: usize) {
        let payload = u64::try_from(payload).unwrap_or(u64::MAX);
        self.sent = self
            .sent
            .saturating_add(payload)
            .saturating_add(u64::from(EXEC_OUTPUT_EVENT_OVERHEAD));
    }

    /// Takes a cumulative acknowledgement; one that goes backwards or past what was sent is
    /// ignored.
    fn acknowledge(&mut self, consumed: u64) {
        if (self.acknowledged..=self.sent).contains(&consumed) {
            self.acknowledged = consumed;
        }
    }
}

/// Reads what is available from `pipe` into `buffer`; None at end of file or on an error.
async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buffer: &mut [u8],
) -> Option<Vec<u8>> {
    let pipe = pipe.as_mut()?;
    match pipe.read(buffer).await {
        Ok(0) | Err(_) => None,
        Ok(read) => Some(buffer[..read].to_vec()),
    }
}

/// Writes stdin chunks in order, acknowledging the cumulative bytes written; an empty chunk
/// closes stdin (EOF). A failed write is reported once as `core.exec.stdin.error` and later
/// chunks are dropped.
async fn feed_stdin(
    stdin: Option<ChildStdin>,
    mut chunks: mpsc::UnboundedReceiver<Vec<u8>>,
    outbound: Outbound,
    id: u32,
) {
    let mut stdin = stdin;
    let mut consumed = 0_u64;
    while let Some(chunk) = chunks.recv().await {
        if chunk.is_empty() {
            stdin = None;
            continue;
        }
        let Some(pipe) = stdin.as_mut() else {
            continue;
        };
        match pipe.write_all(&chunk).await {
            Ok(()) => {
                consumed = consumed.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
                outbound
                    .send(MessageType::ExecStdinAck, id, &ExecStdinAck { consumed })
                    .await;
            }
            Err(error) => {
                stdin = None;
                let errno = error.raw_os_error();
                let report = ExecStdinError {
                    errno,
                    errno_name: errno.map(errno_name),
                    message: format!("writing to the command's stdin failed: {error}"),
                };
                outbound
                    .send(MessageType::ExecStdinError, id, &report)
                    .await;
            }
        }
    }
}

/// Turns the request into the command to spawn, or the `core.exec.failed` agentd would send.
fn prepare<G: GuestProcesses>(guest: &G, request: ExecRequest) -> Result<GuestCommand, ExecFailed> {
    let env = merged_env(guest.baseline_env(), &request.env);
    let cwd = request.cwd.unwrap_or_else(|| "/".into());
    let root = guest.root();
    if !fs::is_directory(&root, &cwd) {
        return Err(failed_with(
            ExecFailureKind::BadCwd,
            nix::errno::Errno::ENOENT,
            format!("{cwd}: the working directory does not exist or is not a directory"),
            "chdir",
        ));
    }
    let path = env
        .iter()
        .find(|(key, _)| key == "PATH")
        .map_or(DEFAULT_PATH, |(_, value)| value.as_str());
    let program = fs::resolve_program(&root, &request.cmd, path, &cwd).map_err(|error| {
        let (kind, errno, message) = match error {
            ProgramError::NotFound => (
                ExecFailureKind::NotFound,
                nix::errno::Errno::ENOENT,
                if request.cmd.contains('/') {
                    format!("{}: No such file or directory", request.cmd)
                } else {
                    format!("{}: command not found", request.cmd)
                },
            ),
            ProgramError::PermissionDenied => (
                ExecFailureKind::PermissionDenied,
                nix::errno::Errno::EACCES,
                format!("{}: Permission denied", request.cmd),
            ),
            ProgramError::NotExecutable(reason) => (
                ExecFailureKind::NotExecutable,
                nix::errno::Errno::ENOEXEC,
                format!("{}: {reason}", request.cmd),
            ),
        };
        failed_with(kind, errno, message, "execvp")
    })?;
    Ok(GuestCommand {
        program,
        args: request.args,
        env,
        cwd: Some(cwd),
        user: request.user,
    })
}

/// The baseline environment with the request's `K=V` entries over it (a later key replaces an
/// earlier one in place); entries without `=` are ignored.
fn merged_env(baseline: &[(String, String)], request: &[String]) -> Vec<(String, String)> {
    let mut env = baseline.to_vec();
    for entry in request {
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        match env.iter_mut().find(|(existing, _)| existing == key) {
            Some(slot) => slot.1 = value.to_owned(),
            None => env.push((key.to_owned(), value.to_owned())),
        }
    }
    env
}

fn spawn_failure(program: &str, error: &std::io::Error) -> ExecFailed {
    let errno = error.raw_os_error();
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound => ExecFailureKind::NotFound,
        std::io::ErrorKind::PermissionDenied => ExecFailureKind::PermissionDenied,
        _ => ExecFailureKind::Other,
    };
    ExecFailed {
        kind,
        errno,
        errno_name: errno.map(errno_name),
        message: format!("{program}: could not start: {error}"),
        stage: Some("spawn".into()),
    }
}

fn failed(kind: ExecFailureKind, errno: Option<i32>, message: String) -> ExecFailed {
    ExecFailed {
        kind,
        errno,
        errno_name: errno.map(errno_name),
        message,
        stage: None,
    }
}

fn failed_with(
    kind: ExecFailureKind,
    errno: nix::errno::Errno,
    message: String,
    stage: &str,
) -> ExecFailed {
    ExecFailed {
        stage: Some(stage.into()),
        ..failed(kind, Some(errno as i32), message)
    }
}

fn errno_name(errno: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(errno))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_never_lets_unacknowledged_output_pass_the_limit() {
        let limits = ExecLimits {
            output_limit: 4096,
            output_chunk_size: 1024,
            ..ExecLimits::default()
        };
        let mut window = OutputWindow::new(limits);
        let mut unacknowledged = 0_u64;
        while window.room() > 0 {
            let payload = window.room();
            window.charge(payload);
            unacknowledged += payload as u64 + u64::from(EXEC_OUTPUT_EVENT_OVERHEAD);
        }
        assert!(unacknowledged <= 4096);
        assert_eq!(window.sent, unacknowledged);

        window.acknowledge(window.sent + 1);
        assert_eq!(
            window.room(),
            0,
            "an acknowledgement past what was sent is ignored"
        );
        window.acknowledge(1024 + 256);
        assert_eq!(window.room(), 1024);
        window.acknowledge(10);
        assert_eq!(
            window.acknowledged,
            1024 + 256,
            "acknowledgements never go backwards"
        );
    }

    #[test]
    fn the_request_environment_overrides_the_baseline_in_place() {
        let baseline = vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("TOKEN".to_owned(), "placeholder".to_owned()),
        ];
        let request = vec![
            "PATH=/usr/bin:/bin".to_owned(),
            "EXTRA=a=b".to_owned(),
            "junk".to_owned(),
        ];
        assert_eq!(
            merged_env(&baseline, &request),
            vec![
                ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
                ("TOKEN".to_owned(), "placeholder".to_owned()),
                ("EXTRA".to_owned(), "a=b".to_owned()),
            ]
        );
    }
}
