use super::*;
use crate::config::Declaration;
use crate::config::SecretGrant;
use crate::config::sandbox::SandboxPolicy;
use crate::name::EnvName;
use crate::name::HostName;
use crate::problem::Problem;
use crate::tree::build::{map_at, node_at};
use crate::tree::{Node, Value};

fn node(value: Value) -> Node {
    node_at(2, value)
}

fn text(value: &str) -> Value {
    Value::Str(value.to_owned())
}

fn env(name: &str) -> Value {
    Value::Env(name.to_owned())
}

fn list(items: &[&str]) -> Value {
    Value::List(items.iter().map(|item| node(text(item))).collect())
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    map_at(2, entries)
}

fn declare(entries: Vec<(&str, Value)>) -> Vec<Declaration> {
    vec![Declaration {
        function: "channel".into(),
        pos: Pos::line(2),
        args: vec![node(map(entries))],
    }]
}

fn check(entries: Vec<(&str, Value)>) -> Result<ChannelConfig, Vec<Problem>> {
    check_channel("channels/ops.lua", &declare(entries))
}

fn problems(entries: Vec<(&str, Value)>) -> Vec<String> {
    check(entries)
        .expect_err("the file should have problems")
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn telegram(mut extra: Vec<(&'static str, Value)>) -> Vec<(&'static str, Value)> {
    let mut entries = vec![("kind", text("telegram")), ("token", env("TG_TOKEN"))];
    entries.append(&mut extra);
    entries
}

fn reference(name: &str) -> EnvRef {
    EnvRef::new(EnvName::try_from(name).unwrap())
}

fn alias(name: &str) -> RoomAlias {
    RoomAlias::try_from(name).unwrap()
}

#[test]
fn a_minimal_channel_takes_every_default() {
    let config = check(telegram(vec![])).unwrap();
    assert_eq!(
        config,
        ChannelConfig {
            name: ChannelName::try_from("ops").unwrap(),
            pos: Pos::line(2),
            platform: Platform::Telegram {
                token: reference("TG_TOKEN"),
            },
            api_url: None,
            rooms: BTreeMap::new(),
            allow: Access::default(),
            dm: DmPolicy::Pair,
            groups: GroupPolicy::Mention,
            busy: BusyPolicy::Followup,
            threads: ThreadPolicy::Own,
            max_age: Duration::from_secs(3600),
            queue_limit: 20,
            allow_bots: Vec::new(),
            bot_turns: 3,
            on_message: None,
            format: None,
        }
    );
}

#[test]
fn every_option_is_read() {
    let config = check_channel(
        "channels/team-chat.lua",
        &declare(vec![
            ("kind", text("matrix")),
            ("homeserver", text("http://127.0.0.1:8008/")),
            ("user", text("@perch:localhost")),
            ("password", env("MATRIX_PASSWORD")),
            ("store_passphrase", env("MATRIX_STORE")),
            (
                "rooms",
                map(vec![
                    ("standup", text("!abc:localhost")),
                    ("ops", text("!def:localhost")),
                ]),
            ),
            (
                "allow",
                map(vec![
                    ("users", list(&["@ann:localhost"])),
                    ("rooms", list(&["standup"])),
                ]),
            ),
            ("dm", text("refuse")),
            ("groups", text("all")),
            ("busy", text("collect")),
            ("collect_window", Value::Int(5)),
            ("threads", text("room")),
            ("max_age", Value::Int(600)),
            ("queue_limit", Value::Float(7.0)),
            ("allow_bots", list(&["@other:localhost"])),
            ("bot_turns", Value::Int(1)),
            ("on_message", Value::Function(FunctionId(0))),
            ("format", Value::Function(FunctionId(1))),
        ]),
    )
    .unwrap();
    assert_eq!(
        config,
        ChannelConfig {
            name: ChannelName::try_from("team-chat").unwrap(),
            pos: Pos::line(2),
            platform: Platform::Matrix {
                homeserver: "http://127.0.0.1:8008".into(),
                user: "@perch:localhost".into(),
                password: reference("MATRIX_PASSWORD"),
                store_passphrase: reference("MATRIX_STORE"),
            },
            api_url: None,
            rooms: BTreeMap::from([
                (alias("ops"), "!def:localhost".to_owned()),
                (alias("standup"), "!abc:localhost".to_owned()),
            ]),
            allow: Access {
                users: vec!["@ann:localhost".into()],
                rooms: vec![alias("standup")],
            },
            dm: DmPolicy::Refuse,
            groups: GroupPolicy::All,
            busy: BusyPolicy::Collect {
                window: Duration::from_secs(5),
            },
            threads: ThreadPolicy::Room,
            max_age: Duration::from_secs(600),
            queue_limit: 7,
            allow_bots: vec!["@other:localhost".into()],
            bot_turns: 1,
            on_message: Some(FunctionId(0)),
            format: Some(FunctionId(1)),
        }
    );
    assert_eq!(config.kind(), ChannelKind::Matrix);
    assert_eq!(config.room_alias("!def:localhost"), Some(&alias("ops")));
    assert_eq!(config.room_alias("!nope:localhost"), None);
    assert_eq!(
        config.platform.credentials(),
        vec![
            ("password", &reference("MATRIX_PASSWORD")),
            ("store_passphrase", &reference("MATRIX_STORE")),
        ]
    );
}

#[test]
fn collect_has_a_default_window() {
    let config = check(telegram(vec![("busy", text("collect"))])).unwrap();
    assert_eq!(
        config.busy,
        BusyPolicy::Collect {
            window: Duration::from_secs(3)
        }
    );
    for (word, policy) in [
        ("steer", BusyPolicy::Steer),
        ("interrupt", BusyPolicy::Interrupt),
        ("followup", BusyPolicy::Followup),
    ] {
        let config = check(telegram(vec![("busy", text(word))])).unwrap();
        assert_eq!(config.busy, policy);
        assert_eq!(config.busy.as_str(), word);
    }
}

#[test]
fn a_literal_credential_is_refused_without_its_value() {
    let secret = "123456:AAE-literal-bot-token";
    let found = problems(vec![("kind", text("telegram")), ("token", text(secret))]);
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:2: token: a literal token is not allowed in a channel file (value not shown)\n  \
             fix: keep it in the service's environment and reference it: token = env \"NAME\""
        ]
    );
    let found = problems(vec![("kind", text("irc")), ("token", text(secret))]);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().all(|problem| !problem.contains(secret)));
    let found = problems(vec![
        ("kind", text("matrix")),
        ("homeserver", text("https://m.example")),
        ("user", text("@a:m.example")),
        ("password", text(secret)),
        ("store_passphrase", Value::Int(4)),
    ]);
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:2: password: a literal password is not allowed in a channel file (value not shown)\n  \
             fix: keep it in the service's environment and reference it: password = env \"NAME\"",
            "channels/ops.lua:2: store_passphrase: expected env \"NAME\", found an integer\n  \
             fix: write store_passphrase = env \"NAME\"",
        ]
    );
}

