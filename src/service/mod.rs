//! `perch run`: the agent as a service. It holds the directory's lock, recovers the inbox,
//! outbox and lanes, connects every channel, and answers until it is told to stop.
//!
//! One inbound event goes: connector → inbox journal (fsynced) → acknowledged to the platform →
//! admission (age, bots, who may talk, addressing) → the channel's `on_message` hook → the
//! verdict, journaled under the event → the conversation's queue → its files saved under
//! `workspace/inbox/` → a lane run naming the event → the reply, its `attach:` lines checked,
//! through `format`, split to the platform's limit (the files on the last piece) → the outbox
//! (every piece's intent fsynced) → the inbox item consumed, and the reply handed to the room's
//! delivery worker → the platform → the receipt.
//!
//! The loop that pings systemd's watchdog only journals, decides and hands off: no reply is
//! sent from it, so a platform's rate limit never holds up the watchdog or another arrival.

mod channel;
mod conversation;
mod converse;
mod delivery;
mod earlier_lanes;
mod generations;
mod heartbeats;
mod intake;
mod lanes;
mod receive;
mod recovery;
mod status;

use channel::{Channel, Health};
use intake::context_line;
pub use lanes::LaneLimits;
use lanes::LanePool;
use receive::{ReceiveFrom, Receiver};

use crate::agent::{LoadedAgent, LoadedChannel};
use crate::alert::Alerts;
use crate::channel::hooks::ChannelHooks;
use crate::channel::{Arrival, Connector};
use crate::clock::Clock;
use crate::control;
use crate::heartbeat::{Heartbeats, JobEnd};
use crate::inbox::Inbox;
use crate::lane::RunLimits;
use crate::log::LogError;
use crate::metrics::Metrics;
use crate::model::Model;
use crate::notify::{Notifier, status_line};
use crate::outbox::Outbox;
use crate::runtime::Runtime;
use crate::sandbox::MachineSetup;
use crate::starts;
use perch_core::alert::AlertKind;
use perch_core::chat::BotTurns;
use perch_core::connection::Begin;
use perch_core::group_context::GroupContext;
use perch_core::name::LaneName;
use perch_core::pairing::Pairing;
use perch_core::starts::LastStart;
use std::collections::{BTreeMap, HashMap};
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
    /// How many lanes may be open at once, and how soon idle conversations and lanes end.
    pub lanes: LaneLimits,
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
pub(super) const DRAIN_MARGIN: Duration = Duration::from_secs(5);

impl std::fmt::Debug for ServiceSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSetup").finish_non_exhaustive()
    }
}

/// Shared by every task of the service: handles fixed at start (the fields here) apart from
/// what changes as it runs (`state`).
struct Service {
    runtime: Runtime,
    inbox: Inbox,
    outbox: Outbox,
    /// The per-room delivery workers every reply is handed to once its intents are recorded.
    deliveries: delivery::Deliveries,
    channels: HashMap<String, Arc<Channel>>,
    limits: RunLimits,
    clock: Clock,
    shutdown: CancellationToken,
    pairing_path: std::path::PathBuf,
    /// The open lanes, capped, shared by conversations, heartbeats and `/stop`.
    lanes: LanePool,
    /// The heartbeat scheduler, set once when it starts.
    heartbeats: std::sync::OnceLock<Heartbeats>,
    /// Set when this start keeps its channels paused (the crash-loop breaker).
    breaker: Option<perch_core::starts::Tripped>,
    /// Every conversation's task and run, waited for at shutdown.
    tasks: TaskTracker,
    drain: Duration,
    metrics: Arc<Metrics>,
    /// Owner alerts: posted to `owner` in agent.lua, rate-limited, or only logged without one.
    alerts: Alerts,
    state: State,
}

/// What the service changes as it runs, each part behind its own lock. The std locks are only
/// ever held for bookkeeping (and, for `pairing`, the synchronous write of `pairing.json`),
/// never across an await.
struct State {
    /// The queue of each conversation whose task is running; the task removes its entry, under
    /// this lock, when it ends idle. A tokio lock: `dispatch` awaits under it (the conversation
    /// is started or found, and sent its item, as one step) and a conversation's task takes it
    /// to end, so no item is sent to a task that is ending.
    conversations: Mutex<HashMap<LaneName, conversation::ConversationEntry>>,
    /// Pending pairing codes and approved senders, written to `pairing.json` on each change.
    pairing: std::sync::Mutex<Pairing>,
    /// The last group messages per (channel, room) that did not address the agent, offered to
    /// the model with the next message that does; bounded in rooms and age.
    context: std::sync::Mutex<GroupContext>,
    /// Bot messages answered per (channel, room) since the last human one, for the loop guard;
    /// rebuilt from the inbox at start; bounded in rooms.
    bot_turns: std::sync::Mutex<BotTurns>,
    /// The files loaded at start that changed since: a restart applies them.
    restart_needed: std::sync::Mutex<Vec<String>>,
}

