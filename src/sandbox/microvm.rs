//! The microVM backend: the [`Sandbox`] contract in a microsandbox microVM, and the only module
//! in perch that names a microsandbox type.
//!
//! One machine per agent, named `spec.name`, booted from an OCI image (perch's own image,
//! loaded with [`load_image`], or a registry reference). The guest sees the agent's workspace
//! read-write at [`GUEST_WORKSPACE`] and no other host directory; what it may add there is
//! bounded by the bind mount's quota (`workspace_disk`). Its network is the allowlist
//! built by `network_policy`; secrets reach it only as placeholders, which microsandbox's
//! network boundary swaps for the real value on the way to the secret's hosts.
//!
//! Every microsandbox call runs against the microsandbox home the machine was set up with
//! ([`crate::host::Places::msb_home`]), never the one the process environment would pick:
//! that home's catalog, images, sandboxes and runtime (`<home>/bin/msb`, unless `$MSB_PATH`
//! names another, which the crate honours). Each machine has its own [`LocalBackend`] for that home.
//!
//! The machine is attached to this process: microsandbox stops it when perch exits, keeping its
//! disk. [`Boot::Resume`] restarts the stored machine from microsandbox's persisted
//! configuration, so cpus, memory and the allowlist are those it was created with; anything
//! that must change with the spec needs [`Boot::Fresh`]. Plain `env` is applied to every command
//! instead, so it is always current. Secrets are recorded as the name of their host variable,
//! never the value: microsandbox reads the variable in this process each time the machine
//! starts, so a rotated value takes effect at the next boot and nothing at rest holds it.

use super::{
    Boot, BoxFuture, Captured, Command, End, GUEST_WORKSPACE, ImageRef, Output, Sandbox,
    SandboxError, Spec, StreamCap, Up,
};
use microsandbox::backend::{Backend as Runtime, LocalBackend, with_backend};
use microsandbox::protocol::exec::{ExecFailed, ExecFailureKind};
use microsandbox::sandbox::{
    NetworkConfig, NetworkPolicy, PullPolicy, SandboxBuilder, SandboxStatus, SecretBuilder,
    SecretSource,
};
use microsandbox::{ExecEvent, ExecHandle, Image, MicrosandboxError};
use perch_core::name::{EnvName, HostName};
use perch_core::output::HeadTail;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The name under which the guest reaches the host. microsandbox resolves it to the
/// per-sandbox gateway, which is `DestinationGroup::Host` in its policy vocabulary.
pub use perch_core::name::HOST_ALIAS;

/// How long a graceful stop may take before the machine is killed (its disk stays).
const STOP_GRACE: Duration = Duration::from_secs(20);

/// How long output is still collected after perch killed a command.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// A microsandbox microVM behind the [`Sandbox`] contract.
pub struct Microvm {
    spec: Spec,
    runtime: Arc<dyn Runtime>,
    machine: Mutex<Option<microsandbox::Sandbox>>,
}

/// A microsandbox backend for the home `home`. Its settings come from `$MSB_CONFIG_PATH` when
/// set, otherwise from `<home>/config.json` (microsandbox's own default for its default home);
/// a missing file means the defaults. Its catalog opens on first use, on the async runtime of
/// that use: so each machine has its own, rather than one shared across runtimes.
fn runtime_for(home: &Path) -> Result<Arc<dyn Runtime>, SandboxError> {
    let config = std::env::var_os("MSB_CONFIG_PATH")
        .filter(|path| !path.is_empty())
        .map_or_else(|| home.join("config.json"), PathBuf::from);
    let backend = LocalBackend::builder()
        .home(home)
        .config_path(config)
        .build_lazy()
        .map_err(|error| SandboxError::Failed {
            action: "configure",
            reason: format!(
                "the microsandbox home {} is not usable: {error}",
                home.display()
            ),
        })?;
    Ok(Arc::new(backend))
}

/// Runs `call` with the backend for `home` as microsandbox's default, for the call and every
/// task it spawns.
async fn with_home<T>(
    home: &Path,
    call: impl Future<Output = Result<T, SandboxError>>,
) -> Result<T, SandboxError> {
    with_backend(runtime_for(home)?, call).await
}

impl Microvm {
    /// The machine for `spec` in the microsandbox home `home`. Nothing boots until
    /// [`Sandbox::up`].
    pub fn new(spec: Spec, home: &Path) -> Result<Microvm, SandboxError> {
        Ok(Microvm {
            spec,
            runtime: runtime_for(home)?,
            machine: Mutex::new(None),
        })
    }

