//! When a task fires: `every:` intervals aligned to the Unix epoch, and cron patterns on the
//! wall clock of a time zone.
//!
//! Cron patterns follow classic (Vixie) cron across daylight-saving changes. A pattern whose
//! second, minute and hour fields name fixed values (`30 2 * * *`, `0,30 9-17 * * *`) fires once
//! per matching wall-clock time: a time that spring-forward skips fires at the first instant after
//! the gap, and a time that fall-back repeats fires at its first occurrence only. A pattern with
//! `*` in one of those fields (`*/10 * * * *`, `0 * * * *`) follows real time instead: it does not
//! fire inside the gap and fires in both halves of the repeated hour. Day of month and day of week
//! combine like classic cron: when both are restricted, a day matching either one fires.

use crate::Timestamp;
use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use std::fmt;
use std::time::Duration;

/// The shortest time allowed between two slots of one task.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The most slots [`slots_between`] returns.
pub const SLOT_LIMIT: usize = 10_000;

/// The longest `every:` interval.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// How many firings of a cron pattern [`Schedule::check_floor`] looks at.
const FLOOR_SAMPLE: usize = 2000;

/// Where checks that sample a schedule start (2026-01-01T00:00:00Z), so they are repeatable.
pub(super) const SAMPLE_START: Timestamp = match DateTime::from_timestamp(1_767_225_600, 0) {
    Some(start) => start,
    None => DateTime::UNIX_EPOCH,
};

/// A task's schedule.
#[derive(Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Every multiple of the interval since the Unix epoch, so restarts never move a slot.
    Every(Duration),
    /// A cron pattern on the wall clock of `tz`. Build it with [`Schedule::cron`].
    Cron {
        expr: String,
        tz: Tz,
        cron: Box<Cron>,
        /// Whether the second, minute and hour fields all name fixed values (no `*`), which
        /// decides how the pattern crosses daylight-saving changes.
        fixed_time: bool,
    },
}

impl Schedule {
    /// Parses a cron pattern: five fields, or six with seconds first; names such as `Mon-Fri`
    /// and `Jan` are accepted, and so are `@daily`-style shortcuts.
    pub fn cron(expr: &str, tz: Tz) -> Result<Schedule, String> {
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser
            .parse(expr)
            .map_err(|error| format!("invalid cron pattern {expr:?}: {error}"))?;
        Ok(Schedule::Cron {
            expr: expr.to_owned(),
            tz,
            cron: Box::new(cron),
            fixed_time: is_fixed_time(expr),
        })
    }

    /// Refuses a schedule that can fire twice within [`MIN_INTERVAL`], or never fires. A cron
    /// pattern is judged on its first 2000 firings after 2026-01-01 in its zone.
    pub fn check_floor(&self) -> Result<(), String> {
        self.floor_sample().map(drop)
    }

    /// Like [`Schedule::check_floor`]; a cron pattern's firings that were looked at come back,
    /// in order, so that other checks need not compute them again (an `every:` interval is
    /// judged without any).
    pub fn floor_sample(&self) -> Result<Vec<Timestamp>, String> {
        match self {
            Schedule::Every(interval) => {
                if *interval < MIN_INTERVAL {
                    Err(format!(
                        "every {} is more often than the floor of one run per {}",
                        format_duration(*interval),
                        format_duration(MIN_INTERVAL)
                    ))
                } else {
                    Ok(Vec::new())
                }
            }
            Schedule::Cron { expr, .. } => {
                let first = next_slot(self, SAMPLE_START)
                    .ok_or_else(|| format!("cron pattern {expr:?} never fires"))?;
                let mut sample = Vec::with_capacity(FLOOR_SAMPLE);
                sample.push(first);
                let mut previous = first;
                for _ in 1..FLOOR_SAMPLE {
                    let Some(slot) = next_slot(self, previous) else {
                        break;
                    };
                    let gap = slot - previous;
                    if gap < TimeDelta::from_std(MIN_INTERVAL).unwrap_or(TimeDelta::MAX) {
                        return Err(format!(
                            "cron pattern {expr:?} fires at {previous} and again {} later, more \
                             often than the floor of one run per {}",
                            format_duration(gap.to_std().unwrap_or_default()),
                            format_duration(MIN_INTERVAL)
                        ));
                    }
                    sample.push(slot);
                    previous = slot;
                }
                Ok(sample)
            }
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every(interval) => f.debug_tuple("Every").field(interval).finish(),
            Schedule::Cron {
                expr,
                tz,
                fixed_time,
                ..
            } => f
                .debug_struct("Cron")
                .field("expr", expr)
                .field("tz", tz)
                .field("fixed_time", fixed_time)
                .finish_non_exhaustive(),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every(interval) => write!(f, "every {}", format_duration(*interval)),
            Schedule::Cron { expr, tz, .. } => write!(f, "cron {expr:?} in {tz}"),
        }
    }
}

