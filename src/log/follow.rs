//! Following lanes while `perch run` writes them, without its lock: the lines appended after a
//! known position, across segment rolls and restarts, each once.
//!
//! The follower takes no lock, writes nothing and repairs nothing. It learns of new bytes from
//! inotify: one watch on the sessions directory (a lane directory appears) and one on each lane
//! directory (a segment file is written, or the next one is renamed into place). Between events
//! it does nothing, so many idle lanes cost nothing, and an event costs one lane: a `stat` of the
//! next segment's name, an open, and a read of the new bytes from the lane's offset, never the
//! segment from its start. A lane inotify cannot watch (past `fs.inotify.max_user_watches`) is
//! looked at every [`POLL_INTERVAL`] instead, and so is a sessions directory that does not exist
//! yet.
//!
//! A line is sent when the writer would keep it. A line is complete at its newline; bytes after
//! the last newline are a torn tail and are not a line yet. A complete line that does not parse
//! and ends the newest segment is torn too, by the writer's own rule: when it reopens the lane it
//! cuts such a line and writes its `tail_repaired` record at the same offset. So that line is
//! held back until more bytes follow it or the lane continues in a new segment, and only then
//! sent as [`ReadLine::Damaged`]; a position therefore never names two different lines.

use super::LogError;
use super::segment::{parse_line, segment_numbers, segment_path};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use perch_core::log::{LinePosition, ReadLine};
use perch_core::name::LaneName;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{self, ErrorKind};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The longest line a follower holds in memory. The writer sets no limit of its own (an index
/// row records a line's length in 32 bits); a longer line is skipped without being kept and sent
/// as [`ReadLine::Damaged`].
pub const MAX_LINE_BYTES: u64 = 16 << 20;

/// How often a lane without an inotify watch, or a sessions directory not created yet, is
/// looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How much of a file is read at once.
const CHUNK: usize = 64 << 10;

/// How many bytes of one lane a pass reads before the other lanes get their turn.
const PASS_BYTES: u64 = 1 << 20;

/// Where each lane under `sessions` ends now: the position just past its last complete line in
/// its newest segment (a torn tail, or a last line that does not parse, is not a line yet). A
/// lane directory without a segment is left out; [`follow`] reads such a lane from its start.
pub fn ends(sessions: &Path) -> Result<BTreeMap<LaneName, LinePosition>, LogError> {
    let mut ends = BTreeMap::new();
    for (lane, dir) in lane_dirs(sessions)? {
        let Some(&segment) = segment_numbers(&dir)?.last() else {
            continue;
        };
        let path = segment_path(&dir, segment);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => continue,
            Err(error) => return Err(LogError::io(&path, "open")(error)),
        };
        let len = file
            .metadata()
            .map_err(LogError::io(&path, "inspect"))?
            .len();
        let offset = kept_end(&file, &path, len)?;
        ends.insert(
            lane.clone(),
            LinePosition {
                lane,
                segment,
                offset,
            },
        );
    }
    Ok(ends)
}

/// Sends every line appended under `sessions` after `from` (a lane missing from `from` is read
/// from its first line, so lanes created while following are seen whole), in each lane's
/// order, until `stop` or until nobody receives. A line that cannot be read is sent as
/// [`ReadLine::Damaged`] and following goes on.
///
/// Each line is sent once: a lane's lines are read from its position to the end of the segment,
/// then from the start of the next segment (its header first), and a line is sent only once it
/// is one the writer keeps. New bytes are read as inotify reports them (see the module's
/// documentation for the cost); the reads are small and made on the calling task.
pub async fn follow(
    sessions: &Path,
    from: BTreeMap<LaneName, LinePosition>,
    lines: mpsc::Sender<(LinePosition, ReadLine)>,
    stop: CancellationToken,
) -> Result<(), LogError> {
    Follower::start(sessions, from, Arc::default())?
        .run(lines, stop)
        .await
}

