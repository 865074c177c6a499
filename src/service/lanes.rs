//! The open lanes, owned by the conversations' owner and shared with its conversations' tasks
//! (heartbeats and `/stop` reach them through its handle): at most
//! [`LaneLimits::open_max`] open at once, each held by whoever runs in it (a conversation's run,
//! a heartbeat job) through a [`LaneLease`]. A lane nobody holds stays open, so its next message
//! finds it warm, until it has been idle for [`LaneLimits::lane_idle`] or its slot is needed
//! for another lane (the least recently used goes first; `perch_core::lanes` decides which).
//! A closed lane is reopened from disk, its history intact.

use crate::host::clock::Clock;
use crate::host::metrics::Metrics;
use crate::lane::Lane;
use crate::log::LaneLog;
use perch_core::lanes::{OpenLane, Room, idle_past, make_room};
use perch_core::log::{Line, Record};
use perch_core::name::LaneName;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How many lanes may be open at once, and how long idle conversations and lanes last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneLimits {
    /// Lanes open at once; an item whose lane finds every slot held waits for one.
    pub open_max: usize,
    /// How long a lane nobody holds stays open.
    pub lane_idle: Duration,
    /// How long a conversation's task waits for another message before it ends.
    pub conversation_idle: Duration,
}

impl Default for LaneLimits {
    fn default() -> LaneLimits {
        LaneLimits {
            open_max: perch_core::lanes::DEFAULT_OPEN_MAX,
            lane_idle: perch_core::lanes::DEFAULT_LANE_IDLE,
            conversation_idle: perch_core::lanes::DEFAULT_CONVERSATION_IDLE,
        }
    }
}

/// The open lanes (see the module documentation). Clones share them: the conversations' owner
/// and its tasks hold it, and nothing else.
#[derive(Debug, Clone)]
pub(super) struct LanePool {
    limits: LaneLimits,
    shared: Arc<Shared>,
    /// Serialises opening and closing lanes, so a lane is never opened twice nor opened while
    /// its earlier self is still closing. A tokio lock: held across the awaits of opening and
    /// closing a lane's log.
    changing: Arc<tokio::sync::Mutex<()>>,
    /// One permit per held lane: a lane being held needs a slot, which a permit guarantees
    /// (fewer than `open_max` lanes held means one is free or idle). Waiters are served in order.
    holds: Arc<Semaphore>,
}

/// What the pool and its leases share.
#[derive(Debug)]
struct Shared {
    /// A std lock: only ever held for bookkeeping, never across an await, so a lease can let go
    /// of its lane in `drop`.
    open: std::sync::Mutex<HashMap<LaneName, Slot>>,
    started: Instant,
    metrics: Arc<Metrics>,
    /// Signalled when a lane's last holder lets go, so the idle sweep sleeps while every open
    /// lane is held or none is open.
    released: tokio::sync::Notify,
}

#[derive(Debug)]
struct Slot {
    lane: Lane,
    holders: usize,
    /// Taken while anyone holds the lane.
    permit: Option<OwnedSemaphorePermit>,
    last_used: Duration,
}

/// A lane held open: while any lease on it lives it is never closed. Derefs to the lane.
#[derive(Debug)]
pub(super) struct LaneLease {
    lane: Lane,
    name: LaneName,
    shared: Arc<Shared>,
}

impl std::ops::Deref for LaneLease {
    type Target = Lane;

    fn deref(&self) -> &Lane {
        &self.lane
    }
}

