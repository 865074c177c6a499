//! The guest: the image's root filesystem assembled as the real guest assembles it, held in Linux
//! namespaces instead of a microVM.
//!
//! One holder process owns a mount, pid, network (loopback only), UTS and IPC namespace. In its
//! private mount namespace it mounts the image's EROFS stack read-only (the fsmeta image named
//! first in the rootfs VMDK descriptor, the layer images after it as its extra devices), the
//! sandbox's `upper.ext4` (loop) holding the overlay's `upper/` and `work/`, the overlay over both,
//! the launch's directory mounts and tmpfs mounts, `/proc` and a minimal `/dev`; then it chroots
//! and waits as pid 1, reaping orphans. Every mount lives only in that namespace, so nothing is
//! left behind when the holder dies, however it dies.
//!
//! The holder runs under `setpriv --pdeathsig KILL` and `unshare --kill-child`: when msb dies
//! (even by SIGKILL), the holder dies, its pid namespace ends, and every guest process with it.
//! Commands enter the namespaces with `nsenter` from a fresh single-threaded child, because a
//! multithreaded process cannot `setns` into a mount namespace.

use microsandbox_runtime::launch::LaunchConfig;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;

/// How long the holder may take to assemble the guest and report ready.
const ASSEMBLE_DEADLINE: Duration = Duration::from_secs(20);

/// The guest's PATH while the holder still runs the host's tools.
const HOST_TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs as pid 1 of the new pid namespace with the host's tools, assembles the guest's root
/// (arguments: see [`Guest::assemble`]), then becomes a chrooted shell that reaps orphans until
/// it is killed.
const HOLDER_SCRIPT: &str = r#"set -eu
stage=$1 host_name=$2 upper_image=$3 lower_kind=$4 lower_source=$5 device_count=$6
shift 6
mkdir -p "$stage/lower" "$stage/disk" "$stage/root"
# The kernel takes an EROFS image's extra devices only as block devices: each gets a read-only
# loop device, detached again right after the mount (a busy loop device detaches when its last
# user, the mount, goes).
devices= loops=
trap 'for loop in $loops; do losetup --detach "$loop" 2>/dev/null; done' EXIT
while [ "$device_count" -gt 0 ]; do
  loop=$(losetup --find --show --read-only "$1")
  devices="$devices,device=$loop" loops="$loops $loop"
  device_count=$((device_count - 1))
  shift
done
case $lower_kind in
  erofs) mount -t erofs -o "ro$devices" "$lower_source" "$stage/lower" ;;
  dir) mount --bind "$lower_source" "$stage/lower"; mount -o remount,bind,ro "$stage/lower" ;;
esac
for loop in $loops; do losetup --detach "$loop"; done
trap - EXIT
if [ -n "$upper_image" ]; then
  mount -t ext4 -o loop "$upper_image" "$stage/disk"
else
  mount -t tmpfs -o mode=755 upper "$stage/disk"
fi
mkdir -p "$stage/disk/upper" "$stage/disk/work"
root=$stage/root
mount -t overlay overlay -o "lowerdir=$stage/lower,upperdir=$stage/disk/upper,workdir=$stage/disk/work" "$root"
while [ $# -ge 4 ]; do
  kind=$1 source=$2 target=$3 mode=$4
  shift 4
  if [ -L "$root$target" ]; then
    echo "the mount point $target is a symlink in the image" >&2
    exit 1
  fi
  mkdir -p "$root$target"
  case $kind in
    bind)
      mount --bind "$source" "$root$target"
      if [ "$mode" = ro ]; then mount -o remount,bind,ro "$root$target"; fi ;;
    tmpfs) mount -t tmpfs -o "$source" tmpfs "$root$target" ;;
  esac
done
mkdir -p "$root/proc" "$root/dev" "$root/tmp"
mount -t proc proc "$root/proc"
mkdir -p "$root/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys" 2>/dev/null || true
mount -t tmpfs -o mode=755,size=64k dev "$root/dev"
for node in null zero full random urandom tty; do
  touch "$root/dev/$node"
  mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir -p "$root/dev/shm"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