    /// Runs `call` with this machine's microsandbox home as the crate's default backend.
    async fn in_home<T>(&self, call: impl Future<Output = T>) -> T {
        with_backend(self.runtime.clone(), call).await
    }

    async fn boot(&self, boot: Boot) -> Result<Up, SandboxError> {
        let mut machine = self.machine.lock().await;
        match boot {
            Boot::Resume => {
                if let Some(current) = machine.take() {
                    if matches!(current.status().await, Ok(SandboxStatus::Running)) {
                        *machine = Some(current);
                        return Ok(Up::Resumed);
                    }
                    // Our handle outlived its machine (it crashed or is going down): let it
                    // finish, then restart the stored machine like any other stopped one.
                    let _ = self.halt(&current).await;
                }
                let (started, up) = match microsandbox::Sandbox::start(&self.spec.name).await {
                    Ok(started) => (started, Up::Resumed),
                    Err(MicrosandboxError::SandboxNotFound(_)) => {
                        (self.create(false).await?, Up::Created)
                    }
                    Err(error) => return Err(self.failure("boot", &error)),
                };
                *machine = Some(started);
                Ok(up)
            }
            Boot::Fresh => {
                if let Some(current) = machine.take()
                    && let Err(error) = self.halt(&current).await
                {
                    *machine = Some(current);
                    return Err(error);
                }
                *machine = Some(self.create(true).await?);
                Ok(Up::Created)
            }
        }
    }

    async fn create(&self, replace: bool) -> Result<microsandbox::Sandbox, SandboxError> {
        let builder = self.builder(replace)?;
        builder.create().await.map_err(|error| match error {
            MicrosandboxError::SandboxAlreadyExists(_) if !replace => SandboxError::Failed {
                action: "boot",
                reason: format!(
                    "{}; microsandbox keeps state under this name that it cannot start, and a fresh boot replaces it",
                    self.redact(error.to_string())
                ),
            },
            error => self.failure("boot", &error),
        })
    }

    /// The whole machine configuration; the network part comes from [`guest_network`].
    fn builder(&self, replace: bool) -> Result<SandboxBuilder, SandboxError> {
        let spec = &self.spec;
        let NetworkConfig {
            policy, secrets, ..
        } = guest_network(spec)?;
        let (workspace, quota) = (spec.workspace.clone(), spec.workspace_disk);
        let mut builder = microsandbox::Sandbox::builder(spec.name.as_str())
            .cpus(spec.cpus)
            .memory(spec.memory)
            .ephemeral(false)
            .volume(GUEST_WORKSPACE, move |mount| {
                mount.bind(workspace).quota(quota)
            })
            .workdir(GUEST_WORKSPACE)
            .network(move |network| {
                network
                    .policy(policy)
                    .dns(|dns| dns.rebind_protection(true))
                    .strict(true)
            });
        for entry in secrets.secrets {
            builder = builder.secret_entry(entry);
        }
        // `oci` rather than `image`: a reference that looks like a path must never become a
        // host directory bind-mounted as the guest's root.
        builder = match &spec.image {
            ImageRef::Local { reference, .. } => builder
                .image_with(|image| image.oci(reference.as_str()))
                .pull_policy(PullPolicy::Never),
            ImageRef::Registry(reference) => {
                builder.image_with(|image| image.oci(reference.as_str()))
            }
        };
        if replace {
            builder = builder.replace();
        }
        Ok(builder)
    }

    /// Stops `machine` gracefully, or kills it after [`STOP_GRACE`]; either way its disk stays.
    async fn halt(&self, machine: &microsandbox::Sandbox) -> Result<(), SandboxError> {
        if matches!(
            machine.status().await,
            Ok(SandboxStatus::Stopped | SandboxStatus::Crashed | SandboxStatus::Created)
        ) {
            return Ok(());
        }
        let Err(stop) = machine.stop_with_timeout(STOP_GRACE).await else {
            return Ok(());
        };
        machine.kill().await.map_err(|kill| SandboxError::Failed {
            action: "stop",
            reason: self.redact(format!("{stop}; killing it after that failed too: {kill}")),
        })
    }

    async fn halt_held(&self) -> Result<(), SandboxError> {
        let mut machine = self.machine.lock().await;
        let Some(current) = machine.take() else {
            return Ok(());
        };
        if let Err(error) = self.halt(&current).await {
            *machine = Some(current);
            return Err(error);
        }
        Ok(())
    }

