//! Segment files and their indexes, read back into a lane's state; and the chain of segments
//! that makes up one lane.

use super::error::LogError;
use super::file::{open_read_append, read_at, scan_lines};
use super::snapshot::{IndexStatus, LaneSnapshot, OpenSummary};
use perch_core::id::EntryId;
use perch_core::log::{
    Entry, FORMAT_VERSION, Header, INDEX_HEADER_LEN, IndexHeader, LaneState, Line, PendingTool,
    Row, Summary,
};
use perch_core::name::LaneName;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub(crate) fn segment_path(dir: &Path, number: u32) -> PathBuf {
    dir.join(format!("{number:06}.jsonl"))
}

pub(crate) fn index_path(dir: &Path, number: u32) -> PathBuf {
    dir.join(format!("{number:06}.idx"))
}

/// The segment numbers present in a lane directory, oldest first.
pub(crate) fn segment_numbers(dir: &Path) -> Result<Vec<u32>, LogError> {
    let mut numbers = Vec::new();
    let listing = match fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(numbers),
        Err(error) => return Err(LogError::io(dir, "list")(error)),
    };
    for item in listing {
        let item = item.map_err(LogError::io(dir, "list"))?;
        let name = item.file_name();
        let Some(stem) = name.to_str().and_then(|name| name.strip_suffix(".jsonl")) else {
            continue;
        };
        if let Ok(number) = stem.parse::<u32>() {
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// How a segment file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    /// Read and append through one descriptor (the lane writer's newest segment).
    ReadAppend,
}

/// One segment file, its rows and the state they fold to.
#[derive(Debug)]
pub(crate) struct Segment {
    pub path: PathBuf,
    pub number: u32,
    /// Held open while the segment is the newest; an older one is opened when read.
    file: Option<File>,
    pub header: Header,
    pub rows: Vec<Row>,
    pub state: LaneState,
}

/// A segment as found on disk.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub segment: Segment,
    /// Where the good lines end and how many bytes after that are torn.
    pub torn: Option<(u64, u64)>,
    pub index: IndexStatus,
    /// How many rows of the index file on disk are right (the rest must be rewritten).
    pub index_rows_kept: usize,
}

impl Segment {
    pub(crate) fn load(dir: &Path, number: u32, access: Access) -> Result<Loaded, LogError> {
        let path = segment_path(dir, number);
        let file = match access {
            Access::Read => File::open(&path).map_err(LogError::io(&path, "open"))?,
            Access::ReadAppend => open_read_append(&path)?,
        };
        let len = file
            .metadata()
            .map_err(LogError::io(&path, "inspect"))?
            .len();
        let header = read_header(&file, &path, len)?;
        let (mut rows, index) =
            read_index(&index_path(dir, number), &header, number, &file, &path, len)?;
        let index_rows_kept = rows.len();
        let from = rows.last().map_or(0, Row::end);
        let first_line = rows.len() as u64 + 1;
        let scan = scan_lines(&file, &path, from, len, first_line, |offset, bytes| {
            let line = parse_line(bytes)?;
            if rows.is_empty() != matches!(line, Line::Header(_)) {
                return Err("the header must be the first line and only the first".into());
            }
            rows.push(Row::new(offset, bytes, Summary::of(&line)));
            Ok(())
        })?;
        let index = match index {
            IndexStatus::Current if rows.len() > index_rows_kept => IndexStatus::Extended {
                lines: (rows.len() - index_rows_kept) as u64,
            },
            other => other,
        };
        let mut state = LaneState::default();
        for row in &rows {
            state.apply(&row.summary);
        }
        let segment = Segment {
            path,
            number,
            file: Some(file),
            header,
            rows,
            state,
        };
        Ok(Loaded {
            segment,
            torn: scan.torn.map(|bytes| (scan.end, bytes)),
            index,
            index_rows_kept,
        })
    }

    /// The open file, when the segment holds one.
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// Closes the file; later reads open it again.
    pub(crate) fn release_file(&mut self) {
        self.file = None;
    }

    /// Reads line `index` (0-based), checking it against its row.
    pub(crate) fn read(&self, index: u64) -> Result<Line, LogError> {
        match &self.file {
            Some(file) => self.read_in(file, index),
            None => {
                let file = File::open(&self.path).map_err(LogError::io(&self.path, "open"))?;
                self.read_in(&file, index)
            }
        }
    }

    /// Reads `lines` (0-based), each checked against its row, opening the file at most once.
    pub(crate) fn read_lines(&self, lines: &[u64]) -> Result<Vec<Line>, LogError> {
        let opened;
        let file = match &self.file {
            Some(file) => file,
            None => {
                opened = File::open(&self.path).map_err(LogError::io(&self.path, "open"))?;
                &opened
            }
        };
        lines
            .iter()
            .map(|&index| self.read_in(file, index))
            .collect()
    }

