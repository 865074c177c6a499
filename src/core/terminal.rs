//! Text from chat platforms (display names, messages) made safe to print: nothing a sender writes
//! can move a terminal's cursor, recolour it, reorder what follows, or hide characters.

/// How many characters of a name or text [`for_terminal`] shows by default.
pub const SHOWN_CHARS: usize = 200;

/// Characters that change how surrounding text is shown without being visible themselves: bidi
/// embeddings, overrides, isolates and marks, zero-width characters, and other format characters
/// a terminal or a file name should not carry.
pub fn is_invisible_format(ch: char) -> bool {
    matches!(
        ch,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// A character that must not reach a terminal as itself: C0 and C1 controls (ESC among them),
/// DEL, and the invisible format characters of [`is_invisible_format`].
pub fn is_unsafe_for_terminal(ch: char) -> bool {
    ch.is_control() || is_invisible_format(ch)
}

/// `text` for a terminal or a log line: every unsafe character written as `\u{…}` (so ESC is
/// `\u{1b}` and a right-to-left override `\u{202e}`), cut to `max_chars` characters with `…`.
pub fn for_terminal(text: &str, max_chars: usize) -> String {
    let mut shown = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    let mut count: usize = 0;
    for ch in text.chars() {
        let piece = if is_unsafe_for_terminal(ch) {
            format!("\\u{{{:x}}}", u32::from(ch))
        } else {
            ch.to_string()
        };
        let len = piece.chars().count();
        if count.saturating_add(len) > max_chars {
            shown.push('…');
            return shown;
        }
        count += len;
        shown.push_str(&piece);
    }
    shown
}

/// `text` with every unsafe character escaped as [`for_terminal`] does, at any length: for log
/// lines, which quote what platforms and models said.
pub fn escaped(text: &str) -> String {
    if !text.chars().any(is_unsafe_for_terminal) {
        return text.to_owned();
    }
    for_terminal(text, usize::MAX)
}

/// `text` with every unsafe character escaped as [`escaped`] does, except line feeds and tabs,
/// which are kept: for text of several lines (a model's reply, a problem and its fix) printed
/// as lines. A carriage return is escaped, so no line can be written over.
pub fn escaped_lines(text: &str) -> String {
    let unsafe_in_lines = |ch: char| is_unsafe_for_terminal(ch) && !matches!(ch, '\n' | '\t');
    if !text.chars().any(unsafe_in_lines) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for ch in text.chars() {
        if unsafe_in_lines(ch) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(ch)));
        } else {
            out.push(ch);
        }
    }
    out
}

/// JSON `text` with every character [`is_unsafe_for_terminal`] written as a `\uXXXX` escape:
/// safe to print, and it still decodes to exactly the same values. Only for JSON text as
/// serde_json writes it, where such a character stands only inside a string, except the line
/// breaks and tabs of pretty-printing, which are left alone.
pub fn json_escaped(text: &str) -> String {
    let unsafe_in_json = |ch: char| is_unsafe_for_terminal(ch) && !matches!(ch, '\n' | '\t');
    if !text.chars().any(unsafe_in_json) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for ch in text.chars() {
        if unsafe_in_json(ch) {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// [`for_terminal`] with the default length, [`SHOWN_CHARS`].
pub fn shown(text: &str) -> String {
    for_terminal(text, SHOWN_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_what_a_terminal_acts_on_and_keeps_pretty_printing() {
        let value = serde_json::json!({"name": "Mal\u{1b}[2Jlory\u{202e}\u{85}", "id": "88"});
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        let escaped = json_escaped(&pretty);
        assert_eq!(
            escaped,
            "{\n  \"id\": \"88\",\n  \"name\": \"Mal\\u001b[2Jlory\\u202e\\u0085\"\n}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&escaped).unwrap(),
            value
        );
        assert_eq!(json_escaped("{\"plain\":1}"), "{\"plain\":1}");
    }

    #[test]
    fn controls_and_invisible_characters_are_shown_escaped() {
        let cases: &[(&str, &str)] = &[
            ("Alice", "Alice"),
            ("Zoë 山田", "Zoë 山田"),
            (
                "\u{1b}[2J\u{1b}]0;pwned\u{7}",
                "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}",
            ),
            ("evil\u{202e}txt.exe", "evil\\u{202e}txt.exe"),
            ("a\u{2066}b\u{2069}", "a\\u{2066}b\\u{2069}"),
            ("zero\u{200b}width\u{feff}", "zero\\u{200b}width\\u{feff}"),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            ("del\u{7f}", "del\\u{7f}"),
            ("two\nlines\r", "two\\u{a}lines\\u{d}"),
            ("tag\u{e0041}", "tag\\u{e0041}"),
            ("emoji 👍🏽", "emoji 👍🏽"),
        ];
        for (raw, expected) in cases {
            assert_eq!(for_terminal(raw, 100), *expected, "{raw:?}");
        }
    }

    #[test]
    fn escaped_lines_keep_line_feeds_and_tabs_and_escape_the_rest() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            ("two\nlines\n", "two\nlines\n"),
            ("col\tumn", "col\tumn"),
            ("over\rwrite", "over\\u{d}write"),
            ("\u{1b}[2J\nnext", "\\u{1b}[2J\nnext"),
            ("evil\u{202e}txt\n", "evil\\u{202e}txt\n"),
            ("nel\u{85}ls\u{2028}ps", "nel\\u{85}ls\\u{2028}ps"),
            ("bell\u{7}", "bell\\u{7}"),
            ("Zoë 山田 👍🏽", "Zoë 山田 👍🏽"),
        ];
        for (raw, expected) in cases {
            assert_eq!(escaped_lines(raw), *expected, "{raw:?}");
        }
        let escaped_twice = escaped_lines(&escaped_lines("a\u{1b}b"));
        assert_eq!(escaped_twice, "a\\u{1b}b", "escaping is done once");
    }

    #[test]
    fn shown_text_is_cut_to_its_length() {
        assert_eq!(for_terminal("abcdef", 3), "abc…");
        assert_eq!(for_terminal("abc", 3), "abc");
        assert_eq!(
            for_terminal("ab\u{1b}", 5),
            "ab…",
            "an escape is never cut in half"
        );
        let long = "\u{202e}".repeat(10_000);
        assert!(shown(&long).chars().count() <= SHOWN_CHARS + 1);
        assert_eq!(escaped(&long).len(), 10_000 * "\\u{202e}".len());
        assert_eq!(escaped("plain"), "plain");
    }
}
