//! The environment variables `perch run` reads at start, and whether each can be found: in the
//! process's environment, in the agent's environment file, or neither. `perch info` and
//! `perch doctor` report from this what `perch run` would refuse on, before it does.

use super::{ChannelConfig, Definition};
use std::collections::BTreeSet;

/// A variable `perch run` reads at start, and the place that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needed {
    pub name: String,
    /// Where the variable is named, as a person finds it: `models.yml: providers.openai.apiKey`.
    pub place: String,
}

/// Every variable `perch run` resolves before it answers: the key of the agent's own model's
/// provider, each channel's credentials, and each sandbox secret's source. Channels are given
/// as (file, config).
pub fn needed(definition: &Definition, channels: &[(&str, &ChannelConfig)]) -> Vec<Needed> {
    let mut needed = Vec::new();
    let model = &definition.agent.model;
    if let Some((provider, _)) = definition.models.model(model)
        && let Some(key) = &provider.api_key
    {
        needed.push(Needed {
            name: key.name().to_string(),
            place: format!("models.yml: providers.{}.apiKey", model.provider),
        });
    }
    for (file, config) in channels {
        for (key, reference) in config.platform.credentials() {
            needed.push(Needed {
                name: reference.name().to_string(),
                place: format!("{file}: {key}"),
            });
        }
    }
    for (index, grant) in definition.sandbox.secrets.iter().enumerate() {
        needed.push(Needed {
            name: grant.source.name().to_string(),
            place: format!("sandbox.lua: secrets[{}].source", index + 1),
        });
    }
    needed
}

/// What is known of the agent's environment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvFile {
    /// None is configured, or the service's default file does not exist.
    Absent,
    /// Read: the names it sets to a value.
    Read { path: String, set: BTreeSet<String> },
    /// It exists (or was named) but cannot be read by this user.
    Unreadable { path: String, reason: String },
}

/// Where a needed variable stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Set in the process's environment or in the environment file.
    Found,
    /// Set nowhere perch can see: `perch run` would refuse to start.
    Missing { fix: String },
    /// Not in the process's environment, and the file that may hold it cannot be read.
    CannotCheck { reason: String },
}

/// Where `needed` stands, given whether the process's environment sets it and what is known of
/// the environment file.
pub fn find(needed: &Needed, in_process: bool, file: &EnvFile) -> Finding {
    if in_process {
        return Finding::Found;
    }
    match file {
        EnvFile::Read { set, .. } if set.contains(&needed.name) => Finding::Found,
        EnvFile::Read { path, .. } => Finding::Missing {
            fix: format!("add {}=... to {path}", needed.name),
        },
        EnvFile::Absent => Finding::Missing {
            fix: format!(
                "export {} before perch run, or set it in the service's environment file",
                needed.name
            ),
        },
        EnvFile::Unreadable { path, reason } => Finding::CannotCheck {
            reason: format!("{path} cannot be read here ({reason})"),
        },
    }
}

/// The names an environment file (systemd's `EnvironmentFile=` format) sets to a non-empty
/// value: `NAME=value` lines, with `export ` allowed before the name; blank lines and lines
/// starting with `#` or `;` are skipped.
pub fn names_set(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim_start)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with(';'))
        .filter_map(|line| {
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (name, value) = line.split_once('=')?;
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            let name = name.trim();
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            (valid && !value.is_empty()).then(|| name.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Needed {
        Needed {
            name: "OPENAI_API_KEY".to_owned(),
            place: "models.yml: providers.openai.apiKey".to_owned(),
        }
    }

    fn read(names: &[&str]) -> EnvFile {
        EnvFile::Read {
            path: "/etc/perch/a.env".to_owned(),
            set: names.iter().map(|name| (*name).to_owned()).collect(),
        }
    }

    #[test]
    fn a_variable_is_found_in_the_process_or_the_file_missing_when_neither_and_unchecked_when_the_file_is_closed()
     {
        let unreadable = EnvFile::Unreadable {
            path: "/etc/perch/a.env".to_owned(),
            reason: "permission denied".to_owned(),
        };
        let rows: [(bool, EnvFile, &str); 7] = [
            (true, EnvFile::Absent, "found"),
            (true, unreadable.clone(), "found"),
            (true, read(&[]), "found"),
            (false, read(&["OPENAI_API_KEY"]), "found"),
            (
                false,
                read(&["OTHER"]),
                "missing: add OPENAI_API_KEY=... to /etc/perch/a.env",
            ),
            (
                false,
                EnvFile::Absent,
                "missing: export OPENAI_API_KEY before perch run, or set it in the service's \
                 environment file",
            ),
            (
                false,
                unreadable,
                "cannot check: /etc/perch/a.env cannot be read here (permission denied)",
            ),
        ];
        for (in_process, file, expected) in rows {
            let shown = match find(&key(), in_process, &file) {
                Finding::Found => "found".to_owned(),
                Finding::Missing { fix } => format!("missing: {fix}"),
                Finding::CannotCheck { reason } => format!("cannot check: {reason}"),
            };
            assert_eq!(shown, expected, "in process: {in_process}, file: {file:?}");
        }
    }

    #[test]
    fn an_environment_file_sets_the_names_it_gives_a_value() {
        let text = "# tokens\nOPENAI_API_KEY=sk-1\n; old\nexport TELEGRAM_TOKEN=\"123:abc\"\n\
                    EMPTY=\nQUOTED_EMPTY=''\n  SPACED = x\n1BAD=x\nBAD-NAME=x\nno equals\n";
        let names: Vec<String> = names_set(text).into_iter().collect();
        assert_eq!(names, ["OPENAI_API_KEY", "SPACED", "TELEGRAM_TOKEN"]);
    }
}
