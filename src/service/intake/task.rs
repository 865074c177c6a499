//! Intake's task: an arrival journaled and acknowledged, admitted, handed to the channel's
//! hook, and decided; chat commands and pairing offers are answered here. Nothing here waits
//! for a platform: a reply is recorded in the outbox and handed to its room's delivery worker,
//! and the event is consumed once that record is fsynced.

use super::super::Common;
use super::super::channel::{Channel, Channels};
use super::super::conversations::Conversations;
use super::super::deliveries::{Deliveries, Posted, Text, To};
use super::super::earlier_lanes;
use super::handle::Request;
use crate::agent::AgentDir;
use crate::channel::hooks::{ChannelHooks, HookVerdict};
use crate::channel::{Arrival, InboundEvent};
use crate::store::generations;
use crate::store::inbox::{Disposition, Inbox, PendingItem, Recorded};
use crate::store::outbox::{DeliveryLane, Outbox};
use crate::store::pairing::{
    APPROVED_NOTICE, no_pending_pairing, no_pending_request, not_approved, write_pairing,
};
use perch_core::admission::{Admission, Arrived, Gate, admit};
use perch_core::alert::AlertKind;
use perch_core::chat::{BotTurns, ChatCommand};
use perch_core::config::ChannelConfig;
use perch_core::control::{PairApproved, PairListed, PairSender};
use perch_core::group_context::GroupContext;
use perch_core::name::LaneName;
use perch_core::narration::{Event, PairingDecision, Refusal};
use perch_core::pairing::{Approval, Approved, Issued, Pairing, Who, pairing_code};
use perch_core::terminal;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Intake's task and everything it owns. It is serial (one arrival, then one request, at a
/// time), so its state needs no lock.
///
/// Who settles an inbox item: this task, for every event that needs no run (its disposition and
/// the event consumed together), and, after a restart, for items a run already answered; the
/// conversation that answers an item consumes it once its reply is recorded (or once it was
/// steered into a run, or answered with the overflow notice). The inbox's writer is one thread
/// that serialises every record; [`Inbox`] is a handle to it, cloned here and into the
/// conversations, so no two records ever interleave within a line and each is fsynced in order.
pub(super) struct IntakeTask {
    pub(super) requests: mpsc::UnboundedReceiver<Request>,
    pub(super) arrivals: mpsc::Receiver<(String, Arrival)>,
    pub(super) channels: Channels,
    /// Each channel's hooks (the channel file's Lua state and store): only this task calls
    /// them, one call at a time, in arrival order; other tasks ask it to format their replies.
    pub(super) hooks: HashMap<String, ChannelHooks>,
    /// Pending pairing codes and approved senders, written to `pairing.json` on each change.
    pub(super) pairing: Pairing,
    pub(super) pairing_path: PathBuf,
    /// The last group messages per (channel, room) that did not address the agent, offered to
    /// the model with the next message that does; bounded in rooms and age.
    pub(super) context: GroupContext,
    /// Bot messages answered per (channel, room) since the last human one, for the loop guard;
    /// rebuilt from the inbox at start; bounded in rooms.
    pub(super) bot_turns: BotTurns,
    pub(super) inbox: Inbox,
    pub(super) outbox: Outbox,
    pub(super) conversations: Conversations,
    pub(super) deliveries: Deliveries,
    pub(super) dir: AgentDir,
    /// Its `shutdown` stops the taking of arrivals; its `closing` ends the task, once the
    /// service has drained (replies are formatted until then).
    pub(super) common: Common,
}

/// Whether an event about to be decided is still owed its reply (a chat command's, a pairing
/// offer): after a restart, an event decided again may have had its reply recorded before the
/// crash, and then its command is not carried out again nor its reply sent twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    Due,
    /// The outbox holds a reply to it: deliver that one (the outbox does), do nothing again.
    Recorded,
}

