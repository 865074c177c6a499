//! The one writer of a journal: a thread that owns it and takes requests, gathering every
//! append waiting at the moment into one write and one fsync (group commit). An append may
//! carry a deduplication key; an item whose key was already appended is not written again.

use super::error::LogError;
use super::journal::Journal;
use std::collections::HashSet;
use std::path::Path;
use std::sync::mpsc as std_mpsc;
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

impl JournalWriter {
    /// Starts the writer thread for `journal`. `seen` holds the keys already in it.
    pub fn start(
        journal: Journal,
        seen: HashSet<String>,
        dir: &Path,
        name: &str,
    ) -> Result<JournalWriter, LogError> {
        let (requests, receiver) = std_mpsc::channel();
        let writer = Writer { journal, seen };
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
    seen: HashSet<String>,
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
                        if let Some(key) = &entry.key {
                            if !self.seen.insert(key.clone()) {
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
                for key in keys {
                    self.seen.remove(&key);
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