    fn read_in(&self, file: &File, index: u64) -> Result<Line, LogError> {
        let corrupt = |reason: String| LogError::Corrupt {
            path: self.path.clone(),
            line: index + 1,
            reason,
        };
        let row = usize::try_from(index)
            .ok()
            .and_then(|i| self.rows.get(i))
            .ok_or_else(|| corrupt("no such line".into()))?;
        let bytes = read_at(file, &self.path, row.offset, row.len)?;
        if crc32fast::hash(&bytes) != row.crc {
            return Err(corrupt(
                "its bytes changed after it was written (checksum mismatch)".into(),
            ));
        }
        parse_line(&bytes).map_err(corrupt)
    }

    pub(crate) fn push(&mut self, row: Row) {
        self.state.apply(&row.summary);
        self.rows.push(row);
    }

    pub(crate) fn end(&self) -> u64 {
        self.rows.last().map_or(0, Row::end)
    }
}

pub(crate) fn parse_line(bytes: &[u8]) -> Result<Line, String> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    serde_json::from_slice(body).map_err(|error| format!("not a log line: {error}"))
}

fn read_header(file: &File, path: &Path, len: u64) -> Result<Header, LogError> {
    let corrupt = |reason: &str| LogError::Corrupt {
        path: path.to_owned(),
        line: 1,
        reason: reason.to_owned(),
    };
    let mut bytes = Vec::new();
    let mut end = None;
    for probe in [4u32 << 10, 1 << 20] {
        let probe = u32::try_from(len.min(u64::from(probe))).unwrap_or(probe);
        bytes = read_at(file, path, 0, probe)?;
        end = bytes.iter().position(|&b| b == b'\n');
        if end.is_some() || u64::from(probe) == len {
            break;
        }
    }
    let end = end.ok_or_else(|| corrupt("no complete header line"))?;
    match parse_line(&bytes[..=end]).map_err(|reason| corrupt(&reason))? {
        Line::Header(header) if header.version != FORMAT_VERSION => {
            Err(LogError::UnsupportedVersion {
                path: path.to_owned(),
                found: header.version,
            })
        }
        Line::Header(header) => Ok(header),
        _ => Err(corrupt("the first line is not a header")),
    }
}

/// Reads the index and keeps the rows that provably match the log; anything doubtful means
/// starting over from the log.
fn read_index(
    index: &Path,
    header: &Header,
    number: u32,
    file: &File,
    path: &Path,
    len: u64,
) -> Result<(Vec<Row>, IndexStatus), LogError> {
    let rebuild = |reason: &str| {
        Ok((
            Vec::new(),
            IndexStatus::Rebuilt {
                reason: reason.to_owned(),
            },
        ))
    };
    let bytes = match fs::read(index) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == ErrorKind::NotFound => return rebuild("there was no index"),
        Err(error) => return Err(LogError::io(index, "read")(error)),
    };
    let expected = IndexHeader {
        session: header.session,
        segment: number,
    };
    if IndexHeader::decode(&bytes) != Some(expected) {
        return rebuild("the index belongs to another file");
    }
    let mut rows = Vec::with_capacity((bytes.len() - INDEX_HEADER_LEN) / Row::SIZE);
    for chunk in bytes[INDEX_HEADER_LEN..].chunks_exact(Row::SIZE) {
        let Ok(raw) = <&[u8; Row::SIZE]>::try_from(chunk) else {
            break;
        };
        let Ok(row) = Row::decode(raw) else {
            return rebuild("the index has an unreadable row");
        };
        let expected_offset = rows.last().map_or(0, Row::end);
        if row.offset != expected_offset || row.len == 0 {
            return rebuild("the index rows are not contiguous");
        }
        if row.end() > len {
            break;
        }
        rows.push(row);
    }
    if !matches!(
        rows.first().map(|row| row.summary),
        None | Some(Summary::Header { .. })
    ) {
        return rebuild("the index does not start with the header");
    }
    if let Some(last) = rows.last() {
        let bytes = read_at(file, path, last.offset, last.len)?;
        if crc32fast::hash(&bytes) != last.crc {
            return rebuild("the index does not match the log");
        }
    }
    Ok((rows, IndexStatus::Current))
}

/// The segments of one lane: the newest, fully loaded, and older ones loaded when a branch
/// reaches back into them.
#[derive(Debug)]
pub(crate) struct Chain {
    pub dir: PathBuf,
    pub lane: LaneName,
    pub current: Segment,
    older: HashMap<u32, Segment>,
}

impl Chain {
    pub(crate) fn new(dir: PathBuf, lane: LaneName, current: Segment) -> Chain {
        Chain {
            dir,
            lane,
            current,
            older: HashMap::new(),
        }
    }

    /// Replaces the newest segment after a roll; the old one joins the older ones.
    pub(crate) fn advance(&mut self, next: Segment) {
        let mut previous = std::mem::replace(&mut self.current, next);
        previous.release_file();
        self.older.insert(previous.number, previous);
    }

    fn older(&mut self, number: u32) -> Result<&Segment, LogError> {
        if !self.older.contains_key(&number) {
            let mut segment = Segment::load(&self.dir, number, Access::Read)?.segment;
            segment.release_file();
            self.older.insert(number, segment);
        }
        Ok(&self.older[&number])
    }

