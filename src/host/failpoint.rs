//! Failpoints: named places where a test build can make perch die on the spot, to prove that
//! recovery handles a crash at every step. `PERCH_FAILPOINT=after:tool_started` aborts the
//! process right after that record is written. Compiled in only with the `failpoints` feature
//! (test builds); in every other build [`hit`] and [`stall`] do nothing.

/// Aborts the process if `PERCH_FAILPOINT` names `point`.
#[cfg(feature = "failpoints")]
pub fn hit(point: &str) {
    if std::env::var("PERCH_FAILPOINT").is_ok_and(|wanted| wanted == point) {
        std::process::abort();
    }
}

/// Failpoints are compiled out of this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &str) {}

/// Blocks the calling thread for a minute if `PERCH_FAILPOINT` names `point`: a step that
/// hangs. Call it only on a thread of its own, never on the async runtime.
#[cfg(feature = "failpoints")]
pub fn stall(point: &str) {
    if std::env::var("PERCH_FAILPOINT").is_ok_and(|wanted| wanted == point) {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Failpoints are compiled out of this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn stall(_point: &str) {}
