//! Files in chat messages, both ways. Inbound: what an attachment is (a reference the platform
//! gave, never its bytes), the name and directory it is saved under in the workspace, and the
//! line that tells the agent about it. Outbound: the `attach: <path>` lines of a reply, the
//! workspace path each names, and the note a reply gets for a file it could not carry.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// The largest file perch saves or sends, in bytes (25 MB: under every platform's limit for
/// bots, Discord's 25 MiB, Telegram's 20 MB for downloads and 50 MB for uploads aside).
pub const FILE_LIMIT: u64 = 25_000_000;
/// The most bytes of files one message may carry, either way.
pub const MESSAGE_LIMIT: u64 = 25_000_000;
/// The most files one reply may attach (Discord's limit per message).
pub const MAX_REPLY_FILES: usize = 10;
/// The longest saved file name, in bytes.
pub const NAME_LIMIT: usize = 100;
/// Where inbound files go, relative to the workspace.
pub const INBOX_DIR: &str = "inbox";
/// The most bytes of files `workspace/inbox/` may hold for perch to save another there: every
/// regular file under it counts, whoever wrote it (ten files at [`FILE_LIMIT`]).
pub const INBOX_LIMIT: u64 = 250_000_000;
/// The most entries perch counts under `workspace/inbox/`; past them it saves nothing there.
pub const INBOX_ENTRY_LIMIT: usize = 100_000;
/// The deepest perch looks under `workspace/inbox/` (its own files are three levels down); a
/// deeper directory is not counted, so perch saves nothing there.
pub const INBOX_DEPTH_LIMIT: usize = 16;

/// One file attached to an inbound message, as a reference the connector can fetch again:
/// never the bytes, never a credential or a URL that embeds one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The platform's reference: a Telegram file id, a Discord attachment URL, a Matrix `mxc://`
    /// URI.
    pub source: String,
    /// The file name the sender gave, as given (unsafe until [`safe_file_name`] made it safe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The MIME type the platform reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The size in bytes the platform reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Matrix: the file is encrypted; its key stays in the event, which the connector fetches
    /// again, so it never reaches a journal.
    #[serde(default, skip_serializing_if = "is_false")]
    pub encrypted: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// A workspace file a reply carries: which file (the outbox journals this, not the bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundFile {
    /// Relative to the workspace, such as `notes/report.pdf`.
    pub path: String,
    /// The file name shown on the platform.
    pub name: String,
}

/// Why a file was not saved or not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRefusal {
    /// Larger than [`FILE_LIMIT`]; the size when known.
    TooLarge {
        size: Option<u64>,
    },
    /// The message's files together pass [`MESSAGE_LIMIT`].
    MessageTooLarge,
    /// A reply names more than [`MAX_REPLY_FILES`] files.
    TooMany,
    /// The path leads outside the workspace.
    Outside,
    NotFound,
    /// A symlink is on the path: perch follows none in the workspace.
    Symlink,
    NotAFile,
    /// A regular file with this many links: it may be a file outside the workspace too, so
    /// perch neither reads nor sends it.
    HardLinked(u64),
    /// `workspace/inbox/` holds this many bytes, and the file would take it past
    /// [`INBOX_LIMIT`]; `None` when it holds more than [`INBOX_ENTRY_LIMIT`] entries or nests
    /// deeper than [`INBOX_DEPTH_LIMIT`] levels, and was not counted.
    InboxFull {
        used: Option<u64>,
    },
    /// Anything else (a failed download, an unreadable file), said in a few words.
    Failed(String),
}