ip link set lo up 2>/dev/null || true
hostname "$host_name"
exec chroot "$root" /bin/sh -c 'echo ready; exec </dev/null >/dev/null 2>&1; while :; do sleep 3600 & wait $!; done'
"#;

/// Closes the descriptors msb inherited from the crate (the config file, the parent-watch pipe,
/// the startup pipe, the lifecycle lock, disk locks; their numbers are `$1`, space-separated)
/// before exec'ing the rest of the arguments, so no guest-side process holds them: the crate reads
/// "lock held" as "runtime alive". (std offers no safe way to mark an inherited raw descriptor
/// close-on-exec, and `unsafe` is denied here.)
const CLOSE_INHERITED: &str = r#"for fd in $1; do eval "exec $fd<&-"; done; shift; exec "$@""#;

/// One request to run a process in the guest.
#[derive(Debug, Clone)]
pub struct GuestCommand {
    /// The program: a guest path, or a name looked up along the guest's PATH.
    pub program: String,
    /// Its arguments, without the program itself.
    pub args: Vec<String>,
    /// Exactly the environment the process gets ("K=V" already split).
    pub env: Vec<(String, String)>,
    /// Guest path; None = "/".
    pub cwd: Option<String>,
    /// Guest user name or uid (optionally `user:group`); None = root.
    pub user: Option<String>,
}

/// Why the guest could not be assembled.
#[derive(Debug)]
pub struct AssembleError {
    /// What failed, readable; becomes `boot-error.json`'s message.
    pub message: String,
    /// The OS error behind it, when there is one.
    pub errno: Option<i32>,
}

impl AssembleError {
    fn new(message: impl Into<String>) -> AssembleError {
        AssembleError {
            message: message.into(),
            errno: None,
        }
    }

    fn io(what: &str, error: &std::io::Error) -> AssembleError {
        AssembleError {
            message: format!("{what}: {error}"),
            errno: error.raw_os_error(),
        }
    }
}

/// What the guest is made of, read from the launch config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPlan {
    /// The read-only lower layer.
    pub lower: Lower,
    /// The writable upper disk (an ext4 image holding `upper/` and `work/`); None = tmpfs.
    pub upper: Option<PathBuf>,
    /// Directory and tmpfs mounts, in launch order.
    pub mounts: Vec<GuestMount>,
    /// The guest's hostname.
    pub hostname: String,
    /// Environment every exec starts from: bootstrap default env, then secret placeholders.
    pub baseline_env: Vec<(String, String)>,
    /// Host directory for the holder's mount points (inside its private mount namespace).
    pub stage: PathBuf,
}

/// The read-only lower layer of the guest's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lower {
    /// An EROFS image and the images its device table names, in device order.
    Erofs {
        /// The primary image (the fsmeta image the VMDK descriptor lists first).
        primary: PathBuf,
        /// The extra devices (the layer images), in order.
        devices: Vec<PathBuf>,
    },
    /// A host directory used as the root (`rootfs.path`, a bind rootfs).
    Directory(PathBuf),
}

/// One mount inside the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestMount {
    /// A host directory bound at `guest`.
    Bind {
        /// The host directory.
        host: PathBuf,
        /// The guest path.
        guest: String,
        /// Mounted read-only.
        readonly: bool,
    },
    /// A tmpfs at `guest`.
    Tmpfs {
        /// The guest path.
        guest: String,
        /// Its size limit.
        size_mib: Option<u32>,
    },
}

