//! The ordered durable inbox: every inbound chat event is journaled (fsynced, with group commit)
//! before its platform is told it arrived; its disposition (an item for a lane, context, stale,
//! dropped, refused, an error) is journaled under the event's sequence number; an item stays
//! pending until the run that answers it is done. One writer thread owns the journal
//! ([`JournalWriter`]).
//!
//! Events are deduplicated by `(channel, platform_id)` over the deduplication window (a day),
//! and fully consumed segments are kept on disk for that window, so a platform that delivers an
//! event again after a crash or a reconnect gets no second answer. The writer holds the keys of
//! that one window only.

use crate::channel::InboundEvent;
use crate::host::clock::Clock;
use crate::log::{
    DedupKeys, Journal, JournalEntry, JournalItem, JournalWriter, Journaled, LogError,
};
use perch_core::chat::BotTurns;
pub use perch_core::journal::inbox::{Disposition, InboxRecord};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// How long consumed events are kept to recognise a duplicate.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

const MAX_SEGMENT_BYTES: u64 = 8 << 20;

/// Where an inbox starts: what the journal holds that still needs work, and the cursors the
/// connectors resume from.
#[derive(Debug, Clone, Default)]
pub struct Backlog {
    /// Events journaled without a disposition yet, in order: `(seq, channel, event)`.
    pub undecided: Vec<(u64, String, InboundEvent)>,
    /// Events a hook was deciding when perch stopped, in order, with the deciding mark's
    /// sequence number and the hook's file; they are not in `undecided`.
    pub interrupted: Vec<Interrupted>,
    /// Deciding marks whose event was decided or consumed since: only to be consumed.
    pub settled_marks: Vec<u64>,
    /// Items whose run has not been recorded as done, in order.
    pub pending: Vec<PendingItem>,
    /// The newest cursor journaled per channel.
    pub cursors: BTreeMap<String, String>,
    /// The newest `platform_id` journaled per channel and room, for back-fill.
    pub last_seen: BTreeMap<String, BTreeMap<String, String>>,
    /// Group messages kept as context (disposition `context`) since the last message answered in
    /// their room, oldest first: `(channel, event)`. The journal keeps consumed items for its
    /// retention window, so the context a restart would otherwise forget is rebuilt from it.
    pub context: Vec<(String, InboundEvent)>,
    /// The bot-loop guard's count per room, rebuilt from the dispositions still on disk, so a
    /// restart does not start a bot loop's count from zero.
    pub bot_turns: BotTurns,
}

/// An event whose hook never finished deciding it.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupted {
    pub event_seq: u64,
    pub mark_seq: u64,
    pub channel: String,
    pub event: InboundEvent,
    /// The file of the hook that was deciding it.
    pub hook: String,
}

/// An item waiting for its lane.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingItem {
    pub event_seq: u64,
    pub disposition_seq: u64,
    pub channel: String,
    pub event: InboundEvent,
    pub lane: String,
    pub text: String,
    /// The group context offered with it: lines said in its room before it that did not
    /// address the agent, as [`perch_core::origin::context_line`]s. Kept in memory only.
    pub earlier: Vec<String>,
    /// Set at restart for an item whose interrupted run is continued: how to resume it.
    pub resume: Option<perch_core::log::Resumption>,
}

impl PendingItem {
    /// The id a run's `operation_started` record names, so a restart knows it was taken.
    pub fn consumes_id(&self) -> String {
        consumes_id(self.event_seq)
    }
}

/// `inbox:<seq>`: how a lane's run names the inbox event it answers.
pub fn consumes_id(event_seq: u64) -> String {
    format!("inbox:{event_seq}")
}

/// Whether an event was new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    New {
        seq: u64,
    },
    /// Already journaled (the platform delivered it again); nothing was written.
    Duplicate,
}

/// A handle to the inbox's writer. Clones share it.
#[derive(Debug, Clone)]
pub struct Inbox {
    writer: JournalWriter,
}

