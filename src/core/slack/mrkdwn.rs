//! perch's Markdown as Slack's mrkdwn ([`to_mrkdwn`]), text shown as written ([`escape`]),
//! and a message's mrkdwn as a person reads it ([`readable`]).
//!
//! Bold, italic, strikethrough, inline code, fenced code blocks, links, headings, bullets and
//! block quotes become their mrkdwn forms; what is not recognised stays visible as written.
//! Everything a model writes is escaped as Slack asks (`&`, `<`, `>` as `&amp;`, `&lt;`,
//! `&gt;`, and nothing else), so no text it writes can become a control sequence: `<!channel>`,
//! `<!here>`, `<!everyone>`, `<!subteam^…>`, `<@U…>` and `<#C…>` are shown, never notify
//! anyone; and a plain `@channel`, `@here` or `@everyone` gets an invisible word joiner after
//! its `@`, in case a request ever asks Slack to link names. The only links are the ones perch
//! writes from Markdown links, to `http`, `https` and `mailto` URLs.
//!
//! Spans do not cross line breaks, and a span inside one of its own kind is flattened (Slack
//! does not nest them).

use crate::markdown::{Fence, strip_indent};

/// The longest piece of a reply, in characters of Markdown before conversion (the split of
/// `perch_core::delivery::split_message`). Slack advises at most 4,000 characters of text per
/// message and truncates past 40,000; conversion at most multiplies a text's length by five (an
/// `&` becomes `&amp;`), so a converted piece is never truncated.
pub const MAX_CHARS: usize = 4000;

/// A message's text as Slack shows it, for the model: `&amp;`, `&lt;` and `&gt;` decoded, a
/// mention as `@<name>` (`<@U…|name>`) or `@U…`, a channel as `#<name>` or `#C…`, `<!here>`,
/// `<!channel>` and `<!everyone>` as `@here`, `@channel` and `@everyone`, a user group as its
/// label, a date as its fallback text, and a link as `label (url)`, or its URL alone.
pub fn readable(mrkdwn: &str) -> String {
    let mut out = String::with_capacity(mrkdwn.len());
    let mut rest = mrkdwn;
    while let Some(open) = rest.find('<') {
        out.push_str(&decode(&rest[..open]));
        let after = &rest[open + 1..];
        let Some(close) = after.find('>') else {
            out.push_str(&decode(&rest[open..]));
            return out;
        };
        out.push_str(&control(&after[..close]));
        rest = &after[close + 1..];
    }
    out.push_str(&decode(rest));
    out
}

/// One `<…>` sequence of a message's text, as a person reads it.
fn control(inside: &str) -> String {
    let (target, label) = match inside.split_once('|') {
        Some((target, label)) => (target, Some(decode(label))),
        None => (inside, None),
    };
    let label = label.filter(|label| !label.is_empty());
    if let Some(user) = target.strip_prefix('@') {
        return format!("@{}", label.unwrap_or_else(|| user.to_owned()));
    }
    if let Some(channel) = target.strip_prefix('#') {
        return format!("#{}", label.unwrap_or_else(|| channel.to_owned()));
    }
    if let Some(special) = target.strip_prefix('!') {
        let word = special.split('^').next().unwrap_or_default();
        return match (word, label) {
            ("here" | "channel" | "everyone", _) => format!("@{word}"),
            (_, Some(label)) => label,
            ("subteam", None) => format!("@{}", special.trim_start_matches("subteam^")),
            (_, None) => word.to_owned(),
        };
    }
    let url = decode(target);
    let shown = url.strip_prefix("mailto:").unwrap_or(&url);
    match label {
        Some(label) if label != url && label != shown => format!("{label} ({url})"),
        _ => shown.to_owned(),
    }
}

