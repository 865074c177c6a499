//! Conversations: one task per conversation with items waiting, its lane, the channel's busy
//! policy, and the runs that answer.

use super::lanes::LaneLease;
use super::{Channel, DRAIN_MARGIN, Service};
use crate::channel::InboundEvent;
use crate::lane::{Input, Lane, Said, Steered};
use crate::store::inbox::PendingItem;
use crate::store::outbox::DeliveryLane;
use perch_core::config::{BusyPolicy, ChannelConfig};
use perch_core::log::{Outcome, Trigger};
use perch_core::name::LaneName;
use perch_core::origin::{MessageOrigin, Person, Quoted};
use perch_core::prompt::Origin;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

impl Service {
    /// Holds the lane `name`, opened (and recovered) first if it is not open, on `model` or the
    /// agent's. Heartbeats take their lanes through here, sharing them with conversations, so a
    /// lane is never opened twice; when every slot stays held for [`HOLD_WAIT`], or the lane
    /// cannot be opened, it says why.
    pub(super) async fn lane(
        &self,
        name: &LaneName,
        origin: Origin,
        model: Option<&perch_core::name::ModelRef>,
    ) -> Result<LaneLease, String> {
        if let Some(lease) = self.lanes.join(name) {
            return Ok(lease);
        }
        let permit = tokio::time::timeout(HOLD_WAIT, self.lanes.turn())
            .await
            .map_err(|_| {
                format!(
                    "all {} open lanes stayed in use for {HOLD_WAIT:?}",
                    self.lanes.limits().open_max
                )
            })?;
        self.lanes
            .hold(name, permit, || self.open_lane(name, origin, model))
            .await
    }

    /// Opens (and recovers) the lane `name` on `model` or the agent's.
    async fn open_lane(
        &self,
        name: &LaneName,
        origin: Origin,
        model: Option<&perch_core::name::ModelRef>,
    ) -> Result<Lane, String> {
        Ok(match model {
            None => {
                self.runtime
                    .open_lane(name, origin, self.limits)
                    .await
                    .map_err(|error| error.to_string())?
                    .0
            }
            Some(model) => {
                self.runtime
                    .open_lane_with_model(name, origin, self.limits, model)
                    .await?
                    .0
            }
        })
    }

    /// Hands an item to its conversation, starting the conversation's task if it has none.
    pub(super) async fn dispatch(self: &Arc<Self>, mut item: PendingItem) -> Result<(), String> {
        let lane = LaneName::try_from(item.lane.as_str())?;
        let mut conversations = self.state.conversations.lock().await;
        if let Some(queue) = conversations.get(&lane) {
            match queue.send(item) {
                Ok(()) => return Ok(()),
                Err(returned) => item = returned.0,
            }
        }
        let channel = item.channel.clone();
        let (queue, items) = mpsc::unbounded_channel();
        let _ = queue.send(item);
        conversations.insert(lane.clone(), queue);
        self.count_conversations(conversations.len());
        drop(conversations);
        let service = Arc::clone(self);
        let (lane_name, channel_name) = (lane.to_string(), channel.clone());
        self.tasks.spawn(async move {
            let ended = Arc::clone(&service)
                .converse(lane.clone(), channel, items)
                .await;
            if let Err(error) = ended {
                tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
            }
            // However it ended, its entry goes; an idle end has removed it already.
            let mut conversations = service.state.conversations.lock().await;
            if conversations
                .get(&lane)
                .is_some_and(mpsc::UnboundedSender::is_closed)
            {
                conversations.remove(&lane);
            }
            service.count_conversations(conversations.len());
        });
        Ok(())
    }

    fn count_conversations(&self, active: usize) {
        self.metrics
            .set_conversations_active(u64::try_from(active).unwrap_or(u64::MAX));
    }