impl Drop for LaneLease {
    fn drop(&mut self) {
        let now = self.shared.now();
        let mut open = self.shared.lock();
        if let Some(slot) = open.get_mut(&self.name) {
            slot.holders = slot.holders.saturating_sub(1);
            slot.last_used = now;
            if slot.holders == 0 {
                slot.permit = None;
                self.shared.released.notify_one();
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LaneName, Slot>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Takes another hold on `name` if it is open and `permit` (or an existing holder) gives it
    /// a slot.
    fn hold_open(
        self: &Arc<Self>,
        name: &LaneName,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Option<LaneLease> {
        let now = self.now();
        let mut open = self.lock();
        let slot = open.get_mut(name)?;
        if slot.holders == 0 {
            slot.permit = Some(permit?);
        }
        slot.holders += 1;
        slot.last_used = now;
        Some(LaneLease {
            lane: slot.lane.clone(),
            name: name.clone(),
            shared: Arc::clone(self),
        })
    }

    fn count(&self, open: usize) {
        self.metrics
            .set_lanes_open(u64::try_from(open).unwrap_or(u64::MAX));
    }
}

impl LanePool {
    pub(super) fn new(limits: LaneLimits, metrics: Arc<Metrics>) -> LanePool {
        LanePool {
            limits,
            shared: Arc::new(Shared {
                open: std::sync::Mutex::new(HashMap::new()),
                started: Instant::now(),
                metrics,
                released: tokio::sync::Notify::new(),
            }),
            changing: Arc::new(tokio::sync::Mutex::new(())),
            holds: Arc::new(Semaphore::new(limits.open_max)),
        }
    }

    pub(super) fn limits(&self) -> LaneLimits {
        self.limits
    }

    /// What appends records to this pool's lanes from outside their runs: lanes under
    /// `sessions`, stamped by `clock`.
    pub(super) fn writer(&self, sessions: PathBuf, clock: Clock) -> LaneWriter {
        LaneWriter {
            open: Arc::clone(&self.shared),
            changing: Arc::clone(&self.changing),
            sessions,
            clock,
        }
    }

    /// The lane `name` if it is open, without holding it (for `/stop`).
    pub(super) fn open_lane(&self, name: &LaneName) -> Option<Lane> {
        self.shared.lock().get(name).map(|slot| slot.lane.clone())
    }

    /// Another hold on `name` when someone already holds it: no slot is needed.
    pub(super) fn join(&self, name: &LaneName) -> Option<LaneLease> {
        self.shared.hold_open(name, None)
    }

    /// Waits for a slot to hold a lane in, in turn with the other waiters.
    pub(super) async fn turn(&self) -> OwnedSemaphorePermit {
        match Arc::clone(&self.holds).acquire_owned().await {
            Ok(permit) => permit,
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// Holds `name` with the slot `permit` gives: the open lane if it is open, otherwise
    /// opened with `open` after closing the least recently used idle lane if the cap needs its
    /// slot. Opening or closing is not cancelled halfway: callers await this to the end.
    pub(super) async fn hold<F>(
        &self,
        name: &LaneName,
        permit: OwnedSemaphorePermit,
        open: impl FnOnce() -> F,
    ) -> Result<LaneLease, String>
    where
        F: Future<Output = Result<Lane, String>>,
    {
        let _changing = self.changing.lock().await;
        if self.shared.lock().contains_key(name) {
            return self
                .shared
                .hold_open(name, Some(permit))
                .ok_or_else(|| format!("lane {name} closed while it was being held"));
        }
        loop {
            let closing = {
                let mut lanes = self.shared.lock();
                let (names, views) = views(&lanes);
                match make_room(&views, self.limits.open_max) {
                    Room::Free => break,
                    Room::Full => {
                        return Err(format!(
                            "all {} open lanes are in use",
                            self.limits.open_max
                        ));
                    }
                    Room::Close(index) => {
                        let slot = names
                            .get(index)
                            .and_then(|victim| lanes.remove_entry(victim));
                        self.shared.count(lanes.len());
                        slot
                    }
                }
            };
            if let Some(closing) = closing {
                close(closing).await;
            }
        }
        let lane = open().await?;
        let now = self.shared.now();
        let mut lanes = self.shared.lock();
        lanes.insert(
            name.clone(),
            Slot {
                lane: lane.clone(),
                holders: 1,
                permit: Some(permit),
                last_used: now,
            },
        );
        self.shared.count(lanes.len());
        Ok(LaneLease {
            lane,
            name: name.clone(),
            shared: Arc::clone(&self.shared),
        })
    }

    /// Closes the lanes nobody has held for [`LaneLimits::lane_idle`].
    pub(super) async fn close_idle(&self) {
        let _changing = self.changing.lock().await;
        let (idle, drained): (Vec<(LaneName, Slot)>, bool) = {
            let mut lanes = self.shared.lock();
            let (names, views) = views(&lanes);
            let closing: Vec<_> = idle_past(&views, self.shared.now(), self.limits.lane_idle)
                .into_iter()
                .filter_map(|index| names.get(index).and_then(|name| lanes.remove_entry(name)))
                .collect();
            self.shared.count(lanes.len());
            let drained = !closing.is_empty() && lanes.is_empty();
            (closing, drained)
        };
        for closing in idle {
            close(closing).await;
        }
        if drained {
            crate::host::metrics::release_free_memory();
        }
    }

    /// Closes every lane (at shutdown, once the conversations have stopped); whether every one
    /// closed cleanly.
    pub(super) async fn close_all(&self) -> bool {
        let _changing = self.changing.lock().await;
        let all: Vec<(LaneName, Slot)> = {
            let mut lanes = self.shared.lock();
            let all = lanes.drain().collect();
            self.shared.count(0);
            all
        };
        let mut clean = true;
        for closing in all {
            clean &= close(closing).await;
        }
        clean
    }

    /// Closes each lane once it has been idle for [`LaneLimits::lane_idle`], until `shutdown`.
    /// Sleeps until the earliest such moment, or, while no open lane is idle, until a lane is
    /// let go.
    pub(super) async fn close_idle_until(&self, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            let wait = self.until_next_idle();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.shared.released.notified(), if wait.is_none() => {}
                () = tokio::time::sleep(wait.unwrap_or_default()), if wait.is_some() => {
                    self.close_idle().await;
                }
            }
        }
    }

    /// How long until the first lane nobody holds has been idle for `lane_idle`; `None` while
    /// no open lane is idle.
    fn until_next_idle(&self) -> Option<Duration> {
        let now = self.shared.now();
        let lanes = self.shared.lock();
        let (_, views) = views(&lanes);
        views
            .iter()
            .filter(|lane| !lane.held)
            .map(|lane| (lane.last_used + self.limits.lane_idle).saturating_sub(now))
            .min()
    }
}

/// The open lanes' names, and what `perch_core::lanes` decides on, in the same order.
fn views(lanes: &HashMap<LaneName, Slot>) -> (Vec<LaneName>, Vec<OpenLane>) {
    lanes
        .iter()
        .map(|(name, slot)| {
            (
                name.clone(),
                OpenLane {
                    held: slot.holders > 0,
                    last_used: slot.last_used,
                },
            )
        })
        .unzip()
}

/// Closes a lane; whether it closed cleanly.
async fn close((name, slot): (LaneName, Slot)) -> bool {
    match slot.lane.close().await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(lane = %name, "lane {name} did not close cleanly: {error}");
            false
        }
    }
}

/// Appends records to lanes from outside their runs (a delivery's fate), through each lane's
/// one writer. Clones share it.
#[derive(Clone)]
pub(super) struct LaneWriter {
    open: Arc<Shared>,
    /// The pool's: held while a record goes to a lane, so that the lane is neither opened nor
    /// closed meanwhile and the record goes through its one writer (a tokio lock: held across
    /// the append).
    changing: Arc<tokio::sync::Mutex<()>>,
    sessions: PathBuf,
    clock: Clock,
}

impl LaneWriter {
    /// Appends `record` through the lane's one writer: the open lane's, or, when it is not open,
    /// a writer opened for this append and closed after it. A lane that does not exist yet is
    /// not made for it.
    pub(super) async fn append(&self, name: &LaneName, record: Record) -> Result<(), String> {
        let _changing = self.changing.lock().await;
        let open = self.open.lock().get(name).map(|slot| slot.lane.clone());
        if let Some(lane) = open {
            return lane.record(record).await.map_err(|error| error.to_string());
        }
        let sessions = self.sessions.clone();
        if !sessions.join(name.as_str()).is_dir() {
            return Ok(());
        }
        let (lane, clock) = (name.clone(), self.clock.clone());
        let (log, _) = tokio::task::spawn_blocking(move || LaneLog::open(&sessions, &lane, clock))
            .await
            .map_err(|error| format!("opening the lane panicked: {error}"))?
            .map_err(|error| error.to_string())?;
        let appended = log.append(&Line::Record(record)).await;
        let closed = log.close().await;
        appended.map_err(|error| error.to_string())?;
        closed.map_err(|error| error.to_string())
    }
}

/// A heartbeat holds its lane for the whole job: the lease lives as long as the handle.
impl crate::heartbeat::HostLane for LaneLease {
    fn send(
        &self,
        input: crate::lane::Input,
    ) -> crate::channel::BoxFuture<'_, Result<crate::lane::Finished, crate::lane::LaneError>> {
        crate::heartbeat::HostLane::send(&self.lane, input)
    }

    fn note(
        &self,
        note: perch_core::log::Note,
    ) -> crate::channel::BoxFuture<'_, Result<(), crate::lane::LaneError>> {
        crate::heartbeat::HostLane::note(&self.lane, note)
    }
}
