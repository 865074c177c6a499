//! Channel files: checks at load, secrets across files, hooks, `perch channel add`, `info`.

use super::support::{new_agent, perch, stderr, stdout, write};
use perch::agent::{self, AgentDir, LoadedAgent, LoadedChannel};
use perch::channel::hooks::{ChannelHooks, HookItem, HookVerdict, message_input};
use perch::channel::{InboundEvent, Sender};
use perch_core::name::LaneName;
use serde_json::json;
use std::path::Path;

fn load(dir: &Path) -> Result<LoadedAgent, Vec<String>> {
    agent::load(&AgentDir::open(dir).unwrap())
        .map_err(|problems| problems.iter().map(ToString::to_string).collect())
}

fn problems_with(file: &str, text: &str) -> Vec<String> {
    let dir = new_agent();
    write(dir.path(), file, text);
    load(dir.path()).err().unwrap_or_default()
}

const TELEGRAM: &str = "channel {\n  kind = \"telegram\",\n  token = env \"TG_TOKEN\",\n}\n";

#[test]
fn channel_files_load_with_their_settings() {
    let dir = new_agent();
    write(dir.path(), "channels/ops.lua", TELEGRAM);
    write(
        dir.path(),
        "channels/team.lua",
        "channel {\n  kind = \"discord\",\n  token = env \"DC_TOKEN\",\n  rooms = { standup = \"123\" },\n  \
         allow = { users = { \"42\" }, rooms = { \"standup\" } },\n  busy = \"collect\",\n}\n",
    );
    write(dir.path(), "channels/README.md", "not a channel\n");
    let agent = load(dir.path()).unwrap();
    let names: Vec<&str> = agent
        .channels
        .iter()
        .map(|channel| channel.config.name.as_str())
        .collect();
    assert_eq!(names, vec!["ops", "team"]);
    assert_eq!(agent.channels[1].file, "channels/team.lua");
    assert_eq!(agent.channels[1].config.rooms.len(), 1);

    std::fs::remove_dir_all(dir.path().join("channels")).unwrap();
    assert!(load(dir.path()).unwrap().channels.is_empty());
}

#[test]
fn channel_problems_name_file_line_and_key() {
    let found = problems_with(
        "channels/ops.lua",
        "-- the ops chat\n\nchannel {\n  kind = \"telegram\",\n  tokn = env \"TG_TOKEN\",\n  dm = \"open\",\n}\n",
    );
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:3: missing token\n  fix: add it: token = env \"TELEGRAM_TOKEN\"",
            "channels/ops.lua:5: tokn: unknown key\n  fix: did you mean token? known keys: kind, rooms, \
             allow, dm, groups, busy, collect_window, max_age, queue_limit, allow_bots, bot_turns, \
             on_message, format, token, api_url, threads",
            "channels/ops.lua:6: dm: unknown dm policy \"open\"\n  fix: use one of pair, allow, refuse",
        ]
    );
    let found = problems_with(
        "channels/ops.lua",
        "channel {\n  kind = \"matrix\",\n  homeserver = \"https://m.example\",\n  user = \"@a:m.example\",\n  \
         password = env \"P\",\n  store_passphrase = env \"S\",\n  allow = { rooms = { \"team\" } },\n}\n",
    );
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:7: allow.rooms[1]: \"team\" is not a room declared under rooms\n  \
             fix: declare it first: rooms = { team = \"<platform room id>\" }"
        ]
    );
    let found = problems_with(
        "channels/ops.lua",
        "channel {\n  kind = \"irc\" }\nchannel {}\n",
    );
    assert_eq!(
        found,
        vec![
            "channels/ops.lua:3: channel is called again (first call on line 1)\n  fix: keep one channel { ... } call"
        ]
    );
    let found = problems_with("channels/ops.lua", "\n\nlocal x = nil + 1\n");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("channels/ops.lua:3: "), "{}", found[0]);
}

