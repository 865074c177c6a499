//! Whether a path is root's alone: the rule behind "root never executes, follows or writes
//! through a path another user can change". The shell collects what `lstat` says about the path
//! and each of its ancestors ([`Link`]); [`verdict`] decides.
//!
//! A path is trusted by a user `uid` when the path itself and every directory above it are
//! owned by `uid` or by root, none of them can be written by a group or by others, and no link
//! on the way is a symbolic link (so what was checked is what is used). A world-writable
//! directory with the sticky bit (`/tmp`) is allowed above an entry owned by root or `uid`
//! (which the next link's own check requires), since only the entry's owner can rename or
//! remove it there.

/// What `lstat` says about one component of a path, outermost (`/`) first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The path up to and including this component, for the message.
    pub path: String,
    pub uid: u32,
    /// The permission bits with the sticky bit (`st_mode & 0o7777`).
    pub mode: u32,
    pub kind: LinkKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    Directory,
    Symlink,
    /// A regular file, a socket or anything else that is not a directory or a symlink.
    Other,
}

const STICKY: u32 = 0o1000;
const GROUP_OR_OTHER_WRITE: u32 = 0o022;

/// Why a path is not `uid`'s and root's alone, naming the component; `None` when it is.
/// `chain` runs from `/` to the path itself.
pub fn verdict(chain: &[Link], uid: u32) -> Option<String> {
    let trusted_owner = |owner: u32| owner == 0 || owner == uid;
    for (index, link) in chain.iter().enumerate() {
        if link.kind == LinkKind::Symlink {
            return Some(format!("{} is a symbolic link", link.path));
        }
        if !trusted_owner(link.uid) {
            return Some(format!(
                "{} is owned by uid {}, who could replace what is under it",
                link.path, link.uid
            ));
        }
        if index + 1 < chain.len() && link.kind != LinkKind::Directory {
            return Some(format!("{} is not a directory", link.path));
        }
        if link.mode & GROUP_OR_OTHER_WRITE != 0 {
            let sticky_above_the_next = link.kind == LinkKind::Directory
                && link.mode & STICKY != 0
                && index + 1 < chain.len();
            if !sticky_above_the_next {
                return Some(format!(
                    "{} is writable by its group or by others (mode {:04o})",
                    link.path, link.mode
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &str, uid: u32, mode: u32) -> Link {
        Link {
            path: path.to_owned(),
            uid,
            mode,
            kind: LinkKind::Directory,
        }
    }

    fn file(path: &str, uid: u32, mode: u32) -> Link {
        Link {
            path: path.to_owned(),
            uid,
            mode,
            kind: LinkKind::Other,
        }
    }

    #[test]
    fn verdicts() {
        let root = dir("/", 0, 0o755);
        let lib = dir("/usr/local/lib/perch", 0, 0o755);
        let msb = file("/usr/local/lib/perch/bin/msb", 0, 0o755);
        let cases: Vec<(&str, Vec<Link>, u32, Option<&str>)> = vec![
            (
                "root's all the way",
                vec![root.clone(), lib.clone(), msb.clone()],
                0,
                None,
            ),
            (
                "a directory owned by the service user",
                vec![
                    root.clone(),
                    dir("/var/lib/perch/msb", 998, 0o700),
                    file("/var/lib/perch/msb/bin/msb", 0, 0o755),
                ],
                0,
                Some("/var/lib/perch/msb is owned by uid 998"),
            ),
            (
                "a file owned by the service user",
                vec![
                    root.clone(),
                    lib.clone(),
                    file("/usr/local/lib/perch/bin/msb", 998, 0o755),
                ],
                0,
                Some("/usr/local/lib/perch/bin/msb is owned by uid 998"),
            ),
            (
                "a group-writable directory",
                vec![root.clone(), dir("/opt", 0, 0o775), msb.clone()],
                0,
                Some("/opt is writable by its group or by others (mode 0775)"),
            ),
            (
                "a world-writable file",
                vec![
                    root.clone(),
                    lib,
                    file("/usr/local/lib/perch/bin/msb", 0, 0o757),
                ],
                0,
                Some("writable by its group or by others (mode 0757)"),
            ),
            (
                "a symbolic link on the way",
                vec![
                    root.clone(),
                    Link {
                        path: "/var/lib/perch/cache/images/k/rootfs".into(),
                        uid: 0,
                        mode: 0o777,
                        kind: LinkKind::Symlink,
                    },
                ],
                0,
                Some("rootfs is a symbolic link"),
            ),
            (
                "/tmp's sticky bit above root's own directory",
                vec![
                    root.clone(),
                    dir("/tmp", 0, 0o1777),
                    dir("/tmp/.tmpAB", 0, 0o700),
                ],
                0,
                None,
            ),
            (
                "/tmp's sticky bit above someone else's directory",
                vec![
                    root.clone(),
                    dir("/tmp", 0, 0o1777),
                    dir("/tmp/.tmpAB", 65534, 0o700),
                ],
                0,
                Some("/tmp/.tmpAB is owned by uid 65534"),
            ),
            (
                "a world-writable directory without the sticky bit",
                vec![
                    root.clone(),
                    dir("/srv", 0, 0o777),
                    dir("/srv/cache", 0, 0o700),
                ],
                0,
                Some("/srv is writable"),
            ),
            (
                "an ordinary user trusts their own files",
                vec![
                    root.clone(),
                    dir("/home/ann", 1000, 0o750),
                    file("/home/ann/msb", 1000, 0o755),
                ],
                1000,
                None,
            ),
            (
                "a file in the middle of the path",
                vec![root, file("/etc/passwd", 0, 0o644), msb],
                0,
                Some("/etc/passwd is not a directory"),
            ),
        ];
        for (name, chain, uid, expected) in cases {
            let got = verdict(&chain, uid);
            match expected {
                None => assert_eq!(got, None, "{name}"),
                Some(part) => assert!(
                    got.as_deref().is_some_and(|got| got.contains(part)),
                    "{name}: {got:?} does not contain {part:?}"
                ),
            }
        }
    }
}
