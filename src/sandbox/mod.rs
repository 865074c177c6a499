//! The sandbox: where every command the model or a tool authors runs. [`Sandbox`] is the one
//! effect boundary; [`Machine`] drives it (boot on first use, stop when idle, reuse or recreate
//! by fingerprint). The microVM ([`microvm`]) is the only backend an agent can get; the
//! namespace double exists only in test builds.

use perch_core::name::{EnvName, HostName};
pub use perch_core::output::{Captured, KeptFiles, StreamCap};
use perch_core::secret::Secret;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "sandbox-double")]
pub mod double;
pub mod image;
mod machine;
pub mod microvm;
pub mod preflight;
mod setup;

pub use machine::{DEFAULT_IDLE, LastBoot, Machine, MachineOptions, State};
pub use setup::{Backend, MachineSetup, machine_for, machine_name};

/// A boxed future, so that [`Sandbox`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The guest path of the agent's workspace, and every command's working directory.
pub const GUEST_WORKSPACE: &str = "/workspace";

/// What [`Sandbox::up`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Up {
    /// The machine was running, or was restarted with its disk.
    Resumed,
    /// The machine was created with an empty disk (asked for, or nothing stored to resume).
    Created,
}

/// The one effect boundary of the sandbox: boot it, run commands in it, stop it.
pub trait Sandbox: Send + Sync + fmt::Debug {
    /// Makes sure the machine is up. [`Boot::Resume`] restarts the stored machine with its disk
    /// when there is one (and creates it otherwise); [`Boot::Fresh`] discards any stored machine
    /// and creates it anew. Calling it on a running machine with `Resume` does nothing. Says
    /// whether the machine was created, so the caller knows to bootstrap it.
    fn up(&self, boot: Boot) -> BoxFuture<'_, Result<Up, SandboxError>>;

    /// Runs one command in the running machine. A non-zero exit is data in [`Output`], not an
    /// error; cancellation and timeouts kill the command and leave the machine usable.
    fn run(
        &self,
        command: Command,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<Output, SandboxError>>;

    /// Stops the machine, keeping its disk. Stopping a stopped machine does nothing.
    fn stop(&self) -> BoxFuture<'_, Result<(), SandboxError>>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boot {
    Resume,
    Fresh,
}

/// Everything a backend needs to create the machine, resolved on the host at boot.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Derived from the agent directory; unique per directory on this host.
    pub name: String,
    pub image: ImageRef,
    pub cpus: u8,
    /// MiB.
    pub memory: u32,
    /// Mounted read-write at [`GUEST_WORKSPACE`]; the only host directory the guest sees.
    pub workspace: PathBuf,
    /// MiB the guest may add to the workspace beyond what it held at boot.
    pub workspace_disk: u32,
    /// Hosts the guest may reach (DNS aside, nothing else).
    pub allow: Vec<HostName>,
    pub secrets: Vec<ResolvedSecret>,
    /// Plain environment for every command.
    pub env: Vec<(EnvName, String)>,
    /// Per-machine state a backend may keep on the host (never visible in the guest).
    pub state: PathBuf,
}

/// The image a machine boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// perch's own image, built by `perch image build`: the name it was loaded under, the root
    /// filesystem tree it was packed from, and the digest of the layer that boots (its identity
    /// in the machine's fingerprint, so a rebuild recreates the machine).
    Local {
        reference: String,
        rootfs: PathBuf,
        layer: String,
    },
    /// An OCI reference microsandbox pulls from a registry.
    Registry(String),
}

impl ImageRef {
    pub fn reference(&self) -> &str {
        match self {
            ImageRef::Local { reference, .. } => reference,
            ImageRef::Registry(reference) => reference,
        }
    }
}

/// A secret, checked against the host environment at boot. The guest sees only `placeholder`
/// in `env`; the network boundary substitutes the value of the host variable `source` for
/// requests to `hosts`, reading it when the machine starts so that it is never stored.
#[derive(Debug, Clone)]
pub struct ResolvedSecret {
    pub env: EnvName,
    pub source: EnvName,
    pub placeholder: String,
    /// The value as it was when perch checked it; used to keep it out of error text.
    pub value: Secret,
    pub hosts: Vec<HostName>,
}

