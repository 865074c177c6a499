use super::*;
use crate::log::{HeartbeatNote, RunMode};
use chrono::TimeZone;

fn at() -> Timestamp {
    chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
}

#[test]
fn lines_have_three_shapes_on_disk() {
    let op = OperationId::from_bytes([1; 16]);
    let record = Line::Record(Record::OperationFinished {
        op,
        outcome: Outcome::Failed {
            reason: "model unreachable".into(),
        },
        at: at(),
    });
    let text = serde_json::to_string(&record).unwrap();
    assert_eq!(
        text,
        r#"{"kind":"record","type":"operation_finished","op":"01010101-0101-0101-0101-010101010101","outcome":{"status":"failed","reason":"model unreachable"},"at":"2026-11-30T06:00:00Z"}"#
    );
    assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), record);

    let entry = Line::Entry(Entry {
        id: EntryId::from_bytes([2; 16]),
        parent: None,
        at: at(),
        body: EntryBody::Message(Message::new(
            Role::User,
            vec![Part::Text { text: "hi".into() }],
        )),
    });
    let text = serde_json::to_string(&entry).unwrap();
    assert!(
        text.starts_with(r#"{"kind":"entry","id":"02020202"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#""body":{"type":"message","role":"user","parts":[{"type":"text","text":"hi"}]}"#
        ),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), entry);
}

#[test]
fn a_user_message_keeps_its_origins() {
    use crate::origin::{MessageOrigin, Person, Quoted};
    let message = Message {
        role: Role::User,
        parts: vec![Part::Text { text: "hi".into() }],
        origins: vec![MessageOrigin {
            sender: Person {
                id: "1001".into(),
                name: "Ana".into(),
            },
            channel: "tg".into(),
            room: "ops".into(),
            thread: Some("7".into()),
            sent_at: at(),
            direct: false,
            replying_to: Some(Quoted {
                platform_id: "-100:4".into(),
                author: Some(Person {
                    id: "1002".into(),
                    name: "Bo".into(),
                }),
                text: "earlier".into(),
            }),
            earlier: vec!["- Carol (id 9): hi".into()],
        }],
        relay: None,
    };
    let text = serde_json::to_string(&message).unwrap();
    assert_eq!(
        text,
        r#"{"role":"user","parts":[{"type":"text","text":"hi"}],"origins":[{"sender":{"id":"1001","name":"Ana"},"channel":"tg","room":"ops","thread":"7","sent_at":"2026-11-30T06:00:00Z","direct":false,"replying_to":{"platform_id":"-100:4","author":{"id":"1002","name":"Bo"},"text":"earlier"},"earlier":["- Carol (id 9): hi"]}]}"#
    );
    assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), message);
    let direct = r#"{"role":"user","parts":[{"type":"text","text":"hi"}],"origins":[{"sender":{"id":"1001","name":"Ana"},"channel":"tg","room":"1001","sent_at":"2026-11-30T06:00:00Z","direct":true}]}"#;
    let read: Message = serde_json::from_str(direct).unwrap();
    assert!(read.origins[0].direct && read.origins[0].replying_to.is_none());
    let older: Message =
        serde_json::from_str(r#"{"role":"user","parts":[{"type":"text","text":"hi"}]}"#).unwrap();
    assert!(
        older.origins.is_empty(),
        "lanes written before origins still read"
    );
}

#[test]
fn unknown_fields_are_corruption_not_ignored() {
    let text = r#"{"kind":"record","type":"leaf_set","leaf":"02020202-0202-0202-0202-020202020202","at":"2026-11-30T06:00:00Z","extra":1}"#;
    assert!(serde_json::from_str::<Line>(text).is_err());
}

