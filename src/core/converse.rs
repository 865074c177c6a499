//! A conversation as a machine: its queue of chat messages, its run, its hold on its lane, the
//! channel's busy policy and the queue limit. The service's conversation task only waits for
//! the [`Event`]s, calls [`step`], and carries out the [`Action`]s; every decision is here.
//!
//! - A conversation holds its lane while a run is active or items wait, and lets it go when it
//!   has nothing to do ([`Action::ReleaseLane`]); after that, once it has been idle for the
//!   service's idle time, it ends ([`Event::Idle`]).
//! - An item waits for its lane: a free slot ([`Action::AskSlot`]), and, when the lane could not
//!   be opened, a retry after [`open_retry`]'s backoff ([`Action::RetryIn`]); never dropped.
//! - A run takes one item, or, under `busy = "collect"`, every item waiting (once the collect
//!   window, opened by the first of them, has closed). An item resuming an interrupted run
//!   runs alone, as a resumption.
//! - An item arriving during a run is steered into it (`steer`; when the lane says no run is
//!   active, it waits after all), aborts it and runs next (`interrupt`), or waits (`followup`);
//!   waiting items beyond `queue_limit` are answered with [`OVERFLOW_NOTICE`] instead.
//! - `/stop` aborts what runs in the conversation's lane; the items waiting still run.
//! - At shutdown the active run is drained, the waiting items stay in the inbox for the next
//!   start, and the conversation ends.

use crate::config::BusyPolicy;
use crate::lanes::open_retry;
use std::collections::VecDeque;
use std::time::Duration;

/// What a sender is told when their message does not fit in the conversation's queue.
pub const OVERFLOW_NOTICE: &str = "I am still working on earlier messages in this conversation \
                                   and cannot queue more right now. Please send this again in a \
                                   moment.";

/// A chat message as the machine sees it.
pub trait Queued {
    /// It resumes a run a crash interrupted, so it runs alone.
    fn resumes(&self) -> bool;
}

/// Where a conversation stands with its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Not held.
    Released,
    /// Waiting for a slot to hold it in.
    Asking,
    /// Held.
    Held,
    /// It could not be opened; waiting to try again.
    Backoff,
}

/// One conversation's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation<I> {
    queue: VecDeque<I>,
    /// A run of this conversation is in progress.
    run: bool,
    hold: Hold,
    /// The lane's failed opens in a row.
    failures: u32,
    /// The collect window is open.
    collecting: bool,
    ended: bool,
}

/// What happened to a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<I> {
    /// A chat message for it.
    Item(I),
    /// Its run finished (answered, failed or aborted).
    RunFinished,
    /// Its lane is held in a slot (opened first if it was not open).
    SlotGranted,
    /// Its lane could not be opened (or no slot could be made for it).
    LaneOpenFailed,
    /// The wait after a failed open is over.
    RetryDue,
    /// The collect window is over.
    CollectWindowClosed,
    /// It has been idle for the service's idle time and nothing is on its way to it.
    Idle,
    /// `/stop` in its room.
    Stop,
    /// The lane refused a steer: no run was active any more. The item is given back.
    SteerRefused(I),
    /// perch is stopping.
    Shutdown,
}

/// What the conversation's task does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<I> {
    /// Run the lane on `batch` (the lane is held); `resume` when it is one item resuming an
    /// interrupted run.
    StartRun { batch: Vec<I>, resume: bool },
    /// Give the item to the active run at its next tool boundary (and consume it once the lane
    /// took it; else report [`Event::SteerRefused`]).
    Steer(I),
    /// Abort what runs in the lane.
    Abort,
    /// Answer the item with [`OVERFLOW_NOTICE`] and consume it.
    Overflow(I),
    /// Hold the lane: at once when someone holds it already, else in the next free slot.
    AskSlot,
    /// Report [`Event::RetryDue`] after this long.
    RetryIn(Duration),
    /// Report [`Event::CollectWindowClosed`] after this long.
    CollectFor(Duration),
    /// Let go of the lane; the idle time starts now.
    ReleaseLane,
    /// Let the active run finish within the drain, then abort it.
    Drain,
    /// End the conversation's task.
    End,
}