fn is_fixed_time(expr: &str) -> bool {
    let expr = expr.trim();
    if expr.starts_with('@') {
        return !expr.eq_ignore_ascii_case("@hourly");
    }
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let time_fields = if fields.len() == 6 { 3 } else { 2 };
    fields
        .iter()
        .take(time_fields)
        .all(|field| !field.starts_with('*'))
}

/// Reads an `every:` interval: a number and a unit (`s`, `m`, `h`, `d`), or several from the
/// largest unit down, such as `1h30m`.
pub fn parse_every(text: &str) -> Result<Duration, String> {
    let units = [('d', 86_400u64), ('h', 3_600), ('m', 60), ('s', 1)];
    let mut rest = text;
    let mut total: u64 = 0;
    let mut next_unit = 0;
    if rest.is_empty() {
        return Err("an interval is empty; write it as 30m, 2h or 1h30m".to_owned());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let invalid = || format!("{text:?} is not an interval; write it as 30m, 2h or 1h30m");
        if digits == 0 || digits > 9 {
            return Err(invalid());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        let unit = rest[digits..].chars().next().ok_or_else(invalid)?;
        let Some(offset) = units[next_unit..].iter().position(|(u, _)| *u == unit) else {
            return Err(invalid());
        };
        let seconds = units[next_unit + offset].1;
        next_unit += offset + 1;
        total = total.saturating_add(number.saturating_mul(seconds));
        rest = &rest[digits + unit.len_utf8()..];
    }
    if total == 0 {
        return Err(format!("{text:?} is no time at all"));
    }
    let interval = Duration::from_secs(total);
    if interval > MAX_INTERVAL {
        return Err(format!(
            "{text:?} is longer than the longest interval, {}",
            format_duration(MAX_INTERVAL)
        ));
    }
    Ok(interval)
}

/// Writes a duration the way `every:` reads it: `1h30m`, `5m`, `45s`.
pub fn format_duration(duration: Duration) -> String {
    let mut seconds = duration.as_secs();
    if seconds == 0 {
        return "0s".to_owned();
    }
    let mut text = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            text.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    text
}

/// Active hours `HH:MM-HH:MM` on the task's wall clock; the start is included, the end is not,
/// and a range whose end comes before its start wraps past midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveHours {
    /// Minutes after midnight, 0 to 1439.
    pub start: u16,
    /// Minutes after midnight, 0 to 1440.
    pub end: u16,
}

impl ActiveHours {
    /// Reads `HH:MM-HH:MM`; the end may be `24:00`, and the two must differ.
    pub fn parse(text: &str) -> Result<ActiveHours, String> {
        let invalid = || format!("{text:?} is not a range of hours; write it as 08:00-18:00");
        let (start, end) = text.split_once('-').ok_or_else(invalid)?;
        let start = clock_minutes(start.trim(), false).ok_or_else(invalid)?;
        let end = clock_minutes(end.trim(), true).ok_or_else(invalid)?;
        if start == end || (start == 0 && end == 1440) {
            return Err(format!(
                "{text:?} covers the whole day; remove active_hours to run at any hour"
            ));
        }
        Ok(ActiveHours { start, end })
    }

    fn contains_minute(&self, minute: u16) -> bool {
        if self.start < self.end {
            self.start <= minute && minute < self.end
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

fn clock_minutes(text: &str, end: bool) -> Option<u16> {
    let (hours, minutes) = text.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: u16 = hours.parse().ok()?;
    let minutes: u16 = minutes.parse().ok()?;
    if end && hours == 24 && minutes == 0 {
        return Some(1440);
    }
    (hours < 24 && minutes < 60).then_some(hours * 60 + minutes)
}

impl fmt::Display for ActiveHours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}:{:02}-{:02}:{:02}",
            self.start / 60,
            self.start % 60,
            self.end / 60,
            self.end % 60
        )
    }
}