impl GuestPlan {
    /// Reads the plan from `config`: the rootfs (VMDK descriptor + upper, or a directory), the
    /// `mounts` (`tag:host_path[:opts]`) matched by tag to the bootstrap's directory mounts,
    /// the bootstrap's tmpfs mounts, hostname and default env, and the secrets' placeholders.
    pub fn from_launch(config: &LaunchConfig) -> Result<GuestPlan, AssembleError> {
        let rootfs = &config.rootfs;
        let lower = match (&rootfs.path, &rootfs.disk, rootfs.disk_format.as_deref()) {
            (Some(path), _, _) => Lower::Directory(path.clone()),
            (None, Some(disk), Some("vmdk")) => {
                let descriptor = std::fs::read_to_string(disk).map_err(|error| {
                    AssembleError::io(
                        &format!("mount rootfs: cannot read {}", disk.display()),
                        &error,
                    )
                })?;
                let mut extents = vmdk_extents(&descriptor).into_iter();
                let primary = extents.next().ok_or_else(|| {
                    AssembleError::new(format!(
                        "mount rootfs: the descriptor {} lists no extent",
                        disk.display()
                    ))
                })?;
                Lower::Erofs {
                    primary,
                    devices: extents.collect(),
                }
            }
            (None, Some(disk), format) => {
                return Err(AssembleError::new(format!(
                    "mount rootfs: the stand-in cannot boot a {} root disk ({})",
                    format.unwrap_or("raw"),
                    disk.display()
                )));
            }
            (None, None, _) => return Err(AssembleError::new("mount rootfs: no root filesystem")),
        };
        if !rootfs.upper_layers.is_empty()
            || rootfs.upper_format.as_deref().is_some_and(|f| f != "raw")
        {
            return Err(AssembleError::new(
                "mount rootfs: the stand-in supports only a raw upper.ext4 upper disk",
            ));
        }
        let bootstrap = &config.bootstrap;
        if !config.file_mounts.is_empty() || !config.disks.is_empty() {
            return Err(AssembleError::new(
                "mount volumes: the stand-in supports directory and tmpfs mounts only, not \
                 single-file mounts or disk volumes",
            ));
        }
        let mut mounts = Vec::new();
        for spec in &config.mounts {
            let (tag, host, options) = parse_mount_spec(spec);
            let Some(dir_mount) = bootstrap.dir_mounts.iter().find(|mount| mount.tag == tag) else {
                return Err(AssembleError::new(format!(
                    "mount {spec}: no bootstrap directory mount has the tag {tag}"
                )));
            };
            mounts.push(GuestMount::Bind {
                host: PathBuf::from(host),
                guest: dir_mount.guest_path.clone(),
                readonly: dir_mount.flags.readonly || options.iter().any(|option| option == "ro"),
            });
        }
        for tmpfs in &bootstrap.tmpfs_mounts {
            mounts.push(GuestMount::Tmpfs {
                guest: tmpfs.path.clone(),
                size_mib: tmpfs.size_mib,
            });
        }
        let mut baseline_env: Vec<(String, String)> = bootstrap
            .default_env
            .iter()
            .map(|var| (var.key.clone(), var.value.clone()))
            .collect();
        if let Some(network) = &config.network {
            for secret in &network.config().secrets.secrets {
                baseline_env.push((secret.env_var.clone(), secret.placeholder.clone()));
            }
        }
        Ok(GuestPlan {
            lower,
            upper: rootfs.upper.clone(),
            mounts,
            hostname: bootstrap
                .hostname
                .clone()
                .unwrap_or_else(|| "microsandbox".into()),
            baseline_env,
            stage: config.runtime_dir.join("standin"),
        })
    }

    /// The holder script's arguments: stage, hostname, upper, lower kind and source, the number
    /// of extra devices and each of them, then four per mount (kind, source, guest path, mode).
    fn holder_args(&self) -> Vec<String> {
        let display = |path: &Path| path.to_string_lossy().into_owned();
        let (kind, source, devices) = match &self.lower {
            Lower::Erofs { primary, devices } => ("erofs", display(primary), devices.as_slice()),
            Lower::Directory(path) => ("dir", display(path), [].as_slice()),
        };
        let mut args = vec![
            display(&self.stage),
            self.hostname.clone(),
            self.upper.as_deref().map(display).unwrap_or_default(),
            kind.into(),
            source,
            devices.len().to_string(),
        ];
        args.extend(devices.iter().map(|device| display(device)));
        for mount in &self.mounts {
            match mount {
                GuestMount::Bind {
                    host,
                    guest,
                    readonly,
                } => args.extend([
                    "bind".into(),
                    display(host),
                    guest.clone(),
                    if *readonly { "ro" } else { "rw" }.into(),
                ]),
                GuestMount::Tmpfs { guest, size_mib } => args.extend([
                    "tmpfs".into(),
                    match size_mib {
                        Some(mib) => format!("mode=1777,size={mib}m"),
                        None => "mode=1777".into(),
                    },
                    guest.clone(),
                    "rw".into(),
                ]),
            }
        }
        args
    }
}