#[test]
fn kind_is_required_and_must_be_known() {
    assert_eq!(
        problems(vec![("token", env("T"))]),
        vec![
            "channels/ops.lua:2: missing kind\n  \
             fix: name the platform: kind = \"discord\", \"telegram\", \"matrix\" or \"slack\""
        ]
    );
    assert_eq!(
        problems(vec![("kind", text("irc")), ("token", env("T"))]),
        vec![
            "channels/ops.lua:2: kind: unknown kind \"irc\"\n  \
             fix: use one of discord, telegram, matrix, slack"
        ]
    );
}

#[test]
fn each_kind_requires_its_credentials() {
    assert_eq!(
        problems(vec![("kind", text("discord"))]),
        vec!["channels/ops.lua:2: missing token\n  fix: add it: token = env \"DISCORD_TOKEN\""]
    );
    let found = problems(vec![("kind", text("matrix"))]);
    let messages: Vec<&str> = found
        .iter()
        .map(|problem| problem.lines().next().unwrap())
        .collect();
    assert_eq!(
        messages,
        vec![
            "channels/ops.lua:2: missing password",
            "channels/ops.lua:2: missing store_passphrase",
            "channels/ops.lua:2: missing homeserver",
            "channels/ops.lua:2: missing user",
        ]
    );
}

#[test]
fn keys_of_another_kind_and_unknown_keys_are_named() {
    let found = problems(telegram(vec![
        ("homeserver", text("https://m.example")),
        ("alow", map(vec![])),
    ]));
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:2: homeserver: homeserver is for matrix channels, not telegram\n  \
             fix: remove it; a telegram channel takes token = env \"TELEGRAM_TOKEN\"",
            "channels/ops.lua:2: alow: unknown key\n  fix: did you mean allow? known keys: \
             kind, rooms, allow, dm, groups, busy, collect_window, max_age, queue_limit, \
             allow_bots, bot_turns, on_message, format, token, api_url, threads",
        ]
    );
    for (key, value) in [("token", env("T")), ("api_url", text("https://m.example"))] {
        let found = problems(vec![
            ("kind", text("matrix")),
            ("homeserver", text("https://m.example")),
            ("user", text("@a:m.example")),
            ("password", env("P")),
            ("store_passphrase", env("S")),
            (key, value),
        ]);
        assert_eq!(found.len(), 1, "{found:#?}");
        let expected = format!(
            "channels/ops.lua:2: {key}: {key} is for {} channels, not matrix\n",
            if key == "token" {
                "discord and telegram"
            } else {
                "discord, telegram and slack"
            }
        );
        assert!(found[0].starts_with(&expected), "{found:#?}");
    }
}

