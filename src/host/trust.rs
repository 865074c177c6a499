//! Root never executes, follows or writes through a path another user can change: what `lstat`
//! says about a path and its ancestors, judged by [`perch_core::trust::verdict`].

use perch_core::trust::{Link, LinkKind, verdict};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Why `path` is not root's alone when this process runs as root; `None` when it is, or when
/// this process is not root (an ordinary user may run and write their own files). The part of
/// `path` that does not exist yet is not judged: root creates it, under a parent that was.
pub fn refusal_as_root(path: &Path) -> Option<String> {
    let uid = effective_uid();
    (uid == 0).then(|| untrusted(path, uid)).flatten()
}

/// Why `path` is not owned by `uid` and root alone ([`perch_core::trust`]); `None` when it is.
pub fn untrusted(path: &Path, uid: u32) -> Option<String> {
    match chain(path) {
        Ok(chain) => verdict(&chain, uid),
        Err(error) => Some(format!("{} cannot be checked: {error}", path.display())),
    }
}

/// `lstat` of `/` and of each component of `path` in turn, up to the first one that does not
/// exist.
fn chain(path: &Path) -> io::Result<Vec<Link>> {
    let absolute = std::path::absolute(path)?;
    let mut links = Vec::new();
    let mut walked = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                return Err(io::Error::other("the path goes up with `..`"));
            }
            Component::CurDir => continue,
            other => walked.push(other),
        }
        let meta = match std::fs::symlink_metadata(&walked) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => break,
            Err(error) => return Err(error),
        };
        let kind = if meta.file_type().is_symlink() {
            LinkKind::Symlink
        } else if meta.is_dir() {
            LinkKind::Directory
        } else {
            LinkKind::Other
        };
        links.push(Link {
            path: walked.display().to_string(),
            uid: meta.uid(),
            mode: meta.permissions().mode() & 0o7777,
            kind,
        });
    }
    Ok(links)
}