/// The extent files a VMDK descriptor lists, in order, each once (an extent larger than the
/// descriptor's chunk limit appears on several consecutive lines).
pub fn vmdk_extents(descriptor: &str) -> Vec<PathBuf> {
    let mut extents: Vec<PathBuf> = Vec::new();
    for line in descriptor.lines() {
        let line = line.trim();
        if !(line.starts_with("RW ") || line.starts_with("RDONLY ")) {
            continue;
        }
        let Some((_, rest)) = line.split_once('"') else {
            continue;
        };
        let Some((path, _)) = rest.rsplit_once('"') else {
            continue;
        };
        let path = PathBuf::from(path);
        if extents.last() != Some(&path) {
            extents.push(path);
        }
    }
    extents
}

/// Splits `tag:host_path[:opts]` into its parts. The host path may itself hold colons; a last
/// segment is options only when every comma-separated token is a known flag or `key=value`.
pub fn parse_mount_spec(spec: &str) -> (&str, &str, Vec<String>) {
    let (tag, rest) = spec.split_once(':').unwrap_or((spec, ""));
    if let Some((host, options)) = rest.rsplit_once(':') {
        let is_option = |token: &str| {
            matches!(token, "ro" | "rw" | "noexec" | "nosuid" | "nodev") || token.contains('=')
        };
        if !options.is_empty() && options.split(',').all(is_option) {
            return (tag, host, options.split(',').map(String::from).collect());
        }
    }
    (tag, rest, Vec::new())
}

/// The assembled guest: its holder process and what every exec starts from.
#[derive(Debug)]
pub struct Guest {
    holder: std::sync::Mutex<Option<Child>>,
    /// pid 1 of the holder's namespaces, as the host sees it.
    init: u32,
    baseline_env: Vec<(String, String)>,
    /// Descriptors inherited from the crate, closed in every child (see [`CLOSE_INHERITED`]).
    inherited_fds: String,
    tools: HostTools,
    upper: Option<PathBuf>,
}

/// Absolute paths of the host tools the guest is driven with.
#[derive(Debug, Clone)]
struct HostTools {
    bash: PathBuf,
    setpriv: PathBuf,
    nsenter: PathBuf,
}

impl HostTools {
    fn find() -> Result<HostTools, AssembleError> {
        let find = |name: &str| {
            HOST_TOOL_PATH
                .split(':')
                .map(|dir| Path::new(dir).join(name))
                .find(|path| path.is_file())
                .ok_or_else(|| AssembleError::new(format!("the host tool {name} is missing")))
        };
        Ok(HostTools {
            bash: find("bash")?,
            setpriv: find("setpriv")?,
            nsenter: find("nsenter")?,
        })
    }

    /// A command that closes `inherited_fds` and then runs `program` with `args`. bash runs as
    /// `sh` (POSIX mode) because it sees the guest command's environment: in that mode it reads
    /// no `BASH_ENV`, and `exec`/`eval` are special builtins no imported function can shadow.
    fn command(&self, inherited_fds: &str, program: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.bash);
        command
            .arg0("sh")
            .args(["-c", CLOSE_INHERITED, "msb-standin"])
            .arg(inherited_fds)
            .arg(program);
        command
    }
}