/// Whether `at` falls inside `hours` on the wall clock of `tz`.
pub fn in_active_hours(hours: &ActiveHours, tz: Tz, at: Timestamp) -> bool {
    let local = at.with_timezone(&tz);
    let minute = u16::try_from(local.hour() * 60 + local.minute()).unwrap_or(0);
    hours.contains_minute(minute)
}

/// The first slot strictly after `after`; `None` when the schedule never fires again.
pub fn next_slot(schedule: &Schedule, after: Timestamp) -> Option<Timestamp> {
    match schedule {
        Schedule::Every(interval) => {
            let step = i64::try_from(interval.as_secs()).ok().filter(|s| *s > 0)?;
            let next = after
                .timestamp()
                .div_euclid(step)
                .checked_add(1)?
                .checked_mul(step)?;
            DateTime::<Utc>::from_timestamp(next, 0)
        }
        Schedule::Cron {
            tz,
            cron,
            fixed_time: true,
            ..
        } => next_fixed_time(cron, *tz, after),
        Schedule::Cron {
            tz,
            cron,
            fixed_time: false,
            ..
        } => cron
            .find_next_occurrence(&after.with_timezone(tz), false)
            .ok()
            .map(|slot| slot.with_timezone(&Utc)),
    }
}

/// Walks the pattern's wall-clock times and maps each to its instant: the first of a repeated
/// time, the end of the gap for a skipped one. The mapping never goes back in time, so the first
/// time that maps past `after` is the answer.
fn next_fixed_time(cron: &Cron, tz: Tz, after: Timestamp) -> Option<Timestamp> {
    let mut wall = after.with_timezone(&tz).naive_local();
    for _ in 0..1000 {
        wall = cron.find_next_occurrence(&wall, false).ok()?;
        let slot = first_instant_at_or_after(tz, wall)?;
        if slot > after {
            return Some(slot);
        }
    }
    None
}

fn first_instant_at_or_after(tz: Tz, wall: NaiveDateTime) -> Option<Timestamp> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(instant) | LocalResult::Ambiguous(instant, _) => {
            return Some(instant.with_timezone(&Utc));
        }
        LocalResult::None => {}
    }
    let minute = TimeDelta::minutes(1);
    let mut probe = wall;
    for _ in 0..(26 * 60) {
        probe = probe.checked_add_signed(minute)?;
        if tz.from_local_datetime(&probe).earliest().is_some() {
            let mut first = probe;
            for back in 1..60 {
                let earlier = probe.checked_sub_signed(TimeDelta::seconds(back))?;
                if earlier <= wall || tz.from_local_datetime(&earlier).earliest().is_none() {
                    break;
                }
                first = earlier;
            }
            return tz
                .from_local_datetime(&first)
                .earliest()
                .map(|instant| instant.with_timezone(&Utc));
        }
    }
    None
}

