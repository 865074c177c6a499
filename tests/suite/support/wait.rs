//! The one way a test waits for something: look at a condition every so often until it holds,
//! and fail naming what was awaited once the deadline passes. Nothing sleeps longer than the
//! poll interval.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a wait lasts at the most, unless the test says otherwise.
pub const WAIT: Duration = Duration::from_secs(60);
/// How often a condition is looked at, unless the test says otherwise.
pub const POLL: Duration = Duration::from_millis(20);

/// A way of waiting: at most `limit`, looking every `every`.
#[derive(Debug, Clone, Copy)]
pub struct Poll {
    limit: Duration,
    every: Duration,
}

impl Poll {
    /// At most `limit`, looking every [`POLL`].
    pub const fn within(limit: Duration) -> Poll {
        Poll { limit, every: POLL }
    }

    /// The same deadline, looking every `every`.
    pub const fn every(self, every: Duration) -> Poll {
        Poll { every, ..self }
    }

    /// Whether `done` came to hold before the deadline.
    pub fn holds(self, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + self.limit;
        loop {
            if done() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(self.every);
        }
    }

    /// Returns once `done` holds; fails the test naming `what` when the deadline passes first.
    pub fn until(self, what: &str, done: impl FnMut() -> bool) {
        assert!(self.holds(done), "timed out waiting for {what}");
    }

    /// [`Poll::holds`] in async code: the condition is a future, and the wait yields.
    pub async fn holds_async<F, Fut>(self, mut done: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + self.limit;
        loop {
            if done().await {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// [`Poll::until`] in async code: the condition is a future, and the wait yields.
    pub async fn until_async<F, Fut>(self, what: &str, done: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        assert!(self.holds_async(done).await, "timed out waiting for {what}");
    }

    /// The first value `attempt` gives, trying again while it gives none; the wait yields in
    /// between. Fails the test naming `what` when the deadline passes first.
    pub async fn value_async<T>(self, what: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
        let mut value = None;
        let found = self
            .holds_async(|| {
                value = attempt();
                std::future::ready(value.is_some())
            })
            .await;
        assert!(found, "timed out waiting for {what}");
        value.expect("the attempt gave a value")
    }
}

/// Waits until `done` holds, at most [`WAIT`], looking every [`POLL`].
pub fn wait_until(what: &str, done: impl FnMut() -> bool) {
    Poll::within(WAIT).until(what, done);
}
