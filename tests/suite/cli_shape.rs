//! One command-line shape: `-C DIR` on every command, did-you-mean for a mistyped subcommand
//! and a misspelt Lua declaration, one-line summaries in `--help`, `doctor --json`, snake_case
//! keys in every `--json` perch defines, and `perch status` as `systemctl status` reads it,
//! exiting 3 when perch is not running.

use super::support::fake_model::Script;
use super::support::scenario::{Agent, Perch, Scenario, alice};
use super::support::status::Report;
use super::support::status::without_ages;
use super::support::wait::wait_until;
use super::support::{new_agent, perch, stderr, stdout, write};
use std::os::unix::fs::MetadataExt;
use std::process::{Output, Stdio};

/// The subcommands `help` lists, in its order.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn succeeded(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {:?}\n{}{}",
        output.status,
        stdout(output),
        stderr(output)
    );
    stdout(output)
}

/// A Telegram agent on the fakes, and a directory that is not an agent's to run commands from.
fn agent_and_elsewhere() -> (Agent, tempfile::TempDir) {
    (
        Scenario::telegram_dm().build(),
        tempfile::tempdir().unwrap(),
    )
}

#[test]
fn every_command_takes_the_agent_directory_as_dash_c() {
    let (agent, elsewhere) = agent_and_elsewhere();
    let away = elsewhere.path();
    let dir = agent.arg();
    let root = std::fs::canonicalize(agent.path()).unwrap();
    let commands = subcommands(&stdout(&perch(&["--help"], &[])));
    assert!(commands.len() >= 14, "{commands:?}");
    for command in &commands {
        let run = |args: &[&str]| agent.perch_from(away, args, &[]);
        match command.as_str() {
            "init" => {
                let fresh = away.join("fresh");
                succeeded(&run(&["init", "-C", fresh.to_str().unwrap()]), "init");
                assert!(fresh.join("agent.lua").is_file());
            }
            "info" => {
                let text = succeeded(&run(&["info", "-C", dir]), "info");
                assert!(
                    text.contains(&format!("root       {}\n", root.display())),
                    "{text}"
                );
            }
            "doctor" => {
                let json: serde_json::Value =
                    serde_json::from_str(&stdout(&run(&["doctor", "-C", dir, "--json"]))).unwrap();
                let agent_checked = json["checks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|check| check["name"] == "env");
                assert!(agent_checked, "the agent was checked: {json}");
            }
            // perch's own image belongs to no agent: -C is taken and not needed.
            "image" => {}
            "exec" => {
                let said = succeeded(&run(&["exec", "-C", dir, "--", "pwd"]), "exec");
                assert_eq!(said, "/workspace\n");
            }
            "run" => {
                let mut command = agent.command_from(away, &["run", "-C", dir], &[]);
                command.stdout(Stdio::null()).stderr(Stdio::piped());
                let service = Perch::spawn(command);
                agent.wait_for_service();
                service.stop();
            }
            "status" => {
                let output = run(&["status", "-C", dir]);
                assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
                assert!(stdout(&output).contains("channels           tg (telegram)\n"));
            }
            "log" => {
                succeeded(&run(&["chat", "-C", dir]), "chat, for a lane to list");
                let lanes = succeeded(&run(&["log", "-C", dir, "--lanes"]), "log --lanes");
                assert!(lanes.contains("\nterminal "), "{lanes}");
                succeeded(&run(&["log", "-C", dir, "tg"]), "log -C DIR CHANNEL");
            }
            "pair" => {
                let text = succeeded(&run(&["pair", "list", "-C", dir]), "pair list");
                assert_eq!(text, "pending requests: 0\napproved senders: 0\n");
            }
            "chat" => {
                succeeded(&run(&["chat", "-C", dir]), "chat");
                assert!(agent.path().join(".perch/sessions").is_dir());
            }
            "compact" => {
                agent.model.push(Script::text("nothing was said"));
                succeeded(&run(&["compact", "-C", dir]), "compact");
            }
            "tool" => {
                let listed = succeeded(&run(&["tool", "-C", dir]), "tool");
                assert!(listed.contains("workspace_summary  "), "{listed}");
                let from_inside =
                    agent.perch_from(agent.path(), &["tool", "workspace_summary"], &[]);
                succeeded(&from_inside, "a lone tool name, from the agent directory");
                let lost = run(&["tool", "workspace_summary"]);
                assert!(
                    stderr(&lost)
                        .contains("fix: name the agent: perch tool -C DIR workspace_summary"),
                    "{}",
                    stderr(&lost)
                );
            }
            "channel" => {
                succeeded(
                    &run(&["channel", "add", "discord", "-C", dir]),
                    "channel add",
                );
                let added = agent.path().join("channels/discord.lua");
                assert!(added.is_file());
                std::fs::remove_file(added).unwrap();
            }
            "heartbeat" => {
                let text = succeeded(&run(&["heartbeat", "list", "-C", dir]), "heartbeat list");
                assert_eq!(text, "no heartbeat tasks\n");
            }
            "chown" => {
                // Giving the tree from its owner to its owner changes nothing and walks it all.
                let uid = std::fs::metadata(agent.path()).unwrap().uid().to_string();
                let said = succeeded(
                    &run(&["chown", "-C", dir, "--from", &uid, "--to", &uid]),
                    "chown",
                );
                assert!(said.starts_with("gave "), "{said}");
                assert!(said.contains(&format!(" under {dir} to {uid}")), "{said}");
            }
            other => panic!("perch {other}: no -C case here; add one"),
        }
    }
    let twice = agent.perch_from(away, &["status", "-C", dir, away.to_str().unwrap()], &[]);
    assert!(
        stderr(&twice).contains("two agent directories: -C "),
        "{}",
        stderr(&twice)
    );
    let agreeing = agent.perch_from(away, &["pair", "list", dir, "-C", dir], &[]);
    succeeded(&agreeing, "the same directory twice");
}

#[test]
fn a_mistyped_subcommand_is_answered_with_the_nearest_and_every_summary_is_one_line() {
    let said = stderr(&perch(&["stauts"], &[]));
    assert!(
        said.contains("a similar subcommand exists: 'status'"),
        "{said}"
    );
    let said = stderr(&perch(&["heartbeat", "lsit"], &[]));
    assert!(
        said.contains("a similar subcommand exists: 'list'"),
        "{said}"
    );

    let top = stdout(&perch(&["--help"], &[]));
    let mut helps = vec![("perch".to_owned(), top.clone())];
    for group in subcommands(&top) {
        let help = stdout(&perch(&[&group, "--help"], &[]));
        helps.push((group, help));
    }
    for (command, help) in &helps {
        let listed: Vec<&str> = help
            .lines()
            .skip_while(|line| *line != "Commands:")
            .skip(1)
            .take_while(|line| !line.is_empty())
            .collect();
        for line in listed {
            assert!(
                line.starts_with("  ") && !line.starts_with("   ") && line.len() <= 90,
                "perch {command} --help: not a one-line summary: {line:?}"
            );
        }
    }
}

#[test]
fn doctor_json_has_each_check_the_text_has_and_the_same_exit_status() {
    let (agent, elsewhere) = agent_and_elsewhere();
    let text = agent.perch_from(elsewhere.path(), &["doctor", "-C", agent.arg()], &[]);
    let json = agent.perch_from(
        elsewhere.path(),
        &["doctor", "-C", agent.arg(), "--json"],
        &[],
    );
    assert_eq!(text.status.code(), json.status.code());
    let report: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let checks = report["checks"].as_array().unwrap();
    let text = stdout(&text);
    let named: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    let in_json: Vec<&str> = checks
        .iter()
        .map(|check| check["name"].as_str().unwrap())
        .collect();
    assert_eq!(named, in_json, "{text}");
    let mut failures = 0;
    for check in checks {
        let state = check["state"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&state), "{check}");
        failures += usize::from(state == "fail");
        assert!(check["detail"].is_string(), "{check}");
        assert!(
            check["fix"].is_string() || check["fix"].is_null(),
            "{check}"
        );
    }
    assert_eq!(report["failures"], failures);
    assert_eq!(json.status.success(), failures == 0);
}

