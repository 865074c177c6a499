//! The session log: one JSONL line per mutation, the index rows that summarise each line, the
//! fold that reduces a log to its state, and the recovery plan for what a crash left open.
//!
//! A lane's log holds three shapes of line: one `header`, `record`s (bookkeeping: operations and
//! what started them, tool intents, leaf moves, repairs) and `entry`s (the conversation tree:
//! messages and notes). Deleting every record leaves a valid conversation.

mod line;
mod note;
mod position;
mod recovery;
mod row;
mod state;
mod trigger;

pub use line::{
    Commit, Entry, EntryBody, FORMAT_VERSION, Header, Intent, Line, Message, Outcome, Part,
    Previous, Record, Role, Settled,
};
pub use note::{HEARTBEAT_OUTCOME, HeartbeatNote, Note, RunMode, SUMMARY};
pub use position::{LinePosition, ReadLine};
pub use recovery::{
    ItemAnswer, ItemRuns, PendingTool, RecoveryStep, Resumption, answer_taken, interrupted_result,
    plan_recovery, tool_result,
};
pub use row::{INDEX_HEADER_LEN, IndexHeader, Row, RowError, Summary};
pub use state::{DeclaredTool, LaneState, OpenOperation, Violation};
pub use trigger::Trigger;
