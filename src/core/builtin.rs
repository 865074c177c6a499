//! perch's built-in tools as the model sees them (`bash`, `read`, `write`, `edit`), and the
//! pure part of `read`: turning the lines the guest listed into one page for the model.

use crate::config::{BUILTIN_TOOLS, Param, ParamType, Replay, arguments_schema, prepare_arguments};
use serde_json::json;

/// Seconds a `bash` command may run when the call names no timeout.
pub const BASH_DEFAULT_TIMEOUT_SECS: u64 = 120;
/// The longest `timeout` a `bash` call may ask for, in seconds.
pub const BASH_MAX_TIMEOUT_SECS: u64 = 3600;
/// Lines on one `read` page when the call names no limit.
pub const READ_DEFAULT_LIMIT: u64 = 2000;
/// A longer line is cut to this many bytes, and the cut is marked.
pub const READ_LINE_BYTES: usize = 2000;
/// The most characters of file text on one `read` page (header and footer aside), so that a
/// page always reaches the model whole.
pub const READ_PAGE_CHARS: usize = 20_000;
/// In the guest's listing, follows a cut line's first [`READ_LINE_BYTES`] bytes, before the
/// line's full length in bytes.
pub const READ_CUT_MARK: u8 = 0x1f;
/// In the guest's listing, precedes the file's line count on the last line.
pub const READ_TOTAL_MARK: u8 = 0x1e;

/// One built-in tool's declaration.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltinTool {
    pub name: &'static str,
    pub description: &'static str,
    pub replay: Replay,
    pub params: Vec<Param>,
}

impl BuiltinTool {
    /// Checks a call's arguments and fills in defaults, as for a Lua tool.
    pub fn prepare_arguments(
        &self,
        arguments: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        prepare_arguments(self.name, &self.params, arguments)
    }

    /// The JSON schema of the arguments, as the model will see it.
    pub fn json_schema(&self) -> serde_json::Value {
        arguments_schema(&self.params)
    }
}

const BASH: &str = "Run a shell command with bash in your sandbox, a Linux machine in which \
/workspace (the working directory) is yours and persists. Returns the command's stdout, then its \
stderr, then a line [exit code N] when it fails. The command gets no input on stdin. It is killed \
after `timeout` seconds (default 120, at most 3600), and the result says so.";

const READ: &str = "Read a text file in your sandbox. The result starts with a header line \
[PATH: lines A-B of N], followed by those lines exactly as they are in the file (no line numbers \
are added). A page holds at most `limit` lines (default 2000) and about 20,000 characters; when \
the file goes on, a last line [M more lines: continue with offset=K] says which offset to read \
next. A line longer than 2000 bytes is cut, and the cut is marked. Relative paths start at \
/workspace. Binary files are refused: inspect them with bash.";

const WRITE: &str = "Create or overwrite a file in your sandbox with `content`, creating missing \
parent directories. Returns how many bytes were written. Relative paths start at /workspace. To \
change part of an existing file, use edit.";

const EDIT: &str = "Replace one exact piece of text in a file in your sandbox. `old_text` must \
occur in the file exactly once, character for character, whitespace and line breaks included; \
if it occurs 0 times or more than once, the file is left as it was and the error says how many \
times it occurs. Include enough surrounding lines to make it unique, and call edit once per \
change. Relative paths start at /workspace.";

fn param(name: &str, kind: ParamType, description: &str, required: bool) -> Param {
    Param {
        name: name.to_owned(),
        kind,
        description: Some(description.to_owned()),
        required,
        default: None,
        choices: None,
    }
}

