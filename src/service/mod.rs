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
//! Three owners hold what changes as the service runs, each a task with a handle of requests:
//! intake (pairing, group context, bot turns, the channels' hooks), the conversations (each
//! conversation's task, the open lanes) and the deliveries (the rooms' queues and workers).
//! Heartbeats, status and recovery talk to their handles. `run` opens the stores, starts the
//! owners, connects the channels and pings systemd's watchdog; no reply is sent from that loop,
//! nor an arrival taken in, so a platform's rate limit never holds up the watchdog.

mod ask;
mod channel;
mod conversations;
mod deliveries;
mod drain;
mod earlier_lanes;
mod heartbeats;
mod intake;
mod lanes;
mod receive;
mod recovery;
mod status;
#[cfg(test)]
pub(crate) mod test_support;

pub use lanes::LaneLimits;

use crate::agent::{AgentDir, LoadedAgent, LoadedChannel};
use crate::channel::hooks::ChannelHooks;
use crate::channel::{Arrival, Connector};
use crate::heartbeat::JobEnd;
use crate::host::alert::Alerts;
use crate::host::clock::Clock;
use crate::host::metrics::Metrics;
use crate::host::notify::{Notifier, status_line};
use crate::lane::RunLimits;
use crate::lane::Runtime;
use crate::log::LogError;
use crate::model::Model;
use crate::sandbox::MachineSetup;
use crate::store::control;
use crate::store::inbox::{Backlog, Inbox};
use crate::store::outbox::{Outbox, OutboxBacklog};
use crate::store::starts;
use channel::{Channel, Channels, Health};
use conversations::ConversationsSetup;
use deliveries::DeliveriesSetup;
use drain::{DRAIN_MARGIN, Drain};
use heartbeats::HeartbeatHost;
use intake::IntakeSetup;
use lanes::LanePool;
use perch_core::alert::AlertKind;
use perch_core::connection::Begin;
use perch_core::starts::{LastStart, Tripped};
use receive::{ReceiveFrom, Receiver};
use status::Outside;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

impl std::fmt::Debug for ServiceSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSetup").finish_non_exhaustive()
    }
}

/// Runs the service until `shutdown` fires.
pub async fn run(
    agent: LoadedAgent,
    mut setup: ServiceSetup,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let once = setup.once.take();
    let (dir, clock) = (agent.dir.clone(), setup.clock.clone());
    let config_at_start = starts::config_digests(&dir);
    let loaded_channels = agent.channels.clone();
    let runtime = Runtime::start(
        agent,
        &setup.machine,
        Arc::clone(&setup.model),
        clock.clone(),
        |name| std::env::var(name).ok(),
    )?;
    let runtime = Arc::new(runtime.with_metrics(Arc::clone(&setup.metrics)));
    let (alerts, raised) = Alerts::new();
    runtime.spend().set_alerts(alerts.clone());
    let (stores, unsettled) = open_stores(&dir, &clock).await?;
    let (channels, hooks) = open_channels(&dir, loaded_channels, &setup.connectors, &alerts)?;
    let pairing = crate::store::pairing::read_pairing(&dir.pairing_file())?;
    let control_access = control::access(dir.root());
    let control_listener = control::listen(&dir.control_socket(), control_access)?;
    crate::store::generations::migrate(&dir)?;
    let started_at = clock.now();
    let earlier_starts = starts::read_starts(&dir.starts_file())?;
    let breaker = perch_core::starts::breaker(&earlier_starts, started_at);
    let recorded = perch_core::starts::record_start(&earlier_starts, started_at);
    starts::write_starts(&dir.starts_file(), &recorded)?;
    let common = Common {
        clock: clock.clone(),
        metrics: Arc::clone(&setup.metrics),
        alerts: alerts.clone(),
        tasks: TaskTracker::new(),
        shutdown: shutdown.clone(),
        closing: CancellationToken::new(),
        drain: Drain {
            within: setup.drain,
        },
    };
    let backlog = stores.backlog.clone();
    let owners = start_owners(
        &common,
        &runtime,
        &dir,
        stores.clone(),
        &channels,
        hooks,
        pairing,
        &setup,
    );
    let (restart_needed, restart_seen) = watch::channel(Vec::new());
    let paused = breaker.as_ref().map(|tripped| tripped.reason.clone());
    let outside = Arc::new(Outside {
        channels: Arc::clone(&channels),
        inbox: stores.inbox,
        outbox: stores.outbox,
        runtime: Arc::clone(&runtime),
        intake: owners.intake.clone(),
        deliveries: owners.deliveries.clone(),
        heartbeats: OnceLock::new(),
        channels_paused: paused.clone(),
        restart_needed: restart_seen,
        started: started_at,
        common: common.clone(),
    });
    serve_outside(
        &outside,
        raised,
        (control_listener, control_access),
        setup.metrics_listener.take(),
    );
    let recovered = Recovered {
        started: started_at,
        lanes: perch_core::starts::lanes_need_recovery(&earlier_starts),
        channels_paused: paused,
    };
    let last_start = recover(
        &runtime,
        &owners,
        recovered,
        unsettled,
        backlog.clone(),
        setup.limits,
    )
    .await?;
    let scheduled = once.is_none();
    let heartbeats = start_heartbeats(&common, &owners, &runtime, &dir, &setup, scheduled)?;
    let _ = outside.heartbeats.set(heartbeats.clone());
    starts::write_last_start(&dir, &last_start)?;
    if let Some(tripped) = &breaker {
        tracing::info!("channels paused: {}", tripped.reason);
        let until = tripped.until.to_rfc3339();
        alerts.alert(
            AlertKind::CrashLoop,
            format!("channels are paused until {until}: {}", tripped.reason),
        );
    }
    let watching = status::watch_config(
        dir.clone(),
        config_at_start,
        restart_needed,
        shutdown.clone(),
    );
    tokio::spawn(watching);
    let begin = match (&once, &breaker) {
        (Some(_), _) => Begin::OneHeartbeatRun,
        (None, Some(Tripped { until, .. })) => Begin::Paused {
            until: *until,
            now: clock.now(),
        },
        (None, None) => Begin::Now,
    };
    let first_attempts = receive_all(
        &channels,
        &backlog,
        begin,
        &owners.arrivals,
        setup.reconnect,
        &shutdown,
    );
    if let Some(once) = once {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let end = heartbeats.run_now(&once.task, once.dry_run).await;
            let _ = once.end.send(end);
            stop.cancel();
        });
    }
    watchdog(&setup.notifier, first_attempts, &outside, &shutdown).await;
    let _ = setup.notifier.notify(&format!(
        "STOPPING=1\n{}",
        status_line("stopping: finishing the runs in progress")
    ));
    let lanes_closed = stop(&common, &runtime, owners).await?;
    crate::host::narrate::finish(clock.now());
    let starts_now = starts::read_starts(&dir.starts_file())?;
    let stopped =
        perch_core::starts::record_stop(&starts_now, started_at, clock.now(), lanes_closed);
    starts::write_starts(&dir.starts_file(), &stopped)
}