    async fn execute(
        &self,
        command: Command,
        cancel: CancellationToken,
    ) -> Result<Output, SandboxError> {
        let failed = SandboxError::run_failed;
        let machine = self
            .machine
            .lock()
            .await
            .clone()
            .ok_or_else(|| failed("the sandbox is not up".into()))?;
        let argv = command.to_argv();
        let Some((program, args)) = argv.split_first() else {
            return Err(failed("the command is empty".into()));
        };
        if cancel.is_cancelled() {
            return Ok(Output {
                stdout: Captured::default(),
                stderr: Captured::default(),
                end: End::Cancelled,
            });
        }
        let env = exec_env(&self.spec.env, &command.env);
        let stdin = command.stdin;
        let mut handle = machine
            .exec_stream_with(program.as_str(), |options| {
                let options = options.args(args).envs(env).cwd(GUEST_WORKSPACE);
                match stdin {
                    Some(bytes) => options.stdin_bytes(bytes),
                    None => options.stdin_null(),
                }
            })
            .await
            .map_err(|error| self.failure("run a command in", &error))?;

        let mut collected = Collected::new(command.output_cap);
        let deadline = tokio::time::sleep(command.timeout);
        tokio::pin!(deadline);
        let interrupted = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break End::Cancelled,
                () = &mut deadline => break End::TimedOut(command.timeout),
                event = handle.recv() => match event {
                    Some(event) => {
                        if let Some(end) = collected.take(event).map_err(failed)? {
                            return Ok(collected.into_output(end));
                        }
                    }
                    None => return Err(failed(
                        "the command's session ended without an exit status (did the sandbox stop?)".into(),
                    )),
                },
            }
        };
        // agentd signals the command's whole process group; the machine stays up.
        let _ = handle.kill().await;
        let _ = tokio::time::timeout(KILL_GRACE, collected.drain(&mut handle)).await;
        Ok(collected.into_output(interrupted))
    }

    /// Maps a microsandbox error, with every secret value of this spec cut out of its text.
    fn failure(&self, action: &'static str, error: &MicrosandboxError) -> SandboxError {
        match error {
            MicrosandboxError::RuntimeNotInstalled(_)
            | MicrosandboxError::RuntimeIncomplete(_)
            | MicrosandboxError::LibkrunfwNotFound(_) => SandboxError::Unavailable {
                what: self.redact(error.to_string()),
                fix: "install the microsandbox 0.7.11 runtime (msb and libkrunfw) under $MSB_HOME or ~/.microsandbox".into(),
            },
            MicrosandboxError::ImageNotFound(_) if matches!(self.spec.image, ImageRef::Local { .. }) => {
                SandboxError::Unavailable {
                    what: self.redact(error.to_string()),
                    fix: "run `perch image build`".into(),
                }
            }
            MicrosandboxError::SandboxStillRunning(_) => SandboxError::Held {
                name: self.spec.name.clone(),
                owner: self.redact(format!("microsandbox says: {error}")),
            },
            _ => SandboxError::Failed {
                action,
                reason: self.redact(error.to_string()),
            },
        }
    }

    /// microsandbox's messages are not known to leave secret values out (a serialization error
    /// may quote its input), so every value is cut out before the text leaves this module.
    fn redact(&self, text: String) -> String {
        self.spec
            .secrets
            .iter()
            .fold(text, |text, secret| secret.value.redact(&text))
    }
}

impl fmt::Debug for Microvm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let machine = match self.machine.try_lock() {
            Ok(machine) if machine.is_some() => "held",
            Ok(_) => "none",
            Err(_) => "busy",
        };
        f.debug_struct("Microvm")
            .field("spec", &self.spec)
            .field("machine", &machine)
            .finish()
    }
}

impl Sandbox for Microvm {
    fn up(&self, boot: Boot) -> BoxFuture<'_, Result<Up, SandboxError>> {
        Box::pin(self.in_home(self.boot(boot)))
    }

    fn run(
        &self,
        command: Command,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<Output, SandboxError>> {
        Box::pin(self.in_home(self.execute(command, cancel)))
    }

    fn stop(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(self.in_home(self.halt_held()))
    }
}

