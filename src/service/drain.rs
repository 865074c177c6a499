//! The shutdown drain: how long a run in progress at shutdown may go on before it is aborted,
//! and how long after that its end is waited for.

use std::future::Future;
use std::time::Duration;

/// How long past the drain the service waits for aborted runs to be recorded.
pub(super) const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// The drain a run in progress at shutdown gets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Drain {
    pub(super) within: Duration,
}

impl Drain {
    /// Lets `run` finish within the drain (and deliver its reply); then calls `abort`, so that
    /// its operation is closed as cancelled, and waits [`DRAIN_MARGIN`] more. `None` when it
    /// did not end even then.
    pub(super) async fn finish<F: Future + Unpin>(
        self,
        run: &mut F,
        abort: impl FnOnce(),
    ) -> Option<F::Output> {
        if let Ok(finished) = tokio::time::timeout(self.within, &mut *run).await {
            return Some(finished);
        }
        tracing::warn!("a run did not finish within the drain; aborting it");
        abort();
        tokio::time::timeout(DRAIN_MARGIN, run).await.ok()
    }
}
