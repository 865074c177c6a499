//! The lane writer pool: a fixed number of threads ([`THREADS`]) that host every open lane's
//! writer, however many lanes are open. A lane is given to one thread when it opens and stays
//! there until it closes; each thread keeps its lanes' writers in a map and leaves nothing of a
//! lane behind once it is closed or its last handle is dropped.
//!
//! A thread gathers every request waiting at the moment (up to [`MAX_BATCH`]) across all its
//! lanes, stages the appends lane by lane, and then writes each lane's staged lines with one
//! write and at most one fsync (group commit across lanes). A lane whose write fails is marked
//! broken and refuses further appends; the other lanes on the thread go on.

use super::error::LogError;
use super::writer::{Command, Writer, stopped};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, mpsc};
use tokio::sync::oneshot;

/// How many threads write lanes, whatever the number of lanes.
pub const THREADS: usize = 2;

/// How many requests one pass of a thread takes before it writes.
const MAX_BATCH: usize = 1024;

/// What a pool thread is asked to do.
pub(super) enum Message {
    /// Host a freshly opened lane's writer under `id`.
    Adopt {
        id: u64,
        writer: Box<Writer>,
    },
    Lane {
        id: u64,
        command: Command,
    },
    /// The lane's last handle is gone: write what is staged and drop its writer.
    Release {
        id: u64,
    },
    Census {
        reply: oneshot::Sender<Vec<PathBuf>>,
    },
}

/// A lane's place in the pool: the thread that hosts its writer, and its id there. Dropping it
/// releases the lane.
#[derive(Debug)]
pub(super) struct Hosted {
    id: u64,
    thread: mpsc::Sender<Message>,
}

impl Hosted {
    pub(super) fn send(&self, command: Command) -> Result<(), LogError> {
        self.thread
            .send(Message::Lane {
                id: self.id,
                command,
            })
            .map_err(|_| stopped())
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        let _ = self.thread.send(Message::Release { id: self.id });
    }
}

/// The threads started so far and where the next lane goes.
struct Pool {
    threads: Vec<mpsc::Sender<Message>>,
    next: u64,
}

/// A std lock, not a tokio one: it is held only to pick (or start) a thread for a lane being
/// opened, which happens in blocking code, and never across an await.
static POOL: Mutex<Pool> = Mutex::new(Pool {
    threads: Vec::new(),
    next: 0,
});

/// Gives `writer` to one of the pool's threads, starting it if it is not running.
pub(super) fn host(writer: Writer) -> Result<Hosted, LogError> {
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let id = pool.next;
    pool.next += 1;
    let slot = usize::try_from(id % THREADS as u64).unwrap_or(0);
    let mut message = Message::Adopt {
        id,
        writer: Box::new(writer),
    };
    if let Some(thread) = pool.threads.get(slot) {
        match thread.send(message) {
            Ok(()) => {
                return Ok(Hosted {
                    id,
                    thread: thread.clone(),
                });
            }
            // The thread is gone (it can only have panicked); start it again.
            Err(mpsc::SendError(back)) => message = back,
        }
    }
    let (thread, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("perch-lanes-{slot}"))
        .spawn(move || serve(&receiver))
        .map_err(|source| LogError::Io {
            path: PathBuf::from("."),
            action: "start a lane writer thread in",
            source,
        })?;
    thread.send(message).map_err(|_| stopped())?;
    if slot < pool.threads.len() {
        pool.threads[slot] = thread.clone();
    } else {
        pool.threads.push(thread.clone());
    }
    Ok(Hosted { id, thread })
}

/// The directories of the lanes whose writers the pool holds now.
pub async fn hosted_lanes() -> Vec<PathBuf> {
    let threads = POOL
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .threads
        .clone();
    let mut lanes = Vec::new();
    for thread in threads {
        let (reply, answer) = oneshot::channel();
        if thread.send(Message::Census { reply }).is_ok()
            && let Ok(dirs) = answer.await
        {
            lanes.extend(dirs);
        }
    }
    lanes.sort();
    lanes
}

/// One pool thread: takes what is waiting, stages appends per lane, answers the rest in order
/// (a lane's staged lines are written before anything else it asked is answered), then writes
/// every lane that staged lines.
fn serve(receiver: &mpsc::Receiver<Message>) {
    let mut lanes: HashMap<u64, Box<Writer>> = HashMap::new();
    let mut staged: Vec<u64> = Vec::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = receiver.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        for message in batch.drain(..) {
            match message {
                Message::Adopt { id, writer } => {
                    lanes.insert(id, writer);
                }
                Message::Release { id } => {
                    if let Some(mut writer) = lanes.remove(&id) {
                        writer.commit_staged();
                    }
                }
                Message::Census { reply } => {
                    let _ = reply.send(lanes.values().map(|w| w.dir().to_owned()).collect());
                }
                Message::Lane { id, command } => {
                    // A lane that is no longer here drops the request, and its caller hears
                    // that the writer stopped.
                    let Some(writer) = lanes.get_mut(&id) else {
                        continue;
                    };
                    match command {
                        Command::Append { encoded, reply } => {
                            if !writer.has_staged() {
                                staged.push(id);
                            }
                            writer.stage(encoded, reply);
                        }
                        Command::Close { reply } => {
                            writer.commit_staged();
                            lanes.remove(&id);
                            let _ = reply.send(());
                        }
                        other => {
                            writer.commit_staged();
                            writer.answer(other);
                        }
                    }
                }
            }
        }
        for id in staged.drain(..) {
            if let Some(writer) = lanes.get_mut(&id) {
                writer.commit_staged();
            }
        }
        if lanes.capacity() > 64 && lanes.len() < lanes.capacity() / 4 {
            lanes.shrink_to_fit();
        }
    }
}
