//! Hostile chat users: bot loops, others' commands, names that fool a terminal, pairing floods.

use super::super::intake::TEAM;
use super::super::support::fake_discord::Author;
use super::super::support::fake_model::Script;
use super::super::support::fake_telegram::{Chat, User};
use super::super::support::pairing_code;
use super::super::support::scenario::{Scenario, alice};
use super::super::support::wait::wait_until;
use std::path::Path;

#[test]
fn a_bot_loop_stops_after_bot_turns_a_human_resets_it_and_a_restart_keeps_the_count() {
    let agent = Scenario::telegram(&format!(
        "{TEAM}, groups = \"all\", allow_bots = {{ \"11\" }}, bot_turns = 3"
    ))
    .build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let team = Chat::group(-100, "Team");
    let other_agent = User::bot(11, "Other agent", "otheragentbot");
    let carol = User::human(9, "Carol");
    let service = agent.start();
    for turn in 0..8 {
        telegram.push_message(&team, &other_agent, &format!("bot turn {turn}"));
    }
    let human = telegram.push_message(&team, &carol, "enough, you two");
    wait_until("the answer to the human", || telegram.answered(human));
    assert_eq!(
        telegram.sent().len(),
        4,
        "three bot turns and the human's message are answered; five bot messages are not"
    );
    assert_eq!(model.requests().len(), 4);

    for turn in 0..2 {
        telegram.push_message(&team, &other_agent, &format!("after the human {turn}"));
    }
    wait_until("two more bot turns", || telegram.sent().len() == 6);
    service.stop();

    let service = agent.start();
    for turn in 0..2 {
        telegram.push_message(&team, &other_agent, &format!("after the restart {turn}"));
    }
    let human = telegram.push_message(&team, &carol, "and now?");
    wait_until("the answer to the human", || telegram.answered(human));
    service.stop();
    assert_eq!(
        telegram.sent().len(),
        8,
        "the count was rebuilt at start: one more bot turn, not two"
    );
}

#[test]
fn a_bot_loop_stops_on_discord_too() {
    let agent = Scenario::discord(
        "rooms = { general = \"555\" }, allow = { rooms = { \"general\" } }, groups = \"all\",\n  allow_bots = { \"88\" }, bot_turns = 2",
    )
    .build();
    let discord = agent.discord();
    discord.guild_channel(555);
    let service = agent.start();
    agent.wait_for_gateway();
    let other_agent = Author::bot(88, "other-agent");
    for turn in 0..5 {
        discord.push_message(555, &other_agent, &format!("bot turn {turn}"));
    }
    let human = discord
        .push_message(555, &Author::user(77, "Dana"), "stop it")
        .to_string();
    wait_until("the answer to the human", || {
        discord
            .posted()
            .iter()
            .any(|posted| posted.body["message_reference"]["message_id"] == human.as_str())
    });
    service.stop();
    assert_eq!(discord.posted().len(), 3, "two bot turns and the human's");
}

#[test]
fn commands_for_another_bot_or_not_addressed_are_not_obeyed() {
    let agent = Scenario::telegram(TEAM).build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let team = Chat::group(-100, "Team");
    let stranger_room = Chat::group(-200, "Elsewhere");
    let carol = User::human(9, "Carol");
    let mallory = User::human(13, "Mallory");
    let me = User::me().username.unwrap();
    let service = agent.start();
    for text in [
        "/new@otherbot",
        "/stop@otherbot",
        "/status@otherbot",
        "/new",
        "/status",
    ] {
        telegram.push_message(&team, &carol, text);
    }
    telegram.push_message(&stranger_room, &mallory, &format!("/new@{me}"));
    telegram.push_message(&stranger_room, &mallory, &format!("/status@{me}"));
    let asked = telegram.push_message(&team, &carol, &format!("/status@{me}"));
    agent.wait_for_a_reply();
    service.stop();
    let sent = telegram.sent();
    assert_eq!(
        sent.len(),
        1,
        "only the command addressed to this bot by an allowed sender is obeyed: {:?}",
        sent.iter().map(|sent| &sent.shown).collect::<Vec<_>>()
    );
    assert_eq!(sent[0].reply_to, Some(asked.message_id));
    assert!(sent[0].shown.starts_with("perch is running"));
    assert!(
        !agent.path().join(".perch/generations").exists(),
        "no /new was obeyed"
    );
    assert_eq!(model.requests().len(), 0);
}

/// An agent whose Telegram channel offers strangers pairing.
fn pairing_agent() -> super::super::support::scenario::Agent {
    Scenario::telegram("").build()
}

const HOSTILE_NAME: &str = "Eve\u{1b}[2J\u{1b}]0;owned\u{7}\u{202e}gnp.exe\u{2066}";

fn assert_escaped(what: &str, text: &str) {
    for raw in ['\u{1b}', '\u{7}', '\u{202e}', '\u{2066}'] {
        assert!(!text.contains(raw), "{what} prints {raw:?} raw: {text:?}");
    }
    assert!(text.contains("Eve\\u{1b}[2J"), "{what}: {text:?}");
    assert!(
        text.contains("\\u{202e}gnp.exe\\u{2066}"),
        "{what}: {text:?}"
    );
}

