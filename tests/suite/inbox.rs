//! The durable inbox: journaled before acked, verdicts, pending until consumed, duplicates.

use super::support::wait::Poll;
use chrono::TimeZone;
use perch::channel::{InboundEvent, Sender};
use perch::host::clock::Clock;
use perch::log::Journal;
use perch::store::inbox::{Disposition, Inbox, Recorded};
use perch_core::Timestamp;

fn at() -> Timestamp {
    chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
}

fn clock() -> Clock {
    Clock::new(at)
}

fn event(id: &str, room: &str, cursor: Option<&str>) -> InboundEvent {
    InboundEvent {
        platform_id: id.into(),
        cursor: cursor.map(Into::into),
        room: room.into(),
        thread: None,
        sender: Sender {
            id: "42".into(),
            name: "Alice".into(),
            is_bot: false,
        },
        direct: true,
        addressed: true,
        text: format!("message {id}"),
        sent_at: at(),
        attachments: Vec::new(),
        replying_to: None,
        edit_of: None,
        refused: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn items_stay_pending_until_consumed_and_duplicates_are_recognised_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (inbox, backlog) = Inbox::open(dir.path(), clock()).unwrap();
    assert!(backlog.pending.is_empty() && backlog.undecided.is_empty());
    let Recorded::New { seq: first } = inbox
        .record_event("tg", &event("1:1", "1", Some("100")))
        .await
        .unwrap()
    else {
        panic!("the first delivery is new");
    };
    assert_eq!(
        inbox
            .record_event("tg", &event("1:1", "1", Some("100")))
            .await
            .unwrap(),
        Recorded::Duplicate
    );
    let Recorded::New { seq: second } = inbox
        .record_event("tg", &event("1:2", "1", Some("101")))
        .await
        .unwrap()
    else {
        panic!("another message is new");
    };
    let verdict = inbox
        .record_disposition(
            first,
            Disposition::Item {
                lane: "tg-1".into(),
                text: "message 1:1".into(),
            },
        )
        .await
        .unwrap();
    drop(inbox);

    let (inbox, backlog) = reopen(dir.path()).await;
    assert_eq!(backlog.pending.len(), 1);
    assert_eq!(backlog.pending[0].event_seq, first);
    assert_eq!(backlog.pending[0].consumes_id(), format!("inbox:{first}"));
    assert_eq!(
        backlog.undecided.len(),
        1,
        "the second event has no verdict yet"
    );
    assert_eq!(backlog.undecided[0].0, second);
    assert_eq!(backlog.cursors["tg"], "101");
    assert_eq!(backlog.last_seen["tg"]["1"], "1:2");
    inbox.consume(vec![first, verdict]).await.unwrap();
    let stale = inbox
        .record_disposition(second, Disposition::Stale)
        .await
        .unwrap();
    inbox.consume(vec![second, stale]).await.unwrap();
    assert_eq!(inbox.depth().await, 0);
    drop(inbox);

    let (inbox, backlog) = reopen(dir.path()).await;
    assert!(backlog.pending.is_empty() && backlog.undecided.is_empty());
    assert_eq!(
        inbox
            .record_event("tg", &event("1:1", "1", Some("100")))
            .await
            .unwrap(),
        Recorded::Duplicate,
        "a consumed event is still recognised inside the deduplication window"
    );
}

/// The writer thread holds the journal's lock until it has stopped; a reopen waits for that.
async fn reopen(dir: &std::path::Path) -> (Inbox, perch::store::inbox::Backlog) {
    Poll::within(std::time::Duration::from_secs(10))
        .every(std::time::Duration::from_millis(5))
        .value_async("the inbox to be let go", || Inbox::open(dir, clock()).ok())
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deciding_mark_without_a_verdict_is_interrupted_and_old_journals_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let (inbox, _) = Inbox::open(dir.path(), clock()).unwrap();
    let mut seqs = Vec::new();
    for id in ["old", "decided", "interrupted"] {
        let Recorded::New { seq } = inbox
            .record_event("tg", &event(id, "1", None))
            .await
            .unwrap()
        else {
            panic!("new");
        };
        seqs.push(seq);
    }
    let decided_mark = inbox
        .record_deciding(seqs[1], "channels/tg.lua")
        .await
        .unwrap();
    inbox
        .record_disposition(seqs[1], Disposition::Dropped)
        .await
        .unwrap();
    let interrupted_mark = inbox
        .record_deciding(seqs[2], "channels/tg.lua")
        .await
        .unwrap();
    drop(inbox);

    let (_, backlog) = reopen(dir.path()).await;
    let undecided: Vec<u64> = backlog.undecided.iter().map(|(seq, _, _)| *seq).collect();
    assert_eq!(
        undecided,
        vec![seqs[0]],
        "an event without a mark is decided again"
    );
    assert_eq!(backlog.interrupted.len(), 1);
    assert_eq!(backlog.interrupted[0].event_seq, seqs[2]);
    assert_eq!(backlog.interrupted[0].mark_seq, interrupted_mark);
    assert_eq!(backlog.interrupted[0].hook, "channels/tg.lua");
    assert_eq!(backlog.settled_marks, vec![decided_mark]);
}

#[test]
fn consumed_segments_are_kept_for_the_retention_window() {
    let dir = tempfile::tempdir().unwrap();
    let now = std::sync::Arc::new(std::sync::Mutex::new(at()));
    let clock_now = now.clone();
    let clock = Clock::new(move || *clock_now.lock().unwrap());
    let retain = std::time::Duration::from_secs(3600);
    let (mut journal, _) = Journal::open_retaining(dir.path(), 200, retain, clock.clone()).unwrap();
    let body = serde_json::json!({ "text": "x".repeat(150) });
    let first = journal.append(std::slice::from_ref(&body)).unwrap();
    journal.append(std::slice::from_ref(&body)).unwrap();
    journal.consume(&first).unwrap();
    assert_eq!(
        journal.segment_count(),
        2,
        "consumed, but inside the window"
    );
    *now.lock().unwrap() = at() + chrono::Duration::hours(2);
    journal.append(&[body]).unwrap();
    assert_eq!(
        journal.segment_count(),
        2,
        "the old segment went once the window passed"
    );
    drop(journal);
    let (_, contents) = Journal::open_retaining(dir.path(), 200, retain, clock).unwrap();
    assert_eq!(contents.pending.len(), 2);
}
