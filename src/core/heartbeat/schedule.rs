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
    /// Parses a cron pattern: five fields (minute hour day-of-month month day-of-week), or six
    /// with seconds first when `seconds` asks for them; names such as `Mon-Fri` and `Jan` are
    /// accepted, and so are `@daily`-style shortcuts. Each field is checked on its own first,
    /// so a problem names the field at fault.
    pub fn cron(expr: &str, tz: Tz, seconds: bool) -> Result<Schedule, PatternError> {
        let trimmed = expr.trim();
        if trimmed.starts_with('@') {
            if !SHORTCUTS
                .iter()
                .any(|shortcut| shortcut.eq_ignore_ascii_case(trimmed))
            {
                return Err(PatternError::new(
                    format!("{expr:?} is not a shortcut perch knows"),
                    format!("use one of {}, or five fields", SHORTCUTS.join(", ")),
                ));
            }
        } else {
            check_fields(expr, seconds)?;
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expr).map_err(|_| {
            PatternError::new(
                format!("{expr:?} is not a cron pattern perch can read"),
                FIVE_FIELDS_FIX,
            )
        })?;
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

/// A cron pattern perch refuses: what is wrong, in perch's words, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub message: String,
    pub fix: String,
}

impl PatternError {
    fn new(message: impl Into<String>, fix: impl Into<String>) -> Self {
        PatternError {
            message: message.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

const SHORTCUTS: &[&str] = &[
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

const FIVE_FIELDS_FIX: &str = "write five fields, minute hour day-of-month month day-of-week, \
                               such as \"0 9 * * Mon-Fri\"";

const MONTHS: &[&str] = &[
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];

const WEEKDAYS: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// One field of a cron pattern: its name, its range, and what else it accepts.
struct FieldRule {
    name: &'static str,
    min: u32,
    max: u32,
    /// Names for values, the first one standing for `min`.
    names: &'static [&'static str],
    /// `?`, and the `L`, `W` and `#` forms croner reads in the day fields.
    day_forms: bool,
}

const SECOND: FieldRule = FieldRule {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    day_forms: false,
};

const FIVE_FIELD_RULES: [FieldRule; 5] = [
    FieldRule {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
        day_forms: false,
    },
    FieldRule {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
        day_forms: false,
    },
    FieldRule {
        name: "day-of-month",
        min: 1,
        max: 31,
        names: &[],
        day_forms: true,
    },
    FieldRule {
        name: "month",
        min: 1,
        max: 12,
        names: MONTHS,
        day_forms: false,
    },
    FieldRule {
        name: "day-of-week",
        min: 0,
        max: 7,
        names: WEEKDAYS,
        day_forms: true,
    },
];

/// Checks the number of fields against `seconds`, then each field against its rule.
fn check_fields(expr: &str, seconds: bool) -> Result<(), PatternError> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    match (fields.len(), seconds) {
        (5, false) | (6, true) => {}
        (6, false) => {
            let read_with_seconds = field_problem(&fields, true)
                .map(|problem| format!(" (read that way, {problem})"))
                .unwrap_or_default();
            let first_five = fields[..5].join(" ");
            let fix = if field_problem(&fields[..5], false).is_none() {
                format!(
                    "remove the extra field: \"{first_five}\"; or, if the first field is the \
                     second, add seconds: true to the task"
                )
            } else {
                "remove the extra field; or, if the first field is the second, add seconds: true \
                 to the task"
                    .to_owned()
            };
            return Err(PatternError::new(
                format!(
                    "{expr:?} has six fields; a pattern has five (minute hour day-of-month month \
                     day-of-week), and six are read seconds first only when the task says \
                     seconds: true{read_with_seconds}"
                ),
                fix,
            ));
        }
        (5, true) => {
            return Err(PatternError::new(
                format!(
                    "{expr:?} has five fields, but seconds: true asks for six (second minute \
                     hour day-of-month month day-of-week)"
                ),
                "put the second in front, such as \"30 0 9 * * Mon-Fri\", or remove seconds: true",
            ));
        }
        (count, _) => {
            return Err(PatternError::new(
                format!(
                    "{expr:?} has {count} fields; a pattern has five: minute hour day-of-month \
                     month day-of-week"
                ),
                FIVE_FIELDS_FIX,
            ));
        }
    }
    match field_problem(&fields, seconds) {
        None => Ok(()),
        Some(problem) => {
            let rule = problem.rule;
            let names = match rule.names.first().zip(rule.names.last()) {
                Some((first, last)) => {
                    format!(" or names {}-{}", title_case(first), title_case(last))
                }
                None => String::new(),
            };
            Err(PatternError::new(
                problem.to_string(),
                format!(
                    "write the {} as * or numbers {}-{}{names}, in lists (1,15), ranges (1-5) or \
                     steps (*/10)",
                    rule.name, rule.min, rule.max
                ),
            ))
        }
    }
}

/// The first field of `fields` that its rule refuses, read seconds first when `seconds`.
fn field_problem<'f>(fields: &[&'f str], seconds: bool) -> Option<FieldProblem<'f>> {
    let rules = std::iter::once(&SECOND)
        .filter(|_| seconds)
        .chain(FIVE_FIELD_RULES.iter());
    fields.iter().zip(rules).find_map(|(field, rule)| {
        check_field(field, rule)
            .err()
            .map(|(part, what)| FieldProblem {
                rule,
                field,
                part,
                what,
            })
    })
}