#[test]
fn a_misspelt_declaration_is_named_with_the_one_meant() {
    let dir = new_agent();
    write(
        dir.path(),
        "agent.lua",
        "agnet {\n  model = \"openai/gpt-5-mini\",\n}\n",
    );
    let output = perch(&["info", "-C", dir.path().to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains(
            "error: agent.lua:1: agnet is not a perch declaration\n  fix: did you mean agent?\n"
        ),
        "{}",
        stderr(&output)
    );
}

/// Keys from models.yml, which `perch info --json` echoes in the file's spelling.
const MODELS_YML_KEYS: &[&str] = &["baseUrl", "apiKey", "contextWindow", "maxTokens"];

/// Every key with an upper-case letter under `value`, as `path.key`; the maps of names the
/// operator chose (environment variables) and JSON Schemas are data, not perch's keys.
fn keys_not_snake_case(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                let here = format!("{path}.{key}");
                if key.chars().any(char::is_uppercase) && !MODELS_YML_KEYS.contains(&key.as_str()) {
                    found.push(here.clone());
                }
                if !matches!(here.as_str(), ".sandbox.env") && key != "parameters" {
                    keys_not_snake_case(inner, &here, found);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                keys_not_snake_case(item, &format!("{path}[]"), found);
            }
        }
        _ => {}
    }
}

/// Waits for a running agent to have answered Alice once.
fn answered_once(agent: &Agent) {
    agent.model.push(Script::text("hello"));
    agent.send(&alice(), "hi");
    agent.wait_for_a_reply();
}

