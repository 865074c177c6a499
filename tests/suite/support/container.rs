//! A Debian container with systemd as its PID 1, booted with `systemd-nspawn`, for the tests that
//! run `deploy/` for real. The root is the one `.ci/setup` caches (never written: the container
//! runs on an overlay of it), the host's network is shared (so the fakes on the host's loopback
//! are reachable), and on every exit path the container is killed by pid and its mounts undone.
//! The flags are the ones `../shared/notes/systemd-in-a-container.md` found to work on hosts
//! without systemd.

use super::wait::Poll;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Where `.ci/setup` leaves the root: a Debian minbase of the host's release with systemd,
/// systemd-sysv, dbus, ca-certificates and procps, marked complete by `.complete`.
pub fn cached_root() -> PathBuf {
    let cache = std::env::var_os("PERCH_CACHE").map_or_else(
        || PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/perch"),
        PathBuf::from,
    );
    cache.join("systemd-root").join(host_release())
}

/// The host's release (`VERSION_CODENAME`), so a binary built here runs in the container.
fn host_release() -> String {
    std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map_or_else(
            || "unknown".to_owned(),
            |name| name.trim_matches('"').to_owned(),
        )
}

/// Why this host cannot boot the container, if it cannot.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("booting a container needs root".to_owned());
    }
    if !on_path("systemd-nspawn") {
        return Some("systemd-nspawn is missing (.ci/setup installs systemd-container)".to_owned());
    }
    let root = cached_root();
    if !root.join(".complete").exists() {
        return Some(format!(
            "no systemd root at {} (.ci/setup builds it)",
            root.display()
        ));
    }
    if !Path::new("/dev/kvm").exists() {
        return Some("there is no /dev/kvm to give the container".to_owned());
    }
    None
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// A host path the container sees, read-only, at `inside`.
pub struct Bind {
    pub host: PathBuf,
    pub inside: String,
}

/// A booted container. Dropping it kills it, then its [`Mounts`] undo themselves.
pub struct Container {
    nspawn: Child,
    leader: i32,
    merged: PathBuf,
    /// Dropped before the scratch directory that holds the overlay's mount point.
    _mounts: Mounts,
    /// The overlay's upper and work directories and its mount point.
    _scratch: tempfile::TempDir,
}

/// What a boot mounted so far, unmounted when dropped: also when the boot fails half way.
#[derive(Default)]
struct Mounts {
    /// The overlay's mount point, once mounted.
    overlay: Option<PathBuf>,
    /// Whether the tmpfs on `/run/systemd/nspawn` is this container's (and so unmounted).
    run: bool,
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if let Some(merged) = &self.overlay {
            unmount(merged);
        }
        if self.run {
            unmount(Path::new(NSPAWN_RUN));
        }
    }
}

const NSPAWN_RUN: &str = "/run/systemd/nspawn";

impl Container {
    /// Boots the cached root with `binds`, and waits until systemd says the system is up.
    pub fn boot(binds: &[Bind]) -> Container {
        let scratch = tempfile::tempdir().unwrap();
        let (upper, work, merged) = (
            scratch.path().join("upper"),
            scratch.path().join("work"),
            scratch.path().join("merged"),
        );
        for dir in [&upper, &work, &merged] {
            std::fs::create_dir(dir).unwrap();
        }
        let mut mounts = Mounts::default();
        run_ok(Command::new("mount").args([
            "-t",
            "overlay",
            "overlay",
            "-o",
            &format!(
                "lowerdir={},upperdir={},workdir={}",
                cached_root().display(),
                upper.display(),
                work.display()
            ),
            merged.to_str().unwrap(),
        ]));
        mounts.overlay = Some(merged.clone());
        // nspawn refuses to boot when /run is not a tmpfs here (see the notes).
        if !is_mount_point(Path::new(NSPAWN_RUN)) {
            std::fs::create_dir_all(NSPAWN_RUN).unwrap();
            run_ok(Command::new("mount").args(["-t", "tmpfs", "tmpfs", NSPAWN_RUN]));
            mounts.run = true;
        }
        let name = format!("perch-journey-{}", std::process::id());
        let mut command = Command::new("systemd-nspawn");
        command
            .arg("-D")
            .arg(&merged)
            .args(["-M", &name, "--register=no", "--keep-unit", "--boot"])
            .args(["--console=pipe", "--quiet"])
            .args(
                binds
                    .iter()
                    .map(|bind| format!("--bind-ro={}:{}", bind.host.display(), bind.inside)),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let nspawn = command.spawn().unwrap();
        let mut container = Container {
            leader: 0,
            nspawn,
            merged,
            _mounts: mounts,
            _scratch: scratch,
        };
        let pid = container.nspawn.id();
        let mut leader = None;
        Poll::within(Duration::from_secs(30)).until("the container's PID 1", || {
            leader = children(pid).into_iter().find(|child| {
                std::fs::read_to_string(format!("/proc/{child}/comm"))
                    .is_ok_and(|comm| comm.trim() == "systemd")
            });
            leader.is_some()
        });
        container.leader = leader.unwrap();
        let mut state = String::new();
        let up = Poll::within(Duration::from_secs(90))
            .every(Duration::from_millis(200))
            .holds(|| {
                let asked = container.sh("systemctl is-system-running");
                state = format!(
                    "{}{}",
                    asked.stdout_text(),
                    String::from_utf8_lossy(&asked.stderr)
                );
                matches!(asked.stdout_text().trim(), "running" | "degraded")
            });
        assert!(
            up,
            "systemd in the container did not come up: {state:?}\n{}",
            container.sh("systemctl --failed --no-pager").stdout_text()
        );
        container
    }

    /// Runs `script` with `sh -c` inside the container, as root.
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.leader.to_string(),
                "-a",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// [`Container::sh`], which must succeed; its stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let output = self.sh(script);
        assert!(
            output.status.success(),
            "in the container: {script}\nexit: {}\nstdout: {}\nstderr: {}",
            output.status,
            output.stdout_text(),
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout_text()
    }

    /// Writes `text` to `path` inside the container, creating its directory.
    pub fn write(&self, path: &str, text: &str) {
        let on_host = self.merged.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(on_host.parent().unwrap()).unwrap();
        std::fs::write(on_host, text).unwrap();
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // SIGTERM halts the container cleanly; one that does not go in time is killed.
        let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = Poll::within(Duration::from_secs(30))
            .holds(|| matches!(self.nspawn.try_wait(), Ok(Some(_))));
        if !exited {
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
    }
}

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .collect()
}

fn unmount(path: &Path) {
    let done = Command::new("umount")
        .arg(path)
        .status()
        .is_ok_and(|status| status.success());
    if !done {
        let _ = Command::new("umount").arg("-l").arg(path).status();
    }
}

fn is_mount_point(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split_whitespace().nth(4) == path.to_str())
}

fn run_ok(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A command's stdout as text.
pub trait StdoutText {
    fn stdout_text(&self) -> String;
}

impl StdoutText for Output {
    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}
