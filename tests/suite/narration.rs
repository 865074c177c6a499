//! What `perch run` tells its operator on stderr: connected, ready, answered, refused, pairing,
//! heartbeats, deliveries that failed, nothing that can reach the agent; `-q` and `-v`; the
//! journal's priority prefixes and a terminal's time and colour.

use super::support::fake_model::Script;
use super::support::fake_telegram::{BOT_USERNAME, Chat, Failure, User};
use super::support::scenario::{Agent, Perch, Scenario, Watched, alice};
use super::support::stderr;
use super::support::wait::wait_until;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::process::Stdio;
use std::time::Duration;

/// The group `-100`, aliased `team`, where the bot answers; Bob (43) may write directly;
/// strangers are offered pairing.
const CHANNEL: &str = "rooms = { team = \"-100\" }, allow = { users = { \"43\" }, rooms = { \"team\" } }, dm = \"pair\"";

fn bob() -> User {
    User::human(43, "Bob")
}

/// Waits until a line `perch run` wrote contains `part`; that line.
fn line_with(watched: &Watched, part: &str) -> String {
    let mut found = None;
    wait_until(&format!("a line with {part:?}"), || {
        found = watched.lines().into_iter().find(|line| line.contains(part));
        found.is_some()
    });
    found.unwrap_or_default()
}

fn lines_with(lines: &[String], part: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|line| line.contains(part))
        .cloned()
        .collect()
}

