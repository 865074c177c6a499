//! What to do about operations a crash left open. The plan is a pure function of what is on
//! disk and of the tools as they are declared now; the shell carries it out step by step, and
//! carrying it out twice does nothing the second time.

use super::line::{Entry, EntryBody, Message, Outcome, Part, Record, Role};
use crate::Timestamp;
use crate::config::Replay;
use crate::id::{EntryId, OperationId};
use crate::name::ToolName;

/// A tool an open operation declared and whose result was never written.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingTool {
    pub op: OperationId,
    pub call_id: String,
    pub tool: ToolName,
    pub arguments: serde_json::Value,
    pub result: EntryId,
    /// The declaration recorded when the tool started.
    pub replay: Replay,
}

impl PendingTool {
    pub fn from_record(record: &Record) -> Option<PendingTool> {
        match record {
            Record::ToolStarted {
                op,
                call_id,
                tool,
                arguments,
                result,
                replay,
                ..
            } => Some(PendingTool {
                op: *op,
                call_id: call_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                result: *result,
                replay: *replay,
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryStep {
    /// Run the tool again and write its result under the declared id.
    Rerun(PendingTool),
    /// Write a synthetic "interrupted" result under the declared id.
    Interrupt(PendingTool),
    /// Close the operation.
    Finish { op: OperationId, outcome: Outcome },
}

/// Plans recovery for each open operation and the tools it left without results.
///
/// A tool is run again only if the declaration recorded when it started *and* the current one
/// (`current_replay`; `None` when the tool no longer exists) both say `safe`.
pub fn plan_recovery(
    open: &[(OperationId, Vec<PendingTool>)],
    current_replay: impl Fn(&ToolName) -> Option<Replay>,
) -> Vec<RecoveryStep> {
    let mut steps = Vec::new();
    for (op, pending) in open {
        for tool in pending {
            let safe_then = tool.replay == Replay::Safe;
            let safe_now = current_replay(&tool.tool) == Some(Replay::Safe);
            steps.push(if safe_then && safe_now {
                RecoveryStep::Rerun(tool.clone())
            } else {
                RecoveryStep::Interrupt(tool.clone())
            });
        }
        steps.push(RecoveryStep::Finish {
            op: *op,
            outcome: Outcome::Interrupted {
                reason: "perch stopped before this operation finished; recovered on the next start"
                    .into(),
            },
        });
    }
    steps
}

/// The result entry for a pending tool, under the id its `tool_started` record declared.
pub fn tool_result(
    tool: &PendingTool,
    output: String,
    is_error: bool,
    parent: Option<EntryId>,
    at: Timestamp,
) -> Entry {
    Entry {
        id: tool.result,
        parent,
        at,
        body: EntryBody::Message(Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: tool.call_id.clone(),
                output,
                is_error,
            }],
            origins: Vec::new(),
            relay: None,
        }),
    }
}

/// The result entry written for a tool that was interrupted and may not be run again.
pub fn interrupted_result(tool: &PendingTool, parent: Option<EntryId>, at: Timestamp) -> Entry {
    let output = match tool.replay {
        Replay::Safe => format!(
            "interrupted: perch stopped while {} was running, and it is no longer declared replay = \"safe\", so it was not run again",
            tool.tool
        ),
        Replay::Never => format!(
            "interrupted: perch stopped while {} was running; it may or may not have taken effect, so check before running it again",
            tool.tool
        ),
    };
    tool_result(tool, output, true, parent, at)
}

/// What the lane recorded of the runs that took one inbox item, read at restart after lane
/// recovery has closed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRuns {
    /// The item's latest run.
    pub op: OperationId,
    /// How the item's latest run ended.
    pub outcome: Outcome,
    /// That run's last assistant text.
    pub text: String,
    /// One of the runs was already a resumption.
    pub resumed: bool,
    /// The first run wrote the item's user entry, so the branch already holds it.
    pub user_entry: bool,
    /// Tools declared `replay = "never"` that any of the runs started, in order, each once.
    pub irreversible: Vec<String>,
    /// How many inbox items the first run took together (a collected batch takes several).
    pub items: usize,
}

/// How a resumed run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumption {
    /// From the lane's leaf, which already holds the item's user entry.
    FromLeaf,
    /// The interrupted run stopped before writing the user entry: write it, then continue.
    WithInput,
}

/// What a restart does with an inbox item whose run was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemAnswer {
    /// Answer with how the latest run ended: it finished before the crash, only its reply was
    /// not recorded.
    Deliver,
    /// Run it once more, as a resumption.
    Resume(Resumption),
    /// Tell the chat it was interrupted, and why it is not continued.
    Note(String),
}

