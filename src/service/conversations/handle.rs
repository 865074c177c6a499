//! The conversations' handle, and the requests it sends their owner task.

use super::super::ask::ask;
use super::super::lanes::LaneLease;
use crate::store::inbox::PendingItem;
use perch_core::name::{LaneName, ModelRef};
use perch_core::prompt::Origin;
use tokio::sync::{mpsc, oneshot};

/// What the conversations' owner is asked.
pub(super) enum Request {
    /// Hand an item to its conversation, starting the conversation if it has no task.
    Dispatch {
        lane: LaneName,
        item: Box<PendingItem>,
    },
    /// `/stop` in the conversation of `lane`: whether its lane is open, so something stopped.
    Stop {
        lane: LaneName,
        reply: oneshot::Sender<bool>,
    },
    /// A conversation idle for its idle time, having taken `taken` items, asks to end: `true`
    /// once nothing more can reach it, `false` when an item is on its way.
    Retire {
        lane: LaneName,
        taken: u64,
        reply: oneshot::Sender<bool>,
    },
    /// A conversation's task ended (at shutdown, or failing).
    Ended { lane: LaneName },
    /// Hold the lane `name` for a heartbeat (see [`Conversations::hold`]).
    Hold {
        name: LaneName,
        origin: Origin,
        model: Option<ModelRef>,
        reply: oneshot::Sender<Result<LaneLease, String>>,
    },
    /// Close every lane, at shutdown once the conversations have stopped: whether every one
    /// closed cleanly.
    CloseAll { reply: oneshot::Sender<bool> },
}

/// The conversations: their owner task's requests. Clones share them.
#[derive(Clone)]
pub(in crate::service) struct Conversations {
    pub(super) requests: mpsc::UnboundedSender<Request>,
}

impl Conversations {
    /// Hands `item` to its conversation, starting the conversation if it has no task; the
    /// conversation answers it and consumes it.
    pub(in crate::service) fn dispatch(&self, item: PendingItem) -> Result<(), String> {
        let lane = LaneName::try_from(item.lane.as_str())?;
        self.requests
            .send(Request::Dispatch {
                lane,
                item: Box::new(item),
            })
            .map_err(|_| "perch is stopping: the item waits for the next start".to_owned())
    }

    /// `/stop` in the conversation of `lane`: what runs in its lane is aborted (the
    /// conversation's run, by its machine, or a heartbeat's). Whether the lane was open.
    pub(in crate::service) async fn stop(&self, lane: LaneName) -> bool {
        ask(&self.requests, |reply| Request::Stop { lane, reply })
            .await
            .unwrap_or(false)
    }

    /// Holds the lane `name`, opened (and recovered) first if it is not open, for runs from
    /// `origin` on `model` or the agent's. Heartbeats take their lanes through here, sharing
    /// them with conversations, so a lane is never opened twice; when every slot stays held for
    /// a minute, or the lane cannot be opened, it says why.
    pub(in crate::service) async fn hold(
        &self,
        name: LaneName,
        origin: Origin,
        model: Option<ModelRef>,
    ) -> Result<LaneLease, String> {
        ask(&self.requests, |reply| Request::Hold {
            name,
            origin,
            model,
            reply,
        })
        .await
        .ok_or_else(|| "perch is stopping".to_owned())?
    }

    /// Closes every lane; whether every one closed cleanly.
    pub(in crate::service) async fn close_all(&self) -> bool {
        ask(&self.requests, |reply| Request::CloseAll { reply })
            .await
            .unwrap_or(false)
    }

    pub(super) async fn retire(&self, lane: LaneName, taken: u64) -> bool {
        ask(&self.requests, |reply| Request::Retire {
            lane,
            taken,
            reply,
        })
        .await
        .unwrap_or(true)
    }

    pub(super) fn ended(&self, lane: LaneName) {
        let _ = self.requests.send(Request::Ended { lane });
    }
}
