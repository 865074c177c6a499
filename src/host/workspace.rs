//! Reading and writing workspace files on the host, for perch's own use: the files of the system
//! prompt and the skills, the files a chat message brings (saved under `inbox/`) and the files a
//! reply attaches. The guest can change anything under `workspace/`, including replacing a file
//! or a directory with a symlink to a host path, so a path is walked one component at a time from
//! directories held open (`openat`), never followed through a symlink, and a file is read only
//! if the descriptor opened says it is a regular file with no other hard link (one could be a
//! host file linked into the workspace), the same one that was checked. Text files are read up to
//! [`WORKSPACE_FILE_LIMIT`] bytes. A file perch writes is written under a temporary hidden name
//! in its directory, synced, and renamed into place, so a file under its own name is complete.

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use perch_core::Problem;
use perch_core::attachment::FileRefusal;
use perch_core::problem::Pos;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// The most bytes of one workspace file perch reads on the host.
pub const WORKSPACE_FILE_LIMIT: u64 = 64 * 1024;

/// A workspace file's text, or its first [`WORKSPACE_FILE_LIMIT`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceText {
    pub text: String,
    /// The file's size in bytes, when it was longer than the limit.
    pub cut_from: Option<u64>,
}

/// What a directory entry is, as the directory says (a symlink is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    File,
    Symlink,
    Other,
}

/// A directory of the workspace, held open: everything under it is reached through it, so the
/// guest swapping a directory on its path for a symlink afterwards changes nothing.
#[derive(Debug)]
pub struct WorkspaceDir {
    fd: OwnedFd,
    /// Relative to the workspace, for problems.
    relative: PathBuf,
}

const DIRECTORY: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);
const FILE: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY)
    .union(OFlag::O_CLOEXEC);

/// Reads `relative` (a plain relative path such as `skills/x/SKILL.md`) under `workspace`.
/// `Ok(None)` when it does not exist. A symlink anywhere along the path, something other than
/// a regular file, or text that is not UTF-8 is a problem naming `workspace/<relative>`.
pub fn read_workspace_file(
    workspace: &Path,
    relative: &Path,
) -> Result<Option<WorkspaceText>, Problem> {
    match open_parent(workspace, relative)? {
        Some((dir, name)) => dir.read_file(name),
        None => Ok(None),
    }
}

/// The directory holding `relative` under `workspace`, held open, and the file's name in it;
/// `Ok(None)` when that directory does not exist.
fn open_parent<'a>(
    workspace: &Path,
    relative: &'a Path,
) -> Result<Option<(WorkspaceDir, &'a OsStr)>, Problem> {
    let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Err(problem(
            relative,
            "is not a plain path inside the workspace",
            "name the file by a relative path without `..`",
        ));
    };
    match WorkspaceDir::open(workspace, parent) {
        Ok(Some(dir)) => Ok(Some((dir, name))),
        Ok(None) => Ok(None),
        Err(found) => Err(Problem {
            message: format!("is under {}, which {}", found.file, found.message),
            file: label(relative),
            ..found
        }),
    }
}

impl WorkspaceDir {
    /// Opens `relative` (empty for the workspace itself), a directory under `workspace`.
    /// `Ok(None)` when it does not exist or is not a directory.
    pub fn open(workspace: &Path, relative: &Path) -> Result<Option<WorkspaceDir>, Problem> {
        let fd = match nix::fcntl::open(
            workspace,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
            Err(error) => return Err(unreadable(relative, error)),
        };
        let mut dir = WorkspaceDir {
            fd,
            relative: PathBuf::new(),
        };
        for component in relative.components() {
            let Component::Normal(name) = component else {
                return Err(problem(
                    relative,
                    "is not a plain path inside the workspace",
                    "name the file by a relative path without `..`",
                ));
            };
            match dir.subdir(name)? {
                Some(next) => dir = next,
                None => return Ok(None),
            }
        }
        Ok(Some(dir))
    }

    /// Where this directory is, relative to the workspace.
    pub fn relative(&self) -> &Path {
        &self.relative
    }

