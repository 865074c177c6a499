//! Reading lanes for `perch log`, read-only: no lock is taken, nothing is repaired or written,
//! and `perch run` may be appending while it reads. Lines are read through the index (each
//! segment's `.idx` rows, checked against their lines' checksums) where it covers them, so the
//! last turns of a long lane cost little more than reading its index; a line that cannot be
//! read becomes [`ReadLine::Damaged`] and the rest still reads.

use perch_core::Timestamp;
use perch_core::log::{
    INDEX_HEADER_LEN, IndexHeader, Line, LinePosition, ReadLine, Record, Row, Summary,
};
use perch_core::name::LaneName;
use perch_core::transcript::{Assembler, EventKind, Redaction, Selection, Turn};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What went wrong with a file, and what to do when it is a matter of permissions.
fn problem(action: &str, path: &Path, error: &std::io::Error) -> String {
    let fix = if error.kind() == ErrorKind::PermissionDenied {
        "; run perch log as the user that runs the agent (for a service, `sudo -u perch perch log DIR`)"
    } else {
        ""
    };
    format!("cannot {action} {}: {error}{fix}", path.display())
}

/// The lanes under `sessions`, by name.
pub fn lane_names(sessions: &Path) -> Result<Vec<LaneName>, String> {
    let listing = match fs::read_dir(sessions) {
        Ok(listing) => listing,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(problem("list", sessions, &error)),
    };
    let mut names = Vec::new();
    for item in listing {
        let item = item.map_err(|error| problem("list", sessions, &error))?;
        if !item.path().is_dir() {
            continue;
        }
        if let Some(name) = item.file_name().to_str()
            && let Ok(lane) = LaneName::try_from(name)
        {
            names.push(lane);
        }
    }
    names.sort();
    Ok(names)
}

fn segment_file(dir: &Path, number: u32) -> PathBuf {
    dir.join(format!("{number:06}.jsonl"))
}

fn index_file(dir: &Path, number: u32) -> PathBuf {
    dir.join(format!("{number:06}.idx"))
}

