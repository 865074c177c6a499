//! A conversation's effects, as its task carries out its machine's actions: its lane held in
//! the pool, its runs (the reply delivered, the items consumed), steers and overflow notices.

use super::super::channel::Channel;
use super::super::deliveries::{Text, To};
use super::super::lanes::LaneLease;
use super::context::Context;
use super::converse::Talk;
use super::handle::Conversations;
use crate::channel::{BoxFuture, InboundEvent};
use crate::lane::{Input, Lane, Said, Steered};
use crate::store::inbox::PendingItem;
use crate::store::outbox::DeliveryLane;
use perch_core::config::ChannelConfig;
use perch_core::converse::{OVERFLOW_NOTICE, Queued};
use perch_core::log::{Outcome, Trigger};
use perch_core::name::LaneName;
use perch_core::narration::Event;
use perch_core::origin::{MessageOrigin, Person, Quoted};
use perch_core::prompt::Origin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One conversation's effects.
pub(super) struct ConversationTalk {
    pub(super) context: Arc<Context>,
    pub(super) conversations: Conversations,
    pub(super) name: LaneName,
    pub(super) origin: Origin,
    pub(super) channel: Arc<Channel>,
}

impl Queued for PendingItem {
    fn resumes(&self) -> bool {
        self.resume.is_some()
    }
}

impl Talk for ConversationTalk {
    type Item = PendingItem;
    type Lease = LaneLease;
    type Slot = OwnedSemaphorePermit;

    fn join(&self) -> Option<LaneLease> {
        self.context.pool.join(&self.name)
    }

    fn turn(&self) -> BoxFuture<'_, OwnedSemaphorePermit> {
        Box::pin(self.context.pool.turn())
    }

    fn hold(&self, slot: OwnedSemaphorePermit) -> BoxFuture<'_, Result<LaneLease, String>> {
        Box::pin(self.context.pool.hold(&self.name, slot, || {
            self.context
                .open_lane(&self.name, self.origin.clone(), None)
        }))
    }

    fn run(&self, lease: &LaneLease, batch: Vec<PendingItem>, resume: bool) -> JoinHandle<()> {
        let context = Arc::clone(&self.context);
        let lane: Lane = (**lease).clone();
        let channel = Arc::clone(&self.channel);
        let (lane_name, channel_name) = (self.name.to_string(), self.origin.channel.clone());
        self.context.common.tasks.spawn(async move {
            if let Err(error) = answer(&context, &lane, &channel, batch, resume).await {
                tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
            }
        })
    }

    fn steer<'a>(
        &'a self,
        lease: &'a LaneLease,
        item: PendingItem,
    ) -> BoxFuture<'a, Result<Option<PendingItem>, String>> {
        Box::pin(async move {
            let said = Said {
                origin: origin_of(&self.channel.loaded.config, &item),
                text: item_text(&self.context, &self.channel, &item).await,
            };
            if !matches!(lease.steer_said(said).await, Ok(Steered::Delivered)) {
                return Ok(Some(item));
            }
            self.context
                .inbox
                .consume(vec![item.event_seq, item.disposition_seq])
                .await
                .map_err(|error| error.to_string())?;
            Ok(None)
        })
    }

    fn abort(&self, lease: Option<&LaneLease>) {
        let open = match lease {
            Some(lane) => Some((**lane).clone()),
            None => self.context.pool.open_lane(&self.name),
        };
        if let Some(lane) = open {
            let _ = lane.abort();
        }
    }

    fn overflow(&self, item: PendingItem) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let lane = DeliveryLane::new(lane_name(&item.lane)?, None);
            self.context
                .deliveries
                .post(
                    &self.channel,
                    To::event(&item.event),
                    Text::Written(OVERFLOW_NOTICE.to_owned()),
                    Vec::new(),
                    Some(lane),
                )
                .await?;
            self.context
                .inbox
                .consume(vec![item.event_seq, item.disposition_seq])
                .await
                .map_err(|error| error.to_string())
        })
    }

    fn drain<'a>(
        &'a self,
        lease: Option<&'a LaneLease>,
        mut run: JoinHandle<()>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let abort = || {
                if let Some(lane) = lease {
                    let _ = lane.abort();
                }
            };
            if self
                .context
                .common
                .drain
                .finish(&mut run, abort)
                .await
                .is_none()
            {
                run.abort();
            }
        })
    }

    fn retire(&self, taken: u64) -> BoxFuture<'_, bool> {
        Box::pin(self.conversations.retire(self.name.clone(), taken))
    }

    fn open_failed(&self, error: &str, failures: u32, waiting: usize, wait: Duration) {
        self.context.common.metrics.lane_open_failed();
        let (name, channel) = (&self.name, &self.origin.channel);
        tracing::warn!(
            channel = %channel,
            lane = %name,
            "lane {name} could not be opened (try {failures}); {waiting} item(s) wait, next try in {wait:?}: {error}"
        );
    }
}

