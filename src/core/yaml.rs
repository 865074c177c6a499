//! YAML text into a [`Node`] tree in which every node and key keeps its line and column.
//!
//! Scalars follow the YAML 1.2 core schema (so `no` and `on` stay strings); quoted scalars are
//! always strings. Anchors, aliases, tags and several documents in one file are refused, which
//! keeps configuration files plain. Collections nest at most [`MAX_DEPTH`] deep, so a hostile
//! file cannot make the tree, or anything that walks it, deep.

use crate::problem::{Pos, Problem};
use crate::tree::{Key, Node, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

enum Frame {
    List(Pos, Vec<Node>),
    Map(Pos, Vec<(Key, Node)>, Option<Key>),
}

/// How deep lists and maps may nest in one document, block and flow style alike.
pub const MAX_DEPTH: usize = 32;

/// Parses `text` (the contents of `file`) into a tree; an empty document is `nil`.
pub fn parse(file: &str, text: &str) -> Result<Node, Vec<Problem>> {
    parse_from_line(file, text, 0)
}

/// Like [`parse`], for text that starts after line `lines_before` of `file` (a frontmatter
/// block): every position, and every problem's, counts the lines of the file.
pub fn parse_from_line(file: &str, text: &str, lines_before: u32) -> Result<Node, Vec<Problem>> {
    let located = |marker: &Marker| {
        let mut pos = position(marker);
        pos.line = pos.line.saturating_add(lines_before);
        pos
    };
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut problems = Vec::new();
    let mut documents = 0;
    loop {
        let (event, marker) = match parser.next_token() {
            Ok(token) => token,
            Err(error) => {
                let marker = error.marker();
                problems.push(
                    Problem::new(
                        file,
                        located(marker),
                        format!("invalid YAML: {}", error.info()),
                    )
                    .with_fix("correct the YAML syntax at this position"),
                );
                return Err(problems);
            }
        };
        let pos = located(&marker);
        let finished = match event {
            Event::StreamEnd => break,
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    problems
                        .push(Problem::new(file, pos, "a second YAML document").with_fix(
                            "keep the whole configuration in one document; remove `---`",
                        ));
                }
                None
            }
            Event::Alias(_) => {
                problems.push(
                    Problem::new(file, pos, "YAML aliases are not supported")
                        .with_fix("write the value out in full"),
                );
                Some(Node {
                    pos,
                    value: Value::Nil,
                })
            }
            Event::Scalar(text, style, anchor, tag) => {
                refuse_anchor_and_tag(file, pos, anchor, tag.is_some(), &mut problems);
                Some(Node {
                    pos,
                    value: scalar(text, style),
                })
            }
            Event::SequenceStart(anchor, tag) => {
                refuse_anchor_and_tag(file, pos, anchor, tag.is_some(), &mut problems);
                if stack.len() == MAX_DEPTH {
                    problems.push(too_deep(file, pos));
                    return Err(problems);
                }
                stack.push(Frame::List(pos, Vec::new()));
                None
            }
            Event::MappingStart(anchor, tag) => {
                refuse_anchor_and_tag(file, pos, anchor, tag.is_some(), &mut problems);
                if stack.len() == MAX_DEPTH {
                    problems.push(too_deep(file, pos));
                    return Err(problems);
                }
                stack.push(Frame::Map(pos, Vec::new(), None));
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::List(pos, items)) => Some(Node {
                    pos,
                    value: Value::List(items),
                }),
                _ => None,
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map(pos, entries, _)) => Some(Node {
                    pos,
                    value: Value::Map(entries),
                }),
                _ => None,
            },
        };
        if let Some(node) = finished {
            match stack.last_mut() {
                None => root = Some(node),
                Some(Frame::List(_, items)) => items.push(node),
                Some(Frame::Map(_, entries, pending)) => match pending.take() {
                    Some(key) => entries.push((key, node)),
                    None => {
                        let key_pos = node.pos;
                        match node.into_value() {
                            Value::Str(name) => {
                                if entries.iter().any(|(key, _)| key.name == name) {
                                    problems.push(
                                        Problem::new(
                                            file,
                                            key_pos,
                                            format!("duplicate key {name}"),
                                        )
                                        .with_fix("keep one of them"),
                                    );
                                }
                                *pending = Some(Key { name, pos: key_pos });
                            }
                            other => {
                                problems.push(
                                    Problem::new(
                                        file,
                                        key_pos,
                                        format!(
                                            "a key must be a plain word, found {}",
                                            other.kind()
                                        ),
                                    )
                                    .with_fix("quote the key"),
                                );
                                *pending = Some(Key {
                                    name: String::new(),
                                    pos: key_pos,
                                });
                            }
                        }
                    }
                },
            }
        }
    }
    if problems.is_empty() {
        Ok(root.unwrap_or(Node {
            pos: Pos::line(lines_before.saturating_add(1)),
            value: Value::Nil,
        }))
    } else {
        Err(problems)
    }
}

fn too_deep(file: &str, pos: Pos) -> Problem {
    Problem::new(
        file,
        pos,
        format!("lists and maps nest more than {MAX_DEPTH} levels deep"),
    )
    .with_fix(format!(
        "keep the nesting within {MAX_DEPTH} levels; perch stops reading the file here"
    ))
}

fn position(marker: &Marker) -> Pos {
    let line = u32::try_from(marker.line()).unwrap_or(u32::MAX);
    let column = u32::try_from(marker.col() + 1).unwrap_or(u32::MAX);
    Pos::at(line, column)
}