#[test]
fn only_lines_before_irreversible_effects_are_synced() {
    let tool = |replay| {
        Line::Record(Record::ToolStarted {
            op: OperationId::from_bytes([1; 16]),
            call_id: "c1".into(),
            tool: ToolName::try_from("bash").unwrap(),
            arguments: serde_json::json!({}),
            result: EntryId::from_bytes([3; 16]),
            replay,
            at: at(),
        })
    };
    assert_eq!(tool(Replay::Never).commit(), Commit::Sync);
    assert_eq!(tool(Replay::Safe).commit(), Commit::Flush);
}

#[test]
fn a_resumption_is_marked_and_older_lines_still_read() {
    let started = |resumed| {
        Line::Record(Record::OperationStarted {
            op: OperationId::from_bytes([1; 16]),
            intent: Intent::Run,
            consumes: vec!["inbox:7".into()],
            resumed,
            trigger: None,
            at: at(),
        })
    };
    let old = r#"{"kind":"record","type":"operation_started","op":"01010101-0101-0101-0101-010101010101","intent":"run","consumes":["inbox:7"],"at":"2026-11-30T06:00:00Z"}"#;
    assert_eq!(serde_json::to_string(&started(false)).unwrap(), old);
    assert_eq!(serde_json::from_str::<Line>(old).unwrap(), started(false));
    let resumed = r#"{"kind":"record","type":"operation_started","op":"01010101-0101-0101-0101-010101010101","intent":"run","consumes":["inbox:7"],"resumed":true,"at":"2026-11-30T06:00:00Z"}"#;
    assert_eq!(serde_json::to_string(&started(true)).unwrap(), resumed);
    assert_eq!(
        serde_json::from_str::<Line>(resumed).unwrap(),
        started(true)
    );
}

fn pinned(line: &Line, text: &str) {
    assert_eq!(serde_json::to_string(line).unwrap(), text);
    assert_eq!(&serde_json::from_str::<Line>(text).unwrap(), line);
    assert_eq!(line.commit(), Commit::Flush, "{text}");
}

#[test]
fn a_model_reply_records_its_usage_and_cost() {
    let replied = |cached, cost| {
        Line::Record(Record::ModelReplied {
            op: OperationId::from_bytes([1; 16]),
            attempt: 2,
            model: "openai/gpt-5".into(),
            input: 1200,
            output: 80,
            cached,
            cost,
            at: at(),
        })
    };
    pinned(
        &replied(1000, Some(Money::from_micros(4150))),
        r#"{"kind":"record","type":"model_replied","op":"01010101-0101-0101-0101-010101010101","attempt":2,"model":"openai/gpt-5","input":1200,"output":80,"cached":1000,"cost":4150,"at":"2026-11-30T06:00:00Z"}"#,
    );
    pinned(
        &replied(0, None),
        r#"{"kind":"record","type":"model_replied","op":"01010101-0101-0101-0101-010101010101","attempt":2,"model":"openai/gpt-5","input":1200,"output":80,"at":"2026-11-30T06:00:00Z"}"#,
    );
}

#[test]
fn a_finished_tool_records_its_duration_and_exit_code() {
    let finished = |exit_code, is_error| {
        Line::Record(Record::ToolFinished {
            op: OperationId::from_bytes([1; 16]),
            call_id: "c1".into(),
            result: EntryId::from_bytes([3; 16]),
            duration_ms: 1534,
            exit_code,
            is_error,
            at: at(),
        })
    };
    pinned(
        &finished(Some(3), false),
        r#"{"kind":"record","type":"tool_finished","op":"01010101-0101-0101-0101-010101010101","call_id":"c1","result":"03030303-0303-0303-0303-030303030303","duration_ms":1534,"exit_code":3,"is_error":false,"at":"2026-11-30T06:00:00Z"}"#,
    );
    pinned(
        &finished(None, true),
        r#"{"kind":"record","type":"tool_finished","op":"01010101-0101-0101-0101-010101010101","call_id":"c1","result":"03030303-0303-0303-0303-030303030303","duration_ms":1534,"is_error":true,"at":"2026-11-30T06:00:00Z"}"#,
    );
}

