//! One conversation's task: it waits for what happens to the conversation, steps
//! [`perch_core::converse`]'s machine, which decides everything, and carries out its actions
//! through [`Talk`], the conversation's effects (its lane, its runs, its replies).

use crate::channel::BoxFuture;
use perch_core::config::BusyPolicy;
use perch_core::converse::{Action, Conversation, Event, Queued, step};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a conversation's task does to the world: its lane, its runs and its replies.
pub(super) trait Talk: Send + Sync + 'static {
    type Item: Queued + Send + 'static;
    /// A hold on the lane; the lane may close once every hold on it is dropped.
    type Lease: Send + Sync + 'static;
    /// A slot in which to hold the lane.
    type Slot: Send + 'static;

    /// Another hold on the lane when someone already holds it: no slot is needed.
    fn join(&self) -> Option<Self::Lease>;

    /// Waits for a slot, in turn with the other waiters; dropping the wait gives up its place.
    fn turn(&self) -> BoxFuture<'_, Self::Slot>;

    /// Holds the lane in `slot`, opened first if it is not open. Awaited to its end.
    fn hold(&self, slot: Self::Slot) -> BoxFuture<'_, Result<Self::Lease, String>>;

    /// Starts a run of the held lane on `batch` (as a resumption when `resume`), which answers
    /// and consumes the items; the handle finishes with it.
    fn run(&self, lease: &Self::Lease, batch: Vec<Self::Item>, resume: bool) -> JoinHandle<()>;

    /// Gives `item` to the active run and consumes it; gives it back when the lane has no
    /// active run.
    fn steer<'a>(
        &'a self,
        lease: &'a Self::Lease,
        item: Self::Item,
    ) -> BoxFuture<'a, Result<Option<Self::Item>, String>>;

    /// Aborts what runs in the lane (through `lease` when the conversation holds it).
    fn abort(&self, lease: Option<&Self::Lease>);

    /// Answers `item` with the overflow notice and consumes it.
    fn overflow(&self, item: Self::Item) -> BoxFuture<'_, Result<(), String>>;

    /// Lets `run` finish within the drain, then aborts it.
    fn drain<'a>(
        &'a self,
        lease: Option<&'a Self::Lease>,
        run: JoinHandle<()>,
    ) -> BoxFuture<'a, ()>;

    /// Asks to end, having taken `taken` items: `true` once nothing more can reach this
    /// conversation, `false` when an item is on its way to it.
    fn retire(&self, taken: u64) -> BoxFuture<'_, bool>;

    /// Tells the owner the lane could not be opened (`error`), with what the machine decided.
    fn open_failed(&self, error: &str, failures: u32, waiting: usize, wait: Duration);
}

/// What a conversation's machine is given besides its events: the channel's busy policy and
/// queue limit, and how long it stays idle before it ends.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    pub(super) busy: BusyPolicy,
    pub(super) queue_limit: u32,
    pub(super) idle_after: Duration,
}

/// What the task holds and waits for, as the machine's actions left it.
struct Shell<T: Talk> {
    lease: Option<T::Lease>,
    run: Option<JoinHandle<()>>,
    asking: bool,
    retry_at: Option<Instant>,
    collect_at: Option<Instant>,
    idle_at: Option<Instant>,
    /// The items received, for [`Talk::retire`].
    taken: u64,
    /// Why the lane last failed to open, for the log line of the retry.
    open_error: Option<String>,
}

/// What woke the task.
enum Woken<T: Talk> {
    Event(Event<T::Item>),
    Slot(T::Slot),
    IdleOver,
}

