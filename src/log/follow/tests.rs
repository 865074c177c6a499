use super::*;
use crate::host::clock::Clock;
use crate::log::LaneLog;
use chrono::TimeZone;
use perch_core::id::EntryId;
use perch_core::log::{Entry, EntryBody, Line, Message, Part, Role};
use std::io::Write;

fn clock() -> Clock {
    Clock::new(|| chrono::Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).unwrap())
}

fn text(n: u32, words: &str) -> Line {
    let mut id = [0; 16];
    id[..4].copy_from_slice(&n.to_be_bytes());
    Line::Entry(Entry {
        id: EntryId::from_bytes(id),
        parent: None,
        at: clock().now(),
        body: EntryBody::Message(Message::new(
            Role::User,
            vec![Part::Text { text: words.into() }],
        )),
    })
}

fn encoded(line: &Line) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(line).unwrap();
    bytes.push(b'\n');
    bytes
}

fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf, File) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("000001.jsonl");
    fs::write(&path, bytes).unwrap();
    let file = File::open(&path).unwrap();
    (dir, path, file)
}

#[test]
fn the_kept_end_leaves_out_a_torn_tail_and_a_bad_last_line() {
    let good = encoded(&text(1, "hello"));
    let good_len = good.len() as u64;
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("empty", Vec::new(), 0),
        ("no newline yet", b"{\"kind\":".to_vec(), 0),
        ("one good line", good.clone(), good_len),
        (
            "a fragment after it",
            [&good[..], b"{\"ki"].concat(),
            good_len,
        ),
        (
            "a bad last line",
            [&good[..], b"not json\n"].concat(),
            good_len,
        ),
        (
            "a bad line followed by a fragment",
            [&good[..], b"not json\n{\"ki"].concat(),
            good_len + 9,
        ),
        ("a bad only line", b"not json\n".to_vec(), 0),
    ];
    for (case, bytes, expected) in cases {
        let (_dir, path, file) = file_with(&bytes);
        let len = bytes.len() as u64;
        assert_eq!(kept_end(&file, &path, len).unwrap(), expected, "{case}");
    }
}

#[test]
fn a_long_line_is_found_across_chunks() {
    let long = encoded(&text(1, &"x".repeat(3 * CHUNK)));
    let bytes = [&long[..], &long[..]].concat();
    let (_dir, path, file) = file_with(&bytes);
    assert_eq!(
        kept_end(&file, &path, bytes.len() as u64).unwrap(),
        bytes.len() as u64
    );
    assert_eq!(
        last_newline(&file, &path, bytes.len() as u64 - 1).unwrap(),
        Some(long.len() as u64 - 1)
    );
}

#[test]
fn a_pass_stops_at_its_budget_and_the_next_goes_on() {
    let line = encoded(&text(1, &"y".repeat(100 << 10)));
    let count = 2 * (PASS_BYTES as usize / line.len()) + 3;
    let (dir, _path, _file) = file_with(&line.repeat(count));
    let lane = LaneName::try_from("main").unwrap();
    let mut cursor = Cursor::at(dir.path().to_owned(), None).unwrap();
    let work = Work::default();
    let mut seen = 0;
    let mut passes = 0;
    loop {
        let pass = cursor.read_new(&lane, &work).unwrap();
        passes += 1;
        seen += pass.lines.len();
        if !pass.more {
            break;
        }
    }
    assert_eq!(seen, count);
    assert!(passes >= 3, "{passes}");
}

/// With a thousand lanes on disk, one append costs one lane's look, not a sweep, and no
/// timer runs while every lane is watched.
#[tokio::test]
async fn a_thousand_idle_lanes_cost_nothing_until_one_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let names: Vec<LaneName> = (0..1000)
        .map(|n| LaneName::try_from(format!("lane-{n:04}")).unwrap())
        .collect();
    let (template, _) = LaneLog::open(&sessions, &names[0], clock()).unwrap();
    template.append(&text(1, "first")).await.unwrap();
    template.close().await.unwrap();
    let source = sessions.join(names[0].as_str());
    for name in &names[1..] {
        let target = sessions.join(name.as_str());
        fs::create_dir_all(&target).unwrap();
        for file in ["000001.jsonl", "000001.idx"] {
            fs::copy(source.join(file), target.join(file)).unwrap();
        }
    }
    let from = ends(&sessions).unwrap();
    assert_eq!(from.len(), 1000);

    let work = Arc::new(Work::default());
    let mut follower = Follower::start(&sessions, from, Arc::clone(&work)).unwrap();
    let mut first_look = 0;
    while let Some(pass) = follower.drain_one().unwrap() {
        assert!(pass.lines.is_empty());
        first_look += 1;
    }
    assert_eq!(first_look, 1000);
    let (sender, mut received) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(sender, stop.clone()));

    let mut counted = Vec::new();
    for lane in [&names[500], &names[7], &names[999]] {
        let (log, _) = LaneLog::open(&sessions, lane, clock()).unwrap();
        let before = (
            work.drains.load(Ordering::Relaxed),
            work.opens.load(Ordering::Relaxed),
        );
        log.append(&text(2, "second")).await.unwrap();
        let (position, line) = tokio::time::timeout(Duration::from_secs(10), received.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&position.lane, lane);
        assert_eq!(line, ReadLine::Line(text(2, "second")));
        log.close().await.unwrap();
        counted.push((
            work.drains.load(Ordering::Relaxed) - before.0,
            work.opens.load(Ordering::Relaxed) - before.1,
        ));
    }
    for (drains, opens) in counted {
        assert!(drains <= 2 && opens <= 2, "{drains} drains, {opens} opens");
    }
    assert_eq!(work.ticks.load(Ordering::Relaxed), 0);
    assert!(received.try_recv().is_err());
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A lane inotify could not watch (the watch limit) is found by the timer instead.
#[tokio::test]
async fn a_lane_without_a_watch_is_polled() {
    let dir = tempfile::tempdir().unwrap();
    let main = LaneName::try_from("main").unwrap();
    let (log, _) = LaneLog::open(dir.path(), &main, clock()).unwrap();
    let mut follower =
        Follower::start(dir.path(), ends(dir.path()).unwrap(), Arc::default()).unwrap();
    while follower.drain_one().unwrap().is_some() {}
    follower.watches.clear();
    follower.polled.push(main.clone());
    let work = Arc::clone(&follower.work);
    let (sender, mut received) = mpsc::channel(4);
    let stop = CancellationToken::new();
    let task = tokio::spawn(follower.run(sender, stop.clone()));
    log.append(&text(1, "polled")).await.unwrap();
    let (position, line) = tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (position.lane, line),
        (main, ReadLine::Line(text(1, "polled")))
    );
    assert!(work.ticks.load(Ordering::Relaxed) >= 1);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[test]
fn a_damaged_line_is_named_by_counting_when_followed_from_mid_file() {
    let good = encoded(&text(1, "a"));
    let bytes = [&good[..], &good[..], b"oops\n", &good[..]].concat();
    let (dir, _path, mut file) = file_with(&bytes);
    let _ = file.flush();
    let lane = LaneName::try_from("main").unwrap();
    let position = LinePosition {
        lane: lane.clone(),
        segment: 1,
        offset: good.len() as u64,
    };
    let mut cursor = Cursor::at(dir.path().to_owned(), Some(position)).unwrap();
    let pass = cursor.read_new(&lane, &Work::default()).unwrap();
    assert_eq!(pass.lines.len(), 3);
    match &pass.lines[1].1 {
        ReadLine::Damaged { line, .. } => assert_eq!(*line, 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(pass.lines[1].0.offset, 2 * good.len() as u64);
}