#[test]
fn a_settled_delivery_records_how_it_ended() {
    let settled = |op, answers, settled| {
        Line::Record(Record::DeliverySettled {
            delivery: "d0123456789abcdef01234567".into(),
            channel: "tg".into(),
            op,
            answers,
            settled,
            at: at(),
        })
    };
    let op = Some(OperationId::from_bytes([1; 16]));
    let table = [
        (
            settled(
                op,
                Some("42:17".into()),
                Settled::Sent {
                    platform_id: "42:18".into(),
                },
            ),
            r#"{"kind":"record","type":"delivery_settled","delivery":"d0123456789abcdef01234567","channel":"tg","op":"01010101-0101-0101-0101-010101010101","answers":"42:17","settled":{"state":"sent","platform_id":"42:18"},"at":"2026-11-30T06:00:00Z"}"#,
        ),
        (
            settled(
                op,
                Some("42:17".into()),
                Settled::Unknown {
                    reason: "failed: timeout".into(),
                },
            ),
            r#"{"kind":"record","type":"delivery_settled","delivery":"d0123456789abcdef01234567","channel":"tg","op":"01010101-0101-0101-0101-010101010101","answers":"42:17","settled":{"state":"unknown","reason":"failed: timeout"},"at":"2026-11-30T06:00:00Z"}"#,
        ),
        (
            settled(
                None,
                Some("42:17".into()),
                Settled::NotSent {
                    reason: "refused: Bad Request: chat not found".into(),
                },
            ),
            r#"{"kind":"record","type":"delivery_settled","delivery":"d0123456789abcdef01234567","channel":"tg","answers":"42:17","settled":{"state":"not_sent","reason":"refused: Bad Request: chat not found"},"at":"2026-11-30T06:00:00Z"}"#,
        ),
        (
            settled(
                None,
                None,
                Settled::Dropped {
                    reason: "older than the outbox's time to live".into(),
                },
            ),
            r#"{"kind":"record","type":"delivery_settled","delivery":"d0123456789abcdef01234567","channel":"tg","settled":{"state":"dropped","reason":"older than the outbox's time to live"},"at":"2026-11-30T06:00:00Z"}"#,
        ),
    ];
    for (line, text) in table {
        pinned(&line, text);
    }
}

#[test]
fn observed_records_index_as_observations_the_fold_ignores() {
    use crate::log::{LaneState, Summary};
    let op = OperationId::from_bytes([1; 16]);
    let lines = [
        r#"{"kind":"record","type":"model_replied","op":"01010101-0101-0101-0101-010101010101","attempt":1,"model":"openai/gpt-5","input":20,"output":10,"at":"2026-11-30T06:00:00Z"}"#,
        r#"{"kind":"record","type":"tool_finished","op":"01010101-0101-0101-0101-010101010101","call_id":"c1","result":"03030303-0303-0303-0303-030303030303","duration_ms":5,"exit_code":0,"is_error":false,"at":"2026-11-30T06:00:00Z"}"#,
        r#"{"kind":"record","type":"delivery_settled","delivery":"d1","channel":"tg","settled":{"state":"sent","platform_id":"42:18"},"at":"2026-11-30T06:00:00Z"}"#,
    ];
    let summaries: Vec<Summary> = lines
        .iter()
        .map(|text| Summary::of(&serde_json::from_str::<Line>(text).unwrap()))
        .collect();
    assert_eq!(
        summaries,
        [
            Summary::Observed { op: Some(op) },
            Summary::Observed { op: Some(op) },
            Summary::Observed { op: None },
        ]
    );
    let header = Summary::Header {
        previous_leaf: None,
    };
    let mut state = LaneState::default();
    state.apply(&header);
    for summary in &summaries {
        state
            .check(summary, |_| false)
            .expect("an observation of an operation that is not open is still appended");
        state.apply(summary);
    }
    assert!(state.open_operations().is_empty());
    assert_eq!(state.leaf(), None);
    assert_eq!(state.lines(), 4);
}