/// The lane directories under `sessions`; none when it does not exist.
fn lane_dirs(sessions: &Path) -> Result<Vec<(LaneName, PathBuf)>, LogError> {
    let listing = match fs::read_dir(sessions) {
        Ok(listing) => listing,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(LogError::io(sessions, "list")(error)),
    };
    let mut lanes = Vec::new();
    for item in listing {
        let item = item.map_err(LogError::io(sessions, "list"))?;
        if !item.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        if let Some(lane) = item
            .file_name()
            .to_str()
            .and_then(|name| LaneName::try_from(name).ok())
        {
            lanes.push((lane, item.path()));
        }
    }
    Ok(lanes)
}

/// Where the lines the writer keeps end in a file of `len` bytes: past the last newline, or at
/// the start of the last line when that line ends the file and does not parse.
fn kept_end(file: &File, path: &Path, len: u64) -> Result<u64, LogError> {
    let Some(newline) = last_newline(file, path, len)? else {
        return Ok(0);
    };
    let end = newline + 1;
    if end < len {
        return Ok(end);
    }
    let start = last_newline(file, path, newline)?.map_or(0, |before| before + 1);
    let parses = match usize::try_from(end - start) {
        Ok(size) if end - start <= MAX_LINE_BYTES => {
            let mut bytes = vec![0; size];
            file.read_exact_at(&mut bytes, start)
                .map_err(LogError::io(path, "read"))?;
            parse_line(&bytes).is_ok()
        }
        _ => false,
    };
    Ok(if parses { end } else { start })
}

/// The offset of the last newline before `before`, reading backwards a chunk at a time.
fn last_newline(file: &File, path: &Path, before: u64) -> Result<Option<u64>, LogError> {
    let mut chunk = vec![0; CHUNK];
    let mut end = before;
    while end > 0 {
        let start = end.saturating_sub(CHUNK as u64);
        let piece = &mut chunk[..(end - start) as usize];
        file.read_exact_at(piece, start)
            .map_err(LogError::io(path, "read"))?;
        if let Some(at) = piece.iter().rposition(|&byte| byte == b'\n') {
            return Ok(Some(start + at as u64));
        }
        end = start;
    }
    Ok(None)
}

/// What following has cost so far, counted where the cost is paid, so a test can hold it to
/// flat cost however many lanes there are.
#[derive(Debug, Default)]
pub(crate) struct Work {
    /// Lanes looked at for new bytes.
    pub drains: AtomicU64,
    /// Segment files opened.
    pub opens: AtomicU64,
    /// Timer wake-ups for polled lanes.
    pub ticks: AtomicU64,
}

impl Work {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One lane's read position: the next line to send.
#[derive(Debug)]
struct Cursor {
    dir: PathBuf,
    segment: u32,
    /// Where the next line starts.
    offset: u64,
    /// The 1-based number of the line at `offset` in its file, once known (it is counted only
    /// when a damaged line needs naming, for a lane followed from the middle of a segment).
    line: Option<u64>,
    /// The line at `offset` is longer than [`MAX_LINE_BYTES`]; its bytes up to here were
    /// scanned for its end and dropped.
    skipped_to: Option<u64>,
}

/// What one pass over a lane found.
#[derive(Debug, Default)]
struct Pass {
    lines: Vec<(LinePosition, ReadLine)>,
    /// It stopped at [`PASS_BYTES`] with more to read.
    more: bool,
}

impl Cursor {
    fn at(dir: PathBuf, position: Option<LinePosition>) -> Result<Cursor, LogError> {
        let (segment, offset, line) = match position {
            Some(position) => (position.segment, position.offset, None),
            None => {
                let first = segment_numbers(&dir)?.first().copied().unwrap_or(1);
                (first, 0, Some(1))
            }
        };
        Ok(Cursor {
            dir,
            segment,
            offset,
            line,
            skipped_to: None,
        })
    }

    /// Reads what was appended since the last pass, at most [`PASS_BYTES`] of it, finishing a
    /// segment before going on to the next.
    fn read_new(&mut self, lane: &LaneName, work: &Work) -> Result<Pass, LogError> {
        let mut pass = Pass::default();
        let mut budget = PASS_BYTES;
        loop {
            // Looked for before the segment is read: every byte of a segment is written before
            // the next one is created, so reading it after seeing its successor reads it whole.
            let next = segment_path(&self.dir, self.segment + 1);
            let continued = next.try_exists().map_err(LogError::io(&next, "inspect"))?;
            pass.more = self.read_segment(lane, continued, &mut pass.lines, &mut budget, work)?;
            if pass.more || !continued {
                return Ok(pass);
            }
            self.segment += 1;
            self.offset = 0;
            self.line = Some(1);
            self.skipped_to = None;
        }
    }

