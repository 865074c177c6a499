//! What `perch run` counts, and `GET /metrics` in Prometheus's text exposition format, answered
//! by a small HTTP/1.1 responder on the listener `perch run --metrics` opens (off by default).
//!
//! Counters live in one [`Metrics`], shared by the service, its lanes and the heartbeat runs;
//! the gauges that have a source of truth elsewhere (the inbox's depth, the machine's boots) are
//! read when a scrape asks.

use perch_core::heartbeat::SlotOutcome;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Where `--metrics` without an address listens.
pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

/// The upper bounds, in seconds, of `perch_run_duration_seconds`'s buckets (`+Inf` follows).
pub const RUN_BUCKETS: [f64; 10] = [0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// How a delivery was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The platform took it.
    Receipt,
    /// The platform refused it, or it was too old to send after a restart.
    Dropped,
    /// Its fate is unknown; it is never resent.
    Unknown,
}

impl DeliveryOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryOutcome::Receipt => "receipt",
            DeliveryOutcome::Dropped => "dropped",
            DeliveryOutcome::Unknown => "unknown",
        }
    }
}

/// Label values, in the order of the family's label names.
type Labels = Vec<String>;

/// One counter per set of label values.
#[derive(Debug, Default)]
struct Family(Mutex<BTreeMap<Labels, u64>>);

impl Family {
    fn add(&self, labels: &[&str], by: u64) {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key: Labels = labels.iter().map(|value| (*value).to_owned()).collect();
        *counts.entry(key).or_insert(0) += by;
    }

    fn snapshot(&self) -> BTreeMap<Labels, u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Observations per bucket of [`RUN_BUCKETS`], not cumulative; the last is `+Inf`.
    buckets: [u64; RUN_BUCKETS.len() + 1],
    count: u64,
    sum: f64,
}

/// The service's counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    events_in: Family,
    events_out: Family,
    deliveries: Family,
    tool_calls: Family,
    heartbeat_outcomes: Family,
    tokens_input: AtomicU64,
    tokens_output: AtomicU64,
    runs: Mutex<Histogram>,
    inbox_depth: AtomicU64,
    vm_boots: AtomicU64,
    lanes_open: AtomicU64,
    lanes_open_peak: AtomicU64,
    conversations_active: AtomicU64,
    lane_open_failures: AtomicU64,
}

impl Metrics {
    /// A new event from `channel` was taken into the inbox (a redelivered one is not counted).
    pub fn event_in(&self, channel: &str) {
        self.events_in.add(&[channel], 1);
    }

    /// A delivery to `channel` was sent through the outbox and settled as `outcome`.
    pub fn delivered(&self, channel: &str, outcome: DeliveryOutcome) {
        self.events_out.add(&[channel], 1);
        self.settled(channel, outcome);
    }

    /// A delivery to `channel` was settled as `outcome` (after a restart, without sending it).
    pub fn settled(&self, channel: &str, outcome: DeliveryOutcome) {
        self.deliveries.add(&[channel, outcome.as_str()], 1);
    }

    /// A lane run ended after `took`.
    pub fn run_finished(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = RUN_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(RUN_BUCKETS.len());
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.buckets[bucket] += 1;
        runs.count += 1;
        runs.sum += seconds;
    }

    /// A run called `tool`.
    pub fn tool_call(&self, tool: &str) {
        self.tool_calls.add(&[tool], 1);
    }

    /// A model reply's usage.
    pub fn tokens(&self, input: u64, output: u64) {
        self.tokens_input.fetch_add(input, Ordering::Relaxed);
        self.tokens_output.fetch_add(output, Ordering::Relaxed);
    }

    /// A heartbeat run of `task` ended with `outcome`.
    pub fn heartbeat_outcome(&self, task: &str, outcome: &SlotOutcome) {
        self.heartbeat_outcomes.add(&[task, outcome.name()], 1);
    }

    pub fn set_inbox_depth(&self, depth: u64) {
        self.inbox_depth.store(depth, Ordering::Relaxed);
    }

    pub fn set_vm_boots(&self, boots: u64) {
        self.vm_boots.store(boots, Ordering::Relaxed);
    }

