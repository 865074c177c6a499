//! [`Machine`]: the one task that owns an agent's sandbox. It boots the machine on the first
//! command (not before), stops it after a quiet spell, keeping its disk, and decides between
//! resuming the stored machine and recreating it by comparing fingerprints.

use super::{Boot, Command, Output, Sandbox, SandboxError, Up};
use crate::agent::{LockError, OwnerLock};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a machine stays up without commands before it is stopped.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30);

const FINGERPRINT_FILE: &str = "fingerprint.json";
const LOCK_FILE: &str = "lock";

/// How a [`Machine`] runs its sandbox.
#[derive(Debug, Clone)]
pub struct MachineOptions {
    /// Stop the machine after this long without commands.
    pub idle: Duration,
    /// Where the lock and the stored fingerprint live (`.perch/sandbox/`).
    pub state: PathBuf,
    /// Everything that, when changed, requires a new machine rather than a restarted one.
    pub fingerprint: serde_json::Value,
    /// Shell lines run once for each new machine, in order, before any other command.
    pub bootstrap: Vec<String>,
}

/// A handle to the task that owns one agent's sandbox. Clones share the task; the machine
/// stops when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct Machine {
    requests: mpsc::UnboundedSender<Request>,
    sandbox: Arc<dyn Sandbox>,
    boots: Arc<AtomicU64>,
}

/// What the machine is doing, for status lines and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Stopped,
    Running { commands: usize },
}

/// How the machine came up the last time it booted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastBoot {
    Never,
    Resumed,
    /// Created anew (first boot, or the fingerprint changed), bootstrap included.
    Created,
}

impl LastBoot {
    /// How the machine last came up, in words for `perch status`.
    pub fn words(self) -> &'static str {
        match self {
            LastBoot::Never => "not booted since perch run started",
            LastBoot::Resumed => "last boot resumed it",
            LastBoot::Created => "last boot created it anew",
        }
    }
}

#[derive(Debug)]
enum Request {
    Acquire(oneshot::Sender<Result<(), SandboxError>>),
    Release,
    Stop(oneshot::Sender<Result<(), SandboxError>>),
    Status(oneshot::Sender<(State, LastBoot)>),
}

impl Machine {
    /// Takes the agent's sandbox lock and starts the owning task. Nothing boots yet. Fails at
    /// once when another live perch process holds this agent's machine.
    pub fn start(
        sandbox: Arc<dyn Sandbox>,
        options: MachineOptions,
    ) -> Result<Machine, SandboxError> {
        let lock =
            OwnerLock::acquire_file(&options.state, LOCK_FILE).map_err(|error| match error {
                LockError::Held { path, owner } => SandboxError::Held {
                    name: path.display().to_string(),
                    owner: owner.map_or_else(
                        || "another perch process".to_owned(),
                        |pid| format!("perch process {pid}"),
                    ),
                },
                LockError::Io { path, source } => SandboxError::Failed {
                    action: "lock",
                    reason: format!("{}: {source}", path.display()),
                },
            })?;
        let (requests, inbox) = mpsc::unbounded_channel();
        let boots = Arc::new(AtomicU64::new(0));
        let owner = Owner {
            boots: Arc::clone(&boots),
            sandbox: Arc::clone(&sandbox),
            options,
            _lock: lock,
            running: false,
            commands: 0,
            idle_since: None,
            last_boot: LastBoot::Never,
        };
        tokio::spawn(owner.serve(inbox));
        Ok(Machine {
            requests,
            sandbox,
            boots,
        })
    }

    /// How many times this machine has come up (resumed or created) since it was started.
    pub fn boots(&self) -> u64 {
        self.boots.load(Ordering::Relaxed)
    }

    /// Runs `command`, booting the machine first if it is not up.
    pub async fn run(
        &self,
        command: Command,
        cancel: CancellationToken,
    ) -> Result<Output, SandboxError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Acquire(reply))?;
        answer.await.map_err(|_| stopped())??;
        let _release = Release(self.requests.clone());
        self.sandbox.run(command, cancel).await
    }

    /// Stops the machine now, keeping its disk. The next command boots it again.
    pub async fn stop(&self) -> Result<(), SandboxError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Stop(reply))?;
        answer.await.map_err(|_| stopped())?
    }

    pub async fn state(&self) -> Result<(State, LastBoot), SandboxError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Status(reply))?;
        answer.await.map_err(|_| stopped())
    }

    fn send(&self, request: Request) -> Result<(), SandboxError> {
        self.requests.send(request).map_err(|_| stopped())
    }
}