fn decode(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Put after the `@` of a broadcast word: invisible, and it keeps the word from being one.
const WORD_JOINER: char = '\u{2060}';

/// The words that notify a whole channel or workspace when Slack links them.
const BROADCASTS: &[&str] = &["channel", "here", "everyone"];

/// Converts perch's Markdown to Slack mrkdwn, escaping everything else.
pub fn to_mrkdwn(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len() + markdown.len() / 8);
    let mut lines = markdown.split('\n');
    let mut first = true;
    while let Some(line) = lines.next() {
        if !first {
            out.push('\n');
        }
        first = false;
        if let Some(fence) = Fence::open(line) {
            out.push_str("```\n");
            let mut body = Vec::new();
            for next in lines.by_ref() {
                if fence.closes(next) {
                    break;
                }
                body.push(next);
            }
            out.push_str(&escape_code(&body.join("\n")));
            out.push_str("\n```");
            continue;
        }
        block_line(line, &mut out);
    }
    out
}

/// `text` as Slack shows it verbatim: escaped, with no formatting of perch's.
pub fn escape(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (at, &ch) in chars.iter().enumerate() {
        push_escaped(&mut out, &chars, at, ch);
    }
    out
}

fn push_escaped(out: &mut String, chars: &[char], at: usize, ch: char) {
    match ch {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '@' => {
            out.push('@');
            if starts_broadcast(chars, at) {
                out.push(WORD_JOINER);
            }
        }
        _ => out.push(ch),
    }
}

/// Whether `@` at `at` starts `@channel`, `@here` or `@everyone` standing as a word.
fn starts_broadcast(chars: &[char], at: usize) -> bool {
    if at > 0 && chars[at - 1].is_alphanumeric() {
        return false;
    }
    BROADCASTS.iter().any(|word| {
        let end = at + 1 + word.len();
        end <= chars.len()
            && chars[at + 1..end]
                .iter()
                .map(|ch| ch.to_ascii_lowercase())
                .eq(word.chars())
            && chars.get(end).is_none_or(|next| !next.is_alphanumeric())
    })
}

/// Code keeps every character; only what Slack reserves is escaped, and a run of three
/// backticks is broken so that it cannot end the block.
fn escape_code(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace("```", "``\u{200B}`")
}

fn block_line(line: &str, out: &mut String) {
    let Some(trimmed) = strip_indent(line) else {
        out.push_str(&inline(line, Open::default()));
        return;
    };
    if let Some(heading) = heading(trimmed) {
        if heading.is_empty() {
            return;
        }
        out.push('*');
        out.push_str(&inline(
            heading,
            Open {
                bold: true,
                ..Open::default()
            },
        ));
        out.push('*');
        return;
    }
    if is_thematic_break(trimmed) {
        out.push_str("──────────");
        return;
    }
    if let Some(quoted) = trimmed.strip_prefix('>') {
        let quoted = quoted.trim_start_matches('>');
        let quoted = quoted.strip_prefix(' ').unwrap_or(quoted);
        out.push_str("> ");
        out.push_str(&inline(quoted, Open::default()));
        return;
    }
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    if let Some(item) = ["- ", "* ", "+ "]
        .iter()
        .find_map(|bullet| rest.strip_prefix(bullet))
    {
        out.push_str(&line[..indent]);
        out.push_str("• ");
        out.push_str(&inline(item, Open::default()));
        return;
    }
    out.push_str(&inline(line, Open::default()));
}

