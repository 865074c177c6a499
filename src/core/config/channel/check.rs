//! Checking a channel file: its one `channel { ... }` declaration read into a [`ChannelConfig`],
//! every problem collected with its key path, and the secrets it names.

use super::{
    Access, BusyPolicy, ChannelConfig, ChannelKind, DmPolicy, GroupPolicy, Platform,
    TERMINAL_CHANNEL, ThreadPolicy,
};
use crate::config::sandbox::SandboxPolicy;
use crate::config::{Declaration, single, table_argument};
use crate::name::{ChannelName, EnvName, RoomAlias};
use crate::problem::{Pos, Problem};
use crate::secret::EnvRef;
use crate::tree::{Checker, Fields, FunctionId, Key, Node, Path, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const DEFAULT_COLLECT_WINDOW: u64 = 3;

const DEFAULT_MAX_AGE: u64 = 3600;

const DEFAULT_QUEUE_LIMIT: u32 = 20;

const DEFAULT_BOT_TURNS: u32 = 3;

const USAGE: &str = "channel { kind = \"telegram\", token = env \"TELEGRAM_TOKEN\" }";

const COMMON_KEYS: &[&str] = &[
    "kind",
    "rooms",
    "allow",
    "dm",
    "groups",
    "busy",
    "collect_window",
    "max_age",
    "queue_limit",
    "allow_bots",
    "bot_turns",
    "on_message",
    "format",
];

const ALLOW_KEYS: &[&str] = &["users", "rooms"];

const CREDENTIAL_KEYS: &[&str] = &[
    "token",
    "password",
    "store_passphrase",
    "app_token",
    "bot_token",
];

/// The channel name of `file` (`channels/ops.lua` is `ops`), as written.
pub fn channel_stem(file: &str) -> &str {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.strip_suffix(".lua").unwrap_or(base)
}

/// Checks the declarations `file` (such as `channels/ops.lua`) made: one `channel { ... }`.
/// The channel is named by the file's stem.
pub fn check_channel(
    file: &str,
    declarations: &[Declaration],
) -> Result<ChannelConfig, Vec<Problem>> {
    let mut checker = Checker::new(file);
    let name = channel_name(&mut checker, file);
    let config = single(&mut checker, declarations, "channel", USAGE).and_then(|declaration| {
        let table = table_argument(&mut checker, declaration, USAGE)?;
        let fields = checker.fields(table, &Path::root())?;
        read_channel(&mut checker, fields, name, declaration.pos)
    });
    match config {
        Some(config) if !checker.has_problems() => Ok(config),
        _ => Err(checker.into_problems()),
    }
}

fn channel_name(checker: &mut Checker, file: &str) -> Option<ChannelName> {
    let stem = channel_stem(file);
    let fix = format!("rename the file; a channel name is {}", ChannelName::RULE);
    if stem == TERMINAL_CHANNEL {
        checker.push(
            Problem::new(
                file,
                Pos::default(),
                "the channel name terminal belongs to `perch chat`",
            )
            .with_fix(fix),
        );
        return None;
    }
    match ChannelName::try_from(stem) {
        Ok(name) => Some(name),
        Err(_) => {
            checker.push(
                Problem::new(
                    file,
                    Pos::default(),
                    format!("{stem:?} is not a valid channel name"),
                )
                .with_fix(fix),
            );
            None
        }
    }
}

fn read_channel(
    checker: &mut Checker,
    mut fields: Fields<'_>,
    name: Option<ChannelName>,
    pos: Pos,
) -> Option<ChannelConfig> {
    let root = Path::root();
    let kind = fields
        .required(
            checker,
            "kind",
            "name the platform: kind = \"discord\", \"telegram\", \"matrix\" or \"slack\"",
        )
        .and_then(|node| {
            choice(
                checker,
                node,
                &root.key("kind"),
                "kind",
                &ChannelKind::ALL.map(|kind| (kind.as_str(), kind)),
            )
        });
    let platform = platform(checker, &mut fields, kind, pos);
    let api_url = if kind == Some(ChannelKind::Matrix) {
        None
    } else {
        fields.optional("api_url")
    };
    let api_url = api_url.and_then(|node| {
        let url = url(checker, node, &root.key("api_url"), "api_url")?;
        if kind == Some(ChannelKind::Telegram) && url.contains("/bot") {
            checker.report_fix(
                node.pos,
                &root.key("api_url"),
                "api_url must not hold the bot's path or token (value not shown)",
                "give the server's base URL, such as https://api.telegram.org; perch adds /bot<token>/ itself",
            );
            return None;
        }
        if kind == Some(ChannelKind::Slack) && url.contains("xox") {
            checker.report_fix(
                node.pos,
                &root.key("api_url"),
                "api_url must not hold a token (value not shown)",
                "give the Web API's base, such as https://slack.com/api/; the tokens are app_token and bot_token",
            );
            return None;
        }
        Some(url)
    });
    let rooms = fields
        .optional("rooms")
        .map(|node| rooms(checker, node, &root.key("rooms")))
        .unwrap_or_default();
    let allow = fields
        .optional("allow")
        .map(|node| access(checker, node, &root.key("allow"), &rooms))
        .unwrap_or_default();
    let dm = fields.optional("dm").map_or(Some(DmPolicy::Pair), |node| {
        choice(
            checker,
            node,
            &root.key("dm"),
            "dm policy",
            &[
                ("pair", DmPolicy::Pair),
                ("allow", DmPolicy::Allow),
                ("refuse", DmPolicy::Refuse),
            ],
        )
    });
    let groups = fields
        .optional("groups")
        .map_or(Some(GroupPolicy::Mention), |node| {
            choice(
                checker,
                node,
                &root.key("groups"),
                "groups policy",
                &[("mention", GroupPolicy::Mention), ("all", GroupPolicy::All)],
            )
        });
    let busy = busy(checker, &mut fields);
    let threads = fields
        .optional("threads")
        .map_or(Some(ThreadPolicy::Own), |node| {
            choice(
                checker,
                node,
                &root.key("threads"),
                "threads policy",
                &[("own", ThreadPolicy::Own), ("room", ThreadPolicy::Room)],
            )
        });
    let max_age = seconds(
        checker,
        &mut fields,
        "max_age",
        1..=2_592_000,
        DEFAULT_MAX_AGE,
    );
    let queue_limit = count(
        checker,
        &mut fields,
        "queue_limit",
        1..=10_000,
        DEFAULT_QUEUE_LIMIT,
    );
    let allow_bots = fields
        .optional("allow_bots")
        .map(|node| ids(checker, node, &root.key("allow_bots"), "bot"))
        .unwrap_or_default();
    let bot_turns = count(
        checker,
        &mut fields,
        "bot_turns",
        1..=100,
        DEFAULT_BOT_TURNS,
    );
    let on_message = hook(checker, &mut fields, "on_message", "msg");
    let format = hook(checker, &mut fields, "format", "reply");

    let mut known: Vec<&str> = COMMON_KEYS.to_vec();
    match kind {
        Some(kind) => known.extend(kind.own_keys()),
        None => {
            for key in ChannelKind::ALL.iter().flat_map(|kind| kind.own_keys()) {
                if !known.contains(key) {
                    known.push(key);
                }
            }
        }
    }
    fields.finish(checker, &known);

    Some(ChannelConfig {
        name: name?,
        pos,
        platform: platform?,
        api_url,
        rooms,
        allow,
        dm: dm?,
        groups: groups?,
        busy: busy?,
        threads: threads?,
        max_age: max_age?,
        queue_limit: queue_limit?,
        allow_bots,
        bot_turns: bot_turns?,
        on_message: on_message?,
        format: format?,
    })
}

/// One of `options`, by its word.
fn choice<T: Copy>(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    what: &str,
    options: &[(&str, T)],
) -> Option<T> {
    let text = checker.str(node, path)?;
    let found = options
        .iter()
        .find(|(word, _)| *word == text)
        .map(|(_, value)| *value);
    if found.is_none() {
        let words: Vec<&str> = options.iter().map(|(word, _)| *word).collect();
        checker.report_fix(
            node.pos,
            path,
            format!("unknown {what} {text:?}"),
            format!("use one of {}", words.join(", ")),
        );
    }
    found
}

/// The credentials and connection details of `kind`. Keys that belong to another kind are
/// reported; with no valid kind, credentials are still checked for literal values.
fn platform(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    kind: Option<ChannelKind>,
    pos: Pos,
) -> Option<Platform> {
    let root = Path::root();
    let Some(kind) = kind else {
        for key in CREDENTIAL_KEYS {
            if let Some(node) = fields.optional(key) {
                env_reference(checker, node, key);
            }
        }
        return None;
    };
    let mut foreign: Vec<&str> = Vec::new();
    for key in ChannelKind::ALL.iter().flat_map(|other| other.own_keys()) {
        if !kind.own_keys().contains(key) && !foreign.contains(key) {
            foreign.push(key);
        }
    }
    for key in foreign {
        if let Some(node) = fields.optional(key) {
            let owners: Vec<&str> = ChannelKind::ALL
                .into_iter()
                .filter(|other| other.own_keys().contains(&key))
                .map(ChannelKind::as_str)
                .collect();
            checker.report_fix(
                node.pos,
                &root.key(key),
                format!("{key} is for {} channels, not {kind}", listed(&owners)),
                format!(
                    "remove it; a {kind} channel takes {}",
                    kind.credential_example()
                ),
            );
        }
    }
    match kind {
        ChannelKind::Discord => Some(Platform::Discord {
            token: credential(checker, fields, kind, "token")?,
        }),
        ChannelKind::Telegram => Some(Platform::Telegram {
            token: credential(checker, fields, kind, "token")?,
        }),
        ChannelKind::Slack => {
            let app_token = credential(checker, fields, kind, "app_token");
            let bot_token = credential(checker, fields, kind, "bot_token");
            let (app_token, bot_token) = (app_token?, bot_token?);
            if app_token.name() == bot_token.name() {
                checker.report_fix(
                    pos,
                    &root.key("bot_token"),
                    format!(
                        "app_token and bot_token both name {}, but they are two tokens",
                        bot_token.name()
                    ),
                    "keep the app-level token (xapp-…) and the bot token (xoxb-…) in two variables, such as SLACK_APP_TOKEN and SLACK_BOT_TOKEN",
                );
                return None;
            }
            Some(Platform::Slack {
                app_token,
                bot_token,
            })
        }
        ChannelKind::Matrix => {
            let password = credential(checker, fields, kind, "password");
            let store_passphrase = credential(checker, fields, kind, "store_passphrase");
            let fix = format!("add it: {}", kind.credential_example());
            let homeserver = fields
                .required(checker, "homeserver", &fix)
                .and_then(|node| url(checker, node, &root.key("homeserver"), "homeserver"));
            let user = fields.required(checker, "user", &fix).and_then(|node| {
                let text = checker.non_empty_str(node, &root.key("user"))?;
                if text.chars().any(char::is_whitespace) {
                    checker.report_fix(
                        node.pos,
                        &root.key("user"),
                        format!("{text:?} is not a Matrix user id"),
                        "write the full id, such as @perch:example.org",
                    );
                    return None;
                }
                Some(text.to_owned())
            });
            Some(Platform::Matrix {
                homeserver: homeserver?,
                user: user?,
                password: password?,
                store_passphrase: store_passphrase?,
            })
        }
    }
}

/// `a`, `a and b`, `a, b and c`.
fn listed(words: &[&str]) -> String {
    match words.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// A required credential of `kind`.
fn credential(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    kind: ChannelKind,
    key: &str,
) -> Option<EnvRef> {
    fields
        .required(
            checker,
            key,
            &format!("add it: {}", kind.credential_example()),
        )
        .and_then(|node| env_reference(checker, node, key))
}

/// `env "NAME"`; a literal value is refused without repeating it.
fn env_reference(checker: &mut Checker, node: &Node, key: &str) -> Option<EnvRef> {
    let path = Path::root().key(key);
    match &node.value {
        Value::Env(name) => match EnvName::try_from(name.as_str()) {
            Ok(name) => Some(EnvRef::new(name)),
            Err(_) => {
                checker.report_fix(node.pos, &path, "not a variable name", EnvName::RULE);
                None
            }
        },
        Value::Str(_) => {
            checker.report_fix(
                node.pos,
                &path,
                format!("a literal {key} is not allowed in a channel file (value not shown)"),
                format!(
                    "keep it in the service's environment and reference it: {key} = env \"NAME\""
                ),
            );
            None
        }
        other => {
            checker.report_fix(
                node.pos,
                &path,
                format!("expected env \"NAME\", found {}", other.kind()),
                format!("write {key} = env \"NAME\""),
            );
            None
        }
    }
}

/// An `http://` or `https://` URL with a host. The value is not repeated in problems, because
/// an endpoint may carry a credential in its path.
fn url(checker: &mut Checker, node: &Node, path: &Path, key: &str) -> Option<String> {
    let text = checker.non_empty_str(node, path)?;
    let rest = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"));
    let authority = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    let problem = match authority {
        None => Some("must start with https:// or http://"),
        Some("") => Some("has no host"),
        Some(authority) if authority.contains('@') => {
            Some("must not carry a user name or password")
        }
        Some(_) if text.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            Some("must not contain spaces")
        }
        Some(_) => None,
    };
    if let Some(problem) = problem {
        checker.report_fix(
            node.pos,
            path,
            format!("{key} {problem}"),
            format!("write {key} = \"https://host.example\""),
        );
        return None;
    }
    Some(text.trim_end_matches('/').to_owned())
}

fn rooms(checker: &mut Checker, node: &Node, path: &Path) -> BTreeMap<RoomAlias, String> {
    let mut rooms = BTreeMap::new();
    let entries: &[(Key, Node)] = match &node.value {
        Value::Map(entries) => entries,
        Value::List(items) if items.is_empty() => &[],
        other => {
            checker.report_fix(
                node.pos,
                path,
                format!("expected a table of aliases, found {}", other.kind()),
                "name each room: rooms = { standup = \"<platform room id>\" }",
            );
            return rooms;
        }
    };
    for (key, value) in entries {
        let item_path = path.key(&key.name);
        let Ok(alias) = RoomAlias::try_from(key.name.as_str()) else {
            checker.report_fix(
                key.pos,
                &item_path,
                "not a room alias",
                format!("an alias is {}", RoomAlias::RULE),
            );
            continue;
        };
        let Some(id) = checker.non_empty_str(value, &item_path) else {
            continue;
        };
        if let Some((other, _)) = rooms.iter().find(|(_, known)| *known == id) {
            checker.report_fix(
                value.pos,
                &item_path,
                format!("the same room as {other}"),
                "give each room one alias",
            );
            continue;
        }
        rooms.insert(alias, id.to_owned());
    }
    rooms
}

fn access(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    rooms: &BTreeMap<RoomAlias, String>,
) -> Access {
    let Some(mut fields) = checker.fields(node, path) else {
        return Access::default();
    };
    let users = fields
        .optional("users")
        .map(|node| ids(checker, node, &path.key("users"), "user"))
        .unwrap_or_default();
    let mut allowed_rooms: Vec<RoomAlias> = Vec::new();
    if let Some(list) = fields.optional("rooms") {
        for (pos, item_path, text) in checker.str_list(list, &path.key("rooms")) {
            match RoomAlias::try_from(text.as_str()) {
                Ok(alias) if rooms.contains_key(&alias) => {
                    if allowed_rooms.contains(&alias) {
                        checker.report_fix(
                            pos,
                            &item_path,
                            format!("{alias} is listed twice"),
                            "remove one",
                        );
                    } else {
                        allowed_rooms.push(alias);
                    }
                }
                _ => {
                    let declared: Vec<&str> = rooms.keys().map(RoomAlias::as_str).collect();
                    let fix = if declared.is_empty() {
                        format!("declare it first: rooms = {{ {text} = \"<platform room id>\" }}")
                    } else {
                        format!(
                            "use one of {} or declare it under rooms",
                            declared.join(", ")
                        )
                    };
                    checker.report_fix(
                        pos,
                        &item_path,
                        format!("{text:?} is not a room declared under rooms"),
                        fix,
                    );
                }
            }
        }
    }
    fields.finish(checker, ALLOW_KEYS);
    Access {
        users,
        rooms: allowed_rooms,
    }
}

/// A list of platform ids (users or bots): non-empty strings without repeats.
fn ids(checker: &mut Checker, node: &Node, path: &Path, what: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for (pos, item_path, text) in checker.str_list(node, path) {
        if text.trim().is_empty() {
            checker.report_fix(
                pos,
                &item_path,
                "must not be empty",
                format!("write the platform's {what} id"),
            );
        } else if ids.contains(&text) {
            checker.report_fix(
                pos,
                &item_path,
                format!("{text} is listed twice"),
                "remove one",
            );
        } else {
            ids.push(text);
        }
    }
    ids
}

fn busy(checker: &mut Checker, fields: &mut Fields<'_>) -> Option<BusyPolicy> {
    let root = Path::root();
    let window = fields.optional("collect_window");
    let busy = fields.optional("busy").map_or(Some("followup"), |node| {
        choice(
            checker,
            node,
            &root.key("busy"),
            "busy policy",
            &[
                ("followup", "followup"),
                ("steer", "steer"),
                ("collect", "collect"),
                ("interrupt", "interrupt"),
            ],
        )
    })?;
    let window = match (busy, window) {
        ("collect", None) => Some(DEFAULT_COLLECT_WINDOW),
        ("collect", Some(node)) => checker
            .int_in(node, &root.key("collect_window"), 1..=300)
            .and_then(|n| u64::try_from(n).ok()),
        (_, Some(node)) => {
            checker.report_fix(
                node.pos,
                &root.key("collect_window"),
                format!("collect_window applies only to busy = \"collect\", not {busy:?}"),
                "remove collect_window, or set busy = \"collect\"",
            );
            None
        }
        (_, None) => None,
    };
    Some(match busy {
        "steer" => BusyPolicy::Steer,
        "collect" => BusyPolicy::Collect {
            window: Duration::from_secs(window?),
        },
        "interrupt" => BusyPolicy::Interrupt,
        _ => BusyPolicy::Followup,
    })
}

fn seconds(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    key: &str,
    range: std::ops::RangeInclusive<i64>,
    default: u64,
) -> Option<Duration> {
    match fields.optional(key) {
        None => Some(Duration::from_secs(default)),
        Some(node) => checker
            .int_in(node, &Path::root().key(key), range)
            .and_then(|n| u64::try_from(n).ok())
            .map(Duration::from_secs),
    }
}

fn count(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    key: &str,
    range: std::ops::RangeInclusive<i64>,
    default: u32,
) -> Option<u32> {
    match fields.optional(key) {
        None => Some(default),
        Some(node) => checker
            .int_in(node, &Path::root().key(key), range)
            .and_then(|n| u32::try_from(n).ok()),
    }
}

/// An optional function; `None` when the key holds something else.
fn hook(
    checker: &mut Checker,
    fields: &mut Fields<'_>,
    key: &str,
    argument: &str,
) -> Option<Option<FunctionId>> {
    match fields.optional(key) {
        None => Some(None),
        Some(Node {
            value: Value::Function(id),
            ..
        }) => Some(Some(*id)),
        Some(node) => {
            checker.report_fix(
                node.pos,
                &Path::root().key(key),
                format!("expected a function, found {}", node.value.kind()),
                format!("write {key} = function({argument}, store) ... end"),
            );
            None
        }
    }
}

/// A problem for every channel credential that `sandbox.lua` also lends to the guest as a
/// secret source: the guest could then post to the platform directly, around the outbox and
/// the access rules.
pub fn channel_secret_problems<'c>(
    sandbox: &SandboxPolicy,
    channels: impl IntoIterator<Item = (&'c str, &'c ChannelConfig)>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (file, channel) in channels {
        for (key, reference) in channel.platform.credentials() {
            let Some(index) = sandbox
                .secrets
                .iter()
                .position(|grant| grant.source.name() == reference.name())
            else {
                continue;
            };
            problems.push(
                Problem::new(
                    file,
                    channel.pos,
                    format!(
                        "{} is also a secret source in sandbox.lua (secrets[{}]), so the sandbox \
                         could post to {} directly, around the outbox and the access rules",
                        reference.name(),
                        index + 1,
                        channel.kind()
                    ),
                )
                .with_path(key)
                .with_fix(format!(
                    "remove that secret from sandbox.lua, or give the sandbox a credential of its own in another variable than {}",
                    reference.name()
                )),
            );
        }
    }
    problems
}
