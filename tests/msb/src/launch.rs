//! `msb machine`: the launch boundary as `microsandbox` 0.7.11 drives it (`runtime/spawn.rs`).
//!
//! argv carries labels and descriptor numbers; fd 96 the `LaunchConfig` JSON; fd 97 (optional)
//! the parent-watch pipe (EOF = the creator died: stop; byte 0x01 = detach: keep running);
//! fd 98 (optional) the startup pipe, else stdout; fd 99 the per-sandbox lifecycle lock, held
//! simply by never closing it, so it is released exactly when this process is gone.
//!
//! The order follows the real runtime (`runner/vm.rs` `run`): the startup line first, then the
//! run row, then the guest; a failure after the startup line is written to
//! `log_dir/boot-error.json` and ends the process with 1, which is what the crate reads when the
//! process dies before its relay answers.

use crate::catalog::{Catalog, TerminationReason};
use crate::guest::{AssembleError, Guest, GuestPlan};
use crate::relay;
use microsandbox_runtime::boot_error::{BootError, BootErrorStage};
use microsandbox_runtime::launch::{LaunchCapabilities, LaunchConfig, PARENT_WATCH_DETACH};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The labels and descriptor numbers `msb machine` gets on its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineArgs {
    /// `--name`: the sandbox name.
    pub name: String,
    /// `--sandbox-id`: the sandbox's catalog id.
    pub sandbox_id: i32,
    /// `--parent-watch-fd`: the read end of the creator's watchdog pipe.
    pub parent_watch_fd: Option<i32>,
    /// `--startup-fd`: where the startup line goes instead of stdout.
    pub startup_fd: Option<i32>,
    /// `--config-fd`: the launch config.
    pub config_fd: i32,
    /// `--lifecycle-lock-fd`: the lifecycle lock (held for life by never closing it).
    pub lifecycle_lock_fd: Option<i32>,
}

