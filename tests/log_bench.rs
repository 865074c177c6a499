//! `perch log`'s benchmark: the time to render the last 50 turns of a 100,000-line lane, through
//! the library (read through the index, assemble, render) and through the binary. Run with
//! `cargo bench --bench log_bench`; `--smoke` writes a 20,000-line lane instead.
#![allow(clippy::print_stdout)]

use chrono::Utc;
use perch::host::clock::system_clock;
use perch::log::LaneLog;
use perch_core::config::Replay;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{
    Entry, EntryBody, Intent, Line, Message, Outcome, Part, Record, Role, Settled,
};
use perch_core::name::{LaneName, ToolName};
use perch_core::origin::{MessageOrigin, Person};
use perch_core::spend::Money;
use perch_core::transcript::{Redaction, Selection, render_turn};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const TURNS_SHOWN: usize = 50;

fn entry(
    id: EntryId,
    parent: Option<EntryId>,
    role: Role,
    parts: Vec<Part>,
    origins: Vec<MessageOrigin>,
) -> Line {
    Line::Entry(Entry {
        id,
        parent,
        at: Utc::now(),
        body: EntryBody::Message(Message {
            role,
            parts,
            origins,
            relay: None,
        }),
    })
}

fn filler(len: usize) -> String {
    "lorem ipsum dolor sit amet ".repeat(len / 27 + 1)[..len].to_owned()
}

/// One turn of 18 lines: a message with its origin, two model replies with a tool call between
/// them, and the delivery.
fn turn(n: u64, parent: Option<EntryId>) -> (Vec<Line>, EntryId) {
    let op = OperationId::from_uuid(uuid::Uuid::now_v7());
    let new_id = || EntryId::from_uuid(uuid::Uuid::now_v7());
    let (question, call, result, answer) = (new_id(), new_id(), new_id(), new_id());
    let origin = MessageOrigin {
        sender: Person {
            id: format!("{}", 1000 + n % 7),
            name: format!("user {}", n % 7),
        },
        channel: "telegram".into(),
        room: "team".into(),
        thread: None,
        sent_at: Utc::now(),
        direct: false,
        replying_to: None,
        earlier: Vec::new(),
    };
    let replied = |attempt| {
        Line::Record(Record::ModelReplied {
            op,
            attempt,
            model: "openai/gpt-5-mini".into(),
            input: 1200,
            output: 80,
            cached: 400,
            cost: Some(Money::from_micros(1500)),
            at: Utc::now(),
        })
    };
    let attempt = |attempt| {
        Line::Record(Record::AttemptStarted {
            op,
            attempt,
            at: Utc::now(),
        })
    };
    let call_id = format!("call-{n}");
    let lines = vec![
        Line::Record(Record::OperationStarted {
            op,
            intent: Intent::Run,
            consumes: vec![format!("inbox:{n}")],
            resumed: false,
            trigger: None,
            at: Utc::now(),
        }),
        entry(
            question,
            parent,
            Role::User,
            vec![Part::Text { text: filler(200) }],
            vec![origin],
        ),
        attempt(1),
        replied(1),
        entry(
            call,
            Some(question),
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: filler(400),
                    signature: None,
                },
                Part::ToolCall {
                    call_id: call_id.clone(),
                    name: "bash".into(),
                    arguments: serde_json::json!({ "command": "cargo test" }),
                },
            ],
            vec![],
        ),
        Line::Record(Record::ToolStarted {
            op,
            call_id: call_id.clone(),
            tool: ToolName::try_from("bash").expect("a tool name"),
            arguments: serde_json::json!({ "command": "cargo test" }),
            result,
            replay: Replay::Never,
            at: Utc::now(),
        }),
        entry(
            result,
            Some(call),
            Role::Tool,
            vec![Part::ToolResult {
                call_id: call_id.clone(),
                output: (0..40)
                    .map(|line| format!("line {line} {}\n", filler(60)))
                    .collect(),
                is_error: false,
            }],
            vec![],
        ),
        Line::Record(Record::ToolFinished {
            op,
            call_id,
            result,
            duration_ms: 1234,
            exit_code: Some(0),
            is_error: false,
            at: Utc::now(),
        }),
        attempt(2),
        replied(2),
        entry(
            answer,
            Some(result),
            Role::Assistant,
            vec![Part::Text { text: filler(600) }],
            vec![],
        ),
        Line::Record(Record::OperationFinished {
            op,
            outcome: Outcome::Completed,
            at: Utc::now(),
        }),
        Line::Record(Record::DeliverySettled {
            delivery: format!("d-{n}"),
            channel: "telegram".into(),
            op: Some(op),
            answers: Some(format!("-100:{n}")),
            settled: Settled::Sent {
                platform_id: format!("-100:{}", n + 1),
            },
            at: Utc::now(),
        }),
    ];
    (lines, answer)
}

