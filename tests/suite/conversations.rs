//! A conversation through `perch run`: answered in its chat, carried across restarts and lanes.

use super::support::fake_model::Script;
use super::support::fake_telegram::{BOT_USERNAME, Chat, User};
use super::support::scenario::{Scenario, alice};
use super::support::wait::wait_until;
use chrono::{DateTime, TimeZone, Utc};
use perch::host::clock::system_clock;
use perch::log::LaneLog;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{Entry, EntryBody, Intent, Line, Message, Outcome, Part, Record, Role};
use perch_core::name::LaneName;
use perch_core::origin::{MessageOrigin, Person};
use std::path::Path;

#[test]
fn a_telegram_message_is_answered_in_its_chat_as_a_reply() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    model.push(Script::text("Hello **Alice**!"));
    let service = agent.start();
    let pushed = agent.send(&alice(), "hi there");
    agent.wait_for_a_reply();
    let sent = telegram.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat_id, 42);
    assert_eq!(sent[0].reply_to, Some(pushed.message_id));
    assert_eq!(sent[0].shown, "Hello Alice!");
    assert!(model.last_request().body.to_string().contains("hi there"));
    service.stop();

    // A restart neither loses nor repeats anything.
    model.push(Script::text("second answer"));
    let service = agent.start();
    agent.send(&alice(), "and again");
    agent.wait_for_replies(2);
    service.stop();
    assert_eq!(telegram.sent()[1].shown, "second answer");
    assert_eq!(model.requests().len(), 2, "nothing was answered twice");
}

#[test]
fn group_context_survives_a_restart_and_is_offered_once() {
    let agent = Scenario::telegram(super::intake::TEAM).build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let team = Chat::group(-100, "Team");
    let carol = User::human(9, "Carol");
    telegram.push_message(&team, &carol, "the deploy failed at step 3");
    let second = telegram.push_message(&team, &carol, "it says disk full");
    let service = agent.start();
    let second_id = format!("-100:{}", second.message_id);
    wait_until("both messages journaled", || {
        agent
            .status()
            .last_events
            .get("tg")
            .and_then(|event| event.platform_id.as_deref())
            == Some(second_id.as_str())
    });
    service.stop();

    model.push(Script::text("Clean the disk, then rerun step 3."));
    model.push(Script::text("Glad it worked."));
    let service = agent.start();
    telegram.push_message(
        &team,
        &carol,
        &format!("@{BOT_USERNAME} what should we do?"),
    );
    agent.wait_for_a_reply();
    let asked = model.requests()[0].body["messages"].to_string();
    assert!(
        asked.contains("Earlier in this room")
            && asked.contains("the deploy failed at step 3")
            && asked.contains("it says disk full"),
        "the context from before the restart is offered: {asked}"
    );
    telegram.push_message(&team, &carol, &format!("@{BOT_USERNAME} it worked"));
    agent.wait_for_replies(2);
    service.stop();
    let again = model.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    assert!(
        !again.contains("Earlier in this room"),
        "context is offered once: {again}"
    );
}

fn at(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 3, minute, 0).unwrap()
}

fn message(n: u8, parent: Option<u8>, role: Role, text: &str, origins: Vec<MessageOrigin>) -> Line {
    Line::Entry(Entry {
        id: EntryId::from_bytes([n; 16]),
        parent: parent.map(|parent| EntryId::from_bytes([parent; 16])),
        at: at(u32::from(n)),
        body: EntryBody::Message(Message {
            role,
            parts: vec![Part::Text { text: text.into() }],
            origins,
            relay: None,
        }),
    })
}

/// A lane as an earlier version left it after one answered message from Alice (42) in her
/// private chat on `channel`.
fn write_earlier_lane(agent: &Path, lane: &str, channel: &str) {
    let op = OperationId::from_bytes([1; 16]);
    let alice = MessageOrigin {
        sender: Person {
            id: "42".into(),
            name: "Alice".into(),
        },
        channel: channel.into(),
        room: "42".into(),
        thread: None,
        sent_at: at(1),
        direct: true,
        replying_to: None,
        earlier: Vec::new(),
    };
    let lines = [
        Line::Record(Record::OperationStarted {
            op,
            intent: Intent::Run,
            consumes: vec!["inbox:1".into()],
            resumed: false,
            trigger: None,
            at: at(1),
        }),
        message(1, None, Role::User, "what is my cat called?", vec![alice]),
        message(
            2,
            Some(1),
            Role::Assistant,
            "Your cat is called Miso.",
            vec![],
        ),
        Line::Record(Record::OperationFinished {
            op,
            outcome: Outcome::Completed,
            at: at(2),
        }),
    ];
    let sessions = agent.join(".perch/sessions");
    let lane = LaneName::try_from(lane).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (log, _) = LaneLog::open(&sessions, &lane, system_clock()).unwrap();
        for line in &lines {
            log.append(line).await.unwrap();
        }
        log.close().await.unwrap();
    });
}

/// The names of the agent's lanes, sorted.
pub(super) fn lanes(agent: &Path) -> Vec<String> {
    super::support::names_in(&agent.join(".perch/sessions"))
}

#[test]
fn a_conversation_an_earlier_version_wrote_continues_in_its_lane_through_perch_run() {
    let table = [
        ("tg", "tg-42", "exact_name"),
        (
            "a-channel-named-at-such-length-that-its-earlier-lanes-got-hashes",
            "a-channel-named-at-such-length-that-its-earlier--63fdca83",
            "same_origins",
        ),
    ];
    for (channel, earlier, adopted) in table {
        let agent = Scenario::telegram("allow = { users = { \"42\" } }")
            .channel_file(&format!("channels/{channel}.lua"))
            .build();
        write_earlier_lane(agent.path(), earlier, channel);

        agent.model.push(Script::text("Your dog is called Rex."));
        let service = agent.start();
        agent.send(&alice(), "and my dog?");
        agent.wait_for_a_reply();
        service.stop();

        assert_eq!(agent.telegram().sent()[0].shown, "Your dog is called Rex.");
        let request = agent.model.last_request().body.to_string();
        for said in [
            "what is my cat called?",
            "Your cat is called Miso.",
            "and my dog?",
        ] {
            assert!(request.contains(said), "{channel}: {said:?} in {request}");
        }
        assert_eq!(
            lanes(agent.path()),
            vec![earlier.to_owned()],
            "{channel}: no new lane"
        );
        let records: Vec<serde_json::Value> =
            std::fs::read_dir(agent.path().join(".perch/earlier-lanes"))
                .unwrap()
                .map(|entry| {
                    serde_json::from_slice(&std::fs::read(entry.unwrap().path()).unwrap()).unwrap()
                })
                .collect();
        assert_eq!(records.len(), 1, "{channel}: {records:?}");
        assert_eq!(records[0]["lane"], earlier);
        assert_eq!(records[0]["adoption"]["adopted"], adopted, "{channel}");
    }
}