/// Parses the arguments after `machine`. Sizing (`--vcpus`, `--memory-mib`, their maxima) and
/// log-level flags are accepted and ignored; `--restore` is refused, as is anything unknown.
pub fn parse_machine_args(args: &[String]) -> Result<MachineArgs, String> {
    let mut name = None;
    let mut sandbox_id = None;
    let mut parent_watch_fd = None;
    let mut startup_fd = None;
    let mut config_fd = None;
    let mut lifecycle_lock_fd = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let flag = flag.as_str();
        if matches!(
            flag,
            "--error" | "--warn" | "--info" | "--debug" | "--trace"
        ) {
            continue;
        }
        if flag == "--restore" {
            return Err("checkpoint restore is not supported by the stand-in runtime".into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .as_str();
        let number = |value: &str| {
            value
                .parse::<i32>()
                .map_err(|_| format!("{flag} takes a number, not {value:?}"))
        };
        match flag {
            "--name" => name = Some(value.to_string()),
            "--sandbox-id" => sandbox_id = Some(number(value)?),
            "--parent-watch-fd" => parent_watch_fd = Some(number(value)?),
            "--startup-fd" => startup_fd = Some(number(value)?),
            "--config-fd" => config_fd = Some(number(value)?),
            "--lifecycle-lock-fd" => lifecycle_lock_fd = Some(number(value)?),
            "--vcpus" | "--memory-mib" | "--max-vcpus" | "--max-memory-mib" => {
                number(value)?;
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(MachineArgs {
        name: name.ok_or("--name is required")?,
        sandbox_id: sandbox_id.ok_or("--sandbox-id is required")?,
        parent_watch_fd,
        startup_fd,
        config_fd: config_fd.ok_or("--config-fd is required")?,
        lifecycle_lock_fd,
    })
}

/// What `msb __launch-protocol` answers: the capabilities the real 0.7.11 runtime advertises.
/// The stand-in enforces none of the network ones (it has no network but loopback); it accepts
/// them so the crate launches the configuration perch really sends.
pub fn capabilities() -> LaunchCapabilities {
    LaunchCapabilities {
        protocols: vec![1, 2],
        required_restore_backing: true,
        tcp_accept_queue_size: true,
        max_inbound_tcp_connections: true,
        http_deny_message: true,
        http_deny_json: true,
        http_connect_proxy: true,
        http_connect_proxy_auth: true,
        guest_clock: true,
        fs_state_limit: true,
        exec_limits: true,
    }
}

/// `<home>`: two levels above `db_path` (`<home>/db/msb.db`).
pub fn home_of(db_path: &Path) -> PathBuf {
    db_path
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Runs `msb machine` with `argv` (everything after the program name, starting at `machine`).
pub fn machine(argv: &[String]) -> ExitCode {
    let inherited_fds = inherited_fds();
    let args = match parse_machine_args(argv.get(1..).unwrap_or_default()) {
        Ok(args) => args,
        Err(error) => return complain(&format!("msb machine: {error}"), 2),
    };
    let raw = match read_descriptor(args.config_fd) {
        Ok(raw) => raw,
        Err(error) => {
            return complain(
                &format!(
                    "msb machine: cannot read the launch config on fd {}: {error}",
                    args.config_fd
                ),
                1,
            );
        }
    };
    let config = match LaunchConfig::decode(&raw) {
        Ok(config) => config,
        Err(error) => return complain(&format!("msb machine: {error}"), 1),
    };
    if let Err(error) = record_launch(&config, &args, argv, &raw) {
        return complain(
            &format!("msb machine: cannot record the launch: {error}"),
            1,
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return complain(&format!("msb machine: tokio runtime: {error}"), 1),
    };
    runtime.block_on(run(args, config, inherited_fds))
}

fn complain(message: &str, code: u8) -> ExitCode {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
    ExitCode::from(code)
}

/// Descriptors above stderr open at start: what the crate handed over (the config file, the
/// pipes, the lifecycle lock, disk locks). Read before this process opens anything itself.
fn inherited_fds() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<i32> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    // read_dir's own descriptor is listed too; it is closed by now.
    fds.retain(|fd| Path::new(&format!("/proc/self/fd/{fd}")).exists());
    fds.sort_unstable();
    fds
}

/// Reads an inherited descriptor from its start, through `/proc/self/fd` (a fresh open file
/// description, so the inherited one is left as it is).
fn read_descriptor(fd: i32) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    std::fs::File::open(format!("/proc/self/fd/{fd}"))?.read_to_end(&mut raw)?;
    Ok(raw)
}

/// Appends this launch to `<home>/standin/launches.jsonl` (0600: the config holds resolved
/// secret values).
fn record_launch(
    config: &LaunchConfig,
    args: &MachineArgs,
    argv: &[String],
    raw: &[u8],
) -> Result<(), String> {
    let received: serde_json::Value =
        serde_json::from_slice(raw).map_err(|error| error.to_string())?;
    let line = serde_json::json!({
        "name": args.name,
        "sandbox_id": args.sandbox_id,
        "argv": argv,
        "config": received,
    });
    let dir = home_of(&config.db_path).join("standin");
    std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let path = dir.join("launches.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .map_err(|error| format!("{}: {error}", path.display()))?;
    file.write_all(format!("{line}\n").as_bytes())
        .map_err(|error| format!("{}: {error}", path.display()))
}

/// Writes the startup line to the startup pipe or stdout.
fn announce(startup_fd: Option<i32>) -> std::io::Result<()> {
    let line = format!(
        "{}\n",
        serde_json::json!({"pid": std::process::id(), "startup_events": false})
    );
    match startup_fd {
        Some(fd) => std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))?
            .write_all(line.as_bytes()),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(line.as_bytes())?;
            stdout.flush()
        }
    }
}

/// After the startup line, as the real runtime does: stdout to /dev/null (the creator may drop
/// the pipe), stderr to `log_dir/runtime.log`.
fn redirect_output(log_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(log_dir)?;
    let devnull = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    nix::unistd::dup2_stdout(&devnull)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join("runtime.log"))?;
    nix::unistd::dup2_stderr(&log)?;
    Ok(())
}

fn log(message: &str) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "{} msb stand-in: {message}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
}

/// Writes `boot-error.json` for a boot that failed after the startup line.
fn boot_failed(
    log_dir: &Path,
    stage: BootErrorStage,
    message: &str,
    errno: Option<i32>,
) -> ExitCode {
    log(&format!("boot failed: {message}"));
    let record = BootError {
        t: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        stage,
        errno,
        reason: None,
        message: message.to_string(),
    };
    if let Err(error) = record.write_atomic(log_dir) {
        log(&format!("cannot write boot-error.json: {error}"));
    }
    ExitCode::from(1)
}

/// Why the runtime is ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// `core.shutdown` from the host.
    ShutdownRequested,
    /// SIGTERM or SIGUSR1.
    Signal,
    /// The creator died (parent-watch EOF).
    ParentExit,
    /// The guest ended by itself.
    GuestEnded,
}

impl Ending {
    fn reason(self) -> TerminationReason {
        match self {
            Ending::ShutdownRequested => TerminationReason::ShutdownRequested,
            Ending::Signal | Ending::ParentExit => TerminationReason::Signal,
            Ending::GuestEnded => TerminationReason::Failed,
        }
    }
}