async fn write_lane(sessions: &Path, lines: u64) -> u64 {
    let lane = LaneName::try_from("bench").expect("a lane name");
    let (log, _) = LaneLog::open(sessions, &lane, system_clock()).expect("the lane opens");
    let mut written = 1;
    let mut parent = None;
    let mut n = 0;
    while written < lines {
        let (turn, leaf) = turn(n, parent);
        for line in &turn {
            log.append(line).await.expect("append");
        }
        written += turn.len() as u64;
        parent = Some(leaf);
        n += 1;
    }
    log.close().await.expect("the lane closes");
    written
}

fn main() {
    let smoke = std::env::args().any(|arg| arg == "--smoke");
    let lines = if smoke { 20_000 } else { 100_000 };
    let agent = tempfile::tempdir().expect("a temporary directory");
    let perch = env!("CARGO_BIN_EXE_perch");
    let init = Command::new(perch)
        .args(["init", agent.path().to_str().expect("a UTF-8 path")])
        .output()
        .expect("perch init runs");
    assert!(init.status.success(), "perch init");
    let sessions = agent.path().join(".perch/sessions");
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let written = runtime.block_on(write_lane(&sessions, lines));
    let bytes = std::fs::metadata(sessions.join("bench/000001.jsonl"))
        .expect("the segment")
        .len();
    #[expect(clippy::cast_precision_loss, reason = "a size to print")]
    let megabytes = bytes as f64 / 1e6;
    println!(
        "perch log: the last {TURNS_SHOWN} turns of a {written}-line lane of {megabytes:.0} MB ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    let query = perch::log::transcript::Query {
        lane: Some(LaneName::try_from("bench").expect("a lane name")),
        selection: Selection::default(),
        last: TURNS_SHOWN,
        redaction: Redaction::new(["sk-bench-not-a-real-key".to_owned()]),
        ends: Default::default(),
    };
    let mut best = Duration::MAX;
    let mut shown = 0;
    let mut text_len = 0;
    for _ in 0..5 {
        let began = Instant::now();
        let turns = perch::log::transcript::last_turns(&sessions, &query).expect("the lane reads");
        let mut text = String::new();
        for turn in &turns {
            render_turn(turn, &mut text);
        }
        best = best.min(began.elapsed());
        shown = turns.len();
        text_len = text.len();
    }
    println!(
        "  read through the index, assemble and render : {best:>9.2?}   (best of 5; {shown} turns, {text_len} bytes of text)   (target: well under 1 s)"
    );
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let began = Instant::now();
        let output = Command::new(perch)
            .args([
                "log",
                agent.path().to_str().expect("a UTF-8 path"),
                "--lane",
                "bench",
                "-n",
            ])
            .arg(TURNS_SHOWN.to_string())
            .output()
            .expect("perch log runs");
        best = best.min(began.elapsed());
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!(
        "  `perch log --lane bench -n {TURNS_SHOWN}`, the whole process: {best:>9.2?}   (best of 3; loads the agent too)"
    );
    let began = Instant::now();
    let output = Command::new(perch)
        .args([
            "log",
            agent.path().to_str().expect("a UTF-8 path"),
            "--lanes",
        ])
        .output()
        .expect("perch log --lanes runs");
    assert!(output.status.success());
    println!(
        "  `perch log --lanes` (spend from every model reply)  : {:>9.2?}",
        began.elapsed()
    );
}
