//! `perch doctor`: can this machine run perch's microVMs? Each check says what it found and,
//! when it fails, what to do. Every check is local and quick (no network, no boot), so
//! [`require`] can run the machine-level ones before every effect instead of a boot attempt
//! that would fail ten seconds later.

use crate::agent::{self, AgentDir};
use crate::sandbox::{ImageRef, SandboxError};
use perch_core::config::DEFAULT_IMAGE;
use std::fmt;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The microsandbox runtime version this perch is built against.
pub const MSB_VERSION: &str = "0.7.11";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Not verified, or overridden on the user's word; does not fail `perch doctor`.
    Warn,
    Fail,
}

/// One line of `perch doctor`: what was checked, what was found, and the fix for a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        write!(f, "{status}  {:<9} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n{:16}fix: {fix}", "")?;
        }
        Ok(())
    }
}

/// Where doctor looks, taken from the environment by the caller ([`Places::from_environment`]);
/// tests point it at fake files.
#[derive(Debug, Clone)]
pub struct Places {
    /// `/dev/kvm`.
    pub kvm: PathBuf,
    /// `/proc/cpuinfo`.
    pub cpuinfo: PathBuf,
    /// `/sys/module/kvm_pvm`: present when `/dev/kvm` is software nested virtualization.
    pub pvm_module: PathBuf,
    /// Rust's name for the CPU (`std::env::consts::ARCH`). The vmx/svm flags are only looked
    /// for on `x86_64`: aarch64 KVM hosts have neither.
    pub arch: String,
    /// `PERCH_ASSUME_KVM=1`: a failed virtualization check becomes a warning.
    pub assume_kvm: bool,
    /// `$MSB_PATH`, if set.
    pub msb_path: Option<PathBuf>,
    /// `$MSB_HOME`, or `~/.microsandbox`.
    pub msb_home: PathBuf,
    /// `$PERCH_CACHE`, or `~/.cache/perch`.
    pub cache: PathBuf,
}

impl Places {
    /// The real places, with `$MSB_PATH`, `$MSB_HOME`, `$PERCH_CACHE`, `$PERCH_ASSUME_KVM` and
    /// `$HOME` read from the environment.
    pub fn from_environment() -> Places {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        Places {
            kvm: PathBuf::from("/dev/kvm"),
            cpuinfo: PathBuf::from("/proc/cpuinfo"),
            pvm_module: PathBuf::from("/sys/module/kvm_pvm"),
            arch: std::env::consts::ARCH.to_owned(),
            assume_kvm: std::env::var_os("PERCH_ASSUME_KVM").is_some_and(|value| value == "1"),
            msb_path: std::env::var_os("MSB_PATH").map(PathBuf::from),
            msb_home: std::env::var_os("MSB_HOME")
                .map_or_else(|| home.join(".microsandbox"), PathBuf::from),
            cache: std::env::var_os("PERCH_CACHE")
                .map_or_else(|| home.join(".cache/perch"), PathBuf::from),
        }
    }
}

/// Every check: the machine ([`machine`]), the cache directory, and the image: `perch:default`,
/// or the image the agent in `dir` names.
pub fn run(places: &Places, dir: Option<&Path>) -> Vec<Check> {
    let mut checks = machine(places);
    checks.push(cache(&places.cache));
    checks.push(match dir {
        None => image(&places.cache),
        Some(dir) => agent_image(&places.cache, dir),
    });
    checks
}

/// The checks every effect depends on: KVM, hardware virtualization, the runtime pair.
pub fn machine(places: &Places) -> Vec<Check> {
    vec![kvm(places), virtualization(places), runtime(places)]
}

/// Runs [`machine`] and returns its first failure as [`SandboxError::Unavailable`]. Warnings
/// pass.
pub fn require(places: &Places) -> Result<(), SandboxError> {
    match machine(places)
        .into_iter()
        .find(|check| check.status == Status::Fail)
    {
        None => Ok(()),
        Some(check) => Err(SandboxError::Unavailable {
            what: format!("this machine cannot run perch's microVMs: {}", check.detail),
            fix: check.fix.unwrap_or_else(|| "run `perch doctor`".into()),
        }),
    }
}

fn check(name: &'static str, ok: bool, detail: String, fix: &str) -> Check {
    Check {
        name,
        status: if ok { Status::Ok } else { Status::Fail },
        detail,
        fix: (!ok).then(|| fix.to_owned()),
    }
}