impl Guest {
    /// Starts the holder and waits until it reports the guest assembled. `inherited_fds` are the
    /// descriptors msb inherited (closed in every child). Call from an async task on a runtime
    /// worker or the main thread, never from a short-lived blocking thread: the holder's
    /// parent-death signal follows the spawning thread.
    pub async fn assemble(plan: &GuestPlan, inherited_fds: &[i32]) -> Result<Guest, AssembleError> {
        let tools = HostTools::find()?;
        if let Some(upper) = &plan.upper {
            // A previous run killed outright may still be releasing the same disk.
            wait_until_released(upper).await;
        }
        std::fs::create_dir_all(&plan.stage).map_err(|error| {
            AssembleError::io(
                &format!("mount rootfs: cannot create {}", plan.stage.display()),
                &error,
            )
        })?;
        let inherited_fds = inherited_fds
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = tools
            .command(&inherited_fds, &tools.setpriv)
            .args(["--pdeathsig", "KILL", "--", "unshare"])
            .args([
                "--mount",
                "--pid",
                "--net",
                "--uts",
                "--ipc",
                "--fork",
                "--kill-child=SIGKILL",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                HOLDER_SCRIPT,
                "msb-standin-holder",
            ])
            .args(plan.holder_args())
            .env_clear()
            .env("PATH", HOST_TOOL_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| AssembleError::io("build vm: cannot start the holder", &error))?;
        let stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let ready = async {
            let mut line = String::new();
            if let Some(stdout) = stdout {
                let _ = BufReader::new(stdout).read_line(&mut line).await;
            }
            line
        };
        let line = tokio::time::timeout(ASSEMBLE_DEADLINE, ready)
            .await
            .unwrap_or_default();
        if line.trim() != "ready" {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let mut message = String::new();
            if let Some(stderr) = stderr.as_mut() {
                let _ = stderr.read_to_string(&mut message).await;
            }
            return Err(AssembleError::new(format!(
                "mount rootfs: the guest could not be assembled: {}",
                message.trim()
            )));
        }
        let init = child
            .id()
            .and_then(first_child)
            .ok_or_else(|| AssembleError::new("build vm: the holder has no init process"))?;
        Ok(Guest {
            holder: std::sync::Mutex::new(Some(child)),
            init,
            baseline_env: plan.baseline_env.clone(),
            inherited_fds,
            tools,
            upper: plan.upper.clone(),
        })
    }

    /// Spawns `command` inside the guest with piped stdin/stdout/stderr, as the leader of a new
    /// process group (so `killpg(child.id())` reaches the whole command), kill_on_drop.
    /// An error only when the host could not start the helper at all.
    pub fn spawn(&self, command: &GuestCommand) -> std::io::Result<Child> {
        let mut process = self.tools.command(&self.inherited_fds, &self.tools.setpriv);
        process
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&self.tools.nsenter)
            .arg("--target")
            .arg(self.init.to_string())
            .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--root"])
            // nsenter opens the directory before it enters the namespaces, so it is named
            // through the holder's root as the host sees it.
            .arg(format!(
                "--wd={}",
                self.root()
                    .join(
                        command
                            .cwd
                            .as_deref()
                            .unwrap_or("/")
                            .trim_start_matches('/')
                    )
                    .display()
            ));
        if let Some(user) = &command.user {
            let (uid, gid) = self.resolve_user(user)?;
            process
                .arg(format!("--setuid={uid}"))
                .arg(format!("--setgid={gid}"));
        }
        process
            .arg("--")
            .arg(&command.program)
            .args(&command.args)
            .env_clear()
            .envs(command.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        process.spawn()
    }