/// The built-in tools, in the order of [`BUILTIN_TOOLS`].
pub fn builtin_tools() -> Vec<BuiltinTool> {
    let path = |verb: &str| {
        param(
            "path",
            ParamType::String,
            &format!("The file to {verb}; relative paths start at /workspace"),
            true,
        )
    };
    let tools = vec![
        BuiltinTool {
            name: "bash",
            description: BASH,
            replay: Replay::Never,
            params: vec![
                param(
                    "command",
                    ParamType::String,
                    "The command, run by bash -c in /workspace",
                    true,
                ),
                param(
                    "timeout",
                    ParamType::Integer,
                    "Seconds before the command is killed (1 to 3600, default 120)",
                    false,
                ),
            ],
        },
        BuiltinTool {
            name: "read",
            description: READ,
            replay: Replay::Safe,
            params: vec![
                path("read"),
                Param {
                    default: Some(json!(1)),
                    ..param(
                        "offset",
                        ParamType::Integer,
                        "The first line to read, counting from 1",
                        false,
                    )
                },
                Param {
                    default: Some(json!(READ_DEFAULT_LIMIT)),
                    ..param("limit", ParamType::Integer, "The most lines to read", false)
                },
            ],
        },
        BuiltinTool {
            name: "write",
            description: WRITE,
            replay: Replay::Never,
            params: vec![
                path("write"),
                param(
                    "content",
                    ParamType::String,
                    "The file's whole new content",
                    true,
                ),
            ],
        },
        BuiltinTool {
            name: "edit",
            description: EDIT,
            replay: Replay::Never,
            params: vec![
                path("edit"),
                param(
                    "old_text",
                    ParamType::String,
                    "The exact text to replace; it must occur in the file exactly once",
                    true,
                ),
                param(
                    "new_text",
                    ParamType::String,
                    "The text to put in its place",
                    true,
                ),
            ],
        },
    ];
    debug_assert!(
        tools
            .iter()
            .map(|tool| tool.name)
            .eq(BUILTIN_TOOLS.iter().copied())
    );
    tools
}

/// One page of a file for the model, from the guest's `listing` of it: the lines from `offset`
/// on (at most `limit` of them, each cut after [`READ_LINE_BYTES`] bytes and then marked with
/// [`READ_CUT_MARK`] and its length), each ending in `\n`, and a last line of
/// [`READ_TOTAL_MARK`] and the file's line count. An offset past the end is an error that
/// states the file's line count.
pub fn read_page(path: &str, offset: u64, limit: u64, listing: &[u8]) -> Result<String, String> {
    let listing = listing.strip_suffix(b"\n").unwrap_or(listing);
    let (content, total) = listing
        .iter()
        .rposition(|&byte| byte == READ_TOTAL_MARK)
        .and_then(|at| {
            let total = std::str::from_utf8(&listing[at + 1..]).ok()?.parse().ok()?;
            Some((&listing[..at], total))
        })
        .ok_or_else(|| format!("reading {path} failed: the guest's listing has no line count"))?;
    let total: u64 = total;
    if total == 0 {
        return if offset <= 1 {
            Ok(format!("[{path}: empty, 0 lines]"))
        } else {
            Err(format!(
                "offset {offset} is past the end of {path}, which is empty (0 lines)"
            ))
        };
    }
    if offset > total {
        return Err(format!(
            "offset {offset} is past the end of {path}, which has {total} {}; use an offset from 1 to {total}",
            lines_word(total)
        ));
    }
    let lines = content
        .strip_suffix(b"\n")
        .map(|content| content.split(|&byte| byte == b'\n'));
    let mut page = Vec::new();
    let mut used = 0;
    for line in lines.into_iter().flatten().take(usize_from(limit)) {
        let line = render_line(line);
        let chars = line.chars().count() + 1;
        if !page.is_empty() && used + chars > READ_PAGE_CHARS {
            break;
        }
        used += chars;
        page.push(line);
    }
    if page.is_empty() {
        return Err(format!(
            "reading {path} failed: the guest listed no lines from {offset}"
        ));
    }
    let last = offset + page.len() as u64 - 1;
    let mut text = format!("[{path}: lines {offset}-{last} of {total}]\n");
    text.push_str(&page.join("\n"));
    if last < total {
        text.push_str(&format!(
            "\n[{} more {}: continue with offset={}]",
            total - last,
            lines_word(total - last),
            last + 1
        ));
    }
    Ok(text)
}

fn render_line(line: &[u8]) -> String {
    let Some((kept, length)) = (line.len() > READ_LINE_BYTES
        && line[READ_LINE_BYTES] == READ_CUT_MARK)
        .then(|| (&line[..READ_LINE_BYTES], &line[READ_LINE_BYTES + 1..]))
    else {
        return String::from_utf8_lossy(line).into_owned();
    };
    let kept = match std::str::from_utf8(kept) {
        Err(error) if error.error_len().is_none() => &kept[..error.valid_up_to()],
        _ => kept,
    };
    format!(
        "{} [... line cut after {READ_LINE_BYTES} of {} bytes]",
        String::from_utf8_lossy(kept),
        String::from_utf8_lossy(length)
    )
}

fn lines_word(n: u64) -> &'static str {
    if n == 1 { "line" } else { "lines" }
}