    /// The older segment that holds entry `id`, searching newest first.
    fn find_older(&mut self, id: EntryId, below: u32) -> Result<Option<u32>, LogError> {
        for number in (1..below).rev() {
            if !segment_path(&self.dir, number).exists() {
                continue;
            }
            if self.older(number)?.state.contains(id) {
                return Ok(Some(number));
            }
        }
        Ok(None)
    }

    pub(crate) fn knows(&mut self, id: EntryId) -> Result<bool, LogError> {
        if self.current.state.contains(id) {
            return Ok(true);
        }
        let below = self.current.number;
        Ok(self.find_older(id, below)?.is_some())
    }

    /// The entries from the root to the leaf, across segments.
    pub(crate) fn branch(&mut self) -> Result<Vec<Entry>, LogError> {
        let Some(leaf) = self.current.state.leaf() else {
            return Ok(Vec::new());
        };
        let mut pieces: Vec<Vec<Entry>> = Vec::new();
        let mut number = self.current.number;
        let mut next = Some(leaf);
        while let Some(id) = next {
            let segment = if number == self.current.number {
                &self.current
            } else {
                self.older(number)?
            };
            let (lines, continues) = segment.state.branch(id);
            let mut entries = Vec::with_capacity(lines.len());
            for (line, read) in lines.iter().zip(segment.read_lines(&lines)?) {
                match read {
                    Line::Entry(entry) => entries.push(entry),
                    _ => {
                        return Err(LogError::Corrupt {
                            path: segment.path.clone(),
                            line: line + 1,
                            reason: "the index says an entry is here, the line is not one".into(),
                        });
                    }
                }
            }
            pieces.push(entries);
            next = None;
            if let Some(id) = continues {
                let Some(found) = self.find_older(id, number)? else {
                    return Err(LogError::Corrupt {
                        path: segment_path(&self.dir, number),
                        line: 1,
                        reason: format!(
                            "the branch continues at entry {id}, which no earlier segment holds"
                        ),
                    });
                };
                number = found;
                next = Some(id);
            }
        }
        Ok(pieces.into_iter().rev().flatten().collect())
    }

    pub(crate) fn snapshot(&self) -> LaneSnapshot {
        let state = &self.current.state;
        LaneSnapshot {
            lane: self.lane.clone(),
            segment: self.current.number,
            lines: state.lines(),
            leaf: state.leaf(),
            open: state
                .open_operations()
                .iter()
                .map(|operation| OpenSummary {
                    op: operation.op,
                    missing: state
                        .missing_results(operation)
                        .map(|tool| tool.result)
                        .collect(),
                })
                .collect(),
        }
    }

    /// For each open operation, the tools it declared and never wrote a result for.
    pub(crate) fn pending_tools(
        &self,
    ) -> Result<Vec<(perch_core::id::OperationId, Vec<PendingTool>)>, LogError> {
        let state = &self.current.state;
        let mut open = Vec::new();
        for operation in state.open_operations() {
            let mut pending = Vec::new();
            for tool in state.missing_results(operation) {
                let line = self.current.read(tool.line)?;
                let Line::Record(record) = &line else {
                    return Err(LogError::Corrupt {
                        path: self.current.path.clone(),
                        line: tool.line + 1,
                        reason: "the index says a tool_started record is here, the line is not one"
                            .into(),
                    });
                };
                if let Some(tool) = PendingTool::from_record(record) {
                    pending.push(tool);
                }
            }
            open.push((operation.op, pending));
        }
        Ok(open)
    }
}

/// A read-only view of a lane, for commands that must not take the writer's place: no lock, no
/// repair, nothing written. A torn tail is left alone and reported.
#[derive(Debug)]
pub struct LaneReader {
    chain: Chain,
    torn: Option<u64>,
}

impl LaneReader {
    pub fn open(sessions: &Path, lane: &LaneName) -> Result<LaneReader, LogError> {
        let dir = sessions.join(lane.as_str());
        let numbers = segment_numbers(&dir)?;
        let Some(&newest) = numbers.last() else {
            return Err(LogError::Io {
                path: dir,
                action: "open the lane",
                source: std::io::Error::new(ErrorKind::NotFound, "no segment files"),
            });
        };
        let loaded = Segment::load(&dir, newest, Access::Read)?;
        Ok(LaneReader {
            chain: Chain::new(dir, lane.clone(), loaded.segment),
            torn: loaded.torn.map(|(_, bytes)| bytes),
        })
    }

    pub fn snapshot(&self) -> LaneSnapshot {
        self.chain.snapshot()
    }

    pub fn branch(&mut self) -> Result<Vec<Entry>, LogError> {
        self.chain.branch()
    }

    /// Bytes at the end of the newest segment that do not form a complete line (the writer
    /// cuts them off when it next opens the lane).
    pub fn torn_tail(&self) -> Option<u64> {
        self.torn
    }
}
