//! Following lanes while the real writer appends in the same process: what `--follow` streams.
//!
//! Where a test shows that a lane sent nothing, it writes a line to another lane (the probe)
//! after the write that must not be sent, and waits for the probe's line: the follower takes
//! inotify's events in order and looks at lanes in the order they were marked, so by the time
//! the probe's line arrives the earlier write has been looked at. A first probe line shows that
//! the follower is running, its watches in place.

use chrono::TimeZone;
use perch::host::clock::Clock;
use perch::log::follow::{MAX_LINE_BYTES, ends, follow};
use perch::log::{LaneLog, LogError};
use perch_core::id::EntryId;
use perch_core::log::{
    Entry, EntryBody, Line, LinePosition, Message, Part, ReadLine, Record, Role,
};
use perch_core::name::LaneName;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

fn clock() -> Clock {
    Clock::new(|| chrono::Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).unwrap())
}

fn lane(name: &str) -> LaneName {
    LaneName::try_from(name).unwrap()
}

fn id(n: u8) -> EntryId {
    EntryId::from_bytes([n; 16])
}

/// Message `n` of a lane's chain, its parent message `n - 1`.
fn message(n: u8) -> Line {
    Line::Entry(Entry {
        id: id(n),
        parent: (n > 1).then(|| id(n - 1)),
        at: clock().now(),
        body: EntryBody::Message(Message {
            role: Role::User,
            parts: vec![Part::Text {
                text: format!("m{n}"),
            }],
            origins: Vec::new(),
            relay: None,
        }),
    })
}

fn encoded(line: &Line) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(line).unwrap();
    bytes.push(b'\n');
    bytes
}

fn segment(sessions: &Path, lane: &str, number: u32) -> PathBuf {
    sessions.join(lane).join(format!("{number:06}.jsonl"))
}

fn append_by_hand(sessions: &Path, lane: &str, bytes: &[u8]) {
    let mut file = OpenOptions::new()
        .append(true)
        .open(segment(sessions, lane, 1))
        .unwrap();
    file.write_all(bytes).unwrap();
}

async fn open(sessions: &Path, name: &str, messages: std::ops::RangeInclusive<u8>) -> LaneLog {
    let (log, _) = LaneLog::open(sessions, &lane(name), clock()).unwrap();
    for n in messages {
        log.append(&message(n)).await.unwrap();
    }
    log
}

/// The text of a message line, or what else the line is.
fn text(line: &ReadLine) -> String {
    match line {
        ReadLine::Line(Line::Entry(Entry {
            body: EntryBody::Message(Message { parts, .. }),
            ..
        })) => match &parts[0] {
            Part::Text { text } => text.clone(),
            other => format!("{other:?}"),
        },
        ReadLine::Line(Line::Header(header)) => format!("header {}", header.segment),
        other => format!("{other:?}"),
    }
}

struct Following {
    received: mpsc::Receiver<(LinePosition, ReadLine)>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), LogError>>,
}

impl Following {
    fn from(sessions: &Path, from: BTreeMap<LaneName, LinePosition>) -> Following {
        let (sender, received) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let sessions = sessions.to_owned();
        let stopping = stop.clone();
        let task = tokio::spawn(async move { follow(&sessions, from, sender, stopping).await });
        Following {
            received,
            stop,
            task,
        }
    }

    fn from_the_ends(sessions: &Path) -> Following {
        Following::from(sessions, ends(sessions).unwrap())
    }

    async fn next(&mut self) -> (LinePosition, ReadLine) {
        tokio::time::timeout(Duration::from_secs(10), self.received.recv())
            .await
            .expect("a line within 10 s")
            .expect("the follower is running")
    }

    async fn texts(&mut self, count: usize) -> Vec<(String, u32, String)> {
        let mut texts = Vec::new();
        for _ in 0..count {
            let (position, line) = self.next().await;
            texts.push((position.lane.to_string(), position.segment, text(&line)));
        }
        texts
    }

