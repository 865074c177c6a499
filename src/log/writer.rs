//! The writer of one lane, which owns the newest segment, its index and the lane's lock, and the
//! requests its handle ([`super::lane`]) sends it. Writers run on the pool's threads
//! ([`super::pool`]), never on a thread of their own.

use super::error::LogError;
use super::file::{Appender, append_to, create_with_first_line, lock_exclusive};
use super::segment::{Access, Chain, Segment, index_path, segment_numbers, segment_path};
use super::snapshot::{Appended, IndexStatus, LaneSnapshot, OpenReport, TailRepair};
use crate::host::clock::Clock;
use perch_core::id::{OperationId, SessionId};
use perch_core::log::{
    Commit, Entry, FORMAT_VERSION, Header, INDEX_HEADER_LEN, IndexHeader, Line, PendingTool,
    Previous, Record, Row, Summary, Violation,
};
use perch_core::name::LaneName;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use tokio::sync::oneshot;

type Reply<T> = oneshot::Sender<Result<T, LogError>>;

/// A request to a lane's writer.
pub(super) enum Command {
    Append {
        encoded: Encoded,
        reply: Reply<Appended>,
    },
    Snapshot {
        reply: oneshot::Sender<LaneSnapshot>,
    },
    Branch {
        reply: Reply<Vec<Entry>>,
    },
    Read {
        line: u64,
        reply: Reply<Line>,
    },
    PendingTools {
        reply: Reply<Vec<(OperationId, Vec<PendingTool>)>>,
    },
    Roll {
        reply: Reply<u32>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// A line serialized by the caller, so producers share the encoding work.
pub(super) struct Encoded {
    bytes: Vec<u8>,
    summary: Summary,
    commit: Commit,
}

impl Encoded {
    pub(super) fn new(line: &Line) -> Encoded {
        let mut bytes =
            serde_json::to_vec(line).expect("log lines have string keys and always serialize");
        bytes.push(b'\n');
        Encoded {
            bytes,
            summary: Summary::of(line),
            commit: line.commit(),
        }
    }
}

pub(super) fn stopped() -> LogError {
    LogError::WriterStopped {
        reason: "it has shut down".into(),
    }
}

fn create_segment(dir: &Path, header: &Header) -> Result<(), LogError> {
    let encoded = Encoded::new(&Line::Header(header.clone()));
    create_with_first_line(&segment_path(dir, header.segment), &encoded.bytes)
}

/// Cuts the newest segment back to `len` (a torn tail) and makes that durable.
fn truncate(segment: &Segment, len: u64) -> Result<(), LogError> {
    let Some(file) = segment.file() else {
        return Err(LogError::WriterStopped {
            reason: "the newest segment is not open".into(),
        });
    };
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(LogError::io(&segment.path, "truncate"))
}

/// The index file of the newest segment. It is opened only while rows are appended, so an open
/// lane holds no descriptor for it.
#[derive(Debug)]
struct IndexFile {
    path: PathBuf,
    len: u64,
}

impl IndexFile {
    fn append(&mut self, rows: &[u8]) -> Result<(), LogError> {
        let mut appender = Appender::open(&self.path, self.len)?;
        appender.append(rows, false)?;
        self.len = appender.len();
        Ok(())
    }
}

/// Brings the index file in line with the segment's rows.
fn write_index(
    dir: &Path,
    segment: &Segment,
    kept: usize,
    status: &IndexStatus,
) -> Result<IndexFile, LogError> {
    let path = index_path(dir, segment.number);
    let header = IndexHeader {
        session: segment.header.session,
        segment: segment.number,
    };
    let kept = if matches!(status, IndexStatus::Rebuilt { .. }) {
        0
    } else {
        kept
    };
    let mut bytes = Vec::with_capacity(INDEX_HEADER_LEN + (segment.rows.len() - kept) * Row::SIZE);
    if kept == 0 {
        bytes.extend_from_slice(&header.encode());
        let temporary = path.with_extension("idx.tmp");
        for row in &segment.rows {
            bytes.extend_from_slice(&row.encode());
        }
        let mut file = File::create(&temporary).map_err(LogError::io(&temporary, "create"))?;
        file.write_all(&bytes)
            .map_err(LogError::io(&temporary, "write"))?;
        fs::rename(&temporary, &path).map_err(LogError::io(&path, "rename into place"))?;
        return Ok(IndexFile {
            path,
            len: bytes.len() as u64,
        });
    }
    let kept_len = (INDEX_HEADER_LEN + kept * Row::SIZE) as u64;
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(LogError::io(&path, "open"))?;
    file.set_len(kept_len)
        .map_err(LogError::io(&path, "truncate"))?;
    drop(file);
    let mut index = IndexFile {
        path,
        len: kept_len,
    };
    for row in &segment.rows[kept..] {
        bytes.extend_from_slice(&row.encode());
    }
    if !bytes.is_empty() {
        index.append(&bytes)?;
    }
    Ok(index)
}

#[derive(Default)]
struct Staged {
    bytes: Vec<u8>,
    rows: Vec<u8>,
    sync: bool,
    replies: Vec<(Reply<Appended>, u64)>,
}

/// One lane's writer: everything it owns lives here, and it lives in the pool's map while the
/// lane is open. Its descriptors: the lane's lock and the newest segment (read and appended
/// through one); the index is opened per batch.
pub(super) struct Writer {
    chain: Chain,
    /// The newest segment's length as written.
    log_len: u64,
    index: Option<IndexFile>,
    _lock: File,
    clock: Clock,
    broken: Option<String>,
    staged: Staged,
}

impl Writer {
    /// Opens (or creates) the lane under `sessions`, taking its lock, cutting off a torn tail
    /// and bringing its index up to date. Blocking.
    pub(super) fn open(
        sessions: &Path,
        lane: &LaneName,
        clock: Clock,
    ) -> Result<(Writer, OpenReport), LogError> {
        let dir = sessions.join(lane.as_str());
        fs::create_dir_all(&dir).map_err(LogError::io(&dir, "create"))?;
        // A lane is closed as idle and reopened while perch runs programs, whose forks can hold
        // its lock a moment after it is let go.
        let lock = lock_exclusive(&dir.join("lock"), crate::host::file_lock::MOMENT)?;
        let numbers = segment_numbers(&dir)?;
        let created = numbers.is_empty();
        let number = match numbers.last() {
            Some(&number) => number,
            None => {
                let header = Header {
                    version: FORMAT_VERSION,
                    session: SessionId::from_uuid(uuid::Uuid::now_v7()),
                    lane: lane.clone(),
                    segment: 1,
                    created: clock.now(),
                    previous: None,
                };
                create_segment(&dir, &header)?;
                1
            }
        };
        let loaded = Segment::load(&dir, number, Access::ReadAppend)?;
        let segment = loaded.segment;
        let repaired = match loaded.torn {
            Some((offset, truncated_bytes)) => {
                truncate(&segment, offset)?;
                Some(TailRepair {
                    offset,
                    truncated_bytes,
                })
            }
            None => None,
        };
        let index = write_index(&dir, &segment, loaded.index_rows_kept, &loaded.index)?;
        let mut writer = Writer {
            log_len: segment.end(),
            chain: Chain::new(dir, lane.clone(), segment),
            index: Some(index),
            _lock: lock,
            clock,
            broken: None,
            staged: Staged::default(),
        };
        if let Some(repair) = repaired {
            let line = Line::Record(Record::TailRepaired {
                truncated_bytes: repair.truncated_bytes,
                offset: repair.offset,
                at: writer.clock.now(),
            });
            let (reply, _) = oneshot::channel();
            writer.stage(Encoded::new(&line), reply);
            writer.commit_staged();
            if let Some(reason) = writer.broken.take() {
                return Err(LogError::WriterStopped { reason });
            }
        }
        let report = OpenReport {
            lane: lane.clone(),
            segment: number,
            lines: writer.chain.current.state.lines(),
            created,
            repaired,
            index: loaded.index,
        };
        Ok((writer, report))
    }

    /// The lane's directory.
    pub(super) fn dir(&self) -> &Path {
        &self.chain.dir
    }

    /// Whether appends are staged and not yet written.
    pub(super) fn has_staged(&self) -> bool {
        !self.staged.replies.is_empty()
    }

    /// Checks one line against the lane's invariants and queues it for the next write.
    pub(super) fn stage(&mut self, encoded: Encoded, reply: Reply<Appended>) {
        if let Some(reason) = &self.broken {
            let _ = reply.send(Err(LogError::WriterStopped {
                reason: reason.clone(),
            }));
            return;
        }
        if let Err(violation) = self.check(&encoded.summary) {
            let _ = reply.send(Err(violation));
            return;
        }
        let offset = self.log_len + self.staged.bytes.len() as u64;
        let row = Row::new(offset, &encoded.bytes, encoded.summary);
        let line = self.chain.current.state.lines();
        self.chain.current.push(row);
        self.staged.bytes.extend_from_slice(&encoded.bytes);
        self.staged.rows.extend_from_slice(&row.encode());
        self.staged.sync |= encoded.commit == Commit::Sync;
        self.staged.replies.push((reply, line));
    }

    fn check(&mut self, summary: &Summary) -> Result<(), LogError> {
        match self.chain.current.state.check(summary, |_| false) {
            Ok(()) => Ok(()),
            Err(Violation::UnknownParent(id) | Violation::UnknownLeaf(id))
                if self.chain.knows(id)? =>
            {
                self.chain
                    .current
                    .state
                    .check(summary, |other| other == id)
                    .map_err(LogError::Refused)
            }
            Err(violation) => Err(LogError::Refused(violation)),
        }
    }

    /// Writes every staged line in one write, fsyncs once if any of them needs it, then
    /// answers their callers.
    pub(super) fn commit_staged(&mut self) {
        if self.staged.replies.is_empty() {
            return;
        }
        let staged = std::mem::take(&mut self.staged);
        let durability = if staged.sync {
            Commit::Sync
        } else {
            Commit::Flush
        };
        let current = &self.chain.current;
        let written = match current.file() {
            Some(file) => append_to(
                file,
                &current.path,
                &mut self.log_len,
                &staged.bytes,
                staged.sync,
            ),
            None => Err(LogError::WriterStopped {
                reason: "the newest segment is not open".into(),
            }),
        };
        match written {
            Ok(()) => {
                if let Some(index) = &mut self.index
                    && index.append(&staged.rows).is_err()
                {
                    let _ = fs::remove_file(&index.path);
                    self.index = None;
                }
                for (reply, line) in staged.replies {
                    let _ = reply.send(Ok(Appended { line, durability }));
                }
            }
            Err(error) => {
                let reason = error.to_string();
                self.broken = Some(reason.clone());
                for (reply, _) in staged.replies {
                    let _ = reply.send(Err(LogError::WriterStopped {
                        reason: reason.clone(),
                    }));
                }
            }
        }
    }

    /// Answers a request other than an append or a close (the pool handles those).
    pub(super) fn answer(&mut self, command: Command) {
        match command {
            Command::Snapshot { reply } => {
                let _ = reply.send(self.chain.snapshot());
            }
            Command::Branch { reply } => {
                let _ = reply.send(self.chain.branch());
            }
            Command::Read { line, reply } => {
                let _ = reply.send(self.chain.current.read(line));
            }
            Command::PendingTools { reply } => {
                let _ = reply.send(self.chain.pending_tools());
            }
            Command::Roll { reply } => {
                let _ = reply.send(self.roll());
            }
            Command::Append { .. } | Command::Close { .. } => {}
        }
    }

    fn roll(&mut self) -> Result<u32, LogError> {
        if let Some(reason) = &self.broken {
            return Err(LogError::WriterStopped {
                reason: reason.clone(),
            });
        }
        let current = &self.chain.current;
        let open = current.state.open_operations().len();
        if open > 0 {
            return Err(LogError::OperationsOpen { count: open });
        }
        let number = current.number + 1;
        let file = current
            .path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
            .to_owned();
        let header = Header {
            version: FORMAT_VERSION,
            session: current.header.session,
            lane: self.chain.lane.clone(),
            segment: number,
            created: self.clock.now(),
            previous: Some(Previous {
                file,
                leaf: current.state.leaf(),
            }),
        };
        create_segment(&self.chain.dir, &header)?;
        let loaded = Segment::load(&self.chain.dir, number, Access::ReadAppend)?;
        let index = write_index(&self.chain.dir, &loaded.segment, 0, &loaded.index)?;
        self.log_len = loaded.segment.end();
        self.index = Some(index);
        self.chain.advance(loaded.segment);
        Ok(number)
    }
}
