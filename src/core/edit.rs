//! The `edit` tool's replacement: one exact piece of text, which must occur exactly once.

use std::fmt;

/// A file's text after a successful replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pub text: String,
    /// The line (counting from 1) on which the replaced text started.
    pub line: usize,
}

/// Why a replacement was not made; the file is left as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditError {
    EmptyOldText,
    /// `old_text` and `new_text` are the same.
    Unchanged,
    NotFound {
        /// The file has CRLF line ends and `old_text` has bare LFs, the likely cause.
        line_ends_differ: bool,
    },
    /// `old_text` occurs `count` times (overlapping occurrences counted), starting on `lines`.
    Ambiguous {
        count: usize,
        lines: Vec<usize>,
    },
}

const LINES_NAMED: usize = 10;

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EditError::EmptyOldText => f.write_str(
                "old_text is empty; give the exact text to replace, with enough of its surroundings to occur once",
            ),
            EditError::Unchanged => {
                f.write_str("old_text and new_text are the same, so there is nothing to change")
            }
            EditError::NotFound { line_ends_differ } => {
                f.write_str(
                    "old_text occurs 0 times; it must match the file exactly, whitespace and line breaks included (read the file again and copy the text)",
                )?;
                if *line_ends_differ {
                    f.write_str("; the file ends its lines with CRLF (\\r\\n) and old_text does not")?;
                }
                Ok(())
            }
            EditError::Ambiguous { count, lines } => {
                let named: Vec<String> = lines
                    .iter()
                    .take(LINES_NAMED)
                    .map(ToString::to_string)
                    .collect();
                let more = if lines.len() > LINES_NAMED { ", ..." } else { "" };
                write!(
                    f,
                    "old_text occurs {count} times (starting on lines {}{more}); include more of the surrounding text so that it occurs exactly once",
                    named.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for EditError {}

/// Replaces the one occurrence of `old` in `text` with `new`. Zero occurrences, or more than
/// one (overlapping ones included, so that `aa` in `aaa` is ambiguous), are errors.
pub fn replace_once(text: &str, old: &str, new: &str) -> Result<Replacement, EditError> {
    if old.is_empty() {
        return Err(EditError::EmptyOldText);
    }
    if old == new {
        return Err(EditError::Unchanged);
    }
    let starts = occurrences(text, old);
    match starts.as_slice() {
        [] => Err(EditError::NotFound {
            line_ends_differ: text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n"),
        }),
        [start] => {
            let mut replaced = String::with_capacity(text.len() - old.len() + new.len());
            replaced.push_str(&text[..*start]);
            replaced.push_str(new);
            replaced.push_str(&text[start + old.len()..]);
            Ok(Replacement {
                text: replaced,
                line: line_of(text, *start),
            })
        }
        many => Err(EditError::Ambiguous {
            count: many.len(),
            lines: many.iter().map(|start| line_of(text, *start)).collect(),
        }),
    }
}

fn occurrences(text: &str, needle: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(needle) {
        let start = from + found;
        starts.push(start);
        let step = text[start..].chars().next().map_or(1, char::len_utf8);
        from = start + step;
    }
    starts
}

fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_occurrence_is_replaced_and_its_line_given() {
        assert_eq!(
            replace_once("one\ntwo\nthree\n", "two\n", "2\n2b\n"),
            Ok(Replacement {
                text: "one\n2\n2b\nthree\n".into(),
                line: 2
            })
        );
        assert_eq!(
            replace_once("héllo wörld", "wörld", "").map(|r| r.text),
            Ok("héllo ".into())
        );
    }

    #[test]
    fn zero_or_several_occurrences_change_nothing_and_say_how_many() {
        assert_eq!(
            replace_once("a\nb\n", "c", "d"),
            Err(EditError::NotFound {
                line_ends_differ: false
            })
        );
        assert_eq!(
            replace_once("x\nfoo\ny\nfoo\n", "foo", "bar"),
            Err(EditError::Ambiguous {
                count: 2,
                lines: vec![2, 4]
            })
        );
        assert_eq!(
            replace_once("aaa", "aa", "b"),
            Err(EditError::Ambiguous {
                count: 2,
                lines: vec![1, 1]
            }),
            "overlapping occurrences are ambiguous too"
        );
        let message = replace_once("foo foo foo", "foo", "x")
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("old_text occurs 3 times"), "{message}");
    }

    #[test]
    fn empty_and_identical_texts_are_refused() {
        assert_eq!(replace_once("abc", "", "x"), Err(EditError::EmptyOldText));
        assert_eq!(replace_once("abc", "b", "b"), Err(EditError::Unchanged));
    }

    #[test]
    fn crlf_files_get_a_hint() {
        let error = replace_once("a\r\nb\r\n", "a\nb", "c").unwrap_err();
        assert_eq!(
            error,
            EditError::NotFound {
                line_ends_differ: true
            }
        );
        assert!(error.to_string().contains("CRLF"), "{error}");
    }
}
