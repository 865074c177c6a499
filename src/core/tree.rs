//! The value tree every configuration file is read into before it is checked.
//!
//! Lua declarations and YAML documents both become a [`Node`] tree; one set of checks then turns
//! the tree into typed configuration, collecting every problem instead of stopping at the first.
//! YAML nodes carry their own line and column. Lua keeps no position per table key at run time,
//! so every node of a Lua declaration carries the line of the declaring call; a problem about a
//! key is then moved to the line the key is written on, found in the file's text
//! ([`crate::lua_source::point_at_keys`]).

use crate::problem::{Pos, Problem};
use std::fmt::Write as _;

/// A function value, identified by the order in which the evaluating Lua state saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FunctionId(pub usize);

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub value: Value,
}

impl Node {
    /// The node's value, taken out of it.
    pub fn into_value(mut self) -> Value {
        std::mem::replace(&mut self.value, Value::Nil)
    }
}

/// A tree is dropped from an explicit stack rather than by recursion, so however deep a tree
/// came to be, dropping it cannot overflow the thread's stack.
impl Drop for Node {
    fn drop(&mut self) {
        let mut pending: Vec<Node> = Vec::new();
        take_children(&mut self.value, &mut pending);
        while let Some(mut node) = pending.pop() {
            take_children(&mut node.value, &mut pending);
        }
    }
}

fn take_children(value: &mut Value, pending: &mut Vec<Node>) {
    match value {
        Value::List(items) => pending.append(items),
        Value::Map(entries) => pending.extend(entries.drain(..).map(|(_, node)| node)),
        _ => {}
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// `env "NAME"`: a reference to a host environment variable, never its value.
    Env(String),
    Function(FunctionId),
    List(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub pos: Pos,
}

impl Value {
    /// The word used for this kind of value in problems.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Env(_) => "an env reference",
            Value::Function(_) => "a function",
            Value::List(_) => "a list",
            Value::Map(_) => "a table of keys",
        }
    }
}

/// A key path inside a declaration, displayed as `secrets[1].hosts`. List indexes count from 1.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Path(String);

impl Path {
    pub fn root() -> Self {
        Path(String::new())
    }

    pub fn key(&self, key: &str) -> Path {
        if self.0.is_empty() {
            Path(key.to_owned())
        } else {
            Path(format!("{}.{key}", self.0))
        }
    }

    pub fn index(&self, zero_based: usize) -> Path {
        let mut path = self.0.clone();
        let _ = write!(path, "[{}]", zero_based + 1);
        Path(path)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Collects problems for one file while its tree is checked.
#[derive(Debug)]
pub struct Checker {
    file: String,
    problems: Vec<Problem>,
}

impl Checker {
    pub fn new(file: impl Into<String>) -> Self {
        Checker {
            file: file.into(),
            problems: Vec::new(),
        }
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn report(&mut self, pos: Pos, path: &Path, message: impl Into<String>) -> &mut Problem {
        self.problems
            .push(Problem::new(self.file.clone(), pos, message).with_path(path.as_str()));
        let last = self.problems.len() - 1;
        &mut self.problems[last]
    }

    pub fn report_fix(
        &mut self,
        pos: Pos,
        path: &Path,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        let problem = self.report(pos, path, message);
        problem.fix = Some(fix.into());
    }

    pub fn push(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    pub fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    fn wrong_kind(&mut self, node: &Node, path: &Path, expected: &str) {
        let found = node.value.kind();
        self.report(
            node.pos,
            path,
            format!("expected {expected}, found {found}"),
        );
    }

    pub fn str<'n>(&mut self, node: &'n Node, path: &Path) -> Option<&'n str> {
        match &node.value {
            Value::Str(text) => Some(text),
            _ => {
                self.wrong_kind(node, path, "a string");
                None
            }
        }
    }

    pub fn non_empty_str<'n>(&mut self, node: &'n Node, path: &Path) -> Option<&'n str> {
        let text = self.str(node, path)?;
        if text.trim().is_empty() {
            self.report(node.pos, path, "must not be empty");
            return None;
        }
        Some(text)
    }

