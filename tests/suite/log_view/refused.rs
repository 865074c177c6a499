//! Refused messages through `perch run`, shown by `perch log --refused` and `perch status`: room
//! and sender ids, the reason and the fix; never the message's text, never a group line kept
//! as context; a chosen name's terminal escape and bidi control escaped.

use super::*;
use crate::suite::support::fake_model::Script;
use crate::suite::support::fake_telegram::{BOT_USERNAME, Chat, User};
use crate::suite::support::scenario::Perch;

/// The group `-100`, aliased `team`, where the bot answers when mentioned; Bob (43) may write
/// directly; other direct messages are refused.
const CHANNEL: &str = "rooms = { team = \"-100\" }, allow = { users = { \"43\" }, rooms = { \"team\" } }, dm = \"refuse\"";

/// What no rendering of a refusal may contain: the messages' text and the context line's sender.
const NEVER_SHOWN: [&str; 4] = ["hunter2", "swordfish", "only context", "Carol"];

/// A display name with a terminal escape and a right-to-left override.
const MALLORY: &str = "Mal\u{1b}[31mlory\u{202e}";

/// Runs the agent, sends it a mention from a group not in `allow.rooms`, a direct message from a
/// sender not in `allow.users`, an unaddressed line in the allowed group, and a message from
/// Bob, which is answered once the others are decided.
fn refused_through_perch_run() -> (Agent, Perch) {
    let agent = Scenario::telegram(CHANNEL).build();
    agent.model.push(Script::text("hello Bob"));
    let service = agent.start();
    let telegram = agent.telegram();
    telegram.push_message(
        &Chat::group(-200, "Elsewhere"),
        &User::human(77, "Eve"),
        &format!("@{BOT_USERNAME} the launch code is hunter2"),
    );
    agent.send(&User::human(88, MALLORY), "my password is swordfish");
    telegram.push_message(
        &Chat::group(-100, "Team"),
        &User::human(44, "Carol"),
        "this line is only context",
    );
    agent.send(&User::human(43, "Bob"), "hi");
    agent.wait_for_replies(1);
    (agent, service)
}

fn assert_nothing_unsafe_or_private(shown: &str) {
    for never in NEVER_SHOWN {
        assert!(!shown.contains(never), "{never:?} in\n{shown}");
    }
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "a raw escape or bidi control in\n{shown}"
    );
}

