//! Delivery: a reply formatted, split, recorded in the outbox, sent with its files, and settled;
//! after a restart, the deliveries a crash left unsettled.

use super::{Channel, Service};
use crate::channel::{Delivery, DeliveryError, InboundEvent, OutboundFile};
use crate::metrics::DeliveryOutcome;
use crate::outbox::{Outbox, OutboxRecord, Unsettled};
use perch_core::alert::AlertKind;
use perch_core::delivery::{
    AttemptFailure, Attempts, NotSentBecause, Retry, Unreceipted, after_failure, split_message,
};
use std::collections::VecDeque;

impl Service {
    /// Formats, splits and delivers a reply through the outbox.
    pub(super) async fn reply(
        &self,
        channel: &Channel,
        to: InboundEvent,
        text: String,
    ) -> Result<(), String> {
        self.post(
            channel,
            &to.room,
            to.thread.as_deref(),
            Some(&to.platform_id),
            text,
        )
        .await
        .map(drop)
    }

    /// Formats, splits and delivers `text` to `room` through the outbox, the first piece as a
    /// reply to `reply_to`; returns the deliveries' ids.
    pub(super) async fn post(
        &self,
        channel: &Channel,
        room: &str,
        thread: Option<&str>,
        reply_to: Option<&str>,
        text: String,
    ) -> Result<Vec<String>, String> {
        self.post_files(channel, room, thread, reply_to, text, Vec::new())
            .await
    }

    /// [`Service::post`] with workspace files, attached to the last piece. If the platform
    /// refuses that piece with its files, it is sent again without them, saying so.
    pub(super) async fn post_files(
        &self,
        channel: &Channel,
        room: &str,
        thread: Option<&str>,
        reply_to: Option<&str>,
        text: String,
        files: Vec<OutboundFile>,
    ) -> Result<Vec<String>, String> {
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
        let limits = channel.connector.limits();
        let mut pieces = split_message(&formatted, limits.max_chars);
        if pieces.is_empty() && !files.is_empty() {
            pieces.push(String::new());
        }
        let last = pieces.len().saturating_sub(1);
        let mut files = Some(files);
        let mut ids = Vec::new();
        let mut queue: VecDeque<(Option<String>, String, Vec<OutboundFile>)> = pieces
            .into_iter()
            .enumerate()
            .map(|(index, piece)| {
                let reply_to = reply_to.filter(|_| index == 0).map(str::to_owned);
                let attached = if index == last {
                    files.take().unwrap_or_default()
                } else {
                    Vec::new()
                };
                (reply_to, piece, attached)
            })
            .collect();
        while let Some((reply_to, text, attachments)) = queue.pop_front() {
            let delivery = Delivery {
                id: Outbox::new_id(),
                room: room.to_owned(),
                thread: thread.map(str::to_owned),
                reply_to,
                text,
                attachments,
            };
            ids.push(delivery.id.clone());
            let intent = self
                .outbox
                .intend(&channel.loaded.config.name.to_string(), &delivery)
                .await
                .map_err(|error| error.to_string())?;
            crate::failpoint::hit("after:delivery_intent");
            if let Some(reason) = self.send(channel, intent, &delivery).await? {
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
                let text = crate::attachments::with_notes(&delivery.text, &[note]);
                for (index, piece) in split_message(&text, limits.max_chars)
                    .into_iter()
                    .enumerate()
                {
                    let reply_to = delivery.reply_to.clone().filter(|_| index == 0);
                    queue.push_back((reply_to, piece, Vec::new()));
                }
            }
        }
        Ok(ids)
    }

    /// Sends one recorded delivery, with the workspace files it attaches, and settles it. Returns
    /// the platform's reason when it refused a delivery that carried files.
    pub(super) async fn send(
        &self,
        channel: &Channel,
        intent: u64,
        delivery: &Delivery,
    ) -> Result<Option<String>, String> {
        let (uploads, notes) = if delivery.attachments.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            crate::attachments::uploads(
                &self.runtime.agent().dir.workspace(),
                &delivery.attachments,
            )
            .await
        };
        let noted;
        let delivery = if notes.is_empty() {
            delivery
        } else {
            noted = Delivery {
                text: crate::attachments::with_notes(&delivery.text, &notes),
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
                    crate::failpoint::hit("after:delivery_sent");
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
                        tokio::time::sleep(wait).await;
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
                    self.alert(
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
        self.outbox
            .settle(intent, record)
            .await
            .map_err(|error| error.to_string())?;
        if let Some(outcome) = outcome {
            self.metrics
                .delivered(&channel.loaded.config.name.to_string(), outcome);
        }
        Ok(refused)
    }

    /// After a restart: resend inside the platform's window, report unknowns, drop the old.
    pub(super) async fn settle_outbox(
        &self,
        unsettled: Vec<Unsettled>,
    ) -> Result<serde_json::Value, String> {
        let (mut resent, mut unknown, mut expired) = (0, 0, 0);
        for delivery in unsettled {
            let Some(channel) = self.channels.get(&delivery.channel) else {
                continue;
            };
            let window = channel.connector.limits().resend_window;
            match self.outbox.decide(&delivery, window) {
                Unreceipted::Resend => {
                    resent += 1;
                    self.send(channel, delivery.seq, &delivery.delivery).await?;
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
                    self.outbox
                        .settle(
                            delivery.seq,
                            OutboxRecord::Unknown {
                                intent: delivery.seq,
                                reason,
                            },
                        )
                        .await
                        .map_err(|error| error.to_string())?;
                }
                Unreceipted::Expired => {
                    expired += 1;
                    self.metrics
                        .settled(&delivery.channel, DeliveryOutcome::Dropped);
                    self.outbox
                        .settle(
                            delivery.seq,
                            OutboxRecord::Dropped {
                                intent: delivery.seq,
                                reason: "older than the outbox's time to live".into(),
                            },
                        )
                        .await
                        .map_err(|error| error.to_string())?;
                }
            }
        }
        Ok(serde_json::json!({ "resent": resent, "unknown": unknown, "expired": expired }))
    }
}

/// How a settled delivery is counted; an intent is not a settlement.
fn delivery_outcome(record: &OutboxRecord) -> Option<DeliveryOutcome> {
    match record {
        OutboxRecord::Receipt { .. } => Some(DeliveryOutcome::Receipt),
        OutboxRecord::Dropped { .. } => Some(DeliveryOutcome::Dropped),
        OutboxRecord::Unknown { .. } => Some(DeliveryOutcome::Unknown),
        OutboxRecord::Intent { .. } => None,
    }
}