/// A chat run interrupted by a crash is resumed once, unless it started a tool that must not run
/// twice (then it is left to the user, with the tools named), it answered several items together
/// (each would otherwise resume it), or it was already resumed (so a run that crashes perch cannot
/// crash-loop it).
pub fn answer_taken(runs: &ItemRuns) -> ItemAnswer {
    if !matches!(runs.outcome, Outcome::Interrupted { .. }) {
        return ItemAnswer::Deliver;
    }
    if !runs.irreversible.is_empty() {
        let tools: Vec<String> = runs
            .irreversible
            .iter()
            .map(|tool| format!("`{tool}`"))
            .collect();
        let (noun, pronoun) = if tools.len() == 1 {
            ("tool", "it")
        } else {
            ("tools", "they")
        };
        return ItemAnswer::Note(format!(
            "Sorry, I could not finish that: perch stopped during this run after starting the \
             {noun} {}; {pronoun} may or may not have finished, so the run was not continued. \
             Please check, and ask again if needed.",
            tools.join(", ")
        ));
    }
    if runs.items > 1 {
        return ItemAnswer::Note(
            "Sorry, I could not finish that: perch stopped while answering several messages \
             together, and such a run is not continued. Please ask again."
                .into(),
        );
    }
    if runs.resumed {
        return ItemAnswer::Note(
            "Sorry, I could not finish that: perch stopped while answering it, and again while \
             continuing it after a restart, so it was not tried a third time. Please ask again."
                .into(),
        );
    }
    ItemAnswer::Resume(if runs.user_entry {
        Resumption::FromLeaf
    } else {
        Resumption::WithInput
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(tool: &str, replay: Replay, n: u8) -> PendingTool {
        PendingTool {
            op: OperationId::from_bytes([1; 16]),
            call_id: format!("call-{n}"),
            tool: ToolName::try_from(tool).unwrap(),
            arguments: serde_json::json!({}),
            result: EntryId::from_bytes([n; 16]),
            replay,
        }
    }

    #[test]
    fn only_tools_safe_then_and_now_are_rerun() {
        let op = OperationId::from_bytes([1; 16]);
        let open = vec![(
            op,
            vec![
                pending("grep", Replay::Safe, 1),
                pending("became_effectful", Replay::Safe, 2),
                pending("deploy", Replay::Never, 3),
                pending("removed", Replay::Safe, 4),
                pending("now_safe", Replay::Never, 5),
            ],
        )];
        let current = |tool: &ToolName| match tool.as_str() {
            "grep" | "now_safe" => Some(Replay::Safe),
            "became_effectful" | "deploy" => Some(Replay::Never),
            _ => None,
        };
        let kinds: Vec<&str> = plan_recovery(&open, current)
            .iter()
            .map(|step| match step {
                RecoveryStep::Rerun(_) => "rerun",
                RecoveryStep::Interrupt(_) => "interrupt",
                RecoveryStep::Finish { .. } => "finish",
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "rerun",
                "interrupt",
                "interrupt",
                "interrupt",
                "interrupt",
                "finish"
            ]
        );
    }

    #[test]
    fn an_operation_with_nothing_pending_is_just_closed() {
        let op = OperationId::from_bytes([1; 16]);
        let steps = plan_recovery(&[(op, vec![])], |_| None);
        assert!(matches!(
            steps.as_slice(),
            [RecoveryStep::Finish {
                outcome: Outcome::Interrupted { .. },
                ..
            }]
        ));
        assert!(plan_recovery(&[], |_| None).is_empty());
    }

    #[test]
    fn interrupted_chat_runs_are_resumed_once_unless_irreversible() {
        let interrupted = Outcome::Interrupted {
            reason: "perch stopped".into(),
        };
        let runs = |outcome: &Outcome, resumed, user_entry, irreversible: &[&str]| ItemRuns {
            op: OperationId::from_bytes([1; 16]),
            outcome: outcome.clone(),
            text: "hello".into(),
            resumed,
            user_entry,
            irreversible: irreversible.iter().map(ToString::to_string).collect(),
            items: 1,
        };
        let together = ItemRuns {
            items: 2,
            ..runs(&interrupted, false, true, &[])
        };
        let failed = Outcome::Failed {
            reason: "model".into(),
        };
        let table: Vec<(ItemRuns, &str)> = vec![
            (runs(&Outcome::Completed, false, true, &[]), "deliver"),
            (runs(&Outcome::Completed, true, true, &["bash"]), "deliver"),
            (runs(&failed, false, true, &[]), "deliver"),
            (runs(&Outcome::Cancelled, false, true, &[]), "deliver"),
            (runs(&interrupted, false, true, &[]), "resume from leaf"),
            (runs(&interrupted, false, false, &[]), "resume with input"),
            (runs(&interrupted, true, true, &[]), "note: again while"),
            (together, "note: several messages"),
            (runs(&interrupted, true, false, &[]), "note: again while"),
            (
                runs(&interrupted, false, true, &["bash"]),
                "note: the tool `bash`; it",
            ),
            (
                runs(&interrupted, true, true, &["bash", "deploy"]),
                "note: the tools `bash`, `deploy`; they",
            ),
        ];
        for (runs, expected) in table {
            let got = match answer_taken(&runs) {
                ItemAnswer::Deliver => "deliver".to_owned(),
                ItemAnswer::Resume(Resumption::FromLeaf) => "resume from leaf".to_owned(),
                ItemAnswer::Resume(Resumption::WithInput) => "resume with input".to_owned(),
                ItemAnswer::Note(text) => format!("note: {text}"),
            };
            match expected.strip_prefix("note: ") {
                Some(part) => assert!(
                    got.starts_with("note: ") && got.contains(part),
                    "{runs:?}: {got}"
                ),
                None => assert_eq!(got, expected, "{runs:?}"),
            }
        }
    }
}