/// One command for the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub program: Program,
    /// Added to the machine's environment for this command only.
    pub env: Vec<(String, String)>,
    /// Bytes for the command's standard input; it sees end-of-file after them (or at once).
    pub stdin: Option<Vec<u8>>,
    /// The command is killed when it runs longer; [`Command::DEFAULT_TIMEOUT`] unless set.
    pub timeout: Duration,
    /// How much of each of its output streams reaches perch; the rest is counted.
    pub output_cap: StreamCap,
    /// Whether the whole of stdout and stderr is written to guest files as the command runs.
    pub keep: Option<KeepInGuest>,
}

/// The guest files a command's whole output goes to, and the combined size up to which they
/// are removed again when it ends (its caller has all of it then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepInGuest {
    pub files: KeptFiles,
    pub remove_up_to: usize,
}

/// Runs `$4...` with its stdout and stderr also written whole to `$1` and `$2`, and exits with
/// its status. Both files are removed at the end when together they hold at most `$3` bytes.
const KEEP_WRAPPER: &str = r#"out=$1 err=$2 small=$3; shift 3
mkdir -p -- "${out%/*}" || exit 125
status="$out.status"
{ { { "$@"; echo $? > "$status"; } 2>&1 1>&3 3>&- | tee -- "$err" >&2 3>&-; } 3>&1 | tee -- "$out"; }
code=$(cat -- "$status" 2>/dev/null); rm -f -- "$status"
if [ $(( $(wc -c < "$out") + $(wc -c < "$err") )) -le "$small" ]; then rm -f -- "$out" "$err"; fi
exit "${code:-125}""#;

impl Command {
    /// The longest any guest command runs unless its caller chooses otherwise: the longest
    /// `bash` timeout the model may ask for.
    pub const DEFAULT_TIMEOUT: Duration =
        Duration::from_secs(perch_core::builtin::BASH_MAX_TIMEOUT_SECS);

    pub fn shell(line: impl Into<String>) -> Command {
        Command::new(Program::Shell(line.into()))
    }

    fn new(program: Program) -> Command {
        Command {
            program,
            env: Vec::new(),
            stdin: None,
            timeout: Command::DEFAULT_TIMEOUT,
            output_cap: StreamCap::HOST_DEFAULT,
            keep: None,
        }
    }

