//! Markdown as Telegram's MarkdownV2 parse mode accepts it.
//!
//! [`to_telegram_markdown_v2`] turns the Markdown models write (bold, italic, strikethrough,
//! inline code, fenced code blocks, links, headings, bullets, block quotes) into MarkdownV2 and
//! escapes every other reserved character, so the result always parses: every entity it opens,
//! it closes, and every character of `_*[]()~`>#+-=|{}.!\` outside an entity is escaped. What it
//! does not recognise stays visible as literal text.
//!
//! Spans do not cross line breaks. Nested spans of the same kind are flattened (Telegram refuses
//! them), and two italic spans that touch are separated by an empty bold entity, the separator
//! Telegram documents for the `_`/`__` ambiguity.

/// The characters MarkdownV2 reserves outside entities, plus the backslash itself.
const RESERVED: &str = "_*[]()~`>#+-=|{}.!\\";

/// Converts common Markdown to Telegram MarkdownV2 with correct escaping.
pub fn to_telegram_markdown_v2(markdown: &str) -> String {
    let mut out = Writer::default();
    let mut lines = markdown.split('\n');
    let mut first = true;
    while let Some(line) = lines.next() {
        if !first {
            out.push_raw("\n");
        }
        first = false;
        if let Some(fence) = Fence::open(line) {
            let mut body = Vec::new();
            for next in lines.by_ref() {
                if fence.closes(next) {
                    break;
                }
                body.push(next);
            }
            out.push_raw("```");
            out.push_raw(fence.language);
            out.push_raw("\n");
            out.push_raw(&escape_code(&body.join("\n")));
            out.push_raw("\n```");
            continue;
        }
        block_line(line, &mut out);
    }
    out.text
}

/// Escapes `text` so that MarkdownV2 shows it verbatim, with no entities.
pub fn escape_markdown_v2(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for ch in text.chars() {
        push_escaped(&mut out, ch);
    }
    out
}

fn push_escaped(out: &mut String, ch: char) {
    if RESERVED.contains(ch) {
        out.push('\\');
    }
    out.push(ch);
}