    /// The lanes open now; the peak since start follows it up.
    pub fn set_lanes_open(&self, open: u64) {
        self.lanes_open.store(open, Ordering::Relaxed);
        self.lanes_open_peak.fetch_max(open, Ordering::Relaxed);
    }

    /// The conversations with a task now (items waiting, a run, or within their idle grace).
    pub fn set_conversations_active(&self, active: u64) {
        self.conversations_active.store(active, Ordering::Relaxed);
    }

    /// A lane could not be opened (its items wait and it is tried again).
    pub fn lane_open_failed(&self) {
        self.lane_open_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Every metric in Prometheus's text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        family(
            &mut out,
            "perch_events_in_total",
            "Chat events taken into the inbox, per channel.",
            &["channel"],
            &self.events_in.snapshot(),
        );
        family(
            &mut out,
            "perch_events_out_total",
            "Deliveries sent through the outbox, per channel, whatever their outcome.",
            &["channel"],
            &self.events_out.snapshot(),
        );
        family(
            &mut out,
            "perch_deliveries_total",
            "Deliveries settled, per channel and outcome (receipt, dropped, unknown).",
            &["channel", "outcome"],
            &self.deliveries.snapshot(),
        );
        let runs = self
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        header(
            &mut out,
            "perch_run_duration_seconds",
            "How long lane runs took, from the request to the outcome.",
            "histogram",
        );
        let mut cumulative = 0;
        for (index, count) in runs.buckets.iter().enumerate() {
            cumulative += count;
            let bound = RUN_BUCKETS
                .get(index)
                .map_or_else(|| "+Inf".to_owned(), |bound| bound.to_string());
            let _ = writeln!(
                out,
                "perch_run_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(out, "perch_run_duration_seconds_sum {}", runs.sum);
        let _ = writeln!(out, "perch_run_duration_seconds_count {}", runs.count);
        family(
            &mut out,
            "perch_tool_calls_total",
            "Tool calls made by runs, per tool.",
            &["tool"],
            &self.tool_calls.snapshot(),
        );
        header(
            &mut out,
            "perch_model_tokens_total",
            "Model tokens, per direction (input includes cached input).",
            "counter",
        );
        for (direction, tokens) in [
            ("input", &self.tokens_input),
            ("output", &self.tokens_output),
        ] {
            let _ = writeln!(
                out,
                "perch_model_tokens_total{{direction=\"{direction}\"}} {}",
                tokens.load(Ordering::Relaxed)
            );
        }
        family(
            &mut out,
            "perch_heartbeat_outcomes_total",
            "Heartbeat runs, per task and outcome.",
            &["task", "outcome"],
            &self.heartbeat_outcomes.snapshot(),
        );
        for (name, help, kind, value) in [
            (
                "perch_inbox_depth",
                "Inbox items waiting.",
                "gauge",
                &self.inbox_depth,
            ),
            (
                "perch_vm_boots_total",
                "Times the sandbox machine was booted (resumed or created).",
                "counter",
                &self.vm_boots,
            ),
            (
                "perch_lane_open_failures_total",
                "Times a lane could not be opened; its items waited and it was tried again.",
                "counter",
                &self.lane_open_failures,
            ),
            (
                "perch_lanes_open",
                "Lanes open now (capped; idle ones close).",
                "gauge",
                &self.lanes_open,
            ),
            (
                "perch_lanes_open_peak",
                "The most lanes open at once since start.",
                "gauge",
                &self.lanes_open_peak,
            ),
            (
                "perch_conversations_active",
                "Conversations with a task now.",
                "gauge",
                &self.conversations_active,
            ),
        ] {
            header(&mut out, name, help, kind);
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        if let Some(allocated) = heap_allocated_bytes() {
            header(
                &mut out,
                "perch_heap_allocated_bytes",
                "Bytes the allocator has handed out and not taken back (glibc's mallinfo2: \
                 uordblks + hblkhd), read at the scrape.",
                "gauge",
            );
            let _ = writeln!(out, "perch_heap_allocated_bytes {allocated}");
        }
        out
    }
}

/// The bytes glibc's allocator has handed out and not taken back: small and medium blocks in
/// use in every arena (`uordblks`) plus the blocks it mapped on their own (`hblkhd`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_allocated_bytes() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments, returns a struct by value and only reads the
    // allocator's own statistics under its locks; glibc has had it since 2.33.
    #[allow(unsafe_code)]
    let info = unsafe { libc::mallinfo2() };
    u64::try_from(info.uordblks.saturating_add(info.hblkhd)).ok()
}

/// Another allocator than glibc's: not measured.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_allocated_bytes() -> Option<u64> {
    None
}

