//! Conversations: one owner task keeps the conversations that have a task and the open lanes
//! (the pool, shared with those tasks only); each conversation's task holds its lane while it
//! has something to do, runs it on its items, and ends once it has been idle for its idle time.
//! `/stop` and heartbeats' lanes are requests to the owner.

mod context;
mod converse;
mod handle;
mod owner;
mod talk;

pub(super) use handle::Conversations;
pub(super) use talk::lane_name;

use super::Common;
use super::channel::Channels;
use super::deliveries::Deliveries;
use super::lanes::LanePool;
use crate::lane::RunLimits;
use crate::lane::Runtime;
use crate::store::inbox::Inbox;
use context::Context;
use owner::Owner;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the conversations are started with.
pub(super) struct ConversationsSetup {
    pub(super) runtime: Arc<Runtime>,
    pub(super) inbox: Inbox,
    pub(super) deliveries: Deliveries,
    pub(super) channels: Channels,
    /// The open lanes; the conversations own them from now on.
    pub(super) pool: LanePool,
    pub(super) limits: RunLimits,
    pub(super) common: Common,
}

/// Starts the conversations' owner; returns its handle and the owner's task.
pub(super) fn start(setup: ConversationsSetup) -> (Conversations, tokio::task::JoinHandle<()>) {
    let (requests, received) = mpsc::unbounded_channel();
    let handle = Conversations { requests };
    let context = Arc::new(Context {
        workspace: setup.runtime.agent().dir.workspace(),
        runtime: setup.runtime,
        inbox: setup.inbox,
        deliveries: setup.deliveries,
        pool: setup.pool,
        limits: setup.limits,
        common: setup.common,
    });
    let owner = Owner::new(received, handle.clone(), context, setup.channels);
    (handle, tokio::spawn(owner.run()))
}
