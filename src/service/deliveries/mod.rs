//! Deliveries: a reply formatted, split and recorded in the outbox (every intent fsynced), then
//! sent by its room's worker, which settles it; after a restart, the deliveries a crash left
//! unsettled.
//!
//! One owner task records each reply's intents, in order, and keeps every (channel, room)'s
//! FIFO; while a room's FIFO holds anything, one worker task sends from it: one room's rate
//! limit never holds up another room, and within a room the pieces of a reply and the replies
//! go out in the order their intents were recorded. The worker only carries out
//! [`after_failure`](perch_core::delivery::after_failure), the retry policy.
//!
//! Once a settlement is in the outbox, the delivery's lane (its intent names it) is told with a
//! `delivery_settled` record, which the owner queues for a writer task per lane, so that
//! delivery never waits on a lane.

mod handle;
mod owner;
mod post;
mod recovery;
mod room_queues;
mod worker;

pub(super) use handle::{Deliveries, Format, Posted};
pub(super) use post::{Text, To, outcome_reply};

use super::Common;
use super::channel::Channels;
use super::lanes::LaneWriter;
use crate::store::outbox::Outbox;
use owner::Owner;
use room_queues::RoomQueues;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;
use worker::Workers;

/// What the deliveries are started with.
pub(super) struct DeliveriesSetup {
    pub(super) outbox: Outbox,
    pub(super) channels: Channels,
    /// Formats a reply with its channel's `format` hook.
    pub(super) format: Format,
    /// Where the files a delivery attaches are read from.
    pub(super) workspace: PathBuf,
    /// Appends each settlement to the delivery's lane.
    pub(super) writer: LaneWriter,
    /// The workers are among its tasks.
    pub(super) common: Common,
}

/// Starts the deliveries' owner; returns its handle and the owner's task.
pub(super) fn start(setup: DeliveriesSetup) -> (Deliveries, tokio::task::JoinHandle<()>) {
    let (requests, received) = mpsc::unbounded_channel();
    let deliveries = Deliveries {
        requests,
        channels: setup.channels,
        format: setup.format,
        workspace: setup.workspace.clone(),
        outbox: setup.outbox.clone(),
        common: setup.common.clone(),
    };
    let workers = Arc::new(Workers {
        deliveries: deliveries.clone(),
        outbox: setup.outbox.clone(),
        workspace: setup.workspace,
        common: setup.common.clone(),
    });
    let owner = Owner {
        requests: received,
        rooms: RoomQueues::default(),
        records: RoomQueues::default(),
        outbox: setup.outbox,
        workers,
        writer: setup.writer,
        common: setup.common,
    };
    (deliveries, tokio::spawn(owner.run()))
}
