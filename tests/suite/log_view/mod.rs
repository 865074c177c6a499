//! `perch log` of lanes the real writer wrote: turns, selection, lanes, JSON, damage, mistakes.

mod follow;
mod perch_run;
mod refused;
mod schema_check;

use super::support::fake_telegram::TOKEN;
use super::support::scenario::{Agent, Scenario, alice};
use super::support::wait::wait_until;
use super::support::{new_agent, perch, stderr, stdout, tree};
use chrono::{DateTime, TimeZone, Utc};
use perch::host::clock::system_clock;
use perch::log::LaneLog;
use perch_core::config::Replay;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{
    Entry, EntryBody, Intent, Line, Message, Outcome, Part, Record, Role, Settled,
};
use perch_core::name::{LaneName, ToolName};
use perch_core::origin::{MessageOrigin, Person, Quoted};
use perch_core::spend::Money;
use std::path::Path;

const SECRET: &str = "sk-log-view-7f3a9c1e55d0b2";

fn at(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 2, 3, minute, 0).unwrap()
}

fn op(n: u8) -> OperationId {
    OperationId::from_bytes([n; 16])
}

fn id(n: u8) -> EntryId {
    EntryId::from_bytes([n; 16])
}

fn started(n: u8, resumed: bool, minute: u32) -> Line {
    Line::Record(Record::OperationStarted {
        op: op(n),
        intent: Intent::Run,
        consumes: vec![format!("inbox:{n}")],
        resumed,
        trigger: None,
        at: at(minute),
    })
}

fn finished(n: u8, outcome: Outcome, minute: u32) -> Line {
    Line::Record(Record::OperationFinished {
        op: op(n),
        outcome,
        at: at(minute),
    })
}

fn entry(
    n: u8,
    parent: Option<u8>,
    role: Role,
    parts: Vec<Part>,
    origins: Vec<MessageOrigin>,
    minute: u32,
) -> Line {
    Line::Entry(Entry {
        id: id(n),
        parent: parent.map(id),
        at: at(minute),
        body: EntryBody::Message(Message {
            role,
            parts,
            origins,
            relay: None,
        }),
    })
}

fn text(text: &str) -> Part {
    Part::Text { text: text.into() }
}

fn from(id: &str, name: &str, minute: u32) -> MessageOrigin {
    MessageOrigin {
        sender: Person {
            id: id.into(),
            name: name.into(),
        },
        channel: "telegram".into(),
        room: "team".into(),
        thread: None,
        sent_at: at(minute),
        direct: false,
        replying_to: None,
        earlier: Vec::new(),
    }
}

fn replied(n: u8, attempt: u32, input: u64, output: u64, micros: u64, minute: u32) -> Line {
    Line::Record(Record::ModelReplied {
        op: op(n),
        attempt,
        model: "openai/gpt-5-mini".into(),
        input,
        output,
        cached: 0,
        cost: Some(Money::from_micros(micros)),
        at: at(minute),
    })
}

fn attempt(n: u8, attempt: u32, minute: u32) -> Line {
    Line::Record(Record::AttemptStarted {
        op: op(n),
        attempt,
        at: at(minute),
    })
}

/// Writes `lines` to `lane` through the lane writer, as `perch run` would.
fn write_lane(agent: &Path, lane: &str, lines: &[Line]) {
    let sessions = agent.join(".perch/sessions");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let lane = LaneName::try_from(lane).unwrap();
        let (log, _) = LaneLog::open(&sessions, &lane, system_clock()).unwrap();
        for line in lines {
            log.append(line).await.unwrap();
        }
        log.close().await.unwrap();
    });
}

