//! `perch doctor`: can this machine run perch's microVMs? Each check says what it found and,
//! when it fails, what to do. Every check in [`run`] is local and quick (no network, no boot),
//! so [`require`] can run the machine-level ones before every effect instead of a boot attempt
//! that would fail ten seconds later. [`online`] (`perch doctor --online`) is the one part that
//! talks to the network: each channel's platform and each model provider, with their
//! credentials, all at once, each under a timeout.

use super::agent_checks::{agent_checks, loaded_checks, service_env_file};
use crate::agent::{self, AgentDir};
use crate::channel::{self, CheckError};
use crate::host::Places;
use crate::model::{self, ModelErrorKind};
use crate::sandbox::preflight::check;
use crate::sandbox::{ImageRef, SandboxError};
use perch_core::config::DEFAULT_IMAGE;
use std::fs::OpenOptions;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The machine's checks, which every effect runs first ([`crate::sandbox::preflight`]); doctor
/// reports them with its own.
pub use crate::sandbox::preflight::{
    Check, MSB_VERSION, Status, kvm, machine, require, runtime, virtualization,
};

/// Check that this machine can run perch's microVMs
///
/// KVM, hardware virtualization, the microsandbox runtime, the cache directory, the image and the clock; with an agent
/// directory, also the permissions of its secrets. Quick and local: nothing is booted or
/// downloaded, and nothing is sent unless --online. PERCH_ASSUME_KVM=1 turns a failed
/// virtualization check into a warning; PERCH_ENV_FILE names the agent's environment file
/// when it is not /etc/perch/NAME.env.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// An agent directory: check the image its sandbox.lua names instead of perch:default,
    /// and its secrets [default: the current directory, if it is an agent directory]
    pub dir: Option<PathBuf>,
    /// Also check, over the network, every channel's credentials and every model provider's
    /// key (all at once, 5 s each); never prints a credential
    #[arg(long)]
    pub online: bool,
    /// Print one JSON object instead of text: each check's name, state (ok, warn or fail),
    /// detail and fix, in the order the text shows them; the exit status is the same
    #[arg(long)]
    pub json: bool,
}

