//! Validated names. Each type can only hold a value that passed its check.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident, $check:expr, $rule:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The rule a valid value follows, for error messages.
            pub const RULE: &'static str = $rule;

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(value: String) -> Result<Self, String> {
                let check: fn(&str) -> bool = $check;
                if check(&value) {
                    Ok($name(value))
                } else {
                    Err(format!("{value:?} is not a valid {}: {}", stringify!($name), $rule))
                }
            }
        }

        impl TryFrom<&str> for $name {
            type Error = String;

            fn try_from(value: &str) -> Result<Self, String> {
                $name::try_from(value.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

fn word(value: &str, max: usize, extra: &[char]) -> bool {
    let mut chars = value.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    value.len() <= max
        && first.is_ascii_alphanumeric()
        && chars.all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

validated_name!(
    /// A conversation lane; it names a directory under `.perch/sessions/`.
    LaneName,
    |v| word(v, 64, &['-', '_']),
    "1 to 64 letters, digits, '-' or '_', starting with a letter or digit"
);

validated_name!(
    /// A chat channel: the stem of its file in `channels/`, and the name of its directory under
    /// `.perch/channels/`.
    ChannelName,
    |v| word(v, 64, &['-', '_']),
    "1 to 64 letters, digits, '-' or '_', starting with a letter or digit"
);

validated_name!(
    /// The name a channel file gives one of its platform rooms (`rooms = { standup = "..." }`),
    /// used in delivery targets such as `ops:standup`.
    RoomAlias,
    |v| word(v, 64, &['-', '_']),
    "1 to 64 letters, digits, '-' or '_', starting with a letter or digit"
);

validated_name!(
    /// A heartbeat task in `workspace/HEARTBEAT.yml`.
    TaskName,
    |v| {
        !v.is_empty()
            && v.len() <= 40
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    },
    "1 to 40 lowercase letters, digits, '-' or '_'"
);

impl TaskName {
    /// The lane the task's runs use: `heartbeat-<name>`.
    pub fn own_lane(&self) -> LaneName {
        LaneName(format!("{HEARTBEAT_LANE_PREFIX}{}", self.0))
    }

    /// The lane of the task's dry runs: `heartbeat-<name>-dry-run`.
    pub fn dry_run_lane(&self) -> LaneName {
        LaneName(format!(
            "{HEARTBEAT_LANE_PREFIX}{}{DRY_RUN_LANE_SUFFIX}",
            self.0
        ))
    }

    /// Whether the name ends in `-dry-run`, which `HEARTBEAT.yml` refuses: the task's own lane
    /// would be the dry-run lane of the task named without it.
    pub fn is_dry_run_shaped(&self) -> bool {
        self.0.ends_with(DRY_RUN_LANE_SUFFIX)
    }
}

const HEARTBEAT_LANE_PREFIX: &str = "heartbeat-";
const DRY_RUN_LANE_SUFFIX: &str = "-dry-run";

/// What a lane holds, read from its name alone: `heartbeat-<task>` is a heartbeat task's own
/// lane, `heartbeat-<task>-dry-run` the lane of its dry runs (a task name never ends in
/// `-dry-run`), where `<task>` is a [`TaskName`]; every other lane holds a conversation (chat,
/// `perch chat`'s `terminal`, a lane a hook or `HEARTBEAT.yml` names). A conversation lane perch
/// names itself is never one of the first two shapes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LaneKind {
    Conversation,
    Heartbeat(TaskName),
    DryRun(TaskName),
}

impl LaneKind {
    /// A heartbeat task's own lane or its dry-run lane.
    pub fn is_heartbeat(&self) -> bool {
        matches!(self, LaneKind::Heartbeat(_) | LaneKind::DryRun(_))
    }
}

impl LaneName {
    /// What the lane holds; see [`LaneKind`].
    pub fn kind(&self) -> LaneKind {
        let Some(rest) = self.0.strip_prefix(HEARTBEAT_LANE_PREFIX) else {
            return LaneKind::Conversation;
        };
        if let Some(task) = rest
            .strip_suffix(DRY_RUN_LANE_SUFFIX)
            .and_then(|task| TaskName::try_from(task).ok())
        {
            return LaneKind::DryRun(task);
        }
        match TaskName::try_from(rest) {
            Ok(task) => LaneKind::Heartbeat(task),
            Err(_) => LaneKind::Conversation,
        }
    }
}

validated_name!(
    /// A tool the model can call.
    ToolName,
    |v| word(v, 64, &['-', '_']) && v.starts_with(|c: char| c.is_ascii_alphabetic()),
    "1 to 64 letters, digits, '-' or '_', starting with a letter"
);

validated_name!(
    /// A provider key in `models.yml`.
    ProviderName,
    |v| word(v, 64, &['-', '_', '.']),
    "1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit"
);

validated_name!(
    /// The name of an environment variable.
    EnvName,
    |v| {
        !v.is_empty()
            && v.len() <= 128
            && !v.starts_with(|c: char| c.is_ascii_digit())
            && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    },
    "letters, digits and '_', not starting with a digit"
);

validated_name!(
    /// A host name the sandbox may reach. `*.example.com` allows every subdomain of
    /// `example.com`. IP addresses are not host names.
    HostName,
    is_host_pattern,
    "a DNS name such as api.github.com, or *.example.com for its subdomains; not an IP address"
);

/// The name under which a guest reaches its own host, when `allow` lists it.
pub const HOST_ALIAS: &str = "host.microsandbox.internal";

fn is_host_pattern(value: &str) -> bool {
    let name = value.strip_prefix("*.").unwrap_or(value);
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |label: &&str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let all_numeric = labels.iter().all(|l| l.chars().all(|c| c.is_ascii_digit()));
    name.len() <= 253 && labels.len() >= 2 && labels.iter().all(label_ok) && !all_numeric
}

/// `provider/id` as written in `agent.lua`; it splits at the first `/`, so the id may hold more.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ModelRef {
    pub provider: ProviderName,
    pub id: String,
}

impl ModelRef {
    pub fn parse(text: &str) -> Result<ModelRef, String> {
        let Some((provider, id)) = text.split_once('/') else {
            return Err(format!(
                "{text:?} has no provider; write it as provider/model-id"
            ));
        };
        if id.is_empty() {
            return Err(format!("{text:?} has no model id after the '/'"));
        }
        Ok(ModelRef {
            provider: ProviderName::try_from(provider)?,
            id: id.to_owned(),
        })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_refs_split_at_the_first_slash() {
        let model = ModelRef::parse("openrouter/meta-llama/llama-4").unwrap();
        assert_eq!(model.provider.as_str(), "openrouter");
        assert_eq!(model.id, "meta-llama/llama-4");
        assert!(ModelRef::parse("gpt-5").is_err());
        assert!(ModelRef::parse("openai/").is_err());
    }

    #[test]
    fn host_names_refuse_addresses_and_bad_labels() {
        for good in [
            "api.github.com",
            "*.githubusercontent.com",
            "host.microsandbox.internal",
        ] {
            assert!(HostName::try_from(good).is_ok(), "{good}");
        }
        for bad in [
            "10.0.0.1",
            "localhost",
            "Api.GitHub.com",
            "a..b",
            "-a.com",
            "*.com.",
            "https://x.com",
        ] {
            assert!(HostName::try_from(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_follow_their_rules() {
        assert!(LaneName::try_from("main").is_ok());
        assert!(LaneName::try_from("../etc").is_err());
        assert!(LaneName::try_from("").is_err());
        assert!(ChannelName::try_from("ops-2").is_ok());
        assert!(ChannelName::try_from("ops:x").is_err());
        assert!(RoomAlias::try_from("standup").is_ok());
        assert!(RoomAlias::try_from("a/b").is_err());
        assert!(ToolName::try_from("9lives").is_err());
        assert!(EnvName::try_from("GITHUB_TOKEN").is_ok());
        assert!(EnvName::try_from("1X").is_err());
        assert!(EnvName::try_from("A-B").is_err());
        assert!(TaskName::try_from("standup_2-a").is_ok());
        assert!(TaskName::try_from("Standup").is_err());
        assert!(TaskName::try_from("a".repeat(41)).is_err());
    }

    #[test]
    fn a_lanes_kind_is_read_from_its_name() {
        let task = |name: &str| TaskName::try_from(name).unwrap();
        let table = [
            ("heartbeat-digest", LaneKind::Heartbeat(task("digest"))),
            ("heartbeat-digest-dry-run", LaneKind::DryRun(task("digest"))),
            ("heartbeat-a_b-2", LaneKind::Heartbeat(task("a_b-2"))),
            ("heartbeat-dry-run", LaneKind::Heartbeat(task("dry-run"))),
            ("heartbeat--dry-run", LaneKind::Heartbeat(task("-dry-run"))),
            ("heartbeat-Digest", LaneKind::Conversation),
            ("heartbeat-", LaneKind::Conversation),
            ("heartbeat", LaneKind::Conversation),
            ("Heartbeat-digest", LaneKind::Conversation),
            (
                "heartbeat-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                LaneKind::Conversation,
            ),
            ("tg-4242", LaneKind::Conversation),
            ("terminal", LaneKind::Conversation),
            ("main", LaneKind::Conversation),
            (
                "chat-heartbeat-foo-0123456789abcdef",
                LaneKind::Conversation,
            ),
        ];
        for (name, kind) in table {
            assert_eq!(LaneName::try_from(name).unwrap().kind(), kind, "{name}");
        }
        for name in ["digest", "a", "standup_2-a", &"z".repeat(40)] {
            let task = task(name);
            assert_eq!(task.own_lane().kind(), LaneKind::Heartbeat(task.clone()));
            assert_eq!(task.dry_run_lane().kind(), LaneKind::DryRun(task.clone()));
            assert!(task.own_lane().kind().is_heartbeat());
            assert!(!task.is_dry_run_shaped());
        }
        assert!(task("x-dry-run").is_dry_run_shaped());
        assert!(!LaneKind::Conversation.is_heartbeat());
    }

    #[test]
    fn heartbeat_lanes_are_valid_lane_names() {
        let task = TaskName::try_from("_".repeat(40)).unwrap();
        for lane in [task.own_lane(), task.dry_run_lane()] {
            assert_eq!(LaneName::try_from(lane.as_str()).unwrap(), lane);
        }
        assert_eq!(
            task.dry_run_lane().as_str(),
            format!("heartbeat-{}-dry-run", "_".repeat(40))
        );
    }
}
