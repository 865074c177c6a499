//! What a lane's writer reports: what opening a lane found and did, where an append landed,
//! and the lane's state. The segments compute them; the handle hands them out.

use perch_core::id::{EntryId, OperationId};
use perch_core::log::Commit;
use perch_core::name::LaneName;

/// What opening a lane found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    pub lane: LaneName,
    pub segment: u32,
    /// Lines in the newest segment, including any repair record written on open.
    pub lines: u64,
    pub created: bool,
    pub repaired: Option<TailRepair>,
    pub index: IndexStatus,
}

/// A torn last line that was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailRepair {
    pub offset: u64,
    pub truncated_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexStatus {
    /// The index covered every line.
    Current,
    /// The index lagged the log by this many lines, which were parsed and indexed.
    Extended { lines: u64 },
    /// The index was missing or did not match; the whole log was parsed.
    Rebuilt { reason: String },
}

/// Where an append landed and how durable it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The line's 0-based position in its segment.
    pub line: u64,
    pub durability: Commit,
}

/// A lane's state, cheap to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSnapshot {
    pub lane: LaneName,
    pub segment: u32,
    pub lines: u64,
    pub leaf: Option<EntryId>,
    pub open: Vec<OpenSummary>,
}

/// An operation that has not finished, and the results it declared and has not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSummary {
    pub op: OperationId,
    pub missing: Vec<EntryId>,
}