/// The team's lane: a question answered with a tool call and a delivery of unknown fate; then
/// a run a crash interrupted, resumed after the restart and delivered.
fn team_lane() -> Vec<Line> {
    let asked = MessageOrigin {
        replying_to: Some(Quoted {
            platform_id: "-100:41".into(),
            author: Some(Person {
                id: "2002".into(),
                name: "Bo".into(),
            }),
            text: "the build broke".into(),
        }),
        ..from("1001", "Ana", 1)
    };
    vec![
        started(1, false, 1),
        entry(
            2,
            None,
            Role::User,
            vec![text("why is the build red? \u{1b}[31mhi")],
            vec![asked],
            1,
        ),
        attempt(1, 1, 1),
        replied(1, 1, 1200, 80, 1500, 1),
        entry(
            3,
            Some(2),
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "r".repeat(312),
                    signature: None,
                },
                Part::ToolCall {
                    call_id: "call-1".into(),
                    name: "bash".into(),
                    arguments: serde_json::json!({ "command": "cargo test" }),
                },
            ],
            vec![],
            1,
        ),
        Line::Record(Record::ToolStarted {
            op: op(1),
            call_id: "call-1".into(),
            tool: ToolName::try_from("bash").unwrap(),
            arguments: serde_json::json!({ "command": "cargo test" }),
            result: id(4),
            replay: Replay::Never,
            at: at(1),
        }),
        entry(
            4,
            Some(3),
            Role::Tool,
            vec![Part::ToolResult {
                call_id: "call-1".into(),
                output: format!(
                    "running 3 tests\ntest a ... ok\ntest b ... FAILED\nkey {SECRET}\nline 5\nline 6\n"
                ),
                is_error: false,
            }],
            vec![],
            2,
        ),
        Line::Record(Record::ToolFinished {
            op: op(1),
            call_id: "call-1".into(),
            result: id(4),
            duration_ms: 2300,
            exit_code: Some(101),
            is_error: false,
            at: at(2),
        }),
        attempt(1, 2, 2),
        replied(1, 2, 1500, 40, 1600, 2),
        entry(
            5,
            Some(4),
            Role::Assistant,
            vec![text("test b fails: it expects UTC.")],
            vec![],
            2,
        ),
        finished(1, Outcome::Completed, 2),
        Line::Record(Record::DeliverySettled {
            delivery: "tg-delivery-1".into(),
            channel: "telegram".into(),
            op: Some(op(1)),
            answers: Some("-100:42".into()),
            settled: Settled::Unknown {
                reason: "perch stopped while sending".into(),
            },
            at: at(3),
        }),
        started(6, false, 10),
        entry(
            7,
            Some(5),
            Role::User,
            vec![text("deploy it")],
            vec![from("2002", "Bo", 10)],
            10,
        ),
        attempt(6, 1, 10),
        finished(
            6,
            Outcome::Interrupted {
                reason: "perch stopped during the run".into(),
            },
            12,
        ),
        started(8, true, 12),
        attempt(8, 1, 12),
        replied(8, 1, 900, 10, 700, 12),
        entry(
            9,
            Some(7),
            Role::Assistant,
            vec![text("Deployed.")],
            vec![],
            12,
        ),
        finished(8, Outcome::Completed, 12),
        Line::Record(Record::DeliverySettled {
            delivery: "tg-delivery-2".into(),
            channel: "telegram".into(),
            op: Some(op(8)),
            answers: Some("-100:43".into()),
            settled: Settled::Sent {
                platform_id: "-100:44".into(),
            },
            at: at(13),
        }),
    ]
}

/// A heartbeat whose first reply was not a verdict, corrected to a message.
fn heartbeat_lane() -> Vec<Line> {
    vec![
        started(20, false, 30),
        entry(
            21,
            None,
            Role::User,
            vec![text(
                "[heartbeat digest for 2026-12-02T03:30:00+00:00]\n\nPost the digest.",
            )],
            vec![],
            30,
        ),
        replied(20, 1, 400, 30, 100, 30),
        entry(
            22,
            Some(21),
            Role::Assistant,
            vec![text("Sure, here it is.")],
            vec![],
            30,
        ),
        finished(20, Outcome::Completed, 30),
        started(23, false, 31),
        entry(
            24,
            Some(22),
            Role::User,
            vec![text(&perch_core::heartbeat::correction(
                &perch_core::heartbeat::judge("Sure, here it is.").unwrap_err(),
            ))],
            vec![],
            31,
        ),
        replied(23, 1, 450, 12, 100, 31),
        entry(
            25,
            Some(24),
            Role::Assistant,
            vec![text("Message: Stand-up at ten.")],
            vec![],
            31,
        ),
        finished(23, Outcome::Completed, 31),
        Line::Entry(Entry {
            id: id(26),
            parent: Some(id(25)),
            at: at(31),
            body: EntryBody::Note(perch_core::log::Note::from_data(
                "heartbeat_outcome".into(),
                serde_json::json!({
                    "task": "digest",
                    "slot": "2026-12-02T03:30:00+00:00",
                    "run": "run-7",
                    "mode": "scheduled",
                    "outcome": {
                        "outcome": "message",
                        "text": "Stand-up at ten.",
                        "target": "telegram:team",
                        "delivery": "tg-delivery-3",
                    },
                }),
            )),
        }),
    ]
}