/// Runs the lane on `items` (one, or several collected; a resumption when `resume`), delivers
/// the reply and consumes the items.
async fn answer(
    context: &Context,
    lane: &Lane,
    channel: &Arc<Channel>,
    items: Vec<PendingItem>,
    resume: bool,
) -> Result<(), String> {
    let Some(last) = items.last().cloned() else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let typing = keep_typing(channel, &last.event);
    let mut said = Vec::with_capacity(items.len());
    for item in &items {
        said.push(Said {
            origin: origin_of(&channel.loaded.config, item),
            text: item_text(context, channel, item).await,
        });
    }
    let text = said
        .iter()
        .map(|said| said.text.as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    let consumes = items.iter().map(PendingItem::consumes_id).collect();
    let input = Input {
        text,
        consumes,
        fresh: false,
        said,
        trigger: Trigger::Chat,
    };
    let finished = match (resume, last.resume) {
        (true, Some(resumption)) => lane.resume(input, resumption, None).await,
        _ => lane.send(input, None).await,
    }
    .map_err(|error| error.to_string());
    typing.cancel();
    let finished = finished?;
    if let Outcome::Failed { reason } | Outcome::Interrupted { reason } = &finished.outcome {
        tracing::warn!(
            channel = %last.channel,
            lane = %last.lane,
            messages = items.len(),
            outcome = outcome_name(&finished.outcome),
            "lane {}: run {}: {reason}",
            last.lane,
            outcome_name(&finished.outcome)
        );
    }
    let delivery_lane = DeliveryLane::new(lane_name(&last.lane)?, Some(finished.op));
    context
        .deliveries
        .deliver_outcome(
            channel,
            &last.event,
            &finished.outcome,
            &finished.text,
            delivery_lane,
        )
        .await?;
    if finished.outcome == Outcome::Completed {
        crate::host::narrate::tell(&Event::Answered {
            channel: last.channel.clone(),
            lane: last.lane.clone(),
            took: started.elapsed(),
        });
    }
    let seqs = items
        .iter()
        .flat_map(|item| [item.event_seq, item.disposition_seq])
        .collect();
    context
        .inbox
        .consume(seqs)
        .await
        .map_err(|error| error.to_string())
}

/// The item's text as the agent reads it: with a line per attachment, each fetched and saved
/// under `workspace/inbox/` first (or said not to be there, and why).
async fn item_text(context: &Context, channel: &Channel, item: &PendingItem) -> String {
    if item.event.attachments.is_empty() {
        return item.text.clone();
    }
    let received = crate::tools::attachments::receive(
        channel.connector.as_ref(),
        &context.workspace,
        &item.channel,
        &item.event,
    )
    .await;
    for unsaved in &received.unsaved {
        tracing::warn!(
            channel = %item.channel,
            lane = %item.lane,
            "channel {}: an attachment of {} was not saved: {unsaved}",
            item.channel,
            item.event.platform_id
        );
    }
    perch_core::attachment::with_lines(&item.text, &received.lines)
}

fn keep_typing(channel: &Channel, event: &InboundEvent) -> CancellationToken {
    let stop = CancellationToken::new();
    let connector = Arc::clone(&channel.connector);
    let room = event.room.clone();
    let thread = event.thread.clone();
    let stopped = stop.clone();
    tokio::spawn(async move {
        loop {
            connector.typing(&room, thread.as_deref()).await;
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(4)) => {}
                () = stopped.cancelled() => return,
            }
        }
    });
    stop
}

/// Where `item` came from, as its user entry keeps it: the room by the channel file's alias
/// for it where there is one, and the group context offered with it.
fn origin_of(config: &ChannelConfig, item: &PendingItem) -> MessageOrigin {
    let event = &item.event;
    let person = |sender: &crate::channel::Sender| Person {
        id: sender.id.clone(),
        name: sender.name.clone(),
    };
    MessageOrigin {
        sender: person(&event.sender),
        channel: config.name.to_string(),
        room: config
            .room_alias(&event.room)
            .map_or_else(|| event.room.clone(), ToString::to_string),
        thread: event.thread.clone(),
        sent_at: event.sent_at,
        direct: event.direct,
        replying_to: event.replying_to.as_deref().map(|quote| Quoted {
            platform_id: quote.platform_id.clone(),
            author: quote.author.as_ref().map(person),
            text: quote.text.clone(),
        }),
        earlier: item.earlier.clone(),
    }
    .bounded()
}

/// A run's outcome in one word, for log lines.
fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Completed => "completed",
        Outcome::Cancelled => "cancelled",
        Outcome::Failed { .. } => "failed",
        Outcome::Interrupted { .. } => "interrupted",
    }
}

/// An inbox item's lane, by name.
pub(in crate::service) fn lane_name(lane: &str) -> Result<LaneName, String> {
    LaneName::try_from(lane).map_err(|error| format!("lane {lane:?}: {error}"))
}
