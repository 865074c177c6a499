//! A room's worker: sends what its room's queue holds, in order, and settles each delivery,
//! carrying out [`after_failure`], the retry policy; and a lane's writer, appending the records
//! waiting for it. Each ends when its queue is empty.

use super::super::Common;
use super::super::channel::Channel;
use super::super::lanes::LaneWriter;
use super::handle::{Deliveries, Handed, Recorded, RoomKey};
use crate::channel::{Delivery, DeliveryError};
use crate::host::metrics::DeliveryOutcome;
use crate::store::outbox::{DeliveryLane, Outbox, OutboxRecord};
use perch_core::alert::AlertKind;
use perch_core::delivery::{
    AttemptFailure, Attempts, NotSentBecause, Retry, after_failure, split_message,
};
use perch_core::name::LaneName;
use perch_core::narration::Event;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

/// What every room's worker shares.
pub(super) struct Workers {
    /// Where each worker takes its room's next reply from, and tells lanes.
    pub(super) deliveries: Deliveries,
    pub(super) outbox: Outbox,
    /// Where the files a delivery attaches are read from.
    pub(super) workspace: PathBuf,
    /// Its `shutdown` cuts a retry's wait short: the delivery is left unsettled for the next
    /// start.
    pub(super) common: Common,
}

/// Why a worker stopped delivering a reply before every piece was settled.
enum Unfinished {
    /// An outbox write failed.
    Write(String),
    /// perch is stopping, and a retry would have had to wait: the intents of the piece that
    /// waited (unless an earlier attempt at it may have posted it) and of the reply's pieces
    /// after it, none of them sent.
    Stopping { unsent: Vec<u64> },
}

/// Writes what waits for `lane`, in order, until nothing does.
pub(super) async fn write_records(deliveries: Deliveries, writer: LaneWriter, lane: LaneName) {
    while let Some(record) = deliveries.next_record(lane.clone()).await {
        if let Err(error) = writer.append(&lane, record).await {
            tracing::warn!(lane = %lane, "a record was not appended to lane {lane}: {error}");
        }
    }
}

impl Workers {
    /// One room's worker: delivers what its queue holds, in order, and ends (its entry removed)
    /// when the queue is empty.
    pub(super) async fn work(self: Arc<Self>, key: RoomKey) {
        loop {
            let Some(next) = self.deliveries.next(key.clone()).await else {
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
                    for left in self.deliveries.abandon(key.clone()).await {
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
        // Whether the outbox says an attempt at it has begun since it was last known not posted.
        let mut marked = false;
        let record = loop {
            if !marked {
                self.outbox
                    .sending(intent)
                    .await
                    .map_err(|error| Unfinished::Write(error.to_string()))?;
                crate::host::failpoint::hit("after:delivery_sending");
                marked = true;
            }
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
                    if attempts.certainly_not_posted() && !wait.is_zero() {
                        // A restart during the wait sends it then, on any platform.
                        self.outbox
                            .unsent(
                                vec![intent],
                                "the platform did not take it; waiting to try again",
                            )
                            .await
                            .map_err(|error| Unfinished::Write(error.to_string()))?;
                        marked = false;
                    }
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
                            () = self.common.shutdown.cancelled() => {
                                // An earlier attempt that may have posted it keeps it unsettled
                                // for the resend window, never marked unsent.
                                let unsent = if attempts.certainly_not_posted() {
                                    vec![intent]
                                } else {
                                    Vec::new()
                                };
                                return Err(Unfinished::Stopping { unsent });
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
                    self.common.alerts.alert(
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
        let narrated = narration(&channel.loaded.config.name.to_string(), delivery, &record);
        let settled = record.settled();
        self.outbox
            .settle(intent, record)
            .await
            .map_err(|error| Unfinished::Write(error.to_string()))?;
        self.deliveries.tell_lane(
            &channel.loaded.config.name.to_string(),
            delivery,
            lane.cloned(),
            settled,
        );
        if let Some(outcome) = outcome {
            self.common
                .metrics
                .delivered(&channel.loaded.config.name.to_string(), outcome);
        }
        if let Some(event) = narrated {
            crate::host::narrate::tell(&event);
        }
        Ok(refused)
    }
}

/// What the operator is told of a settled delivery.
fn narration(channel: &str, delivery: &Delivery, record: &OutboxRecord) -> Option<Event> {
    let (channel, room) = (channel.to_owned(), delivery.room.clone());
    match record {
        OutboxRecord::Receipt { .. } => Some(Event::Delivered { channel, room }),
        OutboxRecord::Dropped { reason, .. } => Some(Event::NotDelivered {
            channel,
            room,
            reason: reason.clone(),
        }),
        OutboxRecord::Unknown { reason, .. } => Some(Event::DeliveryUnknown {
            channel,
            room,
            reason: reason.clone(),
        }),
        OutboxRecord::Intent { .. }
        | OutboxRecord::Sending { .. }
        | OutboxRecord::Unsent { .. } => None,
    }
}

/// How a settled delivery is counted; an intent is not a settlement.
fn delivery_outcome(record: &OutboxRecord) -> Option<DeliveryOutcome> {
    match record {
        OutboxRecord::Receipt { .. } => Some(DeliveryOutcome::Receipt),
        OutboxRecord::Dropped { .. } => Some(DeliveryOutcome::Dropped),
        OutboxRecord::Unknown { .. } => Some(DeliveryOutcome::Unknown),
        OutboxRecord::Intent { .. }
        | OutboxRecord::Sending { .. }
        | OutboxRecord::Unsent { .. } => None,
    }
}
