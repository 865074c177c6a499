//! The segmented journal under the inbox and outbox: items kept until consumed, tails repaired.

use super::log::clock;
use perch::log::{Journal, LogError};
use serde_json::json;
use std::fs;

fn segment_files(dir: &std::path::Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|item| {
            item.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|ext| ext == "jsonl")
        })
        .count()
}

#[test]
fn unconsumed_items_come_back_in_order_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, pending) = Journal::open(dir.path(), 1 << 20, clock()).unwrap();
    assert!(pending.is_empty());
    let seqs = journal
        .append(&[
            json!({"text": "a"}),
            json!({"text": "b"}),
            json!({"text": "c"}),
        ])
        .unwrap();
    assert_eq!(seqs, vec![1, 2, 3]);
    journal.consume(&[2]).unwrap();
    assert!(matches!(
        Journal::open(dir.path(), 1 << 20, clock()),
        Err(LogError::Held { .. })
    ));
    drop(journal);

    let (mut journal, pending) = Journal::open(dir.path(), 1 << 20, clock()).unwrap();
    let bodies: Vec<_> = pending
        .iter()
        .map(|item| (item.seq, item.body["text"].clone()))
        .collect();
    assert_eq!(bodies, vec![(1, json!("a")), (3, json!("c"))]);
    assert_eq!(journal.append(&[json!({"text": "d"})]).unwrap(), vec![4]);
}

#[test]
fn fully_consumed_segments_are_deleted_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = Journal::open(dir.path(), 200, clock()).unwrap();
    for n in 0..12 {
        journal
            .append(&[json!({ "n": n, "pad": "x".repeat(60) })])
            .unwrap();
    }
    let before = segment_files(dir.path());
    assert!(before >= 4, "small segments roll: {before}");
    assert_eq!(journal.segment_count(), before);

    journal
        .consume(&[2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        .unwrap();
    assert_eq!(
        segment_files(dir.path()),
        before,
        "item 1 holds the oldest segment, so nothing goes"
    );
    journal.consume(&[1]).unwrap();
    assert_eq!(
        segment_files(dir.path()),
        1,
        "everything but the newest segment is gone"
    );
    assert_eq!(journal.depth(), 0);
    drop(journal);

    let (journal, pending) = Journal::open(dir.path(), 200, clock()).unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(journal.depth(), 0);
}

#[test]
fn a_torn_journal_tail_is_cut_and_complete_items_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = Journal::open(dir.path(), 1 << 20, clock()).unwrap();
    journal.append(&[json!("first"), json!("second")]).unwrap();
    drop(journal);
    let path = dir.path().join("000001.jsonl");
    let whole = fs::read(&path).unwrap();
    fs::write(&path, &whole[..whole.len() - 5]).unwrap();
    let (mut journal, pending) = Journal::open(dir.path(), 1 << 20, clock()).unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|item| item.body.clone())
            .collect::<Vec<_>>(),
        vec![json!("first")]
    );
    assert_eq!(journal.append(&[json!("again")]).unwrap(), vec![2]);
}
