//! A segmented journal: an ordered durable queue whose consumed segments are deleted.

use super::error::LogError;
use super::file::{Appender, create_with_first_line, lock_exclusive, scan_lines, sync_parent};
use super::segment::{segment_numbers, segment_path};
use crate::host::clock::Clock;
use perch_core::Timestamp;
use perch_core::journal::{JOURNAL_VERSION, JournalLine};
use perch_core::log::Commit;
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// An item waiting to be consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalItem {
    pub seq: u64,
    pub at: Timestamp,
    pub body: serde_json::Value,
}

#[derive(Debug)]
struct SegmentItems {
    number: u32,
    seqs: Vec<u64>,
    /// When its newest item was appended.
    newest: Option<Timestamp>,
}

/// One journal directory, owned by one task; a second opener gets [`LogError::Held`].
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    _lock: File,
    segments: Vec<SegmentItems>,
    current: Appender,
    next_seq: u64,
    unconsumed: BTreeSet<u64>,
    max_segment_bytes: u64,
    /// How long a fully consumed segment is kept (the deduplication window).
    retain: std::time::Duration,
    clock: Clock,
}

/// What a journal holds when it is opened.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JournalContents {
    /// Items not yet consumed, in order.
    pub pending: Vec<JournalItem>,
    /// Consumed items still on disk (inside the retention window), in order.
    pub consumed: Vec<JournalItem>,
    /// Lines [`peek`] could not read (a torn last line is not one of them): what is pending is
    /// not known past them.
    pub unreadable: Vec<UnreadableLine>,
}

/// A journal line that is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableLine {
    pub path: PathBuf,
    /// 1-based.
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for UnreadableLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.reason)
    }
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and returns the items not yet consumed, oldest
    /// first. A torn tail in the newest segment is cut off.
    pub fn open(
        dir: &Path,
        max_segment_bytes: u64,
        clock: Clock,
    ) -> Result<(Journal, Vec<JournalItem>), LogError> {
        Journal::open_retaining(dir, max_segment_bytes, std::time::Duration::ZERO, clock)
            .map(|(journal, contents)| (journal, contents.pending))
    }

    /// Like [`Journal::open`], keeping fully consumed segments until their newest item is older
    /// than `retain`, and returning the consumed items still on disk too.
    pub fn open_retaining(
        dir: &Path,
        max_segment_bytes: u64,
        retain: std::time::Duration,
        clock: Clock,
    ) -> Result<(Journal, JournalContents), LogError> {
        fs::create_dir_all(dir).map_err(LogError::io(dir, "create"))?;
        // Opened once per process, sometimes from async code: a held journal is refused at once.
        let lock = lock_exclusive(&dir.join("lock"), std::time::Duration::ZERO)?;
        let mut numbers = segment_numbers(dir)?;
        if numbers.is_empty() {
            create_segment(dir, 1, &clock)?;
            numbers.push(1);
        }
        let newest = numbers[numbers.len() - 1];
        let mut segments = Vec::new();
        let mut items = Vec::new();
        let mut consumed = BTreeSet::new();
        let mut next_seq = 1;
        let mut current_end = 0;
        for &number in &numbers {
            let path = segment_path(dir, number);
            let file = File::open(&path).map_err(LogError::io(&path, "open"))?;
            let len = file
                .metadata()
                .map_err(LogError::io(&path, "inspect"))?
                .len();
            let mut seqs = Vec::new();
            let mut newest_item = None;
            let scan = scan_lines(&file, &path, 0, len, 1, |_, bytes| {
                let line: JournalLine = serde_json::from_slice(&bytes[..bytes.len() - 1])
                    .map_err(|error| format!("not a journal line: {error}"))?;
                match line {
                    JournalLine::Header { version, .. } if version != JOURNAL_VERSION => {
                        return Err(format!(
                            "journal version {version} is not {JOURNAL_VERSION}"
                        ));
                    }
                    JournalLine::Header { .. } => {}
                    JournalLine::Item { seq, at, body } => {
                        if seq < next_seq {
                            return Err(format!("item {seq} is out of order"));
                        }
                        next_seq = seq + 1;
                        seqs.push(seq);
                        newest_item = Some(at);
                        items.push(JournalItem { seq, at, body });
                    }
                    JournalLine::Consumed { seqs, .. } => consumed.extend(seqs),
                }
                Ok(())
            })?;
            if let Some(bytes) = scan.torn {
                if number != newest {
                    return Err(LogError::Corrupt {
                        path,
                        line: 0,
                        reason: format!("{bytes} bytes of an incomplete line in a closed segment"),
                    });
                }
                let mut appender = Appender::open(&path, scan.end)?;
                appender.truncate(scan.end)?;
            }
            current_end = scan.end;
            segments.push(SegmentItems {
                number,
                seqs,
                newest: newest_item,
            });
        }
        let (done, items): (Vec<JournalItem>, Vec<JournalItem>) = items
            .into_iter()
            .partition(|item| consumed.contains(&item.seq));
        let unconsumed = items.iter().map(|item| item.seq).collect();
        let current = Appender::open(&segment_path(dir, newest), current_end)?;
        let mut journal = Journal {
            dir: dir.to_owned(),
            _lock: lock,
            segments,
            current,
            next_seq,
            unconsumed,
            max_segment_bytes,
            retain,
            clock,
        };
        journal.delete_consumed()?;
        Ok((
            journal,
            JournalContents {
                pending: items,
                consumed: done,
                unreadable: Vec::new(),
            },
        ))
    }

    /// Appends items in order with one write and one fsync; returns their sequence numbers.
    /// When this returns, the items survive a crash of the machine.
    pub fn append(&mut self, bodies: &[serde_json::Value]) -> Result<Vec<u64>, LogError> {
        if self.current.len() >= self.max_segment_bytes {
            self.roll()?;
        }
        let mut bytes = Vec::new();
        let mut seqs = Vec::with_capacity(bodies.len());
        let mut sync = false;
        let at = self.clock.now();
        for (offset, body) in bodies.iter().enumerate() {
            let seq = self.next_seq + offset as u64;
            let line = JournalLine::Item {
                seq,
                at,
                body: body.clone(),
            };
            sync |= line.commit() == Commit::Sync;
            push_line(&mut bytes, &line);
            seqs.push(seq);
        }
        self.current.append(&bytes, sync)?;
        self.next_seq += bodies.len() as u64;
        self.unconsumed.extend(seqs.iter().copied());
        if let Some(segment) = self.segments.last_mut() {
            segment.seqs.extend(seqs.iter().copied());
            segment.newest = Some(at);
        }
        Ok(seqs)
    }

    /// Marks items consumed and deletes the oldest segments whose items are all consumed.
    pub fn consume(&mut self, seqs: &[u64]) -> Result<(), LogError> {
        let fresh: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|seq| self.unconsumed.contains(seq))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let line = JournalLine::Consumed {
            seqs: fresh.clone(),
            at: self.clock.now(),
        };
        let mut bytes = Vec::new();
        push_line(&mut bytes, &line);
        self.current.append(&bytes, line.commit() == Commit::Sync)?;
        for seq in fresh {
            self.unconsumed.remove(&seq);
        }
        self.delete_consumed()
    }

    /// Items appended and not yet consumed.
    pub fn depth(&self) -> usize {
        self.unconsumed.len()
    }

    /// Segment files on disk.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn roll(&mut self) -> Result<(), LogError> {
        let number = self.segments.last().map_or(1, |segment| segment.number + 1);
        create_segment(&self.dir, number, &self.clock)?;
        let path = segment_path(&self.dir, number);
        let len = fs::metadata(&path)
            .map_err(LogError::io(&path, "inspect"))?
            .len();
        self.current = Appender::open(&path, len)?;
        self.segments.push(SegmentItems {
            number,
            seqs: Vec::new(),
            newest: None,
        });
        self.delete_consumed()
    }

    fn delete_consumed(&mut self) -> Result<(), LogError> {
        let mut deleted = false;
        let now = self.clock.now();
        let retain = chrono::Duration::from_std(self.retain).unwrap_or(chrono::Duration::MAX);
        while self.segments.len() > 1
            && self.segments[0]
                .seqs
                .iter()
                .all(|seq| !self.unconsumed.contains(seq))
            && self.segments[0]
                .newest
                .is_none_or(|newest| newest + retain <= now)
        {
            let segment = self.segments.remove(0);
            let path = segment_path(&self.dir, segment.number);
            fs::remove_file(&path).map_err(LogError::io(&path, "delete the consumed segment"))?;
            deleted = true;
        }
        if deleted {
            sync_parent(&segment_path(&self.dir, 0))?;
        }
        Ok(())
    }
}

