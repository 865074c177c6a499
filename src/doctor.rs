//! `perch doctor`: can this machine run perch's microVMs? Each check says what it found and,
//! when it fails, what to do.

use std::fmt;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The microsandbox runtime version this perch is built against.
pub const MSB_VERSION: &str = "0.7.11";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Fail,
}

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
            Status::Fail => "FAIL",
        };
        write!(f, "{status}  {:<9} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n{:16}fix: {fix}", "")?;
        }
        Ok(())
    }
}

/// Where doctor looks, taken from the environment by the caller.
#[derive(Debug, Clone)]
pub struct Places {
    pub kvm: PathBuf,
    pub cpuinfo: PathBuf,
    pub pvm_module: PathBuf,
    /// `$MSB_PATH`, if set.
    pub msb_path: Option<PathBuf>,
    /// `$MSB_HOME`, or `~/.microsandbox`.
    pub msb_home: PathBuf,
    /// `$PERCH_CACHE`, or `~/.cache/perch`.
    pub cache: PathBuf,
}

impl Places {
    pub fn from_environment() -> Places {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        Places {
            kvm: PathBuf::from("/dev/kvm"),
            cpuinfo: PathBuf::from("/proc/cpuinfo"),
            pvm_module: PathBuf::from("/sys/module/kvm_pvm"),
            msb_path: std::env::var_os("MSB_PATH").map(PathBuf::from),
            msb_home: std::env::var_os("MSB_HOME")
                .map_or_else(|| home.join(".microsandbox"), PathBuf::from),
            cache: std::env::var_os("PERCH_CACHE")
                .map_or_else(|| home.join(".cache/perch"), PathBuf::from),
        }
    }
}

pub fn run(places: &Places) -> Vec<Check> {
    vec![
        kvm(places),
        virtualization(places),
        runtime(places),
        cache(&places.cache),
    ]
}

fn check(name: &'static str, ok: bool, detail: String, fix: &str) -> Check {
    Check {
        name,
        status: if ok { Status::Ok } else { Status::Fail },
        detail,
        fix: (!ok).then(|| fix.to_owned()),
    }
}

fn kvm(places: &Places) -> Check {
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

fn virtualization(places: &Places) -> Check {
    let flags = std::fs::read_to_string(&places.cpuinfo).unwrap_or_default();
    let hardware = flags
        .lines()
        .filter(|line| line.starts_with("flags"))
        .any(|line| {
            line.split_whitespace()
                .any(|flag| flag == "vmx" || flag == "svm")
        });
    if hardware {
        return check(
            "cpu",
            true,
            "hardware virtualization (vmx/svm) is available".into(),
            "",
        );
    }
    let detail = if places.pvm_module.exists() {
        "no vmx/svm: /dev/kvm is software nested virtualization (kvm_pvm), on which microVM guests crash at boot"
    } else {
        "no vmx/svm flag: the CPU offers no hardware virtualization to this machine"
    };
    check(
        "cpu",
        false,
        detail.into(),
        "use bare metal or a cloud VM with nested VT-x/AMD-V; until then perch cannot run agents here",
    )
}

fn runtime(places: &Places) -> Check {
    let msb = places
        .msb_path
        .clone()
        .unwrap_or_else(|| places.msb_home.join("bin/msb"));
    let lib = msb
        .parent()
        .and_then(Path::parent)
        .map(|prefix| prefix.join("lib/libkrunfw.so.5.6.1"));
    let fix = "install msb and libkrunfw.so.5.6.1 from the microsandbox==0.7.11 wheel into ~/.microsandbox (or $MSB_HOME)";
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