#[test]
fn urls_are_checked_without_repeating_them() {
    for (url, message) in [
        (
            "ftp://x.example",
            "api_url must start with https:// or http://",
        ),
        ("https://", "api_url has no host"),
        (
            "https://user:pw@x.example",
            "api_url must not carry a user name or password",
        ),
        ("https://x.example/a b", "api_url must not contain spaces"),
    ] {
        let found = problems(telegram(vec![("api_url", text(url))]));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(&format!("channels/ops.lua:2: api_url: {message}\n")),
            "{url}: {}",
            found[0]
        );
        if url.len() > "https://".len() {
            assert!(!found[0].contains(url), "{}", found[0]);
        }
    }
    let found = problems(telegram(vec![(
        "api_url",
        text("https://api.telegram.org/bot123:SECRET"),
    )]));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(!found[0].contains("SECRET"), "{}", found[0]);
    let config = check(telegram(vec![("api_url", text("http://127.0.0.1:9/"))])).unwrap();
    assert_eq!(config.api_url.as_deref(), Some("http://127.0.0.1:9"));
}

#[test]
fn rooms_and_access_are_checked() {
    let found = problems(telegram(vec![
        (
            "rooms",
            map(vec![
                ("team", text("-100")),
                ("again", text("-100")),
                ("empty", text(" ")),
                ("bad alias", text("-200")),
            ]),
        ),
        (
            "allow",
            map(vec![
                ("users", list(&["42", "42", ""])),
                ("rooms", list(&["team", "elsewhere"])),
                ("bots", list(&[])),
            ]),
        ),
        ("allow_bots", list(&["7", "7"])),
    ]));
    let messages: Vec<&str> = found
        .iter()
        .map(|problem| problem.lines().next().unwrap())
        .collect();
    assert_eq!(
        messages,
        vec![
            "channels/ops.lua:2: rooms.again: the same room as team",
            "channels/ops.lua:2: rooms.empty: must not be empty",
            "channels/ops.lua:2: rooms.bad alias: not a room alias",
            "channels/ops.lua:2: allow.users[2]: 42 is listed twice",
            "channels/ops.lua:2: allow.users[3]: must not be empty",
            "channels/ops.lua:2: allow.rooms[2]: \"elsewhere\" is not a room declared under rooms",
            "channels/ops.lua:2: allow.bots: unknown key",
            "channels/ops.lua:2: allow_bots[2]: 7 is listed twice",
        ]
    );
    assert!(found[5].ends_with("fix: use one of team or declare it under rooms"));
    let found = problems(telegram(vec![("rooms", list(&["-100"]))]));
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:2: rooms: expected a table of aliases, found a list\n  \
             fix: name each room: rooms = { standup = \"<platform room id>\" }"
        ]
    );
}

#[test]
fn threads_join_their_room_only_where_the_file_asks_and_the_platform_has_them() {
    let telegram_with = |word: &str| check(telegram(vec![("threads", text(word))]));
    for (word, policy) in [("own", ThreadPolicy::Own), ("room", ThreadPolicy::Room)] {
        assert_eq!(telegram_with(word).unwrap().threads, policy, "{word}");
    }
    assert_eq!(check(telegram(vec![])).unwrap().threads, ThreadPolicy::Own);
    assert_eq!(
        problems(telegram(vec![("threads", text("fold"))])),
        vec![
            "channels/ops.lua:2: threads: unknown threads policy \"fold\"\n  fix: use one of own, room"
        ]
    );
    assert_eq!(
        problems(vec![
            ("kind", text("discord")),
            ("token", env("DISCORD_TOKEN")),
            ("threads", text("room")),
        ]),
        vec![
            "channels/ops.lua:2: threads: threads is for telegram, matrix and slack channels, not discord\n  \
             fix: remove it; a discord channel takes token = env \"DISCORD_TOKEN\""
        ]
    );
    for (policy, posted_in, conversation) in [
        (ThreadPolicy::Own, Some("t1"), Some("t1")),
        (ThreadPolicy::Own, None, None),
        (ThreadPolicy::Room, Some("t1"), None),
        (ThreadPolicy::Room, None, None),
    ] {
        assert_eq!(
            policy.conversation_thread(posted_in),
            conversation,
            "{policy:?} {posted_in:?}"
        );
    }
}

