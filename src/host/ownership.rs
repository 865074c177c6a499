//! Gives a tree's files from one user to another without following anything the old user could
//! have planted: each entry is opened with `O_PATH | O_NOFOLLOW` relative to its parent's
//! descriptor, judged on what `fstat` says about that descriptor
//! ([`perch_core::ownership::verdict`]), and changed through the same descriptor
//! (`fchownat(fd, "", AT_EMPTY_PATH)`), so swapping a name for a link between the check and the
//! change reaches nothing. Directories are walked through the descriptor that was judged.

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat};
use nix::unistd::{Gid, Uid, fchownat};
use perch_core::ownership::{Entry, EntryKind, Handover, SkipReason, Verdict, verdict};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What a walk did.
#[derive(Debug, Default)]
pub struct HandoverReport {
    /// Entries whose owner was changed.
    pub given: usize,
    /// Entries left alone, each with its path relative to the top and why.
    pub skipped: Vec<(PathBuf, SkipReason)>,
}

/// Gives every entry under `top` (and `top` itself) that `from` owns to `to_user`:`to_group`,
/// skipping and reporting what [`verdict`] refuses. An error is a directory or entry that could
/// not be read or changed; what was changed before it stays changed.
pub fn hand_over(
    top: &Path,
    from: Uid,
    to_user: Uid,
    to_group: Gid,
) -> Result<HandoverReport, String> {
    let fd = nix::fcntl::open(
        top,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|error| format!("{}: {error}", top.display()))?;
    let stat = fstat(&fd).map_err(|error| format!("{}: {error}", top.display()))?;
    if kind(&stat) != EntryKind::Directory {
        return Err(format!(
            "{} is not a directory (a symbolic link is not followed)",
            top.display()
        ));
    }
    let walk = Walk {
        top,
        handover: Handover {
            from_uid: from.as_raw(),
            device: stat.st_dev,
        },
        to: (to_user, to_group),
    };
    let mut report = HandoverReport::default();
    walk.entry(&fd, &stat, Path::new(""), 0, &mut report)?;
    Ok(report)
}

struct Walk<'a> {
    top: &'a Path,
    handover: Handover,
    to: (Uid, Gid),
}

impl Walk<'_> {
    /// Judges the entry open as `fd` (at `relative`, `depth` below the top), changes it, and
    /// walks it if it is a directory.
    fn entry(
        &self,
        fd: &OwnedFd,
        stat: &FileStat,
        relative: &Path,
        depth: usize,
        report: &mut HandoverReport,
    ) -> Result<(), String> {
        let entry = Entry {
            kind: kind(stat),
            uid: stat.st_uid,
            links: stat.st_nlink,
            device: stat.st_dev,
        };
        match verdict(self.handover, entry, depth) {
            Verdict::Skip(reason) => {
                report.skipped.push((relative.to_owned(), reason));
                return Ok(());
            }
            Verdict::Give => {}
        }
        fchownat(
            fd,
            "",
            Some(self.to.0),
            Some(self.to.1),
            AtFlags::AT_EMPTY_PATH,
        )
        .map_err(|error| self.failed(relative, error))?;
        report.given += 1;
        if entry.kind == EntryKind::Directory {
            for name in self.names(fd, relative)? {
                let child = relative.join(&name);
                let child_fd = match openat(
                    fd,
                    name.as_os_str(),
                    OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(child_fd) => child_fd,
                    // Removed since the listing: nothing to give.
                    Err(nix::errno::Errno::ENOENT) => continue,
                    Err(error) => return Err(self.failed(&child, error)),
                };
                let child_stat = fstat(&child_fd).map_err(|error| self.failed(&child, error))?;
                self.entry(&child_fd, &child_stat, &child, depth + 1, report)?;
            }
        }
        Ok(())
    }

    /// The names in the directory open as `fd`, without `.` and `..`.
    fn names(&self, fd: &OwnedFd, relative: &Path) -> Result<Vec<OsString>, String> {
        let mut listing = Dir::openat(
            fd.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| self.failed(relative, error))?;
        let mut names = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(|error| self.failed(relative, error))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name != "." && name != ".." {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn failed(&self, relative: &Path, error: nix::errno::Errno) -> String {
        format!("{}: {error}", self.top.join(relative).display())
    }
}

fn kind(stat: &FileStat) -> EntryKind {
    match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFDIR => EntryKind::Directory,
        SFlag::S_IFLNK => EntryKind::SymbolicLink,
        _ => EntryKind::File,
    }
}