/// The most malloc arenas: an agent allocates little and from few threads at once, and each
/// extra arena keeps its own free pages (glibc's default is eight per core).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS_MAX: libc::c_int = 2;

/// Sizes glibc's allocator for one agent; called at the very start of `main`, before any thread
/// is started.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_allocator() {
    // SAFETY: mallopt only sets the allocator's parameters under its own lock; called before
    // any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS_MAX);
    }
}

/// Another allocator than glibc's: left as it is.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_allocator() {}

/// Gives the pages freed since the last call back to the system, in every arena (after a burst
/// of conversations has ended and its lanes have closed).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    // SAFETY: malloc_trim takes the allocator's locks itself and only returns free pages.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Another allocator than glibc's: left to it.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn family(
    out: &mut String,
    name: &str,
    help: &str,
    label_names: &[&str],
    samples: &BTreeMap<Labels, u64>,
) {
    header(out, name, help, "counter");
    for (values, count) in samples {
        let labels: Vec<String> = label_names
            .iter()
            .zip(values)
            .map(|(name, value)| format!("{name}=\"{}\"", escape_label(value)))
            .collect();
        let _ = writeln!(out, "{name}{{{}}} {count}", labels.join(","));
    }
}

/// A label value as the text format writes it: backslash, double quote and newline escaped.
pub fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// What a request's head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
}

/// Routes a request by its request line: `GET /metrics` (a query string is ignored) is the
/// only thing served.
pub fn route(head: &str) -> Route {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (words.next().unwrap_or_default(), words.next());
    let path = target
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        (_, "/metrics") => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

/// The longest request head read; a longer one is answered 404 from what was read.
const HEAD_LIMIT: usize = 8 * 1024;

/// How long a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one connection may take from accept to close, the answer included, so a client
/// that stops reading cannot hold its slot.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The most connections open at once. A scraper needs one; the rest absorb retries. Anyone on
/// the machine can connect, and each connection is a descriptor perch also needs for its lanes
/// and channels.
///
/// When every slot is taken, a new connection closes the oldest one that has not yet sent its
/// request head, and takes its place; only when all of them are being answered is the new one
/// closed on accept. An answer takes no time to speak of, so idle connections cannot keep a
/// scrape out however many there are: a scraper sends its request as soon as it connects, and is
/// only closed if [`MAX_CONNECTIONS`] newer connections arrive before its request does. Each
/// connection also has [`HEAD_TIMEOUT`] from accept for its head, and [`CONNECTION_TIMEOUT`] in
/// all.
pub const MAX_CONNECTIONS: usize = 16;

/// The most connection descriptors the server holds at once: those with a slot, and those closed
/// for a newer one whose task has not yet let go of them. The accept loop waits for one to be
/// let go rather than run ahead of the closes under a flood of idle connections.
pub const MAX_DESCRIPTORS: usize = 2 * MAX_CONNECTIONS;

/// How long the accept loop pauses after a failed accept (`EMFILE` and the like) before it tries
/// again, instead of spinning on the error.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// One open connection, in [`OpenConnections`].
#[derive(Debug)]
struct OpenConnection {
    id: u64,
    /// Its request head has come: it is being answered, and is never closed for a newer one.
    head_read: bool,
    /// Cancelled to close it for a newer connection.
    close: CancellationToken,
}

/// The connections open now, oldest first.
#[derive(Debug, Default)]
struct OpenConnections {
    next_id: u64,
    open: std::collections::VecDeque<OpenConnection>,
}

/// What became of a newly accepted connection.
enum Admitted {
    /// It has a slot: its id, and the token that closes it.
    Open(u64, CancellationToken),
    /// It took the slot of the oldest connection still waiting for its head, which is closed.
    Replaced(u64, CancellationToken),
    /// Every slot is being answered: it is closed unanswered.
    Refused,
}

impl OpenConnections {
    fn admit(&mut self) -> Admitted {
        let mut replaced = false;
        if self.open.len() >= MAX_CONNECTIONS {
            let Some(oldest_idle) = self.open.iter().position(|open| !open.head_read) else {
                return Admitted::Refused;
            };
            if let Some(idle) = self.open.remove(oldest_idle) {
                idle.close.cancel();
            }
            replaced = true;
        }
        let id = self.next_id;
        self.next_id += 1;
        let close = CancellationToken::new();
        self.open.push_back(OpenConnection {
            id,
            head_read: false,
            close: close.clone(),
        });
        if replaced {
            Admitted::Replaced(id, close)
        } else {
            Admitted::Open(id, close)
        }
    }

    fn head_read(&mut self, id: u64) {
        if let Some(open) = self.open.iter_mut().find(|open| open.id == id) {
            open.head_read = true;
        }
    }

    fn closed(&mut self, id: u64) {
        self.open.retain(|open| open.id != id);
    }
}

type Shared = Arc<Mutex<OpenConnections>>;

fn lock(open: &Shared) -> std::sync::MutexGuard<'_, OpenConnections> {
    open.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gives a connection's slot, and its share of [`MAX_DESCRIPTORS`], back when its task ends,
/// however it ends.
struct Slot {
    open: Shared,
    id: u64,
    _descriptor: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.open).closed(self.id);
    }
}