#[test]
fn a_display_name_made_to_fool_the_terminal_is_shown_escaped_and_stored_as_received() {
    let agent = pairing_agent();
    let telegram = agent.telegram();
    let eve = User::human(66, HOSTILE_NAME);
    let service = agent.start();
    agent.send(&eve, "let me in");
    agent.wait_for_a_reply();
    let offer = telegram.sent()[0].text.clone();
    let code = pairing_code(&offer);

    let status = agent.perch(&["status"]);
    assert!(status.status.success());
    assert_escaped("perch status", &String::from_utf8_lossy(&status.stdout));
    for args in [&["status", "--json"][..], &["pair", "list", "--json"]] {
        let output = agent.perch(args);
        let json = String::from_utf8_lossy(&output.stdout).into_owned();
        for raw in ['\u{1b}', '\u{7}', '\u{202e}', '\u{2066}'] {
            assert!(!json.contains(raw), "{args:?} prints {raw:?} raw: {json:?}");
        }
        assert!(json.contains("\\u202egnp.exe\\u2066"), "{args:?}: {json}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(
            value.to_string().contains("gnp.exe"),
            "{args:?} decodes: {value}"
        );
    }
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.path().join(".perch/pairing.json")).unwrap())
            .unwrap();
    assert_eq!(
        stored["pending"][0]["name"], HOSTILE_NAME,
        "stored as received"
    );

    let approved = agent.perch(&["pair", "approve", &code]);
    assert!(approved.status.success());
    assert_escaped(
        "perch pair approve",
        &String::from_utf8_lossy(&approved.stdout),
    );
    let stderr = service.stop();
    assert!(
        !stderr.contains('\u{1b}'),
        "the log holds no raw ESC: {stderr:?}"
    );
}

#[test]
fn a_provider_error_reaches_the_chat_as_a_generic_sentence_and_the_log_keeps_it() {
    let agent = Scenario::telegram("dm = \"allow\"").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    model.push(Script::status_body(
        403,
        r#"{"error":{"message":"Project proj_Q7f3 in organization org-8TqZ has no access to this model; contact billing-admin@example.com","type":"invalid_request_error","code":"model_not_found"}}"#,
    ));
    let service = agent.start();
    agent.send(&alice(), "hello");
    agent.wait_for_a_reply();
    let stderr = service.stop();
    let said = &telegram.sent()[0].shown;
    assert!(said.starts_with("Sorry, I could not finish that"), "{said}");
    for detail in ["example.com", "org-8TqZ", "proj_Q7f3", "billing"] {
        assert!(!said.contains(detail), "the chat sees {detail}: {said}");
    }
    assert!(
        stderr.contains("org-8TqZ"),
        "the log keeps the detail: {stderr}"
    );
}

/// Throwaway accounts fill the channel's pairing list: a later sender is still listed (the
/// oldest request is dropped for theirs), is told pairing is busy and given their id, once, and
/// is let in by that id.
#[test]
fn throwaway_accounts_cannot_starve_pairing() {
    let agent = pairing_agent();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let full = perch_core::pairing::MAX_PENDING_PER_CHANNEL;
    for id in 0..full {
        let id = 1000 + i64::try_from(id).unwrap();
        agent.send(&User::human(id, &format!("throwaway {id}")), "hi");
    }
    wait_until("a code each", || telegram.sent().len() == full);
    let dora = User::human(104, "Dora");
    agent.send(&dora, "hello, I am real");
    wait_until("an answer to Dora", || telegram.sent().len() == full + 1);
    agent.send(&dora, "hello??");
    let later = User::human(105, "Later");
    agent.send(&later, "me too");
    wait_until("an answer to the next sender", || {
        telegram.sent().len() == full + 2
    });
    let sent = telegram.sent();
    let busy = &sent[full];
    assert_eq!(busy.chat_id, 104);
    assert!(
        busy.shown.contains("pairing is busy")
            && busy.shown.contains("your id, tg:104")
            && busy.shown.contains("perch pair approve tg:104"),
        "{}",
        busy.shown
    );
    assert_eq!(
        sent[full + 1].chat_id,
        105,
        "the repeated hello got no second notice"
    );
    let list = String::from_utf8_lossy(&agent.perch(&["pair", "list"]).stdout).into_owned();
    assert!(
        list.contains(&format!("pending requests: {full}")),
        "{list}"
    );
    assert!(
        list.contains("tg:104") && !list.contains("tg:1000 ") && !list.contains("tg:1001 "),
        "the newest are listed, the oldest dropped: {list}"
    );
    assert!(agent.perch(&["pair", "approve", "tg:104"]).status.success());
    model.push(Script::text("hi Dora"));
    agent.send(&dora, "now?");
    wait_until("Dora's answer", || telegram.has_shown("hi Dora"));
    service.stop();
}

fn newest_segment(journal: &Path) -> std::path::PathBuf {
    let mut segments: Vec<_> = std::fs::read_dir(journal)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    segments.sort();
    segments.pop().unwrap()
}

#[test]
fn a_corrupt_inbox_line_is_reported_by_status_not_hidden() {
    let agent = Scenario::telegram("dm = \"allow\"").build();
    let service = agent.start();
    agent.send(&alice(), "hello");
    agent.wait_for_a_reply();
    service.stop();
    let segment = newest_segment(&agent.path().join(".perch/inbox"));
    let mut bytes = std::fs::read(&segment).unwrap();
    let line = bytes.iter().filter(|byte| **byte == b'\n').count() + 1;
    bytes.extend_from_slice(b"{\"kind\":\"item\",\"seq\":99,\"body\": \x1b[31m not json\n");
    std::fs::write(&segment, bytes).unwrap();

    let status = agent.status();
    let unreadable = &status.inbox_unreadable;
    assert_eq!(unreadable.len(), 1, "{status:?}");
    let reported = &unreadable[0];
    assert!(
        reported.contains(&format!("{}:{line}:", segment.display())),
        "names the file and line: {reported}"
    );
    let text = String::from_utf8_lossy(&agent.perch(&["status"]).stdout).into_owned();
    assert!(text.contains("inbox corrupt"), "{text}");
    assert!(text.contains("inbox pending      at least 0"), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
}
