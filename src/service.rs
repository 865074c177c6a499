//! `perch run`: the agent as a service. It holds the directory's lock, recovers the inbox,
//! outbox and lanes, connects every channel, and answers until it is told to stop.
//!
//! One inbound event goes: connector → inbox journal (fsynced) → acknowledged to the platform →
//! admission (age, bots, who may talk, addressing) → the channel's `on_message` hook → the
//! verdict, journaled under the event → the conversation's queue → its files saved under
//! `workspace/inbox/` → a lane run naming the event → the reply, its `attach:` lines checked,
//! through `format`, split to the platform's limit (the files on the last piece) → the outbox
//! (intent fsynced) → the platform → the receipt → the inbox item consumed.

use crate::agent::{LoadedAgent, LoadedChannel};
use crate::alert::Alerts;
use crate::channel::hooks::{ChannelHooks, HookVerdict};
use crate::channel::{Arrival, Connector, Delivery, DeliveryError, InboundEvent, OutboundFile};
use crate::control::{self, ControlRequest};
use crate::heartbeat::{self, Heartbeats, Job, JobEnd, Ledger, Mode, SchedulerSetup, Turned};
use crate::inbox::{Backlog, Inbox, PendingItem, Recorded, Verdict, consumes_id};
use crate::lane::{Input, Lane, RunLimits, Steered};
use crate::log::{Clock, LogError};
use crate::metrics::{DeliveryOutcome, Metrics};
use crate::model::Model;
use crate::notify::{Notifier, status_line};
use crate::outbox::{Outbox, OutboxRecord, Unsettled};
use crate::runtime::Runtime;
use crate::sandbox::MachineSetup;
use crate::starts;
use perch_core::admission::{Admission, Arrived, admit};
use perch_core::alert::AlertKind;
use perch_core::chat::{BotTurns, ChatCommand};
use perch_core::config::BusyPolicy;
use perch_core::control::{
    ChannelHealth, HeartbeatListed, HeartbeatRan, LiveStatus, Resumed, encode_reply,
};
use perch_core::delivery::{
    AttemptFailure, Attempts, NotSentBecause, Retry, Unreceipted, after_failure, lane_for,
    split_message,
};
use perch_core::heartbeat::{SlotOutcome, Target, Verdict as HeartbeatVerdict};
use perch_core::log::Outcome;
use perch_core::name::LaneName;
use perch_core::pairing::{Approval, Issued, Pairing, pairing_code};
use perch_core::prompt::Origin;
use perch_core::spend::RunKind;
use perch_core::terminal;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Makes the connector of one channel (the real platform, or a test's).
pub type ConnectorFactory =
    Arc<dyn Fn(&LoadedChannel) -> Result<Arc<dyn Connector>, String> + Send + Sync>;

/// Everything `perch run` needs besides the agent.
pub struct ServiceSetup {
    pub machine: MachineSetup,
    pub model: Arc<dyn Model>,
    pub connectors: ConnectorFactory,
    pub clock: Clock,
    pub limits: RunLimits,
    /// The first wait before reconnecting a dropped channel; it doubles up to a minute.
    pub reconnect: Duration,
    /// How often `HEARTBEAT.yml` is looked at for changes.
    pub heartbeat_reload: Duration,
    /// Tells systemd when the service is ready, alive and stopping.
    pub notifier: Notifier,
    /// How long a run in progress at shutdown may go on before it is aborted.
    pub drain: Duration,
    /// What the service counts (events, deliveries, runs, tool calls, tokens, heartbeats).
    pub metrics: Arc<Metrics>,
    /// Where `GET /metrics` is answered, when `--metrics` asked for it.
    pub metrics_listener: Option<tokio::net::TcpListener>,
    /// Set to serve one `perch heartbeat run` and stop, with no service running: channels are
    /// connected for delivery but not received from, and no scheduled slot fires.
    pub once: Option<HeartbeatOnce>,
}

/// One heartbeat run asked for on the command line, and where its end goes.
#[derive(Debug)]
pub struct HeartbeatOnce {
    pub task: String,
    pub dry_run: bool,
    pub end: tokio::sync::oneshot::Sender<Result<JobEnd, String>>,
}

/// How long past the drain the service waits for aborted runs to be recorded.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

impl std::fmt::Debug for ServiceSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSetup").finish_non_exhaustive()
    }
}

/// One connected channel.
struct Channel {
    loaded: LoadedChannel,
    connector: Arc<dyn Connector>,
    hooks: Mutex<ChannelHooks>,
    /// The channel's hook calls still running, abandoned ones included.
    hook_calls_running: Arc<std::sync::atomic::AtomicUsize>,
    health: std::sync::Mutex<Health>,
    /// Told when the channel stops or turns unhealthy.
    alerts: Alerts,
}

/// How a channel is doing, for `perch status`.
#[derive(Debug, Clone, Default)]
struct Health {
    /// `receiving`, `reconnecting: <why>` or `stopped: <why>`.
    connection: String,
    /// `on_message` failures in a row; from [`UNHEALTHY_AFTER`] on, the channel is reported
    /// unhealthy.
    hook_failures: u32,
    last_hook_error: Option<String>,
}

/// Hook failures in a row after which a channel is reported unhealthy.
const UNHEALTHY_AFTER: u32 = 5;

impl Channel {
    fn set_connection(&self, connection: String) {
        let stopped = connection.starts_with("stopped");
        let was_stopped = {
            let mut health = self
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::replace(&mut health.connection, connection.clone()).starts_with("stopped")
        };
        if stopped && !was_stopped {
            self.alerts.alert(
                AlertKind::ChannelUnhealthy,
                format!(
                    "channel {} is {connection}; the other channels keep working. Fix it, then \
                     restart perch.",
                    self.loaded.config.name
                ),
            );
        }
    }

    fn hook_result(&self, error: Option<&str>) {
        let turned_unhealthy = {
            let mut health = self
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match error {
                Some(error) => {
                    health.hook_failures += 1;
                    health.last_hook_error = Some(error.to_owned());
                }
                None => health.hook_failures = 0,
            }
            health.hook_failures == UNHEALTHY_AFTER
        };
        if let (true, Some(error)) = (turned_unhealthy, error) {
            self.alerts.alert(
                AlertKind::ChannelUnhealthy,
                format!(
                    "channel {} is unhealthy: its on_message hook failed {UNHEALTHY_AFTER} times \
                     in a row; the last error: {error}",
                    self.loaded.config.name
                ),
            );
        }
    }

    fn status(&self) -> ChannelHealth {
        let health = self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let hook_calls_running = self
            .hook_calls_running
            .load(std::sync::atomic::Ordering::SeqCst);
        ChannelHealth {
            name: self.loaded.config.name.to_string(),
            kind: self.loaded.config.kind().as_str().to_owned(),
            healthy: health.hook_failures < UNHEALTHY_AFTER
                && hook_calls_running < crate::channel::hooks::MAX_ABANDONED
                && !health.connection.starts_with("stopped"),
            connection: health.connection,
            hook_calls_running,
            hook_failures_in_a_row: health.hook_failures,
            last_hook_error: health.last_hook_error,
        }
    }
}

