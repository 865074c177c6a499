//! The conversations' owner: one task that keeps the map of conversations with a task, starts a
//! conversation's task for its first item, hands it the next ones, lets it end once nothing
//! more can reach it, and answers `/stop`, heartbeats' lane holds and the final close.

use super::super::channel::Channels;
use super::context::Context;
use super::converse::{Rules, converse};
use super::handle::{Conversations, Request};
use super::talk::ConversationTalk;
use crate::store::inbox::PendingItem;
use perch_core::converse::Event;
use perch_core::name::LaneName;
use perch_core::prompt::Origin;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One conversation with a task: where its events go, and how many items went there.
struct Entry {
    events: mpsc::UnboundedSender<Event<PendingItem>>,
    sent: u64,
}

pub(super) struct Owner {
    pub(super) requests: mpsc::UnboundedReceiver<Request>,
    /// Given to each conversation's task, to ask to end.
    pub(super) handle: Conversations,
    pub(super) context: Arc<Context>,
    pub(super) channels: Channels,
    /// How long a conversation waits for another message before it ends.
    pub(super) idle_after: Duration,
    conversations: HashMap<LaneName, Entry>,
}

impl Owner {
    pub(super) fn new(
        requests: mpsc::UnboundedReceiver<Request>,
        handle: Conversations,
        context: Arc<Context>,
        channels: Channels,
    ) -> Owner {
        Owner {
            requests,
            handle,
            idle_after: context.pool.limits().conversation_idle,
            context,
            channels,
            conversations: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self) {
        let sweeping = self.context.pool.clone();
        let shutdown = self.context.common.shutdown.clone();
        tokio::spawn(async move { sweeping.close_idle_until(shutdown).await });
        loop {
            let request = tokio::select! {
                request = self.requests.recv() => match request {
                    Some(request) => request,
                    None => return,
                },
                () = self.context.common.closing.cancelled() => return,
            };
            match request {
                Request::Dispatch { lane, item } => self.dispatch(lane, *item),
                Request::Stop { lane, reply } => {
                    let _ = reply.send(self.stop(&lane));
                }
                Request::Retire { lane, taken, reply } => {
                    let _ = reply.send(self.retire(&lane, taken));
                }
                Request::Ended { lane } => {
                    if self
                        .conversations
                        .get(&lane)
                        .is_some_and(|entry| entry.events.is_closed())
                    {
                        self.conversations.remove(&lane);
                    }
                    self.count();
                }
                Request::Hold {
                    name,
                    origin,
                    model,
                    reply,
                } => {
                    let context = Arc::clone(&self.context);
                    tokio::spawn(async move {
                        let held = context.hold(&name, origin, model.as_ref()).await;
                        let _ = reply.send(held);
                    });
                }
                Request::CloseAll { reply } => {
                    let pool = self.context.pool.clone();
                    tokio::spawn(async move {
                        let _ = reply.send(pool.close_all().await);
                    });
                }
            }
        }
    }

    /// Hands `item` to its conversation, starting the conversation's task if it has none.
    fn dispatch(&mut self, lane: LaneName, item: PendingItem) {
        let mut event = Event::Item(item);
        if let Some(entry) = self.conversations.get_mut(&lane) {
            match entry.events.send(event) {
                Ok(()) => {
                    entry.sent += 1;
                    return;
                }
                Err(returned) => event = returned.0,
            }
        }
        let Event::Item(item) = &event else {
            return;
        };
        let channel_name = item.channel.clone();
        let Some(channel) = self.channels.get(&channel_name).cloned() else {
            tracing::error!(channel = %channel_name, lane = %lane, "no channel {channel_name}");
            return;
        };
        let (events, received) = mpsc::unbounded_channel();
        let _ = events.send(event);
        self.conversations
            .insert(lane.clone(), Entry { events, sent: 1 });
        self.count();
        let rules = Rules {
            busy: channel.loaded.config.busy,
            queue_limit: channel.loaded.config.queue_limit,
            idle_after: self.idle_after,
        };
        let talk = ConversationTalk {
            context: Arc::clone(&self.context),
            conversations: self.handle.clone(),
            name: lane.clone(),
            origin: Origin {
                channel: channel_name.clone(),
                room: None,
            },
            channel,
        };
        let (handle, shutdown) = (self.handle.clone(), self.context.common.shutdown.clone());
        self.context.common.tasks.spawn(async move {
            if let Err(error) = converse(talk, received, rules, shutdown).await {
                tracing::error!(channel = %channel_name, lane = %lane, "{error}");
            }
            handle.ended(lane);
        });
    }

    /// `/stop`: the conversation's task is told (its machine aborts what runs in the lane);
    /// without a task, what runs in the lane (a heartbeat's run) is aborted here. Whether the
    /// lane is open, so that something was stopped.
    fn stop(&self, lane: &LaneName) -> bool {
        let open = self.context.pool.open_lane(lane);
        match self.conversations.get(lane) {
            Some(entry) if entry.events.send(Event::Stop).is_ok() => open.is_some(),
            _ => open.is_some_and(|lane| lane.abort().is_ok()),
        }
    }

    /// Lets an idle conversation end unless an item went to it that it has not taken.
    fn retire(&mut self, lane: &LaneName, taken: u64) -> bool {
        if self
            .conversations
            .get(lane)
            .is_some_and(|entry| entry.sent != taken)
        {
            return false;
        }
        self.conversations.remove(lane);
        self.count();
        true
    }

    fn count(&self) {
        self.context
            .common
            .metrics
            .set_conversations_active(u64::try_from(self.conversations.len()).unwrap_or(u64::MAX));
    }
}