/// Takes a std lock of [`State`], whose holders never leave it half changed, so a panic while
/// holding one does not make it unusable.
fn locked<T>(lock: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the service until `shutdown` fires.
pub async fn run(
    agent: LoadedAgent,
    mut setup: ServiceSetup,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let once = setup.once.take();
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
    let inbox_dir = dir.inbox_dir();
    let outbox_dir = dir.outbox_dir();
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
    let pairing_path = dir.pairing_file();
    let pairing = control::read_pairing(&pairing_path)?;
    let control_listener = control::listen(&dir.control_socket())?;
    generations::migrate(&dir)?;
    let started_at = clock.now();
    let earlier_starts = starts::read_starts(&dir.starts_file())?;
    let breaker = perch_core::starts::breaker(&earlier_starts, started_at);
    starts::write_starts(
        &dir.starts_file(),
        &perch_core::starts::record_start(&earlier_starts, started_at),
    )?;
    let mut context = GroupContext::default();
    for (channel, event) in &backlog.context {
        context.push(channel, &event.room, context_line(event), event.sent_at);
    }
    let tasks = TaskTracker::new();
    let lanes = LanePool::new(setup.lanes, Arc::clone(&setup.metrics));
    let deliveries = delivery::Deliveries::new(
        outbox.clone(),
        Arc::clone(&setup.metrics),
        alerts.clone(),
        dir.workspace(),
        lanes.records(dir.sessions_dir(), clock.clone(), tasks.clone()),
        shutdown.clone(),
        tasks.clone(),
    );
    let service = Arc::new(Service {
        lanes,
        pairing_path,
        runtime,
        inbox,
        outbox,
        deliveries,
        channels,
        limits: setup.limits,
        clock,
        shutdown: shutdown.clone(),
        heartbeats: std::sync::OnceLock::new(),
        tasks,
        drain: setup.drain,
        metrics: Arc::clone(&setup.metrics),
        breaker: breaker.clone(),
        alerts,
        state: State {
            conversations: Mutex::new(HashMap::new()),
            pairing: std::sync::Mutex::new(pairing),
            context: std::sync::Mutex::new(context),
            bot_turns: std::sync::Mutex::new(backlog.bot_turns.clone()),
            restart_needed: std::sync::Mutex::new(Vec::new()),
        },
    });
    service.start_alerts(raised);
    service.update_gates();
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
    let lanes = if perch_core::starts::lanes_need_recovery(&earlier_starts) {
        service.recover_lanes().await?
    } else {
        BTreeMap::new()
    };
    {
        let service = Arc::clone(&service);
        let shutdown = shutdown.clone();
        tokio::spawn(async move { service.lanes.close_idle_until(shutdown).await });
    }
    let outbox_recovered = service.settle_outbox(unsettled.unsettled).await?;
    let inbox_recovered = service
        .resume_inbox(backlog.clone(), &unsettled.replied_to)
        .await?;
    service.start_heartbeats(setup.heartbeat_reload, setup.once.is_none())?;
    starts::write_last_start(
        &dir,
        &LastStart {
            started: started_at,
            lanes_recovered: lanes,
            outbox: outbox_recovered,
            inbox: inbox_recovered,
            channels_paused: breaker.as_ref().map(|tripped| tripped.reason.clone()),
        },
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
        let begin = match (&once, &breaker) {
            (Some(_), _) => Begin::OneHeartbeatRun,
            (None, Some(tripped)) => Begin::Paused {
                until: tripped.until,
                now: service.clock.now(),
            },
            (None, None) => Begin::Now,
        };
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
        first_attempts.push(first_attempt);
        let shown = Arc::clone(channel);
        let receiver = Receiver {
            name: name.clone(),
            connector: Arc::clone(&channel.connector),
            show: move |connection| shown.set_connection(connection),
            arrivals: arrivals.clone(),
            first_wait: setup.reconnect,
            first_attempt: Some(over),
            shutdown: shutdown.clone(),
        };
        let from = ReceiveFrom {
            cursor: resume,
            since,
        };
        tokio::spawn(receiver.receive_forever(from, begin));
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
    let mut lanes_closed = true;
    if tokio::time::timeout(service.drain + DRAIN_MARGIN, service.tasks.wait())
        .await
        .is_err()
    {
        lanes_closed = false;
        tracing::warn!(
            "some conversations did not stop in time; their lanes are recovered at the next start"
        );
    }
    match tokio::time::timeout(DRAIN_MARGIN, service.lanes.close_all()).await {
        Ok(all_closed) => lanes_closed &= all_closed,
        Err(_) => {
            lanes_closed = false;
            tracing::warn!(
                "some lanes did not close in time; they are recovered at the next start"
            );
        }
    }
    service
        .runtime
        .machine()
        .stop()
        .await
        .map_err(|error| error.to_string())?;
    let starts_now = starts::read_starts(&dir.starts_file())?;
    starts::write_starts(
        &dir.starts_file(),
        &perch_core::starts::record_stop(
            &starts_now,
            started_at,
            service.clock.now(),
            lanes_closed,
        ),
    )?;
    Ok(())
}

/// A status line with no fields of its own.
pub(super) fn tracing_note(line: &str) {
    tracing::info!("{line}");
}

/// The longest readiness waits for the channels' first connection attempts.
const FIRST_CONNECTION: Duration = Duration::from_secs(30);
