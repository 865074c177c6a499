//! Delivery: a reply formatted, split and recorded in the outbox (every intent fsynced) by its
//! caller, then handed to its room's worker, which sends it with its files and settles it;
//! after a restart, the deliveries a crash left unsettled.
//!
//! Every (channel, room) has one FIFO and, while it holds anything, one worker task: one room's
//! rate limit never holds up another room, and within a room the pieces of a reply and the
//! replies go out in the order their intents were recorded. The worker only carries out
//! [`after_failure`], the retry policy.
//!
//! Once a settlement is in the outbox, the delivery's lane (its intent names it) is told with a
//! `delivery_settled` record, appended by another task so that delivery never waits on a lane.

use super::lanes::LaneRecords;
use super::{Channel, Service};
use crate::channel::{Delivery, DeliveryError, InboundEvent, OutboundFile};
use crate::host::alert::Alerts;
use crate::host::metrics::{DeliveryOutcome, Metrics};
use crate::store::outbox::{DeliveryLane, Outbox, OutboxRecord, Unsettled};
use perch_core::alert::AlertKind;
use perch_core::delivery::{
    AttemptFailure, Attempts, NotSentBecause, Retry, Unreceipted, after_failure, split_message,
};
use perch_core::log::{Record, Settled};
use perch_core::starts::OutboxRecovered;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

impl Service {
    /// Formats, splits and records a reply to `to` in the outbox, and hands it to its room's
    /// worker; returns once every intent is fsynced.
    pub(super) async fn reply(
        &self,
        channel: &Arc<Channel>,
        to: &InboundEvent,
        text: String,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        self.post(
            channel,
            &to.room,
            to.thread.as_deref(),
            Some(&to.platform_id),
            text,
            lane,
        )
        .await
    }

    /// Formats, splits and records `text` to `room` in the outbox, the first piece as a reply
    /// to `reply_to`, and hands it to the room's worker; returns once every intent is fsynced.
    /// How each piece settles is appended to `lane`'s session log.
    pub(super) async fn post(
        &self,
        channel: &Arc<Channel>,
        room: &str,
        thread: Option<&str>,
        reply_to: Option<&str>,
        text: String,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        self.post_files(channel, room, thread, reply_to, text, Vec::new(), lane)
            .await
    }