pub fn command(args: DoctorArgs) -> Result<ExitCode, String> {
    let dir = args.dir.or_else(|| {
        AgentDir::open(Path::new("."))
            .is_ok()
            .then(|| PathBuf::from("."))
    });
    let mut checks = run(&Places::from_environment(), dir.as_deref());
    if args.online {
        match &dir {
            Some(dir) => checks.extend(super::runtime()?.block_on(online(
                dir,
                |name| std::env::var(name).ok(),
                ONLINE_TIMEOUT,
            ))),
            None => checks.push(Check {
                name: "online",
                status: Status::Fail,
                detail: "nothing checked: no agent directory".to_owned(),
                fix: Some("pass the agent's directory, or run in it".to_owned()),
            }),
        }
    }
    if args.json {
        super::emit(&format!("{}\n", super::printed(&checks_json(&checks))?))?;
    } else {
        let mut out = String::new();
        for check in &checks {
            out.push_str(&format!("{check}\n"));
        }
        super::emit_escaped(&out)?;
    }
    let failed = checks.iter().any(|check| check.status == Status::Fail);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `perch doctor --json`: the checks in order, and how many failed and warned.
fn checks_json(checks: &[Check]) -> serde_json::Value {
    let count = |status: Status| checks.iter().filter(|check| check.status == status).count();
    serde_json::json!({
        "checks": checks.iter().map(|check| serde_json::json!({
            "name": check.name,
            "state": match check.status {
                Status::Ok => "ok",
                Status::Warn => "warn",
                Status::Fail => "fail",
            },
            "detail": check.detail,
            "fix": check.fix,
        })).collect::<Vec<_>>(),
        "failures": count(Status::Fail),
        "warnings": count(Status::Warn),
    })
}

/// Every local check: the machine ([`machine`]), the cache directory, the image
/// (`perch:default`, or the image the agent in `dir` names), the clock, and, given an agent,
/// the permissions of its secrets ([`secrets`]), the trust store it needs, and everything
/// `perch run` would refuse on ([`agent_checks`]).
pub fn run(places: &Places, dir: Option<&Path>) -> Vec<Check> {
    let mut checks = machine(places);
    checks.push(cache(&places.cache));
    checks.push(match dir {
        None => image(&places.cache),
        Some(dir) => agent_image(&places.cache, dir),
    });
    let agent = dir.and_then(|dir| AgentDir::open(dir).ok());
    checks.push(clock(
        SystemTime::now(),
        agent.as_ref().map(AgentDir::state_dir).as_deref(),
    ));
    if let Some(agent) = &agent {
        checks.extend(secrets(agent, places.env_file.as_deref()));
        match agent::load(agent) {
            Ok(loaded) => {
                checks.extend(trust_store(&loaded, model::check_trust_store()));
                checks.extend(loaded_checks(&loaded, places.env_file.as_deref()));
            }
            Err(_) => checks.extend(agent_checks(agent, places.env_file.as_deref())),
        }
    }
    checks
}

/// Whether this machine can verify the `https://` servers the agent talks to with its own trust
/// store: the model providers in `models.yml` and Matrix homeservers (Telegram's and Discord's
/// clients carry their own roots). `found` is [`model::check_trust_store`]'s answer. No check
/// when nothing the agent uses is `https://`; a failure only for the agent's own model or a
/// homeserver, a warning when only another provider needs it.
pub fn trust_store(
    loaded: &agent::LoadedAgent,
    found: Result<(), model::SetupProblem>,
) -> Option<Check> {
    let https = |url: &str| {
        url.get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    };
    let definition = &loaded.definition;
    let own = &definition.agent.model.provider;
    let mut needed = Vec::new();
    let mut wanted = Vec::new();
    for (name, provider) in &definition.models.providers {
        if https(&provider.base_url) {
            let place = format!("models.yml providers.{name} ({})", provider.base_url);
            if name == own {
                needed.push(place)
            } else {
                wanted.push(place)
            }
        }
    }
    for channel in &loaded.channels {
        if let perch_core::config::Platform::Matrix { homeserver, .. } = &channel.config.platform
            && https(homeserver)
        {
            needed.push(format!("{} ({homeserver})", channel.file));
        }
    }
    let users = needed
        .iter()
        .chain(&wanted)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if users.is_empty() {
        return None;
    }
    Some(match found {
        Ok(()) => check(
            "trust",
            true,
            format!("CA certificates found, for {users}"),
            "",
        ),
        Err(setup) => Check {
            name: "trust",
            status: if needed.is_empty() {
                Status::Warn
            } else {
                Status::Fail
            },
            detail: format!("{}; needed by {users}", setup.problem),
            fix: Some(setup.fix.to_owned()),
        },
    })
}

/// The cache is writable, or, as the service runs it, a directory of root's that this user can
/// read (`perch image build` writes it as root). As root, doctor writes nothing into a cache
/// another user can change.
fn cache(path: &Path) -> Check {
    if let Some(reason) = crate::host::trust::refusal_as_root(path) {
        return Check {
            name: "cache",
            status: Status::Warn,
            detail: format!(
                "{} is not probed: this is root, and {reason}",
                path.display()
            ),
            fix: Some("run doctor as the user that owns it".to_owned()),
        };
    }
    match std::fs::create_dir_all(path).and_then(|()| tempfile_probe(path)) {
        Ok(()) => check("cache", true, format!("{} is writable", path.display()), ""),
        Err(error)
            if error.kind() == std::io::ErrorKind::PermissionDenied
                && root_owned_and_readable(path) =>
        {
            check(
                "cache",
                true,
                format!(
                    "{} is root's and readable (perch image build writes it as root)",
                    path.display()
                ),
                "",
            )
        }
        Err(error) => check(
            "cache",
            false,
            format!("{} is not writable: {error}", path.display()),
            "set PERCH_CACHE to a writable directory",
        ),
    }
}

fn root_owned_and_readable(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir() && meta.uid() == 0)
        && std::fs::read_dir(path).is_ok()
}

fn tempfile_probe(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(probe)
}