impl fmt::Display for FileRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = human_size(FILE_LIMIT);
        match self {
            FileRefusal::TooLarge { size: Some(size) } => {
                write!(f, "{} is larger than the {limit} limit", human_size(*size))
            }
            FileRefusal::TooLarge { size: None } => write!(f, "larger than the {limit} limit"),
            FileRefusal::MessageTooLarge => write!(
                f,
                "the files of one message may total at most {}",
                human_size(MESSAGE_LIMIT)
            ),
            FileRefusal::TooMany => {
                write!(f, "one reply may attach at most {MAX_REPLY_FILES} files")
            }
            FileRefusal::Outside => f.write_str("it is outside /workspace"),
            FileRefusal::NotFound => f.write_str("no such file"),
            FileRefusal::Symlink => f.write_str("a symlink is in the way"),
            FileRefusal::NotAFile => f.write_str("not a regular file"),
            FileRefusal::HardLinked(links) => write!(
                f,
                "it has {links} hard links, and perch reads no workspace file linked from elsewhere"
            ),
            FileRefusal::InboxFull { used: Some(used) } => write!(
                f,
                "/workspace/inbox holds {} and may hold at most {}; delete files there to make room",
                human_size(*used),
                human_size(INBOX_LIMIT)
            ),
            FileRefusal::InboxFull { used: None } => write!(
                f,
                "/workspace/inbox holds more than {INBOX_ENTRY_LIMIT} entries or nests deeper than \
                 {INBOX_DEPTH_LIMIT} levels; delete files there to make room"
            ),
            FileRefusal::Failed(why) => f.write_str(why),
        }
    }
}

/// A file name safe to create in a directory perch owns: the last component of `name` (a sender
/// can write `../../etc/passwd`), without invisible format characters (bidi overrides and
/// isolates, zero-width characters), without control characters (NUL included), separators or
/// characters file systems refuse, without leading dots (no hidden files) or leading dashes,
/// at most [`NAME_LIMIT`] bytes with its extension kept. A name with nothing left becomes
/// `image`, `audio`, `video` or `file`, with the extension of `content_type` when known.
pub fn safe_file_name(name: Option<&str>, content_type: Option<&str>) -> String {
    let last = name
        .unwrap_or_default()
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or_default();
    let cleaned: String = last
        .chars()
        .filter(|ch| !crate::terminal::is_invisible_format(*ch))
        .map(|ch| {
            if ch.is_control() || matches!(ch, ':' | '*' | '?' | '"' | '<' | '>' | '|') {
                '_'
            } else {
                ch
            }
        })
        .collect();
    let trimmed = cleaned
        .trim_start_matches(|ch: char| ch.is_whitespace() || ch == '.' || ch == '-')
        .trim_end_matches(|ch: char| ch.is_whitespace() || ch == '.');
    if trimmed.chars().all(|ch| ch == '_') {
        return fallback_name(content_type);
    }
    shorten(trimmed, NAME_LIMIT)
}