    /// Reads the complete lines of the current segment after `offset`; returns whether it
    /// stopped because the budget ran out.
    fn read_segment(
        &mut self,
        lane: &LaneName,
        continued: bool,
        out: &mut Vec<(LinePosition, ReadLine)>,
        budget: &mut u64,
        work: &Work,
    ) -> Result<bool, LogError> {
        let path = segment_path(&self.dir, self.segment);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(LogError::io(&path, "open")(error)),
        };
        Work::count(&work.opens);
        let len = file
            .metadata()
            .map_err(LogError::io(&path, "inspect"))?
            .len();
        let mut start = self.offset;
        let mut read_from = self.skipped_to.unwrap_or(start);
        let mut skipping = self.skipped_to.is_some();
        let mut line = Vec::new();
        let mut chunk = vec![0; CHUNK];
        while read_from < len {
            let wanted = usize::try_from(len - read_from).map_or(CHUNK, |left| left.min(CHUNK));
            let read = file
                .read_at(&mut chunk[..wanted], read_from)
                .map_err(LogError::io(&path, "read"))?;
            if read == 0 {
                break;
            }
            let mut rest = &chunk[..read];
            let mut at = read_from;
            while let Some(newline) = rest.iter().position(|&byte| byte == b'\n') {
                let (piece, after) = rest.split_at(newline + 1);
                let end = at + piece.len() as u64;
                let too_long = skipping || (line.len() + piece.len()) as u64 > MAX_LINE_BYTES;
                let parsed = if too_long {
                    Err(format!("longer than {MAX_LINE_BYTES} bytes, not read"))
                } else {
                    line.extend_from_slice(piece);
                    parse_line(&line)
                };
                if parsed.is_err() && end == len && !continued {
                    self.offset = start;
                    self.skipped_to = too_long.then_some(end - 1);
                    return Ok(false);
                }
                let read_line = match parsed {
                    Ok(parsed) => ReadLine::Line(parsed),
                    Err(reason) => ReadLine::Damaged {
                        file: path.display().to_string(),
                        line: self.line_number(&file, &path, start)?,
                        reason,
                    },
                };
                out.push((
                    LinePosition {
                        lane: lane.clone(),
                        segment: self.segment,
                        offset: start,
                    },
                    read_line,
                ));
                self.line = self.line.map(|number| number + 1);
                *budget = budget.saturating_sub(end - start);
                start = end;
                at = end;
                rest = after;
                line.clear();
                skipping = false;
                if *budget == 0 {
                    self.offset = start;
                    self.skipped_to = None;
                    return Ok(true);
                }
            }
            if !skipping {
                if (line.len() + rest.len()) as u64 > MAX_LINE_BYTES {
                    skipping = true;
                    line = Vec::new();
                } else {
                    line.extend_from_slice(rest);
                }
            }
            read_from += read as u64;
        }
        self.offset = start;
        self.skipped_to = skipping.then_some(read_from);
        Ok(false)
    }

    /// The number of the line starting at `offset`, counting newlines before it the first time.
    fn line_number(&mut self, file: &File, path: &Path, offset: u64) -> Result<u64, LogError> {
        if let Some(number) = self.line {
            return Ok(number);
        }
        let mut chunk = vec![0; CHUNK];
        let mut newlines = 0;
        let mut at = 0;
        while at < offset {
            let wanted = usize::try_from(offset - at).map_or(CHUNK, |left| left.min(CHUNK));
            let read = file
                .read_at(&mut chunk[..wanted], at)
                .map_err(LogError::io(path, "read"))?;
            if read == 0 {
                break;
            }
            newlines += chunk[..read].iter().filter(|&&byte| byte == b'\n').count() as u64;
            at += read as u64;
        }
        self.line = Some(newlines + 1);
        Ok(newlines + 1)
    }
}