#[test]
fn a_lane_written_before_these_records_still_reads() {
    let old = [
        r#"{"kind":"header","version":1,"session":"05050505-0505-0505-0505-050505050505","lane":"main","segment":1,"created":"2026-11-30T06:00:00Z"}"#,
        r#"{"kind":"record","type":"operation_started","op":"01010101-0101-0101-0101-010101010101","intent":"run","consumes":["inbox:7"],"at":"2026-11-30T06:00:00Z"}"#,
        r#"{"kind":"record","type":"attempt_started","op":"01010101-0101-0101-0101-010101010101","attempt":1,"at":"2026-11-30T06:00:00Z"}"#,
        r#"{"kind":"entry","id":"02020202-0202-0202-0202-020202020202","parent":null,"at":"2026-11-30T06:00:00Z","body":{"type":"message","role":"assistant","parts":[{"type":"text","text":"hi"}]}}"#,
        r#"{"kind":"record","type":"operation_finished","op":"01010101-0101-0101-0101-010101010101","outcome":{"status":"completed"},"at":"2026-11-30T06:00:00Z"}"#,
    ];
    for text in old {
        let line: Line = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&line).unwrap(), text);
    }
}

#[test]
fn every_trigger_is_pinned_in_its_operation_started_line() {
    use crate::name::TaskName;
    let task = || TaskName::try_from("daily").unwrap();
    let slot = chrono::Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).unwrap();
    let started = |intent, trigger| {
        Line::Record(Record::OperationStarted {
            op: OperationId::from_bytes([1; 16]),
            intent,
            consumes: Vec::new(),
            resumed: false,
            trigger: Some(trigger),
            at: at(),
        })
    };
    let line = |trigger: &str, intent: &str| {
        format!(
            r#"{{"kind":"record","type":"operation_started","op":"01010101-0101-0101-0101-010101010101","intent":"{intent}","trigger":{trigger},"at":"2026-11-30T06:00:00Z"}}"#
        )
    };
    let table = [
        (Intent::Run, Trigger::Chat, r#"{"kind":"chat"}"#),
        (Intent::Run, Trigger::Terminal, r#"{"kind":"terminal"}"#),
        (
            Intent::Run,
            Trigger::Heartbeat {
                task: task(),
                slot,
                coalesced: 0,
            },
            r#"{"kind":"heartbeat","task":"daily","slot":"2026-12-03T09:00:00Z"}"#,
        ),
        (
            Intent::Run,
            Trigger::Heartbeat {
                task: task(),
                slot,
                coalesced: 3,
            },
            r#"{"kind":"heartbeat","task":"daily","slot":"2026-12-03T09:00:00Z","coalesced":3}"#,
        ),
        (
            Intent::Run,
            Trigger::Correction {
                task: task(),
                slot,
                reason: "the reply is empty".into(),
            },
            r#"{"kind":"correction","task":"daily","slot":"2026-12-03T09:00:00Z","reason":"the reply is empty"}"#,
        ),
        (
            Intent::Run,
            Trigger::Steer { task: task(), slot },
            r#"{"kind":"steer","task":"daily","slot":"2026-12-03T09:00:00Z"}"#,
        ),
        (
            Intent::Compact,
            Trigger::ContextFull,
            r#"{"kind":"context_full"}"#,
        ),
        (
            Intent::Compact,
            Trigger::CompactCommand,
            r#"{"kind":"compact_command"}"#,
        ),
    ];
    for (intent, trigger, text) in table {
        let intent_text = match intent {
            Intent::Run => "run",
            Intent::Compact => "compact",
        };
        pinned(&started(intent, trigger), &line(text, intent_text));
    }
    let unknown = line(
        r#"{"kind":"heartbeat","task":"daily","slot":"2026-12-03T09:00:00Z","sender":"1"}"#,
        "run",
    );
    assert!(
        serde_json::from_str::<Line>(&unknown).is_err(),
        "a trigger is perch's own: an unknown field in one is corruption"
    );
    let old = r#"{"kind":"record","type":"operation_started","op":"01010101-0101-0101-0101-010101010101","intent":"run","at":"2026-11-30T06:00:00Z"}"#;
    assert!(matches!(
        serde_json::from_str::<Line>(old).unwrap(),
        Line::Record(Record::OperationStarted { trigger: None, .. })
    ));
}

#[test]
fn only_a_steer_relays_its_user_entry() {
    use crate::name::TaskName;
    let slot = chrono::Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).unwrap();
    let task = TaskName::try_from("watch").unwrap();
    assert_eq!(
        Trigger::Steer {
            task: task.clone(),
            slot
        }
        .relay(),
        Some(Relay::HeartbeatSteer {
            task: task.clone(),
            slot
        })
    );
    for trigger in [
        Trigger::Chat,
        Trigger::Terminal,
        Trigger::Heartbeat {
            task: task.clone(),
            slot,
            coalesced: 0,
        },
        Trigger::Correction {
            task,
            slot,
            reason: "empty".into(),
        },
        Trigger::ContextFull,
        Trigger::CompactCommand,
    ] {
        assert_eq!(trigger.relay(), None, "{trigger:?}");
    }
}