impl IntakeTask {
    /// Takes arrivals until shutdown and answers requests until closing.
    pub(super) async fn run(mut self) {
        self.update_gates();
        self.tell_those_approved_while_stopped().await;
        let mut receiving = true;
        loop {
            tokio::select! {
                biased;
                () = self.common.closing.cancelled() => return,
                request = self.requests.recv() => match request {
                    Some(request) => self.answer(request).await,
                    None => return,
                },
                () = self.common.shutdown.cancelled(), if receiving => receiving = false,
                arrival = self.arrivals.recv(), if receiving => match arrival {
                    Some((channel, arrival)) => {
                        if let Err(error) = self.arrive(&channel, arrival).await {
                            tracing::error!(channel = %channel, "an arrival on {channel} failed: {error}");
                            self.common.alerts.alert(
                                AlertKind::Intake,
                                format!("a message on channel {channel} could not be taken in: {error}"),
                            );
                        }
                    }
                    None => receiving = false,
                },
            }
        }
    }

    async fn answer(&mut self, request: Request) {
        match request {
            Request::Format {
                channel,
                text,
                reply,
            } => {
                let _ = reply.send(Ok(self.format(&channel, text).await));
            }
            Request::Approve { who, reply } => {
                let _ = reply.send(self.approve(&who).await);
            }
            Request::Deny { who, reply } => {
                let _ = reply.send(self.deny(&who));
            }
            Request::Revoke {
                channel,
                sender,
                reply,
            } => {
                let _ = reply.send(self.revoke(&channel, &sender));
            }
            Request::PairList { reply } => {
                self.pairing.expire(self.common.clock.now());
                let _ = reply.send(PairListed {
                    pending: self.pairing.pending.clone(),
                    approved: self.pairing.approved.clone(),
                });
            }
            Request::PairingsPending { reply } => {
                let _ = reply.send(self.pairing.pending.len());
            }
            Request::Recover {
                backlog,
                replied_to,
                reply,
            } => {
                let _ = reply.send(self.resume_inbox(*backlog, &replied_to).await);
            }
        }
    }

    /// `text` as `channel`'s `format` hook makes it, or as written when the hook fails.
    pub(super) async fn format(&mut self, channel: &str, text: String) -> String {
        let Some(hooks) = self.hooks.get_mut(channel) else {
            return text;
        };
        hooks.run_format(&text).await.unwrap_or_else(|error| {
            tracing::warn!(
                channel = %channel,
                "format hook failed, sending the reply as written: {error}"
            );
            text
        })
    }

    /// Formats, splits and records a reply to `to` in the outbox, and hands it to its room's
    /// worker; returns once every intent is fsynced.
    pub(super) async fn reply(
        &mut self,
        channel: &Arc<Channel>,
        to: &InboundEvent,
        text: String,
        lane: Option<DeliveryLane>,
    ) -> Result<Posted, String> {
        let formatted = self
            .format(&channel.loaded.config.name.to_string(), text)
            .await;
        self.deliveries
            .post(
                channel,
                To::event(to),
                Text::Formatted(formatted),
                Vec::new(),
                lane,
            )
            .await
    }

    /// Approves whom `who` names, durably, tells the connectors, and tells the person in their
    /// direct messages, through the outbox, when their request said where.
    async fn approve(&mut self, who: &Who) -> Result<PairApproved, String> {
        if let Who::Sender { channel, .. } = who {
            self.loaded_channel(channel)?;
        }
        let before = self.pairing.clone();
        let approved = match self.pairing.approve(who, self.common.clock.now()) {
            Approval::Approved(approved) => approved,
            Approval::Unknown => {
                let code = match who {
                    Who::Code { code } => terminal::shown(code),
                    Who::Sender { .. } => String::new(),
                };
                return Err(no_pending_pairing(&code));
            }
        };
        if let Err(error) = write_pairing(&self.pairing_path, &self.pairing) {
            self.pairing = before;
            return Err(error);
        }
        self.update_gates();
        let told = self.tell_approved(&approved).await;
        crate::host::narrate::tell(&Event::PairingDecided {
            channel: approved.channel.clone(),
            sender: approved.sender.clone(),
            name: approved.name.clone(),
            decision: if told {
                PairingDecision::ApprovedTold
            } else {
                PairingDecision::ApprovedUntold
            },
        });
        Ok(PairApproved {
            channel: approved.channel,
            sender: approved.sender,
            name: approved.name,
            told,
        })
    }

