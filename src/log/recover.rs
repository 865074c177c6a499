//! Carrying out the recovery plan for one lane.

use super::error::LogError;
use super::lane::LaneLog;
use crate::host::clock::Clock;
use perch_core::config::Replay;
use perch_core::log::{
    Line, PendingTool, Record, RecoveryStep, interrupted_result, plan_recovery, tool_result,
};
use perch_core::name::ToolName;

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    pub operations_closed: usize,
    pub tools_rerun: usize,
    pub tools_interrupted: usize,
}

/// The output of a tool run again during recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRerun {
    pub output: String,
    pub is_error: bool,
}

/// Produces every missing result of every open operation and closes them. `current_replay`
/// gives each tool's declaration as it stands now (`None` if it is gone); `rerun` starts a tool
/// that may be replayed, returning a future that owns what it needs (so the recovery stays
/// `Send` for any caller). Running this twice does nothing the second time.
pub async fn recover<Rerun>(
    log: &LaneLog,
    current_replay: impl Fn(&ToolName) -> Option<Replay>,
    mut rerun: impl FnMut(&PendingTool) -> Rerun,
    clock: &Clock,
) -> Result<RecoveryReport, LogError>
where
    Rerun: std::future::Future<Output = ToolRerun>,
{
    let open = log.pending_tools().await?;
    let mut report = RecoveryReport::default();
    for step in plan_recovery(&open, current_replay) {
        let line = match step {
            RecoveryStep::Rerun(tool) => {
                let result = rerun(&tool).await;
                let parent = log.snapshot().await?.leaf;
                report.tools_rerun += 1;
                Line::Entry(tool_result(
                    &tool,
                    result.output,
                    result.is_error,
                    parent,
                    clock.now(),
                ))
            }
            RecoveryStep::Interrupt(tool) => {
                let parent = log.snapshot().await?.leaf;
                report.tools_interrupted += 1;
                Line::Entry(interrupted_result(&tool, parent, clock.now()))
            }
            RecoveryStep::Finish { op, outcome } => {
                report.operations_closed += 1;
                Line::Record(Record::OperationFinished {
                    op,
                    outcome,
                    at: clock.now(),
                })
            }
        };
        log.append(&line).await?;
    }
    Ok(report)
}
