//! What started an operation, as its `operation_started` record says.

use crate::Timestamp;
use crate::name::TaskName;
use crate::origin::Relay;
use serde::{Deserialize, Serialize};

/// What started an operation. Only perch writes it: nothing a person, a guest or the model
/// writes can set it, so whether a turn is a chat turn, a heartbeat's firing, its correction or
/// its steer is read from here, never from the text of the input. Lanes written before it have
/// none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Trigger {
    /// Messages from a chat channel; the run's user entry holds each with its origin.
    Chat,
    /// A line typed in `perch chat`.
    Terminal,
    /// Heartbeat task `task` fired for `slot`, standing in for `coalesced` missed slots.
    Heartbeat {
        task: TaskName,
        slot: Timestamp,
        #[serde(default, skip_serializing_if = "is_zero")]
        coalesced: u32,
    },
    /// The one corrective message after the reply to `task`'s firing for `slot` was not a
    /// verdict; `reason` says why it was not.
    Correction {
        task: TaskName,
        slot: Timestamp,
        reason: String,
    },
    /// The `Steer:` verdict of `task`'s run for `slot`, run in the lane it steers because no run
    /// was active there to take it.
    Steer { task: TaskName, slot: Timestamp },
    /// A compaction before a run, because the conversation neared the model's context window.
    ContextFull,
    /// A compaction asked for with `perch compact`.
    CompactCommand,
}

impl Trigger {
    /// What starts the run a relayed text gets when no run is active to take it.
    pub fn relayed(relay: &Relay) -> Trigger {
        match relay {
            Relay::HeartbeatSteer { task, slot } => Trigger::Steer {
                task: task.clone(),
                slot: *slot,
            },
        }
    }

    /// What the run's user entry is relayed from, when perch relays it rather than a person
    /// saying it: a steer's task and slot.
    pub fn relay(&self) -> Option<Relay> {
        match self {
            Trigger::Steer { task, slot } => Some(Relay::HeartbeatSteer {
                task: task.clone(),
                slot: *slot,
            }),
            Trigger::Chat
            | Trigger::Terminal
            | Trigger::Heartbeat { .. }
            | Trigger::Correction { .. }
            | Trigger::ContextFull
            | Trigger::CompactCommand => None,
        }
    }
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}