#[test]
fn a_literal_token_is_refused_and_never_shown() {
    let token = "123456789:AAHliteralTelegramTokenValue";
    let dir = new_agent();
    write(
        dir.path(),
        "channels/ops.lua",
        &format!("channel {{\n  kind = \"telegram\",\n  token = \"{token}\",\n}}\n"),
    );
    let output = perch(&["info", dir.path().to_str().unwrap()], &[]);
    assert!(!output.status.success());
    let shown = stderr(&output);
    assert!(
        shown.contains(
            "error: channels/ops.lua:3: token: a literal token is not allowed in a channel file (value not shown)\n  \
             fix: keep it in the service's environment and reference it: token = env \"NAME\""
        ),
        "{shown}"
    );
    assert!(!shown.contains("AAHliteral"), "{shown}");
    assert!(!stdout(&output).contains("AAHliteral"));
}

#[test]
fn a_channel_credential_cannot_be_a_sandbox_secret() {
    let dir = new_agent();
    write(dir.path(), "channels/ops.lua", TELEGRAM);
    write(
        dir.path(),
        "channels/second.lua",
        "channel { kind = \"telegram\", token = env \"TG_TOKEN\" }\n",
    );
    assert!(
        load(dir.path()).is_ok(),
        "two channels may share a variable"
    );
    write(
        dir.path(),
        "sandbox.lua",
        "sandbox {\n  allow = { \"api.telegram.org\" },\n  secrets = {\n    \
         { env = \"BOT\", source = env \"TG_TOKEN\", hosts = { \"api.telegram.org\" } },\n  },\n}\n",
    );
    let found = load(dir.path()).unwrap_err();
    let expected = |file: &str, line: u32| {
        format!(
            "{file}:{line}: token: TG_TOKEN is also a secret source in sandbox.lua (secrets[1]), so the \
             sandbox could post to telegram directly, around the outbox and the access rules\n  \
             fix: remove that secret from sandbox.lua, or give the sandbox a credential of its own \
             in another variable than TG_TOKEN"
        )
    };
    assert_eq!(
        found,
        vec![
            expected("channels/ops.lua", 3),
            expected("channels/second.lua", 1)
        ]
    );
}

const HOOKS: &str = r#"local calls = 0

channel {
  kind = "telegram",
  token = env "TG_TOKEN",
  rooms = { team = "-100" },
  on_message = function(msg, store)
    calls = calls + 1
    store.set("seen", (store.get("seen") or 0) + 1)
    store.set("last", { text = msg.text, alias = msg.alias, channel = msg.channel })
    if msg.text == "drop" then return nil end
    if msg.text == "number" then return 42 end
    if msg.text == "untexted" then return { lane = "x" } end
    if msg.text == "bad lane" then return { text = "x", lane = "../etc" } elseif msg.text == "heartbeat lane" then return { text = "x", lane = "heartbeat-digest" } end
    if msg.text == "boom" then
      error("boom")
    end
    if msg.text == "loop" then
      while true do end
    end
    if msg.text == "fill" then
      store.set("big", string.rep("x", 2 * 1024 * 1024))
    end
    if msg.text == "forget" then store.delete("last") end
    if msg.text:sub(1, 9) == "!standup " then
      return { text = msg.text:sub(10), lane = "standup" }
    end
    msg.text = msg.text:upper()
    return msg
  end,
  format = function(reply, store)
    if reply == "nil" then return nil end
    return "[" .. (store.get("seen") or 0) .. "] " .. reply
  end,
}
"#;

fn hooked_agent() -> (tempfile::TempDir, LoadedAgent) {
    let dir = new_agent();
    write(dir.path(), "channels/ops.lua", HOOKS);
    let agent = load(dir.path()).unwrap_or_else(|problems| panic!("{problems:#?}"));
    (dir, agent)
}

fn hooks(agent: &LoadedAgent) -> ChannelHooks {
    ChannelHooks::open(&agent.dir, &agent.channels[0]).unwrap()
}