#[test]
fn a_relayed_message_says_where_it_came_from() {
    use crate::name::TaskName;
    let entry = Line::Entry(Entry {
        id: EntryId::from_bytes([2; 16]),
        parent: None,
        at: at(),
        body: EntryBody::Message(Message {
            role: Role::User,
            parts: vec![Part::Text {
                text: "Review PR 7.".into(),
            }],
            origins: Vec::new(),
            relay: Some(Relay::HeartbeatSteer {
                task: TaskName::try_from("watch").unwrap(),
                slot: chrono::Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).unwrap(),
            }),
        }),
    });
    pinned(
        &entry,
        r#"{"kind":"entry","id":"02020202-0202-0202-0202-020202020202","parent":null,"at":"2026-11-30T06:00:00Z","body":{"type":"message","role":"user","parts":[{"type":"text","text":"Review PR 7."}],"relay":{"kind":"heartbeat_steer","task":"watch","slot":"2026-12-03T09:00:00Z"}}}"#,
    );
}

fn note_line(note: Note) -> Line {
    Line::Entry(Entry {
        id: EntryId::from_bytes([2; 16]),
        parent: None,
        at: at(),
        body: EntryBody::Note(note),
    })
}

fn data_line(body: &str) -> String {
    format!(
        r#"{{"kind":"entry","id":"02020202-0202-0202-0202-020202020202","parent":null,"at":"2026-11-30T06:00:00Z","body":{{"type":"data",{body}}}}}"#
    )
}

fn heartbeat_note(mode: Option<RunMode>) -> Note {
    use crate::heartbeat::SlotOutcome;
    use crate::name::TaskName;
    Note::HeartbeatOutcome(HeartbeatNote {
        task: TaskName::try_from("digest").unwrap(),
        slot: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 3, 30, 0).unwrap(),
        run: "run-7".into(),
        mode,
        outcome: SlotOutcome::Message {
            text: "Stand-up at ten.".into(),
            target: "tg:team".into(),
            delivery: "d-3".into(),
        },
    })
}

