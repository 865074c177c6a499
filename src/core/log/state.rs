//! The fold from a log's lines (as [`Summary`] rows) to what a lane needs on open: the leaf,
//! where each entry is, and which operations are still open with which results missing.

use super::row::Summary;
use crate::config::Replay;
use crate::id::{EntryId, OperationId};
use std::collections::{HashMap, HashSet};
use std::fmt;

#[derive(Debug, Clone, Default)]
pub struct LaneState {
    lines: u64,
    entries: HashMap<EntryId, Located>,
    leaf: Option<EntryId>,
    previous_leaf: Option<EntryId>,
    open: Vec<OpenOperation>,
    declared: HashSet<EntryId>,
}

#[derive(Debug, Clone, Copy)]
struct Located {
    line: u64,
    parent: Option<EntryId>,
}

/// An operation that was started and has not finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOperation {
    pub op: OperationId,
    /// The line of its `operation_started` record.
    pub line: u64,
    pub tools: Vec<DeclaredTool>,
}

/// A tool the operation declared it was about to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredTool {
    pub result: EntryId,
    pub replay: Replay,
    /// The line of its `tool_started` record.
    pub line: u64,
}

/// An append that would break the log's invariants, refused before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    HeaderNotFirst,
    MissingHeader,
    DuplicateEntry(EntryId),
    UnknownParent(EntryId),
    UnknownLeaf(EntryId),
    OperationAlreadyOpen(OperationId),
    OperationNotOpen(OperationId),
    ResultAlreadyDeclared(EntryId),
    ResultsMissing {
        op: OperationId,
        results: Vec<EntryId>,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::HeaderNotFirst => f.write_str("a header may only be the first line"),
            Violation::MissingHeader => f.write_str("the first line must be a header"),
            Violation::DuplicateEntry(id) => write!(f, "entry {id} already exists"),
            Violation::UnknownParent(id) => write!(f, "parent entry {id} does not exist"),
            Violation::UnknownLeaf(id) => write!(f, "leaf entry {id} does not exist"),
            Violation::OperationAlreadyOpen(op) => write!(f, "operation {op} is already open"),
            Violation::OperationNotOpen(op) => write!(f, "operation {op} is not open"),
            Violation::ResultAlreadyDeclared(id) => {
                write!(f, "result {id} is already declared or written")
            }
            Violation::ResultsMissing { op, results } => {
                let ids: Vec<String> = results.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "operation {op} cannot finish: results {} were declared and never written",
                    ids.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for Violation {}

impl LaneState {
    /// Lines folded so far; the index of the next line.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The current end of the conversation: the last entry appended, or where `leaf_set` moved it.
    pub fn leaf(&self) -> Option<EntryId> {
        self.leaf.or(self.previous_leaf)
    }

    pub fn open_operations(&self) -> &[OpenOperation] {
        &self.open
    }

    pub fn contains(&self, id: EntryId) -> bool {
        self.entries.contains_key(&id)
    }

    pub fn line_of(&self, id: EntryId) -> Option<u64> {
        self.entries.get(&id).map(|located| located.line)
    }

    /// The results an operation declared and never wrote, in declaration order.
    pub fn missing_results<'s>(
        &'s self,
        operation: &'s OpenOperation,
    ) -> impl Iterator<Item = &'s DeclaredTool> + 's {
        operation
            .tools
            .iter()
            .filter(|tool| !self.entries.contains_key(&tool.result))
    }

    /// Refuses a line that would break an invariant. `known_elsewhere` answers for entries in
    /// earlier segments of the same lane.
    pub fn check(
        &self,
        summary: &Summary,
        known_elsewhere: impl Fn(EntryId) -> bool,
    ) -> Result<(), Violation> {
        let known = |id: EntryId| self.entries.contains_key(&id) || known_elsewhere(id);
        match *summary {
            Summary::Header { .. } if self.lines > 0 => return Err(Violation::HeaderNotFirst),
            Summary::Header { .. } => return Ok(()),
            _ if self.lines == 0 => return Err(Violation::MissingHeader),
            _ => {}
        }
        match *summary {
            Summary::Header { .. } | Summary::TailRepaired | Summary::Observed { .. } => Ok(()),
            Summary::Entry { id, parent } => {
                if self.entries.contains_key(&id) {
                    return Err(Violation::DuplicateEntry(id));
                }
                match parent {
                    Some(parent) if !known(parent) => Err(Violation::UnknownParent(parent)),
                    _ => Ok(()),
                }
            }
            Summary::LeafSet { leaf } if !known(leaf) => Err(Violation::UnknownLeaf(leaf)),
            Summary::LeafSet { .. } => Ok(()),
            Summary::OperationStarted { op } if self.find(op).is_some() => {
                Err(Violation::OperationAlreadyOpen(op))
            }
            Summary::OperationStarted { .. } => Ok(()),
            Summary::AttemptStarted { op } => self
                .find(op)
                .map(|_| ())
                .ok_or(Violation::OperationNotOpen(op)),
            Summary::ToolStarted { op, result, .. } => {
                self.find(op).ok_or(Violation::OperationNotOpen(op))?;
                if self.declared.contains(&result) || self.entries.contains_key(&result) {
                    return Err(Violation::ResultAlreadyDeclared(result));
                }
                Ok(())
            }
            Summary::OperationFinished { op } => {
                let operation = self.find(op).ok_or(Violation::OperationNotOpen(op))?;
                let results: Vec<EntryId> = self
                    .missing_results(operation)
                    .map(|tool| tool.result)
                    .collect();
                if results.is_empty() {
                    Ok(())
                } else {
                    Err(Violation::ResultsMissing { op, results })
                }
            }
        }
    }

    /// Folds one more line in.
    pub fn apply(&mut self, summary: &Summary) {
        let line = self.lines;
        self.lines += 1;
        match *summary {
            Summary::Header { previous_leaf } => self.previous_leaf = previous_leaf,
            Summary::Entry { id, parent } => {
                self.entries.insert(id, Located { line, parent });
                self.leaf = Some(id);
            }
            Summary::LeafSet { leaf } => self.leaf = Some(leaf),
            Summary::OperationStarted { op } => self.open.push(OpenOperation {
                op,
                line,
                tools: Vec::new(),
            }),
            Summary::ToolStarted { op, result, replay } => {
                if let Some(operation) = self.open.iter_mut().find(|o| o.op == op) {
                    operation.tools.push(DeclaredTool {
                        result,
                        replay,
                        line,
                    });
                    self.declared.insert(result);
                }
            }
            Summary::OperationFinished { op } => {
                if let Some(index) = self.open.iter().position(|o| o.op == op) {
                    let operation = self.open.remove(index);
                    for tool in operation.tools {
                        self.declared.remove(&tool.result);
                    }
                }
            }
            Summary::AttemptStarted { .. } | Summary::TailRepaired | Summary::Observed { .. } => {}
        }
    }

    /// The lines of the branch ending at `leaf`, root first, as far as this segment holds it,
    /// and the entry in an earlier segment where the branch continues, if it does.
    pub fn branch(&self, leaf: EntryId) -> (Vec<u64>, Option<EntryId>) {
        let mut lines = Vec::new();
        let mut next = Some(leaf);
        while let Some(id) = next {
            let Some(located) = self.entries.get(&id) else {
                lines.reverse();
                return (lines, Some(id));
            };
            if lines.len() > self.entries.len() {
                break;
            }
            lines.push(located.line);
            next = located.parent;
        }
        lines.reverse();
        (lines, None)
    }

    fn find(&self, op: OperationId) -> Option<&OpenOperation> {
        self.open.iter().find(|o| o.op == op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EntryId {
        EntryId::from_bytes([n; 16])
    }

    /// The entry `n` under the entry `parent`.
    fn entry(n: u8, parent: Option<u8>) -> Summary {
        Summary::Entry {
            id: id(n),
            parent: parent.map(id),
        }
    }

    fn op(n: u8) -> OperationId {
        OperationId::from_bytes([n; 16])
    }

    fn fold(summaries: &[Summary]) -> LaneState {
        let mut state = LaneState::default();
        for summary in summaries {
            state.check(summary, |_| false).unwrap();
            state.apply(summary);
        }
        state
    }

    const HEADER: Summary = Summary::Header {
        previous_leaf: None,
    };

    #[test]
    fn branches_follow_parents_not_file_order() {
        let state = fold(&[
            HEADER,
            entry(1, None),
            entry(2, Some(1)),
            entry(3, Some(2)),
            entry(4, Some(1)),
            entry(5, Some(4)),
        ]);
        assert_eq!(state.leaf(), Some(id(5)));
        assert_eq!(state.branch(id(5)), (vec![1, 4, 5], None));
        assert_eq!(state.branch(id(3)), (vec![1, 2, 3], None));
        let mut moved = state;
        moved.apply(&Summary::LeafSet { leaf: id(3) });
        assert_eq!(moved.leaf(), Some(id(3)));
    }

    #[test]
    fn open_operations_list_their_missing_results() {
        let state = fold(&[
            HEADER,
            Summary::OperationStarted { op: op(1) },
            entry(1, None),
            Summary::ToolStarted {
                op: op(1),
                result: id(2),
                replay: Replay::Safe,
            },
            entry(2, Some(1)),
            Summary::ToolStarted {
                op: op(1),
                result: id(3),
                replay: Replay::Never,
            },
        ]);
        let [operation] = state.open_operations() else {
            panic!("one open operation")
        };
        let missing: Vec<EntryId> = state.missing_results(operation).map(|t| t.result).collect();
        assert_eq!(missing, vec![id(3)]);
        assert_eq!(
            state.check(&Summary::OperationFinished { op: op(1) }, |_| false),
            Err(Violation::ResultsMissing {
                op: op(1),
                results: vec![id(3)]
            })
        );
    }

    #[test]
    fn appends_that_break_the_tree_are_refused() {
        let state = fold(&[HEADER, entry(1, None)]);
        let orphan = entry(2, Some(9));
        assert_eq!(
            state.check(&orphan, |_| false),
            Err(Violation::UnknownParent(id(9)))
        );
        assert_eq!(state.check(&orphan, |other| other == id(9)), Ok(()));
        assert_eq!(
            state.check(&entry(1, None), |_| false),
            Err(Violation::DuplicateEntry(id(1)))
        );
        assert_eq!(
            state.check(&HEADER, |_| false),
            Err(Violation::HeaderNotFirst)
        );
        assert_eq!(
            state.check(&Summary::OperationFinished { op: op(7) }, |_| false),
            Err(Violation::OperationNotOpen(op(7)))
        );
        assert_eq!(
            LaneState::default().check(&Summary::TailRepaired, |_| false),
            Err(Violation::MissingHeader)
        );
    }

    #[test]
    fn a_continued_segment_starts_from_the_previous_leaf() {
        let state = fold(&[Summary::Header {
            previous_leaf: Some(id(7)),
        }]);
        assert_eq!(state.leaf(), Some(id(7)));
        let state = fold(&[Summary::Header {
            previous_leaf: Some(id(7)),
        }]);
        let mut state = state;
        let next = entry(8, Some(7));
        state.check(&next, |other| other == id(7)).unwrap();
        state.apply(&next);
        assert_eq!(state.branch(id(8)), (vec![1], Some(id(7))));
    }
}