fn fallback_name(content_type: Option<&str>) -> String {
    let essence = content_type
        .map(|kind| {
            kind.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let stem = match essence.split('/').next().unwrap_or_default() {
        "image" => "image",
        "audio" => "audio",
        "video" => "video",
        _ => "file",
    };
    match extension_for(&essence) {
        Some(extension) => format!("{stem}.{extension}"),
        None => stem.to_owned(),
    }
}

/// `name` cut to at most `limit` bytes on a character boundary, keeping a short extension.
fn shorten(name: &str, limit: usize) -> String {
    if name.len() <= limit {
        return name.to_owned();
    }
    let (stem, extension) = match name.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() && extension.len() <= 16 => {
            (stem, format!(".{extension}"))
        }
        _ => (name, String::new()),
    };
    let room = limit.saturating_sub(extension.len());
    let mut end = room.min(stem.len());
    while !stem.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{extension}", &stem[..end])
}

/// The names `attachments` are saved under: [`safe_file_name`] of each, made unique within the
/// message (`a.txt`, `a-2.txt`).
pub fn saved_names(attachments: &[Attachment]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(attachments.len());
    for attachment in attachments {
        let base = safe_file_name(
            attachment.name.as_deref(),
            attachment.content_type.as_deref(),
        );
        let mut name = base.clone();
        let mut n = 2;
        while names.iter().any(|taken| taken == &name) {
            name = match base.rsplit_once('.') {
                Some((stem, extension)) => format!("{stem}-{n}.{extension}"),
                None => format!("{base}-{n}"),
            };
            n += 1;
        }
        names.push(name);
    }
    names
}

/// The directory, relative to the workspace, where the files of the message `platform_id` on
/// `channel` are saved: `inbox/<channel>/<id>`, with every character of the id that is not a
/// letter, digit, `-`, `_` or `.` replaced, and then a short hash of the id, so that two ids
/// never share a directory.
pub fn inbox_dir(channel: &str, platform_id: &str) -> String {
    let clean = |text: &str, keep_dot: bool| -> String {
        let replaced: String = text
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || (keep_dot && ch == '.') {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        replaced.trim_start_matches('.').chars().take(64).collect()
    };
    let channel = match clean(channel, false) {
        empty if empty.is_empty() => "channel".to_owned(),
        channel => channel,
    };
    let id = clean(platform_id, true);
    let id = if id == platform_id && !id.is_empty() {
        id
    } else {
        let digest = Sha256::digest(platform_id.as_bytes());
        let hash: String = digest[..4]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        if id.is_empty() {
            format!("event-{hash}")
        } else {
            format!("{id}-{hash}")
        }
    };
    format!("{INBOX_DIR}/{channel}/{id}")
}

/// How many bytes the next attachment may have, and which bound that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadLimit {
    pub bytes: u64,
    bound: Bound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    File,
    Message,
    Inbox { used: u64 },
}

impl DownloadLimit {
    /// Why a file of `size` bytes (when known), larger than [`DownloadLimit::bytes`], is refused.
    pub fn refusal(&self, size: Option<u64>) -> FileRefusal {
        match self.bound {
            Bound::File => FileRefusal::TooLarge { size },
            Bound::Message => FileRefusal::MessageTooLarge,
            Bound::Inbox { used } => FileRefusal::InboxFull { used: Some(used) },
        }
    }
}

/// How many bytes the next attachment may have, given its declared size, what is left of the
/// message's budget and how much `workspace/inbox/` holds (`None`: too much to count); a
/// refusal when the declared size is already too much.
pub fn download_limit(
    declared: Option<u64>,
    remaining: u64,
    inbox_used: Option<u64>,
) -> Result<DownloadLimit, FileRefusal> {
    let Some(used) = inbox_used else {
        return Err(FileRefusal::InboxFull { used: None });
    };
    let room = INBOX_LIMIT.saturating_sub(used);
    match declared {
        Some(size) if size > FILE_LIMIT => Err(FileRefusal::TooLarge { size: Some(size) }),
        Some(size) if size > remaining => Err(FileRefusal::MessageTooLarge),
        _ if remaining == 0 => Err(FileRefusal::MessageTooLarge),
        Some(size) if size > room => Err(FileRefusal::InboxFull { used: Some(used) }),
        _ if room == 0 => Err(FileRefusal::InboxFull { used: Some(used) }),
        _ => {
            let (bytes, bound) = [
                (FILE_LIMIT, Bound::File),
                (remaining, Bound::Message),
                (room, Bound::Inbox { used }),
            ]
            .into_iter()
            .min_by_key(|(bytes, _)| *bytes)
            .unwrap_or((FILE_LIMIT, Bound::File));
            Ok(DownloadLimit { bytes, bound })
        }
    }
}

/// Whether a fetched file of `size` bytes may be saved now that `workspace/inbox/` holds
/// `inbox_used` bytes (`None`: too much to count).
pub fn inbox_has_room(inbox_used: Option<u64>, size: u64) -> Result<(), FileRefusal> {
    match inbox_used {
        Some(used) if used.saturating_add(size) <= INBOX_LIMIT => Ok(()),
        used => Err(FileRefusal::InboxFull { used }),
    }
}

/// The line the agent reads for a saved attachment:
/// `[attachment: /workspace/inbox/tg/7/report.pdf (application/pdf, 12 kB)]`.
pub fn attachment_line(guest_path: &str, content_type: Option<&str>, size: u64) -> String {
    match content_type {
        Some(kind) => format!(
            "[attachment: {guest_path} ({}, {})]",
            one_line(kind),
            human_size(size)
        ),
        None => format!("[attachment: {guest_path} ({})]", human_size(size)),
    }
}

/// The line the agent reads for an attachment that was not saved, with why.
pub fn unsaved_line(name: &str, attachment: &Attachment, why: &FileRefusal) -> String {
    let mut facts = Vec::new();
    if let Some(kind) = &attachment.content_type {
        facts.push(one_line(kind));
    }
    if let Some(size) = attachment.size {
        facts.push(human_size(size));
    }
    let facts = if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join(", "))
    };
    format!("[attachment not saved: {name}{facts}: {why}]")
}

