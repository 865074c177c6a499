//! Lua source text read as tokens, to point a problem at the line it is about.
//!
//! A declaration's values reach the checks without positions (Lua keeps none per table key at
//! run time), so a problem about `spend.tokens_per_day` starts out on the line of the declaring
//! call. [`key_line`] finds the line where that key is written, walking the call's table
//! constructors by key; [`missing_separator`] finds where a syntax error most likely began when
//! two table fields have no comma between them. The lexer knows strings and their escapes, long
//! brackets (`[[...]]`, `[==[...]==]`), comments (`--`, `--[[ ]]`), numbers, names and
//! punctuation: enough to tell code from text, never to run it.

use crate::problem::{Pos, Problem};

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A name that is not a keyword.
    Name,
    Keyword,
    /// A quoted or long-bracket string, delimiters included in its text.
    String,
    Number,
    /// Punctuation and operators, such as `{`, `=`, `==`, `...`.
    Symbol,
}

/// One token of the source, with the lines it starts and ends on (a long string may span
/// several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'s> {
    pub kind: TokenKind,
    pub text: &'s str,
    pub line: u32,
    pub end_line: u32,
}

impl Token<'_> {
    fn is(&self, symbol: &str) -> bool {
        matches!(self.kind, TokenKind::Symbol | TokenKind::Keyword) && self.text == symbol
    }
}

const KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

const SYMBOLS: &[&str] = &[
    "...", "..", "==", "~=", "<=", ">=", "//", "::", "<<", ">>", "+", "-", "*", "/", "%", "^", "#",
    "&", "~", "|", "<", ">", "=", "(", ")", "{", "}", "[", "]", ";", ":", ",", ".",
];

/// The tokens of `source`, comments and whitespace left out. The lexer never fails: an
/// unfinished string or comment runs to where Lua would have stopped reading it, and a byte Lua
/// would refuse becomes a one-character symbol.
pub fn tokens(source: &str) -> Vec<Token<'_>> {
    let mut lexer = Lexer {
        source,
        bytes: source.as_bytes(),
        at: 0,
        line: 1,
    };
    let mut tokens = Vec::new();
    while let Some(token) = lexer.next_token() {
        tokens.push(token);
    }
    tokens
}

struct Lexer<'s> {
    source: &'s str,
    bytes: &'s [u8],
    at: usize,
    line: u32,
}

