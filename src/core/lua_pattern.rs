//! Lua's pattern matching (`string.find`, `match`, `gmatch`, `gsub`) with its work counted.
//!
//! Lua's own matcher runs in C, where the instruction budget cannot reach it: the trim idiom
//! `^%s*(.-)%s*$` backtracks quadratically over a run of spaces, and a pattern with several
//! quantifiers does worse. This is the same algorithm (Lua 5.4's `lstrlib.c`) with every step
//! taken from a [`Steps`] allowance, so a match stops when the allowance is spent.

/// The most captures one pattern may make, as in Lua.
pub const MAX_CAPTURES: usize = 32;

/// How deep the matcher may recurse, as in Lua (`MAXCCALLS`).
const MAX_DEPTH: u32 = 200;

/// The work a match may still do; one step is about one Lua instruction's worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    pub left: u64,
}

impl Steps {
    fn take(&mut self, count: u64) -> Result<(), MatchError> {
        match self.left.checked_sub(count) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.left = 0;
                Err(MatchError::OutOfSteps)
            }
        }
    }
}

/// Why a match did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchError {
    /// The pattern is not valid; the text is Lua's own message.
    Pattern(String),
    /// The allowance ran out.
    OutOfSteps,
}

fn malformed(message: impl Into<String>) -> MatchError {
    MatchError::Pattern(message.into())
}

/// One capture of a successful match, as byte offsets into the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// `(...)`: the text from `start` to `end`.
    Text { start: usize, end: usize },
    /// `()`: the position, 0-based (Lua shows it 1-based).
    Position(usize),
}

/// A successful match: the matched range and the pattern's captures, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub start: usize,
    pub end: usize,
    pub captures: Vec<Capture>,
}

impl Match {
    /// Capture `index` (0-based), or the whole match for index 0 when the pattern captures
    /// nothing; what `%1` means in a replacement.
    pub fn capture(&self, index: usize) -> Result<Capture, MatchError> {
        match self.captures.get(index) {
            Some(capture) => Ok(*capture),
            None if index == 0 => Ok(Capture::Text {
                start: self.start,
                end: self.end,
            }),
            None => Err(malformed(format!("invalid capture index %{}", index + 1))),
        }
    }

    /// What `string.match` and `gmatch` return: the captures, or the whole match.
    pub fn values(&self) -> Vec<Capture> {
        if self.captures.is_empty() {
            vec![Capture::Text {
                start: self.start,
                end: self.end,
            }]
        } else {
            self.captures.clone()
        }
    }
}

/// A pattern ready to match: its anchor split off.
#[derive(Debug, Clone, Copy)]
pub struct Pattern<'p> {
    body: &'p [u8],
    anchored: bool,
}

