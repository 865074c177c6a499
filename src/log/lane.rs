//! The handle to one lane's writer ([`super::writer`]): cloneable, each call a message to the
//! writer on its pool thread ([`super::pool`]), answered when done.

use super::error::LogError;
use super::pool::{self, Hosted};
use super::snapshot::{Appended, LaneSnapshot, OpenReport};
use super::writer::{Command, Encoded, Writer, stopped};
use crate::host::clock::Clock;
use perch_core::id::OperationId;
use perch_core::log::{Entry, Line, PendingTool};
use perch_core::name::LaneName;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A handle to one lane's writer. Clones talk to the same writer; when the last one is dropped
/// (or [`LaneLog::close`] is called) the writer leaves the pool, releasing the lane's lock and
/// files.
#[derive(Debug, Clone)]
pub struct LaneLog {
    lane: LaneName,
    hosted: Arc<Hosted>,
}

impl LaneLog {
    /// Opens (or creates) the lane under `sessions`, taking its lock, cutting off a torn tail
    /// and bringing its index up to date, then hands its writer to the pool. Blocking: call it
    /// from a blocking context.
    pub fn open(
        sessions: &Path,
        lane: &LaneName,
        clock: Clock,
    ) -> Result<(LaneLog, OpenReport), LogError> {
        let (writer, report) = Writer::open(sessions, lane, clock)?;
        let hosted = pool::host(writer)?;
        Ok((
            LaneLog {
                lane: lane.clone(),
                hosted: Arc::new(hosted),
            },
            report,
        ))
    }

    pub fn lane(&self) -> &LaneName {
        &self.lane
    }

    /// Appends one line. When this returns `Ok`, the line is written to the operating system,
    /// and fsynced too if the line's own [`Commit`](perch_core::log::Commit) policy says so.
    pub async fn append(&self, line: &Line) -> Result<Appended, LogError> {
        let encoded = Encoded::new(line);
        self.ask(|reply| Command::Append { encoded, reply }).await?
    }

    pub async fn snapshot(&self) -> Result<LaneSnapshot, LogError> {
        self.ask(|reply| Command::Snapshot { reply }).await
    }

    /// The conversation from its root to the current leaf, across segments.
    pub async fn branch(&self) -> Result<Vec<Entry>, LogError> {
        self.ask(|reply| Command::Branch { reply }).await?
    }

    /// Line `line` (0-based) of the newest segment.
    pub async fn read(&self, line: u64) -> Result<Line, LogError> {
        self.ask(|reply| Command::Read { line, reply }).await?
    }

    /// For each open operation, the tools whose declared results were never written.
    pub async fn pending_tools(&self) -> Result<Vec<(OperationId, Vec<PendingTool>)>, LogError> {
        self.ask(|reply| Command::PendingTools { reply }).await?
    }

    /// Continues the lane in a new segment file whose header names this one. Refused while an
    /// operation is open. Returns the new segment's number.
    pub async fn roll(&self) -> Result<u32, LogError> {
        self.ask(|reply| Command::Roll { reply }).await?
    }

    /// Writes everything queued before this call, takes the writer out of the pool and releases
    /// the lane.
    pub async fn close(self) -> Result<(), LogError> {
        self.ask(|reply| Command::Close { reply }).await
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, LogError> {
        let (reply, answer) = oneshot::channel();
        self.hosted.send(command(reply))?;
        answer.await.map_err(|_| stopped())
    }
}
