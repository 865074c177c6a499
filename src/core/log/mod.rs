//! The session log: one JSONL line per mutation, the index rows that summarise each line, the
//! fold that reduces a log to its state, and the recovery plan for what a crash left open.
//!
//! A lane's log holds three shapes of line: one `header`, `record`s (bookkeeping: operations,
//! tool intents, leaf moves, repairs) and `entry`s (the conversation tree). Deleting every record
//! leaves a valid conversation.

mod line;
mod position;
mod recovery;
mod row;
mod state;

pub use line::{
    Commit, Entry, EntryBody, FORMAT_VERSION, Header, Intent, Line, Message, Outcome, Part,
    Previous, Record, Role, Settled,
};
pub use position::{LinePosition, ReadLine};
pub use recovery::{
    ItemAnswer, ItemRuns, PendingTool, RecoveryStep, Resumption, answer_taken, interrupted_result,
    plan_recovery, tool_result,
};
pub use row::{INDEX_HEADER_LEN, IndexHeader, Row, RowError, Summary};
pub use state::{DeclaredTool, LaneState, OpenOperation, Violation};
