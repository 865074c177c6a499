//! The index: one fixed-size row per log line, so a lane can be reopened without parsing it.
//!
//! A row holds where its line is, a checksum of its bytes, and the few facts the fold needs
//! (ids, parent, replay). The index is derived data: the log is the truth, and an index that
//! disagrees with its log is rebuilt from it.

use super::line::{Line, Record};
use crate::config::Replay;
use crate::id::{EntryId, OperationId, SessionId};
use std::fmt;

/// What the fold needs to know about one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    Header {
        previous_leaf: Option<EntryId>,
    },
    Entry {
        id: EntryId,
        parent: Option<EntryId>,
    },
    OperationStarted {
        op: OperationId,
    },
    AttemptStarted {
        op: OperationId,
    },
    ToolStarted {
        op: OperationId,
        result: EntryId,
        replay: Replay,
    },
    OperationFinished {
        op: OperationId,
    },
    LeafSet {
        leaf: EntryId,
    },
    TailRepaired,
    /// A record of what an operation did (a model reply's usage, a tool's end, a delivery's
    /// fate): for the reader, not the fold. `op` is the operation, when the record names one.
    Observed {
        op: Option<OperationId>,
    },
}

impl Summary {
    pub fn of(line: &Line) -> Summary {
        match line {
            Line::Header(header) => Summary::Header {
                previous_leaf: header.previous.as_ref().and_then(|previous| previous.leaf),
            },
            Line::Entry(entry) => Summary::Entry {
                id: entry.id,
                parent: entry.parent,
            },
            Line::Record(record) => match record {
                Record::OperationStarted { op, .. } => Summary::OperationStarted { op: *op },
                Record::AttemptStarted { op, .. } => Summary::AttemptStarted { op: *op },
                Record::ToolStarted {
                    op, result, replay, ..
                } => Summary::ToolStarted {
                    op: *op,
                    result: *result,
                    replay: *replay,
                },
                Record::OperationFinished { op, .. } => Summary::OperationFinished { op: *op },
                Record::LeafSet { leaf, .. } => Summary::LeafSet { leaf: *leaf },
                Record::TailRepaired { .. } => Summary::TailRepaired,
                Record::ModelReplied { op, .. } | Record::ToolFinished { op, .. } => {
                    Summary::Observed { op: Some(*op) }
                }
                Record::DeliverySettled { op, .. } => Summary::Observed { op: *op },
            },
        }
    }
}

/// One line's row in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Byte offset of the line in its file.
    pub offset: u64,
    /// Length of the line including its newline.
    pub len: u32,
    /// CRC-32 of the line's bytes including the newline.
    pub crc: u32,
    pub summary: Summary,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError(pub String);

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Row {
    pub const SIZE: usize = 50;

    pub fn new(offset: u64, bytes: &[u8], summary: Summary) -> Row {
        Row {
            offset,
            len: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            crc: crc32fast::hash(bytes),
            summary,
        }
    }

    /// The offset just past this row's line.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }

    pub fn encode(&self) -> [u8; Row::SIZE] {
        let (tag, flag, a, b) = match self.summary {
            Summary::Header { previous_leaf } => (
                1,
                u8::from(previous_leaf.is_some()),
                previous_leaf.map(|id| id.as_bytes()),
                None,
            ),
            Summary::Entry { id, parent } => (
                2,
                u8::from(parent.is_some()),
                Some(id.as_bytes()),
                parent.map(|id| id.as_bytes()),
            ),
            Summary::OperationStarted { op } => (3, 0, Some(op.as_bytes()), None),
            Summary::AttemptStarted { op } => (4, 0, Some(op.as_bytes()), None),
            Summary::ToolStarted { op, result, replay } => (
                5,
                u8::from(replay == Replay::Safe),
                Some(op.as_bytes()),
                Some(result.as_bytes()),
            ),
            Summary::OperationFinished { op } => (6, 0, Some(op.as_bytes()), None),
            Summary::LeafSet { leaf } => (7, 0, Some(leaf.as_bytes()), None),
            Summary::TailRepaired => (8, 0, None, None),
            Summary::Observed { op } => {
                (9, u8::from(op.is_some()), op.map(|op| op.as_bytes()), None)
            }
        };
        let mut out = [0u8; Row::SIZE];
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.crc.to_le_bytes());
        out[16] = tag;
        out[17] = flag;
        out[18..34].copy_from_slice(&a.unwrap_or_default());
        out[34..50].copy_from_slice(&b.unwrap_or_default());
        out
    }

    pub fn decode(bytes: &[u8; Row::SIZE]) -> Result<Row, RowError> {
        let word = |range: std::ops::Range<usize>| -> [u8; 16] {
            let mut out = [0u8; 16];
            out.copy_from_slice(&bytes[range]);
            out
        };
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&bytes[0..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[8..12]);
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[12..16]);
        let flag = bytes[17];
        let a = word(18..34);
        let b = word(34..50);
        let summary = match bytes[16] {
            1 => Summary::Header {
                previous_leaf: (flag == 1).then(|| EntryId::from_bytes(a)),
            },
            2 => Summary::Entry {
                id: EntryId::from_bytes(a),
                parent: (flag == 1).then(|| EntryId::from_bytes(b)),
            },
            3 => Summary::OperationStarted {
                op: OperationId::from_bytes(a),
            },
            4 => Summary::AttemptStarted {
                op: OperationId::from_bytes(a),
            },
            5 => Summary::ToolStarted {
                op: OperationId::from_bytes(a),
                result: EntryId::from_bytes(b),
                replay: if flag == 1 {
                    Replay::Safe
                } else {
                    Replay::Never
                },
            },
            6 => Summary::OperationFinished {
                op: OperationId::from_bytes(a),
            },
            7 => Summary::LeafSet {
                leaf: EntryId::from_bytes(a),
            },
            8 => Summary::TailRepaired,
            9 => Summary::Observed {
                op: (flag == 1).then(|| OperationId::from_bytes(a)),
            },
            tag => return Err(RowError(format!("unknown row tag {tag}"))),
        };
        Ok(Row {
            offset: u64::from_le_bytes(offset),
            len: u32::from_le_bytes(len),
            crc: u32::from_le_bytes(crc),
            summary,
        })
    }
}