/// `perch:default` is built: the cache records a build whose root filesystem exists.
pub fn image(cache: &Path) -> Check {
    match crate::sandbox::image::resolve_default_image(cache) {
        Ok(ImageRef::Local {
            reference, rootfs, ..
        }) => check(
            "image",
            true,
            format!(
                "{reference} is built (root filesystem {})",
                rootfs.display()
            ),
            "",
        ),
        Ok(ImageRef::Registry(reference)) => {
            check("image", true, format!("{DEFAULT_IMAGE} is {reference}"), "")
        }
        Err(SandboxError::Unavailable { what, fix }) => check("image", false, what, &fix),
        Err(other) => check("image", false, other.to_string(), "run `perch image build`"),
    }
}

/// The image the agent in `dir` boots: `perch:default` is checked; a registry image is pulled
/// at boot, so it is only named.
fn agent_image(cache: &Path, dir: &Path) -> Check {
    let info = format!("perch info {}", dir.display());
    let agent = match AgentDir::open(dir) {
        Ok(agent) => agent,
        Err(error) => return check("agent", false, error.to_string(), "pass an agent directory"),
    };
    let loaded = match agent::load(&agent) {
        Ok(loaded) => loaded,
        Err(problems) => {
            return check(
                "agent",
                false,
                format!(
                    "{}: the configuration has {} problem(s), so its image is unknown",
                    agent.root().display(),
                    problems.len()
                ),
                &format!("run `{info}` to see them"),
            );
        }
    };
    let reference = &loaded.definition.sandbox.image;
    if reference == DEFAULT_IMAGE {
        return image(cache);
    }
    Check {
        name: "image",
        status: Status::Warn,
        detail: format!(
            "sandbox.lua names {reference}, a registry image: microsandbox pulls it at boot, so doctor does not check it"
        ),
        fix: None,
    }
}

/// 2026-11-01 00:00 UTC, in seconds since the epoch: this perch was written after it, so a clock
/// that says otherwise is wrong.
pub const WRITTEN_AFTER_SECS: u64 = 1_793_491_200;

/// How far in the future a file under `.perch/` may seem to have been written before the clock
/// counts as gone back (file systems and clocks disagree by a little).
const CLOCK_SLACK: Duration = Duration::from_secs(300);

/// The most entries looked at under `.perch/` by one walk, so that doctor stays quick.
const WALK_LIMIT: usize = 20_000;

/// The most files and directories with loose permissions named one per line.
const EXPOSED_SHOWN: usize = 20;

const CLOCK_FIX: &str =
    "set the clock and keep it synchronised (`timedatectl set-ntp true`, or chrony)";

/// The clock is not before [`WRITTEN_AFTER_SECS`], and, given the agent's `.perch/`, no file
/// there was written more than a few minutes after `now` (which would mean the clock went
/// back). Local only: nothing is asked of a time server.
pub fn clock(now: SystemTime, state_dir: Option<&Path>) -> Check {
    let written_after = UNIX_EPOCH + Duration::from_secs(WRITTEN_AFTER_SECS);
    let shown = format_time(now);
    if now < written_after {
        return check(
            "clock",
            false,
            format!(
                "the clock says {shown}, before this perch was written ({})",
                format_time(written_after)
            ),
            CLOCK_FIX,
        );
    }
    if let Some(state_dir) = state_dir
        && let Some((path, modified)) = newest(state_dir)
        && modified > now + CLOCK_SLACK
    {
        let ahead = modified.duration_since(now).unwrap_or_default();
        return Check {
            name: "clock",
            status: Status::Warn,
            detail: format!(
                "the clock says {shown}, but {} was written at {}, {} later: the clock went back",
                path.display(),
                format_time(modified),
                span(ahead)
            ),
            fix: Some(CLOCK_FIX.to_owned()),
        };
    }
    let files = if state_dir.is_some_and(Path::is_dir) {
        " and every file under .perch/"
    } else {
        ""
    };
    check(
        "clock",
        true,
        format!("{shown}, after this perch was written{files}"),
        "",
    )
}

fn format_time(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

fn span(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..=5_999 => format!("{} min", seconds.div_ceil(60)),
        6_000..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86_400),
    }
}

/// The most recently modified entry under `dir` (at most [`WALK_LIMIT`] looked at; symlinks
/// not followed).
fn newest(dir: &Path) -> Option<(PathBuf, SystemTime)> {
    let mut newest: Option<(PathBuf, SystemTime)> = None;
    walk(dir, &mut |path, meta| {
        if let Ok(modified) = meta.modified()
            && newest.as_ref().is_none_or(|(_, time)| modified > *time)
        {
            newest = Some((path.to_owned(), modified));
        }
    });
    newest
}

