//! The crash-loop breaker: from the record of recent starts, whether this start should keep its
//! channels paused instead of hammering the platforms again. And what the last start recovered
//! (`.perch/last-start.json`).

use crate::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
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

/// `.perch/last-start.json`: what the last start of `perch run` recovered, for `perch status`.
/// Written whole at each start; its JSON is the `last_start` of `perch status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastStart {
    /// When it started, written as RFC 3339 with `+00:00`.
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub started: Timestamp,
    /// What recovery did in each lane a crash had left with an operation open.
    pub lanes_recovered: BTreeMap<String, LaneRecovered>,
    pub outbox: OutboxRecovered,
    pub inbox: InboxRecovered,
    /// Why the channels started paused (the crash-loop breaker), when they did.
    pub channels_paused: Option<String>,
}

/// What recovery did in one lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LaneRecovered {
    pub operations_closed: usize,
    pub tools_rerun: usize,
    pub tools_interrupted: usize,
}

/// What became of the deliveries recorded and not settled when perch stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutboxRecovered {
    /// Sent again, inside the platform's deduplication window.
    pub resent: usize,
    /// Marked unknown: perhaps posted, never sent again.
    pub unknown: usize,
    /// Dropped: older than the outbox's time to live.
    pub expired: usize,
}

/// What became of the inbox items still waiting when perch stopped. Counts a file written
/// before one of them existed lacks read as 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InboxRecovered {
    /// Items whose run had been recorded: answered or noted, not run again.
    pub already_answered: usize,
    /// Of those, the ones whose reply is posted only now.
    pub replied_after_restart: usize,
    /// Interrupted chat runs continued from their lane's leaf.
    pub resumed: usize,
    /// Interrupted runs answered with a note saying what was interrupted.
    pub noted_as_interrupted: usize,
    /// Items never taken, queued again.
    pub queued_again: usize,
    /// Events without a verdict, decided again.
    pub decided_again: usize,
    /// Events a hook was deciding when perch stopped, rejected.
    pub rejected_as_interrupted: usize,
}

impl LastStart {
    /// Reads `.perch/last-start.json`.
    pub fn read(text: &str) -> Result<LastStart, String> {
        serde_json::from_str(text).map_err(|error| format!("not a last start: {error}"))
    }
}

impl fmt::Display for LastStart {
    /// What it recovered, in words, for `perch status` (which shows when it started):
    /// `1 lane recovered; outbox: 1 resent, 1 unknown; inbox: nothing`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lanes = self.lanes_recovered.len();
        write!(
            f,
            "{lanes} lane{} recovered; outbox: {}; inbox: {}",
            if lanes == 1 { "" } else { "s" },
            self.outbox,
            self.inbox
        )
    }
}

/// The counts that are not zero, as `1 resent, 2 unknown`; `nothing` when all are.
fn counts_in_words(counts: &[(usize, &str)]) -> String {
    let said: Vec<String> = counts
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
    if said.is_empty() {
        "nothing".to_owned()
    } else {
        said.join(", ")
    }
}

impl fmt::Display for OutboxRecovered {
    /// The counts in words, those that are not zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&counts_in_words(&[
            (self.resent, "resent"),
            (self.unknown, "unknown"),
            (self.expired, "expired"),
        ]))
    }
}

impl fmt::Display for InboxRecovered {
    /// The counts in words, those that are not zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&counts_in_words(&[
            (self.already_answered, "already answered"),
            (self.replied_after_restart, "replied after the restart"),
            (self.resumed, "resumed"),
            (self.noted_as_interrupted, "noted as interrupted"),
            (self.queued_again, "queued again"),
            (self.decided_again, "decided again"),
            (self.rejected_as_interrupted, "rejected as interrupted"),
        ]))
    }
}

fn rfc3339<S: Serializer>(at: &Timestamp, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&at.to_rfc3339())
}

fn from_rfc3339<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Timestamp, D::Error> {
    let text = String::deserialize(deserializer)?;
    chrono::DateTime::parse_from_rfc3339(&text)
        .map(|at| at.with_timezone(&chrono::Utc))
        .map_err(serde::de::Error::custom)
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

    fn last_start() -> LastStart {
        LastStart {
            started: chrono::Utc
                .with_ymd_and_hms(2026, 12, 2, 6, 0, 0)
                .unwrap()
                .checked_add_signed(chrono::Duration::nanoseconds(123_456_789))
                .unwrap(),
            lanes_recovered: BTreeMap::from([(
                "tg-42".to_owned(),
                LaneRecovered {
                    operations_closed: 1,
                    tools_rerun: 1,
                    tools_interrupted: 0,
                },
            )]),
            outbox: OutboxRecovered {
                resent: 1,
                unknown: 1,
                expired: 0,
            },
            inbox: InboxRecovered {
                already_answered: 1,
                replied_after_restart: 1,
                resumed: 1,
                noted_as_interrupted: 0,
                queued_again: 2,
                decided_again: 0,
                rejected_as_interrupted: 0,
            },
            channels_paused: Some("paused".into()),
        }
    }

    #[test]
    fn last_start_golden() {
        let golden = concat!(
            r#"{"channels_paused":"paused","inbox":{"already_answered":1,"decided_again":0,"#,
            r#""noted_as_interrupted":0,"queued_again":2,"rejected_as_interrupted":0,"#,
            r#""replied_after_restart":1,"resumed":1},"lanes_recovered":{"tg-42":"#,
            r#"{"operations_closed":1,"tools_interrupted":0,"tools_rerun":1}},"#,
            r#""outbox":{"expired":0,"resent":1,"unknown":1},"#,
            r#""started":"2026-12-02T06:00:00.123456789+00:00"}"#
        );
        let tree = serde_json::to_value(last_start()).unwrap();
        assert_eq!(tree.to_string(), golden);
        assert_eq!(LastStart::read(golden).unwrap(), last_start());
        assert_eq!(
            last_start().to_string(),
            "1 lane recovered; outbox: 1 resent, 1 unknown; inbox: 1 already answered, 1 replied \
             after the restart, 1 resumed, 2 queued again",
            "the text says the counts in words, never as JSON"
        );
        assert_eq!(OutboxRecovered::default().to_string(), "nothing");
    }

    #[test]
    fn a_last_start_from_before_some_inbox_counts_existed_reads_them_as_zero() {
        let old = concat!(
            r#"{"channels_paused":null,"inbox":{"already_answered":1,"decided_again":0,"#,
            r#""queued_again":2},"lanes_recovered":{},"#,
            r#""outbox":{"expired":0,"resent":0,"unknown":0},"#,
            r#""started":"2026-12-02T06:00:00+00:00"}"#
        );
        let read = LastStart::read(old).unwrap();
        assert_eq!(
            read.inbox,
            InboxRecovered {
                already_answered: 1,
                queued_again: 2,
                ..InboxRecovered::default()
            }
        );
        assert_eq!(read.channels_paused, None);
        assert!(LastStart::read(r#"{"started":5}"#).is_err());
    }
}