    /// [`Service::post`] with workspace files, attached to the last piece. If the platform
    /// refuses that piece with its files, the worker sends it again without them, saying so.
    #[expect(
        clippy::too_many_arguments,
        reason = "a delivery's parts, each named where it is called"
    )]
    pub(super) async fn post_files(
        &self,
        channel: &Arc<Channel>,
        room: &str,
        thread: Option<&str>,
        reply_to: Option<&str>,
        text: String,
        files: Vec<OutboundFile>,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        let formatted = {
            let mut hooks = channel.hooks.lock().await;
            hooks.run_format(&text).await
        };
        let formatted = formatted.unwrap_or_else(|error| {
            tracing::warn!(
                channel = %channel.loaded.config.name,
                "format hook failed, sending the reply as written: {error}"
            );
            text
        });
        let mut pieces = split_message(&formatted, channel.connector.limits().max_chars);
        if pieces.is_empty() && !files.is_empty() {
            pieces.push(String::new());
        }
        let last = pieces.len().saturating_sub(1);
        let mut files = Some(files);
        let deliveries = pieces
            .into_iter()
            .enumerate()
            .map(|(index, piece)| Delivery {
                id: Outbox::new_id(),
                room: room.to_owned(),
                thread: thread.map(str::to_owned),
                reply_to: reply_to.filter(|_| index == 0).map(str::to_owned),
                text: piece,
                attachments: if index == last {
                    files.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
            })
            .collect();
        self.deliveries.hand(channel, deliveries, lane).await
    }

    /// After a restart: resend inside the platform's window (through the rooms' workers, so
    /// startup does not wait for them), report unknowns, drop the old.
    pub(super) async fn settle_outbox(
        &self,
        unsettled: Vec<Unsettled>,
    ) -> Result<OutboxRecovered, String> {
        let (mut resent, mut unknown, mut expired) = (0, 0, 0);
        for delivery in unsettled {
            let Some(channel) = self.channels.get(&delivery.channel) else {
                continue;
            };
            let window = channel.connector.limits().resend_window;
            match self.outbox.decide(&delivery, window) {
                Unreceipted::Resend => {
                    resent += 1;
                    self.deliveries.queue(
                        channel,
                        vec![(delivery.seq, delivery.delivery)],
                        delivery.lane,
                        None,
                    );
                }
                Unreceipted::Unknown => {
                    unknown += 1;
                    let reason = "perch stopped between recording this delivery and its receipt; it is not resent, so it is never posted twice".to_owned();
                    tracing::warn!(
                        channel = %delivery.channel,
                        delivery = %delivery.delivery.id,
                        "delivery {} on {}: unknown",
                        delivery.delivery.id,
                        delivery.channel
                    );
                    self.metrics
                        .settled(&delivery.channel, DeliveryOutcome::Unknown);
                    self.alert(
                        AlertKind::DeliveryUnknown,
                        format!(
                            "delivery {} to {} room {} has an unknown fate: perch stopped \
                             between recording it and its receipt. It may or may not have been \
                             posted, and is not sent again; `perch status` lists it.",
                            delivery.delivery.id, delivery.channel, delivery.delivery.room
                        ),
                    );
                    let record = OutboxRecord::Unknown {
                        intent: delivery.seq,
                        reason,
                    };
                    let settled = record.settled();
                    self.outbox
                        .settle(delivery.seq, record)
                        .await
                        .map_err(|error| error.to_string())?;
                    self.deliveries.tell_lane(
                        &delivery.channel,
                        &delivery.delivery,
                        delivery.lane,
                        settled,
                    );
                }
                Unreceipted::Expired => {
                    expired += 1;
                    self.metrics
                        .settled(&delivery.channel, DeliveryOutcome::Dropped);
                    let reason = "older than the outbox's time to live".to_owned();
                    self.outbox
                        .settle(
                            delivery.seq,
                            OutboxRecord::Dropped {
                                intent: delivery.seq,
                                reason: reason.clone(),
                            },
                        )
                        .await
                        .map_err(|error| error.to_string())?;
                    self.deliveries.tell_lane(
                        &delivery.channel,
                        &delivery.delivery,
                        delivery.lane,
                        Some(Settled::Dropped { reason }),
                    );
                }
            }
        }
        Ok(OutboxRecovered {
            resent,
            unknown,
            expired,
        })
    }
}

/// A reply recorded in the outbox and handed to its room's worker.
#[derive(Debug)]
pub(super) struct Posted {
    /// The deliveries' ids, one per piece.
    pub(super) ids: Vec<String>,
    settled: oneshot::Receiver<Result<(), String>>,
}

impl Posted {
    /// Waits until every piece is settled (posted, dropped or of unknown fate, as the outbox
    /// records it); returns the deliveries' ids. An error when an outbox write failed, or when
    /// perch stopped before the pieces were sent (they are settled at the next start).
    pub(super) async fn settled(self) -> Result<Vec<String>, String> {
        match self.settled.await {
            Ok(Ok(())) => Ok(self.ids),
            Ok(Err(error)) => Err(error),
            Err(_) => {
                Err("perch stopped before this delivery was sent; the next start settles it".into())
            }
        }
    }
}

/// The key of one room's queue: the channel's name and the room.
type RoomKey = (String, String);

/// One delivery recorded in the outbox: its intent's sequence number and the delivery.
type Recorded = (u64, Delivery);

/// A reply waiting in its room's queue.
struct Handed {
    channel: Arc<Channel>,
    pieces: Vec<Recorded>,
    /// The lane told how each piece settled.
    lane: Option<DeliveryLane>,
    /// Told once every piece is settled; `None` for a resend after a restart.
    settled: Option<oneshot::Sender<Result<(), String>>>,
}