/// The inotify instance and the thread that waits on it: the thread polls the instance and the
/// read end of a pipe, and hands each batch of events over; dropping this closes the pipe's
/// write end, which ends the thread.
#[derive(Debug)]
struct Watcher {
    inotify: Arc<Inotify>,
    events: mpsc::Receiver<io::Result<Vec<InotifyEvent>>>,
    _stop: io::PipeWriter,
}

impl Watcher {
    fn start(sessions: &Path) -> Result<Watcher, LogError> {
        let failed = |source: io::Error| LogError::io(sessions, "watch")(source);
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|errno| failed(errno.into()))?;
        let inotify = Arc::new(inotify);
        let (stopped, stop) = io::pipe().map_err(failed)?;
        let (sender, events) = mpsc::channel(64);
        let waiting = Arc::clone(&inotify);
        std::thread::Builder::new()
            .name("perch-follow".into())
            .spawn(move || wait_for_events(&waiting, &stopped, &sender))
            .map_err(failed)?;
        Ok(Watcher {
            inotify,
            events,
            _stop: stop,
        })
    }

    fn add_watch(&self, dir: &Path, flags: AddWatchFlags) -> nix::Result<WatchDescriptor> {
        self.inotify.add_watch(dir, flags)
    }
}

/// Hands over inotify's events until `stopped` is closed or nobody takes them. When events come
/// faster than they are taken, the kernel's queue overflows and says so, and the follower looks
/// at every lane again.
fn wait_for_events(
    inotify: &Inotify,
    stopped: &io::PipeReader,
    events: &mpsc::Sender<io::Result<Vec<InotifyEvent>>>,
) {
    loop {
        let mut ready = [
            PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stopped.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut ready, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => {
                let _ = events.blocking_send(Err(errno.into()));
                return;
            }
        }
        if ready[1].any() != Some(false) {
            return;
        }
        let batch = match inotify.read_events() {
            Ok(batch) => Ok(batch),
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(errno) => Err(errno.into()),
        };
        let failed = batch.is_err();
        if events.blocking_send(batch).is_err() || failed {
            return;
        }
    }
}

/// What a lane directory's watch reports: a segment written, or created under its own name.
fn lane_events() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ONLYDIR
}

/// The lanes being followed, their watches, and the ones with new bytes to read.
#[derive(Debug)]
pub(crate) struct Follower {
    sessions: PathBuf,
    watcher: Watcher,
    /// The watch on the sessions directory, once it exists.
    sessions_watch: Option<WatchDescriptor>,
    watches: HashMap<WatchDescriptor, LaneName>,
    lanes: HashMap<LaneName, Cursor>,
    /// Lanes without a watch, looked at every [`POLL_INTERVAL`].
    polled: Vec<LaneName>,
    /// Where to start lanes not found yet.
    from: BTreeMap<LaneName, LinePosition>,
    dirty: VecDeque<LaneName>,
    queued: HashSet<LaneName>,
    work: Arc<Work>,
}

impl Follower {
    /// Watches `sessions` and every lane in it, and marks every lane for a first look (what was
    /// appended between `from` and the watch being in place).
    pub(crate) fn start(
        sessions: &Path,
        from: BTreeMap<LaneName, LinePosition>,
        work: Arc<Work>,
    ) -> Result<Follower, LogError> {
        let watcher = Watcher::start(sessions)?;
        let mut follower = Follower {
            sessions: sessions.to_owned(),
            watcher,
            sessions_watch: None,
            watches: HashMap::new(),
            lanes: HashMap::new(),
            polled: Vec::new(),
            from,
            dirty: VecDeque::new(),
            queued: HashSet::new(),
            work,
        };
        follower.discover()?;
        Ok(follower)
    }

    /// Watches the sessions directory if it is not watched yet, then adds the lanes in it that
    /// are not followed yet.
    fn discover(&mut self) -> Result<(), LogError> {
        if self.sessions_watch.is_none() {
            let flags =
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
            match self.watcher.add_watch(&self.sessions, flags) {
                Ok(watch) => self.sessions_watch = Some(watch),
                Err(Errno::ENOENT) => return Ok(()),
                Err(errno) => return Err(LogError::io(&self.sessions, "watch")(errno.into())),
            }
        }
        for (lane, dir) in lane_dirs(&self.sessions)? {
            if !self.lanes.contains_key(&lane) {
                self.add_lane(lane, dir)?;
            }
        }
        Ok(())
    }