fn segment_numbers(dir: &Path) -> Result<Vec<u32>, String> {
    let listing = fs::read_dir(dir).map_err(|error| problem("list", dir, &error))?;
    let mut numbers: Vec<u32> = listing
        .filter_map(Result::ok)
        .filter_map(|item| {
            item.file_name()
                .to_str()
                .and_then(|name| name.strip_suffix(".jsonl"))
                .and_then(|stem| stem.parse().ok())
        })
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// One segment file and the rows of its index that provably match it.
#[derive(Debug)]
struct SegmentFile {
    number: u32,
    path: PathBuf,
    file: File,
    len: u64,
    rows: Vec<Row>,
}

impl SegmentFile {
    fn open(dir: &Path, number: u32) -> Result<SegmentFile, String> {
        let path = segment_file(dir, number);
        let file = File::open(&path).map_err(|error| problem("open", &path, &error))?;
        let len = file
            .metadata()
            .map_err(|error| problem("inspect", &path, &error))?
            .len();
        let mut segment = SegmentFile {
            number,
            path,
            file,
            len,
            rows: Vec::new(),
        };
        segment.rows = segment.index_rows(&index_file(dir, number));
        Ok(segment)
    }

    /// The index's rows, as far as they are contiguous, inside the file, and end in a line
    /// whose checksum matches; none when the index is missing or belongs to another file.
    fn index_rows(&self, index: &Path) -> Vec<Row> {
        let Ok(bytes) = fs::read(index) else {
            return Vec::new();
        };
        let Some(Line::Header(header)) = self.first_line() else {
            return Vec::new();
        };
        let expected = IndexHeader {
            session: header.session,
            segment: self.number,
        };
        if IndexHeader::decode(&bytes) != Some(expected) {
            return Vec::new();
        }
        let mut rows: Vec<Row> = Vec::with_capacity((bytes.len() - INDEX_HEADER_LEN) / Row::SIZE);
        for chunk in bytes[INDEX_HEADER_LEN..].chunks_exact(Row::SIZE) {
            let Ok(raw) = <&[u8; Row::SIZE]>::try_from(chunk) else {
                break;
            };
            let Ok(row) = Row::decode(raw) else {
                break;
            };
            if row.offset != rows.last().map_or(0, Row::end) || row.len == 0 || row.end() > self.len
            {
                break;
            }
            rows.push(row);
        }
        while let Some(last) = rows.last() {
            match self.bytes(last.offset, last.end()) {
                Ok(bytes) if crc32fast::hash(&bytes) == last.crc => break,
                _ => {
                    rows.pop();
                }
            }
        }
        rows
    }

    fn first_line(&self) -> Option<Line> {
        let bytes = self.bytes(0, self.len.min(1 << 20)).ok()?;
        let end = bytes.iter().position(|&b| b == b'\n')?;
        serde_json::from_slice(&bytes[..end]).ok()
    }

    fn bytes(&self, from: u64, to: u64) -> Result<Vec<u8>, String> {
        let mut bytes = vec![0; usize::try_from(to.saturating_sub(from)).unwrap_or(0)];
        self.file
            .read_exact_at(&mut bytes, from)
            .map_err(|error| problem("read", &self.path, &error))?;
        Ok(bytes)
    }

    fn position(&self, lane: &LaneName, offset: u64) -> LinePosition {
        LinePosition {
            lane: lane.clone(),
            segment: self.number,
            offset,
        }
    }

    fn damaged(&self, line: u64, reason: String) -> ReadLine {
        ReadLine::Damaged {
            file: self.path.display().to_string(),
            line,
            reason,
        }
    }

    /// The lines from row `from_row` (0-based) to `end` (or the end of the file): indexed lines
    /// checked against their rows, the rest split at newlines.
    fn lines(
        &self,
        lane: &LaneName,
        from_row: usize,
        end: Option<u64>,
    ) -> Result<Vec<(LinePosition, ReadLine)>, String> {
        let to = end.unwrap_or(self.len).min(self.len);
        let start = self
            .rows
            .get(from_row)
            .map_or_else(|| self.rows.last().map_or(0, Row::end), |row| row.offset);
        if start >= to {
            return Ok(Vec::new());
        }
        let bytes = self.bytes(start, to)?;
        let slice = |from: u64, until: u64| {
            let from = usize::try_from(from - start).unwrap_or(usize::MAX);
            let until = usize::try_from(until - start).unwrap_or(usize::MAX);
            bytes.get(from..until)
        };
        let mut lines = Vec::new();
        let mut number = from_row as u64;
        let mut offset = start;
        for row in self.rows.iter().skip(from_row) {
            if row.end() > to {
                break;
            }
            number += 1;
            offset = row.end();
            let Some(line) = slice(row.offset, row.end()) else {
                break;
            };
            let read = if crc32fast::hash(line) == row.crc {
                parse(line).unwrap_or_else(|reason| self.damaged(number, reason))
            } else {
                self.damaged(
                    number,
                    "its bytes changed after it was written (checksum mismatch)".into(),
                )
            };
            lines.push((self.position(lane, row.offset), read));
        }
        while offset < to {
            let Some(rest) = slice(offset, to) else { break };
            number += 1;
            match rest.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    let line = &rest[..=at];
                    let read = parse(line).unwrap_or_else(|reason| self.damaged(number, reason));
                    lines.push((self.position(lane, offset), read));
                    offset += line.len() as u64;
                }
                None => {
                    lines.push((
                        self.position(lane, offset),
                        self.damaged(
                            number,
                            format!(
                                "torn: {} bytes without an end of line (being written now, or cut short by a crash; perch run cuts it off when it next opens the lane)",
                                rest.len()
                            ),
                        ),
                    ));
                    offset = to;
                }
            }
        }
        Ok(lines)
    }
}

fn parse(bytes: &[u8]) -> Result<ReadLine, String> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    serde_json::from_slice::<Line>(body)
        .map(ReadLine::Line)
        .map_err(|error| format!("not a log line: {error}"))
}

/// What one read of a lane found.
#[derive(Debug)]
pub struct LaneRead {
    pub lines: Vec<(LinePosition, ReadLine)>,
    /// The read began at the lane's first line.
    pub from_start: bool,
}