/// The delivery workers: one FIFO per (channel, room), and a task per room that has anything
/// queued. Clones share them.
#[derive(Clone)]
pub(super) struct Deliveries {
    shared: Arc<Workers>,
}

/// What every room's worker shares.
struct Workers {
    /// The rooms with a worker, and what waits for each.
    rooms: RoomQueues<Handed>,
    /// Held from a reply's first intent until it is queued, so that replies queue in the order
    /// their intents were recorded. A tokio lock: it is held across the intents' fsyncs.
    recording: tokio::sync::Mutex<()>,
    outbox: Outbox,
    metrics: Arc<Metrics>,
    alerts: Alerts,
    /// Where the files a delivery attaches are read from.
    workspace: PathBuf,
    /// Where each settlement is told to the delivery's lane.
    lanes: LaneRecords,
    /// Cuts a retry's wait short: the delivery is left unsettled for the next start.
    shutdown: CancellationToken,
    /// The service's tasks, which shutdown waits for: the workers are among them.
    tasks: TaskTracker,
}

/// Why a worker stopped delivering a reply before every piece was settled.
enum Unfinished {
    /// An outbox write failed.
    Write(String),
    /// perch is stopping, and a retry would have had to wait: the intents of the piece that
    /// waited and of the reply's pieces after it, none of them sent.
    Stopping { unsent: Vec<u64> },
}