/// Runs one conversation until it ends (idle, or at shutdown), from the events sent to it.
pub(super) async fn converse<T: Talk>(
    talk: T,
    mut events: mpsc::UnboundedReceiver<Event<T::Item>>,
    rules: Rules,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let mut conversation = Conversation::new();
    let mut shell: Shell<T> = Shell {
        lease: None,
        run: None,
        asking: false,
        retry_at: None,
        collect_at: None,
        idle_at: None,
        taken: 0,
        open_error: None,
    };
    let mut next: VecDeque<Event<T::Item>> = VecDeque::new();
    loop {
        let event = match next.pop_front() {
            Some(event) => event,
            None => match shell.wait(&talk, &mut events, &shutdown).await {
                Woken::Event(event) => event,
                Woken::Slot(slot) => {
                    shell.asking = false;
                    match talk.hold(slot).await {
                        Ok(lease) => {
                            shell.lease = Some(lease);
                            Event::SlotGranted
                        }
                        Err(error) => {
                            shell.open_error = Some(error);
                            Event::LaneOpenFailed
                        }
                    }
                }
                Woken::IdleOver => {
                    shell.idle_at = None;
                    if !talk.retire(shell.taken).await {
                        continue;
                    }
                    Event::Idle
                }
            },
        };
        let event = if shutdown.is_cancelled() {
            Event::Shutdown
        } else {
            event
        };
        if matches!(event, Event::Item(_)) {
            shell.taken += 1;
        }
        shell.idle_at = None;
        for action in step(&mut conversation, event, &rules.busy, rules.queue_limit) {
            match action {
                Action::StartRun { batch, resume } => {
                    let lease = shell
                        .lease
                        .as_ref()
                        .expect("the machine starts a run only in a lane it holds");
                    shell.run = Some(talk.run(lease, batch, resume));
                }
                Action::Steer(item) => {
                    let lease = shell
                        .lease
                        .as_ref()
                        .expect("the machine steers only while its run holds the lane");
                    if let Some(item) = talk.steer(lease, item).await? {
                        next.push_back(Event::SteerRefused(item));
                    }
                }
                Action::Abort => talk.abort(shell.lease.as_ref()),
                Action::Overflow(item) => talk.overflow(item).await?,
                Action::AskSlot => {
                    if shell.lease.is_some() {
                        next.push_back(Event::SlotGranted);
                    } else if let Some(lease) = talk.join() {
                        shell.lease = Some(lease);
                        next.push_back(Event::SlotGranted);
                    } else {
                        shell.asking = true;
                    }
                }
                Action::RetryIn(wait) => {
                    let error = shell.open_error.take().unwrap_or_default();
                    talk.open_failed(
                        &error,
                        conversation.failures(),
                        conversation.waiting(),
                        wait,
                    );
                    shell.retry_at = Some(Instant::now() + wait);
                }
                Action::CollectFor(window) => shell.collect_at = Some(Instant::now() + window),
                Action::ReleaseLane => {
                    shell.lease = None;
                    shell.idle_at = Some(Instant::now() + rules.idle_after);
                }
                Action::Drain => {
                    if let Some(run) = shell.run.take() {
                        talk.drain(shell.lease.as_ref(), run).await;
                    }
                }
                Action::End => return Ok(()),
            }
        }
    }
}

impl<T: Talk> Shell<T> {
    /// Waits for the next thing to happen: shutdown first, then the run's end, an event sent
    /// to the conversation, a slot, and the machine's timers.
    async fn wait(
        &mut self,
        talk: &T,
        events: &mut mpsc::UnboundedReceiver<Event<T::Item>>,
        shutdown: &CancellationToken,
    ) -> Woken<T> {
        let finished = async {
            match self.run.as_mut() {
                Some(run) => {
                    let _ = run.await;
                }
                None => std::future::pending().await,
            }
        };
        let at = |instant: Option<Instant>| async move {
            match instant {
                Some(instant) => tokio::time::sleep_until(instant).await,
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            biased;
            () = shutdown.cancelled() => Woken::Event(Event::Shutdown),
            () = finished => Woken::Event(Event::RunFinished),
            event = events.recv() => Woken::Event(event.unwrap_or(Event::Shutdown)),
            slot = talk.turn(), if self.asking => Woken::Slot(slot),
            () = at(self.retry_at) => Woken::Event(Event::RetryDue),
            () = at(self.collect_at) => Woken::Event(Event::CollectWindowClosed),
            () = at(self.idle_at) => Woken::IdleOver,
        };
        match &woken {
            Woken::Event(Event::RunFinished) => self.run = None,
            Woken::Event(Event::RetryDue) => self.retry_at = None,
            Woken::Event(Event::CollectWindowClosed) => self.collect_at = None,
            _ => {}
        }
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Debug)]
    struct Item {
        name: &'static str,
        resumes: bool,
    }

    impl Queued for Item {
        fn resumes(&self) -> bool {
            self.resumes
        }
    }

    fn item(name: &'static str) -> Event<Item> {
        Event::Item(Item {
            name,
            resumes: false,
        })
    }

    /// A lane that is free or not, opens or fails to, and runs for a set time; every call
    /// noted with the (paused) time since the test started, in milliseconds.
    struct FakeLane {
        history: Arc<Mutex<Vec<(u64, String)>>>,
        started: Instant,
        /// How long each run takes.
        runs_for: Duration,
        /// Whether another holder has the lane, so it is joined without a slot.
        joinable: bool,
        /// Opens that fail before one succeeds.
        failing_opens: Mutex<u32>,
        /// When a slot is first free, since the start.
        slot_from: Duration,
        /// Whether the lane has a run to steer into.
        steer_takes: bool,
        /// Whether an item is on its way when the conversation asks to end.
        late_item: Mutex<bool>,
    }

    impl FakeLane {
        fn note(&self, what: String) {
            let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap();
            self.history.lock().unwrap().push((millis, what));
        }
    }

    fn names(items: &[Item]) -> String {
        items
            .iter()
            .map(|item| item.name)
            .collect::<Vec<_>>()
            .join(" ")
    }