/// Length of the index file's header.
pub const INDEX_HEADER_LEN: usize = 32;

/// The index file's header ties it to one segment of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexHeader {
    pub session: SessionId,
    pub segment: u32,
}

const MAGIC: &[u8; 8] = b"PERCHIX1";

impl IndexHeader {
    pub fn encode(&self) -> [u8; INDEX_HEADER_LEN] {
        let mut out = [0u8; INDEX_HEADER_LEN];
        out[0..8].copy_from_slice(MAGIC);
        out[8..24].copy_from_slice(&self.session.as_bytes());
        out[24..28].copy_from_slice(&self.segment.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<IndexHeader> {
        if bytes.len() < INDEX_HEADER_LEN || &bytes[0..8] != MAGIC {
            return None;
        }
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[8..24]);
        let mut segment = [0u8; 4];
        segment.copy_from_slice(&bytes[24..28]);
        Some(IndexHeader {
            session: SessionId::from_bytes(session),
            segment: u32::from_le_bytes(segment),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let summaries = [
            Summary::Header {
                previous_leaf: None,
            },
            Summary::Header {
                previous_leaf: Some(EntryId::from_bytes([9; 16])),
            },
            Summary::Entry {
                id: EntryId::from_bytes([1; 16]),
                parent: None,
            },
            Summary::Entry {
                id: EntryId::from_bytes([1; 16]),
                parent: Some(EntryId::from_bytes([2; 16])),
            },
            Summary::OperationStarted {
                op: OperationId::from_bytes([3; 16]),
            },
            Summary::AttemptStarted {
                op: OperationId::from_bytes([3; 16]),
            },
            Summary::ToolStarted {
                op: OperationId::from_bytes([3; 16]),
                result: EntryId::from_bytes([4; 16]),
                replay: Replay::Safe,
            },
            Summary::ToolStarted {
                op: OperationId::from_bytes([3; 16]),
                result: EntryId::from_bytes([4; 16]),
                replay: Replay::Never,
            },
            Summary::OperationFinished {
                op: OperationId::from_bytes([3; 16]),
            },
            Summary::LeafSet {
                leaf: EntryId::from_bytes([5; 16]),
            },
            Summary::TailRepaired,
            Summary::Observed { op: None },
            Summary::Observed {
                op: Some(OperationId::from_bytes([6; 16])),
            },
        ];
        for (index, summary) in summaries.into_iter().enumerate() {
            let row = Row::new(index as u64 * 100, b"{}\n", summary);
            assert_eq!(Row::decode(&row.encode()).unwrap(), row);
        }
        let mut bad = Row::new(0, b"{}\n", Summary::TailRepaired).encode();
        bad[16] = 99;
        assert!(Row::decode(&bad).is_err());
    }
}