impl Deliveries {
    /// Workers that record in `outbox`, count in `metrics`, alert through `alerts`, read
    /// attachments under `workspace`, tell each delivery's lane how it settled through `lanes`,
    /// and run as `tasks` until `shutdown`.
    pub(super) fn new(
        outbox: Outbox,
        metrics: Arc<Metrics>,
        alerts: Alerts,
        workspace: PathBuf,
        lanes: LaneRecords,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Deliveries {
        Deliveries {
            shared: Arc::new(Workers {
                rooms: RoomQueues::default(),
                recording: tokio::sync::Mutex::new(()),
                outbox,
                metrics,
                alerts,
                workspace,
                lanes,
                shutdown,
                tasks,
            }),
        }
    }

    /// Records every delivery's intent (fsynced, in order) and queues them, as one reply, to
    /// their room's worker. When an intent cannot be recorded, the pieces recorded before it
    /// are still queued (so none is left unsent), and the error is returned.
    async fn hand(
        &self,
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
        let recording = self.shared.recording.lock().await;
        let mut pieces = Vec::with_capacity(deliveries.len());
        let mut failed = None;
        for delivery in deliveries {
            match self
                .shared
                .outbox
                .intend(&name, &delivery, lane.as_ref())
                .await
            {
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
        drop(recording);
        match failed {
            Some(error) => Err(error),
            None => Ok(Posted { ids, settled }),
        }
    }

    /// Queues recorded deliveries, as one reply, to their room's worker, starting the worker if
    /// the room has none.
    fn queue(
        &self,
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
        if self.shared.rooms.push(&key, handed) {
            let workers = Arc::clone(&self.shared);
            self.shared.tasks.spawn(workers.work(key));
        }
    }
}

impl Deliveries {
    /// Tells `lane` how `delivery` settled (see [`Workers::tell_lane`]).
    fn tell_lane(
        &self,
        channel: &str,
        delivery: &Delivery,
        lane: Option<DeliveryLane>,
        settled: Option<Settled>,
    ) {
        self.shared.tell_lane(channel, delivery, lane, settled);
    }
}

impl Workers {
    /// Appends a `delivery_settled` record to the delivery's lane, once its settlement is in
    /// the outbox, without waiting for it: a settlement is recorded there at most once, and the
    /// lane's record is informational (a crash before it is written loses it).
    fn tell_lane(
        &self,
        channel: &str,
        delivery: &Delivery,
        lane: Option<DeliveryLane>,
        settled: Option<Settled>,
    ) {
        let (Some(lane), Some(settled)) = (lane, settled) else {
            return;
        };
        self.lanes.append(
            lane.lane,
            Record::DeliverySettled {
                delivery: delivery.id.clone(),
                channel: channel.to_owned(),
                op: lane.op,
                answers: delivery.reply_to.clone(),
                settled,
                at: self.lanes.now(),
            },
        );
    }

    /// One room's worker: delivers what its queue holds, in order, and ends (its entry removed)
    /// when the queue is empty.
    async fn work(self: Arc<Self>, key: RoomKey) {
        loop {
            let Some(next) = self.rooms.next(&key) else {
                return;
            };
            let Handed {
                channel,
                pieces,
                lane,
                settled,
            } = next;
            let result = match self.deliver(&channel, pieces, lane.as_ref()).await {
                Ok(()) => Ok(()),
                Err(Unfinished::Write(error)) => {
                    tracing::error!(
                        channel = %key.0,
                        "a delivery to {} room {} could not be recorded: {error}",
                        key.0,
                        key.1
                    );
                    Err(error)
                }
                Err(Unfinished::Stopping { mut unsent }) => {
                    // What is left in this room stays unsettled in the outbox, in order, for the
                    // next start, marked as certainly not sent so that it is sent then on any
                    // platform; the callers waiting on it are told so when it is dropped.
                    for left in self.rooms.abandon(&key) {
                        unsent.extend(left.pieces.iter().map(|(intent, _)| *intent));
                    }
                    if let Err(error) = self
                        .outbox
                        .unsent(unsent, "perch stopped while this delivery waited")
                        .await
                    {
                        tracing::warn!(
                            channel = %key.0,
                            "deliveries to {} room {} waiting at shutdown could not be marked unsent (the next start reports them unknown): {error}",
                            key.0,
                            key.1
                        );
                    }
                    return;
                }
            };
            if let Some(settled) = settled {
                let _ = settled.send(result);
            }
        }
    }

    /// Sends one reply's pieces in order and settles each. A piece the platform refused with
    /// its files goes again without them, saying so, before anything else in the room.
    async fn deliver(
        &self,
        channel: &Channel,
        pieces: Vec<Recorded>,
        lane: Option<&DeliveryLane>,
    ) -> Result<(), Unfinished> {
        let name = channel.loaded.config.name.to_string();
        let mut queue = VecDeque::from(pieces);
        while let Some((intent, delivery)) = queue.pop_front() {
            let reason = match self.send(channel, intent, &delivery, lane).await {
                Ok(None) => continue,
                Ok(Some(reason)) => reason,
                Err(Unfinished::Stopping { mut unsent }) => {
                    unsent.extend(queue.iter().map(|(intent, _)| *intent));
                    return Err(Unfinished::Stopping { unsent });
                }
                Err(error) => return Err(error),
            };
            let paths: Vec<&str> = delivery
                .attachments
                .iter()
                .map(|file| file.path.as_str())
                .collect();
            let note = perch_core::attachment::could_not_attach(
                &paths.join(", "),
                &perch_core::attachment::FileRefusal::Failed(format!(
                    "the platform refused it: {reason}"
                )),
            );
            let text = crate::tools::attachments::with_notes(&delivery.text, &[note]);
            let pieces = split_message(&text, channel.connector.limits().max_chars);
            for (index, piece) in pieces.into_iter().enumerate() {
                let again = Delivery {
                    id: Outbox::new_id(),
                    room: delivery.room.clone(),
                    thread: delivery.thread.clone(),
                    reply_to: delivery.reply_to.clone().filter(|_| index == 0),
                    text: piece,
                    attachments: Vec::new(),
                };
                let intent = self
                    .outbox
                    .intend(&name, &again, lane)
                    .await
                    .map_err(|error| Unfinished::Write(error.to_string()))?;
                queue.push_back((intent, again));
            }
        }
        Ok(())
    }

    /// Sends one recorded delivery, with the workspace files it attaches, and settles it. Returns
    /// the platform's reason when it refused a delivery that carried files.
    async fn send(
        &self,
        channel: &Channel,
        intent: u64,
        delivery: &Delivery,
        lane: Option<&DeliveryLane>,
    ) -> Result<Option<String>, Unfinished> {
        let (uploads, notes) = if delivery.attachments.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            crate::tools::attachments::uploads(&self.workspace, &delivery.attachments).await
        };
        let noted;
        let delivery = if notes.is_empty() {
            delivery
        } else {
            noted = Delivery {
                text: crate::tools::attachments::with_notes(&delivery.text, &notes),
                ..delivery.clone()
            };
            &noted
        };
        let resends = channel.connector.limits().resend_window.is_some();
        let mut attempts = Attempts::default();
        let mut refused = None;
        let record = loop {
            let error = match channel.connector.post(delivery, &uploads).await {
                Ok(receipt) => {
                    crate::host::failpoint::hit("after:delivery_sent");
                    break OutboxRecord::Receipt { intent, receipt };
                }
                Err(error) => error,
            };
            let (message, failure) = match &error {
                DeliveryError::RateLimited { retry_after } => (
                    String::new(),
                    AttemptFailure::RateLimited {
                        retry_after: *retry_after,
                    },
                ),
                DeliveryError::Rejected { message } => (message.clone(), AttemptFailure::Rejected),
                DeliveryError::Failed { message } => (message.clone(), AttemptFailure::Failed),
                DeliveryError::NotSent { message } => (message.clone(), AttemptFailure::NotSent),
            };
            let retry;
            (attempts, retry) = after_failure(attempts, failure, resends);
            match retry {
                Retry::After(wait) => {
                    match failure {
                        AttemptFailure::NotSent => tracing::warn!(
                            channel = %channel.loaded.config.name,
                            delivery = %delivery.id,
                            "delivery {} did not reach the platform ({message}); trying again in {} s",
                            delivery.id,
                            wait.as_secs()
                        ),
                        AttemptFailure::Failed => tracing::warn!(
                            channel = %channel.loaded.config.name,
                            delivery = %delivery.id,
                            "delivery {} failed ({message}); resending with the same id",
                            delivery.id
                        ),
                        AttemptFailure::RateLimited { .. } | AttemptFailure::Rejected => {}
                    }
                    if !wait.is_zero() {
                        tokio::select! {
                            () = self.shutdown.cancelled() => {
                                return Err(Unfinished::Stopping { unsent: vec![intent] });
                            }
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
                Retry::NotSent(because) => {
                    if because == NotSentBecause::Rejected && !uploads.is_empty() {
                        refused = Some(message.clone());
                    }
                    break OutboxRecord::Dropped {
                        intent,
                        reason: because.reason(&message),
                    };
                }
                Retry::Unknown => {
                    self.alerts.alert(
                        AlertKind::DeliveryUnknown,
                        format!(
                            "delivery {} to {} room {} has an unknown fate: {error}. It may or \
                             may not have been posted, and is not sent again; `perch status` \
                             lists it.",
                            delivery.id, channel.loaded.config.name, delivery.room
                        ),
                    );
                    break OutboxRecord::Unknown {
                        intent,
                        reason: error.to_string(),
                    };
                }
            }
        };
        let outcome = delivery_outcome(&record);
        let settled = record.settled();
        self.outbox
            .settle(intent, record)
            .await
            .map_err(|error| Unfinished::Write(error.to_string()))?;
        self.tell_lane(
            &channel.loaded.config.name.to_string(),
            delivery,
            lane.cloned(),
            settled,
        );
        if let Some(outcome) = outcome {
            self.metrics
                .delivered(&channel.loaded.config.name.to_string(), outcome);
        }
        Ok(refused)
    }
}

/// FIFOs keyed by room (or by lane, for the records waiting for each), each drained by at most
/// one worker. A room's entry exists exactly as
/// long as its worker: [`RoomQueues::push`] creates it (and says a worker must start), and
/// [`RoomQueues::next`] removes it, under the same lock, when it finds it empty, so nothing is
/// ever queued to a room without a worker, and nothing per room outlives its use.
pub(super) struct RoomQueues<T, K = RoomKey> {
    /// A std lock: held only to push, pop or remove, never across an await.
    rooms: std::sync::Mutex<HashMap<K, VecDeque<T>>>,
}

impl<T, K> Default for RoomQueues<T, K> {
    fn default() -> Self {
        RoomQueues {
            rooms: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

impl<T, K: Eq + std::hash::Hash + Clone> RoomQueues<T, K> {
    /// Queues `item` behind what `room` holds; `true` when the room had no worker, so the caller
    /// must start one (its entry exists from now on).
    pub(super) fn push(&self, room: &K, item: T) -> bool {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        match rooms.get_mut(room) {
            Some(queue) => {
                queue.push_back(item);
                false
            }
            None => {
                rooms.insert(room.clone(), VecDeque::from([item]));
                true
            }
        }
    }

    /// The next item of `room`, for its worker. `None` once the queue is empty: the room's entry
    /// is gone with it, and the worker must end.
    pub(super) fn next(&self, room: &K) -> Option<T> {
        let mut rooms = self.rooms.lock().unwrap_or_else(PoisonError::into_inner);
        let next = rooms.get_mut(room).and_then(VecDeque::pop_front);
        if next.is_none() {
            rooms.remove(room);
        }
        next
    }

    /// Removes `room` with everything still queued to it, for a worker that ends early.
    fn abandon(&self, room: &K) -> VecDeque<T> {
        self.rooms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(room)
            .unwrap_or_default()
    }

    /// How many rooms have a worker.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.rooms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// How a settled delivery is counted; an intent is not a settlement.
fn delivery_outcome(record: &OutboxRecord) -> Option<DeliveryOutcome> {
    match record {
        OutboxRecord::Receipt { .. } => Some(DeliveryOutcome::Receipt),
        OutboxRecord::Dropped { .. } => Some(DeliveryOutcome::Dropped),
        OutboxRecord::Unknown { .. } => Some(DeliveryOutcome::Unknown),
        OutboxRecord::Intent { .. } | OutboxRecord::Unsent { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(name: &str) -> RoomKey {
        ("tg".to_owned(), name.to_owned())
    }

    #[test]
    fn a_room_gets_a_worker_on_its_first_item_only_and_keeps_its_order() {
        let queues = RoomQueues::default();
        assert!(queues.push(&room("1"), "first"), "no worker yet: start one");
        assert!(
            !queues.push(&room("1"), "second"),
            "its worker takes this too"
        );
        assert!(
            queues.push(&room("2"), "elsewhere"),
            "another room, another worker"
        );
        assert_eq!(queues.next(&room("1")), Some("first"));
        assert_eq!(queues.next(&room("1")), Some("second"));
        assert_eq!(queues.len(), 2);
    }

    #[test]
    fn an_emptied_room_is_gone_with_its_worker_and_the_next_item_starts_another() {
        let queues = RoomQueues::default();
        assert!(queues.push(&room("1"), 1));
        assert_eq!(queues.next(&room("1")), Some(1));
        assert!(
            !queues.push(&room("1"), 2),
            "the worker has not found the queue empty yet, so it takes this"
        );
        assert_eq!(queues.next(&room("1")), Some(2));
        assert_eq!(queues.next(&room("1")), None);
        assert_eq!(queues.len(), 0, "nothing is left of the room");
        assert!(
            queues.push(&room("1"), 3),
            "the worker ended: start a new one"
        );
    }

    #[test]
    fn an_abandoned_room_gives_back_what_was_queued_and_is_gone() {
        let queues = RoomQueues::default();
        queues.push(&room("1"), 1);
        queues.push(&room("1"), 2);
        assert_eq!(queues.abandon(&room("1")), VecDeque::from([1, 2]));
        assert_eq!(queues.len(), 0);
        assert!(queues.push(&room("1"), 3));
    }

    #[test]
    fn many_rooms_come_and_go_without_leaving_entries() {
        let queues = RoomQueues::default();
        for n in 0..1000 {
            let key = room(&n.to_string());
            assert!(queues.push(&key, n));
            assert_eq!(queues.next(&key), Some(n));
            assert_eq!(queues.next(&key), None);
        }
        assert_eq!(queues.len(), 0);
    }
}
