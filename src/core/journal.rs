//! Journal lines: an ordered, durable queue (the inbox, the outbox) split into segment files.
//!
//! Items are numbered in arrival order. Consuming an item writes a record naming it; a segment
//! whose items are all consumed is deleted once every older segment is gone, so the records that
//! prove consumption always outlive the items they speak for. An item's body is one record of
//! its journal: [`inbox::InboxRecord`] (with the [`event::InboundEvent`] it journals) or
//! [`outbox::OutboxRecord`].

pub mod event;
pub mod inbox;
pub mod outbox;

use crate::Timestamp;
use crate::log::Commit;
use serde::{Deserialize, Serialize};

/// The version written in every journal header.
pub const JOURNAL_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalLine {
    Header {
        version: u32,
        segment: u32,
        created: Timestamp,
    },
    Item {
        seq: u64,
        at: Timestamp,
        body: serde_json::Value,
    },
    Consumed {
        seqs: Vec<u64>,
        at: Timestamp,
    },
}

impl JournalLine {
    /// An item is fsynced before the source is acknowledged; losing a consumption record only
    /// means an item is offered again, which consumers deduplicate.
    pub fn commit(&self) -> Commit {
        match self {
            JournalLine::Header { .. } | JournalLine::Item { .. } => Commit::Sync,
            JournalLine::Consumed { .. } => Commit::Flush,
        }
    }
}