    pub fn bool(&mut self, node: &Node, path: &Path) -> Option<bool> {
        match node.value {
            Value::Bool(value) => Some(value),
            _ => {
                self.wrong_kind(node, path, "true or false");
                None
            }
        }
    }

    pub fn int(&mut self, node: &Node, path: &Path) -> Option<i64> {
        match node.value {
            Value::Int(value) => Some(value),
            Value::Float(value) if value.fract() == 0.0 && value.abs() < 9.0e15 =>
            {
                #[allow(clippy::cast_possible_truncation)]
                Some(value as i64)
            }
            _ => {
                self.wrong_kind(node, path, "an integer");
                None
            }
        }
    }

    /// A number, integer or not.
    pub fn number(&mut self, node: &Node, path: &Path) -> Option<f64> {
        match node.value {
            #[expect(clippy::cast_precision_loss, reason = "configuration-sized numbers")]
            Value::Int(value) => Some(value as f64),
            Value::Float(value) => Some(value),
            _ => {
                self.wrong_kind(node, path, "a number");
                None
            }
        }
    }

    /// An integer within `range`, reported with the range when outside it.
    pub fn int_in(
        &mut self,
        node: &Node,
        path: &Path,
        range: std::ops::RangeInclusive<i64>,
    ) -> Option<i64> {
        let value = self.int(node, path)?;
        if !range.contains(&value) {
            self.report(
                node.pos,
                path,
                format!(
                    "{value} is out of range; use a value from {} to {}",
                    range.start(),
                    range.end()
                ),
            );
            return None;
        }
        Some(value)
    }

    pub fn list<'n>(&mut self, node: &'n Node, path: &Path) -> Option<&'n [Node]> {
        match &node.value {
            Value::List(items) => Some(items),
            Value::Map(entries) if entries.is_empty() => Some(&[]),
            _ => {
                self.wrong_kind(node, path, "a list");
                None
            }
        }
    }

    /// A list of strings; items that are not strings are reported and skipped.
    pub fn str_list(&mut self, node: &Node, path: &Path) -> Vec<(Pos, Path, String)> {
        let Some(items) = self.list(node, path) else {
            return Vec::new();
        };
        items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| {
                let item_path = path.index(index);
                self.str(item, &item_path)
                    .map(|text| (item.pos, item_path.clone(), text.to_owned()))
            })
            .collect()
    }

    /// The keys of a table, to be taken one by one; [`Fields::finish`] reports the rest as
    /// unknown.
    pub fn fields<'n>(&mut self, node: &'n Node, path: &Path) -> Option<Fields<'n>> {
        match &node.value {
            Value::Map(entries) => Some(Fields::new(node.pos, path.clone(), entries)),
            Value::List(items) if items.is_empty() => {
                Some(Fields::new(node.pos, path.clone(), &[]))
            }
            _ => {
                self.wrong_kind(node, path, "a table of keys");
                None
            }
        }
    }
}

/// The keys of one table while they are being checked.
#[derive(Debug)]
pub struct Fields<'n> {
    pub pos: Pos,
    pub path: Path,
    entries: &'n [(Key, Node)],
    taken: Vec<bool>,
}

impl<'n> Fields<'n> {
    fn new(pos: Pos, path: Path, entries: &'n [(Key, Node)]) -> Self {
        Fields {
            pos,
            path,
            entries,
            taken: vec![false; entries.len()],
        }
    }

