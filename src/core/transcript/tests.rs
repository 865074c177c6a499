use super::assemble::{Assembler, UserEntry, user_entry};
use super::render::{json_line, render_event, render_turn};
use super::*;
use crate::Timestamp;
use crate::id::{EntryId, OperationId};
use crate::log::Previous;
use crate::log::{
    Entry, EntryBody, Header, Intent, Line, LinePosition, Message, Outcome, Part, ReadLine, Record,
    Role, Settled, Trigger,
};
use crate::name::LaneName;
use crate::origin::{MessageOrigin, Relay};
use crate::origin::{Person, Quoted};
use crate::spend::Money;
use chrono::TimeDelta;
use chrono::TimeZone;

fn at(minute: u32) -> Timestamp {
    chrono::Utc
        .with_ymd_and_hms(2026, 12, 2, 9, minute, 0)
        .unwrap()
}

fn lane() -> LaneName {
    LaneName::try_from("tg-team").unwrap()
}

fn op(n: u8) -> OperationId {
    OperationId::from_bytes([n; 16])
}

fn id(n: u8) -> EntryId {
    EntryId::from_bytes([n; 16])
}

fn origin(sender: &str, name: &str, channel: &str, room: &str) -> MessageOrigin {
    MessageOrigin {
        sender: Person {
            id: sender.into(),
            name: name.into(),
        },
        channel: channel.into(),
        room: room.into(),
        thread: None,
        sent_at: at(0),
        direct: false,
        replying_to: None,
        earlier: Vec::new(),
    }
}

