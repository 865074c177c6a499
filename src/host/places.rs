//! Where perch finds the machine's virtualization, the microsandbox runtime and home, its cache
//! and the agent's environment file: read from the environment once, by the caller.

use std::path::PathBuf;

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
    /// `$PERCH_ENV_FILE`: the agent's environment file (its tokens and keys), when it is not
    /// the service's `/etc/perch/<name>.env`.
    pub env_file: Option<PathBuf>,
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
            env_file: std::env::var_os("PERCH_ENV_FILE")
                .filter(|path| !path.is_empty())
                .map(PathBuf::from),
        }
    }
}