/// What every owner, the heartbeats' host and the outside share, fixed at start.
#[derive(Clone)]
struct Common {
    clock: Clock,
    metrics: Arc<Metrics>,
    alerts: Alerts,
    /// The tasks shutdown waits for (conversations, runs, delivery workers, heartbeat runs).
    tasks: TaskTracker,
    /// perch is stopping: no arrival is taken any more, and a delivery's retry wait is cut
    /// short (the delivery is left unsettled for the next start).
    shutdown: CancellationToken,
    /// Ends the owners, once the service has drained.
    closing: CancellationToken,
    /// How long a run in progress at shutdown may go on.
    drain: Drain,
}

/// The journals, and what the inbox held when it was opened.
#[derive(Clone)]
struct Stores {
    inbox: Inbox,
    outbox: Outbox,
    backlog: Backlog,
}

/// The owners' handles, where arrivals go, and the owners' tasks.
struct Owners {
    intake: intake::Intake,
    conversations: conversations::Conversations,
    deliveries: deliveries::Deliveries,
    arrivals: mpsc::Sender<(String, Arrival)>,
    running: [tokio::task::JoinHandle<()>; 3],
}

/// Starts the three owners: the deliveries (which ask intake to format), the conversations
/// (which own the open lanes) and intake (which takes the arrivals and owns `hooks` and
/// `pairing`).
#[expect(
    clippy::too_many_arguments,
    reason = "what the owners share, each named where run has it"
)]
fn start_owners(
    common: &Common,
    runtime: &Arc<Runtime>,
    dir: &AgentDir,
    stores: Stores,
    channels: &Channels,
    hooks: HashMap<String, ChannelHooks>,
    pairing: perch_core::pairing::Pairing,
    setup: &ServiceSetup,
) -> Owners {
    let pool = LanePool::new(setup.lanes, Arc::clone(&common.metrics));
    let (intake, intake_requests) = intake::handle();
    let (deliveries, delivering) = deliveries::start(DeliveriesSetup {
        outbox: stores.outbox.clone(),
        channels: Arc::clone(channels),
        format: intake.formatter(),
        workspace: dir.workspace(),
        writer: pool.writer(dir.sessions_dir(), common.clock.clone()),
        common: common.clone(),
    });
    let (conversations, conversing) = conversations::start(ConversationsSetup {
        runtime: Arc::clone(runtime),
        inbox: stores.inbox.clone(),
        deliveries: deliveries.clone(),
        channels: Arc::clone(channels),
        pool,
        limits: setup.limits,
        common: common.clone(),
    });
    let (arrivals, incoming) = mpsc::channel::<(String, Arrival)>(256);
    let taking = intake::start(
        intake_requests,
        IntakeSetup {
            arrivals: incoming,
            channels: Arc::clone(channels),
            hooks,
            pairing,
            pairing_path: dir.pairing_file(),
            backlog: stores.backlog,
            inbox: stores.inbox,
            outbox: stores.outbox,
            conversations: conversations.clone(),
            deliveries: deliveries.clone(),
            dir: dir.clone(),
            common: common.clone(),
        },
    );
    Owners {
        intake,
        conversations,
        deliveries,
        arrivals,
        running: [taking, conversing, delivering],
    }
}