    /// The directory `name` in this one; `Ok(None)` when there is none. A symlink is refused.
    pub fn subdir(&self, name: &OsStr) -> Result<Option<WorkspaceDir>, Problem> {
        let relative = self.relative.join(name);
        match openat(&self.fd, name, DIRECTORY, Mode::empty()) {
            Ok(fd) => Ok(Some(WorkspaceDir { fd, relative })),
            Err(Errno::ENOENT) => Ok(None),
            Err(Errno::ENOTDIR | Errno::ELOOP) => match self.kind(name) {
                Some(EntryKind::Symlink) => Err(symlink(&relative)),
                _ => Ok(None),
            },
            Err(error) => Err(unreadable(&relative, error)),
        }
    }

    /// The entries of this directory (the first `limit` it lists), in name order, and whether
    /// that was all of them.
    pub fn entries(&self, limit: usize) -> Result<(Vec<(OsString, EntryKind)>, bool), Problem> {
        let mut listing = Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| unreadable(&self.relative, error))?;
        let mut entries = Vec::new();
        let mut complete = true;
        for entry in listing.iter() {
            let entry = entry.map_err(|error| unreadable(&self.relative, error))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            if entries.len() == limit {
                complete = false;
                break;
            }
            let kind = match entry.file_type() {
                Some(Type::Directory) => EntryKind::Directory,
                Some(Type::File) => EntryKind::File,
                Some(Type::Symlink) => EntryKind::Symlink,
                Some(_) => EntryKind::Other,
                None => self.kind(name).unwrap_or(EntryKind::Other),
            };
            entries.push((name.to_owned(), kind));
        }
        entries.sort_by(|(a, _), (b, _)| a.cmp(b));
        Ok((entries, complete))
    }

    /// Reads the file `name` in this directory; see [`read_workspace_file`].
    pub fn read_file(&self, name: &OsStr) -> Result<Option<WorkspaceText>, Problem> {
        let relative = self.relative.join(name);
        let Some((mut bytes, size)) = self.read_up_to(name, WORKSPACE_FILE_LIMIT)? else {
            return Ok(None);
        };
        let cut_from = (bytes.len() as u64 > WORKSPACE_FILE_LIMIT).then_some(size);
        if cut_from.is_some() {
            bytes.truncate(usize::try_from(WORKSPACE_FILE_LIMIT).unwrap_or(usize::MAX));
            if let Err(error) = std::str::from_utf8(&bytes)
                && error.error_len().is_none()
            {
                bytes.truncate(error.valid_up_to());
            }
        }
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(WorkspaceText { text, cut_from })),
            Err(_) => Err(problem(&relative, "is not UTF-8 text", "save it as UTF-8")),
        }
    }

    /// Reads the file `name` in this directory whole, as UTF-8 text, like
    /// [`WorkspaceDir::read_file`] reads it, except that a file longer than `limit` bytes is
    /// refused with a problem naming the limit rather than cut.
    pub fn read_whole_file(&self, name: &OsStr, limit: u64) -> Result<Option<String>, Problem> {
        let relative = self.relative.join(name);
        let Some((bytes, size)) = self.read_up_to(name, limit)? else {
            return Ok(None);
        };
        if bytes.len() as u64 > limit {
            return Err(problem(
                &relative,
                &format!(
                    "is {}, larger than the limit of {}",
                    byte_size(size.max(bytes.len() as u64)),
                    byte_size(limit)
                ),
                "make it smaller",
            ));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| problem(&relative, "is not UTF-8 text", "save it as UTF-8"))
    }

    /// The first `limit + 1` bytes of the regular file `name` (so a longer file shows), and its
    /// size; `Ok(None)` when there is none.
    fn read_up_to(&self, name: &OsStr, limit: u64) -> Result<Option<(Vec<u8>, u64)>, Problem> {
        let relative = self.relative.join(name);
        let (file, size) = match open_single_file(&self.fd, name) {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ok(None),
            Err(Unopened::Symlink) => return Err(symlink(&relative)),
            Err(Unopened::NotAFile) => {
                return Err(problem(
                    &relative,
                    "is not a regular file",
                    "make it a regular file",
                ));
            }
            Err(Unopened::HardLinked(links)) => return Err(hard_linked(&relative, links)),
            Err(Unopened::Failed(error)) => {
                return Err(problem(
                    &relative,
                    &format!("cannot be read: {error}"),
                    "check that it is a regular file that perch may read",
                ));
            }
        };
        let mut bytes = Vec::new();
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| {
                problem(
                    &relative,
                    &format!("cannot be read: {error}"),
                    "check that it is a regular file that perch may read",
                )
            })?;
        Ok(Some((bytes, size)))
    }

    fn kind(&self, name: &OsStr) -> Option<EntryKind> {
        fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|stat| kind_of_mode(stat.st_mode))
    }
}