    /// One conversation: its queue, the channel's busy policy, and its lane, held while a run is
    /// active or items wait and let go of otherwise. An item whose lane cannot be held yet (every
    /// slot in use, or the lane failed to open) waits in the queue and the lane is tried again
    /// (in turn for a slot, with backoff after a failure). Once nothing has arrived for
    /// [`LaneLimits::conversation_idle`](super::LaneLimits) with nothing to do, the task ends,
    /// removing its queue from `conversations` under the lock `dispatch` sends under.
    async fn converse(
        self: Arc<Self>,
        name: LaneName,
        channel: String,
        mut items: mpsc::UnboundedReceiver<PendingItem>,
    ) -> Result<(), String> {
        let connected = self
            .channels
            .get(&channel)
            .cloned()
            .ok_or_else(|| format!("no channel {channel}"))?;
        let origin = Origin {
            channel: channel.clone(),
            room: None,
        };
        let config = connected.loaded.config.clone();
        let shutdown = self.shutdown.clone();
        let idle_after = self.lanes.limits().conversation_idle;
        let mut queue: VecDeque<PendingItem> = VecDeque::new();
        let mut active: Option<tokio::task::JoinHandle<()>> = None;
        let mut lease: Option<LaneLease> = None;
        let mut failures: u32 = 0;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            if active
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished)
            {
                active = None;
            }
            let wants_lane = active.is_none() && !queue.is_empty() && !shutdown.is_cancelled();
            if wants_lane && lease.is_none() {
                lease = self.lanes.join(&name);
            }
            if wants_lane && let Some(lane) = &lease {
                let resuming = queue.front().is_some_and(|item| item.resume.is_some());
                let batch: Vec<PendingItem> = match config.busy {
                    BusyPolicy::Collect { .. } if !resuming => queue.drain(..).collect(),
                    _ => queue.pop_front().into_iter().collect(),
                };
                let service = Arc::clone(&self);
                let lane: Lane = (**lane).clone();
                let connected = Arc::clone(&connected);
                let (lane_name, channel_name) = (name.to_string(), channel.clone());
                active = Some(self.tasks.spawn(async move {
                    if let Err(error) = service.answer(&lane, &connected, batch).await {
                        tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
                    }
                }));
            }
            let idle = active.is_none() && queue.is_empty();
            if idle {
                lease = None;
            }
            let waiting = active.is_none() && !queue.is_empty() && lease.is_none();
            let woken = {
                let finished = async {
                    match active.as_mut() {
                        Some(run) => {
                            let _ = run.await;
                        }
                        None => std::future::pending().await,
                    }
                };
                let retry = async {
                    match retry_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => Woken::Shutdown,
                    () = finished => Woken::Finished,
                    item = items.recv() => Woken::Item(item.map(Box::new)),
                    permit = self.lanes.turn(), if waiting && retry_at.is_none() => {
                        Woken::Turn(permit)
                    }
                    () = retry, if waiting => Woken::Retry,
                    () = tokio::time::sleep(idle_after), if idle => Woken::Idle,
                }
            };
            let item = match woken {
                Woken::Shutdown => {
                    if let (Some(run), Some(lane)) = (active.take(), &lease) {
                        self.drain_run(lane, run).await;
                    }
                    return Ok(());
                }
                Woken::Finished => {
                    active = None;
                    continue;
                }
                Woken::Turn(permit) => {
                    match self
                        .lanes
                        .hold(&name, permit, || {
                            self.open_lane(&name, origin.clone(), None)
                        })
                        .await
                    {
                        Ok(held) => {
                            lease = Some(held);
                            failures = 0;
                        }
                        Err(error) => {
                            self.metrics.lane_open_failed();
                            failures = failures.saturating_add(1);
                            let wait = perch_core::lanes::open_retry(failures);
                            retry_at = Some(tokio::time::Instant::now() + wait);
                            tracing::warn!(
                                channel = %channel,
                                lane = %name,
                                "lane {name} could not be opened (try {failures}); {} item(s) wait, next try in {wait:?}: {error}",
                                queue.len()
                            );
                        }
                    }
                    continue;
                }
                Woken::Retry => {
                    retry_at = None;
                    continue;
                }
                Woken::Idle => {
                    let mut conversations = self.state.conversations.lock().await;
                    match items.try_recv() {
                        Ok(item) => item,
                        Err(_) => {
                            conversations.remove(&name);
                            self.count_conversations(conversations.len());
                            return Ok(());
                        }
                    }
                }
                Woken::Item(None) => return Ok(()),
                Woken::Item(Some(item)) => *item,
            };
            if let Some(window) = collect_window(config.busy) {
                // Messages arriving within the window join the same turn.
                queue.push_back(item);
                tokio::time::sleep(window).await;
                while let Ok(more) = items.try_recv() {
                    queue.push_back(more);
                }
                continue;
            }
            let limit = usize::try_from(config.queue_limit).unwrap_or(usize::MAX);
            match (active.is_some(), &lease, config.busy) {
                (true, Some(lane), BusyPolicy::Steer) => {
                    let said = Said {
                        origin: origin_of(&connected.loaded.config, &item),
                        text: self.item_text(&connected, &item).await,
                    };
                    if matches!(lane.steer_said(said).await, Ok(Steered::Delivered)) {
                        self.inbox
                            .consume(vec![item.event_seq, item.disposition_seq])
                            .await
                            .map_err(|error| error.to_string())?;
                    } else {
                        queue.push_back(item);
                    }
                }
                (true, Some(lane), BusyPolicy::Interrupt) => {
                    let _ = lane.abort();
                    queue.push_back(item);
                }
                _ if queue.len() >= limit => self.overflow(&connected, item).await?,
                _ => queue.push_back(item),
            }
        }
    }

    /// At shutdown: lets the active run finish, and deliver its reply, within the drain; then
    /// aborts it, so that its operation is closed as cancelled.
    async fn drain_run(&self, lane: &Lane, mut run: tokio::task::JoinHandle<()>) {
        if tokio::time::timeout(self.drain, &mut run).await.is_ok() {
            return;
        }
        tracing::warn!("a run did not finish within the drain; aborting it");
        let _ = lane.abort();
        if tokio::time::timeout(DRAIN_MARGIN, &mut run).await.is_err() {
            run.abort();
        }
    }

    /// Runs the lane on `items` (one, or several collected) and delivers the reply.
    async fn answer(
        &self,
        lane: &Lane,
        channel: &Arc<Channel>,
        items: Vec<PendingItem>,
    ) -> Result<(), String> {
        let Some(last) = items.last().cloned() else {
            return Ok(());
        };
        let typing = self.keep_typing(channel, &last.event);
        let mut said = Vec::with_capacity(items.len());
        for item in &items {
            said.push(Said {
                origin: origin_of(&channel.loaded.config, item),
                text: self.item_text(channel, item).await,
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
        let finished = match (items.as_slice(), last.resume) {
            ([_], Some(resumption)) => lane.resume(input, resumption, None).await,
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
        let lane = DeliveryLane::new(lane_name(&last.lane)?, Some(finished.op));
        self.deliver_outcome(
            channel,
            &last.event,
            &finished.outcome,
            &finished.text,
            lane,
        )
        .await?;
        let seqs = items
            .iter()
            .flat_map(|item| [item.event_seq, item.disposition_seq])
            .collect();
        self.inbox
            .consume(seqs)
            .await
            .map_err(|error| error.to_string())
    }

    /// Answers `to` with how its run ended: the reply (and its files) when it completed, a short
    /// apology when it failed or was interrupted (the reason is logged, never posted), nothing
    /// when cancelled. Returns once the reply is recorded in the outbox and handed to its
    /// room's worker, not when it is sent. How it settles is appended to `lane`.
    pub(super) async fn deliver_outcome(
        &self,
        channel: &Arc<Channel>,
        to: &InboundEvent,
        outcome: &Outcome,
        text: &str,
        lane: DeliveryLane,
    ) -> Result<(), String> {
        let (reply, files) = match outcome {
            Outcome::Completed => {
                crate::tools::attachments::reply_files(&self.runtime.agent().dir.workspace(), text)
            }
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
        if reply.trim().is_empty() && files.is_empty() {
            return Ok(());
        }
        crate::host::failpoint::hit("before:delivery_intent");
        self.post_files(
            channel,
            &to.room,
            to.thread.as_deref(),
            Some(&to.platform_id),
            reply,
            files,
            Some(lane),
        )
        .await
        .map(drop)
    }

    /// The item's text as the agent reads it: with a line per attachment, each fetched and saved
    /// under `workspace/inbox/` first (or said not to be there, and why).
    async fn item_text(&self, channel: &Channel, item: &PendingItem) -> String {
        if item.event.attachments.is_empty() {
            return item.text.clone();
        }
        let workspace = self.runtime.agent().dir.workspace();
        let received = crate::tools::attachments::receive(
            channel.connector.as_ref(),
            &workspace,
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

    fn keep_typing(&self, channel: &Channel, event: &InboundEvent) -> CancellationToken {
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

    /// Tells the sender the conversation's queue is full, and consumes the item once that
    /// notice is recorded in the outbox.
    async fn overflow(&self, channel: &Arc<Channel>, item: PendingItem) -> Result<(), String> {
        let text = "I am still working on earlier messages in this conversation and cannot queue \
                    more right now. Please send this again in a moment.";
        let lane = DeliveryLane::new(lane_name(&item.lane)?, None);
        self.reply(channel, &item.event, text.to_owned(), Some(lane))
            .await?;
        self.inbox
            .consume(vec![item.event_seq, item.disposition_seq])
            .await
            .map_err(|error| error.to_string())
    }
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

/// What a chat is told when a run failed; the reason goes to the log and the lane only.
const FAILED_REPLY: &str = "Sorry, I could not finish that: something went wrong on my side. My \
                            owner can find the details in perch's log.";

/// How the spend guard's own refusal starts: perch's words, which the chat is told.
const SPEND_CAP_REASON: &str = "the daily spend cap";

/// What a chat is told when a run was interrupted (perch stopped or crashed during it).
const INTERRUPTED_REPLY: &str = "Sorry, I could not finish that: I was interrupted. Please ask \
                                 again.";

/// How long a heartbeat waits for a lane slot when every open lane is held.
const HOLD_WAIT: Duration = Duration::from_secs(60);

/// What woke a conversation's task.
enum Woken {
    Shutdown,
    Finished,
    Item(Option<Box<PendingItem>>),
    /// A slot to hold the lane in.
    Turn(tokio::sync::OwnedSemaphorePermit),
    /// The wait after a failed open is over.
    Retry,
    /// Nothing to do, and nothing arrived, for the idle grace.
    Idle,
}

/// An inbox item's lane, by name.
pub(super) fn lane_name(lane: &str) -> Result<LaneName, String> {
    LaneName::try_from(lane).map_err(|error| format!("lane {lane:?}: {error}"))
}

fn collect_window(busy: BusyPolicy) -> Option<Duration> {
    match busy {
        BusyPolicy::Collect { window } => Some(window),
        _ => None,
    }
}
