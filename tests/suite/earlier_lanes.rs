//! Agent directories an earlier version of perch wrote, whose conversation lanes were named
//! `<channel>-<room>` (or a prefix and a CRC32 when that was not a valid lane name): through
//! `perch run`, a new message in such a conversation continues its lane, and the model sees its
//! earlier turns.

use super::fake_model::{FakeModel, Script};
use super::fake_telegram::{Chat, FakeTelegram, User};
use super::service::{start, stop, wait_until};
use super::support::{new_agent, write};
use chrono::{DateTime, TimeZone, Utc};
use perch::host::clock::system_clock;
use perch::log::LaneLog;
use perch_core::config::Api;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{Entry, EntryBody, Intent, Line, Message, Outcome, Part, Record, Role};
use perch_core::name::LaneName;
use perch_core::origin::{MessageOrigin, Person};
use std::path::Path;

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

fn lanes(agent: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agent.join(".perch/sessions"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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
        let model = FakeModel::start(Api::OpenAiCompletions);
        let telegram = FakeTelegram::start();
        let dir = new_agent();
        write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
        write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
        write(
            dir.path(),
            &format!("channels/{channel}.lua"),
            &format!(
                "channel {{\n  kind = \"telegram\",\n  token = env \"TELEGRAM_TOKEN\",\n  \
                 api_url = {:?},\n  allow = {{ users = {{ \"42\" }} }},\n}}\n",
                telegram.api_url()
            ),
        );
        write_earlier_lane(dir.path(), earlier, channel);

        model.push(Script::text("Your dog is called Rex."));
        let child = start(dir.path(), None);
        let alice = User::human(42, "Alice");
        telegram.push_message(&Chat::private(&alice), &alice, "and my dog?");
        wait_until("the reply", || !telegram.sent().is_empty());
        stop(child);

        assert_eq!(telegram.sent()[0].shown, "Your dog is called Rex.");
        let request = model.last_request().body.to_string();
        for said in [
            "what is my cat called?",
            "Your cat is called Miso.",
            "and my dog?",
        ] {
            assert!(request.contains(said), "{channel}: {said:?} in {request}");
        }
        assert_eq!(
            lanes(dir.path()),
            vec![earlier.to_owned()],
            "{channel}: no new lane"
        );
        let records: Vec<serde_json::Value> =
            std::fs::read_dir(dir.path().join(".perch/earlier-lanes"))
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