/// Calls `visit` with `dir` and every entry under it, depth first, without following
/// symlinks, for at most [`WALK_LIMIT`] entries.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let mut stack = vec![dir.to_owned()];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        seen += 1;
        if seen > WALK_LIMIT {
            return;
        }
        visit(&path, &meta);
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
}

/// A secret whose mode lets someone besides its owner in.
struct Exposed {
    path: PathBuf,
    mode: u32,
    directory: bool,
    holds: &'static str,
}

/// The permissions of the agent's secrets: `.perch/` (0700), everything under `.perch/matrix/`
/// (directories 0700, files 0600: the Matrix device's access token and keys),
/// `.perch/control.sock` (0600), and the agent's environment file (0600): `env_file`, or the
/// service's `/etc/perch/<name>.env` when it exists. When the agent directory names an
/// operators' group (`crate::store::control::access`), `.perch/` may let that group search it
/// and the socket is theirs to reach (perch checks each connection's peer). Anything else open
/// to its group or to others is
/// a warning with the `chmod` that closes it.
pub fn secrets(agent: &AgentDir, env_file: Option<&Path>) -> Vec<Check> {
    let state = agent.state_dir();
    let mut exposed = Vec::new();
    let mut checked = Vec::new();
    let mut notes = Vec::new();
    let operators = crate::store::control::access(agent.root()).operators;
    let mut look = |path: &Path, meta: &std::fs::Metadata, allowed: u32, holds: &'static str| {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 & !allowed != 0 {
            exposed.push(Exposed {
                path: path.to_owned(),
                mode,
                directory: meta.is_dir(),
                holds,
            });
        }
    };
    if let Ok(meta) = std::fs::symlink_metadata(&state)
        && meta.is_dir()
    {
        let operators_search = if operators.is_some_and(|gid| meta.gid() == gid) {
            0o010
        } else {
            0
        };
        look(&state, &meta, operators_search, "the agent's state");
        checked.push(".perch/".to_owned());
        let matrix = agent.matrix_stores_dir();
        let mut entries = 0;
        walk(&matrix, &mut |path, meta| {
            if meta.is_dir() || meta.is_file() {
                entries += 1;
                look(path, meta, 0, "the Matrix device's access token and keys");
            }
        });
        if entries > 0 {
            checked.push(format!("{entries} entries in .perch/matrix/"));
        }
        let socket = agent.control_socket();
        if let Ok(meta) = std::fs::symlink_metadata(&socket)
            && meta.file_type().is_socket()
        {
            if let Some(gid) = operators {
                checked.push(format!(
                    ".perch/control.sock (for the operators' group, gid {gid}; each connection's peer is checked)"
                ));
            } else {
                look(&socket, &meta, 0, "the running agent's controls");
                checked.push(".perch/control.sock".to_owned());
            }
        }
    }
    let env = env_file.map_or_else(
        || service_env_file(agent.root()),
        |path| Some(path.to_owned()),
    );
    if let Some(env) = env {
        match std::fs::metadata(&env) {
            Ok(meta) => {
                look(&env, &meta, 0, "the agent's tokens and keys");
                checked.push(env.display().to_string());
            }
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
                checked.push(format!("{} (closed to this user)", env.display()));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && env_file.is_none() => {}
            Err(error) => notes.push(Check {
                name: "secrets",
                status: Status::Warn,
                detail: format!(
                    "the environment file {} (PERCH_ENV_FILE) cannot be checked: {error}",
                    env.display()
                ),
                fix: Some("point PERCH_ENV_FILE at the agent's environment file".to_owned()),
            }),
        }
    }
    let mut checks: Vec<Check> = exposed
        .iter()
        .take(EXPOSED_SHOWN)
        .map(|item| Check {
            name: "secrets",
            status: Status::Warn,
            detail: format!(
                "{} is {:04o}: open to {}, and it holds {}",
                item.path.display(),
                item.mode,
                open_to(item.mode),
                item.holds
            ),
            fix: Some(format!(
                "chmod {} {}",
                if item.directory { 700 } else { 600 },
                item.path.display()
            )),
        })
        .collect();
    if exposed.len() > EXPOSED_SHOWN {
        checks.push(Check {
            name: "secrets",
            status: Status::Warn,
            detail: format!(
                "and {} more open to their group or others",
                exposed.len() - EXPOSED_SHOWN
            ),
            fix: Some(format!("chmod -R go= {}", state.display())),
        });
    }
    checks.extend(notes);
    if checks.is_empty() {
        let detail = if checked.is_empty() {
            "no .perch/ yet and no environment file: nothing to check".to_owned()
        } else {
            format!("private to their owner: {}", checked.join(", "))
        };
        checks.push(check("secrets", true, detail, ""));
    }
    checks
}

