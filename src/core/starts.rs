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
    /// Whether that stop closed every lane it had open (every run drained or recorded as
    /// cancelled in time). Records from before this existed read as false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lanes_closed: bool,
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
        lanes_closed: false,
    });
    let excess = starts.len().saturating_sub(KEEP);
    starts.drain(..excess);
    starts
}

/// The record after the start at `started` stopped cleanly at `now`, having closed every lane
/// or not.
pub fn record_stop(
    starts: &[Start],
    started: Timestamp,
    now: Timestamp,
    lanes_closed: bool,
) -> Vec<Start> {
    starts
        .iter()
        .map(|start| {
            if start.at == started {
                Start {
                    at: start.at,
                    stopped: Some(now),
                    lanes_closed,
                }
            } else {
                start.clone()
            }
        })
        .collect()
}

/// Whether a start must look through the lanes on disk for operations left open: not when the
/// previous start (the last of `earlier`) stopped cleanly with every lane closed, since then
/// none can be open (a lane a crashed `perch chat` left open is recovered when it is next
/// opened, as every lane is).
pub fn lanes_need_recovery(earlier: &[Start]) -> bool {
    earlier
        .last()
        .is_none_or(|last| last.stopped.is_none() || !last.lanes_closed)
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
            lanes_closed: false,
        }
    }

    fn stopped(minute: u32, lanes_closed: bool) -> Start {
        Start {
            at: at(minute),
            stopped: Some(at(minute + 1)),
            lanes_closed,
        }
    }

    #[test]
    fn only_a_clean_stop_that_closed_every_lane_spares_the_next_start_the_scan() {
        let table = [
            (vec![], true),
            (vec![crashed(1)], true),
            (vec![stopped(1, false)], true),
            (vec![stopped(1, true)], false),
            (vec![stopped(1, true), crashed(3)], true),
            (vec![crashed(1), stopped(3, true)], false),
        ];
        for (earlier, scan) in table {
            assert_eq!(lanes_need_recovery(&earlier), scan, "{earlier:?}");
        }
        let old: Vec<Start> = serde_json::from_str(
            r#"[{"at":"2026-11-30T09:01:00Z","stopped":"2026-11-30T09:02:00Z"}]"#,
        )
        .unwrap();
        assert!(
            lanes_need_recovery(&old),
            "a record from before lanes_closed"
        );
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
        let clean = stopped(4, true);
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
        let stopped = record_stop(&starts, at(24), at(26), true);
        assert_eq!(stopped.last().unwrap().stopped, Some(at(26)));
        assert!(stopped.last().unwrap().lanes_closed);
        assert!(
            stopped[..KEEP - 1]
                .iter()
                .all(|start| start.stopped.is_none())
        );
    }
}