fn stopped() -> SandboxError {
    SandboxError::Failed {
        action: "reach",
        reason: "the machine's task has ended".into(),
    }
}

/// Marks the end of one command, also when its future is dropped half way.
struct Release(mpsc::UnboundedSender<Request>);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.0.send(Request::Release);
    }
}

struct Owner {
    sandbox: Arc<dyn Sandbox>,
    options: MachineOptions,
    _lock: OwnerLock,
    running: bool,
    commands: usize,
    idle_since: Option<Instant>,
    last_boot: LastBoot,
    boots: Arc<AtomicU64>,
}

impl Owner {
    async fn serve(mut self, mut inbox: mpsc::UnboundedReceiver<Request>) {
        loop {
            let idle_until = self
                .idle_since
                .filter(|_| self.running && self.commands == 0)
                .map(|since| since + self.options.idle);
            let idle = async {
                match idle_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                request = inbox.recv() => match request {
                    Some(request) => self.handle(request).await,
                    None => break,
                },
                () = idle => {
                    let _ = self.halt().await;
                }
            }
        }
        let _ = self.halt().await;
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::Acquire(reply) => {
                let result = self.ensure_up().await;
                if result.is_ok() {
                    self.commands += 1;
                }
                if reply.send(result).is_err() {
                    self.release();
                }
            }
            Request::Release => self.release(),
            Request::Stop(reply) => {
                let _ = reply.send(self.halt().await);
            }
            Request::Status(reply) => {
                let state = if self.running {
                    State::Running {
                        commands: self.commands,
                    }
                } else {
                    State::Stopped
                };
                let _ = reply.send((state, self.last_boot));
            }
        }
    }

    fn release(&mut self) {
        self.commands = self.commands.saturating_sub(1);
        if self.commands == 0 {
            self.idle_since = Some(Instant::now());
        }
    }

    async fn halt(&mut self) -> Result<(), SandboxError> {
        self.idle_since = None;
        if !self.running {
            return Ok(());
        }
        self.running = false;
        self.sandbox.stop().await
    }

    async fn ensure_up(&mut self) -> Result<(), SandboxError> {
        if self.running {
            return Ok(());
        }
        let fingerprint_path = self.options.state.join(FINGERPRINT_FILE);
        let stored = read_fingerprint(&fingerprint_path);
        let boot = if stored.as_ref() == Some(&self.options.fingerprint) {
            Boot::Resume
        } else {
            Boot::Fresh
        };
        if boot == Boot::Fresh {
            // A machine without a matching fingerprint on disk is never resumed, even if this
            // boot fails half way.
            remove_file(&fingerprint_path)?;
        }
        let up = self.sandbox.up(boot).await?;
        self.running = true;
        self.boots.fetch_add(1, Ordering::Relaxed);
        // A stored machine that is gone (a directory restored on another host) is created
        // anew, so it is bootstrapped like a fresh one.
        if up == Up::Created {
            if let Err(error) = self.bootstrap().await {
                let _ = self.halt().await;
                return Err(error);
            }
            write_fingerprint(&fingerprint_path, &self.options.fingerprint)?;
            self.last_boot = LastBoot::Created;
        } else {
            self.last_boot = LastBoot::Resumed;
        }
        Ok(())
    }

    async fn bootstrap(&self) -> Result<(), SandboxError> {
        for line in &self.options.bootstrap {
            let output = self
                .sandbox
                .run(Command::shell(line.clone()), CancellationToken::new())
                .await?;
            if output.end.code() != 0 {
                let stderr = output.stderr.marked_text("stderr");
                let tail: String = stderr
                    .chars()
                    .rev()
                    .take(2000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                return Err(SandboxError::Failed {
                    action: "bootstrap",
                    reason: format!(
                        "sandbox.lua: bootstrap command {line:?} ended with {}: {}",
                        output.end,
                        tail.trim()
                    ),
                });
            }
        }
        Ok(())
    }
}

fn read_fingerprint(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_fingerprint(path: &Path, fingerprint: &serde_json::Value) -> Result<(), SandboxError> {
    let failed = |error: std::io::Error| SandboxError::Failed {
        action: "record the fingerprint of",
        reason: format!("{}: {error}", path.display()),
    };
    let temporary = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(fingerprint).map_err(|error| SandboxError::Failed {
        action: "record the fingerprint of",
        reason: error.to_string(),
    })?;
    std::fs::write(&temporary, text).map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)
}

fn remove_file(path: &Path) -> Result<(), SandboxError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(SandboxError::Failed {
            action: "forget the fingerprint of",
            reason: format!("{}: {error}", path.display()),
        }),
        _ => Ok(()),
    }
}