/// A field a rule refuses: the part at fault and what is wrong with it.
struct FieldProblem<'f> {
    rule: &'static FieldRule,
    field: &'f str,
    part: String,
    what: String,
}

impl fmt::Display for FieldProblem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {} field {:?}", self.rule.name, self.field)?;
        if self.part != self.field {
            write!(f, ": {:?}", self.part)?;
        }
        write!(f, " {}", self.what)
    }
}

fn title_case(name: &str) -> String {
    let mut letters = name.chars();
    letters
        .next()
        .map(|first| first.to_string() + &letters.as_str().to_lowercase())
        .unwrap_or_default()
}

/// The part of one field that croner would refuse or misread, and what is wrong with it.
fn check_field(field: &str, rule: &FieldRule) -> Result<(), (String, String)> {
    let items = if rule.names == WEEKDAYS {
        field.strip_prefix('+').unwrap_or(field)
    } else {
        field
    };
    for item in items.split(',') {
        if item.is_empty() {
            return Err((
                field.to_owned(),
                "has an empty item between commas".to_owned(),
            ));
        }
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => (base, Some(step)),
            None => (item, None),
        };
        match step.map(str::parse::<u32>) {
            Some(Ok(0)) => return Err((item.to_owned(), "steps by 0".to_owned())),
            Some(Err(_)) => {
                return Err((
                    item.to_owned(),
                    "has a step that is not a number".to_owned(),
                ));
            }
            _ => {}
        }
        if base == "*" || (rule.day_forms && base == "?") {
            continue;
        }
        if rule.day_forms && base.contains(['L', 'l', 'W', 'w', '#']) {
            continue;
        }
        let (start, end) = match base.split_once('-') {
            Some((start, end)) => (start, Some(end)),
            None => (base, None),
        };
        let start = value(start, rule)?;
        if let Some(end) = end {
            let ends_on_sunday = rule.names == WEEKDAYS && end.eq_ignore_ascii_case("SUN");
            let end = value(end, rule)?;
            if start > end && !ends_on_sunday {
                return Err((
                    base.to_owned(),
                    "runs backwards; write the smaller value first".to_owned(),
                ));
            }
        }
    }
    Ok(())
}

