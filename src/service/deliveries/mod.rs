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
pub(super) use post::{To, outcome_reply};

use super::channel::Channels;
use super::lanes::LaneWriter;
use crate::host::alert::Alerts;
use crate::host::clock::Clock;
use crate::host::metrics::Metrics;
use crate::store::outbox::Outbox;
use owner::Owner;
use room_queues::RoomQueues;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
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
    pub(super) metrics: Arc<Metrics>,
    pub(super) alerts: Alerts,
    pub(super) clock: Clock,
    /// Cuts a retry's wait short: the delivery is left unsettled for the next start.
    pub(super) shutdown: CancellationToken,
    /// The service's tasks, which shutdown waits for: the workers are among them.
    pub(super) tasks: TaskTracker,
    /// Ends the owner, once the service has drained.
    pub(super) closing: CancellationToken,
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
        metrics: Arc::clone(&setup.metrics),
        alerts: setup.alerts.clone(),
        clock: setup.clock,
    };
    let workers = Arc::new(Workers {
        deliveries: deliveries.clone(),
        outbox: setup.outbox.clone(),
        metrics: setup.metrics,
        alerts: setup.alerts,
        workspace: setup.workspace,
        shutdown: setup.shutdown,
    });
    let owner = Owner {
        requests: received,
        rooms: RoomQueues::default(),
        records: RoomQueues::default(),
        outbox: setup.outbox,
        workers,
        writer: setup.writer,
        tasks: setup.tasks,
        closing: setup.closing,
    };
    (deliveries, tokio::spawn(owner.run()))
}