/// `text` followed by `lines`, one per line: the message as the agent reads it.
pub fn with_lines(text: &str, lines: &[String]) -> String {
    followed_by(text, lines, "\n")
}

/// `text`, `gap`, then `lines`, one per line: `text` alone when there are no lines, the lines
/// alone when `text` is blank.
pub fn followed_by(text: &str, lines: &[String], gap: &str) -> String {
    if lines.is_empty() {
        return text.to_owned();
    }
    let lines = lines.join("\n");
    if text.trim().is_empty() {
        lines
    } else {
        format!("{text}{gap}{lines}")
    }
}

/// A size for people: `512 bytes`, `12 kB`, `3.4 MB` (powers of 1000).
pub fn human_size(bytes: u64) -> String {
    match bytes {
        1 => "1 byte".to_owned(),
        0..1000 => format!("{bytes} bytes"),
        1000..999_500 => format!("{} kB", (bytes + 500) / 1000),
        _ => {
            let tenths = (bytes + 50_000) / 100_000;
            if tenths.is_multiple_of(10) || tenths >= 1000 {
                format!("{} MB", (bytes + 500_000) / 1_000_000)
            } else {
                format!("{}.{} MB", tenths / 10, tenths % 10)
            }
        }
    }
}

/// A reply with its `attach:` lines taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyFiles {
    /// The reply without those lines.
    pub text: String,
    /// The path each line named, as written, in order.
    pub paths: Vec<String>,
}

/// Takes every `attach: <path>` line out of `reply`: a line on its own (leading spaces allowed,
/// `attach` in any case), outside fenced code blocks, whose path may be wrapped in backticks,
/// quotes or angle brackets. A blank line left doubled by a removed line is dropped; other text
/// is kept as written.
pub fn take_attach_lines(reply: &str) -> ReplyFiles {
    let mut kept: Vec<&str> = Vec::new();
    let mut paths = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    let mut removed = false;
    for line in reply.lines() {
        let trimmed = line.trim_start();
        let opens = fence_marker(trimmed);
        match (fence, opens) {
            (Some((ch, len)), Some((found, found_len))) if found == ch && found_len >= len => {
                fence = None;
            }
            (None, Some(marker)) => fence = Some(marker),
            _ => {}
        }
        if fence.is_none()
            && opens.is_none()
            && let Some(path) = attach_path(trimmed)
        {
            paths.push(path);
            removed = true;
            continue;
        }
        let blank = line.trim().is_empty();
        if blank && removed && kept.last().is_none_or(|last| last.trim().is_empty()) {
            continue;
        }
        if !blank {
            removed = false;
        }
        kept.push(line);
    }
    if paths.is_empty() {
        return ReplyFiles {
            text: reply.to_owned(),
            paths,
        };
    }
    ReplyFiles {
        text: kept.join("\n").trim_end().to_owned(),
        paths,
    }
}

fn fence_marker(line: &str) -> Option<(char, usize)> {
    let ch = line.chars().next().filter(|ch| *ch == '`' || *ch == '~')?;
    let len = line.chars().take_while(|found| *found == ch).count();
    (len >= 3).then_some((ch, len))
}