/// The slots in `(after, up_to]`, in order, at most [`SLOT_LIMIT`] of them.
pub fn slots_between(schedule: &Schedule, after: Timestamp, up_to: Timestamp) -> Vec<Timestamp> {
    let mut slots = Vec::new();
    let mut cursor = after;
    while slots.len() < SLOT_LIMIT {
        match next_slot(schedule, cursor) {
            Some(slot) if slot <= up_to => {
                slots.push(slot);
                cursor = slot;
            }
            _ => break,
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn cron(expr: &str, tz: Tz) -> Schedule {
        Schedule::cron(expr, tz).unwrap()
    }

    fn firings(schedule: &Schedule, from: &str, to: &str) -> Vec<String> {
        slots_between(schedule, at(from), at(to))
            .iter()
            .map(|slot| slot.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .collect()
    }

    #[test]
    fn every_slots_are_multiples_of_the_interval_since_the_epoch() {
        let every = Schedule::Every(Duration::from_secs(30 * 60));
        assert_eq!(
            next_slot(&every, at("2026-05-04T10:07:13.250Z")),
            Some(at("2026-05-04T10:30:00Z"))
        );
        assert_eq!(
            next_slot(&every, at("2026-05-04T10:30:00Z")),
            Some(at("2026-05-04T11:00:00Z"))
        );
        assert_eq!(
            next_slot(&every, at("2026-05-04T10:29:59.999Z")),
            Some(at("2026-05-04T10:30:00Z"))
        );
        let odd = Schedule::Every(Duration::from_secs(7 * 60));
        for after in [
            "2026-05-04T10:03:00Z",
            "2026-05-04T10:05:00Z",
            "2026-05-04T10:09:59Z",
        ] {
            let slot = next_slot(&odd, at(after)).unwrap();
            assert_eq!(slot.timestamp() % 420, 0);
            assert_eq!(slot, at("2026-05-04T10:10:00Z"), "{after}");
        }
        assert_eq!(
            next_slot(&every, at("1969-12-31T23:45:00Z")),
            Some(at("1970-01-01T00:00:00Z"))
        );
    }

    #[test]
    fn weekday_mornings_in_berlin_follow_the_october_clock_change() {
        let standup = cron("0 9 * * Mon-Fri", chrono_tz::Europe::Berlin);
        assert_eq!(
            firings(&standup, "2026-10-22T00:00:00Z", "2026-10-30T23:00:00Z"),
            vec![
                "2026-10-22T07:00:00Z",
                "2026-10-23T07:00:00Z",
                "2026-10-26T08:00:00Z",
                "2026-10-27T08:00:00Z",
                "2026-10-28T08:00:00Z",
                "2026-10-29T08:00:00Z",
                "2026-10-30T08:00:00Z",
            ]
        );
    }

    #[test]
    fn a_time_skipped_by_spring_forward_fires_just_after_the_gap() {
        let new_york = cron("30 2 * * *", chrono_tz::America::New_York);
        assert_eq!(
            firings(&new_york, "2026-03-07T00:00:00Z", "2026-03-09T23:00:00Z"),
            vec![
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
            ]
        );
        let berlin = cron("30 2 * * *", chrono_tz::Europe::Berlin);
        assert_eq!(
            firings(&berlin, "2026-03-28T00:00:00Z", "2026-03-30T23:00:00Z"),
            vec![
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
            ]
        );
        let two_in_the_gap = cron("0,30 2 * * *", chrono_tz::Europe::Berlin);
        assert_eq!(
            firings(
                &two_in_the_gap,
                "2026-03-28T12:00:00Z",
                "2026-03-30T12:00:00Z"
            ),
            vec![
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:00:00Z",
                "2026-03-30T00:30:00Z",
            ]
        );
    }

    #[test]
    fn a_time_repeated_by_fall_back_fires_once() {
        let berlin = cron("30 2 * * *", chrono_tz::Europe::Berlin);
        assert_eq!(
            firings(&berlin, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z"),
            vec!["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
        assert_eq!(
            next_slot(&berlin, at("2026-10-25T01:00:00Z")),
            Some(at("2026-10-26T01:30:00Z"))
        );
        let new_york = cron("30 1 * * *", chrono_tz::America::New_York);
        assert_eq!(
            firings(&new_york, "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z"),
            vec!["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
    }

    #[test]
    fn wildcard_patterns_follow_real_time_across_clock_changes() {
        let half_hourly = cron("*/30 * * * *", chrono_tz::Europe::Berlin);
        assert_eq!(
            firings(&half_hourly, "2026-10-24T23:45:00Z", "2026-10-25T02:00:00Z"),
            vec![
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z",
            ]
        );
        assert_eq!(
            firings(&half_hourly, "2026-03-29T00:15:00Z", "2026-03-29T01:30:00Z"),
            vec![
                "2026-03-29T00:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:30:00Z",
            ]
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_are_ored() {
        let thirteenth_or_friday = cron("0 9 13 * Fri", chrono_tz::UTC);
        assert_eq!(
            firings(
                &thirteenth_or_friday,
                "2026-04-01T00:00:00Z",
                "2026-05-15T23:00:00Z"
            ),
            vec![
                "2026-04-03T09:00:00Z",
                "2026-04-10T09:00:00Z",
                "2026-04-13T09:00:00Z",
                "2026-04-17T09:00:00Z",
                "2026-04-24T09:00:00Z",
                "2026-05-01T09:00:00Z",
                "2026-05-08T09:00:00Z",
                "2026-05-13T09:00:00Z",
                "2026-05-15T09:00:00Z",
            ]
        );
        let first_only = cron("0 9 1 * *", chrono_tz::UTC);
        assert_eq!(
            firings(&first_only, "2026-04-01T10:00:00Z", "2026-06-01T10:00:00Z"),
            vec!["2026-05-01T09:00:00Z", "2026-06-01T09:00:00Z"]
        );
    }

    #[test]
    fn six_fields_put_seconds_first() {
        let schedule = cron("15 0 9 * * *", chrono_tz::UTC);
        assert_eq!(
            next_slot(&schedule, at("2026-04-01T00:00:00Z")),
            Some(at("2026-04-01T09:00:15Z"))
        );
        assert!(Schedule::cron("0 0 9 * * * 2026", chrono_tz::UTC).is_err());
        assert!(Schedule::cron("0 9 * *", chrono_tz::UTC).is_err());
        assert!(Schedule::cron("0 25 * * *", chrono_tz::UTC).is_err());
        assert!(Schedule::cron("every day", chrono_tz::UTC).is_err());
    }

    #[test]
    fn the_floor_refuses_schedules_that_fire_too_often() {
        let floor = |expr: &str| cron(expr, chrono_tz::Europe::Berlin).check_floor();
        assert!(floor("* * * * *").is_err());
        assert!(floor("*/5 * * * *").is_ok());
        assert!(floor("*/4 * * * *").is_err());
        assert!(floor("0 9 * * Mon-Fri").is_ok());
        assert!(floor("0 9 29 2 *").is_ok());
        assert!(floor("*/30 0 9 * * *").is_err());
        assert!(floor("0 */5 * * * *").is_ok());
        let refused = floor("0,1 9 * * *").unwrap_err();
        assert!(
            refused.contains("again 1m later, more often than the floor of one run per 5m"),
            "{refused}"
        );
        assert!(floor("0 0 30 2 *").unwrap_err().contains("never fires"));
        assert!(
            Schedule::Every(Duration::from_secs(299))
                .check_floor()
                .is_err()
        );
        assert!(Schedule::Every(MIN_INTERVAL).check_floor().is_ok());
    }

    #[test]
    fn intervals_read_units_from_the_largest_down() {
        for (text, seconds) in [
            ("30m", 1800),
            ("1h30m", 5400),
            ("2d", 172_800),
            ("45s", 45),
            ("1d2h3m4s", 93_784),
            ("90m", 5400),
        ] {
            assert_eq!(
                parse_every(text),
                Ok(Duration::from_secs(seconds)),
                "{text}"
            );
        }
        for bad in [
            "", "30", "m", "1m1h", "1.5h", "30 m", "0m", "1h1h", "-5m", "400d", "5M",
        ] {
            assert!(parse_every(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn active_hours_include_the_start_exclude_the_end_and_may_wrap() {
        let berlin = chrono_tz::Europe::Berlin;
        let office = ActiveHours::parse("08:00-18:00").unwrap();
        assert!(!in_active_hours(
            &office,
            berlin,
            at("2026-05-04T05:59:00Z")
        ));
        assert!(in_active_hours(&office, berlin, at("2026-05-04T06:00:00Z")));
        assert!(in_active_hours(&office, berlin, at("2026-05-04T15:59:59Z")));
        assert!(!in_active_hours(
            &office,
            berlin,
            at("2026-05-04T16:00:00Z")
        ));
        let night = ActiveHours::parse("22:00-06:00").unwrap();
        assert!(in_active_hours(
            &night,
            chrono_tz::UTC,
            at("2026-05-04T23:30:00Z")
        ));
        assert!(in_active_hours(
            &night,
            chrono_tz::UTC,
            at("2026-05-04T05:59:00Z")
        ));
        assert!(!in_active_hours(
            &night,
            chrono_tz::UTC,
            at("2026-05-04T06:00:00Z")
        ));
        assert!(!in_active_hours(
            &night,
            chrono_tz::UTC,
            at("2026-05-04T12:00:00Z")
        ));
        let evening = ActiveHours::parse("18:00-24:00").unwrap();
        assert!(in_active_hours(
            &evening,
            chrono_tz::UTC,
            at("2026-05-04T23:59:00Z")
        ));
        assert_eq!(evening.to_string(), "18:00-24:00");
        for bad in [
            "8-18",
            "08:00",
            "08:00-08:00",
            "00:00-24:00",
            "24:00-06:00",
            "08:60-09:00",
        ] {
            assert!(ActiveHours::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slots_between_stops_at_the_limit() {
        let every = Schedule::Every(MIN_INTERVAL);
        let slots = slots_between(
            &every,
            at("2026-01-01T00:00:00Z"),
            at("2027-01-01T00:00:00Z"),
        );
        assert_eq!(slots.len(), SLOT_LIMIT);
        assert_eq!(slots[0], at("2026-01-01T00:05:00Z"));
        assert!(slots.windows(2).all(|pair| pair[0] < pair[1]));
    }
}