    /// The guest's root directory as the host sees it.
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.init))
    }

    /// The baseline environment every exec gets before the request's own env: the bootstrap's
    /// default env, then each secret's `ENV=placeholder`. The request's env overrides.
    pub fn baseline_env(&self) -> &[(String, String)] {
        &self.baseline_env
    }

    /// Whether the holder (and so the guest) has ended on its own.
    pub fn has_ended(&self) -> bool {
        let Ok(mut holder) = self.holder.lock() else {
            return true;
        };
        match holder.as_mut() {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Ends the guest: kills the holder (its pid namespace, every guest process and every mount
    /// in its mount namespace end with it) and waits for it.
    pub async fn stop(&self) {
        let holder = self.holder.lock().ok().and_then(|mut holder| holder.take());
        if let Some(mut child) = holder {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        // The holder's unshare kills pid 1 as it dies; wait until the namespace is gone so
        // its mounts (and the upper disk's loop device) are released before the catalog says
        // Stopped and the next start mounts the same disk.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while is_alive(self.init) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(upper) = &self.upper {
            wait_until_released(upper).await;
        }
    }

    /// Resolves a guest user (`name`, `uid`, `name:group` or `uid:gid`) against the guest's
    /// `/etc/passwd` and `/etc/group`.
    fn resolve_user(&self, user: &str) -> std::io::Result<(u32, u32)> {
        let not_found = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{what} not found in the guest"),
            )
        };
        let (user, group) = match user.split_once(':') {
            Some((user, group)) => (user, Some(group)),
            None => (user, None),
        };
        let passwd = std::fs::read_to_string(self.root().join("etc/passwd")).unwrap_or_default();
        let entry = passwd
            .lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|fields| fields.len() > 3 && (fields[0] == user || fields[2] == user));
        let uid = match (user.parse::<u32>(), &entry) {
            (Ok(uid), _) => uid,
            (Err(_), Some(fields)) => fields[2].parse().map_err(|_| not_found(user))?,
            (Err(_), None) => return Err(not_found(&format!("user {user}"))),
        };
        let gid = match group {
            Some(group) => match group.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => {
                    let groups =
                        std::fs::read_to_string(self.root().join("etc/group")).unwrap_or_default();
                    groups
                        .lines()
                        .map(|line| line.split(':').collect::<Vec<_>>())
                        .find(|fields| fields.len() > 2 && fields[0] == group)
                        .and_then(|fields| fields[2].parse().ok())
                        .ok_or_else(|| not_found(&format!("group {group}")))?
                }
            },
            None => entry
                .and_then(|fields| fields[3].parse().ok())
                .unwrap_or(uid),
        };
        Ok((uid, gid))
    }
}

