//! The text rules of the fake Bot API: the entities Telegram finds in a message, and MarkdownV2
//! parsed the way Telegram parses it.

use super::User;
use serde_json::{Value, json};

/// Mention and bot-command entities as Telegram finds them, plus the given text mentions;
/// offsets and lengths in UTF-16 code units.
pub(super) fn entities(text: &str, text_mentions: &[(String, User)]) -> Vec<Value> {
    let word = |ch: char| ch.is_ascii_alphanumeric() || ch == '_';
    let chars: Vec<char> = text.chars().collect();
    let utf16 = |index: usize| -> usize { chars[..index].iter().map(|ch| ch.len_utf16()).sum() };
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || chars[i - 1].is_whitespace();
        let after_word = i > 0 && word(chars[i - 1]);
        if chars[i] == '@' && !after_word {
            let len = chars[i + 1..].iter().take_while(|&&ch| word(ch)).count();
            if (5..=32).contains(&len) {
                found.push(json!({"type": "mention", "offset": utf16(i), "length": len + 1}));
                i += len + 1;
                continue;
            }
        }
        if chars[i] == '/' && boundary {
            let mut len = chars[i + 1..].iter().take_while(|&&ch| word(ch)).count();
            if (1..=64).contains(&len) {
                if chars.get(i + 1 + len) == Some(&'@') {
                    let handle = chars[i + 2 + len..]
                        .iter()
                        .take_while(|&&ch| word(ch))
                        .count();
                    if handle > 0 {
                        len += handle + 1;
                    }
                }
                found.push(json!({"type": "bot_command", "offset": utf16(i), "length": len + 1}));
                i += len + 1;
                continue;
            }
        }
        i += 1;
    }
    for (span, user) in text_mentions {
        let start = text
            .find(span.as_str())
            .expect("the text mention's span is in the text");
        let offset: usize = text[..start].chars().map(char::len_utf16).sum();
        let length: usize = span.chars().map(char::len_utf16).sum();
        found.push(json!({"type": "text_mention", "offset": offset, "length": length, "user": user.json()}));
    }
    found.sort_by_key(|entity| entity["offset"].as_u64());
    found
}

const RESERVED: &str = "_*[]()~`>#+-=|{}.!";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entity {
    Bold,
    Italic,
    Underline,
    Strikethrough,
    Spoiler,
    TextUrl,
}

/// Parses MarkdownV2 the way Telegram does; returns the text users see, or the description
/// after `can't parse entities: `.
pub fn parse_markdown_v2(text: &str) -> Result<String, String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|&(_, ch)| ch);
    let escapable = |ch: Option<char>| ch.is_some_and(|ch| (1..=126).contains(&(ch as u32)));
    let mut shown = String::new();
    let mut open: Vec<(Entity, usize)> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (offset, ch) = chars[i];
        let next = at(i + 1);
        if ch == '\\' && escapable(next) {
            shown.push(next.unwrap_or_default());
            i += 2;
            continue;
        }
        if ch == '`' {
            let pre = next == Some('`') && at(i + 2) == Some('`');
            let mut j = if pre { i + 3 } else { i + 1 };
            if pre {
                while at(j).is_some_and(|ch| ch != '\n') {
                    j += 1;
                }
                j += 1;
            }
            let mut closed = false;
            while let Some(ch) = at(j) {
                if ch == '\\' && escapable(at(j + 1)) {
                    shown.push(at(j + 1).unwrap_or_default());
                    j += 2;
                    continue;
                }
                if ch == '`' && (!pre || (at(j + 1) == Some('`') && at(j + 2) == Some('`'))) {
                    closed = true;
                    break;
                }
                shown.push(ch);
                j += 1;
            }
            if !closed {
                let kind = if pre { "Pre" } else { "Code" };
                return Err(format!(
                    "Can't find end of {kind} entity at byte offset {offset}"
                ));
            }
            i = j + if pre { 3 } else { 1 };
            continue;
        }
        if let Some(&(top, _)) = open.last() {
            let ends = match top {
                Entity::Bold => ch == '*',
                Entity::Italic => ch == '_' && next != Some('_'),
                Entity::Underline => ch == '_' && next == Some('_'),
                Entity::Strikethrough => ch == '~',
                Entity::Spoiler => ch == '|' && next == Some('|'),
                Entity::TextUrl => ch == ']',
            };
            if ends {
                open.pop();
                i += if matches!(top, Entity::Underline | Entity::Spoiler) {
                    2
                } else {
                    1
                };
                if top == Entity::TextUrl && at(i) == Some('(') {
                    let start = chars[i].0;
                    i += 1;
                    let mut url = String::new();
                    loop {
                        match at(i) {
                            None => {
                                return Err(format!(
                                    "Can't find end of a URL at byte offset {start}"
                                ));
                            }
                            Some('\\') if escapable(at(i + 1)) => {
                                url.push(at(i + 1).unwrap_or_default());
                                i += 2;
                            }
                            Some(')') => {
                                i += 1;
                                break;
                            }
                            Some(ch) => {
                                url.push(ch);
                                i += 1;
                            }
                        }
                    }
                }
                continue;
            }
        }
        let started = match ch {
            '_' if next == Some('_') => Some((Entity::Underline, 2)),
            '_' => Some((Entity::Italic, 1)),
            '*' => Some((Entity::Bold, 1)),
            '~' => Some((Entity::Strikethrough, 1)),
            '|' if next == Some('|') => Some((Entity::Spoiler, 2)),
            '[' => Some((Entity::TextUrl, 1)),
            _ => None,
        };
        if let Some((entity, width)) = started {
            if let Some(&(_, outer)) = open.iter().find(|(kind, _)| *kind == entity) {
                return Err(format!(
                    "Can't find end of {entity:?} entity at byte offset {outer}"
                ));
            }
            open.push((entity, offset));
            i += width;
            continue;
        }
        if ch == '>' && (i == 0 || at(i - 1) == Some('\n')) {
            i += 1;
            continue;
        }
        if RESERVED.contains(ch) {
            return Err(format!(
                "Character '{ch}' is reserved and must be escaped with the preceding '\\'"
            ));
        }
        shown.push(ch);
        i += 1;
    }
    if let Some(&(entity, offset)) = open.first() {
        return Err(format!(
            "Can't find end of {entity:?} entity at byte offset {offset}"
        ));
    }
    Ok(shown)
}