impl<'s> Lexer<'s> {
    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.at + ahead).copied()
    }

    /// Steps over a line break (`\n`, `\r`, `\r\n` or `\n\r`, one line each, as Lua counts).
    fn newline(&mut self) {
        let first = self.bytes[self.at];
        self.at += 1;
        if let Some(second) = self.peek(0)
            && (second == b'\n' || second == b'\r')
            && second != first
        {
            self.at += 1;
        }
        self.line += 1;
    }

    fn next_token(&mut self) -> Option<Token<'s>> {
        loop {
            let byte = self.peek(0)?;
            match byte {
                b'\n' | b'\r' => self.newline(),
                b' ' | b'\t' | 0x0b | 0x0c => self.at += 1,
                b'-' if self.peek(1) == Some(b'-') => {
                    self.at += 2;
                    if self.long_bracket_level().is_some() {
                        let start = self.at;
                        self.long_bracket(start);
                    } else {
                        while let Some(byte) = self.peek(0) {
                            if byte == b'\n' || byte == b'\r' {
                                break;
                            }
                            self.at += 1;
                        }
                    }
                }
                _ => return Some(self.token()),
            }
        }
    }

    fn token(&mut self) -> Token<'s> {
        let (start, line) = (self.at, self.line);
        let byte = self.bytes[self.at];
        let kind = if byte == b'"' || byte == b'\'' {
            self.quoted(byte);
            TokenKind::String
        } else if byte == b'[' && self.long_bracket_level().is_some() {
            self.long_bracket(start);
            TokenKind::String
        } else if byte.is_ascii_digit()
            || (byte == b'.' && self.peek(1).is_some_and(|next| next.is_ascii_digit()))
        {
            self.number();
            TokenKind::Number
        } else if byte.is_ascii_alphabetic() || byte == b'_' {
            while self
                .peek(0)
                .is_some_and(|next| next.is_ascii_alphanumeric() || next == b'_')
            {
                self.at += 1;
            }
            if KEYWORDS.contains(&&self.source[start..self.at]) {
                TokenKind::Keyword
            } else {
                TokenKind::Name
            }
        } else {
            let rest = &self.source[start..];
            match SYMBOLS.iter().find(|symbol| rest.starts_with(*symbol)) {
                Some(symbol) => self.at += symbol.len(),
                None => self.at += rest.chars().next().map_or(1, char::len_utf8),
            }
            TokenKind::Symbol
        };
        Token {
            kind,
            text: &self.source[start..self.at],
            line,
            end_line: self.line,
        }
    }

    /// A string in `quote`s; a backslash escapes the next character, a line break included.
    /// An unescaped line break ends an unfinished string, as it ends Lua's reading of it.
    fn quoted(&mut self, quote: u8) {
        self.at += 1;
        while let Some(byte) = self.peek(0) {
            match byte {
                b'\\' => {
                    self.at += 1;
                    match self.peek(0) {
                        Some(b'\n' | b'\r') => self.newline(),
                        Some(b'z') => {
                            self.at += 1;
                            while let Some(space) = self.peek(0) {
                                match space {
                                    b'\n' | b'\r' => self.newline(),
                                    b' ' | b'\t' | 0x0b | 0x0c => self.at += 1,
                                    _ => break,
                                }
                            }
                        }
                        Some(_) => self.skip_char(),
                        None => {}
                    }
                }
                b'\n' | b'\r' => return,
                _ if byte == quote => {
                    self.at += 1;
                    return;
                }
                _ => self.skip_char(),
            }
        }
    }

    fn skip_char(&mut self) {
        self.at += self.source[self.at..]
            .chars()
            .next()
            .map_or(1, char::len_utf8);
    }

    /// The level of a long bracket opening here (`[[` is 0, `[==[` is 2), if one does.
    fn long_bracket_level(&self) -> Option<usize> {
        if self.peek(0) != Some(b'[') {
            return None;
        }
        let equals = self.bytes[self.at + 1..]
            .iter()
            .take_while(|byte| **byte == b'=')
            .count();
        (self.peek(1 + equals) == Some(b'[')).then_some(equals)
    }

    /// A long bracket from its opening to its matching close, or to the end of the source.
    fn long_bracket(&mut self, start: usize) {
        let level = self.long_bracket_level().unwrap_or(0);
        self.at = start + level + 2;
        let close = format!("]{}]", "=".repeat(level));
        while let Some(byte) = self.peek(0) {
            match byte {
                b'\n' | b'\r' => self.newline(),
                b']' if self.source[self.at..].starts_with(&close) => {
                    self.at += close.len();
                    return;
                }
                _ => self.skip_char(),
            }
        }
    }

    /// A decimal or hexadecimal numeral, with its fraction and exponent.
    fn number(&mut self) {
        let hex = self.peek(0) == Some(b'0') && matches!(self.peek(1), Some(b'x' | b'X'));
        if hex {
            self.at += 2;
        }
        let exponent: &[u8] = if hex { b"pP" } else { b"eE" };
        while let Some(byte) = self.peek(0) {
            if exponent.contains(&byte) {
                self.at += 1;
                if matches!(self.peek(0), Some(b'+' | b'-')) {
                    self.at += 1;
                }
            } else if byte.is_ascii_alphanumeric() || byte == b'.' {
                self.at += 1;
            } else {
                break;
            }
        }
    }
}

/// How one token changes the nesting of brackets and blocks: `+1` opens, `-1` closes.
fn nesting(token: &Token<'_>) -> i32 {
    match (token.kind, token.text) {
        (TokenKind::Symbol, "(" | "{" | "[")
        | (TokenKind::Keyword, "function" | "do" | "if" | "repeat") => 1,
        (TokenKind::Symbol, ")" | "}" | "]") | (TokenKind::Keyword, "end" | "until") => -1,
        _ => 0,
    }
}