    /// Waits for the probe's line `n`, and checks that nothing came before it.
    async fn probe(&mut self, probe: &LaneLog, n: u8) {
        probe.append(&message(n)).await.unwrap();
        let (position, line) = self.next().await;
        assert_eq!(
            (position.lane.as_str(), text(&line)),
            ("probe", format!("m{n}")),
            "only the probe's line was due"
        );
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn lines_appended_after_the_ends_come_once_and_in_order_while_the_lane_closes_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    let log = open(sessions, "main", 1..=3).await;
    let end = ends(sessions).unwrap()[&lane("main")].clone();
    assert_eq!(end.segment, 1);
    assert_eq!(
        end.offset,
        std::fs::metadata(segment(sessions, "main", 1))
            .unwrap()
            .len()
    );
    let mut following = Following::from_the_ends(sessions);

    for n in 4..=5 {
        log.append(&message(n)).await.unwrap();
    }
    log.close().await.unwrap();
    let log = open(sessions, "main", 6..=6).await;
    log.close().await.unwrap();
    let log = open(sessions, "main", 7..=7).await;

    let mut positions = Vec::new();
    let mut texts = Vec::new();
    for _ in 4..=7 {
        let (position, line) = following.next().await;
        positions.push(position);
        texts.push(text(&line));
    }
    assert_eq!(texts, ["m4", "m5", "m6", "m7"]);
    assert_eq!(positions[0], end);
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]));

    log.append(&message(8)).await.unwrap();
    assert_eq!(text(&following.next().await.1), "m8", "nothing came twice");
    following.stop().await;
}

#[tokio::test]
async fn a_roll_is_followed_into_the_next_segment_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    let log = open(sessions, "main", 1..=1).await;
    let from = ends(sessions).unwrap();
    log.append(&message(2)).await.unwrap();
    assert_eq!(log.roll().await.unwrap(), 2);
    let mut following = Following::from(sessions, from);
    log.append(&message(3)).await.unwrap();
    assert_eq!(log.roll().await.unwrap(), 3);
    log.append(&message(4)).await.unwrap();

    let seen: Vec<(u32, String)> = following
        .texts(5)
        .await
        .into_iter()
        .map(|(_, segment, text)| (segment, text))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "m2".into()),
            (2, "header 2".into()),
            (2, "m3".into()),
            (3, "header 3".into()),
            (3, "m4".into()),
        ]
    );
    log.append(&message(5)).await.unwrap();
    let (position, line) = following.next().await;
    assert_eq!((position.segment, text(&line)), (3, "m5".into()));
    following.stop().await;
}

#[tokio::test]
async fn a_lane_made_while_following_is_read_from_its_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    let main = open(sessions, "main", 1..=1).await;
    let mut following = Following::from_the_ends(sessions);
    let ops = open(sessions, "ops", 1..=2).await;
    main.append(&message(2)).await.unwrap();

    let mut ops_lines = Vec::new();
    let mut main_lines = Vec::new();
    for _ in 0..4 {
        let (position, line) = following.next().await;
        match position.lane.as_str() {
            "ops" => ops_lines.push((position.offset, text(&line))),
            _ => main_lines.push(text(&line)),
        }
    }
    assert_eq!(ops_lines[0], (0, "header 1".into()));
    let ops_texts: Vec<&str> = ops_lines.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(ops_texts, ["header 1", "m1", "m2"]);
    assert_eq!(main_lines, ["m2"]);
    ops.append(&message(3)).await.unwrap();
    assert_eq!(following.texts(1).await, [("ops".into(), 1, "m3".into())]);
    following.stop().await;
}

#[tokio::test]
async fn a_torn_line_is_sent_once_and_only_when_it_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    open(sessions, "main", 1..=1).await.close().await.unwrap();
    let probe = open(sessions, "probe", 1..=1).await;
    let end = ends(sessions).unwrap()[&lane("main")].clone();
    let mut following = Following::from_the_ends(sessions);
    following.probe(&probe, 2).await;

    let line = encoded(&message(2));
    let (first, rest) = line.split_at(line.len() / 2);
    append_by_hand(sessions, "main", first);
    following.probe(&probe, 3).await;
    append_by_hand(sessions, "main", &rest[..rest.len() - 1]);
    following.probe(&probe, 4).await;
    append_by_hand(sessions, "main", b"\n");
    let (position, read) = following.next().await;
    assert_eq!(position, end);
    assert_eq!(read, ReadLine::Line(message(2)));

    let (log, report) = LaneLog::open(sessions, &lane("main"), clock()).unwrap();
    assert_eq!(report.repaired, None, "the line was whole");
    log.append(&message(3)).await.unwrap();
    assert_eq!(following.texts(1).await, [("main".into(), 1, "m3".into())]);
    following.stop().await;
}

