//! The clock the shell hands to whatever writes or decides by time: the wall clock here, a fixed
//! or stepping one in tests. The type is the core's, which never reads the clock itself.

pub use perch_core::clock::Clock;

/// The wall clock.
pub fn system_clock() -> Clock {
    Clock::new(chrono::Utc::now)
}