fn push_line(bytes: &mut Vec<u8>, line: &JournalLine) {
    let encoded =
        serde_json::to_vec(line).expect("journal lines have string keys and always serialize");
    bytes.extend_from_slice(&encoded);
    bytes.push(b'\n');
}

fn create_segment(dir: &Path, number: u32, clock: &Clock) -> Result<(), LogError> {
    let mut bytes = Vec::new();
    push_line(
        &mut bytes,
        &JournalLine::Header {
            version: JOURNAL_VERSION,
            segment: number,
            created: clock.now(),
        },
    );
    create_with_first_line(&segment_path(dir, number), &bytes)
}

/// What a journal holds, read without its lock and without repairing anything (a torn last
/// line is left alone), for read-only views such as `perch status`.
pub fn peek(dir: &Path) -> Result<JournalContents, LogError> {
    let mut items = Vec::new();
    let mut consumed = BTreeSet::new();
    let mut unreadable = Vec::new();
    let numbers = match segment_numbers(dir) {
        Ok(numbers) => numbers,
        Err(_) if !dir.exists() => return Ok(JournalContents::default()),
        Err(error) => return Err(error),
    };
    let newest = numbers.last().copied();
    for number in numbers {
        let path = segment_path(dir, number);
        let bytes = fs::read(&path).map_err(LogError::io(&path, "read"))?;
        let mut lines: Vec<&[u8]> = bytes.split(|byte| *byte == b'\n').collect();
        if lines.last().is_some_and(|last| last.is_empty()) {
            lines.pop();
        } else if Some(number) == newest {
            // A torn last line: a crash mid-append leaves it, and the next open cuts it off.
            lines.pop();
        }
        for (index, line) in lines.into_iter().enumerate() {
            match serde_json::from_slice::<JournalLine>(line) {
                Ok(JournalLine::Item { seq, at, body }) => {
                    items.push(JournalItem { seq, at, body })
                }
                Ok(JournalLine::Consumed { seqs, .. }) => consumed.extend(seqs),
                Ok(JournalLine::Header { .. }) => {}
                Err(error) => unreadable.push(UnreadableLine {
                    path: path.clone(),
                    line: index + 1,
                    reason: format!("not a journal line: {error}"),
                }),
            }
        }
    }
    let (done, pending) = items
        .into_iter()
        .partition(|item| consumed.contains(&item.seq));
    Ok(JournalContents {
        pending,
        consumed: done,
        unreadable,
    })
}