async fn run(args: MachineArgs, config: LaunchConfig, inherited_fds: Vec<i32>) -> ExitCode {
    if let Err(error) = announce(args.startup_fd) {
        return complain(
            &format!("msb machine: cannot write the startup line: {error}"),
            1,
        );
    }
    if let Err(error) = redirect_output(&config.log_dir) {
        return boot_failed(
            &config.log_dir,
            BootErrorStage::Other,
            &format!("runtime log: {error}"),
            error.raw_os_error(),
        );
    }
    log(&format!(
        "sandbox {} (id {}) starting",
        args.name, args.sandbox_id
    ));
    let catalog = match Catalog::open_run(
        &config.db_path,
        config.db_connect_timeout_secs,
        args.sandbox_id,
        std::process::id(),
    )
    .await
    {
        Ok(catalog) => catalog,
        Err(error) => return boot_failed(&config.log_dir, BootErrorStage::Other, &error, None),
    };
    let guest = match assemble(&config, &inherited_fds).await {
        Ok(guest) => Arc::new(guest),
        Err(error) => {
            let _ = catalog.mark_failed().await;
            return boot_failed(
                &config.log_dir,
                BootErrorStage::Mount,
                &error.message,
                error.errno,
            );
        }
    };
    let (agent_listener, control_listener) = match bind_sockets(&config, &args.name) {
        Ok(listeners) => listeners,
        Err(error) => {
            guest.stop().await;
            let _ = catalog.mark_failed().await;
            return boot_failed(
                &config.log_dir,
                BootErrorStage::Other,
                &format!("bind the agent socket: {error}"),
                error.raw_os_error(),
            );
        }
    };
    let (shutdown_sender, shutdown_requests) = tokio::sync::mpsc::channel(4);
    let execs = relay::Execs::default();
    let relay_config = relay::RelayConfig {
        exec_limits: config.bootstrap.exec_limits.unwrap_or_default(),
        control_endpoint: relay::control_socket_path(&config.agent_sock),
    };
    tokio::spawn(relay::serve(
        agent_listener,
        Arc::clone(&guest),
        relay_config,
        execs.clone(),
        shutdown_sender,
    ));
    tokio::spawn(crate::control::serve_control(control_listener, execs));
    log("guest ready");
    let ignore_marker = home_of(&config.db_path)
        .join("standin/ignore-shutdown")
        .join(&args.name);
    let ending = wait_for_ending(
        &guest,
        args.parent_watch_fd,
        shutdown_requests,
        &ignore_marker,
    )
    .await;
    log(&format!("stopping: {ending:?}"));
    guest.stop().await;
    log("guest stopped");
    if let Err(error) = microsandbox_runtime::ipc::remove_socket_pair(&config.agent_sock) {
        log(&format!("cannot remove the sockets: {error}"));
    }
    if let Err(error) = catalog.finish(ending.reason(), 0).await {
        log(&error);
    }
    log("stopped");
    ExitCode::SUCCESS
}

async fn assemble(config: &LaunchConfig, inherited_fds: &[i32]) -> Result<Guest, AssembleError> {
    let plan = GuestPlan::from_launch(config)?;
    Guest::assemble(&plan, inherited_fds).await
}

/// Binds the agent relay socket at `agent_sock` and the runtime's control socket beside it
/// (`ipc::control_socket_path_for`), replacing stale files a killed predecessor left.
fn bind_sockets(
    config: &LaunchConfig,
    name: &str,
) -> std::io::Result<(tokio::net::UnixListener, tokio::net::UnixListener)> {
    use microsandbox_runtime::ipc;
    ipc::RuntimeSocketPaths::new(&config.run_dir, name)
        .prepare_canonical_directory(&config.agent_sock)?;
    if let Some(parent) = config.agent_sock.parent() {
        std::fs::create_dir_all(parent)?;
    }
    ipc::remove_socket_pair(&config.agent_sock)?;
    let control = ipc::control_socket_path_for(&config.agent_sock);
    let agent_listener = tokio::net::UnixListener::bind(&config.agent_sock)?;
    let control_listener = tokio::net::UnixListener::bind(&control)?;
    Ok((agent_listener, control_listener))
}

