//! What a restart needs to know of the lanes on disk, read without their writers (no lock, no
//! repair, nothing written): which lanes a crash left with an operation open, and how the run
//! that took an inbox item ended. Both read only each lane's newest segment: a segment rolls only
//! when no operation is open, so an open operation, and a run whose end the inbox did not hear,
//! are always there.
//!
//! They go through the index ([`Segment::load`] reads it, checks it against the log and parses
//! only the lines it does not cover). A segment that cannot be loaded that way (a malformed line
//! mid-file) is read line by line, skipping the lines that are not log lines, so one damaged lane
//! neither hides the others nor stops a start that does not need it.

use super::error::LogError;
use super::segment::{Access, Segment, segment_numbers, segment_path};
use perch_core::log::{EntryBody, LaneState, Line, Outcome, Part, Record, Role, Summary};
use std::collections::BTreeMap;
use std::path::Path;

/// For each lane under `sessions` whose newest segment has operations started and not finished,
/// how many: after a crash, the lanes recovery must close; while perch runs, the runs in
/// progress. Lanes are named by their directory.
pub fn open_operations(sessions: &Path) -> BTreeMap<String, usize> {
    let mut open = BTreeMap::new();
    let Ok(lanes) = std::fs::read_dir(sessions) else {
        return open;
    };
    for lane in lanes.filter_map(Result::ok) {
        let dir = lane.path();
        let Some(newest) = newest_segment(&dir) else {
            continue;
        };
        let count = match Segment::load(&dir, newest, Access::Read) {
            Ok(loaded) => loaded.segment.state.open_operations().len(),
            Err(_) => {
                let mut state = LaneState::default();
                for line in readable_lines(&dir, newest) {
                    state.apply(&Summary::of(&line));
                }
                state.open_operations().len()
            }
        };
        if count > 0 {
            open.insert(lane.file_name().to_string_lossy().into_owned(), count);
        }
    }
    open
}

/// How the run that took an inbox item ended, as its lane recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenRun {
    pub outcome: Outcome,
    /// The run's last assistant text (empty when it said nothing).
    pub text: String,
}

/// The run in `lane` whose `operation_started` consumes `consumes` (an inbox id), if its newest
/// segment holds one. A run without its end (recovery has not closed it) counts as interrupted.
pub fn taken_run(sessions: &Path, lane: &str, consumes: &str) -> Option<TakenRun> {
    let dir = sessions.join(lane);
    let newest = newest_segment(&dir)?;
    if let Ok(loaded) = Segment::load(&dir, newest, Access::Read) {
        let segment = loaded.segment;
        let summaries: Vec<Summary> = segment.rows.iter().map(|row| row.summary).collect();
        if let Ok(found) = find_run(&summaries, |line| segment.read(line), consumes) {
            return found;
        }
    }
    let lines = readable_lines(&dir, newest);
    let summaries: Vec<Summary> = lines.iter().map(Summary::of).collect();
    let read = |line: u64| {
        usize::try_from(line)
            .ok()
            .and_then(|index| lines.get(index))
            .cloned()
            .ok_or_else(|| LogError::WriterStopped {
                reason: "no such line".into(),
            })
    };
    find_run(&summaries, read, consumes).ok().flatten()
}

/// Finds the run among a segment's lines, reading only the lines the summaries point at: the
/// `operation_started` records, the run's `operation_finished`, and its entries from the last
/// back to the first assistant text.
fn find_run(
    summaries: &[Summary],
    read: impl Fn(u64) -> Result<Line, LogError>,
    consumes: &str,
) -> Result<Option<TakenRun>, LogError> {
    let mut started = None;
    for (line, summary) in (0u64..).zip(summaries) {
        let Summary::OperationStarted { op } = summary else {
            continue;
        };
        if let Line::Record(Record::OperationStarted { consumes: ids, .. }) = read(line)?
            && ids.iter().any(|id| id == consumes)
        {
            started = Some((line, *op));
            break;
        }
    }
    let Some((start, op)) = started else {
        return Ok(None);
    };
    let finish = (0u64..)
        .zip(summaries)
        .skip_while(|(line, _)| *line <= start)
        .find(|(_, summary)| matches!(summary, Summary::OperationFinished { op: other } if *other == op))
        .map(|(line, _)| line);
    let end = finish.unwrap_or(summaries.len() as u64);
    let mut text = String::new();
    for line in (start + 1..end).rev() {
        let Some(Summary::Entry { .. }) = usize::try_from(line).ok().and_then(|i| summaries.get(i))
        else {
            continue;
        };
        if let Line::Entry(entry) = read(line)?
            && let EntryBody::Message(message) = entry.body
            && message.role == Role::Assistant
        {
            let said: String = message
                .parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            if !said.is_empty() {
                text = said;
                break;
            }
        }
    }
    let outcome = match finish {
        Some(line) => match read(line) {
            Ok(Line::Record(Record::OperationFinished { outcome, .. })) => outcome,
            _ => Outcome::Interrupted {
                reason: "its end could not be read".into(),
            },
        },
        None => Outcome::Interrupted {
            reason: "perch stopped during the run".into(),
        },
    };
    Ok(Some(TakenRun { outcome, text }))
}

fn newest_segment(dir: &Path) -> Option<u32> {
    segment_numbers(dir).ok()?.last().copied()
}

/// Every line of a segment that parses as a log line, in order; the rest are skipped.
fn readable_lines(dir: &Path, number: u32) -> Vec<Line> {
    let Ok(bytes) = std::fs::read(segment_path(dir, number)) else {
        return Vec::new();
    };
    bytes
        .split(|&byte| byte == b'\n')
        .filter_map(|line| serde_json::from_slice::<Line>(line).ok())
        .collect()
}
