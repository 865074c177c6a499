//! The slot ledger: a journal under `.perch/heartbeats/` of what each task's slots came to
//! (started, finished, skipped, stopped, resumed). Its records still in force are its
//! unconsumed items; a record a later one makes irrelevant is consumed.

use crate::agent::AgentDir;
use crate::host::clock::Clock;
use crate::log::{Journal, JournalWriter, LogError, peek_journal};
use perch_core::heartbeat::{LedgerRecord, LedgerState, reduce, superseded};
use perch_core::name::TaskName;
use std::time::Duration;

/// How long a consumed ledger record stays on disk.
const LEDGER_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

const LEDGER_SEGMENT_BYTES: u64 = 1 << 20;

/// The ledger's records still in force, oldest first, read without taking the ledger (for
/// `perch heartbeat list` and `perch status`).
pub fn peek_ledger(dir: &AgentDir) -> Result<LedgerState, String> {
    let contents = peek_journal(&dir.heartbeat_ledger_dir()).map_err(|error| error.to_string())?;
    Ok(reduce(contents.pending.iter().filter_map(|item| {
        serde_json::from_value(item.body.clone()).ok()
    })))
}

/// The slot ledger: a journal whose records still in force are its unconsumed items. Records a
/// later one makes irrelevant are consumed, so the ledger stays small however long the agent
/// runs.
#[derive(Debug, Clone)]
pub struct Ledger {
    writer: JournalWriter,
}

impl Ledger {
    /// Opens the ledger and returns its records in force with their sequence numbers. Blocking.
    pub fn open(
        dir: &AgentDir,
        clock: Clock,
    ) -> Result<(Ledger, Vec<(u64, LedgerRecord)>), LogError> {
        let path = dir.heartbeat_ledger_dir();
        let (journal, contents) =
            Journal::open_retaining(&path, LEDGER_SEGMENT_BYTES, LEDGER_RETAIN, clock)?;
        let records = contents
            .pending
            .iter()
            .filter_map(|item| {
                serde_json::from_value(item.body.clone())
                    .ok()
                    .map(|record| (item.seq, record))
            })
            .collect();
        let writer = JournalWriter::start(journal, &path, "heartbeats")?;
        Ok((Ledger { writer }, records))
    }

    async fn append(&self, record: &LedgerRecord) -> Result<u64, LogError> {
        self.writer.append_record(record, "a ledger record").await
    }

    /// Appends `record` to the ledger and to `records` (the records in force, in order), then
    /// consumes what it makes irrelevant, on disk and in `records`.
    pub(super) async fn record(
        &self,
        records: &mut Vec<(u64, LedgerRecord)>,
        record: LedgerRecord,
    ) -> Result<(), LogError> {
        let seq = self.append(&record).await?;
        records.push((seq, record));
        let superseded = superseded(records);
        if !superseded.is_empty() {
            self.writer.consume(superseded.clone()).await?;
            records.retain(|(seq, _)| !superseded.contains(seq));
        }
        Ok(())
    }
}

/// Resumes a stopped task without a running service; the caller holds the directory's lock.
pub async fn resume_here(dir: &AgentDir, task: &str) -> Result<(), String> {
    let name = TaskName::try_from(task).map_err(|error| format!("{task}: {error}"))?;
    let clock = crate::host::clock::system_clock();
    let (ledger, records) = Ledger::open(dir, clock.clone()).map_err(|error| error.to_string())?;
    let state = reduce(records.into_iter().map(|(_, record)| record));
    if state
        .task(&name)
        .is_none_or(|state| state.stopped.is_none())
    {
        return Err(format!("{task} is not stopped"));
    }
    ledger
        .append(&LedgerRecord::TaskResumed {
            task: name,
            at: clock.now(),
        })
        .await
        .map(drop)
        .map_err(|error| error.to_string())
}