impl<I> Conversation<I> {
    /// A conversation with nothing yet.
    pub fn new() -> Conversation<I> {
        Conversation {
            queue: VecDeque::new(),
            run: false,
            hold: Hold::Released,
            failures: 0,
            collecting: false,
            ended: false,
        }
    }

    /// The items waiting.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// The lane's failed opens in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl<I> Default for Conversation<I> {
    fn default() -> Conversation<I> {
        Conversation::new()
    }
}

/// Moves `conversation` on from `event` under the channel's `busy` policy and `limit` (its
/// `queue_limit`); returns what to do, in order. An ended conversation does nothing more.
pub fn step<I: Queued>(
    conversation: &mut Conversation<I>,
    event: Event<I>,
    busy: &BusyPolicy,
    limit: u32,
) -> Vec<Action<I>> {
    let mut actions = Vec::new();
    if conversation.ended {
        return actions;
    }
    match event {
        Event::Item(item) => conversation.arrive(item, busy, limit, &mut actions),
        Event::RunFinished => conversation.run = false,
        Event::SlotGranted => {
            conversation.hold = Hold::Held;
            conversation.failures = 0;
        }
        Event::LaneOpenFailed => {
            if conversation.hold == Hold::Asking {
                conversation.hold = Hold::Backoff;
                conversation.failures = conversation.failures.saturating_add(1);
                actions.push(Action::RetryIn(open_retry(conversation.failures)));
            }
        }
        Event::RetryDue => {
            if conversation.hold == Hold::Backoff {
                conversation.hold = Hold::Released;
            }
        }
        Event::CollectWindowClosed => conversation.collecting = false,
        Event::Idle => {
            if conversation.is_idle() {
                conversation.ended = true;
                actions.push(Action::End);
                return actions;
            }
        }
        Event::Stop => actions.push(Action::Abort),
        Event::SteerRefused(item) => conversation.queue.push_back(item),
        Event::Shutdown => {
            conversation.ended = true;
            if conversation.run {
                actions.push(Action::Drain);
            }
            actions.push(Action::End);
            return actions;
        }
    }
    conversation.settle(busy, &mut actions);
    actions
}

impl<I: Queued> Conversation<I> {
    fn arrive(&mut self, item: I, busy: &BusyPolicy, limit: u32, actions: &mut Vec<Action<I>>) {
        if let BusyPolicy::Collect { window } = busy {
            self.queue.push_back(item);
            if !self.collecting {
                self.collecting = true;
                actions.push(Action::CollectFor(*window));
            }
            return;
        }
        let full = u32::try_from(self.queue.len()).unwrap_or(u32::MAX) >= limit;
        match (self.run, busy) {
            (true, BusyPolicy::Steer) => actions.push(Action::Steer(item)),
            (true, BusyPolicy::Interrupt) => {
                actions.push(Action::Abort);
                self.queue.push_back(item);
            }
            _ if full => actions.push(Action::Overflow(item)),
            _ => self.queue.push_back(item),
        }
    }

    /// What follows from where the conversation stands: a run when its lane is held and items
    /// wait, a request for the lane when it is not, the lane let go when nothing waits.
    fn settle(&mut self, busy: &BusyPolicy, actions: &mut Vec<Action<I>>) {
        if self.collecting || self.run {
            return;
        }
        if self.queue.is_empty() {
            self.hold = Hold::Released;
            actions.push(Action::ReleaseLane);
            return;
        }
        match self.hold {
            Hold::Held => {
                let resuming = self.queue.front().is_some_and(Queued::resumes);
                let batch: Vec<I> = match busy {
                    BusyPolicy::Collect { .. } if !resuming => self.queue.drain(..).collect(),
                    _ => self.queue.pop_front().into_iter().collect(),
                };
                self.run = true;
                actions.push(Action::StartRun {
                    resume: resuming && batch.len() == 1,
                    batch,
                });
            }
            Hold::Released | Hold::Asking => {
                self.hold = Hold::Asking;
                actions.push(Action::AskSlot);
            }
            Hold::Backoff => {}
        }
    }
}

