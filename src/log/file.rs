//! Lines on disk: locking, creating a file with its first line, scanning with torn-tail
//! detection, and appending with rollback on a failed write.

use super::error::LogError;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Takes the exclusive lock at `path`, creating the file, trying again for `patience` while
/// someone else holds it ([`crate::host::file_lock`]). The lock lasts as long as the returned
/// handle.
pub(crate) fn lock_exclusive(path: &Path, patience: Duration) -> Result<File, LogError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(LogError::io(path, "open the lock file"))?;
    match crate::host::file_lock::lock_exclusive(&file, patience) {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(LogError::Held {
            path: path.to_owned(),
        }),
        Err(TryLockError::Error(source)) => Err(LogError::Io {
            path: path.to_owned(),
            action: "lock",
            source,
        }),
    }
}

/// Creates `path` holding exactly `first_line`, durably: it is written and fsynced under a
/// temporary name and then renamed, so the file never exists without its first line.
pub(crate) fn create_with_first_line(path: &Path, first_line: &[u8]) -> Result<(), LogError> {
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary).map_err(LogError::io(&temporary, "create"))?;
    file.write_all(first_line)
        .map_err(LogError::io(&temporary, "write"))?;
    file.sync_all().map_err(LogError::io(&temporary, "fsync"))?;
    fs::rename(&temporary, path).map_err(LogError::io(path, "rename into place"))?;
    sync_parent(path)
}

pub(crate) fn sync_parent(path: &Path) -> Result<(), LogError> {
    let parent = path.parent().unwrap_or(Path::new("."));
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(LogError::io(parent, "fsync the directory"))
}

/// Where a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    /// The end of the last good line.
    pub end: u64,
    /// Bytes after `end` that do not form a good line: a torn tail.
    pub torn: Option<u64>,
}

/// Reads the lines of `file` between `from` and `to`, handing each (with its newline) to
/// `on_line`. A bad or unterminated last line is a torn tail; a bad line anywhere else is
/// corruption. `first_line` is the 1-based number of the line at `from`, for errors.
pub(crate) fn scan_lines(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
    first_line: u64,
    mut on_line: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<Scan, LogError> {
    let mut reader = BufReader::with_capacity(1 << 20, file);
    reader
        .seek(SeekFrom::Start(from))
        .map_err(LogError::io(path, "seek in"))?;
    let mut reader = reader.take(to - from);
    let mut offset = from;
    let mut number = first_line;
    let mut buffer = Vec::with_capacity(64 << 10);
    loop {
        buffer.clear();
        let read = reader
            .read_until(b'\n', &mut buffer)
            .map_err(LogError::io(path, "read"))?;
        if read == 0 {
            return Ok(Scan {
                end: offset,
                torn: None,
            });
        }
        let next = offset + read as u64;
        if buffer.last() != Some(&b'\n') {
            return Ok(Scan {
                end: offset,
                torn: Some(to - offset),
            });
        }
        if let Err(reason) = on_line(offset, &buffer) {
            if next == to {
                return Ok(Scan {
                    end: offset,
                    torn: Some(to - offset),
                });
            }
            return Err(LogError::Corrupt {
                path: path.to_owned(),
                line: number,
                reason,
            });
        }
        offset = next;
        number += 1;
    }
}

/// Reads `len` bytes at `offset`.
pub(crate) fn read_at(
    file: &File,
    path: &Path,
    offset: u64,
    len: u32,
) -> Result<Vec<u8>, LogError> {
    let mut bytes = vec![0; len as usize];
    file.read_exact_at(&mut bytes, offset)
        .map_err(LogError::io(path, "read"))?;
    Ok(bytes)
}

/// The append end of one file. A write that fails is cut back off, so the file never keeps half
/// a batch; after a failed fsync nothing about the file can be trusted and the caller must stop.
#[derive(Debug)]
pub(crate) struct Appender {
    path: PathBuf,
    file: File,
    len: u64,
}

impl Appender {
    pub(crate) fn open(path: &Path, len: u64) -> Result<Appender, LogError> {
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(LogError::io(path, "open for appending"))?;
        Ok(Appender {
            path: path.to_owned(),
            file,
            len,
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Cuts the file back to `len` and makes that durable.
    pub(crate) fn truncate(&mut self, len: u64) -> Result<(), LogError> {
        self.file
            .set_len(len)
            .map_err(LogError::io(&self.path, "truncate"))?;
        self.file
            .sync_all()
            .map_err(LogError::io(&self.path, "fsync"))?;
        self.len = len;
        Ok(())
    }

    pub(crate) fn append(&mut self, bytes: &[u8], sync: bool) -> Result<(), LogError> {
        append_to(&self.file, &self.path, &mut self.len, bytes, sync)
    }
}

/// Appends `bytes` to `file` (opened for appending, `len` bytes long), fsyncing if `sync`. A
/// write that fails is cut back off, so the file never keeps half a batch.
pub(crate) fn append_to(
    mut file: &File,
    path: &Path,
    len: &mut u64,
    bytes: &[u8],
    sync: bool,
) -> Result<(), LogError> {
    if let Err(source) = file.write_all(bytes) {
        let _ = file.set_len(*len);
        return Err(LogError::Io {
            path: path.to_owned(),
            action: "append to",
            source,
        });
    }
    *len += bytes.len() as u64;
    if sync {
        file.sync_data().map_err(LogError::io(path, "fsync"))?;
    }
    Ok(())
}

/// Opens `path` for reading and appending: one descriptor for both.
pub(crate) fn open_read_append(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(LogError::io(path, "open for appending"))
}
