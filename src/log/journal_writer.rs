//! The one writer of a journal: a thread that owns it and takes requests, gathering every
//! append waiting at the moment into one write and one fsync (group commit). An append may
//! carry a deduplication key; an item whose key was appended within the deduplication window is
//! not written again. Keys older than the window are forgotten, so the writer holds the keys of
//! one window's traffic, never of everything the journal has seen.

use super::error::LogError;
use super::journal::Journal;
use crate::host::clock::Clock;
use perch_core::Timestamp;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

const MAX_BATCH: usize = 1024;

/// What became of one item given to [`JournalWriter::append`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journaled {
    New {
        seq: u64,
    },
    /// Its key was appended before; nothing was written.
    Duplicate,
}

/// One item to append, with its deduplication key if it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    pub body: serde_json::Value,
    pub key: Option<String>,
}

enum Request {
    Append {
        entries: Vec<JournalEntry>,
        reply: oneshot::Sender<Result<Vec<Journaled>, LogError>>,
    },
    Consume {
        seqs: Vec<u64>,
        reply: oneshot::Sender<Result<(), LogError>>,
    },
    Depth {
        reply: oneshot::Sender<usize>,
    },
}

/// A handle to a journal's writer thread. Clones share it; the thread ends with the last one.
#[derive(Debug, Clone)]
pub struct JournalWriter {
    requests: std_mpsc::Sender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("journal request")
    }
}

/// The deduplication keys appended within the window, oldest first, each with when it was
/// appended.
#[derive(Debug)]
pub struct DedupKeys {
    window: Duration,
    clock: Clock,
    appended: HashMap<String, Timestamp>,
    /// Every key of `appended` in the order it was appended (a key appended again after it
    /// expired appears twice; the older entry is skipped when it comes up for expiry).
    order: VecDeque<(Timestamp, String)>,
}