/// Waits for the first reason to end: `core.shutdown`, SIGTERM or SIGUSR1 (the real VMM's
/// graceful-exit signals, `msb_krun_vmm` `exit_signal.rs`), parent exit, or the guest ending.
/// SIGINT does not end it: the real VMM forwards it to the guest console when stdin is not a
/// terminal, so a terminal's Ctrl-C, which reaches msb in its creator's process group, leaves
/// the sandbox to its creator. A shutdown request, SIGTERM or SIGUSR1 is ignored while the
/// test knob `ignore_marker` (`<home>/standin/ignore-shutdown/<name>`) exists, so tests can
/// exercise the crate's kill fallback; parent exit and SIGKILL still end the runtime.
async fn wait_for_ending(
    guest: &Guest,
    parent_watch_fd: Option<i32>,
    mut shutdown_requests: tokio::sync::mpsc::Receiver<()>,
    ignore_marker: &Path,
) -> Ending {
    use tokio::signal::unix::{SignalKind, signal};
    let mut parent_gone = watch_parent(parent_watch_fd);
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut user_exit = signal(SignalKind::user_defined1()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let mut guest_check = tokio::time::interval(Duration::from_millis(250));
    let ignoring = |what: &str| {
        let ignore = ignore_marker.exists();
        if ignore {
            log(&format!(
                "{what} ignored: {} exists",
                ignore_marker.display()
            ));
        }
        ignore
    };
    loop {
        tokio::select! {
            Some(()) = shutdown_requests.recv() => {
                if !ignoring("shutdown request") {
                    return Ending::ShutdownRequested;
                }
            }
            Some(()) = next_signal(&mut terminate) => {
                if !ignoring("SIGTERM") {
                    return Ending::Signal;
                }
            }
            Some(()) = next_signal(&mut user_exit) => {
                if !ignoring("SIGUSR1") {
                    return Ending::Signal;
                }
            }
            Some(()) = next_signal(&mut interrupt) => log("SIGINT ignored (the guest console's)"),
            Ok(()) = &mut parent_gone => return Ending::ParentExit,
            _ = guest_check.tick() => {
                if guest.has_ended() {
                    return Ending::GuestEnded;
                }
            }
        }
    }
}

async fn next_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// Watches the parent-watch pipe on a thread of its own: resolves on EOF (the creator died);
/// never resolves once the creator sends the detach byte, or without a pipe.
fn watch_parent(fd: Option<i32>) -> tokio::sync::oneshot::Receiver<()> {
    let (gone, receiver) = tokio::sync::oneshot::channel();
    let Some(fd) = fd else {
        std::mem::forget(gone);
        return receiver;
    };
    let pipe = match std::fs::File::open(format!("/proc/self/fd/{fd}")) {
        Ok(pipe) => pipe,
        Err(error) => {
            log(&format!("cannot watch the parent on fd {fd}: {error}"));
            std::mem::forget(gone);
            return receiver;
        }
    };
    std::thread::spawn(move || {
        let mut pipe = pipe;
        let mut byte = [0u8; 1];
        loop {
            match pipe.read(&mut byte) {
                Ok(0) => {
                    let _ = gone.send(());
                    return;
                }
                Ok(_) if byte[0] == PARENT_WATCH_DETACH => {
                    log("detached from the creator");
                    std::mem::forget(gone);
                    return;
                }
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    log(&format!("parent watch: {error}"));
                    std::mem::forget(gone);
                    return;
                }
            }
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn the_crates_machine_argv_parses() {
        let args = parse_machine_args(&strings(&[
            "--debug",
            "--name",
            "perch-a",
            "--sandbox-id",
            "7",
            "--parent-watch-fd",
            "97",
            "--vcpus",
            "2",
            "--memory-mib",
            "1024",
            "--config-fd",
            "96",
            "--lifecycle-lock-fd",
            "99",
        ]))
        .expect("parses");
        assert_eq!(
            args,
            MachineArgs {
                name: "perch-a".into(),
                sandbox_id: 7,
                parent_watch_fd: Some(97),
                startup_fd: None,
                config_fd: 96,
                lifecycle_lock_fd: Some(99),
            }
        );
    }

    #[test]
    fn restore_and_unknown_arguments_are_refused() {
        let base = ["--name", "a", "--sandbox-id", "1", "--config-fd", "96"];
        let mut restore = strings(&base);
        restore.push("--restore".into());
        assert!(parse_machine_args(&restore).is_err());
        let mut unknown = strings(&base);
        unknown.extend(strings(&["--frobnicate", "1"]));
        assert!(parse_machine_args(&unknown).is_err());
        assert!(parse_machine_args(&strings(&["--name", "a"])).is_err());
    }

    #[test]
    fn the_capabilities_allow_perchs_http_deny_response() {
        let json = serde_json::to_value(capabilities()).expect("serializes");
        assert_eq!(json["http_deny_message"], true);
        assert_eq!(json["http_deny_json"], true);
        assert_eq!(json["exec_limits"], true);
        assert_eq!(json["protocols"], serde_json::json!([1, 2]));
    }

    #[test]
    fn home_is_two_levels_above_the_catalog() {
        assert_eq!(
            home_of(Path::new("/srv/home/db/msb.db")),
            PathBuf::from("/srv/home")
        );
    }
}