    /// The value under `key`, if present and not `nil`.
    pub fn optional(&mut self, key: &str) -> Option<&'n Node> {
        let index = self.entries.iter().position(|(k, _)| k.name == key)?;
        self.taken[index] = true;
        let node = &self.entries[index].1;
        (node.value != Value::Nil).then_some(node)
    }

    /// The value under `key`; a missing key is reported.
    pub fn required(&mut self, checker: &mut Checker, key: &str, fix: &str) -> Option<&'n Node> {
        let node = self.optional(key);
        if node.is_none() {
            checker.report_fix(self.pos, &self.path, format!("missing {key}"), fix);
        }
        node
    }

    pub fn path_of(&self, key: &str) -> Path {
        self.path.key(key)
    }

    /// Reports every key that was not taken, suggesting the closest known key.
    pub fn finish(self, checker: &mut Checker, known: &[&str]) {
        for ((key, _), taken) in self.entries.iter().zip(self.taken) {
            if taken {
                continue;
            }
            let path = self.path.key(&key.name);
            let known_list = known.join(", ");
            let fix = match closest(&key.name, known) {
                Some(near) => format!("did you mean {near}? known keys: {known_list}"),
                None => format!("remove it; known keys: {known_list}"),
            };
            checker.report_fix(key.pos, &path, "unknown key", fix);
        }
    }
}

/// The candidate nearest to `word` (a misspelling: at most two edits, or a quarter of the
/// candidate's length), for a "did you mean" fix.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|candidate| {
            (
                edit_distance(&word.to_lowercase(), &candidate.to_lowercase()),
                *candidate,
            )
        })
        .filter(|(distance, candidate)| *distance <= 2.max(candidate.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Trees for the checkers' unit tests.
#[cfg(test)]
pub(crate) mod build {
    use super::{Key, Node, Value};
    use crate::problem::Pos;

    /// `value` at `line`.
    pub(crate) fn node_at(line: u32, value: Value) -> Node {
        Node {
            pos: Pos::line(line),
            value,
        }
    }

    /// A map whose keys and values all stand at `line`.
    pub(crate) fn map_at(line: u32, entries: Vec<(&str, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(name, value)| {
                    (
                        Key {
                            name: name.into(),
                            pos: Pos::line(line),
                        },
                        node_at(line, value),
                    )
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::build::{map_at, node_at};
    use super::*;

    fn node(value: Value) -> Node {
        node_at(3, value)
    }

    fn map(entries: Vec<(&str, Value)>) -> Node {
        node(map_at(3, entries))
    }

    #[test]
    fn unknown_keys_are_reported_with_a_suggestion() {
        let tree = map(vec![("modle", Value::Str("x".into()))]);
        let mut checker = Checker::new("agent.lua");
        let mut fields = checker.fields(&tree, &Path::root()).unwrap();
        assert!(fields.optional("model").is_none());
        fields.finish(&mut checker, &["model", "thinking"]);
        let problems = checker.into_problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].to_string(),
            "agent.lua:3: modle: unknown key\n  fix: did you mean model? known keys: model, thinking"
        );
    }

    #[test]
    fn paths_count_list_items_from_one() {
        assert_eq!(
            Path::root().key("secrets").index(0).key("hosts").as_str(),
            "secrets[1].hosts"
        );
    }

    #[test]
    fn wrong_kinds_name_what_was_expected() {
        let mut checker = Checker::new("sandbox.lua");
        assert_eq!(
            checker.int(&node(Value::Str("2".into())), &Path::root().key("cpus")),
            None
        );
        assert_eq!(
            checker.into_problems()[0].to_string(),
            "sandbox.lua:3: cpus: expected an integer, found a string"
        );
    }

    #[test]
    fn a_million_levels_deep_tree_drops_without_recursion() {
        let mut tree = node(Value::Nil);
        for level in 0..1_000_000 {
            tree = if level % 2 == 0 {
                node(Value::List(vec![tree]))
            } else {
                map_of(tree)
            };
        }
        let handle = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || drop(tree))
            .unwrap();
        handle.join().expect("the drop ran on a 64 KiB stack");
    }

    fn map_of(inner: Node) -> Node {
        node(Value::Map(vec![(
            Key {
                name: "k".into(),
                pos: Pos::line(3),
            },
            inner,
        )]))
    }
}