impl DedupKeys {
    /// No keys yet: an item is a duplicate of one appended less than `window` before it, as
    /// `clock` tells the time.
    pub fn new(window: Duration, clock: Clock) -> DedupKeys {
        DedupKeys {
            window,
            clock,
            appended: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Notes `key` as appended `at` (a key already in the journal when it is opened). Call in
    /// the order the keys were appended.
    pub fn note(&mut self, key: String, at: Timestamp) {
        if self.fresh(at, self.clock.now()) {
            self.order.push_back((at, key.clone()));
            self.appended.insert(key, at);
        }
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.appended.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.appended.is_empty()
    }

    /// Takes `key` as appended now, unless it was appended within the window: false then.
    fn insert(&mut self, key: &str) -> bool {
        let now = self.clock.now();
        self.expire(now);
        if self.appended.contains_key(key) {
            return false;
        }
        self.order.push_back((now, key.to_owned()));
        self.appended.insert(key.to_owned(), now);
        true
    }

    /// Forgets `key` (its append failed).
    fn forget(&mut self, key: &str) {
        self.appended.remove(key);
    }

    fn fresh(&self, at: Timestamp, now: Timestamp) -> bool {
        chrono::Duration::from_std(self.window).is_ok_and(|window| at + window > now)
    }

    fn expire(&mut self, now: Timestamp) {
        while let Some((at, _)) = self.order.front() {
            if self.fresh(*at, now) {
                break;
            }
            if let Some((at, key)) = self.order.pop_front()
                && self.appended.get(&key) == Some(&at)
            {
                self.appended.remove(&key);
            }
        }
    }
}

impl JournalWriter {
    /// Starts the writer thread for `journal`, whose items carry no deduplication key.
    pub fn start(journal: Journal, dir: &Path, name: &str) -> Result<JournalWriter, LogError> {
        JournalWriter::spawn(
            Writer {
                journal,
                seen: None,
            },
            dir,
            name,
        )
    }

    /// Starts the writer thread for `journal`, deduplicating by key; `seen` holds the keys
    /// already in it.
    pub fn start_deduplicating(
        journal: Journal,
        seen: DedupKeys,
        dir: &Path,
        name: &str,
    ) -> Result<JournalWriter, LogError> {
        JournalWriter::spawn(
            Writer {
                journal,
                seen: Some(seen),
            },
            dir,
            name,
        )
    }

    fn spawn(writer: Writer, dir: &Path, name: &str) -> Result<JournalWriter, LogError> {
        let (requests, receiver) = std_mpsc::channel();
        std::thread::Builder::new()
            .name(format!("perch-{name}"))
            .spawn(move || writer.run(&receiver))
            .map_err(LogError::io(dir, "start the writer thread for"))?;
        Ok(JournalWriter { requests })
    }

    /// Appends `entries` in order; when this returns `Ok`, the new ones are fsynced.
    pub async fn append(&self, entries: Vec<JournalEntry>) -> Result<Vec<Journaled>, LogError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Append { entries, reply })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Appends one `record` (a `what`, for the error) without a deduplication key; returns its
    /// sequence number once it is fsynced.
    pub async fn append_record(
        &self,
        record: &impl serde::Serialize,
        what: &str,
    ) -> Result<u64, LogError> {
        let body = serde_json::to_value(record).map_err(|error| LogError::WriterStopped {
            reason: format!("{what} did not encode: {error}"),
        })?;
        match self
            .append(vec![JournalEntry { body, key: None }])
            .await?
            .first()
        {
            Some(Journaled::New { seq }) => Ok(*seq),
            _ => Err(LogError::WriterStopped {
                reason: format!("{what} was not written"),
            }),
        }
    }

    pub async fn consume(&self, seqs: Vec<u64>) -> Result<(), LogError> {
        let (reply, answer) = oneshot::channel();
        self.send(Request::Consume { seqs, reply })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Items appended and not yet consumed.
    pub async fn depth(&self) -> usize {
        let (reply, answer) = oneshot::channel();
        if self.send(Request::Depth { reply }).is_err() {
            return 0;
        }
        answer.await.unwrap_or(0)
    }

    fn send(&self, request: Request) -> Result<(), LogError> {
        self.requests.send(request).map_err(|_| stopped())
    }
}

fn stopped() -> LogError {
    LogError::WriterStopped {
        reason: "the journal's writer has stopped".into(),
    }
}

struct Writer {
    journal: Journal,
    /// None for a journal without deduplication keys.
    seen: Option<DedupKeys>,
}

/// Where each requested item went in the batch: written at an index of the batch, or a
/// duplicate.
enum Slot {
    Written(usize),
    Duplicate,
}

impl Writer {
    fn run(mut self, requests: &std_mpsc::Receiver<Request>) {
        while let Ok(first) = requests.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.handle(batch);
        }
    }

    fn handle(&mut self, batch: Vec<Request>) {
        let mut bodies = Vec::new();
        let mut keys = Vec::new();
        let mut appends = Vec::new();
        for request in batch {
            match request {
                Request::Append { entries, reply } => {
                    let mut slots = Vec::with_capacity(entries.len());
                    for entry in entries {
                        if let (Some(key), Some(seen)) = (&entry.key, &mut self.seen) {
                            if !seen.insert(key) {
                                slots.push(Slot::Duplicate);
                                continue;
                            }
                            keys.push(key.clone());
                        }
                        slots.push(Slot::Written(bodies.len()));
                        bodies.push(entry.body);
                    }
                    appends.push((slots, reply));
                }
                Request::Consume { seqs, reply } => {
                    let _ = reply.send(self.journal.consume(&seqs));
                }
                Request::Depth { reply } => {
                    let _ = reply.send(self.journal.depth());
                }
            }
        }
        let written = if bodies.is_empty() {
            Ok(Vec::new())
        } else {
            self.journal.append(&bodies)
        };
        match written {
            Ok(seqs) => {
                for (slots, reply) in appends {
                    let appended = slots
                        .iter()
                        .map(|slot| match slot {
                            Slot::Written(index) => seqs
                                .get(*index)
                                .map_or(Journaled::Duplicate, |&seq| Journaled::New { seq }),
                            Slot::Duplicate => Journaled::Duplicate,
                        })
                        .collect();
                    let _ = reply.send(Ok(appended));
                }
            }
            Err(error) => {
                // Nothing was written: a later delivery of these keys must not count as a
                // duplicate.
                if let Some(seen) = &mut self.seen {
                    for key in keys {
                        seen.forget(&key);
                    }
                }
                let reason = error.to_string();
                for (_, reply) in appends {
                    let _ = reply.send(Err(LogError::WriterStopped {
                        reason: reason.clone(),
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::sync::{Arc, Mutex};

    fn start() -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
    }

    fn keys(window_secs: u64) -> (DedupKeys, Arc<Mutex<Timestamp>>) {
        let now = Arc::new(Mutex::new(start()));
        let shared = Arc::clone(&now);
        let clock = Clock::new(move || *shared.lock().unwrap());
        (DedupKeys::new(Duration::from_secs(window_secs), clock), now)
    }

    #[test]
    fn a_key_is_a_duplicate_within_the_window_and_forgotten_after_it() {
        let (mut keys, now) = keys(60);
        assert!(keys.insert("a"));
        assert!(!keys.insert("a"));
        *now.lock().unwrap() = start() + chrono::Duration::seconds(59);
        assert!(!keys.insert("a"));
        assert!(keys.insert("b"));
        *now.lock().unwrap() = start() + chrono::Duration::seconds(60);
        assert!(keys.insert("a"), "a is older than the window");
        assert_eq!(keys.len(), 2);
        *now.lock().unwrap() = start() + chrono::Duration::seconds(119);
        assert!(keys.insert("b"), "b was appended 60 s ago");
        assert!(!keys.insert("a"), "a was appended 59 s ago");
    }

    #[test]
    fn the_keys_held_are_bounded_by_one_window_of_traffic() {
        let (mut keys, now) = keys(10);
        for second in 0..10_000_i64 {
            *now.lock().unwrap() = start() + chrono::Duration::seconds(second);
            assert!(keys.insert(&format!("key-{second}")));
            assert!(keys.len() <= 10, "{} keys held at {second} s", keys.len());
            assert!(keys.order.len() <= 11);
        }
    }

    #[test]
    fn keys_noted_at_open_expire_by_when_they_were_appended() {
        let (mut keys, now) = keys(60);
        *now.lock().unwrap() = start() + chrono::Duration::seconds(100);
        keys.note("old".into(), start());
        keys.note("recent".into(), start() + chrono::Duration::seconds(50));
        assert_eq!(keys.len(), 1);
        assert!(keys.insert("old"));
        assert!(!keys.insert("recent"));
        *now.lock().unwrap() = start() + chrono::Duration::seconds(110);
        assert!(keys.insert("recent"));
    }

    #[test]
    fn a_forgotten_key_is_new_again() {
        let (mut keys, _) = keys(60);
        assert!(keys.insert("a"));
        keys.forget("a");
        assert!(keys.insert("a"));
    }
}