/// Shared by every task of the service.
struct Service {
    runtime: Runtime,
    inbox: Inbox,
    outbox: Outbox,
    channels: HashMap<String, Arc<Channel>>,
    conversations: Mutex<HashMap<LaneName, mpsc::UnboundedSender<PendingItem>>>,
    limits: RunLimits,
    clock: Clock,
    shutdown: CancellationToken,
    pairing: Mutex<Pairing>,
    pairing_path: std::path::PathBuf,
    /// The open lanes, for `/stop`.
    lanes: Mutex<HashMap<LaneName, Lane>>,
    /// How many times `/new` was used per conversation, and where that is kept.
    generations: Mutex<BTreeMap<String, u32>>,
    generations_path: std::path::PathBuf,
    /// The last group messages per (channel, room) that did not address the agent, offered to
    /// the model with the next message that does.
    context: Mutex<HashMap<(String, String), VecDeque<String>>>,
    /// Bot messages answered per (channel, room) since the last human one, for the loop guard;
    /// rebuilt from the inbox at start.
    bot_turns: Mutex<BotTurns>,
    /// The heartbeat scheduler, once started.
    heartbeats: std::sync::OnceLock<Heartbeats>,
    /// Set when this start keeps its channels paused (the crash-loop breaker).
    breaker: Option<perch_core::starts::Tripped>,
    /// The files loaded at start that changed since: a restart applies them.
    restart_needed: std::sync::Mutex<Vec<String>>,
    /// Every conversation's task and run, waited for at shutdown.
    tasks: TaskTracker,
    drain: Duration,
    metrics: Arc<Metrics>,
    /// Owner alerts: posted to `owner` in agent.lua, rate-limited, or only logged without one.
    alerts: Alerts,
}