impl<I> Conversation<I> {
    fn is_idle(&self) -> bool {
        !self.run && !self.collecting && self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Item(&'static str);

    impl Queued for Item {
        fn resumes(&self) -> bool {
            self.0.starts_with('r')
        }
    }

    const LIMIT: u32 = 2;

    fn conversation(
        queue: &[&'static str],
        run: bool,
        hold: Hold,
        failures: u32,
        collecting: bool,
    ) -> Conversation<Item> {
        Conversation {
            queue: queue.iter().map(|name| Item(name)).collect(),
            run,
            hold,
            failures,
            collecting,
            ended: false,
        }
    }

    /// The states of the table, each named as [`shown`] shows it.
    fn states() -> Vec<Conversation<Item>> {
        let mut ended = Conversation::new();
        ended.ended = true;
        vec![
            conversation(&[], false, Hold::Released, 0, false),
            conversation(&["a"], false, Hold::Asking, 0, false),
            conversation(&["r", "a"], false, Hold::Asking, 0, false),
            conversation(&["a"], false, Hold::Backoff, 2, false),
            conversation(&[], true, Hold::Held, 0, false),
            conversation(&["a", "c"], true, Hold::Held, 0, false),
            conversation(&["a"], true, Hold::Held, 0, true),
            conversation(&["a"], false, Hold::Asking, 0, true),
            conversation(&["a"], false, Hold::Held, 0, true),
            ended,
        ]
    }

    /// Every event, once; a new variant does not compile here until it is in the table.
    fn events() -> Vec<Event<Item>> {
        let every = |event: &Event<Item>| match event {
            Event::Item(_)
            | Event::RunFinished
            | Event::SlotGranted
            | Event::LaneOpenFailed
            | Event::RetryDue
            | Event::CollectWindowClosed
            | Event::Idle
            | Event::Stop
            | Event::SteerRefused(_)
            | Event::Shutdown => {}
        };
        let events = vec![
            Event::Item(Item("b")),
            Event::RunFinished,
            Event::SlotGranted,
            Event::LaneOpenFailed,
            Event::RetryDue,
            Event::CollectWindowClosed,
            Event::Idle,
            Event::Stop,
            Event::SteerRefused(Item("b")),
            Event::Shutdown,
        ];
        events.iter().for_each(every);
        events
    }

    /// Every busy policy, once; a new one does not compile here until it is in the table.
    fn policies() -> [BusyPolicy; 4] {
        let policies = [
            BusyPolicy::Followup,
            BusyPolicy::Steer,
            BusyPolicy::Collect {
                window: Duration::from_secs(2),
            },
            BusyPolicy::Interrupt,
        ];
        for policy in &policies {
            match policy {
                BusyPolicy::Followup
                | BusyPolicy::Steer
                | BusyPolicy::Collect { .. }
                | BusyPolicy::Interrupt => {}
            }
        }
        policies
    }

    fn names(items: impl IntoIterator<Item = Item>) -> String {
        items
            .into_iter()
            .map(|item| item.0)
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn shown(conversation: &Conversation<Item>) -> String {
        let Conversation {
            queue,
            run,
            hold,
            failures,
            collecting,
            ended,
        } = conversation;
        if *ended {
            return "ended".to_owned();
        }
        let mut parts = vec![
            match hold {
                Hold::Released => "released",
                Hold::Asking => "asking",
                Hold::Held => "held",
                Hold::Backoff => "backoff",
            }
            .to_owned(),
        ];
        if *run {
            parts.push("run".to_owned());
        }
        parts.push(format!("[{}]", names(queue.iter().cloned())));
        if *collecting {
            parts.push("collecting".to_owned());
        }
        if *failures > 0 {
            parts.push(format!("failures {failures}"));
        }
        parts.join(" ")
    }

    fn action(action: Action<Item>) -> String {
        match action {
            Action::StartRun { batch, resume } => {
                let resuming = if resume { " resuming" } else { "" };
                format!("start [{}]{resuming}", names(batch))
            }
            Action::Steer(item) => format!("steer {}", item.0),
            Action::Abort => "abort".to_owned(),
            Action::Overflow(item) => format!("overflow {}", item.0),
            Action::AskSlot => "ask".to_owned(),
            Action::RetryIn(wait) => format!("retry in {wait:?}"),
            Action::CollectFor(window) => format!("collect for {window:?}"),
            Action::ReleaseLane => "release".to_owned(),
            Action::Drain => "drain".to_owned(),
            Action::End => "end".to_owned(),
        }
    }

    fn outcome(state: &Conversation<Item>, event: &Event<Item>, busy: &BusyPolicy) -> String {
        let mut next = state.clone();
        let actions = step(&mut next, event.clone(), busy, LIMIT);
        let actions: Vec<String> = actions.into_iter().map(action).collect();
        format!("{} / {}", shown(&next), actions.join(", "))
    }

    /// For each state of [`states`] and each event of [`events`] (the item `b` for both items),
    /// with a queue limit of 2: the state after and the actions, the same under every busy
    /// policy, or per policy (followup, steer, collect with a 2 s window, interrupt).
    const TABLE: &[(&str, &str, &str)] = &[
        // Nothing to do, the lane let go: the idle time runs.
        (
            "released []",
            "item",
            "followup: asking [b] / ask | steer: asking [b] / ask | collect: released [b] collecting / collect for 2s | interrupt: asking [b] / ask",
        ),
        ("released []", "run finished", "released [] / release"),
        ("released []", "slot granted", "released [] / release"),
        ("released []", "lane open failed", "released [] / release"),
        ("released []", "retry due", "released [] / release"),
        (
            "released []",
            "collect window closed",
            "released [] / release",
        ),
        ("released []", "idle", "ended / end"),
        ("released []", "stop", "released [] / abort, release"),
        ("released []", "steer refused", "asking [b] / ask"),
        ("released []", "shutdown", "ended / end"),
        // An item waits for a slot.
        (
            "asking [a]",
            "item",
            "followup: asking [a b] / ask | steer: asking [a b] / ask | collect: asking [a b] collecting / collect for 2s | interrupt: asking [a b] / ask",
        ),
        ("asking [a]", "run finished", "asking [a] / ask"),
        ("asking [a]", "slot granted", "held run [] / start [a]"),
        (
            "asking [a]",
            "lane open failed",
            "backoff [a] failures 1 / retry in 100ms",
        ),
        ("asking [a]", "retry due", "asking [a] / ask"),
        ("asking [a]", "collect window closed", "asking [a] / ask"),
        ("asking [a]", "idle", "asking [a] / ask"),
        ("asking [a]", "stop", "asking [a] / abort, ask"),
        ("asking [a]", "steer refused", "asking [a b] / ask"),
        ("asking [a]", "shutdown", "ended / end"),
        // A resumption waits first, the queue at its limit.
        (
            "asking [r a]",
            "item",
            "followup: asking [r a] / overflow b, ask | steer: asking [r a] / overflow b, ask | collect: asking [r a b] collecting / collect for 2s | interrupt: asking [r a] / overflow b, ask",
        ),
        ("asking [r a]", "run finished", "asking [r a] / ask"),
        (
            "asking [r a]",
            "slot granted",
            "held run [a] / start [r] resuming",
        ),
        (
            "asking [r a]",
            "lane open failed",
            "backoff [r a] failures 1 / retry in 100ms",
        ),
        ("asking [r a]", "retry due", "asking [r a] / ask"),
        (
            "asking [r a]",
            "collect window closed",
            "asking [r a] / ask",
        ),
        ("asking [r a]", "idle", "asking [r a] / ask"),
        ("asking [r a]", "stop", "asking [r a] / abort, ask"),
        ("asking [r a]", "steer refused", "asking [r a b] / ask"),
        ("asking [r a]", "shutdown", "ended / end"),
        // The lane failed to open twice: the item waits for the retry.
        (
            "backoff [a] failures 2",
            "item",
            "followup: backoff [a b] failures 2 /  | steer: backoff [a b] failures 2 /  | collect: backoff [a b] collecting failures 2 / collect for 2s | interrupt: backoff [a b] failures 2 / ",
        ),
        (
            "backoff [a] failures 2",
            "run finished",
            "backoff [a] failures 2 / ",
        ),
        (
            "backoff [a] failures 2",
            "slot granted",
            "held run [] / start [a]",
        ),
        (
            "backoff [a] failures 2",
            "lane open failed",
            "backoff [a] failures 2 / ",
        ),
        (
            "backoff [a] failures 2",
            "retry due",
            "asking [a] failures 2 / ask",
        ),
        (
            "backoff [a] failures 2",
            "collect window closed",
            "backoff [a] failures 2 / ",
        ),
        (
            "backoff [a] failures 2",
            "idle",
            "backoff [a] failures 2 / ",
        ),
        (
            "backoff [a] failures 2",
            "stop",
            "backoff [a] failures 2 / abort",
        ),
        (
            "backoff [a] failures 2",
            "steer refused",
            "backoff [a b] failures 2 / ",
        ),
        ("backoff [a] failures 2", "shutdown", "ended / end"),
        // A run is active, nothing waits.
        (
            "held run []",
            "item",
            "followup: held run [b] /  | steer: held run [] / steer b | collect: held run [b] collecting / collect for 2s | interrupt: held run [b] / abort",
        ),
        ("held run []", "run finished", "released [] / release"),
        ("held run []", "slot granted", "held run [] / "),
        ("held run []", "lane open failed", "held run [] / "),
        ("held run []", "retry due", "held run [] / "),
        ("held run []", "collect window closed", "held run [] / "),
        ("held run []", "idle", "held run [] / "),
        ("held run []", "stop", "held run [] / abort"),
        ("held run []", "steer refused", "held run [b] / "),
        ("held run []", "shutdown", "ended / drain, end"),
        // A run is active and the queue is at its limit.
        (
            "held run [a c]",
            "item",
            "followup: held run [a c] / overflow b | steer: held run [a c] / steer b | collect: held run [a c b] collecting / collect for 2s | interrupt: held run [a c b] / abort",
        ),
        (
            "held run [a c]",
            "run finished",
            "followup: held run [c] / start [a] | steer: held run [c] / start [a] | collect: held run [] / start [a c] | interrupt: held run [c] / start [a]",
        ),
        ("held run [a c]", "slot granted", "held run [a c] / "),
        ("held run [a c]", "lane open failed", "held run [a c] / "),
        ("held run [a c]", "retry due", "held run [a c] / "),
        (
            "held run [a c]",
            "collect window closed",
            "held run [a c] / ",
        ),
        ("held run [a c]", "idle", "held run [a c] / "),
        ("held run [a c]", "stop", "held run [a c] / abort"),
        ("held run [a c]", "steer refused", "held run [a c b] / "),
        ("held run [a c]", "shutdown", "ended / drain, end"),
        // The collect window is open while a run is active.
        (
            "held run [a] collecting",
            "item",
            "followup: held run [a b] collecting /  | steer: held run [a] collecting / steer b | collect: held run [a b] collecting /  | interrupt: held run [a b] collecting / abort",
        ),
        (
            "held run [a] collecting",
            "run finished",
            "held [a] collecting / ",
        ),
        (
            "held run [a] collecting",
            "slot granted",
            "held run [a] collecting / ",
        ),
        (
            "held run [a] collecting",
            "lane open failed",
            "held run [a] collecting / ",
        ),
        (
            "held run [a] collecting",
            "retry due",
            "held run [a] collecting / ",
        ),
        (
            "held run [a] collecting",
            "collect window closed",
            "held run [a] / ",
        ),
        (
            "held run [a] collecting",
            "idle",
            "held run [a] collecting / ",
        ),
        (
            "held run [a] collecting",
            "stop",
            "held run [a] collecting / abort",
        ),
        (
            "held run [a] collecting",
            "steer refused",
            "held run [a b] collecting / ",
        ),
        ("held run [a] collecting", "shutdown", "ended / drain, end"),
        // The collect window is open while the item waits for a slot.
        (
            "asking [a] collecting",
            "item",
            "asking [a b] collecting / ",
        ),
        (
            "asking [a] collecting",
            "run finished",
            "asking [a] collecting / ",
        ),
        (
            "asking [a] collecting",
            "slot granted",
            "held [a] collecting / ",
        ),
        (
            "asking [a] collecting",
            "lane open failed",
            "backoff [a] collecting failures 1 / retry in 100ms",
        ),
        (
            "asking [a] collecting",
            "retry due",
            "asking [a] collecting / ",
        ),
        (
            "asking [a] collecting",
            "collect window closed",
            "asking [a] / ask",
        ),
        ("asking [a] collecting", "idle", "asking [a] collecting / "),
        (
            "asking [a] collecting",
            "stop",
            "asking [a] collecting / abort",
        ),
        (
            "asking [a] collecting",
            "steer refused",
            "asking [a b] collecting / ",
        ),
        ("asking [a] collecting", "shutdown", "ended / end"),
        // The collect window is open, the lane held.
        ("held [a] collecting", "item", "held [a b] collecting / "),
        (
            "held [a] collecting",
            "run finished",
            "held [a] collecting / ",
        ),
        (
            "held [a] collecting",
            "slot granted",
            "held [a] collecting / ",
        ),
        (
            "held [a] collecting",
            "lane open failed",
            "held [a] collecting / ",
        ),
        ("held [a] collecting", "retry due", "held [a] collecting / "),
        (
            "held [a] collecting",
            "collect window closed",
            "held run [] / start [a]",
        ),
        ("held [a] collecting", "idle", "held [a] collecting / "),
        ("held [a] collecting", "stop", "held [a] collecting / abort"),
        (
            "held [a] collecting",
            "steer refused",
            "held [a b] collecting / ",
        ),
        ("held [a] collecting", "shutdown", "ended / end"),
        // Ended: nothing more happens.
        ("ended", "item", "ended / "),
        ("ended", "run finished", "ended / "),
        ("ended", "slot granted", "ended / "),
        ("ended", "lane open failed", "ended / "),
        ("ended", "retry due", "ended / "),
        ("ended", "collect window closed", "ended / "),
        ("ended", "idle", "ended / "),
        ("ended", "stop", "ended / "),
        ("ended", "steer refused", "ended / "),
        ("ended", "shutdown", "ended / "),
    ];

    fn event_name(event: &Event<Item>) -> &'static str {
        match event {
            Event::Item(_) => "item",
            Event::RunFinished => "run finished",
            Event::SlotGranted => "slot granted",
            Event::LaneOpenFailed => "lane open failed",
            Event::RetryDue => "retry due",
            Event::CollectWindowClosed => "collect window closed",
            Event::Idle => "idle",
            Event::Stop => "stop",
            Event::SteerRefused(_) => "steer refused",
            Event::Shutdown => "shutdown",
        }
    }

    #[test]
    fn every_state_meets_every_event_under_every_policy_as_the_table_says() {
        let mut rows = TABLE.iter();
        let mut wrong = Vec::new();
        for state in states() {
            for event in events() {
                let row = rows.next().expect("a row for every state and event");
                assert_eq!(
                    (row.0, row.1),
                    (shown(&state).as_str(), event_name(&event)),
                    "the table's rows follow the states and events in order"
                );
                let per_policy: Vec<(String, String)> = policies()
                    .iter()
                    .map(|busy| (busy.as_str().to_owned(), outcome(&state, &event, busy)))
                    .collect();
                let got = if per_policy.iter().all(|(_, got)| *got == per_policy[0].1) {
                    per_policy[0].1.clone()
                } else {
                    per_policy
                        .iter()
                        .map(|(policy, got)| format!("{policy}: {got}"))
                        .collect::<Vec<_>>()
                        .join(" | ")
                };
                if got != row.2 {
                    wrong.push(format!(
                        "{} + {}:\n  want {}\n  got  {got}",
                        row.0, row.1, row.2
                    ));
                }
            }
        }
        assert!(rows.next().is_none(), "no row without its state and event");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn every_hold_is_in_the_table() {
        let holds: Vec<Hold> = states().iter().map(|state| state.hold).collect();
        for hold in [Hold::Released, Hold::Asking, Hold::Held, Hold::Backoff] {
            match hold {
                Hold::Released | Hold::Asking | Hold::Held | Hold::Backoff => {}
            }
            assert!(holds.contains(&hold), "{hold:?}");
        }
    }

    /// Drives a conversation through `events`, collecting what it does.
    fn drive(busy: &BusyPolicy, events: Vec<Event<Item>>) -> Vec<String> {
        let mut conversation = Conversation::new();
        events
            .into_iter()
            .flat_map(|event| step(&mut conversation, event, busy, LIMIT))
            .map(action)
            .collect()
    }

    #[test]
    fn collected_items_run_as_one_batch_once_the_window_closes() {
        let collect = BusyPolicy::Collect {
            window: Duration::from_secs(3),
        };
        let done = drive(
            &collect,
            vec![
                Event::Item(Item("a")),
                Event::Item(Item("b")),
                Event::SlotGranted,
                Event::Item(Item("c")),
                Event::CollectWindowClosed,
                Event::RunFinished,
            ],
        );
        assert_eq!(
            done,
            ["collect for 3s", "start [a b c]", "release"],
            "the window holds the run back until every item is in"
        );
    }

    #[test]
    fn a_lane_that_keeps_failing_is_retried_later_and_later_and_the_items_wait() {
        let done = drive(
            &BusyPolicy::Followup,
            vec![
                Event::Item(Item("a")),
                Event::LaneOpenFailed,
                Event::RetryDue,
                Event::LaneOpenFailed,
                Event::Item(Item("b")),
                Event::RetryDue,
                Event::LaneOpenFailed,
                Event::RetryDue,
                Event::SlotGranted,
                Event::RunFinished,
                Event::RunFinished,
            ],
        );
        assert_eq!(
            done,
            [
                "ask",
                "retry in 100ms",
                "ask",
                "retry in 200ms",
                "ask",
                "retry in 400ms",
                "ask",
                "start [a]",
                "start [b]",
                "release"
            ]
        );
    }

    #[test]
    fn an_idle_conversation_ends_and_a_late_item_keeps_it_going() {
        let done = drive(
            &BusyPolicy::Followup,
            vec![
                Event::Item(Item("a")),
                Event::SlotGranted,
                Event::RunFinished,
                Event::Item(Item("b")),
                Event::Idle,
                Event::SlotGranted,
                Event::RunFinished,
                Event::Idle,
                Event::Item(Item("c")),
            ],
        );
        assert_eq!(
            done,
            [
                "ask",
                "start [a]",
                "release",
                "ask",
                "ask",
                "start [b]",
                "release",
                "end"
            ]
        );
    }
}