#[test]
fn every_note_is_pinned_as_a_data_entry() {
    let table = [
        (
            Note::Summary {
                text: "we talked".into(),
                replaces: Some(EntryId::from_bytes([9; 16])),
            },
            r#""name":"summary","value":{"summarised":"09090909-0909-0909-0909-090909090909","text":"we talked"}"#,
        ),
        (
            Note::Summary {
                text: "we talked".into(),
                replaces: None,
            },
            r#""name":"summary","value":{"summarised":null,"text":"we talked"}"#,
        ),
        (
            heartbeat_note(Some(RunMode::Scheduled)),
            r#""name":"heartbeat_outcome","value":{"mode":"scheduled","outcome":{"delivery":"d-3","outcome":"message","target":"tg:team","text":"Stand-up at ten."},"run":"run-7","slot":"2026-12-02T03:30:00Z","task":"digest"}"#,
        ),
        (
            heartbeat_note(Some(RunMode::Manual)),
            r#""name":"heartbeat_outcome","value":{"mode":"manual","outcome":{"delivery":"d-3","outcome":"message","target":"tg:team","text":"Stand-up at ten."},"run":"run-7","slot":"2026-12-02T03:30:00Z","task":"digest"}"#,
        ),
        (
            heartbeat_note(Some(RunMode::DryRun)),
            r#""name":"heartbeat_outcome","value":{"mode":"dry_run","outcome":{"delivery":"d-3","outcome":"message","target":"tg:team","text":"Stand-up at ten."},"run":"run-7","slot":"2026-12-02T03:30:00Z","task":"digest"}"#,
        ),
        (
            Note::Hook {
                name: "seen".into(),
                value: serde_json::json!({"count": 2}),
            },
            r#""name":"seen","value":{"count":2}"#,
        ),
    ];
    for (note, body) in table {
        pinned(&note_line(note), &data_line(body));
    }
}

#[test]
fn notes_written_before_they_were_typed_still_read() {
    use crate::heartbeat::SlotOutcome;
    use crate::name::TaskName;
    let replaced = Some(EntryId::from_bytes([9; 16]));
    let summary = |replaces| Note::Summary {
        text: "we talked".into(),
        replaces,
    };
    let table = [
        (
            r#""name":"summary","value":{"text":"we talked","summarised":"09090909-0909-0909-0909-090909090909"}"#,
            summary(replaced),
        ),
        (
            r#""name":"summary","value":{"text":"we talked","replaces":"09090909-0909-0909-0909-090909090909"}"#,
            summary(replaced),
        ),
        (r#""name":"summary","value":"we talked""#, summary(None)),
        (
            r#""name":"heartbeat_outcome","value":{"task":"digest","slot":"2026-12-02T03:30:00+00:00","run":"run-7","mode":"scheduled","outcome":{"outcome":"message","text":"Stand-up at ten.","target":"tg:team","delivery":"d-3"}}"#,
            heartbeat_note(Some(RunMode::Scheduled)),
        ),
        (
            r#""name":"heartbeat_outcome","value":{"task":"digest","slot":"2026-12-02T03:30:00+00:00","outcome":{"outcome":"silent"}}"#,
            Note::HeartbeatOutcome(HeartbeatNote {
                task: TaskName::try_from("digest").unwrap(),
                slot: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 3, 30, 0).unwrap(),
                run: String::new(),
                mode: None,
                outcome: SlotOutcome::Silent,
            }),
        ),
        (
            r#""name":"heartbeat_outcome","value":{"task":"digest","outcome":"exploded"}"#,
            Note::Hook {
                name: "heartbeat_outcome".into(),
                value: serde_json::json!({"task": "digest", "outcome": "exploded"}),
            },
        ),
        (
            r#""name":"summary","value":{"words":3}"#,
            Note::Hook {
                name: "summary".into(),
                value: serde_json::json!({"words": 3}),
            },
        ),
        (
            r#""name":"hook_store","value":[1,"two"]"#,
            Note::Hook {
                name: "hook_store".into(),
                value: serde_json::json!([1, "two"]),
            },
        ),
    ];
    for (body, note) in table {
        let text = data_line(body);
        let read: Line = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(read, note_line(note.clone()), "{text}");
        let again: Line = serde_json::from_str(&serde_json::to_string(&read).unwrap()).unwrap();
        assert_eq!(
            again, read,
            "a note written again reads as the same note: {text}"
        );
    }
    assert!(
        serde_json::from_str::<Line>(&data_line(r#""name":"x","value":1,"extra":2"#)).is_err(),
        "an unknown field beside name and value is corruption"
    );
}