/// Reads `relative` (a plain relative path) under `workspace` whole, as UTF-8 text, refused like
/// [`read_workspace_file`] refuses it, and also when it is longer than `limit` bytes.
/// `Ok(None)` when it does not exist.
pub fn read_workspace_text(
    workspace: &Path,
    relative: &Path,
    limit: u64,
) -> Result<Option<String>, Problem> {
    match open_parent(workspace, relative)? {
        Some((dir, name)) => dir.read_whole_file(name, limit),
        None => Ok(None),
    }
}

/// What `stat` says of a workspace entry, without following a symlink: equal stamps mean,
/// as far as the file system tells, an unchanged entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    mode: u32,
    size: i64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl FileStamp {
    /// Whether the entry was last changed long enough before `now` that a later change would
    /// show in its stamp: time stamps are coarse, so two writes close together can leave equal
    /// stamps.
    pub fn is_settled(&self, now: std::time::SystemTime) -> bool {
        let changed = self.modified.max(self.changed);
        let Ok(since_epoch) = now.duration_since(std::time::UNIX_EPOCH) else {
            return false;
        };
        let now = (
            i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
            i64::from(since_epoch.subsec_nanos()),
        );
        (now.0.saturating_sub(changed.0), now.1 - changed.1) > (SETTLED_AFTER_SECS, 0)
    }
}

/// How many seconds after its last change a file's stamp is trusted.
const SETTLED_AFTER_SECS: i64 = 2;

/// The stamp of `relative` (a plain relative path) under `workspace`; `Ok(None)` when there is
/// nothing there. Never opens the entry, so it cannot block on a FIFO or read a device.
pub fn workspace_file_stamp(
    workspace: &Path,
    relative: &Path,
) -> Result<Option<FileStamp>, Problem> {
    let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Err(problem(
            relative,
            "is not a plain path inside the workspace",
            "name the file by a relative path without `..`",
        ));
    };
    let Some(dir) = WorkspaceDir::open(workspace, parent)? else {
        return Ok(None);
    };
    match fstatat(&dir.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileStamp {
            dev: stat.st_dev,
            ino: stat.st_ino,
            mode: stat.st_mode,
            size: stat.st_size,
            modified: (stat.st_mtime, stat.st_mtime_nsec),
            changed: (stat.st_ctime, stat.st_ctime_nsec),
        })),
        Err(Errno::ENOENT) => Ok(None),
        Err(error) => Err(unreadable(relative, error)),
    }
}

fn byte_size(bytes: u64) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} bytes")
    }
}

/// The directory `relative` under `workspace`, held open; with `create`, missing directories
/// are made (mode 0755). `Ok(None)` when it is missing and not created. A symlink or a file on
/// the way is refused.
fn walk_dirs(
    workspace: &Path,
    relative: &Path,
    create: bool,
) -> Result<Option<OwnedFd>, FileRefusal> {
    let failed = |error: Errno| FileRefusal::Failed(io::Error::from(error).to_string());
    let mut fd = nix::fcntl::open(
        workspace,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(failed)?;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(FileRefusal::Outside);
        };
        let mut created = false;
        fd = loop {
            match openat(&fd, name, DIRECTORY, Mode::empty()) {
                Ok(next) => break next,
                Err(Errno::ENOENT) if create && !created => {
                    match mkdirat(&fd, name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => created = true,
                        Err(error) => return Err(failed(error)),
                    }
                }
                Err(Errno::ENOENT) => return Ok(None),
                Err(Errno::ENOTDIR | Errno::ELOOP) => {
                    let kind = fstatat(&fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                        .ok()
                        .map(|stat| kind_of_mode(stat.st_mode));
                    return Err(match kind {
                        Some(EntryKind::Symlink) => FileRefusal::Symlink,
                        _ => FileRefusal::NotAFile,
                    });
                }
                Err(error) => return Err(failed(error)),
            }
        };
    }
    Ok(Some(fd))
}

