//! The crash-loop breaker: from the record of recent starts, whether this start should keep its
//! channels paused instead of hammering the platforms again.

use crate::Timestamp;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Unclean starts in a row, within [`WINDOW`], after which channels start paused.
pub const THRESHOLD: usize = 3;

/// How far back unclean starts count.
pub const WINDOW: Duration = Duration::from_secs(10 * 60);

/// How long channels stay paused before they connect anyway.
pub const COOL_DOWN: Duration = Duration::from_secs(15 * 60);

/// How many starts the record keeps.
pub const KEEP: usize = 20;

/// One start of `perch run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    pub at: Timestamp,
    /// When it stopped cleanly; `None` while it runs, and forever if it crashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Timestamp>,
}

/// Why channels start paused, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tripped {
    pub reason: String,
    pub until: Timestamp,
}

/// Decides for a start at `now`, given the earlier starts (oldest first; the current one not
/// among them): trips when the last [`THRESHOLD`] starts all ended uncleanly within [`WINDOW`].
pub fn breaker(earlier: &[Start], now: Timestamp) -> Option<Tripped> {
    let window = chrono::Duration::from_std(WINDOW).ok()?;
    let unclean: Vec<&Start> = earlier
        .iter()
        .rev()
        .take_while(|start| start.stopped.is_none() && now - start.at <= window)
        .collect();
    if unclean.len() < THRESHOLD {
        return None;
    }
    let until = now + chrono::Duration::from_std(COOL_DOWN).ok()?;
    Some(Tripped {
        reason: format!(
            "perch stopped without shutting down {} times in a row in the last {} minutes; \
             channels stay paused until {} so the platforms are not hammered. Look at the log \
             for the cause; a clean stop and start resets this",
            unclean.len(),
            WINDOW.as_secs() / 60,
            until.to_rfc3339()
        ),
        until,
    })
}

/// The record after a start at `now`: the earlier starts, the oldest dropped past [`KEEP`].
pub fn record_start(earlier: &[Start], now: Timestamp) -> Vec<Start> {
    let mut starts: Vec<Start> = earlier.to_vec();
    starts.push(Start {
        at: now,
        stopped: None,
    });
    let excess = starts.len().saturating_sub(KEEP);
    starts.drain(..excess);
    starts
}

/// The record after the start at `started` stopped cleanly at `now`.
pub fn record_stop(starts: &[Start], started: Timestamp, now: Timestamp) -> Vec<Start> {
    starts
        .iter()
        .map(|start| {
            if start.at == started {
                Start {
                    at: start.at,
                    stopped: Some(now),
                }
            } else {
                start.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minute: u32) -> Timestamp {
        chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 9, minute, 0)
            .unwrap()
    }

    fn crashed(minute: u32) -> Start {
        Start {
            at: at(minute),
            stopped: None,
        }
    }

    #[test]
    fn three_crashes_in_a_row_within_the_window_trip_it() {
        let earlier = [crashed(1), crashed(3), crashed(5)];
        let tripped = breaker(&earlier, at(6)).unwrap();
        assert!(
            tripped.reason.contains("3 times in a row"),
            "{}",
            tripped.reason
        );
        assert_eq!(tripped.until, at(21));
    }

    #[test]
    fn two_crashes_or_a_clean_stop_between_or_old_crashes_do_not() {
        assert_eq!(breaker(&[crashed(3), crashed(5)], at(6)), None);
        let clean = Start {
            at: at(4),
            stopped: Some(at(5)),
        };
        assert_eq!(
            breaker(&[crashed(1), crashed(2), clean, crashed(5)], at(6)),
            None
        );
        assert_eq!(breaker(&[crashed(1), crashed(2), crashed(3)], at(30)), None);
        assert_eq!(breaker(&[], at(0)), None);
    }

    #[test]
    fn the_record_keeps_the_latest_and_marks_the_clean_stop() {
        let mut starts = Vec::new();
        for minute in 0..25 {
            starts = record_start(&starts, at(minute));
        }
        assert_eq!(starts.len(), KEEP);
        assert_eq!(starts[0].at, at(5));
        let stopped = record_stop(&starts, at(24), at(26));
        assert_eq!(stopped.last().unwrap().stopped, Some(at(26)));
        assert!(
            stopped[..KEEP - 1]
                .iter()
                .all(|start| start.stopped.is_none())
        );
    }
}
