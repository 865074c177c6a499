//! Posting: a reply formatted (by the channel's `format` hook), split to the platform's limit,
//! its files on the last piece, and handed to the deliveries' owner, which records every
//! piece's intent before it returns.

use super::super::channel::Channel;
use super::handle::{Deliveries, Posted};
use crate::channel::{Delivery, InboundEvent, OutboundFile};
use crate::store::outbox::{DeliveryLane, Outbox};
use perch_core::delivery::split_message;
use perch_core::heartbeat::Target;
use perch_core::log::Outcome;
use std::path::Path;
use std::sync::Arc;

/// Where a reply goes: its room and thread, and the message it answers.
pub(in crate::service) struct To<'a> {
    pub(in crate::service) room: &'a str,
    pub(in crate::service) thread: Option<&'a str>,
    pub(in crate::service) reply_to: Option<&'a str>,
}

impl<'a> To<'a> {
    /// A reply to `event`, in its room and thread.
    pub(in crate::service) fn event(event: &'a InboundEvent) -> To<'a> {
        To {
            room: &event.room,
            thread: event.thread.as_deref(),
            reply_to: Some(&event.platform_id),
        }
    }
}

/// A reply's text: as written, for the channel's `format` hook, or already formatted (by the
/// channel hooks' owner itself).
pub(in crate::service) enum Text {
    Written(String),
    Formatted(String),
}

impl Deliveries {
    /// Formats a written text with the channel's `format` hook (intake runs it, and keeps the
    /// text as written when the hook fails), splits it, records it and hands it to its room's
    /// worker; returns once every intent is fsynced.
    /// How each piece settles is appended to `lane`'s session log. If the platform refuses the
    /// last piece with its files, the worker sends it again without them, saying so.
    pub(in crate::service) async fn post(
        &self,
        channel: &Arc<Channel>,
        to: To<'_>,
        text: Text,
        files: Vec<OutboundFile>,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        let formatted = match text {
            Text::Formatted(formatted) => formatted,
            Text::Written(text) => {
                let name = channel.loaded.config.name.to_string();
                (self.format)(name.clone(), text.clone())
                    .await
                    .unwrap_or_else(|error| {
                        tracing::warn!(
                            channel = %name,
                            "the reply was not formatted ({error}); sending it as written"
                        );
                        text
                    })
            }
        };
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
                room: to.room.to_owned(),
                thread: to.thread.map(str::to_owned),
                reply_to: to.reply_to.filter(|_| index == 0).map(str::to_owned),
                text: piece,
                attachments: if index == last {
                    files.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
            })
            .collect();
        self.hand(channel, deliveries, lane).await
    }

    /// Answers `to` with how its run ended (see [`outcome_reply`]). Returns once the reply is
    /// recorded in the outbox and handed to its room's worker, not when it is sent. How it
    /// settles is appended to `lane`.
    pub(in crate::service) async fn deliver_outcome(
        &self,
        channel: &Arc<Channel>,
        to: &InboundEvent,
        outcome: &Outcome,
        text: &str,
        lane: DeliveryLane,
    ) -> Result<(), String> {
        let Some((reply, files)) = outcome_reply(&self.workspace, outcome, text) else {
            return Ok(());
        };
        crate::host::failpoint::hit("before:delivery_intent");
        self.post(
            channel,
            To::event(to),
            Text::Written(reply),
            files,
            Some(lane),
        )
        .await
        .map(drop)
    }

    /// Delivers a message to a heartbeat's or an alert's target room, through the outbox, and
    /// waits until it is settled; how it settled is appended to `lane` when there is one.
    pub(in crate::service) async fn post_to(
        &self,
        target: &Target,
        text: &str,
        lane: Option<DeliveryLane>,
    ) -> Result<String, String> {
        let channel = self
            .channels
            .get(target.channel.as_str())
            .ok_or_else(|| format!("the channel {} is not connected", target.channel))?;
        let room = channel
            .loaded
            .config
            .rooms
            .get(&target.room)
            .ok_or_else(|| format!("{} declares no room {}", target.channel, target.room))?
            .clone();
        let to = To {
            room: &room,
            thread: target.thread.as_deref(),
            reply_to: None,
        };
        let ids = self
            .post(
                channel,
                to,
                Text::Written(text.to_owned()),
                Vec::new(),
                lane,
            )
            .await?
            .settled()
            .await?;
        Ok(ids.join(","))
    }
}

/// What a chat is told of how its run ended: the reply (and its files, checked under
/// `workspace`) when it completed, a short apology when it failed or was interrupted (the
/// reason is logged, never posted), nothing when cancelled or when the reply is empty.
pub(in crate::service) fn outcome_reply(
    workspace: &Path,
    outcome: &Outcome,
    text: &str,
) -> Option<(String, Vec<OutboundFile>)> {
    let (reply, files) = match outcome {
        Outcome::Completed => crate::tools::attachments::reply_files(workspace, text),
        Outcome::Cancelled => (String::new(), Vec::new()),
        // The reason can quote the provider (organisation and project ids, e-mail
        // addresses): it stays in the log and the lane.
        Outcome::Failed { reason } if reason.starts_with(SPEND_CAP_REASON) => (
            format!("Sorry, I could not finish that: {reason}"),
            Vec::new(),
        ),
        Outcome::Failed { .. } => (FAILED_REPLY.to_owned(), Vec::new()),
        Outcome::Interrupted { .. } => (INTERRUPTED_REPLY.to_owned(), Vec::new()),
    };
    (!reply.trim().is_empty() || !files.is_empty()).then_some((reply, files))
}

/// What a chat is told when a run failed; the reason goes to the log and the lane only.
const FAILED_REPLY: &str = "Sorry, I could not finish that: something went wrong on my side. My \
                            owner can find the details in perch's log.";

/// How the spend guard's own refusal starts: perch's words, which the chat is told.
const SPEND_CAP_REASON: &str = "the daily spend cap";

/// What a chat is told when a run was interrupted (perch stopped or crashed during it).
const INTERRUPTED_REPLY: &str = "Sorry, I could not finish that: I was interrupted. Please ask \
                                 again.";
