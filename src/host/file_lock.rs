//! Exclusive file locks taken with a moment's patience.
//!
//! A lock released a moment ago can still be held: a process forked to run a program keeps a
//! copy of every descriptor, the lock's among them, until it execs, and the lock lasts as long
//! as any copy does. That lasts microseconds, or a few milliseconds on a loaded host, and
//! matters where a lock is let go and taken again while perch runs programs: a lane closed as
//! idle and reopened by its next message, a machine stopped and started again, an owner lock
//! dropped and taken. Another process that holds the lock holds it for good, and is told apart
//! by waiting [`MOMENT`].

use std::fs::{File, TryLockError};
use std::time::{Duration, Instant};

/// How long a lock held by someone else is tried again before it counts as held.
pub const MOMENT: Duration = Duration::from_millis(200);
const RETRY: Duration = Duration::from_millis(5);

/// Takes `file`'s exclusive lock, trying again for `patience` while someone else holds it.
/// Blocking, for up to `patience`, and only while the lock is held.
pub fn lock_exclusive(file: &File, patience: Duration) -> Result<(), TryLockError> {
    let deadline = Instant::now() + patience;
    loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(RETRY);
            }
            result => return result,
        }
    }
}