impl<'p> Pattern<'p> {
    pub fn new(pattern: &'p [u8]) -> Pattern<'p> {
        match pattern.split_first() {
            Some((b'^', body)) => Pattern {
                body,
                anchored: true,
            },
            _ => Pattern {
                body: pattern,
                anchored: false,
            },
        }
    }

    /// A pattern whose `^` is an ordinary character, as `gmatch` reads it.
    pub fn without_anchor(pattern: &'p [u8]) -> Pattern<'p> {
        Pattern {
            body: pattern,
            anchored: false,
        }
    }

    /// Whether the pattern begins with `^`.
    pub fn is_anchored(&self) -> bool {
        self.anchored
    }

    /// The pattern matched at exactly `start`.
    pub fn match_at(
        &self,
        subject: &[u8],
        start: usize,
        steps: &mut Steps,
    ) -> Result<Option<Match>, MatchError> {
        let mut state = State {
            subject,
            pattern: self.body,
            captures: Vec::new(),
            depth: MAX_DEPTH,
            steps,
        };
        match state.do_match(start, 0)? {
            Some(end) => Ok(Some(Match {
                start,
                end,
                captures: state.finished_captures()?,
            })),
            None => Ok(None),
        }
    }

    /// The first match at `init` or later (only at `init` when anchored), like `string.find`.
    pub fn find(
        &self,
        subject: &[u8],
        init: usize,
        steps: &mut Steps,
    ) -> Result<Option<Match>, MatchError> {
        let mut start = init;
        while start <= subject.len() {
            steps.take(1)?;
            if let Some(found) = self.match_at(subject, start, steps)? {
                return Ok(Some(found));
            }
            if self.anchored {
                break;
            }
            start += 1;
        }
        Ok(None)
    }
}

/// Whether `pattern` has none of Lua's special characters, so `find` may search it plainly.
pub fn is_plain(pattern: &[u8]) -> bool {
    !pattern.iter().any(|byte| b"^$*+?.([%-".contains(byte))
}

/// The first occurrence of `needle` in `haystack` at `init` or later.
pub fn find_plain(
    haystack: &[u8],
    needle: &[u8],
    init: usize,
    steps: &mut Steps,
) -> Result<Option<usize>, MatchError> {
    if needle.is_empty() {
        return Ok(Some(init));
    }
    let Some(last_start) = haystack.len().checked_sub(needle.len()) else {
        return Ok(None);
    };
    let cost = 1 + needle.len() as u64 / 64;
    for start in init..=last_start {
        steps.take(cost)?;
        if haystack[start..].starts_with(needle) {
            return Ok(Some(start));
        }
    }
    Ok(None)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    Unfinished,
    Position,
    Bytes(usize),
}

struct State<'a, 's> {
    subject: &'a [u8],
    pattern: &'a [u8],
    captures: Vec<(usize, Length)>,
    depth: u32,
    steps: &'s mut Steps,
}

impl State<'_, '_> {
    fn pattern_at(&self, p: usize) -> u8 {
        self.pattern.get(p).copied().unwrap_or(0)
    }

    fn subject_at(&self, s: usize) -> u8 {
        self.subject.get(s).copied().unwrap_or(0)
    }

    fn finished_captures(&self) -> Result<Vec<Capture>, MatchError> {
        self.captures
            .iter()
            .map(|(start, length)| match length {
                Length::Unfinished => Err(malformed("unfinished capture")),
                Length::Position => Ok(Capture::Position(*start)),
                Length::Bytes(length) => Ok(Capture::Text {
                    start: *start,
                    end: start + length,
                }),
            })
            .collect()
    }

    fn class_end(&self, mut p: usize) -> Result<usize, MatchError> {
        let first = self.pattern_at(p);
        p += 1;
        match first {
            b'%' => {
                if p >= self.pattern.len() {
                    return Err(malformed("malformed pattern (ends with '%')"));
                }
                Ok(p + 1)
            }
            b'[' => {
                if self.pattern_at(p) == b'^' {
                    p += 1;
                }
                loop {
                    if p >= self.pattern.len() {
                        return Err(malformed("malformed pattern (missing ']')"));
                    }
                    let byte = self.pattern[p];
                    p += 1;
                    if byte == b'%' && p < self.pattern.len() {
                        p += 1;
                    }
                    if self.pattern_at(p) == b']' {
                        break;
                    }
                }
                Ok(p + 1)
            }
            _ => Ok(p),
        }
    }

    fn bracket_class(&self, c: u8, mut p: usize, class_end: usize) -> bool {
        let mut matched = true;
        if self.pattern_at(p + 1) == b'^' {
            matched = false;
            p += 1;
        }
        p += 1;
        while p < class_end {
            let byte = self.pattern_at(p);
            if byte == b'%' {
                p += 1;
                if class_matches(c, self.pattern_at(p)) {
                    return matched;
                }
            } else if self.pattern_at(p + 1) == b'-' && p + 2 < class_end {
                if byte <= c && c <= self.pattern_at(p + 2) {
                    return matched;
                }
                p += 2;
            } else if byte == c {
                return matched;
            }
            p += 1;
        }
        !matched
    }

    fn single_match(&self, s: usize, p: usize, class_end: usize) -> bool {
        if s >= self.subject.len() {
            return false;
        }
        let c = self.subject[s];
        match self.pattern_at(p) {
            b'.' => true,
            b'%' => class_matches(c, self.pattern_at(p + 1)),
            b'[' => self.bracket_class(c, p, class_end - 1),
            literal => literal == c,
        }
    }

    fn do_match(&mut self, s: usize, p: usize) -> Result<Option<usize>, MatchError> {
        if self.depth == 0 {
            return Err(malformed("pattern too complex"));
        }
        self.depth -= 1;
        let result = self.match_body(s, p);
        self.depth += 1;
        result
    }

    fn match_body(&mut self, mut s: usize, mut p: usize) -> Result<Option<usize>, MatchError> {
        loop {
            self.steps.take(1)?;
            if p >= self.pattern.len() {
                return Ok(Some(s));
            }
            match self.pattern[p] {
                b'(' => {
                    return if self.pattern_at(p + 1) == b')' {
                        self.start_capture(s, p + 2, Length::Position)
                    } else {
                        self.start_capture(s, p + 1, Length::Unfinished)
                    };
                }
                b')' => return self.end_capture(s, p + 1),
                b'$' if p + 1 == self.pattern.len() => {
                    return Ok((s == self.subject.len()).then_some(s));
                }
                b'%' if self.pattern_at(p + 1) == b'b' => match self.balance(s, p + 2)? {
                    Some(end) => {
                        s = end;
                        p += 4;
                        continue;
                    }
                    None => return Ok(None),
                },
                b'%' if self.pattern_at(p + 1) == b'f' => {
                    p += 2;
                    if self.pattern_at(p) != b'[' {
                        return Err(malformed("missing '[' after '%f' in pattern"));
                    }
                    let class_end = self.class_end(p)?;
                    let previous = if s == 0 { 0 } else { self.subject_at(s - 1) };
                    let current = self.subject_at(s);
                    if !self.bracket_class(previous, p, class_end - 1)
                        && self.bracket_class(current, p, class_end - 1)
                    {
                        p = class_end;
                        continue;
                    }
                    return Ok(None);
                }
                b'%' if self.pattern_at(p + 1).is_ascii_digit() => {
                    match self.match_capture(s, self.pattern_at(p + 1))? {
                        Some(end) => {
                            s = end;
                            p += 2;
                            continue;
                        }
                        None => return Ok(None),
                    }
                }
                _ => {}
            }
            let class_end = self.class_end(p)?;
            let suffix = self.pattern_at(class_end);
            if !self.single_match(s, p, class_end) {
                if matches!(suffix, b'*' | b'?' | b'-') {
                    p = class_end + 1;
                    continue;
                }
                return Ok(None);
            }
            match suffix {
                b'?' => {
                    if let Some(end) = self.do_match(s + 1, class_end + 1)? {
                        return Ok(Some(end));
                    }
                    p = class_end + 1;
                }
                b'+' => return self.max_expand(s + 1, p, class_end),
                b'*' => return self.max_expand(s, p, class_end),
                b'-' => return self.min_expand(s, p, class_end),
                _ => {
                    s += 1;
                    p = class_end;
                }
            }
        }
    }

    fn max_expand(
        &mut self,
        s: usize,
        p: usize,
        class_end: usize,
    ) -> Result<Option<usize>, MatchError> {
        let mut count = 0;
        while self.single_match(s + count, p, class_end) {
            self.steps.take(1)?;
            count += 1;
        }
        loop {
            if let Some(end) = self.do_match(s + count, class_end + 1)? {
                return Ok(Some(end));
            }
            if count == 0 {
                return Ok(None);
            }
            count -= 1;
        }
    }

    fn min_expand(
        &mut self,
        mut s: usize,
        p: usize,
        class_end: usize,
    ) -> Result<Option<usize>, MatchError> {
        loop {
            if let Some(end) = self.do_match(s, class_end + 1)? {
                return Ok(Some(end));
            }
            if !self.single_match(s, p, class_end) {
                return Ok(None);
            }
            s += 1;
        }
    }

    fn start_capture(
        &mut self,
        s: usize,
        p: usize,
        length: Length,
    ) -> Result<Option<usize>, MatchError> {
        if self.captures.len() >= MAX_CAPTURES {
            return Err(malformed("too many captures"));
        }
        self.captures.push((s, length));
        let result = self.do_match(s, p)?;
        if result.is_none() {
            self.captures.pop();
        }
        Ok(result)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Result<Option<usize>, MatchError> {
        let Some(open) = self
            .captures
            .iter()
            .rposition(|(_, length)| *length == Length::Unfinished)
        else {
            return Err(malformed("invalid pattern capture"));
        };
        self.captures[open].1 = Length::Bytes(s - self.captures[open].0);
        let result = self.do_match(s, p)?;
        if result.is_none() {
            self.captures[open].1 = Length::Unfinished;
        }
        Ok(result)
    }

    fn match_capture(&mut self, s: usize, digit: u8) -> Result<Option<usize>, MatchError> {
        let index = usize::from(digit).wrapping_sub(usize::from(b'1'));
        let (start, length) = match self.captures.get(index) {
            Some((start, Length::Bytes(length))) => (*start, *length),
            Some((_, Length::Position)) => return Ok(None),
            _ => {
                return Err(malformed(format!(
                    "invalid capture index %{}",
                    index.wrapping_add(1)
                )));
            }
        };
        self.steps.take(1 + length as u64 / 64)?;
        let end = s + length;
        if end <= self.subject.len() && self.subject[start..start + length] == self.subject[s..end]
        {
            Ok(Some(end))
        } else {
            Ok(None)
        }
    }

    fn balance(&mut self, mut s: usize, p: usize) -> Result<Option<usize>, MatchError> {
        if p + 1 >= self.pattern.len() {
            return Err(malformed("malformed pattern (missing arguments to '%b')"));
        }
        if s >= self.subject.len() || self.subject[s] != self.pattern[p] {
            return Ok(None);
        }
        let (open, close) = (self.pattern[p], self.pattern[p + 1]);
        let mut depth = 1;
        s += 1;
        while s < self.subject.len() {
            self.steps.take(1)?;
            let byte = self.subject[s];
            if byte == close {
                depth -= 1;
                if depth == 0 {
                    return Ok(Some(s + 1));
                }
            } else if byte == open {
                depth += 1;
            }
            s += 1;
        }
        Ok(None)
    }
}

/// Whether `c` is in the class `%class` (`%a`, `%d`, ...; upper case is the complement; any
/// other character stands for itself), in the C locale as Lua uses it.
fn class_matches(c: u8, class: u8) -> bool {
    let found = match class.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        b's' => matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0,
        _ => return class == c,
    };
    if class.is_ascii_lowercase() {
        found
    } else {
        !found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLENTY: Steps = Steps { left: 100_000_000 };

    fn texts(subject: &str, found: &Match) -> Vec<String> {
        found
            .values()
            .iter()
            .map(|capture| match capture {
                Capture::Text { start, end } => subject[*start..*end].to_owned(),
                Capture::Position(at) => format!("@{}", at + 1),
            })
            .collect()
    }

    fn matched(subject: &str, pattern: &str) -> Option<Vec<String>> {
        let mut steps = PLENTY;
        Pattern::new(pattern.as_bytes())
            .find(subject.as_bytes(), 0, &mut steps)
            .expect("a valid pattern")
            .map(|found| texts(subject, &found))
    }

    #[test]
    fn matches_as_lua_does() {
        let cases: &[(&str, &str, Option<&[&str]>)] = &[
            ("  hello world  ", "^%s*(.-)%s*$", Some(&["hello world"])),
            ("hello", "l+", Some(&["ll"])),
            ("hello", "^l", None),
            ("key = value", "(%w+)%s*=%s*(%w+)", Some(&["key", "value"])),
            ("abc", "()b()", Some(&["@2", "@3"])),
            ("f(a(b)c)d", "%b()", Some(&["(a(b)c)"])),
            ("THE (quick) fox", "%f[%a]%a+", Some(&["THE"])),
            ("hello hello", "(h%a+) %1", Some(&["hello"])),
            ("x=1, y=22", "%d+$", Some(&["22"])),
            ("a.b", "%.", Some(&["."])),
            ("[x]", "[%[%]]", Some(&["["])),
            ("abc", "[^a]+", Some(&["bc"])),
            ("a-z", "[a%-]+", Some(&["a-"])),
            ("hello", "[a-f]", Some(&["e"])),
            ("colour", "colou?r", Some(&["colour"])),
            ("color", "colou?r", Some(&["color"])),
            ("aaa", "a-b", None),
            ("", "^$", Some(&[""])),
            ("tab\there", "%S+$", Some(&["here"])),
            ("x$y", "x$y", Some(&["x$y"])),
        ];
        for (subject, pattern, expected) in cases {
            let expected = expected.map(|texts| texts.iter().map(|t| (*t).to_owned()).collect());
            assert_eq!(
                matched(subject, pattern),
                expected,
                "{subject:?} ~ {pattern:?}"
            );
        }
    }

    #[test]
    fn malformed_patterns_get_lua_messages() {
        for (pattern, message) in [
            ("%", "malformed pattern (ends with '%')"),
            ("[a", "malformed pattern (missing ']')"),
            ("(a", "unfinished capture"),
            ("a)", "invalid pattern capture"),
            ("%1", "invalid capture index %1"),
            ("%fa", "missing '[' after '%f' in pattern"),
            ("%b", "malformed pattern (missing arguments to '%b')"),
        ] {
            let mut steps = PLENTY;
            let result = Pattern::new(pattern.as_bytes()).find(b"aaa", 0, &mut steps);
            assert_eq!(
                result,
                Err(MatchError::Pattern(message.into())),
                "{pattern:?}"
            );
        }
        let deep = "(".repeat(40) + &")".repeat(40);
        let mut steps = PLENTY;
        assert_eq!(
            Pattern::new(deep.as_bytes()).find(b"a", 0, &mut steps),
            Err(MatchError::Pattern("too many captures".into()))
        );
    }

    #[test]
    fn the_trim_idiom_on_a_long_run_of_spaces_runs_out_of_steps() {
        let subject = format!("x{}y", " ".repeat(60_000));
        let mut steps = Steps { left: 10_000_000 };
        let result = Pattern::new(b"^%s*(.-)%s*$").find(subject.as_bytes(), 0, &mut steps);
        assert_eq!(result, Err(MatchError::OutOfSteps));
        assert_eq!(steps.left, 0);
    }

    #[test]
    fn the_trim_idiom_on_ordinary_text_is_cheap() {
        let subject = format!("  {}  ", "word ".repeat(12_000));
        let mut steps = Steps { left: 1_000_000 };
        let found = Pattern::new(b"^%s*(.-)%s*$")
            .find(subject.as_bytes(), 0, &mut steps)
            .expect("enough steps")
            .expect("a match");
        assert_eq!(found.captures.len(), 1);
        assert!(steps.left > 0);
    }

    #[test]
    fn nested_quantifiers_run_out_of_steps() {
        let subject = "a".repeat(2_000);
        let mut steps = Steps { left: 1_000_000 };
        let result = Pattern::new(b".-.-.-.-.-b").find(subject.as_bytes(), 0, &mut steps);
        assert_eq!(result, Err(MatchError::OutOfSteps));
    }

    #[test]
    fn plain_search_counts_its_work() {
        let mut steps = PLENTY;
        assert_eq!(find_plain(b"hello", b"ll", 0, &mut steps), Ok(Some(2)));
        assert_eq!(find_plain(b"hello", b"ll", 3, &mut steps), Ok(None));
        assert_eq!(find_plain(b"hello", b"", 4, &mut steps), Ok(Some(4)));
        let haystack = vec![b'a'; 100_000];
        let mut few = Steps { left: 1_000 };
        assert_eq!(
            find_plain(&haystack, b"ab", 0, &mut few),
            Err(MatchError::OutOfSteps)
        );
        assert!(is_plain(b"hello world") && !is_plain(b"a.b"));
    }
}