fn agent_with_lanes() -> tempfile::TempDir {
    let agent = new_agent();
    write_lane(agent.path(), "telegram-team", &team_lane());
    write_lane(agent.path(), "heartbeat-digest", &heartbeat_lane());
    agent
}

fn log(agent: &Path, args: &[&str]) -> std::process::Output {
    let dir = agent.to_str().unwrap();
    let mut all = vec!["log", dir];
    all.extend_from_slice(args);
    perch(&all, &[("OPENAI_API_KEY", SECRET)])
}

/// Where `needle` first starts in `bytes`.
fn offset_of(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|window| window == needle)
        .unwrap()
}

fn ok(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{}", stderr(output));
    stdout(output)
}

/// `perch log DIR ARGS` of a scenario's agent, with the Telegram token in the environment (so
/// that it is redacted); it must succeed.
fn shown_by_perch_run(agent: &Agent, args: &[&str]) -> String {
    let mut all = vec!["log", agent.arg()];
    all.extend_from_slice(args);
    ok(&perch(&all, &[("TELEGRAM_TOKEN", TOKEN)]))
}

/// `src/core/transcript/perch-log.schema.json`, the schema of `perch log --json`.
fn schema() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/core/transcript/perch-log.schema.json"
        ))
        .unwrap(),
    )
    .unwrap()
}

/// Each line of `perch log --json`'s output, checked against [`schema`].
fn schema_checked(json: &str) -> Vec<serde_json::Value> {
    let schema = schema();
    json.lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Err(problem) = schema_check::event(&schema, &event) {
                panic!("{problem}\nin {line}");
            }
            event
        })
        .collect()
}