fn started(n: u8, resumed: bool, minute: u32) -> Line {
    Line::Record(Record::OperationStarted {
        op: op(n),
        intent: Intent::Run,
        consumes: vec![],
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

fn message(n: u8, role: Role, parts: Vec<Part>, origins: Vec<MessageOrigin>, minute: u32) -> Line {
    Line::Entry(Entry {
        id: id(n),
        parent: None,
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

fn user(n: u8, said: &str, from: Option<MessageOrigin>, minute: u32) -> Line {
    message(
        n,
        Role::User,
        vec![text(said)],
        from.into_iter().collect(),
        minute,
    )
}

fn reply(n: u8, said: &str, minute: u32) -> Line {
    message(n, Role::Assistant, vec![text(said)], vec![], minute)
}

fn replied(n: u8, input: u64, output: u64, cost: Option<u64>, minute: u32) -> Line {
    Line::Record(Record::ModelReplied {
        op: op(n),
        attempt: 1,
        model: "openai/gpt-5-mini".into(),
        input,
        output,
        cached: 0,
        cost: cost.map(Money::from_micros),
        at: at(minute),
    })
}

fn assemble(lines: Vec<Line>) -> Vec<Turn> {
    assemble_with(lines, Redaction::default())
}

fn assemble_with(lines: Vec<Line>, redaction: Redaction) -> Vec<Turn> {
    let mut assembler = Assembler::new(lane(), redaction);
    for (index, line) in lines.into_iter().enumerate() {
        let position = LinePosition {
            lane: lane(),
            segment: 1,
            offset: index as u64 * 100,
        };
        assembler.push(position, &ReadLine::Line(line));
    }
    assembler.into_turns()
}

fn kinds(turn: &Turn) -> Vec<String> {
    turn.events
        .iter()
        .map(|event| {
            serde_json::to_value(event).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn heartbeat_note(outcome: serde_json::Value, minute: u32) -> Line {
    Line::Entry(Entry {
        id: id(90),
        parent: None,
        at: at(minute),
        body: EntryBody::Note(crate::log::Note::from_data(
            "heartbeat_outcome".into(),
            serde_json::json!({
                "task": "digest",
                "slot": "2026-12-02T09:00:00+00:00",
                "run": "run-1",
                "mode": "scheduled",
                "outcome": outcome,
            }),
        )),
    })
}

#[test]
fn turns_begin_at_runs_and_gather_what_each_run_did() {
    struct Case {
        name: &'static str,
        lines: Vec<Line>,
        turns: Vec<Vec<&'static str>>,
    }
    let header = Line::Header(Header {
        version: 1,
        session: crate::id::SessionId::from_bytes([7; 16]),
        lane: lane(),
        segment: 2,
        created: at(0),
        previous: Some(Previous {
            file: "000001.jsonl".into(),
            leaf: None,
        }),
    });
    let delivered = |n: u8| {
        Line::Record(Record::DeliverySettled {
            delivery: format!("d-{n}"),
            channel: "tg".into(),
            op: Some(op(n)),
            answers: Some("-100:4".into()),
            settled: Settled::Unknown {
                reason: "perch stopped mid-send".into(),
            },
            at: at(30),
        })
    };
    let cases = vec![
        Case {
            name: "two plain runs, a header before them",
            lines: vec![
                header,
                started(1, false, 1),
                user(2, "hi", None, 1),
                reply(3, "hello", 1),
                finished(1, Outcome::Completed, 1),
                started(4, false, 2),
                user(5, "again", None, 2),
                finished(4, Outcome::Completed, 2),
            ],
            turns: vec![
                vec!["segment_started"],
                vec![
                    "run_started",
                    "user_message",
                    "assistant_message",
                    "operation_finished",
                ],
                vec!["run_started", "user_message", "operation_finished"],
            ],
        },
        Case {
            name: "an interrupted run and its resumption are one turn",
            lines: vec![
                started(1, false, 1),
                user(2, "deploy", None, 1),
                finished(
                    1,
                    Outcome::Interrupted {
                        reason: "perch stopped".into(),
                    },
                    5,
                ),
                started(3, true, 5),
                reply(4, "done", 5),
                finished(3, Outcome::Completed, 6),
            ],
            turns: vec![vec![
                "run_started",
                "user_message",
                "operation_finished",
                "run_started",
                "assistant_message",
                "operation_finished",
            ]],
        },
        Case {
            name: "a delivery settled later joins the turn of its operation",
            lines: vec![
                started(1, false, 1),
                user(2, "hi", None, 1),
                finished(1, Outcome::Completed, 1),
                started(3, false, 2),
                user(4, "more", None, 2),
                delivered(1),
                finished(3, Outcome::Completed, 2),
            ],
            turns: vec![
                vec![
                    "run_started",
                    "user_message",
                    "operation_finished",
                    "delivery_settled",
                ],
                vec!["run_started", "user_message", "operation_finished"],
            ],
        },
        Case {
            name: "a heartbeat's correction joins its firing, and the note closes it",
            lines: vec![
                started(1, false, 1),
                user(
                    2,
                    "[heartbeat digest for 2026-12-02T09:00:00+00:00]\n\nPost it.",
                    None,
                    1,
                ),
                reply(3, "Sure, here it is.", 1),
                finished(1, Outcome::Completed, 1),
                started(4, false, 2),
                user(
                    5,
                    "That reply is not a valid verdict: the reply is not a verdict. Your whole reply to a heartbeat is one verdict",
                    None,
                    2,
                ),
                reply(6, "Message: Stand-up at ten.", 2),
                finished(4, Outcome::Completed, 2),
                heartbeat_note(
                    serde_json::json!({"outcome": "message", "text": "Stand-up at ten.", "target": "ops:standup", "delivery": "d-9"}),
                    2,
                ),
            ],
            turns: vec![vec![
                "run_started",
                "heartbeat_prompt",
                "assistant_message",
                "operation_finished",
                "run_started",
                "heartbeat_correction",
                "assistant_message",
                "operation_finished",
                "heartbeat_outcome",
            ]],
        },
        Case {
            name: "a heartbeat's delivery, settled after the next firing, joins its turn",
            lines: vec![
                started(1, false, 1),
                user(
                    2,
                    "[heartbeat digest for 2026-12-02T09:00:00+00:00]",
                    None,
                    1,
                ),
                finished(1, Outcome::Completed, 1),
                heartbeat_note(
                    serde_json::json!({"outcome": "message", "text": "Hi.", "target": "ops:standup", "delivery": "d-9"}),
                    1,
                ),
                started(3, false, 2),
                user(
                    4,
                    "[heartbeat digest for 2026-12-02T10:00:00+00:00]",
                    None,
                    2,
                ),
                Line::Record(Record::DeliverySettled {
                    delivery: "d-9".into(),
                    channel: "ops".into(),
                    op: None,
                    answers: None,
                    settled: Settled::Sent {
                        platform_id: "77".into(),
                    },
                    at: at(2),
                }),
                finished(3, Outcome::Completed, 2),
            ],
            turns: vec![
                vec![
                    "run_started",
                    "heartbeat_prompt",
                    "operation_finished",
                    "heartbeat_outcome",
                    "delivery_settled",
                ],
                vec!["run_started", "heartbeat_prompt", "operation_finished"],
            ],
        },
        Case {
            name: "a steer joins the run under way",
            lines: vec![
                started(1, false, 1),
                user(2, "look", None, 1),
                user(3, "and this too", None, 1),
                finished(1, Outcome::Cancelled, 1),
            ],
            turns: vec![vec![
                "run_started",
                "user_message",
                "user_message",
                "operation_finished",
            ]],
        },
    ];
    for case in cases {
        let turns = assemble(case.lines);
        let got: Vec<Vec<String>> = turns.iter().map(kinds).collect();
        assert_eq!(got, case.turns, "{}", case.name);
    }
}

#[test]
fn a_turn_knows_its_origin_usage_and_judgements() {
    let from = MessageOrigin {
        replying_to: Some(Quoted {
            platform_id: "-100:3".into(),
            author: Some(Person {
                id: "7".into(),
                name: "Bo".into(),
            }),
            text: "earlier".into(),
        }),
        ..origin("1001", "Ana", "telegram", "team")
    };
    let turns = assemble(vec![
        started(1, false, 1),
        user(2, "hi", Some(from), 1),
        Line::Record(Record::AttemptStarted {
            op: op(1),
            attempt: 1,
            at: at(1),
        }),
        Line::Record(Record::AttemptStarted {
            op: op(1),
            attempt: 2,
            at: at(1),
        }),
        replied(1, 1200, 300, Some(3100), 1),
        message(
            3,
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "x".repeat(312),
                    signature: None,
                },
                text("hello"),
            ],
            vec![],
            1,
        ),
        replied(1, 100, 20, Some(900), 1),
        finished(1, Outcome::Completed, 1),
    ]);
    let facts = &turns[0].facts;
    assert_eq!(facts.at, Some(at(1)));
    assert_eq!(facts.origins[0].sender_name, "Ana");
    assert_eq!(facts.origins[0].replying_to.as_deref(), Some("-100:3"));
    assert_eq!(
        (
            facts.input_tokens,
            facts.output_tokens,
            facts.cost_micros,
            facts.model_calls
        ),
        (1300, 320, 4000, 2)
    );
    let retries: Vec<bool> = turns[0]
        .events
        .iter()
        .filter_map(|event| match event.kind {
            EventKind::AttemptStarted { retry, .. } => Some(retry),
            _ => None,
        })
        .collect();
    assert_eq!(retries, vec![false, true]);
    let mut text = String::new();
    render_turn(&turns[0], &mut text);
    for expected in [
        "tg-team  telegram:team  Ana (1001)",
        "user      Ana: hi",
        "replying to -100:3 by Bo: \"earlier\"",
        "[reasoning: 312 chars]",
        "reply     hello",
        "retry     request 2",
        "usage     2 model calls, 1300 tokens in, 320 out, cost 0.004",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }

    let heartbeat = assemble(vec![
        started(1, false, 1),
        user(
            2,
            "[heartbeat digest for 2026-12-02T09:00:00+00:00, standing in for 2 missed runs]",
            None,
            1,
        ),
        reply(3, "Sure, here it is.", 1),
        finished(1, Outcome::Completed, 1),
        started(4, false, 2),
        user(
            5,
            "That reply is not a valid verdict: the reply is not a verdict: it is neither SILENCE nor starts with `Message: ` or `Steer: `. Your whole reply to a heartbeat is one verdict",
            None,
            2,
        ),
        reply(6, "SILENCE", 2),
        finished(4, Outcome::Completed, 2),
    ]);
    assert_eq!(heartbeat.len(), 1);
    assert_eq!(heartbeat[0].facts.task.as_deref(), Some("digest"));
    assert_eq!(
        heartbeat[0].facts.slot.as_deref(),
        Some("2026-12-02T09:00:00+00:00")
    );
    let verdicts: Vec<Option<String>> = heartbeat[0]
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::AssistantMessage { verdict, .. } => {
                Some(verdict.as_ref().and_then(|v| v.verdict.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(verdicts, vec![None, Some("silence".to_owned())]);
    assert!(
        heartbeat[0]
            .events
            .iter()
            .all(|event| event.turn == heartbeat[0].start),
        "the correction's events name the firing's turn"
    );
}

#[test]
fn secrets_and_terminal_controls_never_reach_the_output() {
    let secret = "sk-live-0123456789abcdef";
    let turns = assemble_with(
        vec![
            started(1, false, 1),
            user(
                2,
                "\u{1b}[2Jmy key is sk-live-0123456789abcdef",
                Some(origin("1", "Eve\u{202e}", "telegram", "team")),
                1,
            ),
            Line::Record(Record::ToolStarted {
                op: op(1),
                call_id: "c1".into(),
                tool: crate::name::ToolName::try_from("bash").unwrap(),
                arguments: serde_json::json!({"command": format!("curl -H {secret}")}),
                result: id(4),
                replay: crate::config::Replay::Never,
                at: at(1),
            }),
            message(
                4,
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: "c1".into(),
                    output: "token 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw\n\
                             SLACK_BOT_TOKEN=xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy\n"
                        .into(),
                    is_error: false,
                }],
                vec![],
                1,
            ),
            finished(1, Outcome::Completed, 1),
        ],
        Redaction::new([secret.to_owned()]),
    );
    let mut text = String::new();
    render_turn(&turns[0], &mut text);
    let json: String = turns[0]
        .events
        .iter()
        .map(|event| serde_json::to_string(event).unwrap())
        .collect();
    for shown in [&text, &json] {
        assert!(!shown.contains(secret), "{shown}");
        assert!(
            !shown.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"),
            "{shown}"
        );
        assert!(!shown.contains("pdFZKVeTuE8sk7oOcBrzbqgy"), "{shown}");
    }
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(text.contains("\\u{1b}[2J"), "{text}");
    assert!(
        text.contains("<redacted>") && text.contains("<token>"),
        "{text}"
    );
}

#[test]
fn selection_picks_turns_by_place_sender_task_and_window() {
    let turns = assemble(vec![
        started(1, false, 1),
        user(2, "a", Some(origin("1001", "Ana", "telegram", "team")), 1),
        finished(1, Outcome::Completed, 1),
        started(3, false, 20),
        user(4, "b", Some(origin("2002", "Bo", "discord", "ops")), 20),
        finished(3, Outcome::Completed, 20),
        started(5, false, 40),
        user(
            6,
            "[heartbeat digest for 2026-12-02T09:40:00+00:00]",
            None,
            40,
        ),
        finished(5, Outcome::Completed, 40),
    ]);
    let place = |text: &str| Some(Place::parse(text).unwrap());
    let cases: Vec<(&str, Selection, Vec<usize>)> = vec![
        ("everything", Selection::default(), vec![0, 1, 2]),
        (
            "a channel",
            Selection {
                place: place("telegram"),
                ..Selection::default()
            },
            vec![0],
        ),
        (
            "a channel and room",
            Selection {
                place: place("discord:ops"),
                ..Selection::default()
            },
            vec![1],
        ),
        (
            "another room",
            Selection {
                place: place("discord:general"),
                ..Selection::default()
            },
            vec![],
        ),
        (
            "a sender by id",
            Selection {
                sender: Some("2002".into()),
                ..Selection::default()
            },
            vec![1],
        ),
        (
            "a sender by name, any case",
            Selection {
                sender: Some("ana".into()),
                ..Selection::default()
            },
            vec![0],
        ),
        (
            "a task",
            Selection {
                task: Some("digest".into()),
                ..Selection::default()
            },
            vec![2],
        ),
        (
            "heartbeat as a place",
            Selection {
                place: place("heartbeat:digest"),
                ..Selection::default()
            },
            vec![2],
        ),
        (
            "since, inclusive",
            Selection {
                since: Some(at(20)),
                ..Selection::default()
            },
            vec![1, 2],
        ),
        (
            "until, exclusive",
            Selection {
                until: Some(at(20)),
                ..Selection::default()
            },
            vec![0],
        ),
    ];
    for (name, selection, expected) in cases {
        let got: Vec<usize> = turns
            .iter()
            .enumerate()
            .filter(|(_, turn)| selection.selects(turn))
            .map(|(index, _)| index)
            .collect();
        assert_eq!(got, expected, "{name}");
    }
    assert!(Place::parse("telegram:").is_err());
    assert!(Place::parse(":team").is_err());
    assert_eq!(
        Place::parse("tg:-100:7").unwrap(),
        Place {
            channel: "tg".into(),
            room: Some("-100:7".into())
        }
    );
    let since = Selection {
        since: Some(at(20)),
        ..Selection::default()
    };
    assert!(since.wants_before(Some(at(30))));
    assert!(!since.wants_before(Some(at(10))));
    assert!(Selection::default().wants_before(Some(at(0))));
}

#[test]
fn time_windows_are_durations_before_now_or_times() {
    let now = at(30);
    let cases: &[(&str, Option<Timestamp>)] = &[
        ("30m", Some(at(0))),
        ("90s", Some(now - TimeDelta::seconds(90))),
        ("2h", Some(now - TimeDelta::hours(2))),
        ("3d", Some(now - TimeDelta::days(3))),
        ("1w", Some(now - TimeDelta::days(7))),
        ("2026-12-02T09:10:00Z", Some(at(10))),
        ("2026-12-02T10:10:00+01:00", Some(at(10))),
        (
            "2026-12-01",
            Some(chrono::Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()),
        ),
        ("", None),
        ("2x", None),
        ("h", None),
        ("-2h", None),
        ("yesterday", None),
        ("99999999999999999d", None),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_when(text, now).ok(), *expected, "{text:?}");
    }
    assert!(parse_when("2x", now).unwrap_err().contains("30m, 2h"));
}

#[test]
fn every_delivery_state_and_damage_is_drawn() {
    let settled = |settled: Settled| {
        Line::Record(Record::DeliverySettled {
            delivery: "d-1".into(),
            channel: "tg".into(),
            op: None,
            answers: Some("-100:4".into()),
            settled,
            at: at(1),
        })
    };
    let mut assembler = Assembler::new(lane(), Redaction::default());
    let position = |offset| LinePosition {
        lane: lane(),
        segment: 1,
        offset,
    };
    let cases = [
        (
            settled(Settled::Sent {
                platform_id: "-100:5".into(),
            }),
            "delivery  sent as message -100:5 on tg (d-1), answering -100:4",
        ),
        (
            settled(Settled::Unknown {
                reason: "stopped mid-send".into(),
            }),
            "delivery  unknown on tg (d-1), answering -100:4: stopped mid-send",
        ),
        (
            settled(Settled::NotSent {
                reason: "too long".into(),
            }),
            "delivery  not_sent on tg (d-1), answering -100:4: too long",
        ),
        (
            settled(Settled::Dropped {
                reason: "too old".into(),
            }),
            "delivery  dropped on tg (d-1), answering -100:4: too old",
        ),
    ];
    for (offset, (line, expected)) in cases.into_iter().enumerate() {
        let event = assembler.push(position(offset as u64), &ReadLine::Line(line));
        assert_eq!(render_event(&event), vec![format!("  {expected}")]);
    }
    let damaged = assembler.push(
        position(99),
        &ReadLine::Damaged {
            file: "000001.jsonl".into(),
            line: 7,
            reason: "not a log line".into(),
        },
    );
    assert_eq!(damaged.at, None);
    assert_eq!(
        render_event(&damaged),
        vec!["  DAMAGED   000001.jsonl:7: not a log line".to_owned()]
    );
    let json = serde_json::to_value(&damaged).unwrap();
    assert_eq!(json["kind"], "damaged");
    assert_eq!(json["position"]["offset"], 99);
    assert_eq!(json["line"], 7);
}

#[test]
fn json_lines_escape_what_a_terminal_would_act_on_and_still_decode() {
    let said = "a\u{1b}[2J b\u{202e}c d\u{9b}e f\u{e0041}g 👍";
    let turns = assemble(vec![started(1, false, 1), user(2, said, None, 1)]);
    let line = json_line(&turns[0].events[1]);
    assert!(
        line.chars()
            .all(|ch| !crate::terminal::is_unsafe_for_terminal(ch)),
        "{line}"
    );
    assert!(
        line.contains("\\u202e") && line.contains("\\udb40\\udc41"),
        "{line}"
    );
    let back: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(back["messages"][0]["text"], said);
}

#[test]
fn a_compaction_and_the_segment_it_starts_are_drawn_in_the_turn_before() {
    let turns = assemble(vec![
        started(1, false, 1),
        user(2, "hi", None, 1),
        finished(1, Outcome::Completed, 1),
        Line::Record(Record::OperationStarted {
            op: op(3),
            intent: Intent::Compact,
            consumes: vec![],
            resumed: false,
            trigger: Some(Trigger::ContextFull),
            at: at(2),
        }),
        Line::Entry(crate::conversation::summary_entry(
            id(4),
            "the summary",
            Some(id(2)),
            at(2),
        )),
        finished(3, Outcome::Completed, 2),
        Line::Header(Header {
            version: 1,
            session: crate::id::SessionId::from_bytes([7; 16]),
            lane: lane(),
            segment: 2,
            created: at(2),
            previous: Some(Previous {
                file: "000001.jsonl".into(),
                leaf: Some(id(4)),
            }),
        }),
    ]);
    assert_eq!(turns.len(), 1);
    let mut text = String::new();
    render_turn(&turns[0], &mut text);
    for expected in [
        "compact   compaction started, since the conversation neared the model's context window",
        "compact   summary of 11 chars; the lane continues from it",
        "end       compaction completed",
        "log       segment 2, continuing 000001.jsonl",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    let summary = turns[0]
        .events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::CompactionSummary { replaces, .. } => Some(replaces.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(summary, Some(id(2).to_string()));
}

mod triggers;