/// One step of a problem's key path: `spend`, or `[2]` (counting from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// Reads `secrets[1].hosts` into its steps; `None` when it is not a key path.
fn steps(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if !name.is_empty() {
            steps.push(Step::Key(name.to_owned()));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let (index, after) = inner.split_once(']')?;
            steps.push(Step::Index(index.parse().ok()?));
            rest = after;
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(steps)
}

/// A field of a table constructor: its key, the line it starts on and where its value begins.
#[derive(Debug)]
struct Field {
    key: FieldKey,
    line: u32,
    value: usize,
}

#[derive(Debug, PartialEq)]
enum FieldKey {
    Name(String),
    Position(usize),
    /// `[expression] = value` with a key that is not a plain string or integer.
    Other,
}

/// The fields of the table constructor whose `{` is `tokens[open]`.
fn fields(tokens: &[Token<'_>], open: usize) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut position = 0;
    let mut at = open + 1;
    while let Some(first) = tokens.get(at) {
        if first.is("}") {
            break;
        }
        let (key, value) = match (first.kind, tokens.get(at + 1), tokens.get(at + 2)) {
            (TokenKind::Name, Some(equals), _) if equals.is("=") => {
                (FieldKey::Name(first.text.to_owned()), at + 2)
            }
            _ if first.is("[") => {
                match (tokens.get(at + 1), tokens.get(at + 2), tokens.get(at + 3)) {
                    (Some(key), Some(close), Some(equals)) if close.is("]") && equals.is("=") => {
                        (bracketed_key(key), at + 4)
                    }
                    _ => (FieldKey::Other, at),
                }
            }
            _ => {
                position += 1;
                (FieldKey::Position(position), at)
            }
        };
        fields.push(Field {
            key,
            line: first.line,
            value,
        });
        let mut depth = 0;
        at = value;
        while let Some(token) = tokens.get(at) {
            if depth == 0 && (token.is(",") || token.is(";")) {
                at += 1;
                break;
            }
            if depth == 0 && token.is("}") {
                break;
            }
            depth += nesting(token);
            if depth < 0 {
                return fields;
            }
            at += 1;
        }
    }
    fields
}

/// The key of `[key] = value`: a quoted string's text (without escapes, which keys rarely
/// need) or an integer's position.
fn bracketed_key(key: &Token<'_>) -> FieldKey {
    let quoted = key.kind == TokenKind::String
        && !key.text.contains('\\')
        && !key.text.starts_with('[')
        && key.text.len() >= 2;
    if quoted {
        return FieldKey::Name(key.text[1..key.text.len() - 1].to_owned());
    }
    match key.kind {
        TokenKind::Number => key.text.parse().map_or(FieldKey::Other, FieldKey::Position),
        _ => FieldKey::Other,
    }
}

/// The line where the key `path` (`spend.tokens_per_day`, `secrets[1].hosts`) is written in
/// the table the call of `function` on `call_line` declares (`agent { ... }`, or the first table
/// among its arguments, as in `tool("name", { ... })`). A path may start with the name a call
/// gives as its first argument (`name.params[1]` for `tool("name", { params = ... })`).
///
/// When the path leads through a value that is not written as a table (a variable, a function
/// call), the line of the deepest key found is given; `None` when not even the first key is
/// written in the call, or there is no such call on that line.
pub fn key_line(source: &str, call_line: u32, function: &str, path: &str) -> Option<u32> {
    let steps = steps(path)?;
    let tokens = tokens(source);
    let call = tokens.iter().position(|token| {
        token.kind == TokenKind::Name && token.text == function && token.line == call_line
    })?;
    let mut table = table_argument(&tokens, call + 1)?;
    let mut found = None;
    let mut rest = steps.as_slice();
    if let (Some(Step::Key(name)), Some(open), Some(first)) =
        (rest.first(), tokens.get(call + 1), tokens.get(call + 2))
        && open.is("(")
        && first.kind == TokenKind::String
        && first.text.get(1..first.text.len().saturating_sub(1)) == Some(name.as_str())
    {
        rest = &rest[1..];
    }
    while let Some((line, value, taken)) = find_field(&fields(&tokens, table), rest) {
        found = Some(line);
        rest = &rest[taken..];
        match tokens.get(value) {
            Some(token) if !rest.is_empty() && token.is("{") => table = value,
            _ => break,
        }
    }
    found
}

/// The index of the `{` of the first table among the arguments of the call whose arguments
/// start at `tokens[at]`.
fn table_argument(tokens: &[Token<'_>], at: usize) -> Option<usize> {
    let first = tokens.get(at)?;
    if first.is("{") {
        return Some(at);
    }
    if !first.is("(") {
        return None;
    }
    let mut depth = 0;
    for (index, token) in tokens.iter().enumerate().skip(at + 1) {
        if depth == 0 && token.is("{") {
            return Some(index);
        }
        if depth == 0 && token.is(")") {
            return None;
        }
        depth += nesting(token);
    }
    None
}

/// The line and value of the field the first steps of a path name, and how many steps it
/// took: a key with dots in it (`["a.b"] = 1`) takes several. Of repeated keys the last counts,
/// as in Lua.
fn find_field(fields: &[Field], steps: &[Step]) -> Option<(u32, usize, usize)> {
    let found = |key: FieldKey, taken: usize| {
        fields
            .iter()
            .rev()
            .find(|field| field.key == key)
            .map(|field| (field.line, field.value, taken))
    };
    match steps.first()? {
        Step::Index(index) => found(FieldKey::Position(*index), 1),
        Step::Key(_) => {
            let names: Vec<&str> = steps
                .iter()
                .map_while(|step| match step {
                    Step::Key(name) => Some(name.as_str()),
                    Step::Index(_) => None,
                })
                .collect();
            (1..=names.len())
                .rev()
                .find_map(|taken| found(FieldKey::Name(names[..taken].join(".")), taken))
        }
    }
}

/// Moves each problem of `file` that sits on the line of a `function` call and names a key
/// path to the line where that key is written in the call's table.
pub fn point_at_keys(problems: &mut [Problem], file: &str, source: &str, function: &str) {
    for problem in problems.iter_mut() {
        if problem.file != file
            || problem.path.is_empty()
            || problem.pos.line == 0
            || problem.pos.column.is_some()
        {
            continue;
        }
        if let Some(line) = key_line(source, problem.pos.line, function, &problem.path) {
            problem.pos = Pos::line(line);
        }
    }
}

/// Where a syntax error most likely began when it is a missing separator between two fields
/// of a table constructor: the line a field's value ends on, when the next token, on a later
/// line and with no `,` or `;` between, can only start another field. Lua reports such an
/// error where it noticed it, at the next field or later; the first such place at or before
/// `error_line` is given.
pub fn missing_separator(source: &str, error_line: u32) -> Option<u32> {
    let tokens = tokens(source);
    let mut open: Vec<&Token<'_>> = Vec::new();
    for (index, token) in tokens.iter().enumerate() {
        if token.line > error_line {
            break;
        }
        if nesting(token) < 0 {
            open.pop();
        }
        let in_constructor = open.last().is_some_and(|opener| opener.is("{"));
        if in_constructor
            && let Some(next) = tokens.get(index + 1)
            && next.line > token.end_line
            && next.line <= error_line
            && starts_another_field(token, &tokens, index + 1)
        {
            return Some(token.end_line);
        }
        if nesting(token) > 0 {
            open.push(token);
        }
    }
    None
}

/// Whether, in Lua's grammar, a field whose value ends with `last` cannot go on with
/// `tokens[next]`, which starts a field instead.
///
/// A value ending in a name, `)` or `]` may go on as a call (`f "x"`, `f {}`, `f (x)`) or an
/// index (`t [1]`), so after one only `name =` and `[key] =` start a field for sure, or a
/// token no expression continues with (a number, `nil`, `true`, `false`, `function`, `not`,
/// `#`, `...`). A value ending otherwise (a string, a number, `}`, `end`, `nil`...) goes on
/// only with a binary operator, so any token that starts an expression starts a field.
fn starts_another_field(last: &Token<'_>, tokens: &[Token<'_>], next: usize) -> bool {
    let Some(token) = tokens.get(next) else {
        return false;
    };
    let keyed = (token.kind == TokenKind::Name && tokens.get(next + 1).is_some_and(|t| t.is("=")))
        || (token.is("[") && bracket_is_a_key(tokens, next));
    let never_continues = token.kind == TokenKind::Number
        || matches!(
            (token.kind, token.text),
            (
                TokenKind::Keyword,
                "nil" | "true" | "false" | "function" | "not"
            ) | (TokenKind::Symbol, "#" | "...")
        );
    let starts_expression = never_continues
        || matches!(token.kind, TokenKind::Name | TokenKind::String)
        || token.is("{")
        || token.is("[");
    match (last.kind, last.text) {
        (TokenKind::Name, _) | (TokenKind::Symbol, ")" | "]") => keyed || never_continues,
        (TokenKind::String | TokenKind::Number, _)
        | (TokenKind::Keyword, "nil" | "true" | "false" | "end")
        | (TokenKind::Symbol, "}" | "...") => starts_expression,
        _ => false,
    }
}

/// Whether the `[` at `tokens[open]` closes with a `]` followed by `=`: a key, not an index.
fn bracket_is_a_key(tokens: &[Token<'_>], open: usize) -> bool {
    let mut depth = 0;
    for (index, token) in tokens.iter().enumerate().skip(open) {
        depth += nesting(token);
        if depth == 0 {
            return tokens.get(index + 1).is_some_and(|after| after.is("="));
        }
    }
    false
}

/// The line of the last complete token before the token a syntax error was noticed at: the
/// first token on `error_line` Lua names (`near 'memory'`), or the end of the source for
/// `near <eof>`. `None` when that token cannot be found, or the one before it is on the same
/// line.
pub fn line_before_failure(source: &str, error_line: u32, near: Option<&str>) -> Option<u32> {
    let tokens = tokens(source);
    let failing = match near {
        None => tokens.len(),
        Some(text) => tokens
            .iter()
            .position(|token| token.end_line == error_line && token.text == text)
            .or_else(|| tokens.iter().position(|token| token.line == error_line))?,
    };
    let before = tokens.get(failing.checked_sub(1)?)?;
    (before.end_line < error_line).then_some(before.end_line)
}

#[cfg(test)]
mod tests;
