//! Where the time comes from. The core never reads the clock: the shell makes a [`Clock`] from
//! the wall clock, and tests from a fixed or stepping one.

use crate::Timestamp;
use std::sync::Arc;

/// A source of the current time, passed to whatever writes or decides by time. Clones share it.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl Clock {
    /// A clock that asks `now` for the time.
    pub fn new(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// The current time, as this clock tells it.
    pub fn now(&self) -> Timestamp {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_clock_tells_the_time_it_is_given() {
        let at = chrono::Utc.with_ymd_and_hms(2026, 12, 2, 6, 0, 0).unwrap();
        let clock = Clock::new(move || at);
        let shared = clock.clone();
        assert_eq!(clock.now(), at);
        assert_eq!(shared.now(), at);
    }
}