/// An ATX heading's text, without its `#`s.
fn heading(line: &str) -> Option<&str> {
    let level = line.chars().take_while(|&ch| ch == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &line[level..];
    if !rest.is_empty() && !rest.starts_with(' ') {
        return None;
    }
    let text = rest.trim();
    let without_closing = text.trim_end_matches('#');
    if without_closing.is_empty() || without_closing.ends_with(' ') {
        Some(without_closing.trim_end())
    } else {
        Some(text)
    }
}

fn is_thematic_break(line: &str) -> bool {
    let marks: Vec<char> = line.chars().filter(|ch| !ch.is_whitespace()).collect();
    marks.len() >= 3
        && ['-', '*', '_']
            .iter()
            .any(|mark| marks.iter().all(|ch| ch == mark))
}

/// The spans a piece of text is already inside: a span of the same kind is flattened.
#[derive(Debug, Clone, Copy, Default)]
struct Open {
    bold: bool,
    italic: bool,
    strike: bool,
    /// Spans around this text: past [`MAX_SPAN_DEPTH`], markers are left as written.
    depth: u8,
}

/// How deep spans are read inside each other (three kinds, and some flattened repeats).
const MAX_SPAN_DEPTH: u8 = 6;

fn inline(text: &str, open: Open) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < chars.len() {
        let ch = chars[at];
        if ch == '\\' && chars.get(at + 1).is_some_and(char::is_ascii_punctuation) {
            push_escaped(&mut out, &chars, at + 1, chars[at + 1]);
            at += 2;
            continue;
        }
        if ch == '`' {
            let run = run_length(&chars, at, '`');
            if let Some(close) = closing_backticks(&chars, at + run, run) {
                let code: String = chars[at + run..close].iter().collect();
                out.push('`');
                out.push_str(&escape_code(code_span_text(&code)).replace('`', "\u{2CB}"));
                out.push('`');
                at = close + run;
            } else {
                out.extend(&chars[at..at + run]);
                at += run;
            }
            continue;
        }
        if ch == '[' || (ch == '!' && chars.get(at + 1) == Some(&'[')) {
            let start = if ch == '!' { at + 1 } else { at };
            if let Some((label, url, end)) = link(&chars, start) {
                push_link(&mut out, &label, &url);
                at = end;
                continue;
            }
        }
        if ch == '<'
            && let Some((url, end)) = autolink(&chars, at)
        {
            push_link(&mut out, "", &url);
            at = end;
            continue;
        }
        if let Some((marker, inner, end)) = span(&chars, at).filter(|_| open.depth < MAX_SPAN_DEPTH)
        {
            let open = Open {
                depth: open.depth + 1,
                ..open
            };
            let (already, mark, within) = match marker {
                Marker::Bold => (open.bold, '*', Open { bold: true, ..open }),
                Marker::Italic => (
                    open.italic,
                    '_',
                    Open {
                        italic: true,
                        ..open
                    },
                ),
                Marker::Strike => (
                    open.strike,
                    '~',
                    Open {
                        strike: true,
                        ..open
                    },
                ),
            };
            let inner = inline(&inner, within);
            if already {
                out.push_str(&inner);
            } else {
                out.push(mark);
                out.push_str(&inner);
                out.push(mark);
            }
            at = end;
            continue;
        }
        push_escaped(&mut out, &chars, at, ch);
        at += 1;
    }
    out
}

fn run_length(chars: &[char], at: usize, ch: char) -> usize {
    chars[at..].iter().take_while(|&&next| next == ch).count()
}

/// The start of the next run of exactly `run` backticks from `from`.
fn closing_backticks(chars: &[char], from: usize, run: usize) -> Option<usize> {
    let mut at = from;
    while at < chars.len() {
        if chars[at] == '`' {
            let length = run_length(chars, at, '`');
            if length == run {
                return Some(at);
            }
            at += length;
        } else {
            at += 1;
        }
    }
    None
}

/// A code span's text: one space on each side is dropped when both are there.
fn code_span_text(code: &str) -> &str {
    if code.len() >= 2 && code.starts_with(' ') && code.ends_with(' ') && !code.trim().is_empty() {
        &code[1..code.len() - 1]
    } else {
        code
    }
}

/// `[label](url)` at `at`: its label, its URL and where it ends.
fn link(chars: &[char], at: usize) -> Option<(String, String, usize)> {
    let close = at + 1 + chars[at + 1..].iter().position(|&ch| ch == ']')?;
    if chars.get(close + 1) != Some(&'(') {
        return None;
    }
    let url_start = close + 2;
    let url_end = url_start + chars[url_start..].iter().position(|&ch| ch == ')')?;
    let inside: String = chars[url_start..url_end].iter().collect();
    let url = inside.split_whitespace().next()?.to_owned();
    let label = chars[at + 1..close].iter().collect();
    Some((label, url, url_end + 1))
}