fn refuse_anchor_and_tag(
    file: &str,
    pos: Pos,
    anchor: usize,
    tagged: bool,
    problems: &mut Vec<Problem>,
) {
    if anchor != 0 {
        problems.push(
            Problem::new(file, pos, "YAML anchors are not supported")
                .with_fix("remove the `&` anchor"),
        );
    }
    if tagged {
        problems.push(
            Problem::new(file, pos, "YAML tags are not supported").with_fix("remove the `!` tag"),
        );
    }
}

fn scalar(text: String, style: TScalarStyle) -> Value {
    if style != TScalarStyle::Plain {
        return Value::Str(text);
    }
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Nil,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Some(value) = integer(&text) {
        return Value::Int(value);
    }
    let looks_numeric = text
        .trim_start_matches(['-', '+'])
        .starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if looks_numeric && let Ok(value) = text.parse::<f64>() {
        return Value::Float(value);
    }
    Value::Str(text)
}

fn integer(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let magnitude = if let Some(hex) = digits.strip_prefix("0x") {
        i64::from_str_radix(hex, 16).ok()?
    } else if let Some(octal) = digits.strip_prefix("0o") {
        i64::from_str_radix(octal, 8).ok()?
    } else if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()?
    } else {
        return None;
    };
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(node: &Node) -> &[(Key, Node)] {
        match &node.value {
            Value::Map(entries) => entries,
            other => panic!("expected a map, found {other:?}"),
        }
    }

    #[test]
    fn keys_and_values_keep_their_lines() {
        let tree = parse("models.yml", "a: 1\nb:\n  - x\n  - 'no'\nc: no\n").unwrap();
        let map = entries(&tree);
        assert_eq!(map[0].0.name, "a");
        assert_eq!(map[0].1.value, Value::Int(1));
        assert_eq!(map[1].0.pos, Pos::at(2, 1));
        let Value::List(items) = &map[1].1.value else {
            panic!("b is a list")
        };
        assert_eq!(items[1].pos.line, 4);
        assert_eq!(items[1].value, Value::Str("no".into()));
        assert_eq!(map[2].1.value, Value::Str("no".into()));
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let problems = parse("models.yml", "a: 1\nb: [1, 2\n").unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].pos.line >= 2, "{:?}", problems[0]);
        assert!(problems[0].to_string().starts_with("models.yml:"));
    }

    #[test]
    fn duplicate_keys_and_aliases_are_refused() {
        let problems = parse("x.yml", "a: &v 1\na: *v\n").unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|p| p.contains("duplicate key a")),
            "{text:?}"
        );
        assert!(text.iter().any(|p| p.contains("aliases")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("anchors")), "{text:?}");
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        let tree = parse("x.yml", "[~, true, 0x10, -3, 1.5, 1e3, '1', abc, 1.2.3]").unwrap();
        let Value::List(items) = tree.into_value() else {
            panic!("a list")
        };
        let values: Vec<Value> = items.into_iter().map(Node::into_value).collect();
        assert_eq!(
            values,
            vec![
                Value::Nil,
                Value::Bool(true),
                Value::Int(16),
                Value::Int(-3),
                Value::Float(1.5),
                Value::Float(1000.0),
                Value::Str("1".into()),
                Value::Str("abc".into()),
                Value::Str("1.2.3".into()),
            ]
        );
    }

    fn block_list(depth: usize) -> String {
        format!("{}x\n", "- ".repeat(depth))
    }

    fn block_map(depth: usize) -> String {
        (0..depth)
            .map(|level| format!("{}k:\n", "  ".repeat(level)))
            .collect::<String>()
            + &format!("{}x\n", "  ".repeat(depth))
    }

    fn flow_list(depth: usize) -> String {
        format!("{}x{}\n", "[".repeat(depth), "]".repeat(depth))
    }

    fn flow_map(depth: usize) -> String {
        format!("{}x{}\n", "{k: ".repeat(depth), "}".repeat(depth))
    }

    fn depth_of(mut node: &Node) -> usize {
        let mut depth = 0;
        loop {
            node = match &node.value {
                Value::List(items) => &items[0],
                Value::Map(entries) => &entries[0].1,
                _ => return depth,
            };
            depth += 1;
        }
    }

    #[test]
    fn nesting_up_to_the_limit_is_read_and_one_more_level_is_refused() {
        for (style, nested) in [
            ("block list", block_list as fn(usize) -> String),
            ("block map", block_map),
            ("flow list", flow_list),
            ("flow map", flow_map),
        ] {
            let tree = parse("deep.yml", &nested(MAX_DEPTH))
                .unwrap_or_else(|problems| panic!("{style}: {problems:?}"));
            assert_eq!(depth_of(&tree), MAX_DEPTH, "{style}");
            let problems = parse("deep.yml", &nested(MAX_DEPTH + 1)).unwrap_err();
            assert_eq!(problems.len(), 1, "{style}: {problems:?}");
            let text = problems[0].to_string();
            assert!(
                text.starts_with("deep.yml:") && text.contains("nest more than 32 levels deep"),
                "{style}: {text}"
            );
            assert!(problems[0].pos.line >= 1, "{style}: {text}");
        }
    }

    #[test]
    fn a_hostile_depth_is_refused_at_the_limit_without_reading_on() {
        let problems = parse("HEARTBEAT.yml", &block_list(20_000)).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].pos.line, 1);
        let problems = parse("HEARTBEAT.yml", &flow_list(20_000)).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn positions_count_the_lines_before_the_text() {
        let tree = parse_from_line("SKILL.md", "a: 1\nb: [x\n", 1).unwrap_err();
        assert!(tree[0].pos.line >= 3, "{tree:?}");
        let tree = parse_from_line("SKILL.md", "a: 1\nb: 2\n", 1).unwrap();
        let map = entries(&tree);
        assert_eq!(map[1].0.pos, Pos::at(3, 1));
        assert_eq!(map[1].1.pos, Pos::at(3, 4));
    }
}