    /// Tells the senders `perch pair approve` let in while perch was not running. Their marks
    /// are cleared in `pairing.json` before the notices are recorded, so a crash in between
    /// leaves one untold rather than told twice.
    async fn tell_those_approved_while_stopped(&mut self) {
        let before = self.pairing.clone();
        let due = self.pairing.take_notices_due();
        if due.is_empty() {
            return;
        }
        if let Err(error) = write_pairing(&self.pairing_path, &self.pairing) {
            self.pairing = before;
            tracing::warn!(
                "the senders approved while perch was stopped are not told yet: {error}"
            );
            return;
        }
        for approved in &due {
            if self.tell_approved(approved).await {
                crate::host::narrate::tell(&Event::PairingDecided {
                    channel: approved.channel.clone(),
                    sender: approved.sender.clone(),
                    name: approved.name.clone(),
                    decision: PairingDecision::ApprovedTold,
                });
            }
        }
    }

    /// Records the notice telling `approved` they are in, in the room of their request; whether
    /// it was recorded.
    async fn tell_approved(&mut self, approved: &Approved) -> bool {
        let (Some(channel), Some(room)) = (
            self.channels.get(&approved.channel).cloned(),
            approved.room.as_deref(),
        ) else {
            return false;
        };
        let formatted = self
            .format(&approved.channel, APPROVED_NOTICE.to_owned())
            .await;
        let to = To {
            room,
            thread: None,
            reply_to: None,
        };
        match self
            .deliveries
            .post(&channel, to, Text::Formatted(formatted), Vec::new(), None)
            .await
        {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(
                    channel = %approved.channel,
                    "{} was approved, but the notice telling them could not be recorded: {error}",
                    terminal::shown(&approved.sender)
                );
                false
            }
        }
    }

    /// Drops the pending request `who` names, durably.
    fn deny(&mut self, who: &Who) -> Result<PairSender, String> {
        let before = self.pairing.clone();
        let Some(denied) = self.pairing.deny(who, self.common.clock.now()) else {
            self.pairing = before;
            return Err(no_pending_request(who));
        };
        if let Err(error) = write_pairing(&self.pairing_path, &self.pairing) {
            self.pairing = before;
            return Err(error);
        }
        crate::host::narrate::tell(&Event::PairingDecided {
            channel: denied.channel.clone(),
            sender: denied.sender.clone(),
            name: denied.name.clone(),
            decision: PairingDecision::Denied,
        });
        Ok(PairSender {
            channel: denied.channel,
            sender: denied.sender,
            name: denied.name,
        })
    }

    /// Removes an approved sender, durably, and tells the connectors.
    fn revoke(&mut self, channel: &str, sender: &str) -> Result<PairSender, String> {
        let before = self.pairing.clone();
        let Some(revoked) = self.pairing.revoke(channel, sender) else {
            return Err(not_approved(channel, sender));
        };
        if let Err(error) = write_pairing(&self.pairing_path, &self.pairing) {
            self.pairing = before;
            return Err(error);
        }
        self.update_gates();
        crate::host::narrate::tell(&Event::PairingDecided {
            channel: revoked.channel.clone(),
            sender: revoked.sender.clone(),
            name: revoked.name.clone(),
            decision: PairingDecision::Revoked,
        });
        Ok(PairSender {
            channel: revoked.channel,
            sender: revoked.sender,
            name: revoked.name,
        })
    }

    /// Refuses a channel this service did not load: a sender approved on it could never talk.
    fn loaded_channel(&self, channel: &str) -> Result<(), String> {
        if self.channels.get(channel).is_some() {
            return Ok(());
        }
        let mut loaded: Vec<&str> = self.channels.keys().map(String::as_str).collect();
        loaded.sort_unstable();
        Err(format!(
            "no channel {} is loaded (channels: {})",
            terminal::shown(channel),
            if loaded.is_empty() {
                "none".to_owned()
            } else {
                loaded.join(", ")
            }
        ))
    }

    /// Journals the event, acknowledges it, and decides what it is.
    pub(super) async fn arrive(&mut self, channel: &str, arrival: Arrival) -> Result<(), String> {
        let Arrival { event, journaled } = arrival;
        let recorded = self
            .inbox
            .record_event(channel, &event)
            .await
            .map_err(|error| error.to_string())?;
        crate::host::failpoint::hit("after:inbox_journaled");
        let _ = journaled.send(());
        if let Recorded::New { seq } = recorded {
            self.common.metrics.event_in(channel);
            crate::host::narrate::tell(&Event::Received {
                channel: channel.to_owned(),
                room: event.room.clone(),
                sender: event.sender.id.clone(),
            });
            self.decide(seq, channel, event, Reply::Due).await?;
        }
        Ok(())
    }

    pub(super) async fn decide(
        &mut self,
        seq: u64,
        channel: &str,
        event: InboundEvent,
        reply: Reply,
    ) -> Result<(), String> {
        let Some(connected) = self.channels.get(channel).cloned() else {
            return self
                .settle(
                    seq,
                    Disposition::Refused {
                        reason: format!("no channel {channel}"),
                    },
                )
                .await;
        };
        if event.edit_of.is_some() {
            return self.settle(seq, Disposition::Edited).await;
        }
        let config = &connected.loaded.config;
        let arrived = Arrived {
            sender: &event.sender.id,
            sender_is_bot: event.sender.is_bot,
            direct: event.direct,
            addressed: event.addressed,
            room: &event.room,
            sent_at: event.sent_at,
            refused: event.refused.as_deref(),
        };
        let bot_turns = self.bot_turns.in_room(channel, &event.room);
        let admission = admit(
            config,
            &arrived,
            self.common.clock.now(),
            |sender| self.pairing.is_approved(channel, sender),
            bot_turns,
        );
        if let Some(refusal) = Refusal::of(&admission, event.direct)
            && refusal != Refusal::AwaitingPairing
        {
            let reason = match &admission {
                Admission::Refused { reason } => reason.as_str(),
                _ => "",
            };
            self.narrate_refusal(&connected, &event, refusal, reason);
        }
        let mut deciding = None;
        let command = perch_core::chat::command_for_me(&event.text, event.addressed);
        let disposition = match (admission, command) {
            (Admission::Answer, Some(command)) => {
                if reply == Reply::Due {
                    self.command(&connected, &event, command).await?;
                }
                Disposition::Command {
                    command: command.as_str().to_owned(),
                }
            }
            (Admission::Answer, None) => {
                let message = crate::channel::hooks::message_input(config, &event);
                if config.on_message.is_some() {
                    let mark = self
                        .inbox
                        .record_deciding(seq, &connected.loaded.file)
                        .await
                        .map_err(|error| error.to_string())?;
                    deciding = Some(mark);
                    crate::host::failpoint::hit("during:on_message");
                }
                let verdict = match self.hooks.get_mut(channel) {
                    Some(hooks) => hooks.run_on_message(&message).await,
                    None => HookVerdict::Error(format!("no hooks for channel {channel}")),
                };
                match &verdict {
                    HookVerdict::Error(error) => {
                        tracing::warn!(channel, "channel {channel}: on_message failed: {error}");
                        connected.hook_result(Some(error));
                    }
                    HookVerdict::Item(_) | HookVerdict::Drop => connected.hook_result(None),
                }
                match verdict {
                    HookVerdict::Item(item) => {
                        let lane = match item.lane {
                            Some(lane) => Ok(lane),
                            None => self.conversation_lane(config, &event),
                        };
                        match lane {
                            Ok(lane) => Disposition::Item {
                                lane: lane.to_string(),
                                text: item.text,
                            },
                            Err(reason) => Disposition::Error { reason },
                        }
                    }
                    HookVerdict::Drop => Disposition::Dropped,
                    HookVerdict::Error(reason) => Disposition::Error { reason },
                }
            }
            (Admission::Context, _) => {
                self.context.push(
                    channel,
                    &event.room,
                    context_line(&event),
                    self.common.clock.now(),
                );
                Disposition::Context
            }
            (Admission::Stale, _) => Disposition::Stale,
            (Admission::Pair, _) if reply == Reply::Recorded => Disposition::Refused {
                reason: "unknown sender in a direct message; pairing offered".into(),
            },
            (Admission::Pair, _) => match self.offer_pairing(&connected, &event).await {
                Ok(()) => Disposition::Refused {
                    reason: "unknown sender in a direct message; pairing offered".into(),
                },
                Err(error) => {
                    self.common.alerts.alert(
                        AlertKind::Intake,
                        format!(
                            "a pairing code for {} on channel {channel} could not be recorded, so none was offered: {error}",
                            terminal::shown(&event.sender.id)
                        ),
                    );
                    Disposition::Refused {
                        reason: format!(
                            "unknown sender in a direct message; pairing could not be offered: {error}"
                        ),
                    }
                }
            },
            (Admission::Refused { reason }, _) => Disposition::Refused { reason },
        };
        self.bot_turns.note(
            channel,
            &event.room,
            event.sender.is_bot,
            disposition.admitted(),
        );
        let Disposition::Item { lane, text } = disposition.clone() else {
            self.settle(seq, disposition).await?;
            return self.consume_marks(deciding).await;
        };
        let earlier = self
            .context
            .take(channel, &event.room, self.common.clock.now());
        let disposition_seq = self
            .inbox
            .record_disposition(seq, disposition)
            .await
            .map_err(|error| error.to_string())?;
        self.consume_marks(deciding).await?;
        self.conversations.dispatch(PendingItem {
            event_seq: seq,
            disposition_seq,
            channel: channel.to_owned(),
            event,
            lane,
            text,
            earlier,
            resume: None,
        })
    }

    /// The lane of the conversation `event` belongs to, in its current generation (`/new`
    /// starts the next one).
    fn conversation_lane(
        &self,
        config: &ChannelConfig,
        event: &InboundEvent,
    ) -> Result<LaneName, String> {
        let base = self.first_lane(config, event)?;
        let generation = generations::current(&self.dir, &base)?;
        generations::lane(base, generation)
    }

    /// The first lane of the conversation `event` belongs to (before any `/new`).
    fn first_lane(&self, config: &ChannelConfig, event: &InboundEvent) -> Result<LaneName, String> {
        let thread = config.threads.conversation_thread(event.thread.as_deref());
        earlier_lanes::first_lane(&self.dir, config, &event.room, thread)
    }

    /// `/stop` aborts this conversation's run, `/new` starts a fresh conversation, `/status` says
    /// how perch is doing.
    async fn command(
        &mut self,
        channel: &Arc<Channel>,
        event: &InboundEvent,
        command: ChatCommand,
    ) -> Result<(), String> {
        let config = &channel.loaded.config;
        let reply = match command {
            ChatCommand::Stop => {
                let stopped = match self.conversation_lane(config, event) {
                    Ok(lane) => self.conversations.stop(lane).await,
                    Err(_) => false,
                };
                if stopped {
                    "Stopped."
                } else {
                    "Nothing is running here."
                }
                .to_owned()
            }
            ChatCommand::New => {
                let base = self.first_lane(config, event)?;
                generations::advance(&self.dir, &base)?;
                "Starting a new conversation: I will not see the earlier messages here.".to_owned()
            }
            // The /status event itself is journaled and not yet consumed; it is not waiting.
            ChatCommand::Status => format!(
                "perch is running: {} channel(s), {} inbox item(s) waiting, {} deliveries waiting.",
                self.channels.len(),
                self.inbox.depth().await.saturating_sub(1),
                self.outbox.depth().await
            ),
        };
        let lane = self
            .conversation_lane(config, event)
            .ok()
            .map(|lane| DeliveryLane::new(lane, None));
        self.reply(channel, event, reply, lane).await.map(drop)
    }

    /// Hands each channel's connector its [`Gate`]: the channel's allowlists and the senders
    /// pairing approved on it. At start, and after every approval.
    fn update_gates(&self) {
        for (name, channel) in self.channels.iter() {
            let approved = self
                .pairing
                .approved
                .iter()
                .filter(|approved| &approved.channel == name)
                .map(|approved| approved.sender.clone());
            channel
                .connector
                .gate(Gate::new(&channel.loaded.config, approved));
        }
    }

    /// Lists an unknown sender's request and gives them a code to pass to the owner (once
    /// while it is pending), or, when the channel's list is full, their id.
    async fn offer_pairing(
        &mut self,
        channel: &Arc<Channel>,
        event: &InboundEvent,
    ) -> Result<(), String> {
        let code = pairing_code(random_bytes());
        let before = self.pairing.clone();
        let channel_name = channel.loaded.config.name.to_string();
        let issued = self.pairing.issue(
            &channel_name,
            &event.sender.id,
            &event.sender.name,
            &event.room,
            code,
            self.common.clock.now(),
        );
        if issued != Issued::Pending
            && let Err(error) = write_pairing(&self.pairing_path, &self.pairing)
        {
            // A request that is not on disk could never be approved: offer none.
            self.pairing = before;
            return Err(error);
        }
        match &issued {
            Issued::New(code) | Issued::Busy { code, .. } => {
                crate::host::narrate::tell(&Event::Pairing {
                    channel: channel_name.clone(),
                    sender: event.sender.id.clone(),
                    name: event.sender.name.clone(),
                    code: code.clone(),
                });
            }
            Issued::Pending | Issued::BusyTold => {
                self.narrate_refusal(channel, event, Refusal::AwaitingPairing, "");
            }
        }
        let id = format!("{channel_name}:{}", event.sender.id);
        let text = match issued {
            Issued::New(code) => format!(
                "I do not know you yet. If you should be able to talk to me, ask my owner to run \
                 `perch pair approve {code}` within the hour (or to approve your id, {id})."
            ),
            Issued::Busy { dropped, .. } => {
                tracing::warn!(
                    channel = %channel_name,
                    "channel {channel_name}: the pairing list is full; the request of {} ({}) \
                     was dropped for that of {} ({})",
                    terminal::shown(&dropped.name),
                    terminal::shown(&dropped.sender),
                    terminal::shown(&event.sender.name),
                    terminal::shown(&event.sender.id)
                );
                self.common.alerts.alert(
                    AlertKind::PairingFull,
                    format!(
                        "channel {channel_name} has {} pairing requests pending, so each new one \
                         drops the oldest; `perch pair list` shows them, and `perch pair approve \
                         CHANNEL:USER_ID` lets in a person you know, with or without a request.",
                        perch_core::pairing::MAX_PENDING_PER_CHANNEL
                    ),
                );
                format!(
                    "I do not know you yet, and pairing is busy right now: many people are \
                     waiting for my owner. If you should be able to talk to me, give my owner \
                     your id, {id}: they can let you in with `perch pair approve {id}`."
                )
            }
            Issued::Pending | Issued::BusyTold => return Ok(()),
        };
        self.reply(channel, event, text, None).await.map(drop)
    }

    /// Tells the operator that `event` was refused, and why, as the narration's limiter lets it.
    fn narrate_refusal(
        &self,
        channel: &Channel,
        event: &InboundEvent,
        refusal: Refusal,
        reason: &str,
    ) {
        let refused = Event::Refused {
            channel: channel.loaded.config.name.to_string(),
            file: channel.loaded.file.clone(),
            room: event.room.clone(),
            sender: event.sender.id.clone(),
            refusal,
            reason: reason.to_owned(),
        };
        crate::host::narrate::refused(&refused, self.common.clock.now());
    }

    /// Journals a disposition that needs no run, and consumes the event with it.
    pub(super) async fn settle(&self, seq: u64, disposition: Disposition) -> Result<(), String> {
        let disposition_seq = self
            .inbox
            .record_disposition(seq, disposition)
            .await
            .map_err(|error| error.to_string())?;
        self.inbox
            .consume(vec![seq, disposition_seq])
            .await
            .map_err(|error| error.to_string())
    }

    /// Consumes deciding marks once their event's disposition is journaled.
    pub(super) async fn consume_marks(
        &self,
        marks: impl IntoIterator<Item = u64>,
    ) -> Result<(), String> {
        let marks: Vec<u64> = marks.into_iter().collect();
        if marks.is_empty() {
            return Ok(());
        }
        self.inbox
            .consume(marks)
            .await
            .map_err(|error| error.to_string())
    }
}

/// How a group message that did not address the agent is offered as context: its sender (name
/// and id, made safe) and text, and the names of its files, which are not saved.
pub(super) fn context_line(event: &InboundEvent) -> String {
    let sender = perch_core::origin::Person {
        id: event.sender.id.clone(),
        name: event.sender.name.clone(),
    };
    let files = if event.attachments.is_empty() {
        Vec::new()
    } else {
        perch_core::attachment::saved_names(&event.attachments)
    };
    perch_core::origin::context_line(&sender, &event.text, &files)
}

fn random_bytes() -> [u8; 6] {
    let random = uuid::Uuid::new_v4();
    let bytes = random.as_bytes();
    [bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5]]
}