/// `/dev/kvm` exists and opens for reading and writing.
pub fn kvm(places: &Places) -> Check {
    let path = &places.kvm;
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => check(
            "kvm",
            true,
            format!("{} opens for reading and writing", path.display()),
            "",
        ),
        Err(error) => check(
            "kvm",
            false,
            format!("{} cannot be opened: {error}", path.display()),
            "run on a Linux host with KVM, and give this user read-write access to /dev/kvm",
        ),
    }
}

/// `/dev/kvm` is hardware virtualization: not kvm_pvm (software nesting, on which guests crash
/// at boot), and on x86_64 the CPU shows vmx or svm. `PERCH_ASSUME_KVM=1` turns a failure into
/// a warning.
pub fn virtualization(places: &Places) -> Check {
    let fix = "use bare metal or a cloud VM with nested VT-x/AMD-V (or set PERCH_ASSUME_KVM=1 to try anyway)";
    let found = if places.pvm_module.exists() {
        Err(format!(
            "/dev/kvm is kvm_pvm, software nested virtualization ({} exists), on which microVM guests crash at boot",
            places.pvm_module.display()
        ))
    } else if places.arch == "x86_64" {
        let cpuinfo = std::fs::read_to_string(&places.cpuinfo).unwrap_or_default();
        let hardware = cpuinfo
            .lines()
            .filter(|line| line.starts_with("flags"))
            .any(|line| {
                line.split_whitespace()
                    .any(|flag| flag == "vmx" || flag == "svm")
            });
        if hardware {
            Ok("hardware virtualization (vmx/svm) is available".to_owned())
        } else {
            Err(format!(
                "no vmx/svm flag in {}: the CPU offers no hardware virtualization to this machine",
                places.cpuinfo.display()
            ))
        }
    } else {
        Ok(format!(
            "{}: no CPU flag to check; /dev/kvm is taken as hardware virtualization (no kvm_pvm)",
            places.arch
        ))
    };
    match found {
        Ok(detail) => check("cpu", true, detail, ""),
        Err(detail) if places.assume_kvm => Check {
            name: "cpu",
            status: Status::Warn,
            detail: format!("PERCH_ASSUME_KVM=1 overrides this check: {detail}"),
            fix: None,
        },
        Err(detail) => check("cpu", false, detail, fix),
    }
}

/// `msb` reports version [`MSB_VERSION`] and `libkrunfw.so.5.6.1` is in the `lib/` beside its
/// `bin/`.
pub fn runtime(places: &Places) -> Check {
    let msb = places
        .msb_path
        .clone()
        .unwrap_or_else(|| places.msb_home.join("bin/msb"));
    let lib = msb
        .parent()
        .and_then(Path::parent)
        .map(|prefix| prefix.join("lib/libkrunfw.so.5.6.1"));
    let fix = "run .ci/setup, or install msb and libkrunfw.so.5.6.1 from the microsandbox==0.7.11 wheel into ~/.microsandbox/{bin,lib} (or $MSB_HOME)";
    let output = match Command::new(&msb).arg("--version").output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(error) => {
            return check(
                "runtime",
                false,
                format!("{} cannot run: {error}", msb.display()),
                fix,
            );
        }
    };
    if output != format!("msb {MSB_VERSION}") {
        return check(
            "runtime",
            false,
            format!(
                "{} reports {output:?}; perch needs msb {MSB_VERSION}",
                msb.display()
            ),
            fix,
        );
    }
    match lib {
        Some(lib) if lib.exists() => check(
            "runtime",
            true,
            format!("{} {MSB_VERSION} with {}", msb.display(), lib.display()),
            "",
        ),
        _ => check(
            "runtime",
            false,
            format!("libkrunfw.so.5.6.1 is missing next to {}", msb.display()),
            fix,
        ),
    }
}

fn cache(path: &Path) -> Check {
    match std::fs::create_dir_all(path).and_then(|()| tempfile_probe(path)) {
        Ok(()) => check("cache", true, format!("{} is writable", path.display()), ""),
        Err(error) => check(
            "cache",
            false,
            format!("{} is not writable: {error}", path.display()),
            "set PERCH_CACHE to a writable directory",
        ),
    }
}

fn tempfile_probe(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    std::fs::write(&probe, b"probe")?;
    std::fs::remove_file(probe)
}

/// `perch:default` is built: the cache records a build whose root filesystem exists.
pub fn image(cache: &Path) -> Check {
    match crate::image::resolve_default_image(cache) {
        Ok(ImageRef::Local { reference, rootfs }) => check(
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
