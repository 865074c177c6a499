//! The session log on disk.
//!
//! A lane lives in `.perch/sessions/<lane>/` as a chain of segment files (`000001.jsonl`, …),
//! each with a sidecar index (`000001.idx`) of fixed-size rows. One writer per lane owns the
//! newest segment and its index; every other party sends it messages. The writers run on a pool
//! of a fixed number of threads ([`pool`]), not a thread per lane. Appends are written and
//! flushed before they return, and fsynced (one fsync shared by every append of the lane waiting
//! at the time) when the line itself says it precedes an irreversible effect.
//!
//! Opening reads the index and parses only the lines the index does not cover, so reopening a
//! long lane costs little more than reading its index. The log is the truth: an index that does
//! not match its log is rebuilt from the log.
//!
//! [`transcript`] reads lanes for `perch log` without the lock; [`follow`] watches them for
//! `perch log --follow`.

mod error;
mod file;
pub mod follow;
mod journal;
mod journal_writer;
mod lane;
mod pool;
mod recover;
mod scan;
mod segment;
mod snapshot;
pub mod transcript;
mod writer;

pub use error::LogError;
pub use journal::{Journal, JournalContents, JournalItem, peek as peek_journal};
pub use journal_writer::{DedupKeys, JournalEntry, JournalWriter, Journaled};
pub use lane::LaneLog;
pub use pool::{THREADS as WRITER_THREADS, hosted_lanes};
pub use recover::{RecoveryReport, ToolRerun, recover};
pub use scan::{TakenRun, open_operations, taken_run};
pub use segment::LaneReader;
pub use snapshot::{Appended, IndexStatus, LaneSnapshot, OpenReport, OpenSummary, TailRepair};
