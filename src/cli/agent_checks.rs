//! The checks of an agent that `perch run` would refuse on, for `perch info` and `perch doctor`:
//! its configuration, every environment variable it reads at start, and its `HEARTBEAT.yml`.

use crate::agent::{self, AgentDir, LoadedAgent};
use crate::sandbox::preflight::{Check, Status};
use perch_core::config::environment::{self, EnvFile, Finding};
use std::path::{Path, PathBuf};

/// Every check of the agent in `dir`, all at once: its configuration (when it does not load,
/// nothing else can be checked), then its variables and its heartbeat file. `env_file` is
/// PERCH_ENV_FILE; without it, the service's `/etc/perch/<name>.env` is read when it exists.
pub fn agent_checks(dir: &AgentDir, env_file: Option<&Path>) -> Vec<Check> {
    match agent::load(dir) {
        Err(problems) => vec![Check {
            name: "config",
            status: Status::Fail,
            detail: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n                "),
            fix: Some("fix each problem above; `perch info` shows them too".to_owned()),
        }],
        Ok(loaded) => loaded_checks(&loaded, env_file),
    }
}

/// [`agent_checks`] of an agent that loaded.
pub fn loaded_checks(loaded: &LoadedAgent, env_file: Option<&Path>) -> Vec<Check> {
    let mut checks = variables(loaded, env_file, |name| std::env::var_os(name).is_some());
    checks.push(heartbeats(loaded));
    checks
}

/// One check per variable `perch run` reads at start that is missing (a failure) or cannot be
/// checked (a warning), or one passing check naming them all.
pub fn variables(
    loaded: &LoadedAgent,
    env_file: Option<&Path>,
    in_process: impl Fn(&str) -> bool,
) -> Vec<Check> {
    let channels: Vec<(&str, &perch_core::config::ChannelConfig)> = loaded
        .channels
        .iter()
        .map(|channel| (channel.file.as_str(), &channel.config))
        .collect();
    let needed = environment::needed(&loaded.definition, &channels);
    let file = read_env_file(loaded.dir.root(), env_file);
    let mut checks = Vec::new();
    for variable in &needed {
        match environment::find(variable, in_process(&variable.name), &file) {
            Finding::Found => {}
            Finding::Missing { fix } => checks.push(Check {
                name: "env",
                status: Status::Fail,
                detail: format!("{} ({}) is not set", variable.name, variable.place),
                fix: Some(fix),
            }),
            Finding::CannotCheck { reason } => checks.push(Check {
                name: "env",
                status: Status::Warn,
                detail: format!(
                    "cannot check {} ({}): not in this environment, and {reason}",
                    variable.name, variable.place
                ),
                fix: Some(
                    "run the check as the service's user, or point PERCH_ENV_FILE at a copy it \
                     can read"
                        .to_owned(),
                ),
            }),
        }
    }
    if checks.is_empty() {
        let detail = if needed.is_empty() {
            "perch run reads no variables".to_owned()
        } else {
            let names: Vec<&str> = needed.iter().map(|need| need.name.as_str()).collect();
            format!("set: {}", names.join(", "))
        };
        checks.push(Check {
            name: "env",
            status: Status::Ok,
            detail,
            fix: None,
        });
    }
    checks
}

fn read_env_file(root: &Path, named: Option<&Path>) -> EnvFile {
    let Some(path) = named.map(Path::to_owned).or_else(|| service_env_file(root)) else {
        return EnvFile::Absent;
    };
    match read_bounded(&path) {
        Ok(bytes) => EnvFile::Read {
            path: path.display().to_string(),
            set: environment::names_set(&String::from_utf8_lossy(&bytes)),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && named.is_none() => {
            EnvFile::Absent
        }
        Err(error) => EnvFile::Unreadable {
            path: path.display().to_string(),
            reason: error.to_string(),
        },
    }
}

/// The most of an environment file read: far more than any agent's tokens.
const ENV_FILE_LIMIT: u64 = 1024 * 1024;

/// A regular file's first [`ENV_FILE_LIMIT`] bytes; anything else (a FIFO, a directory) is an
/// error, never a wait.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(ENV_FILE_LIMIT).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `/etc/perch/<name>.env`, the environment file `perch@<name>.service` reads (see
/// `deploy/`), for the agent whose directory is `root`.
pub fn service_env_file(root: &Path) -> Option<PathBuf> {
    let name = root.file_name()?.to_str()?;
    Some(Path::new("/etc/perch").join(format!("{name}.env")))
}

/// `workspace/HEARTBEAT.yml` checks, as the scheduler would read it at start.
pub fn heartbeats(loaded: &LoadedAgent) -> Check {
    let env = crate::heartbeat::heartbeat_env(loaded, crate::heartbeat::host_tz());
    match crate::heartbeat::read_file(&loaded.dir, &env) {
        Ok(file) => Check {
            name: "heartbeat",
            status: Status::Ok,
            detail: format!("HEARTBEAT.yml: {} task(s)", file.tasks.len()),
            fix: None,
        },
        Err(problems) => Check {
            name: "heartbeat",
            status: Status::Fail,
            detail: problems.replace('\n', "\n                "),
            fix: None,
        },
    }
}