#[test]
fn policies_and_numbers_are_checked() {
    let found = problems(telegram(vec![
        ("dm", text("open")),
        ("groups", text("none")),
        ("busy", text("queue")),
        ("max_age", Value::Int(0)),
        ("queue_limit", text("20")),
        ("bot_turns", Value::Int(1000)),
    ]));
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:2: dm: unknown dm policy \"open\"\n  fix: use one of pair, allow, refuse",
            "channels/ops.lua:2: groups: unknown groups policy \"none\"\n  fix: use one of mention, all",
            "channels/ops.lua:2: busy: unknown busy policy \"queue\"\n  \
             fix: use one of followup, steer, collect, interrupt",
            "channels/ops.lua:2: max_age: 0 is out of range; use a value from 1 to 2592000",
            "channels/ops.lua:2: queue_limit: expected an integer, found a string",
            "channels/ops.lua:2: bot_turns: 1000 is out of range; use a value from 1 to 100",
        ]
    );
    assert_eq!(
        problems(telegram(vec![("collect_window", Value::Int(2))])),
        vec![
            "channels/ops.lua:2: collect_window: collect_window applies only to busy = \"collect\", not \"followup\"\n  \
             fix: remove collect_window, or set busy = \"collect\""
        ]
    );
    assert_eq!(
        problems(telegram(vec![
            ("busy", text("collect")),
            ("collect_window", Value::Int(0)),
        ]))[0],
        "channels/ops.lua:2: collect_window: 0 is out of range; use a value from 1 to 300"
    );
}

#[test]
fn hooks_must_be_functions() {
    assert_eq!(
        problems(telegram(vec![
            ("on_message", text("drop")),
            ("format", Value::Bool(true)),
        ])),
        vec![
            "channels/ops.lua:2: on_message: expected a function, found a string\n  \
             fix: write on_message = function(msg, store) ... end",
            "channels/ops.lua:2: format: expected a function, found a boolean\n  \
             fix: write format = function(reply, store) ... end",
        ]
    );
}