/// Inside `code` and `pre` entities only the backtick and the backslash are escaped.
fn escape_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch == '`' || ch == '\\' {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// Inside a link's `(...)` only `)` and the backslash are escaped.
fn escape_url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    for ch in url.chars() {
        if ch == ')' || ch == '\\' {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[derive(Default)]
struct Writer {
    text: String,
    after_italic_marker: bool,
}

impl Writer {
    fn push_raw(&mut self, text: &str) {
        if !text.is_empty() {
            self.text.push_str(text);
            self.after_italic_marker = false;
        }
    }

    fn push_char(&mut self, ch: char) {
        push_escaped(&mut self.text, ch);
        self.after_italic_marker = false;
    }

    fn push_italic_marker(&mut self) {
        if self.after_italic_marker {
            self.text.push_str("**");
        }
        self.text.push('_');
        self.after_italic_marker = true;
    }
}

/// A code fence's opening line (CommonMark: three or more backticks or tildes, indented at most
/// three spaces), shared by every renderer of perch's Markdown.
pub(crate) struct Fence<'a> {
    marker: char,
    count: usize,
    pub(crate) language: &'a str,
}

impl<'a> Fence<'a> {
    pub(crate) fn open(line: &'a str) -> Option<Fence<'a>> {
        let trimmed = strip_indent(line)?;
        let marker = trimmed
            .chars()
            .next()
            .filter(|&ch| ch == '`' || ch == '~')?;
        let count = trimmed.chars().take_while(|&ch| ch == marker).count();
        if count < 3 {
            return None;
        }
        let info = trimmed[count..].trim();
        if marker == '`' && info.contains('`') {
            return None;
        }
        let word = info.split_whitespace().next().unwrap_or("");
        let language = if word
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "+-_#.".contains(ch))
        {
            word
        } else {
            ""
        };
        Some(Fence {
            marker,
            count,
            language,
        })
    }

    pub(crate) fn closes(&self, line: &str) -> bool {
        let Some(trimmed) = strip_indent(line) else {
            return false;
        };
        let run = trimmed.chars().take_while(|&ch| ch == self.marker).count();
        run >= self.count && trimmed[run * self.marker.len_utf8()..].trim().is_empty()
    }
}

/// The line without up to three leading spaces; `None` when it is indented further.
pub(crate) fn strip_indent(line: &str) -> Option<&str> {
    let spaces = line.chars().take_while(|&ch| ch == ' ').count();
    (spaces <= 3).then(|| &line[spaces..])
}

fn block_line(line: &str, out: &mut Writer) {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    if let Some(title) = heading(body) {
        out.push_raw(indent);
        let chars: Vec<char> = title.chars().collect();
        out.push_raw("*");
        inline(&chars, Styles::BOLD, out);
        out.push_raw("*");
        return;
    }
    if indent.len() <= 3
        && let Some(quoted) = body.strip_prefix('>')
    {
        let quoted = quoted.strip_prefix(' ').unwrap_or(quoted);
        let chars: Vec<char> = quoted.chars().collect();
        out.push_raw(">");
        inline(&chars, Styles::NONE, out);
        return;
    }
    let bullet = ["- ", "* ", "+ "]
        .iter()
        .find_map(|marker| body.strip_prefix(marker));
    out.push_raw(indent);
    match bullet {
        Some(item) => {
            out.push_raw("• ");
            let chars: Vec<char> = item.chars().collect();
            inline(&chars, Styles::NONE, out);
        }
        None => {
            let chars: Vec<char> = body.chars().collect();
            inline(&chars, Styles::NONE, out);
        }
    }
}

/// The title of an ATX heading (`# Title`, up to six `#`).
fn heading(body: &str) -> Option<&str> {
    let level = body.chars().take_while(|&ch| ch == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &body[level..];
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim_end();
    (!title.is_empty()).then_some(title)
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Styles(u8);

impl Styles {
    const NONE: Styles = Styles(0);
    const BOLD: Styles = Styles(1);
    const ITALIC: Styles = Styles(2);
    const STRIKE: Styles = Styles(4);
    const LINK: Styles = Styles(8);

    fn has(self, style: Styles) -> bool {
        self.0 & style.0 != 0
    }

    fn with(self, style: Styles) -> Styles {
        Styles(self.0 | style.0)
    }
}

fn inline(chars: &[char], active: Styles, out: &mut Writer) {
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        let consumed = match ch {
            '\\' => match chars.get(i + 1) {
                Some(&next) if next.is_ascii_punctuation() => {
                    out.push_char(next);
                    2
                }
                _ => {
                    out.push_char('\\');
                    1
                }
            },
            '`' => code_span(chars, i, out),
            '*' | '_' => emphasis(chars, i, active, out),
            '~' => strikethrough(chars, i, active, out),
            '[' => link(chars, i, active, out),
            _ => 0,
        };
        if consumed == 0 {
            out.push_char(ch);
            i += 1;
        } else {
            i += consumed;
        }
    }
}

fn run_length(chars: &[char], at: usize, ch: char) -> usize {
    chars[at..].iter().take_while(|&&c| c == ch).count()
}

/// A code span: a run of backticks, its content, and a run of the same length.
fn code_span(chars: &[char], at: usize, out: &mut Writer) -> usize {
    let open = run_length(chars, at, '`');
    let start = at + open;
    let mut j = start;
    while j < chars.len() {
        if chars[j] == '`' {
            let run = run_length(chars, j, '`');
            if run == open {
                let mut content: &[char] = &chars[start..j];
                if content.len() > 2
                    && content.first() == Some(&' ')
                    && content.last() == Some(&' ')
                    && content.iter().any(|&ch| ch != ' ')
                {
                    content = &content[1..content.len() - 1];
                }
                if content.is_empty() {
                    return 0;
                }
                let content: String = content.iter().collect();
                out.push_raw("`");
                out.push_raw(&escape_code(&content));
                out.push_raw("`");
                return j + run - at;
            }
            j += run;
        } else {
            j += 1;
        }
    }
    for _ in 0..open {
        out.push_char('`');
    }
    open
}

/// `**bold**`, `__bold__`, `*italic*`, `_italic_`: the longest form that closes wins.
fn emphasis(chars: &[char], at: usize, active: Styles, out: &mut Writer) -> usize {
    let ch = chars[at];
    let run = run_length(chars, at, ch);
    for width in [2, 1] {
        if run < width {
            continue;
        }
        if let Some((end, close_at)) = closing(chars, at, width) {
            let style = if width == 2 {
                Styles::BOLD
            } else {
                Styles::ITALIC
            };
            let inner = &chars[at + width..close_at];
            wrap(inner, style, active, out);
            return end - at;
        }
    }
    0
}

/// Finds the closing delimiter for the `width` characters at `at`: returns the index just past
/// it and the index where it starts.
fn closing(chars: &[char], at: usize, width: usize) -> Option<(usize, usize)> {
    let ch = chars[at];
    let start = at + width;
    let opens = chars.get(start).is_some_and(|next| !next.is_whitespace())
        && (ch != '_' || at == 0 || !chars[at - 1].is_alphanumeric());
    if !opens {
        return None;
    }
    let mut depth = 0usize;
    let mut j = start + 1;
    while j < chars.len() {
        if chars[j] != ch {
            j += 1;
            continue;
        }
        let run = run_length(chars, j, ch);
        let fits = if width == 1 {
            run == 1 || run >= 3
        } else {
            run >= 2
        };
        let close_at = j + run - width;
        let after = j + run;
        let closes = fits
            && !chars[j - 1].is_whitespace()
            && close_at > start
            && (ch != '_' || chars.get(after).is_none_or(|next| !next.is_alphanumeric()));
        let opens_only = fits
            && chars[j - 1].is_whitespace()
            && chars.get(after).is_some_and(|next| !next.is_whitespace());
        if closes {
            if depth == 0 {
                return Some((after, close_at));
            }
            depth -= 1;
        } else if opens_only {
            depth += 1;
        }
        j += run;
    }
    None
}

/// `~~strikethrough~~`.
fn strikethrough(chars: &[char], at: usize, active: Styles, out: &mut Writer) -> usize {
    if run_length(chars, at, '~') < 2 {
        return 0;
    }
    let start = at + 2;
    if chars.get(start).is_none_or(|next| next.is_whitespace()) {
        return 0;
    }
    let mut j = start + 1;
    while j + 1 < chars.len() {
        if chars[j] == '~' && chars[j + 1] == '~' && !chars[j - 1].is_whitespace() {
            wrap(&chars[start..j], Styles::STRIKE, active, out);
            return j + 2 - at;
        }
        j += 1;
    }
    0
}

/// Writes `inner` inside the entity for `style`, or bare when that entity is already open.
fn wrap(inner: &[char], style: Styles, active: Styles, out: &mut Writer) {
    if active.has(style) {
        inline(inner, active, out);
        return;
    }
    let nested = active.with(style);
    if style == Styles::ITALIC {
        out.push_italic_marker();
        inline(inner, nested, out);
        out.push_italic_marker();
    } else {
        let marker = if style == Styles::BOLD { "*" } else { "~" };
        out.push_raw(marker);
        inline(inner, nested, out);
        out.push_raw(marker);
    }
}

/// `[text](url)`. Only absolute `http`, `https`, `tg` and `mailto` URLs become links (Telegram
/// refuses others); any other target is shown after the text in parentheses.
fn link(chars: &[char], at: usize, active: Styles, out: &mut Writer) -> usize {
    let mut depth = 0usize;
    let mut close_text = None;
    for (offset, &ch) in chars[at..].iter().enumerate() {
        match ch {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    close_text = Some(at + offset);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close_text) = close_text else {
        return 0;
    };
    if chars.get(close_text + 1) != Some(&'(') {
        return 0;
    }
    let url_start = close_text + 2;
    let mut depth = 1usize;
    let mut close_url = None;
    for (offset, &ch) in chars[url_start..].iter().enumerate() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close_url = Some(url_start + offset);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close_url) = close_url else {
        return 0;
    };
    let text = &chars[at + 1..close_text];
    let target: String = chars[url_start..close_url].iter().collect();
    let url = target.split_whitespace().next().unwrap_or("");
    let url = url
        .strip_prefix('<')
        .and_then(|url| url.strip_suffix('>'))
        .unwrap_or(url);
    if text.is_empty() || url.is_empty() {
        return 0;
    }
    let linkable = ["http://", "https://", "tg://", "mailto:"]
        .iter()
        .any(|scheme| url.len() > scheme.len() && url.to_ascii_lowercase().starts_with(scheme));
    if linkable && !active.has(Styles::LINK) {
        out.push_raw("[");
        inline(text, active.with(Styles::LINK), out);
        out.push_raw("](");
        out.push_raw(&escape_url(url));
        out.push_raw(")");
    } else {
        inline(text, active.with(Styles::LINK), out);
        out.push_char(' ');
        out.push_char('(');
        for ch in url.chars() {
            out.push_char(ch);
        }
        out.push_char(')');
    }
    close_url + 1 - at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(input: &str) -> String {
        to_telegram_markdown_v2(input)
    }

    #[test]
    fn every_case() {
        let cases: &[(&str, &str)] = &[
            ("plain words", "plain words"),
            ("", ""),
            (
                "Done. 1+1=2! (yes) {ok} #tag a|b x>y ~z",
                "Done\\. 1\\+1\\=2\\! \\(yes\\) \\{ok\\} \\#tag a\\|b x\\>y \\~z",
            ),
            ("back\\slash", "back\\\\slash"),
            ("**bold**", "*bold*"),
            ("__bold__", "*bold*"),
            ("*italic*", "_italic_"),
            ("_italic_", "_italic_"),
            ("***both***", "*_both_*"),
            (
                "**bold with _italic_ inside**",
                "*bold with _italic_ inside*",
            ),
            ("~~gone~~", "~gone~"),
            ("`code`", "`code`"),
            ("`a_b*c.d`", "`a_b*c.d`"),
            ("`` a ` b ``", "`a \\` b`"),
            ("`back\\slash`", "`back\\\\slash`"),
            (
                "[perch](https://example.com/a_b)",
                "[perch](https://example.com/a_b)",
            ),
            ("[x](https://e.com/f(1))", "[x](https://e.com/f(1\\))"),
            (
                "[**bold** link](https://e.com)",
                "[*bold* link](https://e.com)",
            ),
            ("[docs](./README.md)", "docs \\(\\./README\\.md\\)"),
            ("[not a link]", "\\[not a link\\]"),
            ("snake_case_name", "snake\\_case\\_name"),
            ("2 * 3 * 4", "2 \\* 3 \\* 4"),
            ("**unclosed", "\\*\\*unclosed"),
            ("a ** b", "a \\*\\* b"),
            ("`unclosed", "\\`unclosed"),
            ("\\*not italic\\*", "\\*not italic\\*"),
            ("*a*_b_", "_a_**_b_"),
            ("**outer **inner** outer**", "*outer inner outer*"),
            ("*a **b***", "_a *b*_"),
            ("# Title", "*Title*"),
            ("## **Already bold** title", "*Already bold title*"),
            ("#hashtag", "\\#hashtag"),
            ("- item", "• item"),
            ("  * nested", "  • nested"),
            ("1. first", "1\\. first"),
            ("> quoted *text*", ">quoted _text_"),
            ("  > indented quote", ">indented quote"),
            ("---", "\\-\\-\\-"),
            ("| a | b |", "\\| a \\| b \\|"),
            ("https://example.com/x.y", "https://example\\.com/x\\.y"),
            ("emoji 🎉 stays", "emoji 🎉 stays"),
        ];
        for (input, expected) in cases {
            assert_eq!(convert(input), *expected, "input: {input:?}");
        }
    }

    #[test]
    fn code_blocks_keep_their_content() {
        let input = "Run:\n```rust\nlet x = a_b * (c - 1); // `q` \\n\n```\nDone.";
        let expected = "Run:\n```rust\nlet x = a_b * (c - 1); // \\`q\\` \\\\n\n```\nDone\\.";
        assert_eq!(convert(input), expected);
    }

    #[test]
    fn an_unclosed_code_block_is_closed() {
        assert_eq!(convert("```\na.b\n"), "```\na.b\n\n```");
    }

    #[test]
    fn tilde_fences_and_odd_languages() {
        assert_eq!(convert("~~~\nx\n~~~"), "```\nx\n```");
        assert_eq!(convert("```c++\nx\n```"), "```c++\nx\n```");
        assert_eq!(convert("```{weird}\nx\n```"), "```\nx\n```");
    }

    #[test]
    fn spans_do_not_cross_lines() {
        assert_eq!(convert("**a\nb**"), "\\*\\*a\nb\\*\\*");
    }

    #[test]
    fn escaping_covers_every_reserved_character() {
        let reserved = "_*[]()~`>#+-=|{}.!\\";
        let escaped = escape_markdown_v2(reserved);
        let expected: String = reserved.chars().flat_map(|ch| ['\\', ch]).collect();
        assert_eq!(escaped, expected);
        assert_eq!(escape_markdown_v2("plain"), "plain");
    }

    #[test]
    fn unbalanced_input_still_escapes_everything() {
        for input in [
            "*", "_", "**", "__", "~~", "[", "](", "`", "***", "*_*_", "[a](", "_a_b_", "a_",
        ] {
            let output = convert(input);
            let mut chars = output.chars().peekable();
            let mut markers = 0;
            while let Some(ch) = chars.next() {
                if ch == '\\' {
                    chars.next();
                } else if RESERVED.contains(ch) {
                    markers += 1;
                }
            }
            assert!(markers % 2 == 0, "{input:?} -> {output:?}");
        }
    }
}