    pub fn argv<I, S>(args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Command::new(Program::Argv(args.into_iter().map(Into::into).collect()))
    }

    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Command {
        self.stdin = Some(bytes.into());
        self
    }

    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Command {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn timeout(mut self, limit: Duration) -> Command {
        self.timeout = limit;
        self
    }

    pub fn output_cap(mut self, cap: StreamCap) -> Command {
        self.output_cap = cap;
        self
    }

    /// Writes the whole of stdout and stderr to `files` in the guest as the command runs
    /// (removed again when together they are at most `small` bytes), whatever reaches perch.
    pub fn keep_in_guest(mut self, files: KeptFiles, small: usize) -> Command {
        self.keep = Some(KeepInGuest {
            files,
            remove_up_to: small,
        });
        self
    }

    /// The argv the guest executes: a shell line runs as `/bin/sh -c LINE`, inside the keeping
    /// wrapper when the output is kept in the guest.
    pub fn to_argv(&self) -> Vec<String> {
        let argv = match &self.program {
            Program::Argv(args) => args.clone(),
            Program::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        };
        match &self.keep {
            None => argv,
            Some(KeepInGuest {
                files,
                remove_up_to,
            }) => [
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                KEEP_WRAPPER.to_owned(),
                "perch-keep".to_owned(),
                files.stdout.clone(),
                files.stderr.clone(),
                remove_up_to.to_string(),
            ]
            .into_iter()
            .chain(argv)
            .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// `args[0]` is looked up on the guest's `PATH`.
    Argv(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

/// What a command left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// As much as the command's [`StreamCap`] let through, and the count of the rest.
    pub stdout: Captured,
    pub stderr: Captured,
    pub end: End,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    /// Killed by a signal it did not ask for (not by perch).
    Signalled(i32),
    /// perch killed it because the caller cancelled.
    Cancelled,
    /// perch killed it because it outlived its timeout.
    TimedOut(Duration),
}

impl End {
    /// The shell convention: 128+signal, 130 for a cancel (as for Ctrl-C), 124 for a timeout
    /// (as `timeout(1)` does).
    pub fn code(self) -> i32 {
        match self {
            End::Exited(code) => code,
            End::Signalled(signal) => 128 + signal,
            End::Cancelled => 130,
            End::TimedOut(_) => 124,
        }
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exited(code) => write!(f, "exit code {code}"),
            End::Signalled(signal) => write!(f, "killed by signal {signal}"),
            End::Cancelled => write!(f, "cancelled (exit 130)"),
            End::TimedOut(limit) => {
                write!(f, "timed out after {} s and killed", limit.as_secs_f64())
            }
        }
    }
}

/// Why the sandbox could not do what was asked. Never holds a secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxError {
    /// This host cannot run the machine at all (no usable KVM, no runtime pair, no image).
    Unavailable { what: String, fix: String },
    /// Another live perch process holds this agent's machine.
    Held { name: String, owner: String },
    /// A secret's source variable is not set on the host.
    MissingSecret { env: EnvName, source: String },
    /// The machine failed to boot, stop, or run a command.
    Failed {
        action: &'static str,
        reason: String,
    },
}

impl SandboxError {
    /// The machine could not run a command, for `reason`.
    pub fn run_failed(reason: String) -> SandboxError {
        SandboxError::Failed {
            action: "run a command in",
            reason,
        }
    }
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Unavailable { what, fix } => write!(f, "{what}\n  fix: {fix}"),
            SandboxError::Held { name, owner } => write!(
                f,
                "the sandbox {name} is held by another perch process ({owner}); perch never adopts or replaces it\n  fix: stop that process (Ctrl-C in its terminal, or `systemctl stop perch@NAME` for a service), then run this command again; `perch status` shows what it is doing"
            ),
            SandboxError::MissingSecret { env, source } => write!(
                f,
                "sandbox.lua: secrets: {env} reads its value from the host variable {source}, which is not set\n  fix: set {source} in the environment perch runs in"
            ),
            SandboxError::Failed { action, reason } => {
                write!(f, "cannot {action} the sandbox: {reason}")
            }
        }
    }
}

impl std::error::Error for SandboxError {}

/// The model's view of a tool's text: as it is when it fits in
/// [`MODEL_OUTPUT_LIMIT`](perch_core::output::MODEL_OUTPUT_LIMIT) characters; otherwise its
/// beginning and end, with the whole of it kept in the guest under
/// [`FULL_OUTPUT_DIR`](perch_core::output::FULL_OUTPUT_DIR) and that path given. Writing it
/// there is a guest command like any other: `cancel` kills it, and so does [`keep_timeout`].
pub async fn for_model(
    machine: &Machine,
    text: String,
    cancel: CancellationToken,
) -> Result<String, SandboxError> {
    use perch_core::output::{FULL_OUTPUT_DIR, MODEL_OUTPUT_LIMIT, shorten};
    if text.chars().count() <= MODEL_OUTPUT_LIMIT {
        return Ok(text);
    }
    let path = format!("{FULL_OUTPUT_DIR}/{}.txt", uuid::Uuid::now_v7());
    let keep = Command::argv([
        "/bin/sh",
        "-c",
        "mkdir -p \"${1%/*}\" && cat > \"$1\"",
        "perch-keep",
        path.as_str(),
    ])
    .timeout(keep_timeout(text.len()))
    .stdin(text.as_bytes());
    let output = machine.run(keep, cancel).await?;
    if output.end != End::Exited(0) {
        return Err(SandboxError::Failed {
            action: "keep a long output in",
            reason: format!(
                "writing {path} ended with {}: {}",
                output.end,
                output.stderr.marked_text("stderr").trim()
            ),
        });
    }
    Ok(shorten(&text, MODEL_OUTPUT_LIMIT, &path))
}

/// How long writing `bytes` of a long result into the guest may take: 10 s, and 1 s more per
/// MiB.
pub fn keep_timeout(bytes: usize) -> Duration {
    Duration::from_secs(10 + (bytes >> 20) as u64)
}
