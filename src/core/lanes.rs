//! Which lanes stay open: a cap on lanes open at once, the least recently used idle lane
//! closed first when a new one needs its slot, idle lanes closed after a while, and how long an
//! item waits before its lane is tried again when it could not be opened.
//!
//! Times are durations since a point the caller picks (its own start), passed in.

use std::time::Duration;

/// Lanes open at once, unless the service is told otherwise: each holds its branch in memory
/// and a few descriptors, so the cap bounds both, whatever the number of conversations.
pub const DEFAULT_OPEN_MAX: usize = 64;

/// How long a lane nobody holds stays open before it is closed (reopened from disk on its next
/// message).
pub const DEFAULT_LANE_IDLE: Duration = Duration::from_secs(10);

/// How long a conversation's task waits for another message once it has nothing to do, before
/// it ends.
pub const DEFAULT_CONVERSATION_IDLE: Duration = Duration::from_secs(2);

/// The first wait before a lane that could not be opened is tried again; it doubles up to
/// [`OPEN_RETRY_MAX`].
pub const OPEN_RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest wait between two tries at opening a lane.
pub const OPEN_RETRY_MAX: Duration = Duration::from_secs(30);

/// One open lane, as far as choosing what to close goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenLane {
    /// A conversation's run or a heartbeat job holds it: it is never closed under them.
    pub held: bool,
    /// When it was last taken or let go.
    pub last_used: Duration,
}

/// Where a lane about to be opened fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Fewer than the cap are open: open it.
    Free,
    /// The cap is reached: close the lane at this index (the least recently used of those
    /// nobody holds) first.
    Close(usize),
    /// The cap is reached and every open lane is held: wait.
    Full,
}

/// Where a new lane fits among `open` under `cap`.
pub fn make_room(open: &[OpenLane], cap: usize) -> Room {
    if open.len() < cap {
        return Room::Free;
    }
    open.iter()
        .enumerate()
        .filter(|(_, lane)| !lane.held)
        .min_by_key(|(_, lane)| lane.last_used)
        .map_or(Room::Full, |(index, _)| Room::Close(index))
}

/// The lanes to close at `now` because nobody has held them for `idle` or longer, by index.
pub fn idle_past(open: &[OpenLane], now: Duration, idle: Duration) -> Vec<usize> {
    open.iter()
        .enumerate()
        .filter(|(_, lane)| !lane.held && now.saturating_sub(lane.last_used) >= idle)
        .map(|(index, _)| index)
        .collect()
}

/// How long to wait before trying again to open a lane that failed to open `failures` times in
/// a row (1 for the first failure).
pub fn open_retry(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    OPEN_RETRY_FIRST
        .saturating_mul(1 << doublings)
        .min(OPEN_RETRY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(held: bool, last_used_s: u64) -> OpenLane {
        OpenLane {
            held,
            last_used: Duration::from_secs(last_used_s),
        }
    }

    #[test]
    fn a_new_lane_takes_a_free_slot_or_the_least_recently_used_idle_one() {
        let cases: &[(&str, Vec<OpenLane>, usize, Room)] = &[
            ("none open", vec![], 2, Room::Free),
            ("under the cap", vec![lane(true, 1)], 2, Room::Free),
            (
                "at the cap, the oldest idle lane goes",
                vec![lane(false, 5), lane(false, 2), lane(false, 9)],
                3,
                Room::Close(1),
            ),
            (
                "a held lane is never closed, however old",
                vec![lane(true, 0), lane(false, 7), lane(false, 3)],
                3,
                Room::Close(2),
            ),
            (
                "every lane held",
                vec![lane(true, 0), lane(true, 1)],
                2,
                Room::Full,
            ),
            (
                "over the cap (lowered): still one at a time",
                vec![lane(false, 4), lane(false, 1), lane(true, 0)],
                1,
                Room::Close(1),
            ),
            ("a cap of zero opens nothing", vec![], 0, Room::Full),
        ];
        for (what, open, cap, expected) in cases {
            assert_eq!(make_room(open, *cap), *expected, "{what}");
        }
    }

    #[test]
    fn lanes_nobody_holds_close_once_idle_long_enough() {
        let idle = Duration::from_secs(10);
        let cases: &[(&str, Vec<OpenLane>, u64, Vec<usize>)] = &[
            ("nothing open", vec![], 100, vec![]),
            ("idle, but not for long", vec![lane(false, 95)], 100, vec![]),
            (
                "idle exactly long enough",
                vec![lane(false, 90)],
                100,
                vec![0],
            ),
            (
                "held lanes stay, however long",
                vec![lane(true, 0), lane(false, 1), lane(false, 99)],
                100,
                vec![1],
            ),
            (
                "a clock before the last use closes nothing",
                vec![lane(false, 200)],
                100,
                vec![],
            ),
        ];
        for (what, open, now, expected) in cases {
            assert_eq!(
                idle_past(open, Duration::from_secs(*now), idle),
                *expected,
                "{what}"
            );
        }
    }

    #[test]
    fn a_lane_that_fails_to_open_is_tried_again_later_and_later_up_to_a_bound() {
        let cases: &[(u32, Duration)] = &[
            (0, Duration::from_millis(100)),
            (1, Duration::from_millis(100)),
            (2, Duration::from_millis(200)),
            (3, Duration::from_millis(400)),
            (9, Duration::from_millis(25_600)),
            (10, OPEN_RETRY_MAX),
            (u32::MAX, OPEN_RETRY_MAX),
        ];
        for (failures, expected) in cases {
            assert_eq!(
                open_retry(*failures),
                *expected,
                "after {failures} failure(s)"
            );
        }
    }
}