/// Runs the service until `shutdown` fires.
pub async fn run(
    agent: LoadedAgent,
    mut setup: ServiceSetup,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let once = setup.once.take();
    let state = agent.dir.state_dir();
    let channels_loaded = agent.channels.clone();
    let dir = agent.dir.clone();
    let config_at_start = starts::config_digests(&dir);
    let runtime = Runtime::start(
        agent,
        &setup.machine,
        Arc::clone(&setup.model),
        setup.clock.clone(),
        |name| std::env::var(name).ok(),
    )?
    .with_metrics(Arc::clone(&setup.metrics));
    let (alerts, raised) = Alerts::new();
    runtime.spend().set_alerts(alerts.clone());
    let clock = setup.clock.clone();
    let inbox_dir = state.join("inbox");
    let outbox_dir = state.join("outbox");
    let opened_clock = clock.clone();
    let ((inbox, backlog), (outbox, unsettled)) = tokio::task::spawn_blocking(move || {
        Ok::<_, LogError>((
            Inbox::open(&inbox_dir, opened_clock.clone())?,
            Outbox::open(&outbox_dir, opened_clock)?,
        ))
    })
    .await
    .map_err(|error| error.to_string())?
    .map_err(|error| error.to_string())?;
    let mut channels = HashMap::new();
    for loaded in channels_loaded {
        let connector = (setup.connectors)(&loaded)?;
        let hooks = ChannelHooks::open(&dir, &loaded)?;
        let hook_calls_running = hooks.running_calls();
        channels.insert(
            loaded.config.name.to_string(),
            Arc::new(Channel {
                loaded,
                connector,
                hooks: Mutex::new(hooks),
                hook_calls_running,
                health: std::sync::Mutex::new(Health::default()),
                alerts: alerts.clone(),
            }),
        );
    }
    let pairing_path = control::pairing_path(&dir);
    let pairing = control::read_pairing(&pairing_path)?;
    let control_listener = control::listen(&control::socket_path(&dir))?;
    let generations_path = state.join("conversations.json");
    let generations = read_generations(&generations_path)?;
    let started_at = clock.now();
    let earlier_starts = starts::read_starts(&starts::starts_path(&dir))?;
    let breaker = perch_core::starts::breaker(&earlier_starts, started_at);
    starts::write_starts(
        &starts::starts_path(&dir),
        &perch_core::starts::record_start(&earlier_starts, started_at),
    )?;
    let mut context: HashMap<(String, String), VecDeque<String>> = HashMap::new();
    for (channel, event) in &backlog.context {
        let room = context
            .entry((channel.clone(), event.room.clone()))
            .or_default();
        room.push_back(context_line(event));
        while room.len() > CONTEXT_MESSAGES {
            room.pop_front();
        }
    }
    let service = Arc::new(Service {
        lanes: Mutex::new(HashMap::new()),
        context: Mutex::new(context),
        bot_turns: Mutex::new(backlog.bot_turns.clone()),
        generations: Mutex::new(generations),
        generations_path,
        pairing: Mutex::new(pairing),
        pairing_path,
        runtime,
        inbox,
        outbox,
        channels,
        conversations: Mutex::new(HashMap::new()),
        limits: setup.limits,
        clock,
        shutdown: shutdown.clone(),
        heartbeats: std::sync::OnceLock::new(),
        tasks: TaskTracker::new(),
        drain: setup.drain,
        metrics: Arc::clone(&setup.metrics),
        breaker: breaker.clone(),
        restart_needed: std::sync::Mutex::new(Vec::new()),
        alerts,
    });
    service.start_alerts(raised);
    {
        let service = Arc::clone(&service);
        let shutdown = shutdown.clone();
        tokio::spawn(control::serve(control_listener, shutdown, move |request| {
            let service = Arc::clone(&service);
            async move { service.control(request).await }
        }));
    }
    if let Some(listener) = setup.metrics_listener {
        let service = Arc::clone(&service);
        tokio::spawn(crate::metrics::serve(
            listener,
            shutdown.clone(),
            move || {
                let service = Arc::clone(&service);
                async move { service.metrics_text().await }
            },
        ));
    }
    let lanes = service.recover_lanes().await?;
    let outbox_recovered = service.settle_outbox(unsettled.unsettled).await?;
    let inbox_recovered = service
        .resume_inbox(backlog.clone(), &unsettled.replied_to)
        .await?;
    service.start_heartbeats(setup.heartbeat_reload, setup.once.is_none())?;
    starts::write_json(
        &starts::last_start_path(&dir),
        &serde_json::json!({
            "started": started_at.to_rfc3339(),
            "lanes_recovered": lanes,
            "outbox": outbox_recovered,
            "inbox": inbox_recovered,
            "channels_paused": breaker.as_ref().map(|tripped| tripped.reason.clone()),
        }),
    )?;
    if let Some(tripped) = &breaker {
        tracing_note(&format!("channels paused: {}", tripped.reason));
        service.alert(
            AlertKind::CrashLoop,
            format!(
                "channels are paused until {}: {}",
                tripped.until.to_rfc3339(),
                tripped.reason
            ),
        );
    }
    tokio::spawn(Arc::clone(&service).watch_config(config_at_start));
    let (arrivals, mut incoming) = mpsc::channel::<(String, Arrival)>(256);
    let mut first_attempts = Vec::new();
    for (name, channel) in &service.channels {
        if once.is_some() {
            channel.set_connection("not receiving: this process serves one heartbeat run".into());
            continue;
        }
        let resume = backlog.cursors.get(name).cloned();
        let since: Vec<(String, String)> = backlog
            .last_seen
            .get(name)
            .map(|rooms| {
                rooms
                    .iter()
                    .map(|(room, id)| (room.clone(), id.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let (over, first_attempt) = tokio::sync::oneshot::channel();
        if breaker.is_none() {
            first_attempts.push(first_attempt);
        }
        let receiving = receive_forever(
            name.clone(),
            Arc::clone(channel),
            ReceiveFrom {
                cursor: resume,
                since,
            },
            arrivals.clone(),
            setup.reconnect,
            Some(over),
            shutdown.clone(),
        );
        match &breaker {
            None => {
                tokio::spawn(receiving);
            }
            Some(tripped) => {
                channel.set_connection(format!("paused until {}", tripped.until.to_rfc3339()));
                let wait = (tripped.until - service.clock.now())
                    .to_std()
                    .unwrap_or_default();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(wait) => receiving.await,
                    }
                });
            }
        }
    }
    drop(arrivals);
    if let Some(once) = once {
        let heartbeats = service.heartbeats.get().cloned();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let end = match heartbeats {
                Some(heartbeats) => heartbeats.run_now(&once.task, once.dry_run).await,
                None => Err("the heartbeat scheduler did not start".into()),
            };
            let _ = once.end.send(end);
            stop.cancel();
        });
    }
    let notifier = &setup.notifier;
    // Ready once every channel's first connection attempt is over, connected or failed (so one
    // wrong token cannot hold it back), and at the latest after FIRST_CONNECTION.
    let first_connections = tokio::time::timeout(FIRST_CONNECTION, async move {
        for attempt in first_attempts {
            let _ = attempt.await;
        }
    });
    tokio::pin!(first_connections);
    let mut ready = false;
    let mut watchdog = notifier.watchdog().map(|interval| {
        let mut ticks = tokio::time::interval(interval / 2);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let mut receiving = true;
    loop {
        let tick = async {
            match watchdog.as_mut() {
                Some(ticks) => {
                    ticks.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = &mut first_connections, if !ready => {
                ready = true;
                if let Err(error) = notifier.notify(&format!("READY=1\n{}", service.status_line().await)) {
                    tracing::warn!("systemd was not told that perch is ready: {error}");
                }
            }
            () = tick, if ready => {
                let _ = notifier.notify(&format!("WATCHDOG=1\n{}", service.status_line().await));
            }
            arrival = incoming.recv(), if receiving => match arrival {
                Some((channel, arrival)) => {
                    if let Err(error) = service.arrive(&channel, arrival).await {
                        tracing::error!(channel = %channel, "an arrival on {channel} failed: {error}");
                        service.alert(
                            AlertKind::Intake,
                            format!("a message on channel {channel} could not be taken in: {error}"),
                        );
                    }
                }
                None => receiving = false,
            },
        }
    }
    let _ = notifier.notify(&format!(
        "STOPPING=1\n{}",
        status_line("stopping: finishing the runs in progress")
    ));
    service.tasks.close();
    if tokio::time::timeout(service.drain + DRAIN_MARGIN, service.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "some conversations did not stop in time; their lanes are recovered at the next start"
        );
    }
    service
        .runtime
        .machine()
        .stop()
        .await
        .map_err(|error| error.to_string())?;
    let starts_now = starts::read_starts(&starts::starts_path(&dir))?;
    starts::write_starts(
        &starts::starts_path(&dir),
        &perch_core::starts::record_stop(&starts_now, started_at, service.clock.now()),
    )?;
    Ok(())
}

/// Where a channel's receiving resumes: the cursor perch journaled last (Telegram's update id,
/// Matrix's sync token) and, per room, the last journaled event to back-fill from.
struct ReceiveFrom {
    cursor: Option<String>,
    since: Vec<(String, String)>,
}

/// Keeps one channel connected: reconnects with backoff after a drop (1 s doubling to a
/// minute), and only every [`REFUSED_RETRY`] after its credentials were refused, until shutdown.
async fn receive_forever(
    name: String,
    channel: Arc<Channel>,
    from: ReceiveFrom,
    arrivals: mpsc::Sender<(String, Arrival)>,
    first_wait: Duration,
    mut first_attempt: Option<tokio::sync::oneshot::Sender<()>>,
    shutdown: CancellationToken,
) {
    let ReceiveFrom {
        cursor: mut resume,
        since,
    } = from;
    let mut wait = first_wait;
    loop {
        let (events, mut received) = mpsc::channel::<Arrival>(64);
        let forward = {
            let arrivals = arrivals.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let mut last_cursor = None;
                while let Some(arrival) = received.recv().await {
                    last_cursor = arrival.event.cursor.clone().or(last_cursor);
                    if arrivals.send((name.clone(), arrival)).await.is_err() {
                        break;
                    }
                }
                last_cursor
            })
        };
        channel.set_connection("receiving".into());
        let receiving =
            channel
                .connector
                .receive(resume.clone(), since.clone(), events, shutdown.clone());
        // The first attempt is over when the connection is up or the attempt has failed.
        let result = match first_attempt.take() {
            None => receiving.await,
            Some(over) => {
                tokio::pin!(receiving);
                tokio::select! {
                    result = &mut receiving => {
                        let _ = over.send(());
                        result
                    }
                    () = channel.connector.connected() => {
                        let _ = over.send(());
                        receiving.await
                    }
                }
            }
        };
        if let Ok(Some(cursor)) = forward.await {
            resume = Some(cursor);
        }
        if shutdown.is_cancelled() {
            return;
        }
        match result {
            Err(crate::channel::ConnectorError::Unauthorized { message }) => {
                tracing::error!(
                    channel = %name,
                    "channel {name}: {message}; trying again in {} minutes",
                    REFUSED_RETRY.as_secs() / 60
                );
                channel.set_connection(format!("stopped: {message}"));
                tokio::select! {
                    () = tokio::time::sleep(REFUSED_RETRY) => {}
                    () = shutdown.cancelled() => return,
                }
                wait = first_wait;
                continue;
            }
            Err(error) => {
                tracing::warn!(channel = %name, "channel {name}: {error}; reconnecting");
                channel.set_connection(format!("reconnecting: {error}"));
            }
            Ok(()) => wait = first_wait,
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
}

/// How long a channel whose credentials were refused waits before it tries again: long enough
/// not to hammer the platform, short enough to recover from the platform's own mistake.
const REFUSED_RETRY: Duration = Duration::from_secs(600);

/// A status line with no fields of its own.
fn tracing_note(line: &str) {
    tracing::info!("{line}");
}

impl Service {
    /// `GET /metrics`: the counters, with the inbox's depth and the machine's boots read now.
    async fn metrics_text(&self) -> String {
        let depth = self.inbox.depth().await;
        self.metrics
            .set_inbox_depth(u64::try_from(depth).unwrap_or(u64::MAX));
        self.metrics.set_vm_boots(self.runtime.machine().boots());
        self.metrics.render()
    }

    /// Raises an owner alert: logged, and posted to `owner` (rate-limited: at most one message
    /// per kind an hour, then a count of the rest) when agent.lua names one. The crash-loop
    /// breaker, a stopped or unhealthy channel, an unknown delivery, a stopped heartbeat task and
    /// the spend guard come through here.
    pub fn alert(&self, kind: AlertKind, text: impl Into<String>) {
        self.alerts.alert(kind, text);
    }

    /// Starts the alert task: it takes what is raised and posts what the rate limit lets
    /// through to `owner`, through the outbox like any reply. Without an owner, alerts are only
    /// logged.
    fn start_alerts(self: &Arc<Self>, raised: mpsc::UnboundedReceiver<crate::alert::Alert>) {
        let Some(owner) = self.runtime.agent().definition.agent.owner.clone() else {
            return;
        };
        let service = Arc::clone(self);
        let post: crate::alert::PostAlert = Arc::new(move |text: String| {
            let service = Arc::clone(&service);
            let owner = owner.clone();
            Box::pin(async move { service.post_to(&owner, &text).await.map(drop) })
        });
        tokio::spawn(crate::alert::deliver(
            raised,
            post,
            self.clock.clone(),
            self.shutdown.clone(),
        ));
    }

    /// The service's `STATUS=` line for systemd.
    async fn status_line(&self) -> String {
        status_line(&format!(
            "{} channel(s), inbox {} waiting",
            self.channels.len(),
            self.inbox.depth().await
        ))
    }

    /// Journals the event, acknowledges it, and decides what it is.
    async fn arrive(self: &Arc<Self>, channel: &str, arrival: Arrival) -> Result<(), String> {
        let Arrival { event, journaled } = arrival;
        let recorded = self
            .inbox
            .record_event(channel, &event)
            .await
            .map_err(|error| error.to_string())?;
        crate::failpoint::hit("after:inbox_journaled");
        let _ = journaled.send(());
        if let Recorded::New { seq } = recorded {
            self.metrics.event_in(channel);
            self.decide(seq, channel, event).await?;
        }
        Ok(())
    }

    async fn decide(
        self: &Arc<Self>,
        seq: u64,
        channel: &str,
        event: InboundEvent,
    ) -> Result<(), String> {
        let Some(connected) = self.channels.get(channel).cloned() else {
            return self
                .settle(
                    seq,
                    Verdict::Refused {
                        reason: format!("no channel {channel}"),
                    },
                )
                .await;
        };
        let config = &connected.loaded.config;
        let arrived = Arrived {
            sender: &event.sender.id,
            sender_is_bot: event.sender.is_bot,
            direct: event.direct,
            addressed: event.addressed,
            room: &event.room,
            sent_at: event.sent_at,
        };
        let bot_turns = self.bot_turns.lock().await.in_room(channel, &event.room);
        let admission = {
            let pairing = self.pairing.lock().await;
            admit(
                config,
                &arrived,
                self.clock.now(),
                |sender| pairing.is_approved(channel, sender),
                bot_turns,
            )
        };
        let mut deciding = None;
        let command = perch_core::chat::command_for_me(&event.text, event.addressed);
        let verdict = match (admission, command) {
            (Admission::Answer, Some(command)) => {
                self.command(&connected, &event, command).await?;
                Verdict::Command {
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
                    crate::failpoint::hit("during:on_message");
                }
                let verdict = connected.hooks.lock().await.run_on_message(&message).await;
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
                            Some(lane) => Some(lane),
                            None => self.conversation_lane(channel, &event).await,
                        };
                        match lane {
                            Some(lane) => Verdict::Item {
                                lane: lane.to_string(),
                                text: item.text,
                            },
                            None => Verdict::Error {
                                reason: "no lane name could be made for this conversation".into(),
                            },
                        }
                    }
                    HookVerdict::Drop => Verdict::Dropped,
                    HookVerdict::Error(reason) => Verdict::Error { reason },
                }
            }
            (Admission::Context, _) => {
                let mut context = self.context.lock().await;
                let room = context
                    .entry((channel.to_owned(), event.room.clone()))
                    .or_default();
                room.push_back(context_line(&event));
                while room.len() > CONTEXT_MESSAGES {
                    room.pop_front();
                }
                Verdict::Context
            }
            (Admission::Stale, _) => Verdict::Stale,
            (Admission::Pair, _) => match self.offer_pairing(&connected, &event).await {
                Ok(()) => Verdict::Refused {
                    reason: "unknown sender in a direct message; pairing offered".into(),
                },
                Err(error) => {
                    self.alert(
                        AlertKind::Intake,
                        format!(
                            "a pairing code for {} on channel {channel} could not be recorded, so none was offered: {error}",
                            terminal::shown(&event.sender.id)
                        ),
                    );
                    Verdict::Refused {
                        reason: format!(
                            "unknown sender in a direct message; pairing could not be offered: {error}"
                        ),
                    }
                }
            },
            (Admission::Refused { reason }, _) => Verdict::Refused { reason },
        };
        self.bot_turns.lock().await.note(
            channel,
            &event.room,
            event.sender.is_bot,
            crate::inbox::admitted(&verdict),
        );
        let Verdict::Item { lane, text } = verdict.clone() else {
            self.settle(seq, verdict).await?;
            return self.consume_marks(deciding).await;
        };
        let earlier = self
            .context
            .lock()
            .await
            .remove(&(channel.to_owned(), event.room.clone()));
        let text = match earlier {
            Some(earlier) if !earlier.is_empty() => format!(
                "[Earlier in this room, not addressed to you]\n{}\n\n{text}",
                Vec::from(earlier).join("\n")
            ),
            _ => text,
        };
        let verdict_seq = self
            .inbox
            .record_verdict(seq, verdict)
            .await
            .map_err(|error| error.to_string())?;
        self.consume_marks(deciding).await?;
        self.dispatch(PendingItem {
            event_seq: seq,
            verdict_seq,
            channel: channel.to_owned(),
            event,
            lane,
            text,
        })
        .await
    }

    /// The lane of the conversation `event` belongs to, in its current generation (`/new`
    /// starts the next one).
    async fn conversation_lane(&self, channel: &str, event: &InboundEvent) -> Option<LaneName> {
        let base = lane_for(channel, &event.room, event.thread.as_deref())?;
        let generation = self
            .generations
            .lock()
            .await
            .get(base.as_str())
            .copied()
            .unwrap_or(0);
        if generation == 0 {
            return Some(base);
        }
        let prefix: String = base.as_str().chars().take(56).collect();
        LaneName::try_from(format!("{prefix}-n{generation}").as_str()).ok()
    }

    /// `/stop` aborts this conversation's run, `/new` starts a fresh conversation, `/status` says
    /// how perch is doing.
    async fn command(
        &self,
        channel: &Channel,
        event: &InboundEvent,
        command: ChatCommand,
    ) -> Result<(), String> {
        let name = channel.loaded.config.name.to_string();
        let reply = match command {
            ChatCommand::Stop => {
                let lane = self.conversation_lane(&name, event).await;
                let stopped = match lane {
                    Some(lane) => self
                        .lanes
                        .lock()
                        .await
                        .get(&lane)
                        .is_some_and(|lane| lane.abort().is_ok()),
                    None => false,
                };
                if stopped {
                    "Stopped."
                } else {
                    "Nothing is running here."
                }
                .to_owned()
            }
            ChatCommand::New => {
                let Some(base) = lane_for(&name, &event.room, event.thread.as_deref()) else {
                    return Ok(());
                };
                let mut generations = self.generations.lock().await;
                *generations.entry(base.to_string()).or_insert(0) += 1;
                write_generations(&self.generations_path, &generations)?;
                "Starting a new conversation: I will not see the earlier messages here.".to_owned()
            }
            ChatCommand::Status => format!(
                "perch is running: {} channel(s), {} inbox item(s) waiting, {} deliveries waiting.",
                self.channels.len(),
                self.inbox.depth().await,
                self.outbox.depth().await
            ),
        };
        self.reply(channel, event.clone(), reply).await
    }

    /// Gives an unknown sender a code to pass to the owner (once while it is pending).
    async fn offer_pairing(&self, channel: &Channel, event: &InboundEvent) -> Result<(), String> {
        let code = pairing_code(random_bytes());
        let issued = {
            let mut pairing = self.pairing.lock().await;
            let before = pairing.clone();
            let issued = pairing.issue(
                &channel.loaded.config.name.to_string(),
                &event.sender.id,
                &event.sender.name,
                code,
                self.clock.now(),
            );
            if matches!(issued, Issued::New(_) | Issued::Busy { .. })
                && let Err(error) = control::write_pairing(&self.pairing_path, &pairing)
            {
                // A code that is not on disk could never be approved: offer none.
                *pairing = before;
                return Err(error);
            }
            issued
        };
        let text = match issued {
            Issued::New(code) => format!(
                "I do not know you yet. If you should be able to talk to me, ask my owner to run \
                 `perch pair approve {code}` within the hour."
            ),
            Issued::Busy { oldest } => {
                let channel_name = channel.loaded.config.name.to_string();
                let holder = terminal::shown(&oldest.name);
                tracing::warn!(
                    channel = %channel_name,
                    "channel {channel_name}: every pairing code is taken; {} ({}) was told \
                     pairing is busy",
                    terminal::shown(&event.sender.name),
                    terminal::shown(&event.sender.id)
                );
                self.alert(
                    AlertKind::PairingFull,
                    format!(
                        "every pairing code of channel {channel_name} is taken, so new senders \
                         are told pairing is busy. The oldest is held by {holder} ({}) until {}; \
                         `perch status` lists them all.",
                        terminal::shown(&oldest.sender),
                        oldest.expires.to_rfc3339()
                    ),
                );
                format!(
                    "I do not know you yet, and pairing is busy right now: too many people are \
                     waiting for my owner. Please write again after {} UTC.",
                    oldest.expires.format("%H:%M")
                )
            }
            Issued::Pending | Issued::BusyTold => return Ok(()),
        };
        self.reply(channel, event.clone(), text).await
    }

    /// Answers a request that came in on the control socket.
    async fn control(&self, request: Result<ControlRequest, String>) -> serde_json::Value {
        const NOT_YET: &str = "heartbeats are not running yet";
        let request = match request {
            Ok(request) => request,
            Err(error) => return encode_reply::<Resumed>(&Err(error)),
        };
        match request {
            ControlRequest::PairApprove { code } => {
                let mut pairing = self.pairing.lock().await;
                let reply = match pairing.approve(&code, self.clock.now()) {
                    Approval::Approved(approved) => {
                        control::write_pairing(&self.pairing_path, &pairing).map(|()| approved)
                    }
                    Approval::Unknown => Err(control::no_pending_pairing(&code)),
                };
                encode_reply(&reply)
            }
            ControlRequest::HeartbeatRun { task, dry_run } => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => {
                        heartbeats
                            .run_now(&task, dry_run)
                            .await
                            .map(|end| HeartbeatRan {
                                end: heartbeat::run_end(&end),
                            })
                    }
                };
                encode_reply(&reply)
            }
            ControlRequest::HeartbeatResume { task } => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => heartbeats.resume(&task).await.map(|()| Resumed {}),
                };
                encode_reply(&reply)
            }
            ControlRequest::HeartbeatList => {
                let reply = match self.heartbeats.get() {
                    None => Err(NOT_YET.to_owned()),
                    Some(heartbeats) => {
                        heartbeats.list().await.map(|list| HeartbeatListed { list })
                    }
                };
                encode_reply(&reply)
            }
            ControlRequest::Status => encode_reply(&Ok(self.live_status().await)),
        }
    }

    /// What `perch status` learns from the running service.
    async fn live_status(&self) -> LiveStatus {
        let channels = self
            .channels
            .values()
            .map(|channel| channel.status())
            .collect();
        let vm = match self.runtime.machine().state().await {
            Ok((crate::sandbox::State::Running { commands }, last)) => {
                format!("running ({commands} command(s) now; last boot: {last:?})")
            }
            Ok((crate::sandbox::State::Stopped, last)) => {
                format!("stopped (boots on the next command; last boot: {last:?})")
            }
            Err(error) => format!("unknown: {error}"),
        };
        LiveStatus {
            running: true,
            channels,
            inbox_pending: self.inbox.depth().await,
            outbox_pending: self.outbox.depth().await,
            pairings_pending: self.pairing.lock().await.pending.len(),
            vm,
            channels_paused: self.breaker.as_ref().map(|tripped| tripped.reason.clone()),
            restart_needed: self
                .restart_needed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// The open lane `name`, opened (and recovered) first if it is not open yet, on `model` or
    /// the agent's. Conversations and heartbeats share lanes through here, so a lane is never
    /// opened twice.
    async fn lane(
        &self,
        name: &LaneName,
        origin: Origin,
        model: Option<&perch_core::name::ModelRef>,
    ) -> Result<Lane, String> {
        let mut lanes = self.lanes.lock().await;
        if let Some(lane) = lanes.get(name) {
            return Ok(lane.clone());
        }
        let lane = match model {
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
        };
        lanes.insert(name.clone(), lane.clone());
        Ok(lane)
    }

    /// Starts the heartbeat scheduler over the ledger in `.perch/heartbeats/`.
    fn start_heartbeats(
        self: &Arc<Self>,
        reload_every: Duration,
        scheduled: bool,
    ) -> Result<(), String> {
        let agent = self.runtime.agent();
        let env = heartbeat::heartbeat_env(agent, heartbeat::host_tz());
        let (ledger, records) =
            Ledger::open(&agent.dir, self.clock.clone()).map_err(|error| error.to_string())?;
        let service = Arc::clone(self);
        let setup = SchedulerSetup {
            dir: agent.dir.clone(),
            env,
            clock: self.clock.clone(),
            reload_every,
            run_job: Arc::new(move |job: Job| {
                let service = Arc::clone(&service);
                // Counted with the conversations, so a shutdown lets it finish (bounded by the
                // drain) before the machine stops.
                let running = service.tasks.token();
                Box::pin(async move {
                    let end = service.heartbeat(job).await;
                    drop(running);
                    end
                })
            }),
            on_stop: Some({
                let alerts = self.alerts.clone();
                Arc::new(move |task, reason| {
                    alerts.alert(
                        AlertKind::HeartbeatStopped,
                        format!(
                            "heartbeat {task} stopped: {reason}. It stays stopped until its entry \
                             in HEARTBEAT.yml changes or `perch heartbeat resume {task}`."
                        ),
                    );
                })
            }),
            scheduled,
        };
        let heartbeats = heartbeat::start(setup, ledger, records, self.shutdown.clone());
        let _ = self.heartbeats.set(heartbeats);
        Ok(())
    }

    /// One heartbeat run: the check, the judged turn in the task's lane, then the verdict's
    /// effect — a `Message:` through the outbox, a `Steer:` into its lane. The outcome is left in
    /// the lane as a note.
    async fn heartbeat(self: &Arc<Self>, job: Job) -> JobEnd {
        let lane_name = match job.mode {
            Mode::DryRun => job.task.name.dry_run_lane(),
            Mode::Scheduled | Mode::Manual => job.task.name.own_lane(),
        };
        let origin = Origin {
            channel: "heartbeat".into(),
            room: Some(job.task.name.to_string()),
            sender: None,
        };
        let lane = self.lane(&lane_name, origin, job.task.model.as_ref()).await;
        let end = match &lane {
            Ok(lane) => self.heartbeat_turn(lane, &job).await,
            Err(reason) => JobEnd {
                outcome: SlotOutcome::Failed {
                    reason: reason.clone(),
                },
                reply: String::new(),
                stop: None,
            },
        };
        if let Ok(lane) = lane
            && let Err(error) = lane
                .note("heartbeat_outcome", heartbeat::outcome_note(&job, &end))
                .await
        {
            tracing::warn!(
                task = %job.task.name,
                "heartbeat {}: the outcome was not noted in its lane: {error}",
                job.task.name
            );
        }
        if job.mode != Mode::DryRun {
            self.metrics
                .heartbeat_outcome(job.task.name.as_str(), &end.outcome);
        }
        end
    }

    async fn heartbeat_turn(self: &Arc<Self>, lane: &Lane, job: &Job) -> JobEnd {
        if let Err(reason) = self.runtime.spend().check(RunKind::Heartbeat).await {
            return JobEnd {
                outcome: SlotOutcome::Skipped { reason },
                reply: String::new(),
                stop: None,
            };
        }
        let (verdict, reply) = match heartbeat::take_turn(lane, self.runtime.machine(), job).await {
            Turned::Ended(end) => return end,
            Turned::Verdict { verdict, reply } => (verdict, reply),
        };
        let outcome = match verdict {
            _ if job.mode == Mode::DryRun => heartbeat::dry_outcome(job, verdict),
            HeartbeatVerdict::Silence => SlotOutcome::Silent,
            HeartbeatVerdict::Message(text) => match &job.task.delivery {
                None => SlotOutcome::Message {
                    text,
                    target: String::new(),
                    delivery: String::new(),
                },
                Some(target) => match self.post_to(target, &text).await {
                    Ok(delivery) => SlotOutcome::Message {
                        text,
                        target: target.to_string(),
                        delivery,
                    },
                    Err(reason) => SlotOutcome::Failed {
                        reason: format!("the message to {target} was not delivered: {reason}"),
                    },
                },
            },
            HeartbeatVerdict::Steer(text) => {
                let into = job.task.steer_lane();
                match self.steer_from_heartbeat(job, &into, &text).await {
                    Ok(()) => SlotOutcome::Steer { text, lane: into },
                    Err(reason) => SlotOutcome::Failed { reason },
                }
            }
        };
        JobEnd {
            outcome,
            reply,
            stop: None,
        }
    }

    /// Delivers a heartbeat's message to its target room, through the outbox.
    async fn post_to(&self, target: &Target, text: &str) -> Result<String, String> {
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
        let ids = self
            .post(
                channel,
                &room,
                target.thread.as_deref(),
                None,
                text.to_owned(),
            )
            .await?;
        Ok(ids.join(","))
    }

    /// Adds a heartbeat's steer to `into`: to its active run at the next tool boundary, or, when
    /// the lane is idle, as a run of its own. That run's reply stays in the lane: a heartbeat
    /// reaches a chat only through `Message:`.
    async fn steer_from_heartbeat(
        self: &Arc<Self>,
        job: &Job,
        into: &LaneName,
        text: &str,
    ) -> Result<(), String> {
        let origin = Origin {
            channel: "heartbeat".into(),
            room: Some(job.task.name.to_string()),
            sender: None,
        };
        let lane = self.lane(into, origin, None).await?;
        let text = format!("[steer from heartbeat {}]\n\n{text}", job.task.name);
        match lane.steer(text.clone()).await {
            Ok(Steered::Delivered) => Ok(()),
            Ok(Steered::Idle) => {
                let task = job.task.name.clone();
                tokio::spawn(async move {
                    let input = Input {
                        text,
                        consumes: Vec::new(),
                        fresh: false,
                    };
                    if let Err(error) = lane.send(input, None).await {
                        tracing::warn!(
                            task = %task,
                            "heartbeat {task}: the steered run failed: {error}"
                        );
                    }
                });
                Ok(())
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// Journals a verdict that needs no run, and consumes the event with it.
    async fn settle(&self, seq: u64, verdict: Verdict) -> Result<(), String> {
        let verdict_seq = self
            .inbox
            .record_verdict(seq, verdict)
            .await
            .map_err(|error| error.to_string())?;
        self.inbox
            .consume(vec![seq, verdict_seq])
            .await
            .map_err(|error| error.to_string())
    }

    /// Consumes deciding marks once their event's verdict is journaled.
    async fn consume_marks(&self, marks: impl IntoIterator<Item = u64>) -> Result<(), String> {
        let marks: Vec<u64> = marks.into_iter().collect();
        if marks.is_empty() {
            return Ok(());
        }
        self.inbox
            .consume(marks)
            .await
            .map_err(|error| error.to_string())
    }

    /// Hands an item to its conversation, starting the conversation's task if needed.
    async fn dispatch(self: &Arc<Self>, mut item: PendingItem) -> Result<(), String> {
        let lane = LaneName::try_from(item.lane.as_str())?;
        let mut conversations = self.conversations.lock().await;
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
        drop(conversations);
        let service = Arc::clone(self);
        let (lane_name, channel_name) = (lane.to_string(), channel.clone());
        self.tasks.spawn(async move {
            if let Err(error) = service.converse(lane, channel, items).await {
                tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
            }
        });
        Ok(())
    }

    /// One conversation: its lane, its queue, and the channel's busy policy.
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
            sender: None,
        };
        let lane = self.lane(&name, origin, None).await?;
        let config = connected.loaded.config.clone();
        let shutdown = self.shutdown.clone();
        let mut queue: VecDeque<PendingItem> = VecDeque::new();
        let mut active: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            if active
                .as_ref()
                .is_some_and(tokio::task::JoinHandle::is_finished)
            {
                active = None;
            }
            if active.is_none() && !queue.is_empty() && !shutdown.is_cancelled() {
                let batch: Vec<PendingItem> = match config.busy {
                    BusyPolicy::Collect { .. } => queue.drain(..).collect(),
                    _ => queue.pop_front().into_iter().collect(),
                };
                let service = Arc::clone(&self);
                let lane = lane.clone();
                let connected = Arc::clone(&connected);
                let (lane_name, channel_name) = (name.to_string(), channel.clone());
                active = Some(self.tasks.spawn(async move {
                    if let Err(error) = service.answer(&lane, &connected, batch).await {
                        tracing::error!(channel = %channel_name, lane = %lane_name, "{error}");
                    }
                }));
            }
            let woken = {
                let finished = async {
                    match active.as_mut() {
                        Some(run) => {
                            let _ = run.await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => Woken::Shutdown,
                    () = finished => Woken::Finished,
                    item = items.recv() => Woken::Item(item.map(Box::new)),
                }
            };
            let item = match woken {
                Woken::Shutdown => {
                    if let Some(run) = active.take() {
                        self.drain_run(&lane, run).await;
                    }
                    let _ = lane.close().await;
                    return Ok(());
                }
                Woken::Finished => {
                    active = None;
                    continue;
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
            let busy = active.is_some();
            let limit = usize::try_from(config.queue_limit).unwrap_or(usize::MAX);
            match (busy, config.busy) {
                (true, BusyPolicy::Steer) => {
                    let text = self.item_text(&connected, &item).await;
                    if matches!(lane.steer(text).await, Ok(Steered::Delivered)) {
                        self.inbox
                            .consume(vec![item.event_seq, item.verdict_seq])
                            .await
                            .map_err(|error| error.to_string())?;
                    } else {
                        queue.push_back(item);
                    }
                }
                (true, BusyPolicy::Interrupt) => {
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
        channel: &Channel,
        items: Vec<PendingItem>,
    ) -> Result<(), String> {
        let Some(last) = items.last().cloned() else {
            return Ok(());
        };
        let typing = self.keep_typing(channel, &last.event);
        let mut texts = Vec::with_capacity(items.len());
        for item in &items {
            texts.push(self.item_text(channel, item).await);
        }
        let text = texts.join("\n\n");
        let consumes = items.iter().map(PendingItem::consumes_id).collect();
        let finished = lane
            .send(
                Input {
                    text,
                    consumes,
                    fresh: false,
                },
                None,
            )
            .await
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
        self.deliver_outcome(channel, &last.event, &finished.outcome, &finished.text)
            .await?;
        let seqs = items
            .iter()
            .flat_map(|item| [item.event_seq, item.verdict_seq])
            .collect();
        self.inbox
            .consume(seqs)
            .await
            .map_err(|error| error.to_string())
    }

    /// Answers `to` with how its run ended: the reply (and its files) when it completed, a short
    /// apology when it failed or was interrupted (the reason is logged, never posted), nothing
    /// when cancelled.
    async fn deliver_outcome(
        &self,
        channel: &Channel,
        to: &InboundEvent,
        outcome: &Outcome,
        text: &str,
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

    async fn overflow(&self, channel: &Channel, item: PendingItem) -> Result<(), String> {
        let text = "I am still working on earlier messages in this conversation and cannot queue \
                    more right now. Please send this again in a moment.";
        self.reply(channel, item.event.clone(), text.to_owned())
            .await?;
        self.inbox
            .consume(vec![item.event_seq, item.verdict_seq])
            .await
            .map_err(|error| error.to_string())
    }

    /// Formats, splits and delivers a reply through the outbox.
    async fn reply(&self, channel: &Channel, to: InboundEvent, text: String) -> Result<(), String> {
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
    async fn post(
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
    async fn post_files(
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
    async fn send(
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
    async fn settle_outbox(&self, unsettled: Vec<Unsettled>) -> Result<serde_json::Value, String> {
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

    /// Opens every lane a crash left with an operation open, so recovery closes it now rather
    /// than at the lane's next message; returns what recovery did, per lane.
    async fn recover_lanes(&self) -> Result<serde_json::Value, String> {
        let sessions = self.runtime.agent().dir.sessions_dir();
        let mut recovered = serde_json::Map::new();
        for (lane, _) in starts::open_operations(&sessions) {
            let Ok(name) = LaneName::try_from(lane.as_str()) else {
                continue;
            };
            let origin = Origin {
                channel: "recovery".into(),
                room: None,
                sender: None,
            };
            let (opened, report) = self
                .runtime
                .open_lane(&name, origin, self.limits)
                .await
                .map_err(|error| format!("lane {lane}: {error}"))?;
            opened.close().await.map_err(|error| error.to_string())?;
            tracing_note(&format!(
                "recovered lane {lane}: {} operation(s) closed, {} tool(s) run again, {} marked interrupted",
                report.operations_closed, report.tools_rerun, report.tools_interrupted
            ));
            recovered.insert(
                lane,
                serde_json::json!({
                    "operations_closed": report.operations_closed,
                    "tools_rerun": report.tools_rerun,
                    "tools_interrupted": report.tools_interrupted,
                }),
            );
        }
        Ok(serde_json::Value::Object(recovered))
    }

    /// Notices edits to the files loaded at start, and says once per change that a restart
    /// applies them.
    async fn watch_config(self: Arc<Self>, at_start: std::collections::BTreeMap<String, String>) {
        let dir = self.runtime.agent().dir.clone();
        let mut said: Vec<String> = Vec::new();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(CONFIG_WATCH_EVERY) => {}
            }
            let changed = starts::changed_files(&at_start, &starts::config_digests(&dir));
            if changed != said {
                if !changed.is_empty() {
                    tracing_note(&format!(
                        "{} changed since perch run started; restart it to apply (HEARTBEAT.yml and the workspace apply live)",
                        changed.join(", ")
                    ));
                }
                said.clone_from(&changed);
                *self
                    .restart_needed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = changed;
            }
        }
    }

    /// After a restart: an item whose run was already recorded (an `operation_started` names it)
    /// is not run again. If no reply to it was recorded, it gets the one its run left in the lane
    /// (lane recovery has closed the run by now): the reply of a completed run, or a short note
    /// that the run was interrupted. Then it is consumed. The other items are queued again, in
    /// order; events without a verdict are decided again.
    async fn resume_inbox(
        self: &Arc<Self>,
        backlog: Backlog,
        replied_to: &std::collections::HashSet<(String, String)>,
    ) -> Result<serde_json::Value, String> {
        let sessions = self.runtime.agent().dir.sessions_dir();
        let (mut answered, mut queued, undecided) = (0, 0, backlog.undecided.len());
        let mut replied_after_restart = 0;
        for item in backlog.pending {
            let taken = taken_run(&sessions, &item.lane, &consumes_id(item.event_seq));
            if let Some(run) = taken {
                answered += 1;
                let replied =
                    replied_to.contains(&(item.channel.clone(), item.event.platform_id.clone()));
                if !replied && let Some(channel) = self.channels.get(&item.channel) {
                    replied_after_restart += 1;
                    self.deliver_outcome(channel, &item.event, &run.outcome, &run.text)
                        .await?;
                }
                self.inbox
                    .consume(vec![item.event_seq, item.verdict_seq])
                    .await
                    .map_err(|error| error.to_string())?;
            } else {
                queued += 1;
                self.dispatch(item).await?;
            }
        }
        self.consume_marks(backlog.settled_marks).await?;
        let rejected = backlog.interrupted.len();
        for interrupted in backlog.interrupted {
            let reason = format!(
                "perch stopped while the on_message hook of {} was deciding this message (a \
                 crash, a kill or a hang in the hook); it is not handed to the hook again",
                interrupted.hook
            );
            tracing::warn!(
                channel = %interrupted.channel,
                "channel {}: event {} rejected: {reason}",
                interrupted.channel,
                interrupted.event_seq
            );
            if let Some(channel) = self.channels.get(&interrupted.channel) {
                channel.hook_result(Some(&reason));
            }
            self.settle(interrupted.event_seq, Verdict::Error { reason })
                .await?;
            self.consume_marks([interrupted.mark_seq]).await?;
        }
        for (seq, channel, event) in backlog.undecided {
            self.decide(seq, &channel, event).await?;
        }
        Ok(serde_json::json!({
            "already_answered": answered,
            "replied_after_restart": replied_after_restart,
            "queued_again": queued,
            "decided_again": undecided,
            "rejected_as_interrupted": rejected,
        }))
    }
}

/// The longest readiness waits for the channels' first connection attempts.
const FIRST_CONNECTION: Duration = Duration::from_secs(30);

/// How often the files loaded at start are compared with what they were.
const CONFIG_WATCH_EVERY: Duration = Duration::from_secs(5);

/// How a settled delivery is counted; an intent is not a settlement.
fn delivery_outcome(record: &OutboxRecord) -> Option<DeliveryOutcome> {
    match record {
        OutboxRecord::Receipt { .. } => Some(DeliveryOutcome::Receipt),
        OutboxRecord::Dropped { .. } => Some(DeliveryOutcome::Dropped),
        OutboxRecord::Unknown { .. } => Some(DeliveryOutcome::Unknown),
        OutboxRecord::Intent { .. } => None,
    }
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

/// Group messages kept per room as context.
const CONTEXT_MESSAGES: usize = 5;

/// How a group message that did not address the agent is offered as context: its sender and
/// text, and the names of its files, which are not saved.
fn context_line(event: &InboundEvent) -> String {
    let mut line = format!("{}: {}", event.sender.name, event.text);
    if !event.attachments.is_empty() {
        let names = perch_core::attachment::saved_names(&event.attachments).join(", ");
        line.push_str(&format!(" [files, not saved: {names}]"));
    }
    line
}

/// What woke a conversation's task.
enum Woken {
    Shutdown,
    Finished,
    Item(Option<Box<PendingItem>>),
}

fn collect_window(busy: BusyPolicy) -> Option<Duration> {
    match busy {
        BusyPolicy::Collect { window } => Some(window),
        _ => None,
    }
}

/// Whether the newest segment of `lane` has a run naming `consumes`. A run's record and the
/// item's consumption are written in that order, and a segment only rolls when no run is open,
/// so a run the inbox did not hear end is always in the newest segment.
/// How the run that took an inbox item ended, as its lane recorded it.
struct TakenRun {
    outcome: Outcome,
    /// The run's last assistant text.
    text: String,
}

/// The run in `lane` whose `operation_started` consumes `consumes`, if there is one. A run
/// without its end (recovery has not closed it) counts as interrupted.
fn taken_run(sessions: &std::path::Path, lane: &str, consumes: &str) -> Option<TakenRun> {
    let mut segments: Vec<std::path::PathBuf> = std::fs::read_dir(sessions.join(lane))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    segments.sort();
    let mut op: Option<String> = None;
    let mut text = String::new();
    for segment in segments {
        let Ok(contents) = std::fs::read_to_string(&segment) else {
            continue;
        };
        for line in contents.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let what = if value["kind"] == "entry" {
                value["body"]["type"].as_str()
            } else {
                value["type"].as_str()
            };
            match (&op, what) {
                (None, Some("operation_started"))
                    if value["consumes"]
                        .as_array()
                        .is_some_and(|ids| ids.iter().any(|id| id == consumes)) =>
                {
                    op = value["op"].as_str().map(str::to_owned);
                }
                (Some(_), Some("message")) if value["body"]["role"] == "assistant" => {
                    let said: String = value["body"]["parts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|part| part["type"] == "text")
                        .filter_map(|part| part["text"].as_str())
                        .collect();
                    if !said.is_empty() {
                        text = said;
                    }
                }
                (Some(started), Some("operation_finished"))
                    if value["op"].as_str() == Some(started.as_str()) =>
                {
                    let outcome = serde_json::from_value(value["outcome"].clone()).unwrap_or(
                        Outcome::Interrupted {
                            reason: "its end could not be read".into(),
                        },
                    );
                    return Some(TakenRun { outcome, text });
                }
                _ => {}
            }
        }
    }
    op.map(|_| TakenRun {
        outcome: Outcome::Interrupted {
            reason: "perch stopped during the run".into(),
        },
        text,
    })
}

fn random_bytes() -> [u8; 6] {
    let random = uuid::Uuid::new_v4();
    let bytes = random.as_bytes();
    [bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5]]
}

fn read_generations(path: &std::path::Path) -> Result<BTreeMap<String, u32>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

fn write_generations(
    path: &std::path::Path,
    generations: &BTreeMap<String, u32>,
) -> Result<(), String> {
    crate::atomic_file::write_json(path, generations)
}