#[test]
fn the_file_stem_must_be_a_channel_name() {
    let declarations = declare(telegram(vec![]));
    let shown = |file: &str| -> Vec<String> {
        check_channel(file, &declarations)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(
        shown("channels/my ops.lua"),
        vec![format!(
            "channels/my ops.lua: \"my ops\" is not a valid channel name\n  \
             fix: rename the file; a channel name is {}",
            ChannelName::RULE
        )]
    );
    assert_eq!(shown("channels/terminal.lua").len(), 1);
    assert!(shown("channels/terminal.lua")[0].contains("`perch chat`"));
    assert_eq!(channel_stem("channels/ops.lua"), "ops");
}

#[test]
fn the_declaration_must_be_made_once() {
    let found: Vec<String> = check_channel("channels/ops.lua", &[])
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        vec![
            "channels/ops.lua: channel { ... } is never called\n  \
             fix: declare it: channel { kind = \"telegram\", token = env \"TELEGRAM_TOKEN\" }"
        ]
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let found = problems(vec![
        ("kind", text("discord")),
        ("token", text("literal")),
        ("dm", text("x")),
        ("max_age", Value::Int(-1)),
        ("nope", Value::Nil),
        ("nope2", Value::Bool(true)),
    ]);
    assert_eq!(found.len(), 5, "{found:#?}");
}

#[test]
fn a_channel_credential_may_not_be_a_sandbox_secret() {
    let host = HostName::try_from("api.telegram.org").unwrap();
    let sandbox = SandboxPolicy {
        image: "perch:default".into(),
        cpus: 1,
        memory: 1024,
        workspace_disk: crate::config::DEFAULT_WORKSPACE_DISK,
        allow: vec![host.clone()],
        secrets: vec![
            SecretGrant {
                env: EnvName::try_from("GITHUB_TOKEN").unwrap(),
                source: reference("GITHUB_TOKEN"),
                placeholder: None,
                hosts: vec![host.clone()],
            },
            SecretGrant {
                env: EnvName::try_from("BOT").unwrap(),
                source: reference("TG_TOKEN"),
                placeholder: None,
                hosts: vec![host],
            },
        ],
        env: BTreeMap::new(),
        bootstrap: Vec::new(),
    };
    let ops = check(telegram(vec![])).unwrap();
    let other = check_channel(
        "channels/other.lua",
        &declare(vec![("kind", text("discord")), ("token", env("DISCORD"))]),
    )
    .unwrap();
    let found: Vec<String> = channel_secret_problems(
        &sandbox,
        [
            ("channels/ops.lua", &ops),
            ("channels/other.lua", &other),
            ("channels/ops2.lua", &ops),
        ],
    )
    .iter()
    .map(ToString::to_string)
    .collect();
    let expected = |file: &str| {
        format!(
            "{file}:2: token: TG_TOKEN is also a secret source in sandbox.lua (secrets[2]), so the \
             sandbox could post to telegram directly, around the outbox and the access rules\n  \
             fix: remove that secret from sandbox.lua, or give the sandbox a credential of its \
             own in another variable than TG_TOKEN"
        )
    };
    assert_eq!(
        found,
        vec![expected("channels/ops.lua"), expected("channels/ops2.lua")]
    );
}

fn slack(mut extra: Vec<(&'static str, Value)>) -> Vec<(&'static str, Value)> {
    let mut entries = vec![
        ("kind", text("slack")),
        ("app_token", env("SLACK_APP_TOKEN")),
        ("bot_token", env("SLACK_BOT_TOKEN")),
    ];
    entries.append(&mut extra);
    entries
}

#[test]
fn a_slack_channel_takes_two_tokens_and_an_api_url() {
    let config = check(slack(vec![("api_url", text("http://127.0.0.1:9/api/"))])).unwrap();
    assert_eq!(
        config.platform,
        Platform::Slack {
            app_token: reference("SLACK_APP_TOKEN"),
            bot_token: reference("SLACK_BOT_TOKEN"),
        }
    );
    assert_eq!(config.kind(), ChannelKind::Slack);
    assert_eq!(config.api_url.as_deref(), Some("http://127.0.0.1:9/api"));
    assert_eq!(
        config.platform.credentials(),
        vec![
            ("app_token", &reference("SLACK_APP_TOKEN")),
            ("bot_token", &reference("SLACK_BOT_TOKEN")),
        ]
    );
}

#[test]
fn a_slack_channel_is_checked_with_its_lines_and_fixes() {
    assert_eq!(
        problems(vec![("kind", text("slack"))]),
        vec![
            "channels/ops.lua:2: missing app_token\n  fix: add it: app_token = env \"SLACK_APP_TOKEN\", bot_token = env \"SLACK_BOT_TOKEN\"",
            "channels/ops.lua:2: missing bot_token\n  fix: add it: app_token = env \"SLACK_APP_TOKEN\", bot_token = env \"SLACK_BOT_TOKEN\"",
        ]
    );
    let literal = problems(vec![
        ("kind", text("slack")),
        ("app_token", text("xapp-1-A0-1-abc")),
        ("bot_token", env("SLACK_BOT_TOKEN")),
    ]);
    assert_eq!(literal.len(), 1, "{literal:#?}");
    assert!(
        literal[0].starts_with(
            "channels/ops.lua:2: app_token: a literal app_token is not allowed in a channel file (value not shown)"
        ),
        "{literal:#?}"
    );
    assert!(!literal[0].contains("xapp-1"), "{literal:#?}");
    let same = problems(vec![
        ("kind", text("slack")),
        ("app_token", env("SLACK")),
        ("bot_token", env("SLACK")),
    ]);
    assert_eq!(
        same,
        vec![
            "channels/ops.lua:2: bot_token: app_token and bot_token both name SLACK, but they are two tokens\n  \
             fix: keep the app-level token (xapp-…) and the bot token (xoxb-…) in two variables, such as SLACK_APP_TOKEN and SLACK_BOT_TOKEN"
        ]
    );
    let token_in_url = problems(slack(vec![(
        "api_url",
        text("https://slack.com/api/?token=xoxb-1-2"),
    )]));
    assert_eq!(token_in_url.len(), 1, "{token_in_url:#?}");
    assert!(!token_in_url[0].contains("xoxb-1"), "{token_in_url:#?}");
    let foreign = problems(slack(vec![("token", env("T"))]));
    assert_eq!(
        foreign,
        vec![
            "channels/ops.lua:2: token: token is for discord and telegram channels, not slack\n  \
             fix: remove it; a slack channel takes app_token = env \"SLACK_APP_TOKEN\", bot_token = env \"SLACK_BOT_TOKEN\""
        ]
    );
}
