//! Where a line of a lane's log is, as readers name it: the lane, the segment file's number and
//! the line's byte offset in that file. Segments are append-only and never renumbered, so a
//! position stays the same line across segment rolls and restarts.

use super::line::Line;
use crate::name::LaneName;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One line's identity in a lane's log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LinePosition {
    pub lane: LaneName,
    /// The segment file's number (`000003.jsonl` is 3).
    pub segment: u32,
    /// The line's first byte in that file.
    pub offset: u64,
}

impl fmt::Display for LinePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:06}.jsonl@{}", self.lane, self.segment, self.offset)
    }
}

/// A line as a reader found it: parsed, or damaged (torn, not JSON, not a line of this format),
/// named by its file and 1-based line number so a person can look at it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadLine {
    Line(Line),
    Damaged {
        file: String,
        line: u64,
        reason: String,
    },
}
