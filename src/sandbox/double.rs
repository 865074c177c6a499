//! The namespace double: the [`Sandbox`] contract in Linux namespaces, for machines that cannot
//! boot a microVM. Compiled only with the `sandbox-double` feature, which no installed binary
//! has, and never chosen by an agent file.
//!
//! One long-lived holder process owns a mount, pid, network, UTS and IPC namespace. Its mount
//! namespace holds an overlay of the image's root filesystem (read-only, shared) under a
//! per-machine upper directory (the machine's disk), with `workspace/` bound at `/workspace`.
//! Every command enters those namespaces with `nsenter`, from a fresh single-threaded child,
//! because a multithreaded process cannot `setns` into a mount namespace.
//!
//! Where the double cannot enforce a policy it is stricter, never wider: its network namespace
//! holds only a loopback interface, so there is no egress whatever `allow` lists; secrets are
//! placeholders with no value behind them; cpus and memory are not enforced.
//!
//! The holder runs under `setpriv --pdeathsig KILL` and `unshare --kill-child`: when perch
//! dies, the holder dies, its pid namespace ends, and every process in it dies with it.

use super::{
    Boot, BoxFuture, Captured, Command, End, GUEST_WORKSPACE, ImageRef, Output, Sandbox,
    SandboxError, Spec, StreamCap, Up,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use perch_core::output::HeadTail;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

const GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const BOOT_DEADLINE: Duration = Duration::from_secs(20);

/// Runs as pid 1 of the new pid namespace with the host's tools, mounts the guest's view, then
/// becomes a chrooted shell that reaps orphans until it is killed. Paths arrive as `$1`..`$5`.
const HOLDER_SCRIPT: &str = r#"set -e
rootfs=$1 upper=$2 work=$3 merged=$4 workspace=$5
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$upper,workdir=$work" "$merged"
mkdir -p "$merged/workspace" "$merged/proc" "$merged/dev" "$merged/tmp" "$merged/var/tmp"
mount --bind "$workspace" "$merged/workspace"
mount -t proc proc "$merged/proc"
mount -t tmpfs -o mode=755,size=64k dev "$merged/dev"
for node in null zero full random urandom tty; do
  touch "$merged/dev/$node"
  mount --bind "/dev/$node" "$merged/dev/$node"
done
ip link set lo up 2>/dev/null || true
hostname perch
exec chroot "$merged" /bin/sh -c 'cd /workspace; echo ready; exec </dev/null >/dev/null 2>&1; while :; do sleep 3600 & wait $!; done'
"#;

/// The namespace double of one agent's machine.
#[derive(Debug)]
pub struct NamespaceDouble {
    spec: Spec,
    holder: Mutex<Option<Holder>>,
}

#[derive(Debug)]
struct Holder {
    child: Child,
    /// pid 1 of the holder's namespaces, as the host sees it.
    init: u32,
}

impl NamespaceDouble {
    /// The machine's disk (the overlay's upper directory) lives under `spec.state`.
    pub fn new(spec: Spec) -> NamespaceDouble {
        NamespaceDouble {
            spec,
            holder: Mutex::new(None),
        }
    }

    fn rootfs(&self) -> Result<&Path, SandboxError> {
        let rootfs = match &self.spec.image {
            ImageRef::Local { rootfs, .. } => rootfs,
            ImageRef::Registry(reference) => {
                return Err(SandboxError::Unavailable {
                    what: format!(
                        "the namespace double cannot pull the registry image {reference}"
                    ),
                    fix: "use image = \"perch:default\" with the double".into(),
                });
            }
        };
        if rootfs.join("bin/sh").exists() {
            Ok(rootfs)
        } else {
            Err(SandboxError::Unavailable {
                what: format!(
                    "the root filesystem {} does not exist or has no /bin/sh",
                    rootfs.display()
                ),
                fix: "run `perch image build` (or `perch image build --minimal`)".into(),
            })
        }
    }

    fn disk(&self) -> PathBuf {
        self.spec.state.join("disk")
    }

    async fn boot(&self, boot: Boot) -> Result<Holder, SandboxError> {
        let failed = |reason: String| SandboxError::Failed {
            action: "boot",
            reason,
        };
        let rootfs = self.rootfs()?.to_owned();
        if !self.spec.workspace.is_dir() {
            return Err(failed(format!(
                "the workspace {} is not a directory",
                self.spec.workspace.display()
            )));
        }
        let disk = self.disk();
        if boot == Boot::Fresh {
            remove_tree(&disk).await.map_err(|error| {
                failed(format!(
                    "cannot discard the old disk {}: {error}",
                    disk.display()
                ))
            })?;
        }
        let (upper, work, merged) = (disk.join("upper"), disk.join("work"), disk.join("merged"));
        for dir in [&upper, &work, &merged] {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|error| failed(format!("cannot create {}: {error}", dir.display())))?;
        }
        let mut unshare = vec![
            "--pdeathsig",
            "KILL",
            "--",
            "unshare",
            "--mount",
            "--pid",
            "--net",
            "--uts",
            "--ipc",
            "--fork",
            "--kill-child=SIGKILL",
            "--propagation",
            "private",
        ];
        if !nix::unistd::geteuid().is_root() {
            unshare.extend(["--user", "--map-root-user"]);
        }
        unshare.extend(["--", "/bin/sh", "-c", HOLDER_SCRIPT, "perch-holder"]);
        // PR_SET_PDEATHSIG follows the spawning thread, so this must not run on a short-lived
        // blocking-pool thread; async callers spawn from runtime workers.
        let mut child = tokio::process::Command::new("setpriv")
            .args(unshare)
            .args([&rootfs, &upper, &work, &merged, &self.spec.workspace])
            .env_clear()
            .env("PATH", GUEST_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| failed(format!("cannot start setpriv/unshare: {error}")))?;
        let stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let ready = async {
            let mut line = String::new();
            if let Some(stdout) = stdout {
                BufReader::new(stdout).read_line(&mut line).await.ok();
            }
            line
        };
        let line = tokio::time::timeout(BOOT_DEADLINE, ready)
            .await
            .unwrap_or_default();
        if line.trim() != "ready" {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let mut message = String::new();
            if let Some(stderr) = stderr.as_mut() {
                stderr.read_to_string(&mut message).await.ok();
            }
            return Err(failed(format!(
                "the namespace holder did not come up: {}",
                message.trim()
            )));
        }
        let init = child
            .id()
            .and_then(first_child)
            .ok_or_else(|| failed("the namespace holder has no init process".into()))?;
        Ok(Holder { child, init })
    }

    async fn execute(
        &self,
        init: u32,
        command: Command,
        cancel: CancellationToken,
    ) -> Result<Output, SandboxError> {
        let failed = SandboxError::run_failed;
        let target = init.to_string();
        let mut process = tokio::process::Command::new("setpriv");
        process
            .args(["--pdeathsig", "KILL", "--", "nsenter", "--target"])
            .arg(&target)
            .args([
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--root",
                "--wd",
                "--",
                "/usr/bin/env",
                "--",
            ])
            .args(command.to_argv())
            .env_clear()
            .env("PATH", GUEST_PATH)
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .env("PWD", GUEST_WORKSPACE)
            .envs(
                self.spec
                    .env
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
            )
            .envs(
                self.spec
                    .secrets
                    .iter()
                    .map(|secret| (secret.env.as_str(), secret.placeholder.as_str())),
            )
            .envs(command.env.iter().map(|(name, value)| (name, value)))
            .stdin(if command.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = process
            .spawn()
            .map_err(|error| failed(format!("cannot start nsenter: {error}")))?;
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        if let (Some(bytes), Some(mut stdin)) = (command.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                // A command that exits without reading its input closes the pipe; that is
                // its business, not an error.
                let _ = stdin.write_all(&bytes).await;
            });
        }
        let cap = command.output_cap;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let finished =
            async { tokio::join!(child.wait(), collect(stdout, cap), collect(stderr, cap)) };
        tokio::pin!(finished);
        let limit = command.timeout;
        let ((status, stdout, stderr), forced) = tokio::select! {
            output = &mut finished => (output, None),
            () = cancel.cancelled() => {
                kill_group(group);
                (finished.await, Some(End::Cancelled))
            }
            () = tokio::time::sleep(limit) => {
                kill_group(group);
                (finished.await, Some(End::TimedOut(limit)))
            }
        };
        let collected = |result: std::io::Result<Captured>| {
            result.map_err(|error| failed(format!("cannot collect output: {error}")))
        };
        let status =
            status.map_err(|error| failed(format!("cannot wait for the command: {error}")))?;
        Ok(Output {
            stdout: collected(stdout)?,
            stderr: collected(stderr)?,
            end: forced.unwrap_or_else(|| end_of(status)),
        })
    }
}

