//! Conversations: one task per conversation with items waiting, its lane, the channel's busy
//! policy, and the runs that answer.

use super::converse::{Rules, Talk, converse};
use super::lanes::LaneLease;
use super::{Channel, DRAIN_MARGIN, Service};
use crate::channel::BoxFuture;
use crate::channel::InboundEvent;
use crate::inbox::PendingItem;
use crate::lane::{Input, Lane, Said, Steered};
use crate::outbox::DeliveryLane;
use perch_core::config::ChannelConfig;
use perch_core::converse::{Event, OVERFLOW_NOTICE, Queued};
use perch_core::log::{Outcome, Trigger};
use perch_core::name::LaneName;
use perch_core::origin::{MessageOrigin, Person, Quoted};
use perch_core::prompt::Origin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
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
    pub(super) async fn dispatch(self: &Arc<Self>, item: PendingItem) -> Result<(), String> {
        let lane = LaneName::try_from(item.lane.as_str())?;
        let mut conversations = self.state.conversations.lock().await;
        let mut event = Event::Item(item);
        if let Some(entry) = conversations.get_mut(&lane) {
            match entry.events.send(event) {
                Ok(()) => {
                    entry.sent += 1;
                    return Ok(());
                }
                Err(returned) => event = returned.0,
            }
        }
        let Event::Item(item) = &event else {
            return Ok(());
        };
        let channel = item.channel.clone();
        let (events, received) = mpsc::unbounded_channel();
        let _ = events.send(event);
        conversations.insert(lane.clone(), ConversationEntry { events, sent: 1 });
        self.count_conversations(conversations.len());
        drop(conversations);
        let service = Arc::clone(self);
        let (lane_name, channel_name) = (lane.to_string(), channel.clone());
        self.tasks.spawn(async move {
            let ended = match service.talk(&lane, &channel) {
                Ok((talk, rules)) => {
                    converse(talk, received, rules, service.shutdown.clone()).await
                }
                Err(error) => Err(error),
            };
            if let Err(error) = ended {
                tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
            }
            // However it ended, its entry goes; an idle end has removed it already.
            let mut conversations = service.state.conversations.lock().await;
            if conversations
                .get(&lane)
                .is_some_and(|entry| entry.events.is_closed())
            {
                conversations.remove(&lane);
            }
            service.count_conversations(conversations.len());
        });
        Ok(())
    }

    /// `/stop` in the conversation of `lane`: its task is told (its machine aborts what runs in
    /// the lane); without a task, what runs in the lane (a heartbeat's run) is aborted here.
    /// Whether the lane is open, so that something was stopped.
    pub(super) async fn stop(&self, lane: &LaneName) -> bool {
        let open = self.lanes.open_lane(lane);
        let conversations = self.state.conversations.lock().await;
        match conversations.get(lane) {
            Some(entry) if entry.events.send(Event::Stop).is_ok() => open.is_some(),
            _ => open.is_some_and(|lane| lane.abort().is_ok()),
        }
    }

    /// The conversation of `lane` on `channel`: its effects, and its channel's rules.
    fn talk(
        self: &Arc<Self>,
        lane: &LaneName,
        channel: &str,
    ) -> Result<(ServiceTalk, Rules), String> {
        let connected = self
            .channels
            .get(channel)
            .cloned()
            .ok_or_else(|| format!("no channel {channel}"))?;
        let rules = Rules {
            busy: connected.loaded.config.busy,
            queue_limit: connected.loaded.config.queue_limit,
            idle_after: self.lanes.limits().conversation_idle,
        };
        let talk = ServiceTalk {
            service: Arc::clone(self),
            name: lane.clone(),
            origin: Origin {
                channel: channel.to_owned(),
                room: None,
            },
            channel: connected,
        };
        Ok((talk, rules))
    }

    fn count_conversations(&self, active: usize) {
        self.metrics
            .set_conversations_active(u64::try_from(active).unwrap_or(u64::MAX));
    }

    /// At shutdown: lets the active run finish, and deliver its reply, within the drain; then
    /// aborts it, so that its operation is closed as cancelled.
    async fn drain_run(&self, lane: Option<&Lane>, mut run: tokio::task::JoinHandle<()>) {
        if tokio::time::timeout(self.drain, &mut run).await.is_ok() {
            return;
        }
        tracing::warn!("a run did not finish within the drain; aborting it");
        if let Some(lane) = lane {
            let _ = lane.abort();
        }
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
        resume: bool,
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
                crate::attachments::reply_files(&self.runtime.agent().dir.workspace(), text)
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
        crate::failpoint::hit("before:delivery_intent");
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
        let received = crate::attachments::receive(
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
        let lane = DeliveryLane::new(lane_name(&item.lane)?, None);
        self.reply(channel, &item.event, OVERFLOW_NOTICE.to_owned(), Some(lane))
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

/// An inbox item's lane, by name.
pub(super) fn lane_name(lane: &str) -> Result<LaneName, String> {
    LaneName::try_from(lane).map_err(|error| format!("lane {lane:?}: {error}"))
}

impl Queued for PendingItem {
    fn resumes(&self) -> bool {
        self.resume.is_some()
    }
}

/// One conversation's queue, as its task is sent its events.
pub(super) struct ConversationEntry {
    events: mpsc::UnboundedSender<Event<PendingItem>>,
    /// The items sent, for [`Talk::retire`].
    sent: u64,
}

/// A conversation's effects, carried out by the service.
struct ServiceTalk {
    service: Arc<Service>,
    name: LaneName,
    origin: Origin,
    channel: Arc<Channel>,
}

impl Talk for ServiceTalk {
    type Item = PendingItem;
    type Lease = LaneLease;
    type Slot = tokio::sync::OwnedSemaphorePermit;

    fn join(&self) -> Option<LaneLease> {
        self.service.lanes.join(&self.name)
    }

    fn turn(&self) -> BoxFuture<'_, Self::Slot> {
        Box::pin(self.service.lanes.turn())
    }

    fn hold(&self, slot: Self::Slot) -> BoxFuture<'_, Result<LaneLease, String>> {
        Box::pin(self.service.lanes.hold(&self.name, slot, || {
            self.service
                .open_lane(&self.name, self.origin.clone(), None)
        }))
    }

    fn run(&self, lease: &LaneLease, batch: Vec<PendingItem>, resume: bool) -> JoinHandle<()> {
        let service = Arc::clone(&self.service);
        let lane: Lane = (**lease).clone();
        let channel = Arc::clone(&self.channel);
        let (lane_name, channel_name) = (self.name.to_string(), self.origin.channel.clone());
        self.service.tasks.spawn(async move {
            if let Err(error) = service.answer(&lane, &channel, batch, resume).await {
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
                text: self.service.item_text(&self.channel, &item).await,
            };
            if !matches!(lease.steer_said(said).await, Ok(Steered::Delivered)) {
                return Ok(Some(item));
            }
            self.service
                .inbox
                .consume(vec![item.event_seq, item.disposition_seq])
                .await
                .map_err(|error| error.to_string())?;
            Ok(None)
        })
    }

    fn abort(&self, lease: Option<&LaneLease>) {
        match lease {
            Some(lane) => {
                let _ = lane.abort();
            }
            None => {
                if let Some(lane) = self.service.lanes.open_lane(&self.name) {
                    let _ = lane.abort();
                }
            }
        }
    }

    fn overflow(&self, item: PendingItem) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(self.service.overflow(&self.channel, item))
    }

    fn drain<'a>(&'a self, lease: Option<&'a LaneLease>, run: JoinHandle<()>) -> BoxFuture<'a, ()> {
        Box::pin(self.service.drain_run(lease.map(|lease| &**lease), run))
    }

    fn retire(&self, taken: u64) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let mut conversations = self.service.state.conversations.lock().await;
            if conversations
                .get(&self.name)
                .is_some_and(|entry| entry.sent != taken)
            {
                return false;
            }
            conversations.remove(&self.name);
            self.service.count_conversations(conversations.len());
            true
        })
    }

    fn open_failed(&self, error: &str, failures: u32, waiting: usize, wait: Duration) {
        self.service.metrics.lane_open_failed();
        let (name, channel) = (&self.name, &self.origin.channel);
        tracing::warn!(
            channel = %channel,
            lane = %name,
            "lane {name} could not be opened (try {failures}); {waiting} item(s) wait, next try in {wait:?}: {error}"
        );
    }
}