/// The entry `name` in the directory `dir`: its size when it is a regular file, `None` when
/// there is none; a symlink or anything else is refused.
fn regular_size(dir: &OwnedFd, name: &OsStr) -> Result<Option<u64>, FileRefusal> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => match kind_of_mode(stat.st_mode) {
            EntryKind::File => Ok(Some(u64::try_from(stat.st_size).unwrap_or_default())),
            EntryKind::Symlink => Err(FileRefusal::Symlink),
            EntryKind::Directory | EntryKind::Other => Err(FileRefusal::NotAFile),
        },
        Err(Errno::ENOENT) => Ok(None),
        Err(error) => Err(FileRefusal::Failed(io::Error::from(error).to_string())),
    }
}

/// The size of the regular file `name` in the directory `dir` under `workspace`, when there is
/// one: a file perch saved there before (it is complete, see [`save_workspace_file`]).
pub fn saved_file_size(
    workspace: &Path,
    dir: &Path,
    name: &str,
) -> Result<Option<u64>, FileRefusal> {
    match walk_dirs(workspace, dir, false)? {
        Some(fd) => regular_size(&fd, OsStr::new(name)),
        None => Ok(None),
    }
}

/// Writes `bytes` as the file `name` in the directory `dir` under `workspace`, making missing
/// directories: under a temporary hidden name first, synced, then renamed into place. An
/// existing regular file of that name is left as it is (it was saved before); a symlink or a
/// directory in the way is refused.
pub fn save_workspace_file(
    workspace: &Path,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), FileRefusal> {
    let failed = |error: &dyn std::fmt::Display| FileRefusal::Failed(error.to_string());
    let Some(dir) = walk_dirs(workspace, dir, true)? else {
        return Err(FileRefusal::NotFound);
    };
    if regular_size(&dir, OsStr::new(name))?.is_some() {
        return Ok(());
    }
    let temporary = format!(".{name}.part-{}", uuid::Uuid::new_v4().simple());
    let created = openat(
        &dir,
        temporary.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|error| failed(&io::Error::from(error)))?;
    let mut file = File::from(created);
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|error| failed(&error))
        .and_then(|()| {
            renameat(&dir, temporary.as_str(), &dir, name)
                .map_err(|error| failed(&io::Error::from(error)))
        });
    if written.is_err() {
        let _ = unlinkat(&dir, temporary.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// How many bytes the regular files under the directory `relative` in `workspace` hold
/// together, by their sizes, walked without following a symlink; `Ok(Some(0))` when there is
/// no such directory, and `Ok(None)` when it holds more than `max_entries` entries or nests
/// deeper than `max_depth` levels (then it was not counted). An entry removed while it is
/// walked is not counted.
pub fn tree_size(
    workspace: &Path,
    relative: &Path,
    max_entries: usize,
    max_depth: usize,
) -> Result<Option<u64>, FileRefusal> {
    let Some(root) = walk_dirs(workspace, relative, false)? else {
        return Ok(Some(0));
    };
    let mut walk = TreeWalk {
        entries_left: max_entries,
        total: 0,
    };
    Ok(walk.visit(&root, max_depth)?.then_some(walk.total))
}

struct TreeWalk {
    entries_left: usize,
    total: u64,
}

impl TreeWalk {
    /// Adds the sizes under `dir`, `depth_left` levels deep at most; false when a bound was
    /// reached.
    fn visit(&mut self, dir: &OwnedFd, depth_left: usize) -> Result<bool, FileRefusal> {
        let failed = |error: Errno| FileRefusal::Failed(io::Error::from(error).to_string());
        let mut listing = Dir::openat(
            dir,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(failed)?;
        let mut subdirs = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(failed)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            if self.entries_left == 0 {
                return Ok(false);
            }
            self.entries_left -= 1;
            let stat = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::ENOENT) => continue,
                Err(error) => return Err(failed(error)),
            };
            match kind_of_mode(stat.st_mode) {
                EntryKind::File => {
                    let size = u64::try_from(stat.st_size).unwrap_or_default();
                    self.total = self.total.saturating_add(size);
                }
                EntryKind::Directory => subdirs.push(name.to_owned()),
                EntryKind::Symlink | EntryKind::Other => {}
            }
        }
        drop(listing);
        for name in subdirs {
            if depth_left == 0 {
                return Ok(false);
            }
            let subdir = match openat(dir, name.as_os_str(), DIRECTORY, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(error) => return Err(failed(error)),
            };
            if !self.visit(&subdir, depth_left - 1)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Reads the regular file `relative` under `workspace` (a plain relative path) whole, refusing
/// it when it is larger than `limit` bytes, a symlink is on its path, or it is not a regular
/// file.
pub fn read_workspace_bytes(
    workspace: &Path,
    relative: &Path,
    limit: u64,
) -> Result<Vec<u8>, FileRefusal> {
    let (file, size) = open_regular(workspace, relative)?;
    if size > limit {
        return Err(FileRefusal::TooLarge { size: Some(size) });
    }
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| FileRefusal::Failed(error.to_string()))?;
    if bytes.len() as u64 > limit {
        return Err(FileRefusal::TooLarge { size: None });
    }
    Ok(bytes)
}

/// The size of the regular file `relative` under `workspace`, refused like
/// [`read_workspace_bytes`] refuses it.
pub fn workspace_file_size(workspace: &Path, relative: &Path) -> Result<u64, FileRefusal> {
    open_regular(workspace, relative).map(|(_, size)| size)
}

fn open_regular(workspace: &Path, relative: &Path) -> Result<(File, u64), FileRefusal> {
    let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Err(FileRefusal::Outside);
    };
    let dir = walk_dirs(workspace, parent, false)?.ok_or(FileRefusal::NotFound)?;
    match open_single_file(&dir, name) {
        Ok(Some(opened)) => Ok(opened),
        Ok(None) => Err(FileRefusal::NotFound),
        Err(Unopened::Symlink) => Err(FileRefusal::Symlink),
        Err(Unopened::NotAFile) => Err(FileRefusal::NotAFile),
        Err(Unopened::HardLinked(links)) => Err(FileRefusal::HardLinked(links)),
        Err(Unopened::Failed(error)) => Err(FileRefusal::Failed(error.to_string())),
    }
}

/// Why a workspace file was not opened for reading.
#[derive(Debug)]
enum Unopened {
    Symlink,
    /// A directory, a FIFO, a device or a socket.
    NotAFile,
    /// A regular file with this many links.
    HardLinked(u64),
    Failed(io::Error),
}

/// The file `name` in the directory `dir`, opened for reading, and its size; `Ok(None)` when
/// there is none. The one place perch decides whether it may read a file the guest can write:
/// the entry is looked at without following a symlink (so a FIFO or a device is never opened),
/// opened with `O_NOFOLLOW | O_NONBLOCK`, and the descriptor it got must be a regular file
/// with exactly one link, the same file that was looked at. A second link may be a host file
/// (a secret, another agent's file) linked into the workspace, so such a file is refused
/// whatever its name there.
fn open_single_file(dir: &OwnedFd, name: &OsStr) -> Result<Option<(File, u64)>, Unopened> {
    let checked = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(checked) => checked,
        Err(Errno::ENOENT) => return Ok(None),
        Err(error) => return Err(Unopened::Failed(io::Error::from(error))),
    };
    match kind_of_mode(checked.st_mode) {
        EntryKind::File => {}
        EntryKind::Symlink => return Err(Unopened::Symlink),
        EntryKind::Directory | EntryKind::Other => return Err(Unopened::NotAFile),
    }
    let file = match openat(dir, name, FILE, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(Unopened::Symlink),
        Err(error) => return Err(Unopened::Failed(io::Error::from(error))),
    };
    let opened = file.metadata().map_err(Unopened::Failed)?;
    if !opened.is_file() {
        return Err(Unopened::NotAFile);
    }
    if opened.nlink() > 1 {
        return Err(Unopened::HardLinked(opened.nlink()));
    }
    if opened.dev() != checked.st_dev || opened.ino() != checked.st_ino {
        return Err(Unopened::Failed(io::Error::other(
            "it was replaced while perch was reading it",
        )));
    }
    Ok(Some((file, opened.len())))
}