#[tokio::test]
async fn a_torn_line_the_restarted_writer_cuts_is_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    open(sessions, "main", 1..=1).await.close().await.unwrap();
    let probe = open(sessions, "probe", 1..=1).await;
    let end = ends(sessions).unwrap()[&lane("main")].clone();
    let mut following = Following::from_the_ends(sessions);
    following.probe(&probe, 2).await;

    let line = encoded(&message(2));
    append_by_hand(sessions, "main", &line[..line.len() / 2]);
    following.probe(&probe, 3).await;
    let (log, report) = LaneLog::open(sessions, &lane("main"), clock()).unwrap();
    assert_eq!(
        report.repaired.map(|repair| repair.offset),
        Some(end.offset)
    );
    log.append(&message(2)).await.unwrap();

    let (position, read) = following.next().await;
    assert_eq!(
        position, end,
        "the repair record takes the torn line's place"
    );
    assert!(
        matches!(
            read,
            ReadLine::Line(Line::Record(Record::TailRepaired { .. }))
        ),
        "{read:?}"
    );
    let (position, read) = following.next().await;
    assert!(position.offset > end.offset);
    assert_eq!(read, ReadLine::Line(message(2)));
    following.stop().await;
}

#[tokio::test]
async fn a_corrupt_line_is_damaged_with_its_file_and_line_and_the_next_line_still_comes() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    open(sessions, "main", 1..=1).await.close().await.unwrap();
    let probe = open(sessions, "probe", 1..=1).await;
    let end = ends(sessions).unwrap()[&lane("main")].clone();
    let mut following = Following::from_the_ends(sessions);
    following.probe(&probe, 2).await;

    // Ending the segment, a bad line is a torn tail the writer would cut: not sent yet.
    append_by_hand(sessions, "main", b"not json\n");
    following.probe(&probe, 3).await;
    append_by_hand(sessions, "main", &encoded(&message(2)));

    let (position, read) = following.next().await;
    assert_eq!(position, end);
    let ReadLine::Damaged { file, line, reason } = read else {
        panic!("{read:?}");
    };
    assert!(file.ends_with("main/000001.jsonl"), "{file}");
    assert_eq!(line, 3, "after the header and m1");
    assert!(reason.contains("not a log line"), "{reason}");
    assert_eq!(following.next().await.1, ReadLine::Line(message(2)));
    following.stop().await;
}

#[tokio::test]
async fn a_line_longer_than_the_limit_is_damaged_and_the_next_line_still_comes() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path();
    open(sessions, "main", 1..=1).await.close().await.unwrap();
    let probe = open(sessions, "probe", 1..=1).await;
    let end = ends(sessions).unwrap()[&lane("main")].clone();
    let mut following = Following::from_the_ends(sessions);
    following.probe(&probe, 2).await;

    let half = usize::try_from(MAX_LINE_BYTES / 2 + 1).unwrap();
    append_by_hand(sessions, "main", &vec![b'x'; half]);
    following.probe(&probe, 3).await;
    append_by_hand(sessions, "main", &vec![b'x'; half]);
    following.probe(&probe, 4).await;
    append_by_hand(
        sessions,
        "main",
        &[b"\n", &encoded(&message(2))[..]].concat(),
    );

    let (position, read) = following.next().await;
    assert_eq!(position, end);
    let ReadLine::Damaged { line, reason, .. } = read else {
        panic!("{read:?}");
    };
    assert_eq!(line, 3);
    assert!(reason.contains("longer than"), "{reason}");
    let (position, read) = following.next().await;
    assert_eq!(position.offset, end.offset + 2 * half as u64 + 1);
    assert_eq!(read, ReadLine::Line(message(2)));
    following.stop().await;
}

#[tokio::test]
async fn a_sessions_directory_made_after_following_starts_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    assert!(ends(&sessions).unwrap().is_empty());
    let mut following = Following::from(&sessions, BTreeMap::new());
    // On this single-threaded runtime, the follower starts (and finds nothing) here.
    tokio::task::yield_now().await;
    std::fs::create_dir_all(&sessions).unwrap();
    std::fs::write(sessions.join("not-a-lane"), "stray file").unwrap();
    let log = open(&sessions, "main", 1..=1).await;
    log.append(&message(2)).await.unwrap();
    assert_eq!(
        following.texts(3).await,
        [
            ("main".into(), 1, "header 1".into()),
            ("main".into(), 1, "m1".into()),
            ("main".into(), 1, "m2".into()),
        ]
    );
    following.stop().await;
}