fn attach_path(line: &str) -> Option<String> {
    let (word, rest) = line.split_once(':')?;
    if !word.eq_ignore_ascii_case("attach") {
        return None;
    }
    let path = rest.trim();
    let path = [('`', '`'), ('"', '"'), ('\'', '\''), ('<', '>')]
        .iter()
        .find_map(|(open, close)| {
            path.strip_prefix(*open)
                .and_then(|inner| inner.strip_suffix(*close))
        })
        .unwrap_or(path)
        .trim();
    (!path.is_empty()).then(|| path.to_owned())
}

/// The workspace-relative path a reply's `attach:` line names: relative to the workspace, or
/// absolute under `guest_root` (`/workspace`). `.` components are dropped; `..` anywhere, a
/// path outside `guest_root`, or one that names no file is [`FileRefusal::Outside`].
pub fn workspace_path(written: &str, guest_root: &str) -> Result<String, FileRefusal> {
    let root = guest_root.trim_end_matches('/');
    let relative = if written.starts_with('/') {
        match written.strip_prefix(root) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return Err(FileRefusal::Outside),
        }
    } else {
        written
    };
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(FileRefusal::Outside),
            part if part.contains('\0') => return Err(FileRefusal::NotFound),
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        return Err(FileRefusal::NotAFile);
    }
    Ok(parts.join("/"))
}

/// The note a reply gets for a file it could not carry: `(could not attach notes/x.pdf: no such
/// file)`.
pub fn could_not_attach(written: &str, why: &FileRefusal) -> String {
    format!("(could not attach {}: {why})", one_line(written))
}

/// The MIME type for a file name's extension; `application/octet-stream` when unknown.
pub fn content_type_for(name: &str) -> &'static str {
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension.to_ascii_lowercase())
        .unwrap_or_default();
    TYPES
        .iter()
        .find(|(known, _)| *known == extension)
        .map_or("application/octet-stream", |(_, kind)| kind)
}

fn extension_for(content_type: &str) -> Option<&'static str> {
    TYPES
        .iter()
        .find(|(_, kind)| *kind == content_type)
        .map(|(extension, _)| *extension)
}