/// `<scheme://…>` at `at`: its URL and where it ends.
fn autolink(chars: &[char], at: usize) -> Option<(String, usize)> {
    let close = at + 1 + chars[at + 1..].iter().position(|&ch| ch == '>')?;
    let url: String = chars[at + 1..close].iter().collect();
    (linkable(&url) && !url.contains(|ch: char| ch.is_whitespace() || ch == '<'))
        .then_some((url, close + 1))
}

fn linkable(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| lower.starts_with(scheme) && lower.len() > scheme.len())
}

fn push_link(out: &mut String, label: &str, url: &str) {
    if !linkable(url) {
        out.push_str(&escape(label));
        out.push_str(" (");
        out.push_str(&escape(url));
        out.push(')');
        return;
    }
    out.push('<');
    for ch in url.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("%3C"),
            '>' => out.push_str("%3E"),
            '|' => out.push_str("%7C"),
            _ => out.push(ch),
        }
    }
    let label = label.trim();
    if !label.is_empty() && label != url {
        out.push('|');
        out.push_str(&escape(label));
    }
    out.push('>');
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    Bold,
    Italic,
    Strike,
}

/// A bold, italic or strikethrough span starting at `at`: its kind, its text and where it
/// ends. The text may not start or end with a space; `_` opens and closes only at a word's
/// edge (so `snake_case_name` stays as written).
fn span(chars: &[char], at: usize) -> Option<(Marker, String, usize)> {
    let ch = chars[at];
    if !matches!(ch, '*' | '_' | '~') {
        return None;
    }
    let run = run_length(chars, at, ch);
    let (marker, width) = match (ch, run) {
        ('~', 2) => (Marker::Strike, 2),
        ('*' | '_', 2) => (Marker::Bold, 2),
        ('*' | '_', 1) => (Marker::Italic, 1),
        _ => return None,
    };
    if ch == '_' && at > 0 && chars[at - 1].is_alphanumeric() {
        return None;
    }
    let start = at + width;
    if chars.get(start).is_none_or(|next| next.is_whitespace()) {
        return None;
    }
    let mut close = start + 1;
    while close < chars.len() {
        if chars[close] == ch {
            let length = run_length(chars, close, ch);
            let fits = length == width
                && !chars[close - 1].is_whitespace()
                && !(ch == '_'
                    && chars
                        .get(close + width)
                        .is_some_and(|next| next.is_alphanumeric()));
            if fits {
                let inner = chars[start..close].iter().collect();
                return Some((marker, inner, close + width));
            }
            close += length;
        } else if chars[close] == '`' {
            let backticks = run_length(chars, close, '`');
            close = closing_backticks(chars, close + backticks, backticks)
                .map_or(close + backticks, |end| end + backticks);
        } else {
            close += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::split_message;

    #[test]
    fn markdown_becomes_mrkdwn() {
        let cases: &[(&str, &str)] = &[
            ("plain text", "plain text"),
            ("**bold** and __bold__", "*bold* and *bold*"),
            ("*italic* and _italic_", "_italic_ and _italic_"),
            ("~~gone~~", "~gone~"),
            ("**bold _and italic_**", "*bold _and italic_*"),
            ("**a __b__ c**", "*a b c*"),
            ("`a < b && c`", "`a &lt; b &amp;&amp; c`"),
            ("`` a `b` c ``", "`a \u{2CB}b\u{2CB} c`"),
            ("`**not bold**`", "`**not bold**`"),
            ("**see `x*y`**", "*see `x*y`*"),
            (
                "[the docs](https://example.org/a?b=1&c=2)",
                "<https://example.org/a?b=1&amp;c=2|the docs>",
            ),
            (
                "[https://example.org](https://example.org)",
                "<https://example.org>",
            ),
            (
                "[mail](mailto:ada@example.org)",
                "<mailto:ada@example.org|mail>",
            ),
            ("[x](javascript:alert(1))", "x (javascript:alert(1))"),
            ("[x](/relative)", "x (/relative)"),
            (
                "![a cat](https://example.org/cat.png)",
                "<https://example.org/cat.png|a cat>",
            ),
            ("<https://example.org/x>", "<https://example.org/x>"),
            (
                "[a|b](https://x.example/p|q>r)",
                "<https://x.example/p%7Cq%3Er|a|b>",
            ),
            ("# Title", "*Title*"),
            ("### Title ###", "*Title*"),
            ("## **Bold** title", "*Bold title*"),
            ("#hashtag", "#hashtag"),
            (
                "- one\n* two\n+ three\n  - nested",
                "• one\n• two\n• three\n  • nested",
            ),
            ("1. first\n2. second", "1. first\n2. second"),
            ("> quoted **text**", "> quoted *text*"),
            (">> deeper", "> deeper"),
            ("---", "──────────"),
            (
                "```rust\nlet a = b < c && d > e;\n```",
                "```\nlet a = b &lt; c &amp;&amp; d &gt; e;\n```",
            ),
            ("~~~\n**kept**\n~~~", "```\n**kept**\n```"),
            ("```\nunclosed", "```\nunclosed\n```"),
            ("````\n```\n````", "```\n``\u{200B}`\n```"),
            ("snake_case_name and __init__", "snake_case_name and *init*"),
            ("2 * 3 * 4", "2 * 3 * 4"),
            ("a ** b", "a ** b"),
            ("\\*not italic\\*", "*not italic*"),
            ("**unclosed", "**unclosed"),
            ("x < y > z & w", "x &lt; y &gt; z &amp; w"),
            ("&lt; stays literal", "&amp;lt; stays literal"),
            ("**a\nb**", "**a\nb**"),
            ("", ""),
        ];
        for (markdown, expected) in cases {
            assert_eq!(to_mrkdwn(markdown), *expected, "{markdown:?}");
        }
    }

    #[test]
    fn nothing_the_model_writes_notifies_anyone() {
        let cases: &[(&str, &str)] = &[
            ("<!channel> look", "&lt;!channel&gt; look"),
            ("<!here>", "&lt;!here&gt;"),
            ("<!everyone>", "&lt;!everyone&gt;"),
            (
                "<!subteam^S0123ABC|@oncall>",
                "&lt;!subteam^S0123ABC|@oncall&gt;",
            ),
            ("<@U0LAN0Z89> hi", "&lt;@U0LAN0Z89&gt; hi"),
            ("<#C123ABC456>", "&lt;#C123ABC456&gt;"),
            (
                "<!date^1392734382^{date}|x>",
                "&lt;!date^1392734382^{date}|x&gt;",
            ),
            ("**<!here>**", "*&lt;!here&gt;*"),
            ("`<!channel>`", "`&lt;!channel&gt;`"),
            ("```\n<!everyone>\n```", "```\n&lt;!everyone&gt;\n```"),
            (
                "[<!here>](https://example.org)",
                "<https://example.org|&lt;!here&gt;>",
            ),
            (
                "[x](https://example.org/<!here>)",
                "<https://example.org/%3C!here%3E|x>",
            ),
            (
                "<https://example.org|<!channel>>",
                "&lt;https://example.org|&lt;!channel&gt;&gt;",
            ),
            ("\\<!here\\>", "&lt;!here&gt;"),
            (
                "@here and @channel, @Everyone!",
                "@\u{2060}here and @\u{2060}channel, @\u{2060}Everyone!",
            ),
            ("# @here", "*@\u{2060}here*"),
            (
                "ada@here.example and @hereafter",
                "ada@here.example and @hereafter",
            ),
        ];
        for (markdown, expected) in cases {
            let mrkdwn = to_mrkdwn(markdown);
            assert_eq!(mrkdwn, *expected, "{markdown:?}");
            for control in ["<!", "<@", "<#"] {
                assert!(!mrkdwn.contains(control), "{markdown:?} kept {control}");
            }
        }
    }

    #[test]
    fn a_message_reads_as_slack_shows_it() {
        let cases: &[(&str, &str)] = &[
            (
                "<@U0LAN0Z89> is it everything a river should be?",
                "@U0LAN0Z89 is it everything a river should be?",
            ),
            (
                "<@U2147483828|cal> has joined the channel",
                "@cal has joined the channel",
            ),
            (
                "see <#C123ABC456|general> and <#C0>",
                "see #general and #C0",
            ),
            (
                "<!here> <!channel|channel> <!everyone>",
                "@here @channel @everyone",
            ),
            (
                "<!subteam^S0123ABC|@oncall> and <!subteam^S0456>",
                "@oncall and @S0456",
            ),
            (
                "<!date^1392734382^{date_pretty}|Feb 18, 2014 PST>",
                "Feb 18, 2014 PST",
            ),
            (
                "<https://example.org/a?b=1&amp;c=2|the docs>",
                "the docs (https://example.org/a?b=1&c=2)",
            ),
            ("<https://example.org>", "https://example.org"),
            (
                "<https://example.org|https://example.org>",
                "https://example.org",
            ),
            (
                "<mailto:ada@example.org|ada@example.org>",
                "ada@example.org",
            ),
            ("a &lt; b &amp;&amp; c &gt; d", "a < b && c > d"),
            ("&amp;lt; is how you write &lt;", "&lt; is how you write <"),
            ("unclosed <https://x", "unclosed <https://x"),
            ("", ""),
        ];
        for (mrkdwn, expected) in cases {
            assert_eq!(readable(mrkdwn), *expected, "{mrkdwn:?}");
        }
        for written in [
            "a < b & <!here> **x**",
            "[x](https://e.example/?a=1&b=2)",
            "`<@U1>`",
        ] {
            let shown = readable(&to_mrkdwn(written));
            assert!(
                !shown.contains("&amp;") && !shown.contains("&lt;"),
                "{written:?}: {shown:?}"
            );
        }
    }

    #[test]
    fn deeply_nested_markers_end_in_time_and_keep_every_word() {
        let nested = format!("{}b{}", "**a ".repeat(2000), " c**".repeat(2000));
        let mrkdwn = to_mrkdwn(&nested);
        assert!(mrkdwn.starts_with("*a **a **a"), "{}", &mrkdwn[..40]);
        assert!(mrkdwn.contains("a b c* c**"));
        let alternating: String = (0..3000)
            .map(|level| if level % 2 == 0 { "**x " } else { "__y " })
            .collect();
        assert!(to_mrkdwn(&format!("{alternating}z")).ends_with('z'));
        let mixed = format!("{}x{}", "**_~~".repeat(500), "~~_**".repeat(500));
        assert!(to_mrkdwn(&mixed).contains('x'));
    }

    #[test]
    fn escaped_text_is_shown_as_written() {
        assert_eq!(
            escape("**a** <b> & @here"),
            "**a** &lt;b&gt; &amp; @\u{2060}here"
        );
    }

    #[test]
    fn a_long_reply_splits_into_pieces_slack_keeps_whole() {
        let worst = "&".repeat(3 * MAX_CHARS);
        let mixed = format!(
            "# Report\n\n{}\n\n```\n{}\n```\n\n{}",
            "**word** <!here> & ".repeat(400),
            "a && b < c\n".repeat(500),
            "[link](https://example.org/?a=1&b=2) ".repeat(200)
        );
        for text in [worst, mixed] {
            let pieces = split_message(&text, MAX_CHARS);
            assert!(pieces.len() > 1);
            for piece in pieces {
                assert!(piece.chars().count() <= MAX_CHARS);
                let mrkdwn = to_mrkdwn(&piece);
                assert!(
                    mrkdwn.chars().count() <= 40_000,
                    "{}",
                    mrkdwn.chars().count()
                );
                assert_eq!(mrkdwn.matches("```").count() % 2, 0);
                assert!(!mrkdwn.contains("<!"));
            }
        }
    }
}