fn open_to(mode: u32) -> &'static str {
    match (mode & 0o070 != 0, mode & 0o007 != 0) {
        (true, true) => "its group and everyone else",
        (true, false) => "its group",
        _ => "everyone else",
    }
}

/// How long each check of [`online`] may take.
pub const ONLINE_TIMEOUT: Duration = Duration::from_secs(5);

/// `perch doctor --online`: every channel of the agent in `dir` ([`channel::Connector::check`])
/// and every model provider in its `models.yml` ([`model::check_provider`]), all at once, each
/// within `timeout`, with the credentials read through `lookup` (the shell passes the process
/// environment). One check per channel and per provider, in the order they are declared; no
/// detail or fix ever holds a credential.
pub async fn online(
    dir: &Path,
    lookup: impl Fn(&str) -> Option<String>,
    timeout: Duration,
) -> Vec<Check> {
    let agent = match AgentDir::open(dir) {
        Ok(agent) => agent,
        Err(error) => {
            return vec![check(
                "online",
                false,
                format!("nothing checked: {error}"),
                "pass an agent directory",
            )];
        }
    };
    let loaded = match agent::load(&agent) {
        Ok(loaded) => loaded,
        Err(problems) => {
            return vec![check(
                "online",
                false,
                format!(
                    "nothing checked: the configuration has {} problem(s)",
                    problems.len()
                ),
                &format!("run `perch info {}` to see them", agent.root().display()),
            )];
        }
    };
    let mut pending: Vec<tokio::task::JoinHandle<Check>> = Vec::new();
    for channel in &loaded.channels {
        let config = &channel.config;
        let label = format!("{} ({})", config.name, config.platform.kind().as_str());
        let variables = channel::credential_variables(channel);
        let (place, refused) = match config.platform {
            perch_core::config::Platform::Matrix { .. } => (
                "homeserver",
                format!(
                    "stop perch and remove {} to log in again as a new device",
                    agent.matrix_store_dir(config.name.as_str()).display()
                ),
            ),
            _ => ("api_url", channel::credentials_fix(channel)),
        };
        let fixes = Fixes {
            refused,
            unreachable: format!(
                "check the network, any proxy, and the {place} in {}",
                channel.file
            ),
            failed: format!("check the {place} in {}", channel.file),
        };
        match channel::connect(channel, &agent, &lookup) {
            Ok(connector) => pending.push(tokio::spawn(async move {
                channel_check(label, fixes, timeout, connector.check()).await
            })),
            Err(error) => pending.push(tokio::spawn(std::future::ready(check(
                "channel",
                false,
                format!("{label}: not checked: {error}"),
                &format!("set {variables} in the environment perch runs with"),
            )))),
        }
    }
    let used = &loaded.definition.agent.model.provider;
    for (name, provider) in &loaded.definition.models.providers {
        let label = format!(
            "{name} ({} at {})",
            provider.api.as_str(),
            provider.base_url
        );
        let key = match &provider.api_key {
            None => None,
            Some(reference) => match reference.resolve(&lookup) {
                Ok(key) => Some(key),
                Err(missing) => {
                    let detail = format!("{label}: not checked: {missing}");
                    let fix = format!("set {} in the environment perch runs with", missing.0);
                    pending.push(tokio::spawn(std::future::ready(if name == used {
                        check("model", false, detail, &fix)
                    } else {
                        Check {
                            name: "model",
                            status: Status::Warn,
                            detail: format!(
                                "{detail} (the agent's model, {}, is another provider's)",
                                loaded.definition.agent.model
                            ),
                            fix: None,
                        }
                    })));
                    continue;
                }
            },
        };
        let variable = provider
            .api_key
            .as_ref()
            .map(|reference| reference.name().to_string());
        let provider = provider.clone();
        pending.push(tokio::spawn(async move {
            let checked =
                tokio::time::timeout(timeout, model::check_provider(&provider, key.as_ref())).await;
            model_check(&label, variable.as_deref(), timeout, checked)
        }));
    }
    let mut checks = Vec::new();
    for task in pending {
        checks.push(task.await.unwrap_or_else(|error| {
            check(
                "online",
                false,
                format!("a check did not finish: {error}"),
                "run `perch doctor --online` again",
            )
        }));
    }
    checks
}