/// What a start is about to recover, and how it started.
struct Recovered {
    started: perch_core::Timestamp,
    /// The last stop may have left a lane with an operation open.
    lanes: bool,
    channels_paused: Option<String>,
}

/// Recovers what the last run left: the lanes with an operation open, the outbox's unsettled
/// deliveries and the inbox's backlog; what was done, as `.perch/last-start.json` keeps it.
async fn recover(
    runtime: &Runtime,
    owners: &Owners,
    recovered: Recovered,
    unsettled: OutboxBacklog,
    backlog: Backlog,
    limits: RunLimits,
) -> Result<LastStart, String> {
    let lanes_recovered = if recovered.lanes {
        recovery::recover_lanes(runtime, limits).await?
    } else {
        BTreeMap::new()
    };
    let outbox = owners
        .deliveries
        .settle_unsettled(unsettled.unsettled)
        .await?;
    let inbox = owners.intake.recover(backlog, unsettled.replied_to).await?;
    Ok(LastStart {
        started: recovered.started,
        lanes_recovered,
        outbox,
        inbox,
        channels_paused: recovered.channels_paused,
    })
}

/// Starts the heartbeat scheduler, hosted through the owners' handles.
fn start_heartbeats(
    common: &Common,
    owners: &Owners,
    runtime: &Arc<Runtime>,
    dir: &AgentDir,
    setup: &ServiceSetup,
    scheduled: bool,
) -> Result<crate::heartbeat::Heartbeats, String> {
    let host = HeartbeatHost {
        conversations: owners.conversations.clone(),
        deliveries: owners.deliveries.clone(),
        runtime: Arc::clone(runtime),
        common: common.clone(),
    };
    let clock = common.clock.clone();
    heartbeats::start(host, dir, clock, setup.heartbeat_reload, scheduled)
}

/// Opens the inbox and the outbox (their writers start; blocking, so on a blocking thread).
async fn open_stores(dir: &AgentDir, clock: &Clock) -> Result<(Stores, OutboxBacklog), String> {
    let (inbox_dir, outbox_dir, clock) = (dir.inbox_dir(), dir.outbox_dir(), clock.clone());
    let ((inbox, backlog), (outbox, unsettled)) = tokio::task::spawn_blocking(move || {
        Ok::<_, LogError>((
            Inbox::open(&inbox_dir, clock.clone())?,
            Outbox::open(&outbox_dir, clock)?,
        ))
    })
    .await
    .map_err(|error| error.to_string())?
    .map_err(|error| error.to_string())?;
    let stores = Stores {
        inbox,
        outbox,
        backlog,
    };
    Ok((stores, unsettled))
}

/// Every channel with its connector, and each channel's hooks, which intake will own.
fn open_channels(
    dir: &AgentDir,
    loaded: Vec<LoadedChannel>,
    connectors: &ConnectorFactory,
    alerts: &Alerts,
) -> Result<(Channels, HashMap<String, ChannelHooks>), String> {
    let mut channels = HashMap::new();
    let mut hooks = HashMap::new();
    for loaded in loaded {
        let name = loaded.config.name.to_string();
        let connector = connectors(&loaded)?;
        let channel_hooks = ChannelHooks::open(dir, &loaded)?;
        let channel = Channel {
            hook_calls_running: channel_hooks.running_calls(),
            loaded,
            connector,
            health: std::sync::Mutex::new(Health::default()),
            alerts: alerts.clone(),
        };
        hooks.insert(name.clone(), channel_hooks);
        channels.insert(name, Arc::new(channel));
    }
    Ok((Arc::new(channels), hooks))
}