fn usize_from(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin_tool(name: &str) -> Option<BuiltinTool> {
        builtin_tools().into_iter().find(|tool| tool.name == name)
    }

    fn listing(lines: &[&str], total: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for line in lines {
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
        }
        bytes.push(READ_TOTAL_MARK);
        bytes.extend_from_slice(format!("{total}\n").as_bytes());
        bytes
    }

    #[test]
    fn the_declarations_are_the_reserved_names_and_only_read_is_replayed() {
        let tools = builtin_tools();
        let names: Vec<&str> = tools.iter().map(|tool| tool.name).collect();
        assert_eq!(names, BUILTIN_TOOLS);
        let safe: Vec<&str> = tools
            .iter()
            .filter(|tool| tool.replay == Replay::Safe)
            .map(|tool| tool.name)
            .collect();
        assert_eq!(safe, ["read"]);
        let schema = builtin_tool("read").unwrap().json_schema();
        assert_eq!(schema["required"], json!(["path"]));
        assert_eq!(schema["properties"]["limit"]["default"], json!(2000));
    }

    #[test]
    fn arguments_are_checked_and_defaulted() {
        let read = builtin_tool("read").unwrap();
        assert_eq!(
            read.prepare_arguments(&json!({ "path": "a" })),
            Ok(json!({ "path": "a", "offset": 1, "limit": 2000 }))
        );
        let error = read
            .prepare_arguments(&json!({ "offset": "2" }))
            .unwrap_err();
        assert!(error.contains("`path` is required"), "{error}");
        assert!(error.contains("`offset` must be integer"), "{error}");
    }

    #[test]
    fn a_whole_file_is_one_page_with_a_header() {
        assert_eq!(
            read_page("a.txt", 1, 2000, &listing(&["one", "two"], 2)),
            Ok("[a.txt: lines 1-2 of 2]\none\ntwo".into())
        );
        assert_eq!(
            read_page("e", 1, 2000, &listing(&[], 0)),
            Ok("[e: empty, 0 lines]".into())
        );
    }

    #[test]
    fn a_page_stopped_by_the_limit_says_where_to_continue() {
        assert_eq!(
            read_page("a", 3, 2, &listing(&["c", "d"], 10)),
            Ok("[a: lines 3-4 of 10]\nc\nd\n[6 more lines: continue with offset=5]".into())
        );
        assert_eq!(
            read_page("a", 9, 1, &listing(&["i"], 10)),
            Ok("[a: lines 9-9 of 10]\ni\n[1 more line: continue with offset=10]".into())
        );
    }

    #[test]
    fn a_page_stops_at_the_character_budget() {
        let line = "x".repeat(999);
        let lines = vec![line.as_str(); 50];
        let page = read_page("big", 1, 2000, &listing(&lines, 50)).unwrap();
        assert!(
            page.starts_with("[big: lines 1-20 of 50]\n"),
            "{}",
            &page[..40]
        );
        assert!(
            page.ends_with("\n[30 more lines: continue with offset=21]"),
            "{}",
            &page[page.len() - 60..]
        );
    }

    #[test]
    fn an_offset_past_the_end_states_the_line_count() {
        assert_eq!(
            read_page("a.txt", 12, 2000, &listing(&[], 11)),
            Err("offset 12 is past the end of a.txt, which has 11 lines; use an offset from 1 to 11".into())
        );
        assert!(
            read_page("e", 2, 5, &listing(&[], 0))
                .unwrap_err()
                .contains("empty (0 lines)")
        );
    }

    #[test]
    fn cut_lines_are_marked_without_a_broken_character() {
        let mut line = "a".repeat(READ_LINE_BYTES - 1).into_bytes();
        line.extend_from_slice(&"é".as_bytes()[..1]);
        line.push(READ_CUT_MARK);
        line.extend_from_slice(b"5000");
        let mut bytes = line;
        bytes.push(b'\n');
        bytes.push(READ_TOTAL_MARK);
        bytes.extend_from_slice(b"1\n");
        let page = read_page("long", 1, 10, &bytes).unwrap();
        assert!(
            page.ends_with(&format!(
                "{} [... line cut after 2000 of 5000 bytes]",
                "a".repeat(READ_LINE_BYTES - 1)
            )),
            "{}",
            &page[page.len() - 80..]
        );
    }

    #[test]
    fn a_listing_without_a_count_is_an_error() {
        assert!(read_page("a", 1, 1, b"one\n").is_err());
    }
}