/// Loads a `docker save` tarball or an OCI image-layout archive into the image cache of the
/// microsandbox home `home` under `reference`, for [`ImageRef::Local`].
pub async fn load_image(home: &Path, archive: &Path, reference: &str) -> Result<(), SandboxError> {
    let failed = |reason: String| SandboxError::Failed {
        action: "load the image for",
        reason,
    };
    with_home(home, async {
        let loaded = Image::load(archive, vec![reference.to_owned()])
            .await
            .map_err(|error| failed(format!("{}: {error}", archive.display())))?;
        if loaded.iter().any(|image| image.reference() == reference) {
            Ok(())
        } else {
            Err(failed(format!(
                "{} loaded, but not under the name {reference}",
                archive.display()
            )))
        }
    })
    .await
}

/// Whether the image database of the microsandbox home `home` lists `reference` (one database
/// read; the cached layer files themselves are not checked).
pub async fn image_loaded(home: &Path, reference: &str) -> Result<bool, SandboxError> {
    with_home(home, async {
        match Image::get(reference).await {
            Ok(_) => Ok(true),
            Err(MicrosandboxError::ImageNotFound(_)) => Ok(false),
            Err(error) => Err(SandboxError::Failed {
                action: "check the image of",
                reason: error.to_string(),
            }),
        }
    })
    .await
}

/// The placeholder microsandbox chooses when none is given: `$MSB_<ENV>`. perch always passes
/// its own ([`super::ResolvedSecret::placeholder`]), so the guest sees exactly that; this is a
/// default for callers that have none.
pub fn default_placeholder(env: &EnvName) -> String {
    format!("$MSB_{env}")
}

/// The egress policy for `allow`. microsandbox evaluates rules first match wins, then the
/// default; the rules are, in order:
///
/// 1. allow TCP and UDP port 53 to the gateway (`Group(Host)`): DNS through microsandbox's
///    forwarder, for any name (microsandbox judges a DNS query only by gateway rules like
///    this one and by name rules).
/// 2. deny `Group(Loopback)`, `Group(Private)` (RFC 1918, ULA, CGN), `Group(LinkLocal)`,
///    `Group(Metadata)` (169.254.169.254), `Group(Multicast)`, and `Cidr(0.0.0.0/8)`,
///    `Cidr(::/128)`. These come before every name rule, so a listed name that resolves to
///    such an address is still refused. They also make the forwarder's rebind protection
///    answer NXDOMAIN for such answers.
/// 3. allow `Group(Host)` when [`HOST_ALIAS`] is listed, deny it otherwise. The deny matters:
///    a public name whose DNS points at the gateway would otherwise reach the host.
/// 4. allow `Domain(name)` for each listed name, and `DomainSuffix(suffix)` for each
///    `*.suffix`. microsandbox's suffix also matches the apex `suffix` itself. A name rule
///    matches a connection only when the guest resolved that name to the destination address
///    through the forwarder (and, with TLS, the SNI agrees).
///
/// Both defaults are deny: everything else, including ICMP and inbound connections, is refused.
fn network_policy(allow: &[HostName]) -> Result<NetworkPolicy, String> {
    let host = allow.iter().any(|name| name.as_str() == HOST_ALIAS);
    let mut names = Vec::new();
    let mut suffixes = Vec::new();
    for name in allow
        .iter()
        .map(HostName::as_str)
        .filter(|name| *name != HOST_ALIAS)
    {
        match name.strip_prefix("*.") {
            Some(suffix) => suffixes.push(suffix.to_owned()),
            None => names.push(name.to_owned()),
        }
    }
    NetworkPolicy::builder()
        .default_deny()
        .egress(|rule| rule.tcp().udp().port(53).allow_host())
        .egress(|rule| {
            rule.deny_loopback()
                .deny_private()
                .deny_link_local()
                .deny_meta()
                .deny_multicast()
                .deny()
                .cidr("0.0.0.0/8")
                .deny()
                .cidr("::/128")
        })
        .egress(|rule| {
            if host {
                rule.allow_host()
            } else {
                rule.deny_host()
            }
        })
        .egress(move |rule| rule.allow_domains(names).allow_domain_suffixes(suffixes))
        .build()
        .map_err(|error| format!("cannot build the network policy: {error}"))
}