/// Serves the control socket, `GET /metrics` when asked for, and the owner's alerts.
fn serve_outside(
    outside: &Arc<Outside>,
    raised: mpsc::UnboundedReceiver<crate::host::alert::Alert>,
    (control_listener, control_access): (
        tokio::net::UnixListener,
        perch_core::control::ControlAccess,
    ),
    metrics_listener: Option<tokio::net::TcpListener>,
) {
    outside.start_alerts(raised);
    let answering = Arc::clone(outside);
    tokio::spawn(control::serve(
        control_listener,
        control_access,
        outside.common.shutdown.clone(),
        move |request| {
            let outside = Arc::clone(&answering);
            async move { outside.control(request).await }
        },
    ));
    if let Some(listener) = metrics_listener {
        let counting = Arc::clone(outside);
        tokio::spawn(crate::host::metrics::serve(
            listener,
            outside.common.shutdown.clone(),
            move || {
                let outside = Arc::clone(&counting);
                async move { outside.metrics_text().await }
            },
        ));
    }
}

/// Starts every channel's receiving from where the inbox left it, as `begin` says; returns the
/// signals that each first attempt is over.
fn receive_all(
    channels: &Channels,
    backlog: &Backlog,
    begin: Begin,
    arrivals: &mpsc::Sender<(String, Arrival)>,
    first_wait: Duration,
    shutdown: &CancellationToken,
) -> Vec<oneshot::Receiver<()>> {
    let mut first_attempts = Vec::new();
    for (name, channel) in channels.iter() {
        let since = backlog
            .last_seen
            .get(name)
            .map(|rooms| {
                rooms
                    .iter()
                    .map(|(room, id)| (room.clone(), id.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let from = ReceiveFrom {
            cursor: backlog.cursors.get(name).cloned(),
            since,
        };
        let (over, first_attempt) = oneshot::channel();
        first_attempts.push(first_attempt);
        let shown = Arc::clone(channel);
        let receiver = Receiver {
            name: name.clone(),
            connector: Arc::clone(&channel.connector),
            show: move |connection| shown.set_connection(connection),
            arrivals: arrivals.clone(),
            first_wait,
            first_attempt: Some(over),
            shutdown: shutdown.clone(),
            credentials_fix: Some(crate::channel::credentials_fix(&channel.loaded)),
            endpoint: Some(crate::channel::endpoint(&channel.loaded.config)),
        };
        tokio::spawn(receiver.receive_forever(from, begin));
    }
    first_attempts
}

/// Tells systemd the service is ready once every channel's first connection attempt is over,
/// connected or failed (so one wrong token cannot hold it back), and at the latest after
/// [`FIRST_CONNECTION`], and has the operator told so by a task of its own; then pings the
/// watchdog, with the status line, until `shutdown`.
async fn watchdog(
    notifier: &Notifier,
    first_attempts: Vec<oneshot::Receiver<()>>,
    outside: &Arc<Outside>,
    shutdown: &CancellationToken,
) {
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
            () = shutdown.cancelled() => return,
            _ = &mut first_connections, if !ready => {
                ready = true;
                let narrating = Arc::clone(outside);
                tokio::spawn(async move { narrating.narrate_ready().await });
                if let Err(error) = notifier.notify(&format!("READY=1\n{}", outside.status_line().await)) {
                    tracing::warn!("systemd was not told that perch is ready: {error}");
                }
            }
            () = tick, if ready => {
                let _ = notifier.notify(&format!("WATCHDOG=1\n{}", outside.status_line().await));
            }
        }
    }
}

/// At shutdown: waits for the conversations and runs to finish within the drain, closes every
/// lane, stops the machine and ends the owners; whether every lane was closed cleanly.
async fn stop(common: &Common, runtime: &Runtime, owners: Owners) -> Result<bool, String> {
    common.tasks.close();
    let mut lanes_closed = true;
    let drained = common.drain.within + DRAIN_MARGIN;
    if tokio::time::timeout(drained, common.tasks.wait())
        .await
        .is_err()
    {
        lanes_closed = false;
        tracing::warn!(
            "some conversations did not stop in time; their lanes are recovered at the next start"
        );
    }
    match tokio::time::timeout(DRAIN_MARGIN, owners.conversations.close_all()).await {
        Ok(all_closed) => lanes_closed &= all_closed,
        Err(_) => {
            lanes_closed = false;
            tracing::warn!(
                "some lanes did not close in time; they are recovered at the next start"
            );
        }
    }
    runtime
        .machine()
        .stop()
        .await
        .map_err(|error| error.to_string())?;
    common.closing.cancel();
    for owner in owners.running {
        let _ = owner.await;
    }
    Ok(lanes_closed)
}

/// The longest readiness waits for the channels' first connection attempts.
const FIRST_CONNECTION: Duration = Duration::from_secs(30);
