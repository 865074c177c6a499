//! Which ledger records a new one makes irrelevant, so the slot ledger stays small however long
//! the agent runs. What the plan reads from the records in force stays the same with or without
//! them.

use super::ledger::{LedgerRecord, SlotOutcome};

/// The records the last one makes irrelevant, so the ledger stays small however long the agent
/// runs: after a scheduled run that ended well, or skipped slots, the task's earlier slot records
/// (its failures in a row no longer count; its latest finished run stays, for its outcome);
/// after a resume, the stop and the resume; after a stop, an earlier stop. A run's start is
/// consumed only with its end, so an open run and a manual run are never mistaken.
pub fn superseded(records: &[(u64, LedgerRecord)]) -> Vec<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;
    use crate::heartbeat::ledger::{LedgerState, TaskState, reduce};
    use crate::name::TaskName;
    use chrono::{DateTime, TimeDelta};

    fn minute(n: i64) -> Timestamp {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap() + TimeDelta::minutes(n)
    }

    fn name(task: &str) -> TaskName {
        TaskName::try_from(task).unwrap()
    }

    fn started(task: &str, run: &str, slot: i64, manual: bool) -> LedgerRecord {
        LedgerRecord::SlotStarted {
            task: name(task),
            slot: minute(slot),
            run: run.into(),
            manual,
            coalesced: 0,
            at: minute(slot),
        }
    }

    fn finished(task: &str, run: &str, slot: i64, outcome: SlotOutcome) -> LedgerRecord {
        LedgerRecord::SlotFinished {
            task: name(task),
            slot: minute(slot),
            run: run.into(),
            outcome,
            at: minute(slot),
        }
    }

    fn skipped(task: &str, from: i64, to: i64) -> LedgerRecord {
        LedgerRecord::SlotsSkipped {
            task: name(task),
            from: minute(from),
            to: minute(to),
            count: 1,
            reason: "outside active hours".into(),
            at: minute(to),
        }
    }

    fn stopped(task: &str, at: i64) -> LedgerRecord {
        LedgerRecord::TaskStopped {
            task: name(task),
            reason: "the key was refused".into(),
            fingerprint: "f".into(),
            at: minute(at),
        }
    }

    fn resumed(task: &str, at: i64) -> LedgerRecord {
        LedgerRecord::TaskResumed {
            task: name(task),
            at: minute(at),
        }
    }

    fn failed() -> SlotOutcome {
        SlotOutcome::Failed {
            reason: "the model timed out".into(),
        }
    }

    fn invalid() -> SlotOutcome {
        SlotOutcome::Invalid {
            reason: "no verdict".into(),
        }
    }

    #[test]
    fn what_the_last_record_supersedes() {
        use SlotOutcome::Silent;
        let table: Vec<(&str, Vec<LedgerRecord>, Vec<u64>)> = vec![
            (
                "a scheduled run that ended well consumes the task's earlier slot records",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, failed()),
                    started("a", "r2", 60, false),
                    finished("a", "r2", 60, Silent),
                ],
                vec![1, 2],
            ),
            (
                "another task's records are never consumed",
                vec![
                    started("b", "x1", 0, false),
                    finished("b", "x1", 0, Silent),
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                ],
                vec![],
            ),
            (
                "a failed run consumes nothing: its failures in a row still count",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                    started("a", "r2", 60, false),
                    finished("a", "r2", 60, failed()),
                ],
                vec![],
            ),
            (
                "an invalid run consumes nothing",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                    started("a", "r2", 60, false),
                    finished("a", "r2", 60, invalid()),
                ],
                vec![],
            ),
            (
                "a manual run that ended well consumes nothing",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                    started("a", "m1", 30, true),
                    finished("a", "m1", 30, Silent),
                ],
                vec![],
            ),
            (
                "a run still open keeps its start",
                vec![
                    started("a", "r0", 0, false),
                    finished("a", "r0", 0, failed()),
                    started("a", "m1", 30, true),
                    started("a", "r1", 60, false),
                    finished("a", "r1", 60, Silent),
                ],
                vec![1, 2],
            ),
            (
                "skipped slots consume the earlier slot records but the latest finished run",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                    started("a", "r2", 60, false),
                    finished("a", "r2", 60, failed()),
                    skipped("a", 120, 180),
                ],
                vec![1, 2],
            ),
            (
                "a resume consumes the stop and itself",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, failed()),
                    stopped("a", 1),
                    resumed("a", 2),
                ],
                vec![3, 4],
            ),
            (
                "a stop consumes an earlier stop",
                vec![stopped("a", 1), stopped("a", 2)],
                vec![1],
            ),
            (
                "a start consumes nothing",
                vec![
                    started("a", "r1", 0, false),
                    finished("a", "r1", 0, Silent),
                    started("a", "r2", 60, false),
                ],
                vec![],
            ),
        ];
        for (case, records, consumed) in table {
            let numbered: Vec<(u64, LedgerRecord)> = (1..).zip(records).collect();
            assert_eq!(superseded(&numbered), consumed, "{case}");
        }
        assert_eq!(superseded(&[]), Vec::<u64>::new());
    }

    /// What the plan, the listing and a run's prompt read from a task's state.
    fn planned(state: &LedgerState, task: &str) -> Option<TaskState> {
        state.task(&name(task)).cloned()
    }

    /// A long mixed history of two tasks, kept both whole and compacted the way the ledger is
    /// (each record appended, then what it supersedes consumed): after every record the plan
    /// reads the same state from both.
    #[test]
    fn compaction_never_changes_what_the_plan_reads() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let outcomes = [
            SlotOutcome::Silent,
            failed(),
            invalid(),
            SlotOutcome::Skipped {
                reason: "the check exited 1".into(),
            },
            SlotOutcome::Interrupted {
                reason: "perch stopped".into(),
            },
            SlotOutcome::Message {
                text: "hi".into(),
                target: "ops:standup".into(),
                delivery: "d".into(),
            },
        ];
        let mut whole: Vec<(u64, LedgerRecord)> = Vec::new();
        let mut kept: Vec<(u64, LedgerRecord)> = Vec::new();
        let mut open_manual: Vec<(String, String, i64)> = Vec::new();
        let mut slot = 0;
        let mut seq = 0;
        for step in 0..1_000 {
            let task = ["a", "b"][usize::try_from(next(2)).unwrap()];
            slot += i64::try_from(next(3)).unwrap() * 30;
            let outcome = outcomes[usize::try_from(next(6)).unwrap()].clone();
            let records = match next(7) {
                0..=2 => {
                    let run = format!("r{step}");
                    vec![
                        started(task, &run, slot, false),
                        finished(task, &run, slot, outcome),
                    ]
                }
                3 => {
                    let run = format!("m{step}");
                    open_manual.push((task.to_owned(), run.clone(), slot));
                    vec![started(task, &run, slot, true)]
                }
                4 if !open_manual.is_empty() => {
                    let (task, run, at) = open_manual.remove(0);
                    vec![finished(&task, &run, at, outcome)]
                }
                4 => vec![skipped(task, slot, slot + 30)],
                5 => vec![stopped(task, slot)],
                _ => vec![resumed(task, slot)],
            };
            for record in records {
                seq += 1;
                whole.push((seq, record.clone()));
                kept.push((seq, record));
                let consumed = superseded(&kept);
                kept.retain(|(seq, _)| !consumed.contains(seq));
                let full = reduce(whole.iter().map(|(_, record)| record.clone()));
                let compacted = reduce(kept.iter().map(|(_, record)| record.clone()));
                for task in ["a", "b"] {
                    assert_eq!(
                        planned(&compacted, task),
                        planned(&full, task),
                        "task {task} after record {seq}"
                    );
                }
            }
        }
        assert!(
            kept.len() < whole.len() / 4,
            "the ledger stays small: {} of {} records kept",
            kept.len(),
            whole.len()
        );
    }
}
