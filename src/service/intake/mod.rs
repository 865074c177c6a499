//! Intake: one task takes every arrival, journals and acknowledges it, admits it, hands it to
//! its channel's `on_message` hook and decides it: a chat command answered, a pairing offered,
//! an item handed to its conversation. It owns pairing, the group context, the bot-loop guard's
//! turns and the channels' hooks; other tasks ask it to format their replies and to approve a
//! pairing, and, at start, to recover the inbox.

mod handle;
mod recovery;
mod task;

pub(super) use handle::Intake;

use super::Common;
use super::channel::Channels;
use super::conversations::Conversations;
use super::deliveries::Deliveries;
use crate::agent::AgentDir;
use crate::channel::Arrival;
use crate::channel::hooks::ChannelHooks;
use crate::store::inbox::{Backlog, Inbox};
use crate::store::outbox::Outbox;
use handle::Request;
use perch_core::group_context::GroupContext;
use perch_core::pairing::Pairing;
use std::collections::HashMap;
use std::path::PathBuf;
use task::{IntakeTask, context_line};
use tokio::sync::mpsc;

/// Intake's handle, before its task starts: the deliveries it formats for need it first.
pub(super) fn handle() -> (Intake, Requests) {
    let (requests, received) = mpsc::unbounded_channel();
    (Intake { requests }, Requests(received))
}

/// What intake's task will answer.
pub(super) struct Requests(mpsc::UnboundedReceiver<Request>);

/// What intake is started with.
pub(super) struct IntakeSetup {
    pub(super) arrivals: mpsc::Receiver<(String, Arrival)>,
    pub(super) channels: Channels,
    pub(super) hooks: HashMap<String, ChannelHooks>,
    pub(super) pairing: Pairing,
    pub(super) pairing_path: PathBuf,
    /// The inbox's backlog, whose group context and bot turns intake picks up.
    pub(super) backlog: Backlog,
    pub(super) inbox: Inbox,
    pub(super) outbox: Outbox,
    pub(super) conversations: Conversations,
    pub(super) deliveries: Deliveries,
    pub(super) dir: AgentDir,
    pub(super) common: Common,
}

/// Starts intake's task on `requests`.
pub(super) fn start(requests: Requests, setup: IntakeSetup) -> tokio::task::JoinHandle<()> {
    let mut context = GroupContext::default();
    for (channel, event) in &setup.backlog.context {
        context.push(channel, &event.room, context_line(event), event.sent_at);
    }
    let task = IntakeTask {
        requests: requests.0,
        arrivals: setup.arrivals,
        channels: setup.channels,
        hooks: setup.hooks,
        pairing: setup.pairing,
        pairing_path: setup.pairing_path,
        context,
        bot_turns: setup.backlog.bot_turns,
        inbox: setup.inbox,
        outbox: setup.outbox,
        conversations: setup.conversations,
        deliveries: setup.deliveries,
        dir: setup.dir,
        common: setup.common,
    };
    tokio::spawn(task.run())
}