/// Waits (up to a few seconds) until no loop device is backed by `disk`: the kernel releases a
/// dead mount namespace's mounts, and with them their auto-clearing loop devices, a moment after
/// its last process is gone, and the same ext4 image must never be mounted twice at once.
async fn wait_until_released(disk: &Path) {
    let Ok(disk) = std::fs::canonicalize(disk) else {
        return;
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while loop_backs(&disk) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether any loop device is backed by `disk`.
fn loop_backs(disk: &Path) -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    devices.flatten().any(|device| {
        std::fs::read_to_string(device.path().join("loop/backing_file"))
            .is_ok_and(|backing| Path::new(backing.trim()) == disk)
    })
}

/// Whether `pid` is a live process: a zombie (the orphaned init waiting for the host's init to
/// reap it) has already released its namespaces.
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// The first child of `pid` (the holder's pid 1 is unshare's only child).
fn first_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vmdk_descriptor_names_each_extent_once_in_order() {
        let descriptor = "# Disk DescriptorFile\nversion=1\ncreateType=\"twoGbMaxExtentFlat\"\n\n\
            # Extent description\nRW 16 FLAT \"/c/fsmeta/m.erofs\" 0\n\
            RW 4194304 FLAT \"/c/layers/a b.erofs\" 0\nRW 8 FLAT \"/c/layers/a b.erofs\" 4194304\n\
            RW 8 FLAT \"/c/layers/c.erofs\" 0\n\n#DDB\nddb.adapterType = \"ide\"\n";
        assert_eq!(
            vmdk_extents(descriptor),
            [
                PathBuf::from("/c/fsmeta/m.erofs"),
                PathBuf::from("/c/layers/a b.erofs"),
                PathBuf::from("/c/layers/c.erofs"),
            ]
        );
    }

    #[test]
    fn the_plan_follows_the_launch_config() {
        use microsandbox_protocol::bootstrap::{
            BootstrapDirMount, BootstrapEnvVar, BootstrapMountFlags, BootstrapTmpfsMount,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let vmdk = dir.path().join("image.vmdk");
        std::fs::write(
            &vmdk,
            "RW 8 FLAT \"/cache/fsmeta/m.erofs\" 0\nRW 8 FLAT \"/cache/layers/l.erofs\" 0\n",
        )
        .expect("descriptor");
        let mut config = LaunchConfig::default();
        config.runtime_dir = dir.path().join("runtime");
        config.rootfs.disk = Some(vmdk);
        config.rootfs.disk_format = Some("vmdk".into());
        config.rootfs.upper = Some(dir.path().join("upper.ext4"));
        config.mounts = vec![
            "ws_tag:/srv/agent/workspace:quota=10240".into(),
            "ref_tag:/srv/ref:ro".into(),
        ];
        config.bootstrap.dir_mounts = vec![
            BootstrapDirMount {
                tag: "ws_tag".into(),
                guest_path: "/workspace".into(),
                flags: BootstrapMountFlags::default(),
            },
            BootstrapDirMount {
                tag: "ref_tag".into(),
                guest_path: "/ref".into(),
                flags: BootstrapMountFlags::default(),
            },
        ];
        config.bootstrap.tmpfs_mounts = vec![BootstrapTmpfsMount {
            path: "/scratch".into(),
            size_mib: Some(16),
            mode: None,
            flags: BootstrapMountFlags::default(),
        }];
        config.bootstrap.hostname = Some("agent-host".into());
        config.bootstrap.default_env = vec![BootstrapEnvVar {
            key: "LANG".into(),
            value: "C.UTF-8".into(),
        }];
        let plan = GuestPlan::from_launch(&config).expect("a plan");
        assert_eq!(
            plan,
            GuestPlan {
                lower: Lower::Erofs {
                    primary: "/cache/fsmeta/m.erofs".into(),
                    devices: vec!["/cache/layers/l.erofs".into()],
                },
                upper: Some(dir.path().join("upper.ext4")),
                mounts: vec![
                    GuestMount::Bind {
                        host: "/srv/agent/workspace".into(),
                        guest: "/workspace".into(),
                        readonly: false,
                    },
                    GuestMount::Bind {
                        host: "/srv/ref".into(),
                        guest: "/ref".into(),
                        readonly: true,
                    },
                    GuestMount::Tmpfs {
                        guest: "/scratch".into(),
                        size_mib: Some(16),
                    },
                ],
                hostname: "agent-host".into(),
                baseline_env: vec![("LANG".into(), "C.UTF-8".into())],
                stage: dir.path().join("runtime/standin"),
            }
        );

        config.mounts.push("stray:/srv/stray".into());
        let stray = GuestPlan::from_launch(&config).expect_err("an unknown tag");
        assert!(stray.message.contains("stray"), "{}", stray.message);
        config.mounts.pop();
        config.rootfs.disk_format = Some("qcow2".into());
        let qcow = GuestPlan::from_launch(&config).expect_err("a qcow2 root");
        assert!(qcow.message.contains("qcow2"), "{}", qcow.message);
    }

    #[test]
    fn a_mount_spec_splits_into_tag_host_and_options() {
        assert_eq!(
            parse_mount_spec("workspace:/srv/a:b:quota=1024"),
            ("workspace", "/srv/a:b", vec!["quota=1024".to_string()])
        );
        assert_eq!(
            parse_mount_spec("data:/srv/data:ro,nosuid"),
            (
                "data",
                "/srv/data",
                vec!["ro".to_string(), "nosuid".to_string()]
            )
        );
        assert_eq!(
            parse_mount_spec("data:/srv/with:colon"),
            ("data", "/srv/with:colon", vec![])
        );
    }

    /// A fresh scratch directory under the system temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("msb-standin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    async fn output_of(guest: &Guest, script: &str) -> String {
        output_as(guest, None, script).await
    }

    async fn output_as(guest: &Guest, user: Option<&str>, script: &str) -> String {
        let child = guest
            .spawn(&GuestCommand {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
                env: vec![("PATH".into(), HOST_TOOL_PATH.into())],
                cwd: Some("/workspace".into()),
                user: user.map(String::from),
            })
            .expect("spawns");
        let output = child.wait_with_output().await.expect("waits");
        assert!(output.status.success(), "{script}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Needs root (mount namespaces, overlayfs); uses the host's root as a read-only lower.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guest_runs_commands_in_its_own_namespaces_over_a_read_only_root() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let scratch = scratch("guest");
        let workspace = scratch.join("workspace");
        std::fs::create_dir_all(&workspace).expect("workspace");
        let plan = GuestPlan {
            lower: Lower::Directory(PathBuf::from("/")),
            upper: None,
            mounts: vec![GuestMount::Bind {
                host: workspace.clone(),
                guest: "/workspace".into(),
                readonly: false,
            }],
            hostname: "standin-test".into(),
            baseline_env: Vec::new(),
            stage: scratch.join("stage"),
        };
        let guest = Guest::assemble(&plan, &[]).await.expect("assembles");
        assert_eq!(output_of(&guest, "hostname").await, "standin-test");
        assert_eq!(output_of(&guest, "pwd").await, "/workspace");
        output_of(
            &guest,
            "echo kept > /workspace/file; echo private > /etc/standin-probe",
        )
        .await;
        assert_eq!(
            std::fs::read_to_string(workspace.join("file")).expect("the workspace is shared"),
            "kept\n"
        );
        assert!(
            !Path::new("/etc/standin-probe").exists(),
            "the root is read-only below the overlay"
        );
        let processes = output_of(&guest, "ls /proc | grep -c '^[0-9]'").await;
        assert!(
            processes.parse::<u32>().expect("a count") < 10,
            "{processes} processes visible"
        );
        let links = output_of(
            &guest,
            "ls /sys/class/net 2>/dev/null || ip -o link | cut -d: -f2",
        )
        .await;
        assert_eq!(links.split_whitespace().collect::<Vec<_>>(), ["lo"]);
        assert_eq!(output_as(&guest, Some("nobody"), "id -u").await, "65534");
        assert_eq!(output_as(&guest, Some("1234:5678"), "id -u; id -g").await, "1234\n5678");
        let init = guest.init;
        guest.stop().await;
        assert!(!is_alive(init), "the guest's init is gone after stop");
        let _ = std::fs::remove_dir_all(&scratch);
    }

    /// Runs only when `MSB_STANDIN_VMDK` names an image's VMDK descriptor (e.g. one `perch image
    /// load` wrote under `$MSB_HOME/cache/vmdk`): the real EROFS stack under an ext4 upper.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_image_boots_from_its_vmdk_descriptor_and_keeps_writes_on_its_upper_disk() {
        let Some(vmdk) = std::env::var_os("MSB_STANDIN_VMDK") else {
            return;
        };
        let scratch = scratch("image");
        let upper = scratch.join("upper.ext4");
        std::fs::File::create(&upper)
            .and_then(|file| file.set_len(64 << 20))
            .expect("upper image");
        let formatted = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&upper)
            .status()
            .expect("mkfs.ext4");
        assert!(formatted.success());
        let descriptor = std::fs::read_to_string(&vmdk).expect("descriptor");
        let mut extents = vmdk_extents(&descriptor).into_iter();
        let plan = GuestPlan {
            lower: Lower::Erofs {
                primary: extents.next().expect("fsmeta"),
                devices: extents.collect(),
            },
            upper: Some(upper.clone()),
            mounts: vec![GuestMount::Bind {
                host: scratch.clone(),
                guest: "/workspace".into(),
                readonly: false,
            }],
            hostname: "image-test".into(),
            baseline_env: Vec::new(),
            stage: scratch.join("stage"),
        };
        let guest = Guest::assemble(&plan, &[]).await.expect("assembles");
        output_of(&guest, "test -x /bin/sh && echo kept > /root/probe").await;
        guest.stop().await;
        let guest = Guest::assemble(&plan, &[]).await.expect("assembles again");
        assert_eq!(output_of(&guest, "cat /root/probe").await, "kept");
        guest.stop().await;
        assert!(!loop_backs(&std::fs::canonicalize(&upper).expect("upper")));
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