#[test]
fn every_json_perch_defines_has_snake_case_keys_but_those_of_models_yml() {
    let agent = Scenario::telegram_dm().build();
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 1h\n",
    );
    agent.write(
        "sandbox.lua",
        "sandbox { env = { GIT_AUTHOR_NAME = \"perch\" } }\n",
    );
    let service = agent.start();
    answered_once(&agent);
    let dir = agent.arg();
    let mut printed = Vec::new();
    for args in [
        &["info", "--json"][..],
        &["status", "--json"],
        &["doctor", "--json"],
        &["heartbeat", "list", "--json"],
        &["pair", "list", "--json"],
        &["log", "--json"],
        &["log", "--lanes", "--json"],
        &["log", "--refused", "--json"],
    ] {
        let mut all = args.to_vec();
        all.extend(["-C", dir]);
        let output = agent.perch_from(agent.path(), &all, &[]);
        let text = stdout(&output);
        let none_refused = args.contains(&"--refused");
        assert!(
            none_refused || !text.trim().is_empty(),
            "{args:?}: {}",
            stderr(&output)
        );
        let values: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|error| panic!("{args:?}: {error}: {text}"));
        printed.push((args.join(" "), values));
    }
    service.stop();
    for (command, values) in &printed {
        let mut found = Vec::new();
        for value in values {
            keys_not_snake_case(value, "", &mut found);
        }
        assert_eq!(found, Vec::<String>::new(), "perch {command}");
    }
    let info = &printed[0].1[0];
    assert_eq!(info["provider"]["baseUrl"], agent.model.base_url());
    assert!(info["sandbox"]["memory_mib"].is_u64(), "{info}");
    assert_eq!(info["sandbox"]["workspace_disk_mib"], 4096, "{info}");
}

/// `perch status` of the running Telegram agent after one answer, in UTC, with its pid, when it
/// started, how long it has been up and how long ago each time was left out.
const RUNNING_GOLDEN: &str = "state              running since TIME, up UPTIME
pid                PID
channels           tg (telegram)
  tg               receiving; last event TIME (AGO)
inbox pending      0
vm                 stopped (boots on the next command; not booted since perch run started)
last start         TIME (AGO): 0 lanes recovered; outbox: nothing; inbox: nothing
spend today        SPEND
outbox pending     0
unknown deliveries 0
pairings pending   0
";

/// `text` with the running service's pid, start, uptime, every local time and the spend left
/// out.
fn normalised(text: &str) -> String {
    without_ages(text)
        .lines()
        .map(|line| {
            let (label, value) = line.split_at(line.len().min(19));
            let value = match label.trim_end() {
                "pid" => "PID".to_owned(),
                "spend today" => "SPEND".to_owned(),
                "state" => match value.split_once(", up ") {
                    Some((since, _)) => format!("{}, up UPTIME", without_times(since)),
                    None => value.to_owned(),
                },
                _ => without_times(value),
            };
            format!("{label}{value}\n")
        })
        .collect()
}

/// `text` with each `YYYY-MM-DD HH:MM:SS` written `TIME`.
fn without_times(text: &str) -> String {
    const SHAPE: &str = "0000-00-00 00:00:00";
    let fits = |window: &[u8]| {
        window
            .iter()
            .zip(SHAPE.bytes())
            .all(|(byte, shape)| match shape {
                b'0' => byte.is_ascii_digit(),
                other => *byte == other,
            })
    };
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes.len() - at >= SHAPE.len() && fits(&bytes[at..at + SHAPE.len()]) {
            out.push_str("TIME");
            at += SHAPE.len();
        } else {
            let ch = text[at..].chars().next().unwrap();
            out.push(ch);
            at += ch.len_utf8();
        }
    }
    out
}

#[test]
fn status_reads_like_systemctl_status_and_exits_3_once_perch_stopped() {
    let agent = Scenario::telegram_dm().build();
    let service = agent.start();
    answered_once(&agent);
    wait_until("the channel to be receiving and the inbox empty", || {
        let report = agent.status();
        report.connection() == "receiving" && report.inbox_pending == 0
    });
    let utc = [("TZ", "UTC")];
    let running = agent.perch_from(agent.path(), &["status"], &utc);
    assert_eq!(running.status.code(), Some(0), "{}", stderr(&running));
    let text = stdout(&running);
    assert_eq!(normalised(&text), RUNNING_GOLDEN, "{text}");
    let pid = text
        .lines()
        .find_map(|line| line.strip_prefix("pid"))
        .unwrap()
        .trim();
    assert_eq!(pid, service.id().to_string());
    for raw in ["{\"", "T0", "+00:00", "Never", "None"] {
        assert!(!text.contains(raw), "{raw:?} in:\n{text}");
    }
    service.stop();

    let stopped = agent.perch_from(agent.path(), &["status"], &utc);
    assert_eq!(stopped.status.code(), Some(3), "{}", stderr(&stopped));
    assert!(
        stdout(&stopped).starts_with(
            "state              stopped (no perch run answers on .perch/control.sock)\n\
             channels           tg (telegram)\n  tg               stopped; last event "
        ),
        "{}",
        stdout(&stopped)
    );
    let json = agent.perch_from(agent.path(), &["status", "--json"], &utc);
    assert_eq!(json.status.code(), Some(3), "{}", stderr(&json));
    let report = super::support::status::read(&stdout(&json));
    assert_eq!((report.state.as_str(), report.pid), ("stopped", None));
}