/// Reads `lane`: from where its last `runs` runs start (the whole lane when `runs` is none or
/// it has fewer), up to `end` when given (lines at or after it are left out).
pub fn read_lane(
    sessions: &Path,
    lane: &LaneName,
    runs: Option<usize>,
    end: Option<&LinePosition>,
) -> Result<LaneRead, String> {
    let dir = sessions.join(lane.as_str());
    let mut numbers = segment_numbers(&dir)?;
    if let Some(end) = end {
        numbers.retain(|&number| number <= end.segment);
    }
    let mut segments = Vec::with_capacity(numbers.len());
    for &number in &numbers {
        segments.push(SegmentFile::open(&dir, number)?);
    }
    let mut start = (0, 0);
    let mut from_start = true;
    if let Some(runs) = runs {
        let mut found = 0;
        'back: for (index, segment) in segments.iter().enumerate().rev() {
            start = (index, 0);
            for (row_index, row) in segment.rows.iter().enumerate().rev() {
                if matches!(row.summary, Summary::OperationStarted { .. }) {
                    found += 1;
                    if found >= runs {
                        start = (index, row_index);
                        from_start = false;
                        break 'back;
                    }
                }
            }
        }
    }
    let mut lines = Vec::new();
    for (index, segment) in segments.iter().enumerate().skip(start.0) {
        let from_row = if index == start.0 { start.1 } else { 0 };
        let bound = end
            .filter(|end| end.segment == segment.number)
            .map(|end| end.offset);
        lines.extend(segment.lines(lane, from_row, bound)?);
    }
    Ok(LaneRead { lines, from_start })
}

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// One lane; all of them when none.
    pub lane: Option<LaneName>,
    pub selection: Selection,
    /// The last this many selected turns.
    pub last: usize,
    pub redaction: Redaction,
    /// Where each lane ends for this read (lines from there on are left to `--follow`).
    pub ends: BTreeMap<LaneName, LinePosition>,
}