    fn add_lane(&mut self, lane: LaneName, dir: PathBuf) -> Result<(), LogError> {
        match self.watcher.add_watch(&dir, lane_events()) {
            Ok(watch) => {
                self.watches.insert(watch, lane.clone());
            }
            // Gone again, or not a directory.
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(()),
            Err(Errno::ENOSPC) => self.polled.push(lane.clone()),
            Err(errno) => return Err(LogError::io(&dir, "watch")(errno.into())),
        }
        let cursor = Cursor::at(dir, self.from.remove(&lane))?;
        self.lanes.insert(lane.clone(), cursor);
        self.mark(lane);
        Ok(())
    }

    fn mark(&mut self, lane: LaneName) {
        if self.queued.insert(lane.clone()) {
            self.dirty.push_back(lane);
        }
    }

    fn on_event(&mut self, event: InotifyEvent) -> Result<(), LogError> {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            // Events were lost: look at everything once.
            let lanes: Vec<LaneName> = self.lanes.keys().cloned().collect();
            for lane in lanes {
                self.mark(lane);
            }
            return self.discover();
        }
        let name = event.name.as_ref().and_then(|name| name.to_str());
        if Some(event.wd) == self.sessions_watch {
            if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                self.sessions_watch = None;
                return Ok(());
            }
            if event.mask.contains(AddWatchFlags::IN_ISDIR)
                && let Some(lane) = name.and_then(|name| LaneName::try_from(name).ok())
                && !self.lanes.contains_key(&lane)
            {
                let dir = self.sessions.join(lane.as_str());
                self.add_lane(lane, dir)?;
            }
            return Ok(());
        }
        let Some(lane) = self.watches.get(&event.wd).cloned() else {
            return Ok(());
        };
        if event.mask.contains(AddWatchFlags::IN_IGNORED) {
            // The directory is gone; a lane made again under its name is read from its start.
            self.watches.remove(&event.wd);
            self.lanes.remove(&lane);
        } else if name.is_some_and(|name| name.ends_with(".jsonl")) {
            self.mark(lane);
        }
        Ok(())
    }

    fn on_tick(&mut self) -> Result<(), LogError> {
        Work::count(&self.work.ticks);
        if self.sessions_watch.is_none() {
            self.discover()?;
        }
        for lane in self.polled.clone() {
            self.mark(lane);
        }
        Ok(())
    }

    fn polling(&self) -> bool {
        self.sessions_watch.is_none() || !self.polled.is_empty()
    }

    /// Reads one marked lane's new lines.
    fn drain_one(&mut self) -> Result<Option<Pass>, LogError> {
        let Some(lane) = self.dirty.pop_front() else {
            return Ok(None);
        };
        self.queued.remove(&lane);
        let Some(cursor) = self.lanes.get_mut(&lane) else {
            return Ok(Some(Pass::default()));
        };
        Work::count(&self.work.drains);
        let pass = cursor.read_new(&lane, &self.work)?;
        if pass.more {
            self.mark(lane);
        }
        Ok(Some(pass))
    }

    pub(crate) async fn run(
        mut self,
        lines: mpsc::Sender<(LinePosition, ReadLine)>,
        stop: CancellationToken,
    ) -> Result<(), LogError> {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        loop {
            while let Some(pass) = self.drain_one()? {
                for line in pass.lines {
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return Ok(()),
                        sent = lines.send(line) => if sent.is_err() { return Ok(()) },
                    }
                }
                if stop.is_cancelled() {
                    return Ok(());
                }
            }
            let polling = self.polling();
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                events = self.watcher.events.recv() => {
                    let events = events
                        .unwrap_or_else(|| Err(io::Error::other("the watching thread stopped")))
                        .map_err(LogError::io(&self.sessions, "watch"))?;
                    for event in events {
                        self.on_event(event)?;
                    }
                }
                _ = tick.tick(), if polling => self.on_tick()?,
            }
        }
    }
}

#[cfg(test)]
mod tests;
