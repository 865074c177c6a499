//! The checks every effect runs first: can this machine run perch's microVMs? KVM, hardware
//! virtualization and the microsandbox runtime, each saying what it found and, when it fails,
//! what to do. [`require`] runs them before a machine boots, instead of a boot attempt that
//! would fail ten seconds later; `perch doctor` reports them with its other checks.

use super::SandboxError;
use crate::host::Places;
use std::fmt;
use std::fs::OpenOptions;
use std::path::Path;
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

/// A check that passed, or failed with `fix`.
pub(crate) fn check(name: &'static str, ok: bool, detail: String, fix: &str) -> Check {
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
/// a warning; the fix offers it only where the CPU flags may be wrong, never on kvm_pvm.
pub fn virtualization(places: &Places) -> Check {
    let hardware_fix = "use bare metal or a cloud VM with nested VT-x/AMD-V";
    let mut fix = format!("{hardware_fix} (or set PERCH_ASSUME_KVM=1 to try anyway)");
    let found = if places.pvm_module.exists() {
        fix = format!("{hardware_fix}: microVM guests crash under kvm_pvm");
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
        Err(detail) => check("cpu", false, detail, &fix),
    }
}

/// `msb` reports version [`MSB_VERSION`] and `libkrunfw.so.5.6.1` is in the `lib/` beside its
/// `bin/`. perch's test stand-in (`tests/msb`, which says so in its `--version`) is refused by
/// name. As root, `msb` is not run unless it and every directory above it are root's alone
/// ([`crate::host::trust`]).
pub fn runtime(places: &Places) -> Check {
    let msb = places
        .msb_path
        .clone()
        .unwrap_or_else(|| places.msb_home.join("bin/msb"));
    let lib = msb
        .parent()
        .and_then(Path::parent)
        .map(|prefix| prefix.join("lib/libkrunfw.so.5.6.1"));
    let fix = "install the runtime pair with deploy/install-runtime.sh ~/.microsandbox (from perch's source; it takes msb and libkrunfw.so.5.6.1 from the microsandbox==0.7.11 wheel), or put them in ~/.microsandbox/{bin,lib} (or $MSB_HOME) yourself";
    if let Some(reason) = crate::host::trust::refusal_as_root(&msb) {
        return check(
            "runtime",
            false,
            format!("{} is not run: this is root, and {reason}", msb.display()),
            "as root, perch runs only a runtime no other user can replace: install it root-owned (deploy/install.sh puts it in /usr/local/lib/perch/runtime) and set MSB_PATH and MSB_LIBKRUNFW_PATH to it, or run this as the service user (sudo -u perch perch doctor)",
        );
    }
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
    if output.contains("stand-in") {
        return check(
            "runtime",
            false,
            format!(
                "{} is perch's test stand-in ({output:?}): it runs commands in Linux namespaces, not in microVMs",
                msb.display()
            ),
            "install the real runtime pair over it with deploy/install-runtime.sh (from perch's source; it takes msb 0.7.11 from the microsandbox==0.7.11 wheel), or point MSB_HOME or MSB_PATH at a home that holds the real msb",
        );
    }
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