/// The lanes a query reads, checked to exist.
pub fn lanes_of(sessions: &Path, lane: Option<&LaneName>) -> Result<Vec<LaneName>, String> {
    let all = lane_names(sessions)?;
    match lane {
        None => Ok(all),
        Some(lane) if all.contains(lane) => Ok(vec![lane.clone()]),
        Some(lane) => Err(format!(
            "there is no lane {lane} in {}; {}",
            sessions.display(),
            if all.is_empty() {
                "this agent has no lanes yet".to_owned()
            } else {
                format!(
                    "its lanes are: {} (perch log --lanes lists them)",
                    all.iter()
                        .map(LaneName::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )),
    }
}

/// The last `query.last` selected turns, over the lanes it names, oldest first.
pub fn last_turns(sessions: &Path, query: &Query) -> Result<Vec<Turn>, String> {
    let mut shown = Vec::new();
    for lane in lanes_of(sessions, query.lane.as_ref())? {
        shown.extend(lane_turns(sessions, &lane, query)?);
    }
    shown.sort_by(|a, b| (a.facts.at, &a.lane, &a.start).cmp(&(b.facts.at, &b.lane, &b.start)));
    let skip = shown.len().saturating_sub(query.last);
    Ok(shown.split_off(skip))
}

fn lane_turns(sessions: &Path, lane: &LaneName, query: &Query) -> Result<Vec<Turn>, String> {
    let mut runs = query.last.saturating_mul(2).saturating_add(4);
    loop {
        let read = read_lane(sessions, lane, Some(runs), query.ends.get(lane))?;
        let mut assembler = Assembler::new(lane.clone(), query.redaction.clone());
        for (position, line) in &read.lines {
            assembler.push(position.clone(), line);
        }
        let turns = assembler.into_turns();
        let earliest = turns.iter().find_map(|turn| turn.facts.at);
        let mut selected: Vec<Turn> = turns
            .into_iter()
            .filter(|turn| worth_showing(turn) && query.selection.selects(turn))
            .collect();
        if selected.len() >= query.last
            || read.from_start
            || !query.selection.wants_before(earliest)
        {
            let skip = selected.len().saturating_sub(query.last);
            return Ok(selected.split_off(skip));
        }
        runs = runs.saturating_mul(4);
    }
}

/// Lines before the first run read are shown only when they say something (damage, a note).
fn worth_showing(turn: &Turn) -> bool {
    turn.start.is_some()
        || turn.events.iter().any(|event| {
            !matches!(
                event.kind,
                EventKind::SegmentStarted { .. } | EventKind::LeafSet { .. }
            )
        })
}

/// One lane as `perch log --lanes` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LaneStats {
    pub lane: LaneName,
    /// When its last readable line was written.
    pub last_activity: Option<Timestamp>,
    /// Bytes on disk: segments, indexes and the lock file.
    pub bytes: u64,
    pub segments: usize,
    pub lines: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The sum of its model replies' costs, in millionths.
    pub cost_micros: u64,
    /// Lines that could not be read.
    pub damaged: u64,
}

/// Every lane's figures, reading only the lines the index marks as observations (and whatever
/// the index does not cover).
pub fn lane_stats(sessions: &Path) -> Result<Vec<LaneStats>, String> {
    let mut stats = Vec::new();
    for lane in lane_names(sessions)? {
        stats.push(one_lane_stats(sessions, &lane)?);
    }
    Ok(stats)
}

fn one_lane_stats(sessions: &Path, lane: &LaneName) -> Result<LaneStats, String> {
    let dir = sessions.join(lane.as_str());
    let bytes = fs::read_dir(&dir)
        .map_err(|error| problem("list", &dir, &error))?
        .filter_map(Result::ok)
        .filter_map(|item| item.metadata().ok())
        .filter(fs::Metadata::is_file)
        .map(|metadata| metadata.len())
        .sum();
    let mut stats = LaneStats {
        lane: lane.clone(),
        last_activity: None,
        bytes,
        segments: 0,
        lines: 0,
        input_tokens: 0,
        output_tokens: 0,
        cost_micros: 0,
        damaged: 0,
    };
    let numbers = segment_numbers(&dir)?;
    stats.segments = numbers.len();
    for number in numbers {
        let segment = SegmentFile::open(&dir, number)?;
        let mut count = |read: &ReadLine| match read {
            ReadLine::Line(line) => {
                if let Some(at) = line_at(line) {
                    stats.last_activity = Some(stats.last_activity.map_or(at, |last| last.max(at)));
                }
                if let Line::Record(Record::ModelReplied {
                    input,
                    output,
                    cost,
                    ..
                }) = line
                {
                    stats.input_tokens += input;
                    stats.output_tokens += output;
                    stats.cost_micros += cost.map_or(0, |cost| cost.micros());
                }
            }
            ReadLine::Damaged { .. } => stats.damaged += 1,
        };
        for (index, row) in segment.rows.iter().enumerate() {
            let last = index + 1 == segment.rows.len();
            if !matches!(row.summary, Summary::Observed { .. }) && !last {
                continue;
            }
            let bytes = segment.bytes(row.offset, row.end())?;
            let read = if crc32fast::hash(&bytes) == row.crc {
                parse(&bytes).unwrap_or_else(|reason| segment.damaged(index as u64 + 1, reason))
            } else {
                segment.damaged(index as u64 + 1, "checksum mismatch".into())
            };
            count(&read);
        }
        stats.lines += segment.rows.len() as u64;
        let tail = segment.lines(lane, segment.rows.len(), None)?;
        stats.lines += tail.len() as u64;
        for (_, read) in &tail {
            count(read);
        }
    }
    Ok(stats)
}

fn line_at(line: &Line) -> Option<Timestamp> {
    match line {
        Line::Header(header) => Some(header.created),
        Line::Entry(entry) => Some(entry.at),
        Line::Record(record) => Some(match record {
            Record::OperationStarted { at, .. }
            | Record::AttemptStarted { at, .. }
            | Record::ToolStarted { at, .. }
            | Record::OperationFinished { at, .. }
            | Record::ModelReplied { at, .. }
            | Record::ToolFinished { at, .. }
            | Record::DeliverySettled { at, .. }
            | Record::LeafSet { at, .. }
            | Record::TailRepaired { at, .. } => *at,
        }),
    }
}
