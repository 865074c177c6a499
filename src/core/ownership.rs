//! Which files a change of owner may take, decided one directory entry at a time: the walk that
//! gives an agent's files from one service user to another (`perch chown`, run as root by
//! `deploy/install.sh --agent` and by upgrades) runs over a tree the old user can still change,
//! so it follows no link, takes no file that is also reachable from elsewhere, and leaves alone
//! what the old user does not own.

use std::fmt;

/// What kind of entry the walk found, as `fstat` on the entry itself (never followed) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    /// A regular file, a socket, a FIFO or a device node.
    File,
    SymbolicLink,
}

/// One entry, as the walk saw it through the descriptor it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub uid: u32,
    /// Its hard link count (a directory's is not a link count and is not read).
    pub links: u64,
    /// The filesystem it is on.
    pub device: u64,
}

/// Whose files the walk gives away, and where it stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    pub from_uid: u32,
    /// The filesystem of the walk's top directory: the walk does not cross mount points.
    pub device: u64,
}

/// The deepest directory the walk enters (the top is depth 0). A tree the old user built
/// deeper than this is not walked past it, so its depth cannot exhaust the walk's stack.
pub const MAX_DEPTH: usize = 64;

/// What the walk does with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Change its owner; a directory is then walked.
    Give,
    /// Leave it (and, for a directory, everything under it) as it is, and report why.
    Skip(SkipReason),
}

/// Why an entry was left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A symbolic link: whatever it points at may be anyone's.
    SymbolicLink,
    /// A file with other names, which may be outside the tree: another agent's file, or one of
    /// root's.
    HardLinked { links: u64 },
    /// Not the old user's: someone else put it there, or it was never the agent's.
    OwnedByOther { uid: u32 },
    /// On another filesystem (a mount point inside the tree).
    OtherFilesystem,
    /// A directory deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// The verdict for `entry`, `depth` directories below the top of the walk `handover`.
#[must_use]
pub fn verdict(handover: Handover, entry: Entry, depth: usize) -> Verdict {
    let skip = if entry.kind == EntryKind::SymbolicLink {
        Some(SkipReason::SymbolicLink)
    } else if entry.device != handover.device {
        Some(SkipReason::OtherFilesystem)
    } else if entry.uid != handover.from_uid {
        Some(SkipReason::OwnedByOther { uid: entry.uid })
    } else if entry.kind == EntryKind::File && entry.links > 1 {
        Some(SkipReason::HardLinked { links: entry.links })
    } else if entry.kind == EntryKind::Directory && depth > MAX_DEPTH {
        Some(SkipReason::TooDeep)
    } else {
        None
    };
    skip.map_or(Verdict::Give, Verdict::Skip)
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::SymbolicLink => write!(f, "a symbolic link, not followed"),
            SkipReason::HardLinked { links } => write!(
                f,
                "a file with {links} hard links, which may name a file outside the agent"
            ),
            SkipReason::OwnedByOther { uid } => {
                write!(f, "owned by uid {uid}, not the old service user")
            }
            SkipReason::OtherFilesystem => write!(f, "on another filesystem, not crossed"),
            SkipReason::TooDeep => write!(
                f,
                "a directory more than {MAX_DEPTH} levels down, not walked"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: u32 = 990;
    const DEV: u64 = 2049;

    fn entry(kind: EntryKind, uid: u32, links: u64, device: u64) -> Entry {
        Entry {
            kind,
            uid,
            links,
            device,
        }
    }

    #[test]
    fn each_entry_gets_one_verdict() {
        use EntryKind::{Directory, File, SymbolicLink};
        let handover = Handover {
            from_uid: OLD,
            device: DEV,
        };
        let cases = [
            (entry(File, OLD, 1, DEV), Verdict::Give),
            (entry(Directory, OLD, 7, DEV), Verdict::Give),
            (
                entry(SymbolicLink, OLD, 1, DEV),
                Verdict::Skip(SkipReason::SymbolicLink),
            ),
            (
                entry(SymbolicLink, 0, 1, 7),
                Verdict::Skip(SkipReason::SymbolicLink),
            ),
            (
                entry(File, OLD, 2, DEV),
                Verdict::Skip(SkipReason::HardLinked { links: 2 }),
            ),
            (
                entry(File, 0, 1, DEV),
                Verdict::Skip(SkipReason::OwnedByOther { uid: 0 }),
            ),
            (
                entry(Directory, 0, 2, DEV),
                Verdict::Skip(SkipReason::OwnedByOther { uid: 0 }),
            ),
            (
                entry(File, 0, 3, DEV),
                Verdict::Skip(SkipReason::OwnedByOther { uid: 0 }),
            ),
            (
                entry(Directory, OLD, 2, DEV + 1),
                Verdict::Skip(SkipReason::OtherFilesystem),
            ),
            (
                entry(File, OLD, 1, DEV + 1),
                Verdict::Skip(SkipReason::OtherFilesystem),
            ),
        ];
        for (entry, expected) in cases {
            assert_eq!(verdict(handover, entry, 1), expected, "{entry:?}");
        }
        let deep = entry(Directory, OLD, 2, DEV);
        assert_eq!(verdict(handover, deep, MAX_DEPTH), Verdict::Give);
        assert_eq!(
            verdict(handover, deep, MAX_DEPTH + 1),
            Verdict::Skip(SkipReason::TooDeep)
        );
        let file = entry(File, OLD, 1, DEV);
        assert_eq!(verdict(handover, file, MAX_DEPTH + 1), Verdict::Give);
    }

    #[test]
    fn reasons_read_as_sentences() {
        assert_eq!(
            SkipReason::HardLinked { links: 2 }.to_string(),
            "a file with 2 hard links, which may name a file outside the agent"
        );
        assert_eq!(
            SkipReason::OwnedByOther { uid: 0 }.to_string(),
            "owned by uid 0, not the old service user"
        );
    }
}