fn event(text: &str) -> InboundEvent {
    InboundEvent {
        platform_id: "-100:7".into(),
        cursor: None,
        room: "-100".into(),
        thread: None,
        sender: Sender {
            id: "42".into(),
            name: "Ann".into(),
            is_bot: false,
        },
        direct: false,
        addressed: true,
        text: text.into(),
        sent_at: "2026-01-02T03:04:05Z".parse().unwrap(),
        attachments: Vec::new(),
        replying_to: None,
        edit_of: None,
        refused: None,
    }
}

async fn on_message(hooks: &mut ChannelHooks, channel: &LoadedChannel, text: &str) -> HookVerdict {
    hooks
        .run_on_message(&message_input(&channel.config, &event(text)))
        .await
}

fn item(text: &str, lane: Option<&str>) -> HookVerdict {
    HookVerdict::Item(HookItem {
        text: text.into(),
        lane: lane.map(|lane| LaneName::try_from(lane).unwrap()),
    })
}

fn error(verdict: HookVerdict) -> String {
    match verdict {
        HookVerdict::Error(error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn on_message_rewrites_reroutes_and_drops() {
    let (_dir, agent) = hooked_agent();
    let channel = &agent.channels[0];
    let mut hooks = hooks(&agent);
    assert_eq!(
        on_message(&mut hooks, channel, "hello").await,
        item("HELLO", None)
    );
    assert_eq!(
        hooks.store().get("last"),
        Some(&json!({ "text": "hello", "alias": "team", "channel": "ops" }))
    );
    assert_eq!(
        on_message(&mut hooks, channel, "!standup done").await,
        item("done", Some("standup"))
    );
    assert_eq!(
        on_message(&mut hooks, channel, "drop").await,
        HookVerdict::Drop
    );
    assert_eq!(hooks.store().get("seen"), Some(&json!(3)));
    assert_eq!(
        hooks.run_format("hi").await,
        Ok("[3] hi".to_owned()),
        "format sees the store"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hook_failures_are_errors_that_name_the_file() {
    let (_dir, agent) = hooked_agent();
    let channel = &agent.channels[0];
    let mut hooks = hooks(&agent);
    assert_eq!(
        error(on_message(&mut hooks, channel, "number").await),
        "channels/ops.lua: on_message must return a table with a string text (and optionally a \
         string lane), or nil to drop the message, but it returned a number (42)"
    );
    assert_eq!(
        error(on_message(&mut hooks, channel, "untexted").await),
        "channels/ops.lua: on_message must return a table with a string text (and optionally a \
         string lane), or nil to drop the message, but it returned a table with no text"
    );
    let bad_lane = error(on_message(&mut hooks, channel, "bad lane").await);
    assert!(
        bad_lane.starts_with(
            "channels/ops.lua: on_message returned the lane \"../etc\", which is not a lane name"
        ),
        "{bad_lane}"
    );
    assert_eq!(
        error(on_message(&mut hooks, channel, "heartbeat lane").await),
        "channels/ops.lua: on_message returned the lane heartbeat-digest, which belongs to the \
         heartbeat task digest; a message can go only to a conversation's lane"
    );
    assert_eq!(
        error(on_message(&mut hooks, channel, "boom").await),
        "channels/ops.lua:16: boom"
    );
    let started = std::time::Instant::now();
    // Whichever comes first on this machine: the instruction count or the hook's 2 s.
    let stopped = error(on_message(&mut hooks, channel, "loop").await);
    assert!(
        stopped
            == "channels/ops.lua:19: stopped after 10000000 Lua instructions (an endless loop?)"
            || stopped
                == "channels/ops.lua:19: stopped after running for 2 s (an endless loop, or work \
                    too slow for Lua?)",
        "{stopped}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let full = error(on_message(&mut hooks, channel, "fill").await);
    assert!(
        full.starts_with("channels/ops.lua:22: store.set: the store would hold more than 1 MiB"),
        "{full}"
    );
    assert_eq!(
        hooks.run_format("nil").await,
        Err("channels/ops.lua: format must return a string, but it returned nil".to_owned())
    );
    assert_eq!(
        hooks.store().get("seen"),
        None,
        "a failed call keeps none of its changes"
    );
    assert_eq!(
        on_message(&mut hooks, channel, "still works").await,
        item("STILL WORKS", None),
        "the state is usable after an error and a runaway loop"
    );
    assert_eq!(hooks.store().get("seen"), Some(&json!(1)));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_persists_across_a_reload() {
    let (dir, agent) = hooked_agent();
    let channel = &agent.channels[0];
    let mut first = hooks(&agent);
    on_message(&mut first, channel, "one").await;
    on_message(&mut first, channel, "two").await;
    on_message(&mut first, channel, "forget").await;
    let path = agent.dir.channel_store_file(channel.config.name.as_str());
    assert_eq!(path, dir.path().join(".perch/channels/ops/store.json"));
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved, json!({ "seen": 3 }));
    assert!(!path.with_extension("json.tmp").exists());
    drop((first, agent));

    let agent = load(dir.path()).unwrap();
    let channel = &agent.channels[0];
    let mut second = hooks(&agent);
    assert_eq!(second.store().get("seen"), Some(&json!(3)));
    on_message(&mut second, channel, "three").await;
    assert_eq!(second.store().get("seen"), Some(&json!(4)));

    std::fs::write(&path, "[1, 2]").unwrap();
    let refused = ChannelHooks::open(&agent.dir, channel).unwrap_err();
    assert!(refused.contains("is not a JSON object"), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_hooks_the_item_is_the_text() {
    let dir = new_agent();
    write(dir.path(), "channels/ops.lua", TELEGRAM);
    let agent = load(dir.path()).unwrap();
    let channel = &agent.channels[0];
    let mut hooks = hooks(&agent);
    let input = message_input(&channel.config, &event("as is"));
    assert_eq!(input["alias"], json!(null));
    assert_eq!(input["channel"], json!("ops"));
    assert_eq!(input["sender"]["name"], json!("Ann"));
    assert_eq!(hooks.run_on_message(&input).await, item("as is", None));
    assert_eq!(hooks.run_format("reply").await, Ok("reply".to_owned()));
    assert!(
        !agent
            .dir
            .channel_store_file(channel.config.name.as_str())
            .exists()
    );
}

#[test]
fn perch_channel_add_writes_a_stock_adapter_once() {
    let dir = new_agent();
    let root = dir.path().to_str().unwrap();
    let output = perch(&["channel", "add", "telegram", root], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    let path = dir
        .path()
        .canonicalize()
        .unwrap()
        .join("channels/telegram.lua");
    assert!(
        shown.starts_with(&format!(
            "created {} (channel telegram, telegram)\n\nset in the service's environment:\n  \
             TELEGRAM_TOKEN           token\n",
            path.display()
        )),
        "{shown}"
    );
    assert!(
        shown.ends_with(&format!(
            "\nnext: cd {root}; export TELEGRAM_TOKEN=…; perch doctor --online; perch run\n"
        )),
        "channel add ends with the commands to type next: {shown}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        agent::stock_channel(perch_core::config::ChannelKind::Telegram)
    );

    std::fs::write(&path, "-- mine\n").unwrap();
    let output = perch(&["channel", "add", "telegram", root], &[]);
    assert!(!output.status.success());
    assert!(
        stderr(&output)
            .contains("channels/telegram.lua already exists, and perch never overwrites a file"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "-- mine\n");
    std::fs::remove_file(&path).unwrap();

    let output = perch(&["channel", "add", "matrix", root, "--name", "team"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    assert!(
        shown.contains("  MATRIX_PASSWORD          password\n"),
        "{shown}"
    );
    assert!(
        shown.contains("  MATRIX_STORE_PASSPHRASE  store_passphrase\n"),
        "{shown}"
    );
    assert!(shown.contains("set homeserver and user"), "{shown}");
    assert!(dir.path().join("channels/team.lua").is_file());
    assert_eq!(load(dir.path()).unwrap().channels.len(), 1);

    let output = perch(&["channel", "add", "slack", root], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    assert!(
        shown.contains(
            "  SLACK_APP_TOKEN          app_token
  SLACK_BOT_TOKEN          bot_token
"
        ),
        "{shown}"
    );
    assert!(
        shown.ends_with(&format!(
            "\nnext: cd {root}; export SLACK_APP_TOKEN=…; export SLACK_BOT_TOKEN=…; perch doctor --online; perch run\n"
        )),
        "{shown}"
    );
    let info: serde_json::Value =
        serde_json::from_str(&stdout(&perch(&["info", "--json", root], &[]))).unwrap();
    let slack = info["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|channel| channel["kind"] == "slack")
        .unwrap_or_else(|| panic!("no slack channel in {info}"));
    assert_eq!(slack["credentials"]["app_token"], "SLACK_APP_TOKEN");
    assert_eq!(slack["credentials"]["bot_token"], "SLACK_BOT_TOKEN");
    std::fs::remove_file(dir.path().join("channels/slack.lua")).unwrap();

    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("discord.lua"),
        dir.path().join("channels/discord.lua"),
    )
    .unwrap();
    let output = perch(&["channel", "add", "discord", root], &[]);
    assert!(!output.status.success());
    assert!(!outside.path().join("discord.lua").exists());

    for (args, expected) in [
        (
            vec!["channel", "add", "irc", root],
            "unknown channel kind \"irc\"",
        ),
        (
            vec!["channel", "add", "discord", root, "--name", "a/b"],
            "--name: ",
        ),
        (
            vec!["channel", "add", "discord", root, "--name", "terminal"],
            "the channel name terminal belongs to `perch chat`",
        ),
    ] {
        let output = perch(&args, &[]);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            stderr(&output).contains(expected),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    assert!(!dir.path().join("channels/terminal.lua").exists());

    let plain = tempfile::tempdir().unwrap();
    let output = perch(
        &["channel", "add", "discord", plain.path().to_str().unwrap()],
        &[],
    );
    assert!(!output.status.success());
    assert!(stderr(&output).contains("is not a perch agent directory"));
}

#[test]
fn perch_info_shows_channels_by_variable_names_only() {
    let dir = new_agent();
    let root = dir.path().to_str().unwrap();
    write(
        dir.path(),
        "channels/ops.lua",
        "channel {\n  kind = \"telegram\",\n  token = env \"TG_TOKEN\",\n  rooms = { team = \"-100\", alerts = \"-200\" },\n  \
         busy = \"collect\",\n  format = function(reply) return reply end,\n}\n",
    );
    let value = "987654:secret-token-value";
    let output = perch(
        &["info", root],
        &[("TG_TOKEN", value), ("OPENAI_API_KEY", "sk-test")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stdout(&output);
    assert!(
        shown.contains(
            "channels   ops  telegram, rooms alerts, team; dm pair, groups mention, busy collect 3 s; \
             token from $TG_TOKEN; hooks format\n"
        ),
        "{shown}"
    );
    assert!(!shown.contains(value));

    let output = perch(&["info", root, "--json"], &[("TG_TOKEN", value)]);
    let shown = stdout(&output);
    assert!(!shown.contains(value));
    let info: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        info["channels"],
        json!([{
            "name": "ops",
            "file": "channels/ops.lua",
            "kind": "telegram",
            "credentials": { "token": "TG_TOKEN" },
            "homeserver": null,
            "user": null,
            "api_url": null,
            "rooms": { "alerts": "-200", "team": "-100" },
            "allow": { "users": [], "rooms": [] },
            "dm": "pair",
            "groups": "mention",
            "busy": "collect",
            "collect_window_seconds": 3,
            "threads": "own",
            "max_age_seconds": 3600,
            "queue_limit": 20,
            "allow_bots": [],
            "bot_turns": 3,
            "hooks": ["format"],
        }])
    );

    let fresh = new_agent();
    let shown = stdout(&perch(&["info", fresh.path().to_str().unwrap()], &[]));
    assert!(shown.contains("channels   (none)\n"), "{shown}");
}
