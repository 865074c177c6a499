use chrono::Utc;
use perch::host::clock::{Clock, system_clock};
use perch::log::{LaneLog, recover};
use perch_core::config::Replay;
use perch_core::id::{EntryId, OperationId};
use perch_core::log::{
    Entry, EntryBody, Intent, Line, Message, Outcome, Part, PendingTool, Record, Role,
};
use perch_core::name::{LaneName, ToolName};
use std::path::Path;
use std::time::{Duration, Instant};

fn new_entry_id() -> EntryId {
    EntryId::from_uuid(uuid::Uuid::now_v7())
}

fn new_op() -> OperationId {
    OperationId::from_uuid(uuid::Uuid::now_v7())
}

fn lane() -> LaneName {
    LaneName::try_from("bench").expect("a valid lane name")
}

fn message(id: EntryId, parent: Option<EntryId>, role: Role, parts: Vec<Part>) -> Line {
    Line::Entry(Entry {
        id,
        parent,
        at: Utc::now(),
        body: EntryBody::Message(Message {
            role,
            parts,
            origins: Vec::new(),
            relay: None,
        }),
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// Appends/s and commit latency with 64 producers, each awaiting its own append.
pub async fn group_commit(smoke: bool) {
    const PRODUCERS: usize = 64;
    let per_producer = if smoke { 100 } else { 500 };
    println!(
        "\ngroup commit: {PRODUCERS} producers x {per_producer} appends, each awaiting its own"
    );
    for sync in [false, true] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (log, _) = LaneLog::open(dir.path(), &lane(), system_clock()).expect("the lane opens");
        let started = Instant::now();
        let mut producers = Vec::new();
        for _ in 0..PRODUCERS {
            let log = log.clone();
            producers.push(tokio::spawn(async move {
                let op = new_op();
                if sync {
                    let start = Line::Record(Record::OperationStarted {
                        op,
                        intent: Intent::Run,
                        consumes: vec![],
                        resumed: false,
                        trigger: None,
                        at: Utc::now(),
                    });
                    log.append(&start).await.expect("append");
                }
                let mut parent = None;
                let mut latencies = Vec::with_capacity(per_producer);
                for n in 0..per_producer {
                    let id = new_entry_id();
                    let line = if sync {
                        Line::Record(Record::ToolStarted {
                            op,
                            call_id: format!("call-{n}"),
                            tool: ToolName::try_from("deploy").expect("a valid tool name"),
                            arguments: serde_json::json!({ "target": "staging", "n": n }),
                            result: id,
                            replay: Replay::Never,
                            at: Utc::now(),
                        })
                    } else {
                        message(
                            id,
                            parent,
                            Role::Assistant,
                            vec![Part::Text {
                                text: format!("step {n} of the plan, with a sentence of detail"),
                            }],
                        )
                    };
                    let began = Instant::now();
                    log.append(&line).await.expect("append");
                    latencies.push(began.elapsed());
                    parent = Some(id);
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for producer in producers {
            latencies.extend(producer.await.expect("the producer finishes"));
        }
        let elapsed = started.elapsed();
        log.close().await.expect("the lane closes");
        latencies.sort_unstable();
        let rate = latencies.len() as f64 / elapsed.as_secs_f64();
        let (label, target) = if sync {
            ("fsync, group commit", "   (target: >= 20,000 appends/s)")
        } else {
            ("flush only         ", "")
        };
        println!(
            "  {label}: {rate:>9.0} appends/s   p50 {:>8.2?}   p99 {:>8.2?}{target}",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
        );
    }
}

/// A deterministic pseudo-random sequence, so every run writes the same lane.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self, low: usize, high: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        low + (self.0 >> 33) as usize % (high - low)
    }
}

fn filler(len: usize) -> String {
    const WORDS: &str = "src/main.rs:12: let value = compute(input)?; // output line of a tool run in the microVM\n";
    WORDS.chars().cycle().take(len).collect()
}

/// Writes a lane of `lines` lines shaped like real runs: records, short messages, long tool
/// outputs. Returns the segment's size in bytes.
async fn write_realistic_lane(dir: &Path, lines: u64) -> u64 {
    let (log, _) = LaneLog::open(dir, &lane(), system_clock()).expect("the lane opens");
    let mut sizes = Sizes(42);
    let mut parent: Option<EntryId> = None;
    let mut written = 1;
    while written < lines {
        let op = new_op();
        let mut turn = Vec::new();
        turn.push(Line::Record(Record::OperationStarted {
            op,
            intent: Intent::Run,
            consumes: vec!["telegram:1234".into()],
            resumed: false,
            trigger: None,
            at: Utc::now(),
        }));
        let user = new_entry_id();
        turn.push(message(
            user,
            parent,
            Role::User,
            vec![Part::Text {
                text: filler(sizes.next(40, 400)),
            }],
        ));
        turn.push(Line::Record(Record::AttemptStarted {
            op,
            attempt: 1,
            at: Utc::now(),
        }));
        let mut last = user;
        for call in 0..sizes.next(1, 4) {
            let assistant = new_entry_id();
            let call_id = format!("call-{call}");
            turn.push(message(
                assistant,
                Some(last),
                Role::Assistant,
                vec![
                    Part::Reasoning {
                        text: filler(sizes.next(100, 600)),
                        signature: None,
                    },
                    Part::ToolCall {
                        call_id: call_id.clone(),
                        name: "bash".into(),
                        arguments: serde_json::json!({ "command": filler(sizes.next(20, 120)) }),
                    },
                ],
            ));
            let result = new_entry_id();
            turn.push(Line::Record(Record::ToolStarted {
                op,
                call_id: call_id.clone(),
                tool: ToolName::try_from("bash").expect("a valid tool name"),
                arguments: serde_json::json!({ "command": "cargo test" }),
                result,
                replay: Replay::Never,
                at: Utc::now(),
            }));
            let output = if sizes.next(0, 3) == 0 {
                sizes.next(4_000, 24_000)
            } else {
                sizes.next(100, 3_000)
            };
            turn.push(message(
                result,
                Some(assistant),
                Role::Tool,
                vec![Part::ToolResult {
                    call_id,
                    output: filler(output),
                    is_error: false,
                }],
            ));
            last = result;
        }
        let answer = new_entry_id();
        turn.push(message(
            answer,
            Some(last),
            Role::Assistant,
            vec![Part::Text {
                text: filler(sizes.next(100, 1_500)),
            }],
        ));
        turn.push(Line::Record(Record::OperationFinished {
            op,
            outcome: Outcome::Completed,
            at: Utc::now(),
        }));
        parent = Some(answer);
        written += turn.len() as u64;
        for line in turn {
            log.append(&line).await.expect("append");
        }
    }
    let crashed = new_op();
    let question = new_entry_id();
    for line in [
        Line::Record(Record::OperationStarted {
            op: crashed,
            intent: Intent::Run,
            consumes: vec![],
            resumed: false,
            trigger: None,
            at: Utc::now(),
        }),
        message(
            question,
            parent,
            Role::User,
            vec![Part::Text {
                text: "and deploy it".into(),
            }],
        ),
        Line::Record(Record::ToolStarted {
            op: crashed,
            call_id: "call-deploy".into(),
            tool: ToolName::try_from("deploy").expect("a valid tool name"),
            arguments: serde_json::json!({ "target": "production" }),
            result: new_entry_id(),
            replay: Replay::Never,
            at: Utc::now(),
        }),
    ] {
        log.append(&line).await.expect("append");
    }
    log.close().await.expect("the lane closes");
    std::fs::metadata(dir.join("bench").join("000001.jsonl"))
        .expect("the segment exists")
        .len()
}

/// Time to open and recover a 100,000-line lane.
pub async fn reopen(smoke: bool) {
    let lines = if smoke { 20_000 } else { 100_000 };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bytes = write_realistic_lane(dir.path(), lines).await;
    println!(
        "\nreopen: a {lines}-line lane of {:.0} MB (records, short messages, tool outputs up to 24 KB)",
        bytes as f64 / 1e6
    );

    let clock: Clock = system_clock();
    let began = Instant::now();
    let (log, report) = LaneLog::open(dir.path(), &lane(), clock.clone()).expect("the lane opens");
    let recovered = recover(
        &log,
        |_| Some(Replay::Never),
        |_: &PendingTool| -> std::future::Ready<perch::log::ToolRerun> {
            unreachable!("nothing is replayable")
        },
        &clock,
    )
    .await
    .expect("recovery");
    let first = began.elapsed();
    log.close().await.expect("the lane closes");
    println!(
        "  open + recover (one interrupted run) : {first:>8.2?}   ({} lines; closed {} operation, {} interrupted tool)   (target: <= 100 ms)",
        report.lines, recovered.operations_closed, recovered.tools_interrupted
    );
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let began = Instant::now();
        let (log, _) = LaneLog::open(dir.path(), &lane(), clock.clone()).expect("the lane opens");
        let pending = log.pending_tools().await.expect("pending tools");
        assert!(pending.is_empty(), "recovery closed everything");
        best = best.min(began.elapsed());
        log.close().await.expect("the lane closes");
    }
    println!("  open + recovery scan, nothing open   : {best:>8.2?}   (best of 5)");

    let (log, _) = LaneLog::open(dir.path(), &lane(), clock.clone()).expect("the lane opens");
    let began = Instant::now();
    let branch = log.branch().await.expect("the branch reads");
    println!(
        "  read the whole current branch        : {:>8.2?}   ({} entries, checksummed and parsed)",
        began.elapsed(),
        branch.len()
    );
    log.close().await.expect("the lane closes");

    std::fs::remove_file(dir.path().join("bench").join("000001.idx")).expect("the index exists");
    let began = Instant::now();
    let (log, _) = LaneLog::open(dir.path(), &lane(), clock).expect("the lane opens");
    println!(
        "  open after losing the index (parse)  : {:>8.2?}   (one-off: the index is rewritten)",
        began.elapsed()
    );
    log.close().await.expect("the lane closes");
}
