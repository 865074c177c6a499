//! The deliveries' owner: one task that records each reply's intents, in order, and keeps every
//! room's queue and every lane's waiting records, starting a worker for each that holds anything.

use super::super::Common;
use super::super::channel::Channel;
use super::super::lanes::LaneWriter;
use super::handle::{Handed, Posted, Recorded, Request, RoomKey};
use super::room_queues::RoomQueues;
use super::worker::{Workers, write_records};
use crate::channel::Delivery;
use crate::store::outbox::{DeliveryLane, Outbox};
use perch_core::log::Record;
use perch_core::name::LaneName;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

pub(super) struct Owner {
    pub(super) requests: mpsc::UnboundedReceiver<Request>,
    pub(super) rooms: RoomQueues<Handed, RoomKey>,
    pub(super) records: RoomQueues<Record, LaneName>,
    pub(super) outbox: Outbox,
    pub(super) workers: Arc<Workers>,
    pub(super) writer: LaneWriter,
    /// The workers are among its tasks.
    pub(super) common: Common,
}

impl Owner {
    pub(super) async fn run(mut self) {
        loop {
            let request = tokio::select! {
                request = self.requests.recv() => match request {
                    Some(request) => request,
                    None => return,
                },
                () = self.common.closing.cancelled() => return,
            };
            match request {
                Request::Hand {
                    channel,
                    deliveries,
                    lane,
                    reply,
                } => {
                    let posted = self.hand(&channel, deliveries, lane).await;
                    let _ = reply.send(posted);
                }
                Request::Queue {
                    channel,
                    pieces,
                    lane,
                } => self.queue(&channel, pieces, lane, None),
                Request::Next { room, reply } => {
                    let _ = reply.send(self.rooms.next(&room));
                }
                Request::Abandon { room, reply } => {
                    let _ = reply.send(self.rooms.abandon(&room));
                }
                Request::Record { lane, record } => {
                    if self.records.push(&lane, record) {
                        self.common.tasks.spawn(write_records(
                            self.workers.deliveries.clone(),
                            self.writer.clone(),
                            lane,
                        ));
                    }
                }
                Request::NextRecord { lane, reply } => {
                    let _ = reply.send(self.records.next(&lane));
                }
            }
        }
    }

    /// Records every delivery's intent (fsynced, in order) and queues them, as one reply; the
    /// pieces recorded before an intent that could not be are still queued.
    async fn hand(
        &mut self,
        channel: &Arc<Channel>,
        deliveries: Vec<Delivery>,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        let (told, settled) = oneshot::channel();
        let ids = deliveries
            .iter()
            .map(|delivery| delivery.id.clone())
            .collect();
        if deliveries.is_empty() {
            let _ = told.send(Ok(()));
            return Ok(Posted { ids, settled });
        }
        let name = channel.loaded.config.name.to_string();
        let mut pieces = Vec::with_capacity(deliveries.len());
        let mut failed = None;
        for delivery in deliveries {
            match self.outbox.intend(&name, &delivery, lane.as_ref()).await {
                Ok(intent) => pieces.push((intent, delivery)),
                Err(error) => {
                    failed = Some(error.to_string());
                    break;
                }
            }
            crate::host::failpoint::hit("after:delivery_intent");
        }
        if !pieces.is_empty() {
            self.queue(channel, pieces, lane, Some(told));
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(Posted { ids, settled }),
        }
    }

    /// Queues recorded deliveries, as one reply, to their room's worker, starting the worker if
    /// the room has none.
    fn queue(
        &mut self,
        channel: &Arc<Channel>,
        pieces: Vec<Recorded>,
        lane: Option<DeliveryLane>,
        settled: Option<oneshot::Sender<Result<(), String>>>,
    ) {
        let Some(room) = pieces.first().map(|(_, delivery)| delivery.room.clone()) else {
            return;
        };
        let key = (channel.loaded.config.name.to_string(), room);
        let handed = Handed {
            channel: Arc::clone(channel),
            pieces,
            lane,
            settled,
        };
        if self.rooms.push(&key, handed) {
            self.common.tasks.spawn(Arc::clone(&self.workers).work(key));
        }
    }
}
