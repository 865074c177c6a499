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
}
