//! The one boundary between a heartbeat run and the service hosting it. A run asks its host for
//! a lane, a command in the machine, a look at the spend cap, a post, a steer, an owner alert, a
//! count in the metrics and a place in the shutdown drain; it decides everything else itself
//! (the check's meaning, the judged turn, the verdict's effect, the note, the stop).

use crate::channel::BoxFuture;
use crate::lane::{Finished, Input, Lane, LaneError};
use crate::sandbox::{Command, Output, SandboxError};
use crate::store::outbox::DeliveryLane;
use perch_core::alert::AlertKind;
use perch_core::heartbeat::{SlotOutcome, Target};
use perch_core::log::Note;
use perch_core::name::{LaneName, ModelRef, TaskName};
use perch_core::origin::Relay;
use perch_core::prompt::Origin;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// A heartbeat's `Steer:` verdict, as it is carried out.
#[derive(Debug, Clone, PartialEq)]
pub struct Steer {
    /// The lane steered, opened for runs from `origin` if it is not open.
    pub into: LaneName,
    pub origin: Origin,
    /// Where the text is relayed from (the task and its slot).
    pub relay: Relay,
    pub text: String,
}

/// What a heartbeat run needs from the service that hosts it.
pub trait Host: Send + Sync {
    /// The lane `name`, opened for runs from `origin` (on `model` instead of the agent's when
    /// set), or the one already open; why not when it cannot be opened.
    fn open_lane<'a>(
        &'a self,
        name: &'a LaneName,
        origin: Origin,
        model: Option<&'a ModelRef>,
    ) -> BoxFuture<'a, Result<Box<dyn HostLane>, String>>;

    /// Runs `command` in the agent's machine (a task's check).
    fn run_command(&self, command: Command) -> BoxFuture<'_, Result<Output, SandboxError>>;

    /// Whether the spend cap lets a heartbeat run now; why not when it does not.
    fn may_spend(&self) -> BoxFuture<'_, Result<(), String>>;

    /// Posts `text` to `target` through the outbox and waits for it to settle: the delivery
    /// ids, comma-separated, or why it was not delivered. How it settled is appended to `lane`.
    fn post<'a>(
        &'a self,
        target: &'a Target,
        text: &'a str,
        lane: DeliveryLane,
    ) -> BoxFuture<'a, Result<String, String>>;

    /// Adds the steer's text to its lane: to the lane's active run at the next tool boundary,
    /// or, when it is idle, as a run of its own whose reply stays in the lane.
    fn steer(&self, steer: Steer) -> BoxFuture<'_, Result<(), String>>;

    /// Tells the owner.
    fn alert(&self, kind: AlertKind, text: String);

    /// Counts a run's outcome for `task` in the metrics.
    fn count_outcome(&self, task: &TaskName, outcome: &SlotOutcome);

    /// Held while a run goes on, so that a shutdown lets it finish (bounded by the drain).
    fn track_run(&self) -> TaskTrackerToken;
}

/// A lane as a heartbeat run uses it.
pub trait HostLane: Send + Sync {
    /// Runs `input` (after the runs before it) and says how it ended.
    fn send(&self, input: Input) -> BoxFuture<'_, Result<Finished, LaneError>>;

    /// Appends `note` to the conversation after its runs; never shown to the model.
    fn note(&self, note: Note) -> BoxFuture<'_, Result<(), LaneError>>;
}

impl HostLane for Lane {
    fn send(&self, input: Input) -> BoxFuture<'_, Result<Finished, LaneError>> {
        Box::pin(Lane::send(self, input, None))
    }

    fn note(&self, note: Note) -> BoxFuture<'_, Result<(), LaneError>> {
        Box::pin(Lane::note(self, note))
    }
}