impl Inbox {
    /// Opens the journal in `dir` (taking its lock) and starts its writer thread. Blocking.
    pub fn open(dir: &Path, clock: Clock) -> Result<(Inbox, Backlog), LogError> {
        let (journal, contents) =
            Journal::open_retaining(dir, MAX_SEGMENT_BYTES, DEDUP_WINDOW, clock.clone())?;
        let mut seen = DedupKeys::new(DEDUP_WINDOW, clock);
        let mut backlog = Backlog::default();
        let mut all: Vec<&JournalItem> =
            contents.consumed.iter().chain(&contents.pending).collect();
        all.sort_by_key(|item| item.seq);
        let mut journaled: BTreeMap<u64, (String, InboundEvent)> = BTreeMap::new();
        for item in &all {
            match InboxRecord::read(&item.body) {
                Ok(InboxRecord::Event { channel, event }) => {
                    note_event(&mut backlog, &channel, &event);
                    seen.note(dedup_key(&channel, &event), item.at);
                    journaled.insert(item.seq, (channel, *event));
                }
                Ok(InboxRecord::Disposition { event, disposition }) => {
                    if let Some((channel, event)) = journaled.get(&event) {
                        backlog.bot_turns.note(
                            channel,
                            &event.room,
                            event.sender.is_bot,
                            disposition.admitted(),
                        );
                        let same_room = |(kept_channel, kept): &(String, InboundEvent)| {
                            kept_channel == channel && kept.room == event.room
                        };
                        match disposition {
                            Disposition::Context => {
                                backlog.context.push((channel.clone(), event.clone()));
                            }
                            Disposition::Item { .. } => {
                                backlog.context.retain(|kept| !same_room(kept))
                            }
                            _ => {}
                        }
                    }
                }
                Ok(InboxRecord::Deciding { .. }) | Err(_) => {}
            }
        }
        let mut events: BTreeMap<u64, (String, InboundEvent)> = BTreeMap::new();
        let mut dispositions: Vec<(u64, u64, Disposition)> = Vec::new();
        let mut marks: Vec<(u64, u64, String)> = Vec::new();
        for item in &contents.pending {
            match InboxRecord::read(&item.body) {
                Ok(InboxRecord::Event { channel, event }) => {
                    events.insert(item.seq, (channel, *event));
                }
                Ok(InboxRecord::Disposition { event, disposition }) => {
                    dispositions.push((item.seq, event, disposition));
                }
                Ok(InboxRecord::Deciding { event, hook }) => marks.push((item.seq, event, hook)),
                Err(_) => {}
            }
        }
        let mut decided = HashSet::new();
        for (disposition_seq, event_seq, disposition) in dispositions {
            decided.insert(event_seq);
            if let (Disposition::Item { lane, text }, Some((channel, event))) =
                (disposition, events.get(&event_seq))
            {
                backlog.pending.push(PendingItem {
                    event_seq,
                    disposition_seq,
                    channel: channel.clone(),
                    event: event.clone(),
                    lane,
                    text,
                    earlier: Vec::new(),
                    resume: None,
                });
            }
        }
        for (mark_seq, event_seq, hook) in marks {
            match events.get(&event_seq) {
                Some((channel, event)) if !decided.contains(&event_seq) => {
                    backlog.interrupted.push(Interrupted {
                        event_seq,
                        mark_seq,
                        channel: channel.clone(),
                        event: event.clone(),
                        hook,
                    });
                }
                _ => backlog.settled_marks.push(mark_seq),
            }
        }
        let interrupted: HashSet<u64> = backlog
            .interrupted
            .iter()
            .map(|interrupted| interrupted.event_seq)
            .collect();
        backlog.undecided = events
            .into_iter()
            .filter(|(seq, _)| !decided.contains(seq) && !interrupted.contains(seq))
            .map(|(seq, (channel, event))| (seq, channel, event))
            .collect();
        let writer = JournalWriter::start_deduplicating(journal, seen, dir, "inbox")?;
        Ok((Inbox { writer }, backlog))
    }

    /// Journals `event` (fsynced before this returns) unless it is a duplicate.
    pub async fn record_event(
        &self,
        channel: &str,
        event: &InboundEvent,
    ) -> Result<Recorded, LogError> {
        let entry = JournalEntry {
            body: encode(&InboxRecord::Event {
                channel: channel.to_owned(),
                event: Box::new(event.clone()),
            }),
            key: Some(dedup_key(channel, event)),
        };
        let appended = self.writer.append(vec![entry]).await?;
        Ok(match appended.first() {
            Some(Journaled::New { seq }) => Recorded::New { seq: *seq },
            _ => Recorded::Duplicate,
        })
    }

    /// Journals the disposition of the event journaled as `event`; returns its sequence number.
    pub async fn record_disposition(
        &self,
        event: u64,
        disposition: Disposition,
    ) -> Result<u64, LogError> {
        self.writer
            .append_record(
                &InboxRecord::Disposition { event, disposition },
                "a disposition",
            )
            .await
    }

    /// Journals that `hook` (its file) starts deciding the event journaled as `event`;
    /// returns the mark's sequence number, to consume once the disposition is journaled.
    pub async fn record_deciding(&self, event: u64, hook: &str) -> Result<u64, LogError> {
        let mark = InboxRecord::Deciding {
            event,
            hook: hook.to_owned(),
        };
        self.writer.append_record(&mark, "a deciding mark").await
    }

    /// Marks items done.
    pub async fn consume(&self, seqs: Vec<u64>) -> Result<(), LogError> {
        self.writer.consume(seqs).await
    }

    /// Items journaled and not yet consumed.
    pub async fn depth(&self) -> usize {
        self.writer.depth().await
    }
}

fn dedup_key(channel: &str, event: &InboundEvent) -> String {
    format!("{channel}\u{0}{}", event.platform_id)
}

fn note_event(backlog: &mut Backlog, channel: &str, event: &InboundEvent) {
    if let Some(cursor) = &event.cursor {
        backlog.cursors.insert(channel.to_owned(), cursor.clone());
    }
    backlog
        .last_seen
        .entry(channel.to_owned())
        .or_default()
        .insert(event.room.clone(), event.platform_id.clone());
}

fn encode(record: &InboxRecord) -> serde_json::Value {
    serde_json::to_value(record).unwrap_or_else(
        |error| serde_json::json!({ "type": "unencodable", "reason": error.to_string() }),
    )
}

/// The refused messages among what the inbox keeps on disk (a peek of it, consumed and pending
/// items alike), oldest first, each record read by [`InboxRecord::read`]; a line that does not
/// read is skipped (`perch status` reports the inbox's unreadable lines).
pub fn refused(contents: &crate::log::JournalContents) -> Vec<perch_core::refusals::Refused> {
    let mut items: Vec<&JournalItem> = contents.consumed.iter().chain(&contents.pending).collect();
    items.sort_by_key(|item| item.seq);
    perch_core::refusals::refused_in(items.into_iter().filter_map(|item| {
        InboxRecord::read(&item.body)
            .ok()
            .map(|record| (item.seq, item.at, record))
    }))
}
