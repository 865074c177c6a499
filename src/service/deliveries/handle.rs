//! The deliveries' handle, and the requests it sends their owner task.

use super::super::Common;
use super::super::ask::ask;
use super::super::channel::{Channel, Channels};
use crate::channel::{BoxFuture, Delivery};
use crate::store::outbox::{DeliveryLane, Outbox};
use perch_core::log::{Record, Settled};
use perch_core::name::LaneName;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// How a reply is formatted before it is split: the channel's `format` hook, run by its owner
/// (intake) on `(channel, text)`.
pub(in crate::service) type Format =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// The key of one room's queue: the channel's name and the room.
pub(super) type RoomKey = (String, String);

/// One delivery recorded in the outbox: its intent's sequence number and the delivery.
pub(super) type Recorded = (u64, Delivery);

/// A reply waiting in its room's queue.
pub(super) struct Handed {
    pub(super) channel: Arc<Channel>,
    pub(super) pieces: Vec<Recorded>,
    /// The lane told how each piece settled.
    pub(super) lane: Option<DeliveryLane>,
    /// Told once every piece is settled; `None` for a resend after a restart.
    pub(super) settled: Option<oneshot::Sender<Result<(), String>>>,
}

/// What the deliveries' owner is asked.
pub(super) enum Request {
    /// Record every delivery's intent (fsynced, in order) and queue them, as one reply, to their
    /// room's worker.
    Hand {
        channel: Arc<Channel>,
        deliveries: Vec<Delivery>,
        lane: Option<DeliveryLane>,
        reply: oneshot::Sender<Result<Posted, String>>,
    },
    /// Queue deliveries recorded before (a resend after a restart) to their room's worker.
    Queue {
        channel: Arc<Channel>,
        pieces: Vec<Recorded>,
        lane: Option<DeliveryLane>,
    },
    /// The next reply for a room's worker; `None` ends the worker.
    Next {
        room: RoomKey,
        reply: oneshot::Sender<Option<Handed>>,
    },
    /// Everything still queued to a room whose worker ends early.
    Abandon {
        room: RoomKey,
        reply: oneshot::Sender<VecDeque<Handed>>,
    },
    /// Append `record` to `lane`, after the records before it.
    Record { lane: LaneName, record: Record },
    /// The next record for a lane's writer; `None` ends the writer.
    NextRecord {
        lane: LaneName,
        reply: oneshot::Sender<Option<Record>>,
    },
}

/// A reply recorded in the outbox and handed to its room's worker.
#[derive(Debug)]
pub(in crate::service) struct Posted {
    /// The deliveries' ids, one per piece.
    pub(in crate::service) ids: Vec<String>,
    pub(super) settled: oneshot::Receiver<Result<(), String>>,
}

impl Posted {
    /// Waits until every piece is settled (posted, dropped or of unknown fate, as the outbox
    /// records it); returns the deliveries' ids. An error when an outbox write failed, or when
    /// perch stopped before the pieces were sent (they are settled at the next start).
    pub(in crate::service) async fn settled(self) -> Result<Vec<String>, String> {
        match self.settled.await {
            Ok(Ok(())) => Ok(self.ids),
            Ok(Err(error)) => Err(error),
            Err(_) => {
                Err("perch stopped before this delivery was sent; the next start settles it".into())
            }
        }
    }
}

/// The deliveries: their owner task's requests, and what posting needs besides (formatting the
/// reply, the channels, the workspace its files come from). Clones share them.
#[derive(Clone)]
pub(in crate::service) struct Deliveries {
    pub(super) requests: mpsc::UnboundedSender<Request>,
    pub(super) channels: Channels,
    pub(super) format: Format,
    pub(super) workspace: PathBuf,
    pub(super) outbox: Outbox,
    pub(super) common: Common,
}

impl Deliveries {
    /// Records every delivery's intent (fsynced, in order) and queues them, as one reply, to
    /// their room's worker. When an intent cannot be recorded, the pieces recorded before it
    /// are still queued (so none is left unsent), and the error is returned.
    pub(super) async fn hand(
        &self,
        channel: &Arc<Channel>,
        deliveries: Vec<Delivery>,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        ask(&self.requests, |reply| Request::Hand {
            channel: Arc::clone(channel),
            deliveries,
            lane,
            reply,
        })
        .await
        .ok_or_else(stopped)?
    }

    /// Queues deliveries recorded before, as one reply, to their room's worker.
    pub(super) fn queue(
        &self,
        channel: &Arc<Channel>,
        pieces: Vec<Recorded>,
        lane: Option<DeliveryLane>,
    ) {
        let _ = self.requests.send(Request::Queue {
            channel: Arc::clone(channel),
            pieces,
            lane,
        });
    }

    /// The next reply for `room`'s worker; `None` when the worker must end.
    pub(super) async fn next(&self, room: RoomKey) -> Option<Handed> {
        ask(&self.requests, |reply| Request::Next { room, reply })
            .await
            .flatten()
    }

    /// Everything still queued to `room`, whose worker ends early.
    pub(super) async fn abandon(&self, room: RoomKey) -> VecDeque<Handed> {
        ask(&self.requests, |reply| Request::Abandon { room, reply })
            .await
            .unwrap_or_default()
    }

    /// The next record for `lane`'s writer; `None` when the writer must end.
    pub(super) async fn next_record(&self, lane: LaneName) -> Option<Record> {
        ask(&self.requests, |reply| Request::NextRecord { lane, reply })
            .await
            .flatten()
    }

    /// Appends a `delivery_settled` record to the delivery's lane, once its settlement is in
    /// the outbox, without waiting for it: a settlement is recorded there at most once, and the
    /// lane's record is informational (a crash before it is written loses it).
    pub(super) fn tell_lane(
        &self,
        channel: &str,
        delivery: &Delivery,
        lane: Option<DeliveryLane>,
        settled: Option<Settled>,
    ) {
        let (Some(lane), Some(settled)) = (lane, settled) else {
            return;
        };
        let record = Record::DeliverySettled {
            delivery: delivery.id.clone(),
            channel: channel.to_owned(),
            op: lane.op,
            answers: delivery.reply_to.clone(),
            settled,
            at: self.common.clock.now(),
        };
        let _ = self.requests.send(Request::Record {
            lane: lane.lane,
            record,
        });
    }
}

fn stopped() -> String {
    "perch is stopping: the delivery was not recorded".to_owned()
}
