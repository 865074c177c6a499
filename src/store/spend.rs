//! The daily spend guard in the shell: the usage journal in `.perch/spend/` (one writer thread),
//! the day's totals in memory, the check every lane makes before a model request and the record
//! it makes of each reply. The rules (caps, prices, the day, the verdict) are the core's
//! ([`perch_core::spend`]).

use crate::agent::AgentDir;
use crate::host::alert::Alerts;
use crate::host::clock::Clock;
use crate::log::{Journal, JournalEntry, JournalWriter, Journaled, LogError};
use perch_core::alert::AlertKind;
use perch_core::spend::{
    Level, Money, Price, RunKind, SpendDay, SpendPolicy, SpendRecord, SpendToday, TokenUsage,
};
use std::sync::{Arc, Mutex, PoisonError};

const SEGMENT_BYTES: u64 = 1 << 20;

/// The day's spend as `perch status` shows it, read without taking the journal.
pub fn peek_today(dir: &AgentDir, now: perch_core::Timestamp) -> Result<SpendToday, String> {
    let contents = crate::log::peek_journal(&dir.spend_dir()).map_err(|error| error.to_string())?;
    let records = contents.pending.into_iter().filter_map(|item| {
        serde_json::from_value::<SpendRecord>(item.body)
            .ok()
            .map(|record| (item.seq, record))
    });
    let (today, _) = SpendDay::fold(records, now);
    Ok(SpendToday::from(&today))
}

/// The guard of one agent directory. Clones share it; its owner holds the directory's lock, so
/// the journal has one writer.
#[derive(Debug, Clone)]
pub struct SpendGuard {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    policy: SpendPolicy,
    writer: JournalWriter,
    today: Mutex<SpendDay>,
    clock: Clock,
    alerts: Mutex<Alerts>,
}

impl SpendGuard {
    /// Opens the usage journal and folds the day's totals; records of earlier days no longer
    /// count and are consumed. Blocking.
    pub fn open(dir: &AgentDir, policy: SpendPolicy, clock: Clock) -> Result<SpendGuard, LogError> {
        let path = dir.spend_dir();
        let (mut journal, items) = Journal::open(&path, SEGMENT_BYTES, clock.clone())?;
        let mut unreadable = Vec::new();
        let records: Vec<(u64, SpendRecord)> = items
            .into_iter()
            .filter_map(|item| match serde_json::from_value(item.body) {
                Ok(record) => Some((item.seq, record)),
                Err(_) => {
                    unreadable.push(item.seq);
                    None
                }
            })
            .collect();
        let (today, mut stale) = SpendDay::fold(records, clock.now());
        stale.extend(unreadable);
        if !stale.is_empty() {
            journal.consume(&stale)?;
        }
        let writer = JournalWriter::start(journal, &path, "spend")?;
        Ok(SpendGuard {
            inner: Arc::new(Inner {
                policy,
                writer,
                today: Mutex::new(today),
                clock,
                alerts: Mutex::new(Alerts::log_only()),
            }),
        })
    }

    /// Sends the guard's alerts to `alerts` (the service's owner alerts) instead of the log only.
    pub fn set_alerts(&self, alerts: Alerts) {
        *self
            .inner
            .alerts
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = alerts;
    }

    /// Before a model request of a `kind` run: `Err` is why it may not be made.
    pub async fn check(&self, kind: RunKind) -> Result<(), String> {
        let now = self.inner.clock.now();
        let caps = self.inner.policy.caps();
        let (verdict, stale, tell) = {
            let mut today = self.lock();
            let stale = today.roll(now);
            let tell = today.to_tell(caps, now);
            (today.verdict(caps, kind, now), stale, tell)
        };
        self.settle(stale, tell).await;
        verdict
    }

    /// After a reply: counts its usage (its cost at `price`) in the journal and the day's totals,
    /// and tells the owner when the day's spend crossed a level. A record that cannot be written
    /// is still counted for as long as this process runs, and the failure is logged.
    pub async fn record(&self, lane: &str, model: &str, price: Option<Price>, usage: TokenUsage) {
        let now = self.inner.clock.now();
        let record = SpendRecord::Usage {
            at: now,
            lane: lane.to_owned(),
            model: model.to_owned(),
            input: usage.input,
            output: usage.output,
            cached: usage.cached,
            cost: price.map_or(Money::ZERO, |price| price.cost(usage)),
        };
        let (stale, tell) = {
            let mut today = self.lock();
            let stale = today.roll(now);
            today.add(&record);
            (stale, today.to_tell(self.inner.policy.caps(), now))
        };
        self.append(&record).await;
        self.settle(stale, tell).await;
    }

    /// Consumes the records of a day that ended, and tells the owner about a level reached.
    async fn settle(&self, stale: Vec<u64>, tell: Option<(Level, String)>) {
        if !stale.is_empty()
            && let Err(error) = self.inner.writer.consume(stale).await
        {
            tracing::warn!("spend: the records of an earlier day were not consumed: {error}");
        }
        if let Some((level, message)) = tell {
            self.append(&SpendRecord::Told {
                at: self.inner.clock.now(),
                level,
            })
            .await;
            let alerts = self
                .inner
                .alerts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            alerts.alert(AlertKind::Spend, message);
        }
    }

    async fn append(&self, record: &SpendRecord) {
        let written = match serde_json::to_value(record) {
            Ok(body) => self
                .inner
                .writer
                .append(vec![JournalEntry { body, key: None }])
                .await
                .map_err(|error| error.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match written.as_deref().map(<[Journaled]>::first) {
            Ok(Some(Journaled::New { seq })) => self.lock().seqs.push(*seq),
            Ok(_) => tracing::warn!("spend: a usage record was not written"),
            Err(error) => tracing::warn!("spend: a usage record was not written: {error}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpendDay> {
        self.inner
            .today
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