    impl Talk for Arc<FakeLane> {
        type Item = Item;
        type Lease = ();
        type Slot = ();

        fn join(&self) -> Option<()> {
            self.joinable.then(|| self.note("joined".into()))
        }

        fn turn(&self) -> BoxFuture<'_, ()> {
            Box::pin(tokio::time::sleep_until(self.started + self.slot_from))
        }

        fn hold(&self, (): ()) -> BoxFuture<'_, Result<(), String>> {
            Box::pin(async move {
                let mut failing = self.failing_opens.lock().unwrap();
                if *failing > 0 {
                    *failing -= 1;
                    self.note("open failed".into());
                    return Err("no such lane".into());
                }
                self.note("held".into());
                Ok(())
            })
        }

        fn run(&self, (): &(), batch: Vec<Item>, resume: bool) -> JoinHandle<()> {
            let resuming = if resume { " resuming" } else { "" };
            self.note(format!("run [{}]{resuming}", names(&batch)));
            let lane = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(lane.runs_for).await;
                lane.note(format!("answered [{}]", names(&batch)));
            })
        }

        fn steer<'a>(
            &'a self,
            (): &'a (),
            item: Item,
        ) -> BoxFuture<'a, Result<Option<Item>, String>> {
            Box::pin(async move {
                if self.steer_takes {
                    self.note(format!("steered {}", item.name));
                    Ok(None)
                } else {
                    self.note(format!("steer of {} refused", item.name));
                    Ok(Some(item))
                }
            })
        }

        fn abort(&self, lease: Option<&()>) {
            self.note(format!("abort (held: {})", lease.is_some()));
        }

        fn overflow(&self, item: Item) -> BoxFuture<'_, Result<(), String>> {
            Box::pin(async move {
                self.note(format!("overflow {}", item.name));
                Ok(())
            })
        }

        fn drain<'a>(&'a self, _lease: Option<&'a ()>, run: JoinHandle<()>) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                self.note("drain".into());
                let _ = run.await;
            })
        }

        fn retire(&self, taken: u64) -> BoxFuture<'_, bool> {
            Box::pin(async move {
                let late = std::mem::take(&mut *self.late_item.lock().unwrap());
                self.note(format!("retire after {taken} (late item: {late})"));
                !late
            })
        }

        fn open_failed(&self, error: &str, failures: u32, waiting: usize, wait: Duration) {
            self.note(format!(
                "open failed {failures} time(s), {waiting} waiting, retry in {}ms: {error}",
                wait.as_millis()
            ));
        }
    }

    /// A conversation under `busy` (queue limit 2, idle after 2 s) on a lane set up by `lane`,
    /// fed `script`: each entry is sent after the given milliseconds since the start. Shut down
    /// at `stop_at` ms unless it ended before; returns the history.
    async fn conversation(
        busy: BusyPolicy,
        lane: impl FnOnce(&mut FakeLane),
        script: Vec<(u64, Event<Item>)>,
        stop_at: u64,
    ) -> Vec<(u64, String)> {
        let started = Instant::now();
        let mut fake = FakeLane {
            history: Arc::default(),
            started,
            runs_for: Duration::from_secs(1),
            joinable: false,
            failing_opens: Mutex::new(0),
            slot_from: Duration::ZERO,
            steer_takes: true,
            late_item: Mutex::new(false),
        };
        lane(&mut fake);
        let fake = Arc::new(fake);
        let (send, events) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let rules = Rules {
            busy,
            queue_limit: 2,
            idle_after: Duration::from_secs(2),
        };
        let task = tokio::spawn(converse(Arc::clone(&fake), events, rules, shutdown.clone()));
        let feeding = async {
            for (at, event) in script {
                tokio::time::sleep_until(started + Duration::from_millis(at)).await;
                let _ = send.send(event);
            }
            tokio::time::sleep_until(started + Duration::from_millis(stop_at)).await;
            shutdown.cancel();
            std::future::pending::<()>().await;
        };
        tokio::select! {
            ended = task => ended.unwrap().unwrap(),
            () = feeding => {}
        }
        fake.note("ended".into());
        fake.history.lock().unwrap().clone()
    }

    fn history(expected: &[(u64, &str)]) -> Vec<(u64, String)> {
        expected
            .iter()
            .map(|(at, what)| (*at, (*what).to_owned()))
            .collect()
    }

    const COLLECT: BusyPolicy = BusyPolicy::Collect {
        window: Duration::from_millis(500),
    };

    #[tokio::test(start_paused = true)]
    async fn an_item_during_a_run_waits_for_it_under_followup() {
        let got = conversation(
            BusyPolicy::Followup,
            |_| {},
            vec![(0, item("a")), (300, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (1000, "answered [a]"),
                (1000, "run [b]"),
                (2000, "answered [b]"),
                (4000, "retire after 2 (late item: false)"),
                (4000, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_during_a_run_is_steered_into_it_or_waits_when_the_lane_says_no_run() {
        let got = conversation(
            BusyPolicy::Steer,
            |_| {},
            vec![(0, item("a")), (300, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (300, "steered b"),
                (1000, "answered [a]"),
                (3000, "retire after 2 (late item: false)"),
                (3000, "ended"),
            ])
        );
        let got = conversation(
            BusyPolicy::Steer,
            |lane| lane.steer_takes = false,
            vec![(0, item("a")), (300, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (300, "steer of b refused"),
                (1000, "answered [a]"),
                (1000, "run [b]"),
                (2000, "answered [b]"),
                (4000, "retire after 2 (late item: false)"),
                (4000, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_during_a_run_aborts_it_and_runs_next_under_interrupt() {
        let got = conversation(
            BusyPolicy::Interrupt,
            |_| {},
            vec![(0, item("a")), (300, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (300, "abort (held: true)"),
                (1000, "answered [a]"),
                (1000, "run [b]"),
                (2000, "answered [b]"),
                (4000, "retire after 2 (late item: false)"),
                (4000, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn items_within_the_collect_window_run_as_one_turn() {
        let got = conversation(
            COLLECT,
            |_| {},
            vec![
                (0, item("a")),
                (200, item("b")),
                (400, item("c")),
                (700, item("d")),
            ],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (500, "held"),
                (500, "run [a b c]"),
                (1500, "answered [a b c]"),
                (1500, "run [d]"),
                (2500, "answered [d]"),
                (4500, "retire after 4 (late item: false)"),
                (4500, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_at_its_limit_answers_the_next_item_with_the_overflow_notice() {
        let got = conversation(
            BusyPolicy::Followup,
            |_| {},
            vec![
                (0, item("a")),
                (100, item("b")),
                (200, item("c")),
                (300, item("d")),
            ],
            10_000,
        )
        .await;
        assert_eq!(
            got[..4],
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (300, "overflow d"),
                (1000, "answered [a]"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_that_fails_to_open_is_retried_after_the_machines_delay() {
        let got = conversation(
            BusyPolicy::Followup,
            |lane| lane.failing_opens = Mutex::new(2),
            vec![(0, item("a")), (50, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got[..8],
            history(&[
                (0, "open failed"),
                (
                    0,
                    "open failed 1 time(s), 1 waiting, retry in 100ms: no such lane"
                ),
                (100, "open failed"),
                (
                    100,
                    "open failed 2 time(s), 2 waiting, retry in 200ms: no such lane"
                ),
                (300, "held"),
                (300, "run [a]"),
                (1300, "answered [a]"),
                (1300, "run [b]"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_waits_for_a_slot_and_joins_a_lane_someone_holds_at_once() {
        let got = conversation(
            BusyPolicy::Followup,
            |lane| lane.slot_from = Duration::from_millis(400),
            vec![(0, item("a"))],
            10_000,
        )
        .await;
        assert_eq!(got[..2], history(&[(400, "held"), (400, "run [a]")]));
        let got = conversation(
            BusyPolicy::Followup,
            |lane| lane.joinable = true,
            vec![(0, item("a"))],
            10_000,
        )
        .await;
        assert_eq!(got[..2], history(&[(0, "joined"), (0, "run [a]")]));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_end_with_an_item_on_its_way_takes_the_item_first() {
        let got = conversation(
            BusyPolicy::Followup,
            |lane| lane.late_item = Mutex::new(true),
            vec![(0, item("a")), (3001, item("b"))],
            10_000,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (1000, "answered [a]"),
                (3000, "retire after 1 (late item: true)"),
                (3001, "held"),
                (3001, "run [b]"),
                (4001, "answered [b]"),
                (6001, "retire after 2 (late item: false)"),
                (6001, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_drains_the_active_run_and_leaves_the_waiting_items() {
        let got = conversation(
            BusyPolicy::Followup,
            |_| {},
            vec![(0, item("a")), (100, item("b"))],
            500,
        )
        .await;
        assert_eq!(
            got,
            history(&[
                (0, "held"),
                (0, "run [a]"),
                (500, "drain"),
                (1000, "answered [a]"),
                (1000, "ended"),
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumption_runs_alone_and_stop_aborts_the_run() {
        let resumed = Event::Item(Item {
            name: "r",
            resumes: true,
        });
        let got = conversation(
            COLLECT,
            |_| {},
            vec![(0, resumed), (0, item("a")), (600, Event::Stop)],
            10_000,
        )
        .await;
        assert_eq!(
            got[..5],
            history(&[
                (500, "held"),
                (500, "run [r] resuming"),
                (600, "abort (held: true)"),
                (1500, "answered [r]"),
                (1500, "run [a]"),
            ])
        );
    }
}