#[test]
fn a_conversation_shows_its_turns_tools_deliveries_heartbeat_and_recovery() {
    let agent = agent_with_lanes();
    let before = tree(agent.path());
    let text = ok(&log(agent.path(), &[]));
    for expected in [
        "2026-12-02 03:01:00 UTC  telegram-team  telegram:team  Ana (1001)",
        "user      Ana: why is the build red? \\u{1b}[31mhi",
        "replying to -100:41 by Bo: \"the build broke\"",
        "[reasoning: 312 chars]",
        "tool      bash {\"command\":\"cargo test\"}",
        "output    bash (6 lines)",
        "│ running 3 tests",
        "│ … 2 more",
        "ended     exit 101, 2.3 s",
        "reply     test b fails: it expects UTC.",
        "delivery  unknown on telegram (tg-delivery-1), answering -100:42: perch stopped while sending",
        "usage     2 model calls, 2700 tokens in, 120 out, cost 0.0031",
        "user      Bo: deploy it",
        "end       interrupted (closed on recovery): perch stopped during the run",
        "recovery  resumed after a restart: the interrupted run continues",
        "reply     Deployed.",
        "delivery  sent as message -100:44 on telegram (tg-delivery-2), answering -100:43",
        "heartbeat-digest  heartbeat digest (slot 2026-12-02T03:30:00+00:00)",
        "verdict   invalid: the reply is not a verdict",
        "corrected asked again for a verdict, since the reply is not a verdict",
        "verdict   valid: message",
        "outcome   message (scheduled run of digest for slot 2026-12-02T03:30:00+00:00) to telegram:team as delivery tg-delivery-3",
        "lane telegram-team: 2 turns shown, 3600 tokens in, 130 out, cost 0.0038",
        "lane heartbeat-digest: 1 turn shown, 850 tokens in, 42 out, cost 0.0002",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    assert!(
        !text.contains(SECRET),
        "the provider key is redacted:\n{text}"
    );
    assert!(text.contains("│ key <redacted>"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no raw escape reaches the terminal"
    );
    assert_eq!(
        text.matches("resumed after a restart").count(),
        1,
        "the resumed run is in the interrupted run's turn"
    );
    assert_eq!(tree(agent.path()), before, "perch log writes nothing");
}

#[test]
fn selection_by_place_sender_task_lane_window_and_count() {
    let agent = agent_with_lanes();
    let turns = |args: &[&str]| -> Vec<String> {
        ok(&log(agent.path(), args))
            .lines()
            .filter(|line| line.starts_with("2026-"))
            .map(|line| line.split("  ").nth(1).unwrap().to_owned() + &line[11..19])
            .collect()
    };
    let team1 = "telegram-team03:01:00".to_owned();
    let team2 = "telegram-team03:10:00".to_owned();
    let digest = "heartbeat-digest03:30:00".to_owned();
    let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
        (vec![], vec![team1.clone(), team2.clone(), digest.clone()]),
        (vec!["telegram:team"], vec![team1.clone(), team2.clone()]),
        (vec!["--channel", "telegram:other"], vec![]),
        (vec!["--sender", "bo"], vec![team2.clone()]),
        (vec!["--sender", "1001"], vec![team1.clone()]),
        (vec!["--task", "digest"], vec![digest.clone()]),
        (
            vec!["--lane", "telegram-team"],
            vec![team1.clone(), team2.clone()],
        ),
        (vec!["-n", "1"], vec![digest.clone()]),
        (
            vec!["--lane", "telegram-team", "--last", "1"],
            vec![team2.clone()],
        ),
        (vec!["--since", "2026-12-02T03:05:00Z"], vec![team2, digest]),
        (vec!["--until", "2026-12-02T03:05:00Z"], vec![team1]),
    ];
    for (args, expected) in cases {
        assert_eq!(turns(&args), expected, "{args:?}");
    }
}

#[test]
fn lanes_are_listed_with_activity_size_lines_and_spend() {
    let agent = agent_with_lanes();
    let text = ok(&log(agent.path(), &["--lanes"]));
    let team = text
        .lines()
        .find(|line| line.starts_with("telegram-team"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(team.contains("2026-12-02 03:13:00 UTC"), "{team}");
    assert!(team.contains(" 24 "), "header and 23 lines: {team}");
    assert!(team.contains("0.0038"), "{team}");
    assert!(team.contains("KiB"), "{team}");
    let json = ok(&log(agent.path(), &["--lanes", "--json"]));
    let lanes: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lanes.len(), 2);
    let digest = &lanes[0];
    assert_eq!(digest["lane"], "heartbeat-digest");
    assert_eq!(digest["cost_micros"], 200);
    assert_eq!(digest["lines"], 12);
}

#[test]
fn the_lane_column_is_as_wide_as_the_longest_lane_name() {
    let agent = agent_with_lanes();
    let long = "mx-_hideout_example_org-_threadroot-bbb0601229ef0391";
    write_lane(agent.path(), long, &heartbeat_lane());
    let text = ok(&log(agent.path(), &["--lanes"]));
    let column = |line: &str, what: &str| {
        line.find(what)
            .unwrap_or_else(|| panic!("{what} in {line}\n{text}"))
    };
    let lines: Vec<&str> = text.lines().collect();
    let activity = column(lines[0], "LAST ACTIVITY");
    assert_eq!(activity, long.len() + 1, "{text}");
    for line in &lines[1..] {
        assert_eq!(column(line, "2026-12-02"), activity, "{text}");
    }
}

#[test]
fn json_output_follows_the_schema_file() {
    let agent = agent_with_lanes();
    let json = ok(&log(agent.path(), &["--json"]));
    let mut kinds = std::collections::BTreeSet::new();
    let mut positions = std::collections::BTreeSet::new();
    for event in schema_checked(&json) {
        kinds.insert(event["kind"].as_str().unwrap().to_owned());
        assert!(
            positions.insert(event["position"].to_string()),
            "each event has its own position: {event}"
        );
    }
    for kind in [
        "run_started",
        "user_message",
        "attempt_started",
        "model_replied",
        "assistant_message",
        "tool_started",
        "tool_result",
        "tool_finished",
        "delivery_settled",
        "operation_finished",
        "heartbeat_prompt",
        "heartbeat_correction",
        "heartbeat_outcome",
    ] {
        assert!(kinds.contains(kind), "{kind} in {kinds:?}");
    }
    assert!(!json.contains(SECRET));
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["kind"], "run_started");
    assert_eq!(first["lane"], "telegram-team");
    assert_eq!(first["position"]["segment"], 1);
    assert_eq!(first["turn"], first["position"]);
    let schema = schema();
    let bad = serde_json::json!({"lane": "x", "position": {"lane": "x", "segment": 1, "offset": 0}, "turn": null, "at": null, "kind": "damaged", "file": "f", "line": "seven", "reason": "r"});
    assert!(
        schema_check::event(&schema, &bad).is_err(),
        "the checker checks types"
    );
    let extra = serde_json::json!({"lane": "x", "position": {"lane": "x", "segment": 1, "offset": 0}, "turn": null, "at": null, "kind": "leaf_set", "leaf": "l", "surprise": 1});
    assert!(
        schema_check::event(&schema, &extra).is_err(),
        "and undeclared fields"
    );
}

#[test]
fn damaged_and_torn_lines_are_shown_with_their_file_and_line_and_the_rest_renders() {
    let agent = agent_with_lanes();
    let segment = agent
        .path()
        .join(".perch/sessions/telegram-team/000001.jsonl");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = offset_of(&bytes, b"deploy it");
    bytes[at..at + 9].copy_from_slice(b"\x00eploy it");
    bytes.extend_from_slice(br#"{"kind":"record","type":"leaf_s"#);
    std::fs::write(&segment, &bytes).unwrap();
    let before = tree(agent.path());
    let text = ok(&log(agent.path(), &[]));
    let file = segment.canonicalize().unwrap();
    let file = file.display();
    for expected in [
        format!("DAMAGED   {file}:16: its bytes changed after it was written (checksum mismatch)"),
        format!("DAMAGED   {file}:25: torn: 31 bytes without an end of line"),
        "reply     Deployed.".to_owned(),
        "reply     test b fails: it expects UTC.".to_owned(),
        "outcome   message (scheduled run".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected:?} in\n{text}");
    }
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        bytes,
        "nothing is repaired"
    );
    assert_eq!(tree(agent.path()), before);

    std::fs::remove_file(
        agent
            .path()
            .join(".perch/sessions/telegram-team/000001.idx"),
    )
    .unwrap();
    let text = ok(&log(agent.path(), &["--lane", "telegram-team"]));
    assert!(
        text.contains(&format!("DAMAGED   {file}:16: not a log line")),
        "without the index the line is parsed, and fails: {text}"
    );
    assert!(text.contains("reply     Deployed."), "{text}");
    assert!(
        text.contains(&format!("DAMAGED   {file}:25: torn")),
        "{text}"
    );
}

#[test]
fn mistakes_name_what_to_do() {
    let agent = agent_with_lanes();
    let cases: &[(&[&str], &str)] = &[
        (&["--lane", "nope"], "there is no lane nope in"),
        (
            &["--lane", "nope"],
            "its lanes are: heartbeat-digest, telegram-team",
        ),
        (
            &["--since", "yesterday"],
            "--since: \"yesterday\" is not a time: write a duration",
        ),
        (&["--until", "3x"], "--until: \"3x\" is not a time"),
        (
            &["telegram:"],
            "is not a place: write CHANNEL or CHANNEL:ROOM",
        ),
    ];
    for (args, expected) in cases {
        let output = log(agent.path(), args);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            stderr(&output).contains(expected),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let empty = new_agent();
    let output = log(empty.path(), &[]);
    assert_eq!(ok(&output), "no turns to show\n");
}