fn kind_of_mode(mode: u32) -> EntryKind {
    match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
        SFlag::S_IFDIR => EntryKind::Directory,
        SFlag::S_IFREG => EntryKind::File,
        SFlag::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn label(relative: &Path) -> String {
    if relative.as_os_str().is_empty() {
        "workspace/".to_owned()
    } else {
        format!("workspace/{}", relative.display())
    }
}

fn problem(relative: &Path, message: &str, fix: &str) -> Problem {
    Problem::new(label(relative), Pos::default(), message).with_fix(fix)
}

fn symlink(relative: &Path) -> Problem {
    problem(
        relative,
        "is a symlink; perch reads workspace files on the host and never follows a symlink there",
        "replace the symlink with the file or directory itself",
    )
}

fn hard_linked(relative: &Path, links: u64) -> Problem {
    let file = label(relative);
    problem(
        relative,
        &format!(
            "has {links} hard links; perch reads workspace files on the host and never one that is also linked elsewhere, which could be a file outside the workspace"
        ),
        &format!(
            "replace it with a copy of its own: cp {file} {file}.copy && mv {file}.copy {file}"
        ),
    )
}

fn unreadable(relative: &Path, error: Errno) -> Problem {
    problem(
        relative,
        &format!("cannot be read: {}", io::Error::from(error)),
        "check its permissions",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn symlinks_anywhere_on_the_path_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        fs::create_dir_all(workspace.join("real")).unwrap();
        fs::write(dir.path().join("host.txt"), "host secret").unwrap();
        fs::write(workspace.join("real/file.md"), "fine").unwrap();
        std::os::unix::fs::symlink(dir.path().join("host.txt"), workspace.join("link.md")).unwrap();
        std::os::unix::fs::symlink(workspace.join("real"), workspace.join("alias")).unwrap();
        assert_eq!(
            read_workspace_file(&workspace, Path::new("real/file.md")),
            Ok(Some(WorkspaceText {
                text: "fine".into(),
                cut_from: None
            }))
        );
        let refused = read_workspace_file(&workspace, Path::new("link.md")).unwrap_err();
        assert_eq!(refused.file, "workspace/link.md");
        assert!(
            refused.message.starts_with("is a symlink; perch reads"),
            "{refused}"
        );
        let refused = read_workspace_file(&workspace, Path::new("alias/file.md")).unwrap_err();
        assert_eq!(refused.file, "workspace/alias/file.md");
        assert!(
            refused
                .message
                .starts_with("is under workspace/alias, which is a symlink; perch reads"),
            "{refused}"
        );
        assert_eq!(
            read_workspace_file(&workspace, Path::new("missing.md")),
            Ok(None)
        );
        assert_eq!(
            read_workspace_file(&workspace, Path::new("real/file.md/x")),
            Ok(None)
        );
        assert!(read_workspace_file(&workspace, Path::new("../host.txt")).is_err());
        assert!(read_workspace_file(&workspace, Path::new("real")).is_err());
    }

    #[test]
    fn a_directory_lists_its_entries_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("b")).unwrap();
        fs::write(dir.path().join("a"), "").unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("c")).unwrap();
        let root = WorkspaceDir::open(dir.path(), Path::new(""))
            .unwrap()
            .unwrap();
        assert_eq!(
            root.entries(10).unwrap(),
            (
                vec![
                    ("a".into(), EntryKind::File),
                    ("b".into(), EntryKind::Directory),
                    ("c".into(), EntryKind::Symlink),
                ],
                true
            )
        );
        assert!(!root.entries(2).unwrap().1);
        assert!(root.subdir(OsStr::new("c")).is_err());
        assert_eq!(
            root.subdir(OsStr::new("b")).unwrap().unwrap().relative(),
            Path::new("b")
        );
    }

    #[test]
    fn files_are_saved_without_following_symlinks_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        fs::create_dir_all(&workspace).unwrap();
        let inbox = Path::new("inbox/tg/1");
        save_workspace_file(&workspace, inbox, "a.txt", b"hello").unwrap();
        assert_eq!(
            fs::read(workspace.join("inbox/tg/1/a.txt")).unwrap(),
            b"hello"
        );
        assert_eq!(saved_file_size(&workspace, inbox, "a.txt"), Ok(Some(5)));
        assert_eq!(saved_file_size(&workspace, inbox, "b.txt"), Ok(None));
        assert_eq!(
            saved_file_size(&workspace, Path::new("inbox/none"), "b.txt"),
            Ok(None)
        );
        save_workspace_file(&workspace, inbox, "a.txt", b"other").unwrap();
        assert_eq!(
            fs::read(workspace.join("inbox/tg/1/a.txt")).unwrap(),
            b"hello"
        );
        let names: Vec<_> = fs::read_dir(workspace.join("inbox/tg/1"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.txt"], "no temporary file is left behind");

        let outside = dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, workspace.join("inbox/dc")).unwrap();
        assert_eq!(
            save_workspace_file(&workspace, Path::new("inbox/dc/2"), "x", b"x"),
            Err(FileRefusal::Symlink)
        );
        std::os::unix::fs::symlink("/etc/passwd", workspace.join("inbox/tg/1/p")).unwrap();
        assert_eq!(
            save_workspace_file(&workspace, inbox, "p", b"x"),
            Err(FileRefusal::Symlink)
        );
        assert!(fs::read_dir(&outside).unwrap().next().is_none());
        assert_eq!(
            save_workspace_file(&workspace, Path::new("inbox/tg/1/a.txt"), "x", b"x"),
            Err(FileRefusal::NotAFile)
        );
    }

    #[test]
    fn files_to_send_are_read_only_when_regular_and_small_enough() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        fs::create_dir_all(workspace.join("notes")).unwrap();
        fs::write(workspace.join("notes/a.pdf"), b"%PDF").unwrap();
        fs::write(dir.path().join("secret"), b"host").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), workspace.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), workspace.join("up")).unwrap();
        let read = |path: &str, limit| read_workspace_bytes(&workspace, Path::new(path), limit);
        assert_eq!(read("notes/a.pdf", 10), Ok(b"%PDF".to_vec()));
        assert_eq!(
            workspace_file_size(&workspace, Path::new("notes/a.pdf")),
            Ok(4)
        );
        assert_eq!(
            read("notes/a.pdf", 3),
            Err(FileRefusal::TooLarge { size: Some(4) })
        );
        assert_eq!(read("link", 10), Err(FileRefusal::Symlink));
        assert_eq!(read("up/secret", 10), Err(FileRefusal::Symlink));
        assert_eq!(read("notes", 10), Err(FileRefusal::NotAFile));
        assert_eq!(read("missing", 10), Err(FileRefusal::NotFound));
        assert_eq!(read("nodir/x", 10), Err(FileRefusal::NotFound));
        assert_eq!(read("../secret", 10), Err(FileRefusal::Outside));
    }

    #[test]
    fn a_file_with_another_hard_link_is_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        fs::create_dir_all(workspace.join("skills/s")).unwrap();
        fs::write(dir.path().join("secret"), b"host secret").unwrap();
        for linked in ["HEARTBEAT.yml", "AGENTS.md", "skills/s/SKILL.md", "out.pdf"] {
            fs::hard_link(dir.path().join("secret"), workspace.join(linked)).unwrap();
        }
        let refused = read_workspace_text(&workspace, Path::new("HEARTBEAT.yml"), 1024)
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "workspace/HEARTBEAT.yml: has 5 hard links; perch reads workspace files on the host \
             and never one that is also linked elsewhere, which could be a file outside the \
             workspace\n  fix: replace it with a copy of its own: cp workspace/HEARTBEAT.yml \
             workspace/HEARTBEAT.yml.copy && mv workspace/HEARTBEAT.yml.copy \
             workspace/HEARTBEAT.yml"
        );
        let refused = read_workspace_file(&workspace, Path::new("AGENTS.md")).unwrap_err();
        assert!(refused.message.starts_with("has 5 hard links"), "{refused}");
        let skills = WorkspaceDir::open(&workspace, Path::new("skills/s"))
            .unwrap()
            .unwrap();
        assert!(skills.read_file(OsStr::new("SKILL.md")).is_err());
        assert_eq!(
            read_workspace_bytes(&workspace, Path::new("out.pdf"), 1024),
            Err(FileRefusal::HardLinked(5))
        );
        assert_eq!(
            workspace_file_size(&workspace, Path::new("out.pdf")),
            Err(FileRefusal::HardLinked(5))
        );
        fs::remove_file(workspace.join("out.pdf")).unwrap();
        fs::copy(dir.path().join("secret"), workspace.join("out.pdf")).unwrap();
        assert_eq!(
            read_workspace_bytes(&workspace, Path::new("out.pdf"), 1024),
            Ok(b"host secret".to_vec()),
            "a copy of its own is read"
        );
    }

    #[test]
    fn a_tree_is_sized_without_following_symlinks_and_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        let inbox = Path::new("inbox");
        fs::create_dir_all(&workspace).unwrap();
        assert_eq!(tree_size(&workspace, inbox, 100, 4), Ok(Some(0)));
        fs::create_dir_all(workspace.join("inbox/tg/1")).unwrap();
        fs::create_dir_all(workspace.join("inbox/dc/2")).unwrap();
        fs::write(workspace.join("inbox/tg/1/a"), [0; 10]).unwrap();
        fs::write(workspace.join("inbox/dc/2/b"), [0; 5]).unwrap();
        let sparse = fs::File::create(workspace.join("inbox/tg/1/sparse")).unwrap();
        sparse.set_len(1_000_000).unwrap();
        fs::write(dir.path().join("host"), [0; 1000]).unwrap();
        std::os::unix::fs::symlink(dir.path().join("host"), workspace.join("inbox/link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), workspace.join("inbox/tg/up")).unwrap();
        assert_eq!(tree_size(&workspace, inbox, 100, 4), Ok(Some(1_000_015)));
        assert_eq!(
            tree_size(&workspace, inbox, 8, 4),
            Ok(None),
            "too many entries"
        );
        assert_eq!(tree_size(&workspace, inbox, 9, 4), Ok(Some(1_000_015)));
        assert_eq!(tree_size(&workspace, inbox, 100, 1), Ok(None), "too deep");
        assert_eq!(tree_size(&workspace, inbox, 100, 2), Ok(Some(1_000_015)));
        fs::remove_dir_all(workspace.join("inbox")).unwrap();
        std::os::unix::fs::symlink(dir.path(), workspace.join("inbox")).unwrap();
        assert_eq!(
            tree_size(&workspace, inbox, 100, 4),
            Err(FileRefusal::Symlink)
        );
    }

    #[test]
    fn long_files_are_cut_at_the_limit_on_a_character_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{}é{}", "a".repeat(65_535), "b".repeat(10));
        fs::write(dir.path().join("big.md"), &text).unwrap();
        let read = read_workspace_file(dir.path(), Path::new("big.md"))
            .unwrap()
            .unwrap();
        assert_eq!(read.text, "a".repeat(65_535));
        assert_eq!(read.cut_from, Some(text.len() as u64));
    }

    #[test]
    fn whole_files_are_refused_past_their_limit_and_fifos_never_block() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("ok.yml"), "a: 1\n").unwrap();
        fs::write(dir.path().join("big.yml"), "x".repeat(2049)).unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("fifo.yml"),
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yml")).unwrap();
        let read = |name: &str| read_workspace_text(dir.path(), Path::new(name), 2048);
        assert_eq!(read("ok.yml"), Ok(Some("a: 1\n".into())));
        assert_eq!(read("none.yml"), Ok(None));
        assert_eq!(
            read("big.yml").unwrap_err().to_string(),
            "workspace/big.yml: is 2049 bytes, larger than the limit of 2 KiB\n  fix: make it smaller"
        );
        assert!(
            read("fifo.yml")
                .unwrap_err()
                .to_string()
                .starts_with("workspace/fifo.yml: is not a regular file")
        );
        assert!(
            read("zero.yml")
                .unwrap_err()
                .to_string()
                .starts_with("workspace/zero.yml: is a symlink")
        );
        let stamp = |name: &str| workspace_file_stamp(dir.path(), Path::new(name)).unwrap();
        assert_eq!(stamp("none.yml"), None);
        let before = stamp("ok.yml");
        assert!(before.is_some() && stamp("fifo.yml").is_some());
        assert_eq!(stamp("ok.yml"), before);
        fs::write(dir.path().join("ok.yml"), "a: 22\n").unwrap();
        assert_ne!(stamp("ok.yml"), before, "a rewrite changes the stamp");
        let just_written = stamp("ok.yml").unwrap();
        assert!(!just_written.is_settled(std::time::SystemTime::now()));
        assert!(
            just_written
                .is_settled(std::time::SystemTime::now() + std::time::Duration::from_secs(3))
        );
    }
}