/// Extensions and their MIME types; the first extension of a type is the one a nameless file
/// of that type gets.
const TYPES: &[(&str, &str)] = &[
    ("txt", "text/plain"),
    ("log", "text/plain"),
    ("md", "text/markdown"),
    ("csv", "text/csv"),
    ("html", "text/html"),
    ("json", "application/json"),
    ("yaml", "application/yaml"),
    ("yml", "application/yaml"),
    ("pdf", "application/pdf"),
    ("zip", "application/zip"),
    ("gz", "application/gzip"),
    ("tar", "application/x-tar"),
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("svg", "image/svg+xml"),
    ("mp3", "audio/mpeg"),
    ("ogg", "audio/ogg"),
    ("oga", "audio/ogg"),
    ("wav", "audio/wav"),
    ("m4a", "audio/mp4"),
    ("mp4", "video/mp4"),
    ("webm", "video/webm"),
    ("mov", "video/quicktime"),
];

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(name: Option<&str>, content_type: Option<&str>) -> Attachment {
        Attachment {
            source: "x".into(),
            name: name.map(str::to_owned),
            content_type: content_type.map(str::to_owned),
            size: None,
            encrypted: false,
        }
    }

    #[test]
    fn hostile_names_become_safe_names() {
        let cases = [
            (Some("report.pdf"), None, "report.pdf"),
            (Some("../../etc/passwd"), None, "passwd"),
            (Some("..\\..\\boot.ini"), None, "boot.ini"),
            (Some(".bashrc"), None, "bashrc"),
            (Some("..."), Some("text/plain"), "file.txt"),
            (Some(".."), None, "file"),
            (Some("a/b/c.txt"), None, "c.txt"),
            (Some("dir/"), Some("image/png"), "image.png"),
            (Some("nul\0byte.txt"), None, "nul_byte.txt"),
            (Some("line\nbreak.txt"), None, "line_break.txt"),
            (Some("-rf .txt"), None, "rf .txt"),
            (Some("  spaced  "), None, "spaced"),
            (Some("what?.txt"), None, "what_.txt"),
            (Some("\0"), None, "file"),
            (Some("ünïcødé 文件.md"), None, "ünïcødé 文件.md"),
            (Some("invoice\u{202e}fdp.exe"), None, "invoicefdp.exe"),
            (Some("a\u{2066}b\u{2069}\u{200f}.txt"), None, "ab.txt"),
            (Some("zero\u{200b}\u{feff}width.txt"), None, "zerowidth.txt"),
            (Some("\u{202e}\u{2067}"), Some("image/png"), "image.png"),
            (Some(".\u{200b}.hidden"), None, "hidden"),
            (Some("esc\u{1b}[2J.txt"), None, "esc_[2J.txt"),
            (Some("c1\u{9b}.txt"), None, "c1_.txt"),
            (None, Some("image/jpeg"), "image.jpg"),
            (None, Some("audio/ogg; codecs=opus"), "audio.ogg"),
            (None, Some("video/mp4"), "video.mp4"),
            (None, Some("application/x-unknown"), "file"),
            (None, None, "file"),
        ];
        for (name, content_type, expected) in cases {
            assert_eq!(safe_file_name(name, content_type), expected, "{name:?}");
        }
    }

    #[test]
    fn long_names_are_cut_keeping_the_extension() {
        let long = format!("{}.pdf", "a".repeat(300));
        let safe = safe_file_name(Some(&long), None);
        assert_eq!(safe.len(), NAME_LIMIT);
        assert!(safe.ends_with("a.pdf"));
        let wide = "é".repeat(200);
        let safe = safe_file_name(Some(&wide), None);
        assert!(safe.len() <= NAME_LIMIT);
        assert_eq!(safe, "é".repeat(NAME_LIMIT / 2));
        let odd_extension = format!("{}.{}", "b".repeat(50), "c".repeat(100));
        assert_eq!(safe_file_name(Some(&odd_extension), None).len(), NAME_LIMIT);
    }

    #[test]
    fn names_are_unique_within_a_message() {
        let names = saved_names(&[
            attachment(Some("a.txt"), None),
            attachment(Some("../a.txt"), None),
            attachment(None, Some("image/png")),
            attachment(None, Some("image/png")),
            attachment(Some("a.txt"), None),
            attachment(Some("README"), None),
            attachment(Some("README"), None),
        ]);
        assert_eq!(
            names,
            [
                "a.txt",
                "a-2.txt",
                "image.png",
                "image-2.png",
                "a-3.txt",
                "README",
                "README-2"
            ]
        );
    }

    #[test]
    fn inbox_directories_are_safe_and_distinct() {
        assert_eq!(inbox_dir("dc", "1234567890"), "inbox/dc/1234567890");
        let telegram = inbox_dir("tg", "-100123:45");
        assert!(telegram.starts_with("inbox/tg/-100123_45-"), "{telegram}");
        assert_ne!(telegram, inbox_dir("tg", "-100123_45"));
        let matrix = inbox_dir("mx", "$Ab/c+d:example.org");
        assert!(
            matrix.starts_with("inbox/mx/_Ab_c_d_example.org-"),
            "{matrix}"
        );
        let hidden = inbox_dir("mx", "../..");
        assert!(hidden.starts_with("inbox/mx/_..-"), "{hidden}");
        assert!(!hidden.contains("/.."), "{hidden}");
        assert!(inbox_dir("x", "").starts_with("inbox/x/event-"));
        let long = inbox_dir("x", &"9".repeat(200));
        assert!(long.len() < 100, "{long}");
    }

    #[test]
    fn download_limits_follow_declared_sizes_and_the_budget() {
        let empty = Some(0);
        let bytes = |limit: Result<DownloadLimit, FileRefusal>| limit.map(|limit| limit.bytes);
        assert_eq!(
            bytes(download_limit(None, MESSAGE_LIMIT, empty)),
            Ok(FILE_LIMIT)
        );
        assert_eq!(bytes(download_limit(Some(10), 100, empty)), Ok(100));
        assert_eq!(
            download_limit(Some(FILE_LIMIT + 1), MESSAGE_LIMIT, empty),
            Err(FileRefusal::TooLarge {
                size: Some(FILE_LIMIT + 1)
            })
        );
        assert_eq!(
            download_limit(Some(101), 100, empty),
            Err(FileRefusal::MessageTooLarge)
        );
        assert_eq!(
            download_limit(None, 0, empty),
            Err(FileRefusal::MessageTooLarge)
        );
        let limit = download_limit(None, MESSAGE_LIMIT, empty).unwrap();
        assert_eq!(
            limit.refusal(Some(7)),
            FileRefusal::TooLarge { size: Some(7) }
        );
        let limit = download_limit(None, 100, empty).unwrap();
        assert_eq!(limit.refusal(Some(101)), FileRefusal::MessageTooLarge);
    }

    #[test]
    fn the_inbox_total_bounds_every_download_and_save() {
        let used = INBOX_LIMIT - 50;
        let full = FileRefusal::InboxFull { used: Some(used) };
        let limit = download_limit(None, MESSAGE_LIMIT, Some(used)).unwrap();
        assert_eq!(limit.bytes, 50);
        assert_eq!(limit.refusal(Some(51)), full);
        assert_eq!(
            download_limit(Some(51), MESSAGE_LIMIT, Some(used)),
            Err(full.clone())
        );
        assert_eq!(
            download_limit(Some(50), MESSAGE_LIMIT, Some(used)).map(|limit| limit.bytes),
            Ok(50)
        );
        assert_eq!(
            download_limit(None, MESSAGE_LIMIT, Some(INBOX_LIMIT + 1)),
            Err(FileRefusal::InboxFull {
                used: Some(INBOX_LIMIT + 1)
            })
        );
        assert_eq!(
            download_limit(Some(1), MESSAGE_LIMIT, None),
            Err(FileRefusal::InboxFull { used: None })
        );
        assert_eq!(
            download_limit(Some(FILE_LIMIT + 1), MESSAGE_LIMIT, Some(used)),
            Err(FileRefusal::TooLarge {
                size: Some(FILE_LIMIT + 1)
            }),
            "a file too large for any inbox says so"
        );
        assert_eq!(inbox_has_room(Some(used), 50), Ok(()));
        assert_eq!(inbox_has_room(Some(used), 51), Err(full.clone()));
        assert_eq!(
            inbox_has_room(None, 1),
            Err(FileRefusal::InboxFull { used: None })
        );
        assert_eq!(
            full.to_string(),
            "/workspace/inbox holds 250 MB and may hold at most 250 MB; delete files there to make room"
        );
        assert_eq!(
            FileRefusal::HardLinked(2).to_string(),
            "it has 2 hard links, and perch reads no workspace file linked from elsewhere"
        );
    }

    #[test]
    fn lines_for_the_agent() {
        assert_eq!(
            attachment_line("/workspace/inbox/tg/1/a.png", Some("image/png"), 12_345),
            "[attachment: /workspace/inbox/tg/1/a.png (image/png, 12 kB)]"
        );
        assert_eq!(
            attachment_line("/workspace/inbox/tg/1/a", None, 3),
            "[attachment: /workspace/inbox/tg/1/a (3 bytes)]"
        );
        let big = Attachment {
            size: Some(40_000_000),
            ..attachment(Some("x.pdf"), Some("application/pdf"))
        };
        assert_eq!(
            unsaved_line(
                "x.pdf",
                &big,
                &FileRefusal::TooLarge {
                    size: Some(40_000_000)
                }
            ),
            "[attachment not saved: x.pdf (application/pdf, 40 MB): 40 MB is larger than the 25 MB limit]"
        );
        assert_eq!(with_lines("", &["[a]".into()]), "[a]");
        assert_eq!(with_lines("look", &["[a]".into()]), "look\n[a]");
        assert_eq!(with_lines("look", &[]), "look");
    }

    #[test]
    fn sizes_for_people() {
        let cases = [
            (0, "0 bytes"),
            (1, "1 byte"),
            (999, "999 bytes"),
            (1000, "1 kB"),
            (12_345, "12 kB"),
            (999_499, "999 kB"),
            (999_500, "1 MB"),
            (3_400_000, "3.4 MB"),
            (25_000_000, "25 MB"),
            (123_456_789, "123 MB"),
        ];
        for (bytes, shown) in cases {
            assert_eq!(human_size(bytes), shown, "{bytes}");
        }
    }

    #[test]
    fn attach_lines_are_taken_out_of_a_reply() {
        let reply = "Here is the report.\n\nattach: notes/report.pdf\nATTACH: `/workspace/a b.png`\n  attach: \"c.txt\"\n\nThanks!";
        assert_eq!(
            take_attach_lines(reply),
            ReplyFiles {
                text: "Here is the report.\n\nThanks!".into(),
                paths: vec![
                    "notes/report.pdf".into(),
                    "/workspace/a b.png".into(),
                    "c.txt".into()
                ],
            }
        );
        let only = take_attach_lines("attach: x.pdf\n");
        assert_eq!(only.text, "");
        assert_eq!(only.paths, ["x.pdf"]);
        let fenced = "Write it like this:\n```\nattach: example.pdf\n```\n~~~~\nattach: y\n~~~\nattach: z\n~~~~\nattach: real.txt";
        let taken = take_attach_lines(fenced);
        assert_eq!(taken.paths, ["real.txt"]);
        assert_eq!(
            taken.text,
            "Write it like this:\n```\nattach: example.pdf\n```\n~~~~\nattach: y\n~~~\nattach: z\n~~~~"
        );
        for kept in [
            "attach:",
            "please attach: nothing",
            "- attach: x",
            "attachment: x",
        ] {
            assert_eq!(
                take_attach_lines(kept).paths,
                Vec::<String>::new(),
                "{kept}"
            );
            assert_eq!(take_attach_lines(kept).text, kept);
        }
    }

    #[test]
    fn attach_paths_stay_inside_the_workspace() {
        let root = "/workspace";
        let ok = [
            ("notes/x.pdf", "notes/x.pdf"),
            ("./notes//x.pdf", "notes/x.pdf"),
            ("/workspace/notes/x.pdf", "notes/x.pdf"),
            ("/workspace//a", "a"),
        ];
        for (written, expected) in ok {
            assert_eq!(workspace_path(written, root), Ok(expected.to_owned()));
        }
        for written in [
            "../agent.lua",
            "notes/../../x",
            "/etc/passwd",
            "/workspace-other/x",
            "/workspace/../x",
        ] {
            assert_eq!(
                workspace_path(written, root),
                Err(FileRefusal::Outside),
                "{written}"
            );
        }
        assert_eq!(
            workspace_path("/workspace", root),
            Err(FileRefusal::NotAFile)
        );
        assert_eq!(workspace_path(".", root), Err(FileRefusal::NotAFile));
        assert_eq!(
            could_not_attach("notes/x.pdf", &FileRefusal::NotFound),
            "(could not attach notes/x.pdf: no such file)"
        );
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type_for("a.PDF"), "application/pdf");
        assert_eq!(content_type_for("photo.jpeg"), "image/jpeg");
        assert_eq!(content_type_for("README"), "application/octet-stream");
        assert_eq!(extension_for("image/jpeg"), Some("jpg"));
    }

    #[test]
    fn old_records_without_the_new_fields_still_read() {
        let old: Attachment = serde_json::from_str(r#"{"source": "abc"}"#).unwrap();
        assert_eq!(old, attachment(None, None).with_source("abc"));
        let json = serde_json::to_string(&old).unwrap();
        assert_eq!(json, r#"{"source":"abc"}"#);
    }

    impl Attachment {
        fn with_source(mut self, source: &str) -> Attachment {
            self.source = source.into();
            self
        }
    }
}
