//! The slot ledger: a journal under `.perch/heartbeats/` of what each task's slots came to
//! (started, finished, skipped, stopped, resumed). Its records still in force are its
//! unconsumed items; a record a later one makes irrelevant is consumed.

use crate::agent::AgentDir;
use crate::log::{Clock, Journal, JournalEntry, JournalWriter, Journaled, LogError, peek_journal};
use perch_core::heartbeat::{LedgerRecord, LedgerState, SlotOutcome, reduce};
use perch_core::name::TaskName;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// How long a consumed ledger record stays on disk.
const LEDGER_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

const LEDGER_SEGMENT_BYTES: u64 = 1 << 20;

/// The ledger's directory under `.perch/`.
pub fn ledger_dir(dir: &AgentDir) -> PathBuf {
    dir.state_dir().join("heartbeats")
}

/// The ledger's records still in force, oldest first, read without taking the ledger (for
/// `perch heartbeat list` and `perch status`).
pub fn peek_ledger(dir: &AgentDir) -> Result<LedgerState, String> {
    let contents = peek_journal(&ledger_dir(dir)).map_err(|error| error.to_string())?;
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
        let path = ledger_dir(dir);
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
        let writer = JournalWriter::start(journal, HashSet::new(), &path, "heartbeats")?;
        Ok((Ledger { writer }, records))
    }

    async fn append(&self, record: &LedgerRecord) -> Result<u64, LogError> {
        let body = serde_json::to_value(record).map_err(|error| LogError::WriterStopped {
            reason: format!("a ledger record did not encode: {error}"),
        })?;
        match self
            .writer
            .append(vec![JournalEntry { body, key: None }])
            .await?
            .first()
        {
            Some(Journaled::New { seq }) => Ok(*seq),
            _ => Err(LogError::WriterStopped {
                reason: "a ledger record was not written".into(),
            }),
        }
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
    let clock = crate::log::system_clock();
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

/// The records the last one makes irrelevant, so the ledger stays small however long the agent
/// runs: after a scheduled run that ended well, or skipped slots, the task's earlier slot records
/// (its failures in a row no longer count; its latest finished run stays, for its outcome);
/// after a resume, the stop and the resume; after a stop, an earlier stop. A run's start is
/// consumed only with its end, so an open run and a manual run are never mistaken.
fn superseded(records: &[(u64, LedgerRecord)]) -> Vec<u64> {
    let Some(((last_seq, last), earlier)) = records.split_last() else {
        return Vec::new();
    };
    let task = last.task();
    let earlier: Vec<&(u64, LedgerRecord)> = earlier
        .iter()
        .filter(|(_, record)| record.task() == task)
        .collect();
    let is_slot = |record: &LedgerRecord| {
        matches!(
            record,
            LedgerRecord::SlotStarted { .. }
                | LedgerRecord::SlotFinished { .. }
                | LedgerRecord::SlotsSkipped { .. }
        )
    };
    let candidates: Vec<u64> = match last {
        LedgerRecord::SlotFinished { run, outcome, .. } => {
            let scheduled_start = earlier.iter().find_map(|(seq, record)| match record {
                LedgerRecord::SlotStarted {
                    run: started,
                    manual: false,
                    ..
                } if started == run => Some(*seq),
                _ => None,
            });
            let ended_well = !matches!(
                outcome,
                SlotOutcome::Failed { .. } | SlotOutcome::Invalid { .. }
            );
            match scheduled_start {
                Some(start) if ended_well => earlier
                    .iter()
                    .filter(|(seq, record)| *seq < start && is_slot(record))
                    .map(|(seq, _)| *seq)
                    .collect(),
                _ => Vec::new(),
            }
        }
        LedgerRecord::SlotsSkipped { .. } => {
            let latest_finished = earlier
                .iter()
                .rev()
                .find(|(_, record)| matches!(record, LedgerRecord::SlotFinished { .. }))
                .map(|(seq, _)| *seq);
            earlier
                .iter()
                .filter(|(seq, record)| is_slot(record) && Some(*seq) != latest_finished)
                .map(|(seq, _)| *seq)
                .collect()
        }
        LedgerRecord::TaskResumed { .. } => earlier
            .iter()
            .filter(|(_, record)| matches!(record, LedgerRecord::TaskStopped { .. }))
            .map(|(seq, _)| *seq)
            .chain([*last_seq])
            .collect(),
        LedgerRecord::TaskStopped { .. } => earlier
            .iter()
            .filter(|(_, record)| matches!(record, LedgerRecord::TaskStopped { .. }))
            .map(|(seq, _)| *seq)
            .collect(),
        LedgerRecord::SlotStarted { .. } => Vec::new(),
    };
    let finish_of = |run: &str| {
        records.iter().find_map(|(seq, record)| match record {
            LedgerRecord::SlotFinished { run: finished, .. } if finished == run => Some(*seq),
            _ => None,
        })
    };
    candidates
        .iter()
        .copied()
        .filter(|seq| {
            records.iter().all(|(at, record)| match record {
                LedgerRecord::SlotStarted { run, .. } if at == seq => {
                    finish_of(run).is_some_and(|finish| candidates.contains(&finish))
                }
                _ => true,
            })
        })
        .collect()
}