/// The fix for each way a channel's check can fail.
struct Fixes {
    refused: String,
    unreachable: String,
    failed: String,
}

async fn channel_check(
    label: String,
    fixes: Fixes,
    timeout: Duration,
    checking: channel::BoxFuture<'_, Result<channel::Checked, CheckError>>,
) -> Check {
    let (status, detail, fix) = match tokio::time::timeout(timeout, checking).await {
        Ok(Ok(checked)) if checked.verified => (Status::Ok, checked.detail, None),
        Ok(Ok(checked)) => (Status::Warn, checked.detail, None),
        Ok(Err(error)) => {
            let fix = match &error {
                CheckError::Refused { .. } => fixes.refused,
                CheckError::Unreachable { .. } => fixes.unreachable,
                CheckError::Failed { .. } => fixes.failed,
                CheckError::Incomplete { fix, .. } => fix.clone(),
            };
            (Status::Fail, error.to_string(), Some(fix))
        }
        Err(_) => (
            Status::Fail,
            format!("timeout: no answer within {} s", timeout.as_secs_f64()),
            Some(fixes.unreachable),
        ),
    };
    Check {
        name: "channel",
        status,
        detail: format!("{label}: {detail}"),
        fix,
    }
}

fn model_check(
    label: &str,
    variable: Option<&str>,
    timeout: Duration,
    checked: Result<Result<String, ModelErrorKind>, tokio::time::error::Elapsed>,
) -> Check {
    let unreachable = "check the network, any proxy, and the provider's baseUrl in models.yml";
    let (status, detail, fix) = match checked {
        Ok(Ok(detail)) => (Status::Ok, detail, None),
        Ok(Err(ModelErrorKind::Rejected {
            status: status @ (401 | 403),
            message,
        })) => (
            Status::Fail,
            format!("refused ({status}): {message}"),
            Some(match variable {
                Some(variable) => format!("check the key in {variable}"),
                None => "the provider wants a key: add `apiKey: $NAME` to models.yml".to_owned(),
            }),
        ),
        Ok(Err(ModelErrorKind::Disconnected { detail })) => (
            Status::Fail,
            format!("unreachable: {detail}"),
            Some(unreachable.to_owned()),
        ),
        Ok(Err(ModelErrorKind::Misconfigured(setup))) => {
            (Status::Fail, setup.problem, Some(setup.fix.to_owned()))
        }
        Ok(Err(ModelErrorKind::Timeout)) | Err(_) => (
            Status::Fail,
            format!("timeout: no answer within {} s", timeout.as_secs_f64()),
            Some(unreachable.to_owned()),
        ),
        Ok(Err(other)) => (
            Status::Warn,
            format!(
                "GET /models answered, but the key is not verified: {}",
                describe_model_error(&other)
            ),
            None,
        ),
    };
    Check {
        name: "model",
        status,
        detail: format!("{label}: {detail}"),
        fix,
    }
}

fn describe_model_error(kind: &ModelErrorKind) -> String {
    match kind {
        ModelErrorKind::RateLimited { .. } => "rate limited (429)".to_owned(),
        ModelErrorKind::Server { status, message }
        | ModelErrorKind::Rejected { status, message }
        | ModelErrorKind::OutOfCredit { status, message } => {
            format!("{status}: {message}")
        }
        ModelErrorKind::Disconnected { detail } | ModelErrorKind::Garbage { detail } => {
            detail.clone()
        }
        ModelErrorKind::Misconfigured(setup) => setup.problem.clone(),
        ModelErrorKind::Timeout => "timed out".to_owned(),
        ModelErrorKind::Cancelled => "cancelled".to_owned(),
    }
}