/// The number a field's value stands for.
fn value(text: &str, rule: &FieldRule) -> Result<u32, (String, String)> {
    let refused = |what: String| Err((text.to_owned(), what));
    if let Ok(number) = text.parse::<u32>() {
        if number < rule.min || number > rule.max {
            return refused(format!("is out of range {}-{}", rule.min, rule.max));
        }
        return Ok(number);
    }
    let upper = text.to_ascii_uppercase();
    if let Some(index) = rule.names.iter().position(|name| *name == upper) {
        return Ok(rule.min + u32::try_from(index).unwrap_or(0));
    }
    if MONTHS.contains(&upper.as_str()) {
        return refused("names a month; months go in the month field".to_owned());
    }
    if WEEKDAYS.contains(&upper.as_str()) {
        return refused("names a day of the week; days go in the day-of-week field".to_owned());
    }
    refused(format!("is not a number from {} to {}", rule.min, rule.max))
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

    /// A pattern that must read; six fields are read seconds first.
    fn cron(expr: &str, tz: Tz) -> Schedule {
        let seconds = expr.split_whitespace().count() == 6;
        Schedule::cron(expr, tz, seconds).unwrap()
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
    fn six_fields_put_seconds_first_only_when_seconds_are_asked_for() {
        let schedule = cron("15 0 9 * * *", chrono_tz::UTC);
        assert_eq!(
            next_slot(&schedule, at("2026-04-01T00:00:00Z")),
            Some(at("2026-04-01T09:00:15Z"))
        );
        let refused = Schedule::cron("0 9 * * Mon-Fri *", chrono_tz::UTC, false).unwrap_err();
        assert_eq!(
            refused.message,
            "\"0 9 * * Mon-Fri *\" has six fields; a pattern has five (minute hour day-of-month \
             month day-of-week), and six are read seconds first only when the task says \
             seconds: true (read that way, the month field \"Mon-Fri\": \"Mon\" names a day of \
             the week; days go in the day-of-week field)"
        );
        assert_eq!(
            refused.fix,
            "remove the extra field: \"0 9 * * Mon-Fri\"; or, if the first field is the second, \
             add seconds: true to the task"
        );
        let five = Schedule::cron("0 9 * * *", chrono_tz::UTC, true).unwrap_err();
        assert!(
            five.message.contains("but seconds: true asks for six"),
            "{five}"
        );
    }

    #[test]
    fn each_field_is_checked_and_named_in_perchs_words() {
        let cases: &[(&str, bool, &str)] = &[
            (
                "0 25 * * *",
                false,
                "the hour field \"25\" is out of range 0-23",
            ),
            (
                "60 9 * * *",
                false,
                "the minute field \"60\" is out of range 0-59",
            ),
            (
                "0 9,25 * * *",
                false,
                "the hour field \"9,25\": \"25\" is out of range 0-23",
            ),
            (
                "0 9 0 * *",
                false,
                "the day-of-month field \"0\" is out of range 1-31",
            ),
            (
                "0 9 * 13 *",
                false,
                "the month field \"13\" is out of range 1-12",
            ),
            (
                "0 9 * * 8",
                false,
                "the day-of-week field \"8\" is out of range 0-7",
            ),
            (
                "61 0 9 * * *",
                true,
                "the second field \"61\" is out of range 0-59",
            ),
            (
                "0 9 * Mon *",
                false,
                "the month field \"Mon\" names a day of the week; days go in the day-of-week \
                 field",
            ),
            (
                "0 9 * * Jan",
                false,
                "the day-of-week field \"Jan\" names a month; months go in the month field",
            ),
            (
                "0 nine * * *",
                false,
                "the hour field \"nine\" is not a number from 0 to 23",
            ),
            ("*/0 * * * *", false, "the minute field \"*/0\" steps by 0"),
            (
                "*/x * * * *",
                false,
                "the minute field \"*/x\" has a step that is not a number",
            ),
            (
                "0 17-9 * * *",
                false,
                "the hour field \"17-9\" runs backwards; write the smaller value first",
            ),
            (
                "0 9,,10 * * *",
                false,
                "the hour field \"9,,10\" has an empty item between commas",
            ),
            (
                "0 9 * *",
                false,
                "\"0 9 * *\" has 4 fields; a pattern has five",
            ),
            ("0 0 9 * * * 2026", true, "has 7 fields"),
            (
                "@fortnightly",
                false,
                "\"@fortnightly\" is not a shortcut perch knows",
            ),
            ("every day", false, "has 2 fields"),
        ];
        for (expr, seconds, expected) in cases {
            let refused = Schedule::cron(expr, chrono_tz::UTC, *seconds).unwrap_err();
            assert!(
                refused.message.starts_with(expected) || refused.message.contains(expected),
                "{expr}: {refused}"
            );
            assert!(!refused.message.contains("rror"), "{expr}: {refused}");
        }
        let fix = Schedule::cron("0 9 * 13 *", chrono_tz::UTC, false)
            .unwrap_err()
            .fix;
        assert_eq!(
            fix,
            "write the month as * or numbers 1-12 or names Jan-Dec, in lists (1,15), ranges (1-5) \
             or steps (*/10)"
        );
        for accepted in [
            "0 9 * * Mon-Fri",
            "0 9 * * sat-sun",
            "0 9 * * 1-7",
            "0 9 L * *",
            "0 9 15W * *",
            "0 9 ? * Fri#2",
            "0 9 * * 5L",
            "0 9 1 Jan,Jul *",
            "*/15 8-18/2 * * *",
            "@daily",
            "@Weekly",
        ] {
            assert!(
                Schedule::cron(accepted, chrono_tz::UTC, false).is_ok(),
                "{accepted}: {:?}",
                Schedule::cron(accepted, chrono_tz::UTC, false)
            );
        }
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
