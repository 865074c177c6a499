//! Times and durations as perch shows them to a person: the local time to the second, how long
//! ago or until, how long up. Never a nanosecond or a raw RFC 3339 stamp.

use perch_core::Timestamp;

/// `at` in the local time zone, to the second: `2026-12-03 21:40:05`.
pub fn local_time(at: Timestamp) -> String {
    at.with_timezone(&chrono::Local)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// `at` as local time, and how long before or after `now`: `2026-12-03 21:40:05 (5 min ago)`.
pub fn when(at: Timestamp, now: Timestamp) -> String {
    format!("{} ({})", local_time(at), relative(at, now))
}

/// An RFC 3339 instant as [`when`] shows it; text that does not read as one is shown as it is.
pub fn when_text(at: &str, now: Timestamp) -> String {
    chrono::DateTime::parse_from_rfc3339(at).map_or_else(
        |_| perch_core::terminal::shown(at),
        |at| when(at.with_timezone(&chrono::Utc), now),
    )
}

/// How far `at` is from `now`: `just now`, `5 min ago`, `in 3h 2min`.
pub fn relative(at: Timestamp, now: Timestamp) -> String {
    let seconds = (now - at).num_seconds();
    if seconds.abs() < 60 {
        return "just now".to_owned();
    }
    let span = span(seconds.unsigned_abs());
    if seconds > 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// A duration in its two largest units: `45s`, `12 min`, `3h 12min`, `2 days 3h`.
pub fn span(seconds: u64) -> String {
    let days = seconds / 86_400;
    let hours = seconds / 3_600 % 24;
    let minutes = seconds / 60 % 60;
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, minutes) => format!("{minutes} min"),
        (0, hours, minutes) => format!("{hours}h {minutes}min"),
        (1, hours, _) => format!("1 day {hours}h"),
        (days, hours, _) => format!("{days} days {hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_keep_their_two_largest_units() {
        for (seconds, said) in [
            (0, "0s"),
            (45, "45s"),
            (60, "1 min"),
            (12 * 60 + 59, "12 min"),
            (3 * 3600 + 12 * 60 + 5, "3h 12min"),
            (86_400 + 7_200, "1 day 2h"),
            (3 * 86_400 + 3_600 * 5 + 60, "3 days 5h"),
        ] {
            assert_eq!(span(seconds), said, "{seconds}");
        }
    }

    #[test]
    fn an_instant_is_before_or_after_now() {
        let now = chrono::Utc::now();
        assert_eq!(
            relative(now - chrono::Duration::seconds(20), now),
            "just now"
        );
        assert_eq!(
            relative(now - chrono::Duration::minutes(5), now),
            "5 min ago"
        );
        assert_eq!(
            relative(now + chrono::Duration::minutes(125), now),
            "in 2h 5min"
        );
        assert_eq!(when_text("not a time", now), "not a time");
    }
}