/// The guest's network policy ([`network_policy`]) and secrets, built without touching
/// microsandbox's state so that tests can read them; [`Microvm::builder`] applies both.
///
/// Each [`super::ResolvedSecret`] becomes one microsandbox secret: the guest sees the spec's
/// placeholder in env var `env`; the value is substituted (in request headers, microsandbox's
/// default) only in requests to `hosts` over intercepted TLS whose SNI and DNS resolution
/// agree. [`HOST_ALIAS`] is the one host that may get it over plain HTTP, and a secret for it
/// names no other host: microsandbox 0.7.11 keeps one TLS setting per secret and replaces an
/// entry with the same env rather than merging it, so `sandbox.lua` refuses the mix at load and
/// this refuses it again. Adding any secret turns microsandbox's TLS interception on. The value
/// leaves [`perch_core::secret::Secret`] only in the `.value(...)` call here.
fn guest_network(spec: &Spec) -> Result<NetworkConfig, SandboxError> {
    let policy = network_policy(&spec.allow).map_err(|reason| SandboxError::Failed {
        action: "configure",
        reason,
    })?;
    let mut network = NetworkConfig {
        policy,
        ..NetworkConfig::default()
    };
    for secret in &spec.secrets {
        if secret.hosts.is_empty() {
            return Err(SandboxError::Failed {
                action: "configure",
                reason: format!("the secret {} names no host it may be sent to", secret.env),
            });
        }
        let to_alias = secret.hosts.iter().any(|host| host.as_str() == HOST_ALIAS);
        if to_alias && secret.hosts.len() > 1 {
            return Err(SandboxError::Failed {
                action: "configure",
                reason: format!(
                    "the secret {} names {HOST_ALIAS} beside other hosts; give {HOST_ALIAS} a secret of its own",
                    secret.env
                ),
            });
        }
        let entry = secret.hosts.iter().fold(
            SecretBuilder::new()
                .env(secret.env.as_str())
                .source(SecretSource::env(secret.source.as_str()))
                .placeholder(secret.placeholder.as_str())
                .require_tls_identity(!to_alias),
            |entry, host| entry.allow(host.as_str()),
        );
        network.secrets.secrets.push(entry.build());
    }
    network
        .secrets
        .validate()
        .map_err(|error| SandboxError::Failed {
            action: "configure",
            reason: error.to_string(),
        })?;
    Ok(network)
}

/// The spec's plain environment with the command's on top; a later value for a name replaces
/// an earlier one in place (the guest would otherwise see the first of two entries).
fn exec_env(spec: &[(EnvName, String)], command: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let pairs = spec
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .chain(
            command
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
        );
    for (name, value) in pairs {
        match env.iter_mut().find(|(existing, _)| existing == name) {
            Some(entry) => entry.1 = value.to_owned(),
            None => env.push((name.to_owned(), value.to_owned())),
        }
    }
    env
}

/// Output of one command as its events arrive, each stream kept within the command's cap.
#[derive(Debug)]
struct Collected {
    stdout: HeadTail,
    stderr: HeadTail,
}

impl Collected {
    fn new(cap: StreamCap) -> Collected {
        Collected {
            stdout: HeadTail::new(cap),
            stderr: HeadTail::new(cap),
        }
    }

    /// Records one event; `Some` once the command has ended. agentd reports a command killed
    /// by a signal as exit code -1 without the signal's number, so that arrives as
    /// `End::Exited(-1)`.
    fn take(&mut self, event: ExecEvent) -> Result<Option<End>, String> {
        match event {
            ExecEvent::Stdout(bytes) => self.stdout.push(&bytes),
            ExecEvent::Stderr(bytes) => self.stderr.push(&bytes),
            ExecEvent::Exited { code } => return Ok(Some(End::Exited(code))),
            ExecEvent::Failed(failure) => return self.spawn_failed(&failure).map(Some),
            ExecEvent::Started { .. } | ExecEvent::StdinError(_) => {}
        }
        Ok(None)
    }

    /// A program that cannot be started ends as a shell would end it: 127 when it does not
    /// exist, 126 when it cannot be executed, with agentd's message on stderr.
    fn spawn_failed(&mut self, failure: &ExecFailed) -> Result<End, String> {
        let code = match failure.kind {
            ExecFailureKind::NotFound => 127,
            ExecFailureKind::PermissionDenied | ExecFailureKind::NotExecutable => 126,
            _ => return Err(format!("the command could not start: {}", failure.message)),
        };
        self.stderr
            .push(format!("perch: {}\n", failure.message).as_bytes());
        Ok(End::Exited(code))
    }

    async fn drain(&mut self, handle: &mut ExecHandle) {
        while let Some(event) = handle.recv().await {
            if !matches!(self.take(event), Ok(None)) {
                break;
            }
        }
    }

    fn into_output(self, end: End) -> Output {
        Output {
            stdout: self.stdout.finish(),
            stderr: self.stderr.finish(),
            end,
        }
    }
}

#[cfg(test)]
mod tests;