#[test]
fn perch_run_narrates_connected_ready_answered_refused_and_pairing() {
    let agent = Scenario::telegram(CHANNEL).build();
    let telegram = agent.telegram();
    agent.model.push(Script::text("hello Bob"));
    let watched = Watched::spawn(agent.command());
    line_with(&watched, &format!("tg: connected as @{BOT_USERNAME}"));
    line_with(
        &watched,
        "ready: 1 channel (tg), 0 heartbeat tasks, model fake/m1",
    );

    agent.send(&alice(), "please let me in, my word is swordfish");
    agent.wait_for_replies(1);
    let offer = telegram.sent()[0].shown.clone();
    let code = offer
        .split("perch pair approve ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("a code in {offer:?}"))
        .to_owned();
    let pairing = line_with(&watched, "pairing requested by Alice (42)");
    assert!(
        pairing.contains(&format!("code {code}")) && pairing.contains("perch pair approve"),
        "{pairing}"
    );

    let stranger = User::human(77, "Eve");
    telegram.push_message(
        &Chat::group(-200, "Elsewhere"),
        &stranger,
        &format!("@{BOT_USERNAME} the launch code is hunter2"),
    );
    let refused = line_with(&watched, "refused a message from 77 in room -200");
    assert!(
        refused.contains("the room is not in allow.rooms")
            && refused
                .contains("fix: channels/tg.lua: rooms (name it: team = \"-200\") and allow.rooms"),
        "{refused}"
    );

    agent.send(&bob(), "what is the weather, secretly?");
    agent.wait_for_replies(2);
    let answered = line_with(&watched, "tg: answered in lane tg-43-");
    assert!(
        answered.contains(" after ") && answered.ends_with(" s"),
        "{answered}"
    );

    let lines = watched.stop();
    let all = lines.join("\n");
    for text in ["swordfish", "hunter2", "secretly", "hello Bob"] {
        assert!(!all.contains(text), "no message text is narrated: {all}");
    }
    assert!(
        lines
            .iter()
            .all(|line| !line.starts_with("tg: a message from")
                && !line.starts_with("tg: delivered to")),
        "the detail lines wait for -v: {all}"
    );
}

#[test]
fn a_discord_channel_is_narrated_connected_as_the_bot_discord_named() {
    let agent = Scenario::discord("dm = \"allow\"").build();
    let watched = Watched::spawn(agent.command());
    line_with(&watched, "dc: connected as perch-bot");
    line_with(&watched, "ready: 1 channel (dc)");
    watched.stop();
}

#[test]
fn a_flood_of_refused_messages_from_one_room_is_one_line_then_a_count() {
    let agent = Scenario::telegram(CHANNEL).build();
    let telegram = agent.telegram();
    agent.model.push(Script::text("still here"));
    let watched = Watched::spawn(agent.command());
    line_with(&watched, "ready: ");
    let stranger = User::human(77, "Eve");
    for n in 0..100 {
        telegram.push_message(
            &Chat::group(-200, "Elsewhere"),
            &stranger,
            &format!("spam {n}"),
        );
    }
    // Intake decides in arrival order: once Bob is answered, all 100 were refused.
    agent.send(&bob(), "hi");
    agent.wait_for_replies(1);
    let lines = watched.stop();
    let refusals = lines_with(&lines, "in room -200");
    assert_eq!(
        refusals.len(),
        2,
        "one line, then the count at shutdown: {refusals:#?}"
    );
    assert!(
        refusals[0].contains("refused a message from 77 in room -200"),
        "{refusals:#?}"
    );
    assert!(
        refusals[1].starts_with("tg: 99 more messages refused in room -200 in "),
        "{refusals:#?}"
    );
}

#[test]
fn a_heartbeat_firing_and_its_verdict_are_narrated() {
    let agent = Scenario::telegram(CHANNEL).build();
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the digest.\n    every: 5m\n    delivery: tg:team\n",
    );
    agent
        .model
        .push(Script::text("Message: the private digest text"));
    let watched = Watched::spawn(agent.command());
    line_with(&watched, "1 heartbeat task,");
    // Slots of `every` fall on multiples of the interval: run it now, through the service.
    let ran = agent.perch(&["heartbeat", "run", "digest"]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    line_with(&watched, "heartbeat digest: firing (slot ");
    line_with(&watched, "heartbeat digest: verdict Message, to tg:team");
    let all = watched.stop().join("\n");
    assert!(!all.contains("private digest text"), "{all}");
}

#[test]
fn a_reply_not_delivered_and_one_of_unknown_fate_are_narrated() {
    let agent = Scenario::telegram_dm().build();
    let telegram = agent.telegram();
    agent.model.push(Script::text("refused reply"));
    agent.model.push(Script::text("unknown reply"));
    telegram.fail_next(
        "sendMessage",
        Failure::Api {
            code: 400,
            description: "Bad Request: chat not found".into(),
        },
    );
    let watched = Watched::spawn(agent.command());
    agent.send(&alice(), "first");
    let not_sent = line_with(&watched, "tg: a reply to room 42 was not delivered: ");
    assert!(not_sent.starts_with("warning: "), "{not_sent}");
    assert!(not_sent.contains("chat not found"), "{not_sent}");
    telegram.fail_next(
        "sendMessage",
        Failure::Api {
            code: 400,
            description: "Bad Request: something teloxide does not know".into(),
        },
    );
    agent.send(&alice(), "second");
    let unknown = line_with(
        &watched,
        "tg: a reply to room 42 may or may not have been posted",
    );
    assert!(unknown.starts_with("warning: "), "{unknown}");
    watched.stop();
}

/// An agent with no channel and no heartbeat task.
fn unreachable_agent() -> Agent {
    let agent = Scenario::telegram_dm().build();
    std::fs::remove_file(agent.path().join("channels/tg.lua")).unwrap();
    agent
}

const UNREACHABLE: &str =
    "warning: nothing can reach the agent: no channel in channels/ and no task in HEARTBEAT.yml";

#[test]
fn an_agent_nothing_can_reach_is_warned_about() {
    let agent = unreachable_agent();
    let watched = Watched::spawn(agent.command());
    line_with(&watched, UNREACHABLE);
    let lines = watched.stop();
    assert_eq!(
        lines_with(&lines, "ready: no channels, 0 heartbeat tasks").len(),
        1
    );
}

#[test]
fn quiet_narrates_only_warnings_and_errors() {
    let agent = unreachable_agent();
    let mut command = agent.command();
    command.arg("-q");
    let watched = Watched::spawn(command);
    line_with(&watched, UNREACHABLE);
    agent.wait_for_service();
    let lines = watched.stop();
    assert!(lines_with(&lines, "ready: ").is_empty(), "{lines:#?}");
}

#[test]
fn verbose_also_narrates_each_message_taken_in_and_each_reply_delivered() {
    let agent = Scenario::telegram_dm().build();
    agent.model.push(Script::text("hi"));
    let mut command = agent.command();
    command.arg("-v");
    let watched = Watched::spawn(command);
    agent.send(&alice(), "hello");
    line_with(&watched, "tg: a message from 42 in room 42");
    line_with(&watched, "tg: delivered to room 42");
    line_with(&watched, "tg: answered in lane ");
    watched.stop();
}

#[test]
fn under_the_journal_lines_carry_their_priority_and_no_time() {
    let agent = unreachable_agent();
    let log = tempfile::NamedTempFile::new().unwrap();
    let meta = log.as_file().metadata().unwrap();
    let mut command = agent.command();
    command
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(Stdio::from(log.reopen().unwrap()));
    let service = Perch::spawn(command);
    let read = || std::fs::read_to_string(log.path()).unwrap();
    wait_until("the warning", || read().contains("nothing can reach"));
    service.stop();
    let text = read();
    let ready = text
        .lines()
        .find(|line| line.contains("ready: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(ready.starts_with("<6>ready: no channels"), "{text}");
    assert!(
        text.lines()
            .any(|line| line.starts_with(&format!("<4>{UNREACHABLE}"))),
        "{text}"
    );

    let elsewhere = tempfile::NamedTempFile::new().unwrap();
    let mut command = agent.command();
    command
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(Stdio::from(elsewhere.reopen().unwrap()));
    let service = Perch::spawn(command);
    let read = || std::fs::read_to_string(elsewhere.path()).unwrap();
    wait_until("the warning", || read().contains("nothing can reach"));
    service.stop();
    assert!(
        read().lines().any(|line| line.starts_with(UNREACHABLE)),
        "a JOURNAL_STREAM naming another file is not stderr's: {}",
        read()
    );
}

/// `perch run` with its stderr on a terminal (a pseudo-terminal the test reads), until the
/// unreachable warning; every line it wrote there.
fn on_a_terminal(agent: &Agent, no_color: bool) -> Vec<String> {
    use nix::pty::{Winsize, openpty};
    use nix::sys::termios::Termios;
    let pty = openpty(None::<&Winsize>, None::<&Termios>).unwrap();
    let mut command = agent.command();
    command.stderr(Stdio::from(pty.slave));
    if no_color {
        command.env("NO_COLOR", "1");
    }
    let service = Perch::spawn(command);
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let text = std::sync::Arc::clone(&text);
        let mut master = std::fs::File::from(pty.master);
        std::thread::spawn(move || {
            let mut buffer = [0_u8; 4096];
            // The master reads EIO once the child, the last holder of the slave, exits.
            while let Ok(read) = master.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                text.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..read]));
            }
        })
    };
    wait_until("the warning", || {
        text.lock().unwrap().contains("nothing can reach")
    });
    service.terminate();
    let output = service.wait_within(Duration::from_secs(60), "perch run after SIGTERM");
    assert!(output.status.success(), "{}", stderr(&output));
    reader.join().unwrap();
    let text = text.lock().unwrap().clone();
    text.lines()
        .map(|line| line.trim_end_matches('\r').to_owned())
        .collect()
}

/// Whether `line` starts with a local time, `HH:MM:SS `.
fn timed(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 9
        && bytes[..8].iter().enumerate().all(|(index, byte)| {
            if index % 3 == 2 {
                *byte == b':'
            } else {
                byte.is_ascii_digit()
            }
        })
        && bytes[8] == b' '
}

#[test]
fn on_a_terminal_lines_carry_the_local_time_and_colour_unless_no_color() {
    let agent = unreachable_agent();
    let plain = on_a_terminal(&agent, true);
    let warning = plain
        .iter()
        .find(|line| line.contains("nothing can reach"))
        .unwrap();
    assert!(timed(warning), "{warning:?}");
    assert!(warning[9..].starts_with(UNREACHABLE), "{warning:?}");
    assert!(
        plain.iter().all(|line| !line.contains('\x1b')),
        "no colour with NO_COLOR: {plain:#?}"
    );

    let coloured = on_a_terminal(&agent, false);
    let warning = coloured
        .iter()
        .find(|line| line.contains("nothing can reach"))
        .unwrap();
    assert!(
        warning.starts_with("\x1b[2m") && warning.contains("\x1b[33mwarning: nothing can reach"),
        "{warning:?}"
    );
}