#[test]
fn refusals_show_in_perch_log_refused_with_ids_reason_and_fix() {
    let (agent, service) = refused_through_perch_run();
    let text = stdout(&agent.perch(&["log", "--refused"]));
    for expected in [
        "tg  room -200  from Eve (77)\n  refused: the room is not in allow.rooms and the sender \
         not in allow.users\n  fix: channels/tg.lua: rooms (name it: team = \"-200\") and \
         allow.rooms (add the name), or allow.users (add \"77\")\n",
        "tg  room 88  from Mal\\u{1b}[31mlory\\u{202e} (88)\n  refused: a direct message from a \
         sender not in allow.users\n  fix: channels/tg.lua: allow.users (add \"88\"), or dm = \
         \"pair\" to let strangers ask\n",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    assert_eq!(text.matches("  refused: ").count(), 2, "{text}");
    assert_nothing_unsafe_or_private(&text);

    let json = stdout(&agent.perch(&["log", "--refused", "--json"]));
    assert_nothing_unsafe_or_private(&json);
    assert!(json.contains(r"Mal\u001b[31mlory\u202e"), "{json}");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let fields = |line: &serde_json::Value| {
        ["room", "sender", "name", "kind", "fix"].map(|key| line[key].as_str().unwrap().to_owned())
    };
    assert_eq!(
        lines.iter().map(fields).collect::<Vec<_>>(),
        vec![
            [
                "-200".to_owned(),
                "77".to_owned(),
                "Eve".to_owned(),
                "room_not_allowed".to_owned(),
                "channels/tg.lua: rooms (name it: team = \"-200\") and allow.rooms (add the \
                 name), or allow.users (add \"77\")"
                    .to_owned(),
            ],
            [
                "88".to_owned(),
                "88".to_owned(),
                MALLORY.to_owned(),
                "direct_refused".to_owned(),
                "channels/tg.lua: allow.users (add \"88\"), or dm = \"pair\" to let strangers \
                 ask"
                .to_owned(),
            ],
        ]
    );
    assert_eq!(
        lines[0]["reason"],
        "the room is not in allow.rooms and the sender not in allow.users"
    );

    let only_eve = stdout(&agent.perch(&["log", "--refused", "tg:-200"]));
    assert!(
        only_eve.contains("from Eve (77)") && !only_eve.contains("(88)"),
        "{only_eve}"
    );
    let by_name = stdout(&agent.perch(&["log", "--refused", "--sender", "eve", "--json"]));
    assert_eq!(by_name.lines().count(), 1, "{by_name}");
    let later = stdout(&agent.perch(&["log", "--refused", "--since", "2999-01-01"]));
    assert!(later.contains("no refused messages"), "{later}");
    let last = stdout(&agent.perch(&["log", "--refused", "-n", "1"]));
    assert!(
        last.contains("(88)") && !last.contains("(77)") && last.contains("the last 1 of 2"),
        "{last}"
    );
    service.stop();
    assert_eq!(
        stdout(&agent.perch(&["log", "--refused"])),
        text,
        "the same once perch has stopped"
    );
}

#[test]
fn refusals_show_in_perch_status_text_and_json() {
    let (agent, service) = refused_through_perch_run();
    let report = agent.status();
    let shown: Vec<(&str, &str, &str, &str, u64)> = report
        .refusals
        .iter()
        .map(|one| {
            (
                one.room.as_str(),
                one.sender.as_str(),
                one.name.as_str(),
                one.kind.as_str(),
                one.count,
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("88", "88", MALLORY, "direct_refused", 1),
            ("-200", "77", "Eve", "room_not_allowed", 1),
        ],
        "newest first, no context line"
    );
    assert!(
        report.refusals[1]
            .fix
            .starts_with("channels/tg.lua: rooms (name it: team = \"-200\")"),
        "{:?}",
        report.refusals[1]
    );
    let json = stdout(&agent.perch(&["status", "--json"]));
    assert_nothing_unsafe_or_private(&json);
    assert!(json.contains(r"Mal\u001b[31mlory\u202e"), "{json}");

    let text = agent.status_text();
    assert_nothing_unsafe_or_private(&text);
    for expected in [
        "refused            the newest, one per room and reason",
        "  tg room 88: Mal\\u{1b}[31mlory\\u{202e} (88), 1 time, last ",
        ": a direct message from a sender not in allow.users\n    fix: channels/tg.lua: \
         allow.users (add \"88\")",
        "  tg room -200: Eve (77), 1 time, last ",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    service.stop();
}

#[test]
fn a_stranger_waiting_for_pairing_is_a_refusal_and_a_group_line_kept_as_context_is_none() {
    let agent = Scenario::telegram(
        "rooms = { team = \"-100\" }, allow = { users = { \"43\" }, rooms = { \"team\" } }, dm = \"pair\"",
    )
    .build();
    agent.model.push(Script::text("hello Bob"));
    let service = agent.start();
    agent.send(
        &User::human(88, "Mallory"),
        "let me in, the word is swordfish",
    );
    agent.wait_for_replies(1);
    agent.telegram().push_message(
        &Chat::group(-100, "Team"),
        &User::human(44, "Carol"),
        "this line is only context",
    );
    agent.send(&User::human(43, "Bob"), "hi");
    agent.wait_for_replies(2);
    let json = stdout(&agent.perch(&["log", "--refused", "--json"]));
    assert_nothing_unsafe_or_private(&json);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{json}");
    assert_eq!(lines[0]["kind"], "awaiting_pairing", "{json}");
    assert_eq!(lines[0]["sender"], "88", "{json}");
    let report = agent.status();
    assert_eq!(report.refusals.len(), 1, "{:?}", report.refusals);
    assert_eq!(report.refusals[0].kind, "awaiting_pairing");
    service.stop();
}

/// A task or a channel `perch log` cannot know is an error naming what there is, not an empty
/// listing that exits 0; a declared one with nothing logged yet is not.
#[test]
fn perch_log_names_what_exists_when_asked_for_an_unknown_task_or_channel() {
    let agent = Scenario::telegram(CHANNEL).build();
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: p\n    every: 1h\n",
    );
    for args in [
        &["log", "--task", "nope"][..],
        &["log", "nochannel"],
        &["log", "--refused", "nochannel"],
        &["log", "--channel", "nochannel:team"],
    ] {
        let output = agent.perch(args);
        let said = stderr(&output);
        assert!(!output.status.success(), "{args:?} exits non-zero: {said}");
        let names = if args.contains(&"--task") {
            ["\"nope\"", "the tasks: digest"]
        } else {
            ["\"nochannel\"", "the agent's channels: tg"]
        };
        for name in names {
            assert!(said.contains(name), "{args:?} names {name}: {said}");
        }
    }
    for args in [
        &["log", "--task", "digest"][..],
        &["log", "tg"],
        &["log", "heartbeat"],
        &["log", "--refused", "tg:team"],
    ] {
        let output = agent.perch(args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    }
}
