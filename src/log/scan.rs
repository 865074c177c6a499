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
use perch_core::config::Replay;
use perch_core::log::{EntryBody, ItemRuns, LaneState, Line, Outcome, Record, Role, Summary};
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

/// The runs that took an inbox item, as its lane recorded them: how the latest ended, what it
/// said, and what a restart needs to decide whether to resume it.
pub type TakenRun = ItemRuns;

/// The runs in `lane` whose `operation_started` consumes `consumes` (an inbox id), if its newest
/// segment holds one. A run without its end (recovery has not closed it) counts as interrupted.
pub fn taken_run(sessions: &Path, lane: &str, consumes: &str) -> Option<TakenRun> {
    let dir = sessions.join(lane);
    let newest = newest_segment(&dir)?;
    if let Ok(loaded) = Segment::load(&dir, newest, Access::Read) {
        let segment = loaded.segment;
        let summaries: Vec<Summary> = segment.rows.iter().map(|row| row.summary).collect();
        if let Ok(found) = find_runs(&summaries, |line| segment.read(line), consumes) {
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
    find_runs(&summaries, read, consumes).ok().flatten()
}

/// Finds the item's runs among a segment's lines, reading only the lines the summaries point
/// at: the `operation_started` records, each run's `operation_finished` and `tool_started`
/// records of tools never replayed, its first entry, and the latest run's entries from the last
/// back to the first assistant text.
fn find_runs(
    summaries: &[Summary],
    read: impl Fn(u64) -> Result<Line, LogError>,
    consumes: &str,
) -> Result<Option<TakenRun>, LogError> {
    let mut runs = Vec::new();
    for (line, summary) in (0u64..).zip(summaries) {
        let Summary::OperationStarted { op } = summary else {
            continue;
        };
        if let Line::Record(Record::OperationStarted {
            consumes: ids,
            resumed,
            ..
        }) = read(line)?
            && ids.iter().any(|id| id == consumes)
        {
            runs.push((line, *op, resumed, ids.len()));
        }
    }
    let Some(&(first_start, first_op, _, items)) = runs.first() else {
        return Ok(None);
    };
    let resumed = runs.iter().any(|(_, _, resumed, _)| *resumed);
    let end_of = |start: u64, op| {
        (0u64..)
            .zip(summaries)
            .skip_while(|(line, _)| *line <= start)
            .find(|(_, summary)| matches!(summary, Summary::OperationFinished { op: other } if *other == op))
            .map(|(line, _)| line)
    };
    let first_end = end_of(first_start, first_op).unwrap_or(summaries.len() as u64);
    let user_entry = match (first_start + 1..first_end)
        .find(|line| matches!(summary_at(summaries, *line), Some(Summary::Entry { .. })))
    {
        Some(line) => matches!(
            read(line)?,
            Line::Entry(entry) if matches!(&entry.body, EntryBody::Message(message) if message.role == Role::User)
        ),
        None => false,
    };
    let mut irreversible: Vec<String> = Vec::new();
    for &(start, op, _, _) in &runs {
        let end = end_of(start, op).unwrap_or(summaries.len() as u64);
        for line in start + 1..end {
            if let Some(Summary::ToolStarted {
                op: other,
                replay: Replay::Never,
                ..
            }) = summary_at(summaries, line)
                && *other == op
                && let Line::Record(Record::ToolStarted { tool, .. }) = read(line)?
                && !irreversible.iter().any(|named| named == tool.as_str())
            {
                irreversible.push(tool.to_string());
            }
        }
    }
    let Some(&(start, op, _, _)) = runs.last() else {
        return Ok(None);
    };
    let finish = end_of(start, op);
    let end = finish.unwrap_or(summaries.len() as u64);
    let mut text = String::new();
    for line in (start + 1..end).rev() {
        let Some(Summary::Entry { .. }) = summary_at(summaries, line) else {
            continue;
        };
        if let Line::Entry(entry) = read(line)?
            && let EntryBody::Message(message) = entry.body
            && message.role == Role::Assistant
        {
            let said = perch_core::conversation::text_of(&message);
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
    Ok(Some(ItemRuns {
        op,
        outcome,
        text,
        resumed,
        user_entry,
        irreversible,
        items,
    }))
}

fn summary_at(summaries: &[Summary], line: u64) -> Option<&Summary> {
    usize::try_from(line).ok().and_then(|i| summaries.get(i))
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