/// Reads `stream` to its end, keeping only what `cap` allows.
async fn collect(
    stream: Option<impl tokio::io::AsyncRead + Unpin>,
    cap: StreamCap,
) -> std::io::Result<Captured> {
    let mut kept = HeadTail::new(cap);
    if let Some(mut stream) = stream {
        let mut chunk = vec![0; 64 << 10];
        loop {
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                break;
            }
            kept.push(&chunk[..read]);
        }
    }
    Ok(kept.finish())
}

impl Sandbox for NamespaceDouble {
    fn up(&self, boot: Boot) -> BoxFuture<'_, Result<Up, SandboxError>> {
        Box::pin(async move {
            let mut holder = self.holder.lock().await;
            if let Some(running) = holder.as_mut() {
                if boot == Boot::Resume && running.is_alive() {
                    return Ok(Up::Resumed);
                }
                stop_holder(running).await;
                *holder = None;
            }
            let up = if boot == Boot::Resume && self.disk().join("upper").is_dir() {
                Up::Resumed
            } else {
                Up::Created
            };
            *holder = Some(self.boot(boot).await?);
            Ok(up)
        })
    }

    fn run(
        &self,
        command: Command,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<Output, SandboxError>> {
        Box::pin(async move {
            let init = {
                let mut holder = self.holder.lock().await;
                let alive = holder
                    .as_mut()
                    .and_then(|running| running.is_alive().then_some(running.init));
                match alive {
                    Some(init) => init,
                    None => {
                        return Err(SandboxError::run_failed(
                            "the machine is not running".into(),
                        ));
                    }
                }
            };
            self.execute(init, command, cancel).await
        })
    }

    fn stop(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            if let Some(mut running) = self.holder.lock().await.take() {
                stop_holder(&mut running).await;
            }
            Ok(())
        })
    }
}

impl Holder {
    fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

async fn stop_holder(holder: &mut Holder) {
    let _ = holder.child.start_kill();
    let _ = holder.child.wait().await;
}

fn kill_group(group: Option<Pid>) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
    }
}

fn end_of(status: ExitStatus) -> End {
    match (status.code(), status.signal()) {
        (Some(code), _) => End::Exited(code),
        (None, Some(signal)) => End::Signalled(signal),
        (None, None) => End::Exited(-1),
    }
}

fn first_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

async fn remove_tree(path: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir_all(path).await {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