/// Answers `GET /metrics` on `listener` with what `scrape` renders, one request per connection,
/// at most [`MAX_CONNECTIONS`] at once (an idle one closed for a newer one), each within
/// [`CONNECTION_TIMEOUT`], until `shutdown`.
pub async fn serve<F, Fut>(listener: TcpListener, shutdown: CancellationToken, scrape: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let scrape = Arc::new(scrape);
    let open: Shared = Arc::default();
    let descriptors = Arc::new(tokio::sync::Semaphore::new(MAX_DESCRIPTORS));
    let (mut refused, mut replaced): (u64, u64) = (0, 0);
    loop {
        let descriptor = tokio::select! {
            () = shutdown.cancelled() => return,
            permit = Arc::clone(&descriptors).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let admitted = lock(&open).admit();
                let (id, close) = match admitted {
                    Admitted::Open(id, close) => (id, close),
                    Admitted::Replaced(id, close) => {
                        replaced += 1;
                        if replaced.is_power_of_two() {
                            tracing::warn!(
                                "metrics: {replaced} idle connection(s) closed unanswered, each for a newer one: {MAX_CONNECTIONS} were open and the oldest had sent no request"
                            );
                        }
                        (id, close)
                    }
                    Admitted::Refused => {
                        drop(stream);
                        refused += 1;
                        if refused.is_power_of_two() {
                            tracing::warn!(
                                "metrics: {refused} connection(s) closed unanswered: {MAX_CONNECTIONS} were already being answered"
                            );
                        }
                        continue;
                    }
                };
                let scrape = Arc::clone(&scrape);
                let slot = Slot {
                    open: Arc::clone(&open),
                    id,
                    _descriptor: descriptor,
                };
                tokio::spawn(async move {
                    let head_read = || lock(&slot.open).head_read(slot.id);
                    let answering = tokio::time::timeout(
                        CONNECTION_TIMEOUT,
                        answer(stream, scrape.as_ref(), head_read),
                    );
                    let answered = tokio::select! {
                        () = close.cancelled() => Err(std::io::Error::other(
                            "closed for a newer connection before it sent its request",
                        )),
                        answered = answering => answered
                            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
                    };
                    if let Err(error) = answered {
                        tracing::debug!("metrics: a request was not answered: {error}");
                    }
                    drop(slot);
                });
            }
            Err(error) => {
                tracing::warn!("metrics: cannot accept a connection: {error}");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

async fn answer<F, Fut>(
    mut stream: TcpStream,
    scrape: &F,
    head_read: impl FnOnce(),
) -> std::io::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = String>,
{
    let head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    head_read();
    let (status, content_type, body) = match route(&head) {
        Route::Metrics => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            scrape().await,
        ),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
        Route::NotFound => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found; the metrics are at /metrics\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the blank line that ends a request head (or [`HEAD_LIMIT`], or the end).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while head.len() < HEAD_LIMIT && !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..read]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}
