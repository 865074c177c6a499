//! Pure decisions for chat delivery: delivery ids, splitting a reply to a platform's limit,
//! whether a failed attempt is tried again, what to do with a delivery that has no receipt after
//! a restart.

use crate::Timestamp;
use std::time::Duration;

/// The longest delivery id: Discord's nonce limit.
pub const DELIVERY_ID_LEN: usize = 25;

/// A delivery id from 16 random or time-ordered bytes: `d` and 24 hex digits, 25 ASCII
/// characters.
pub fn delivery_id(bytes: [u8; 16]) -> String {
    let mut id = String::with_capacity(DELIVERY_ID_LEN);
    id.push('d');
    for byte in &bytes[4..] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// What to do, after a restart, with a delivery whose intent was recorded and whose receipt
/// was not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreceipted {
    /// Inside the platform's deduplication window: send again with the same id; the platform
    /// drops it if the first attempt got through.
    Resend,
    /// No idempotency, or its window has passed: whether it was posted is unknown. Reported,
    /// never resent, so nothing is posted twice.
    Unknown,
    /// Older than the outbox's time to live: dropped with a record, not flooded out late.
    Expired,
}

/// Whether a delivery without a receipt may have reached its platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// It may have been posted: perch stopped during or after an attempt at it.
    Maybe,
    /// It certainly was not: perch stopped before its first attempt, or while it waited (its
    /// turn, a rate limit, a retry after a request that never reached the platform), and the
    /// outbox says so.
    Not,
}

/// Decides [`Unreceipted`] for an intent recorded at `recorded`. One that was certainly not
/// sent is sent now on any platform, as long as it is not too old.
pub fn unreceipted(
    recorded: Timestamp,
    now: Timestamp,
    resend_window: Option<Duration>,
    ttl: Duration,
    sent: Sent,
) -> Unreceipted {
    let age = (now - recorded).to_std().unwrap_or(Duration::ZERO);
    if age > ttl {
        return Unreceipted::Expired;
    }
    match (sent, resend_window) {
        (Sent::Not, _) => Unreceipted::Resend,
        (Sent::Maybe, Some(window)) if age <= window => Unreceipted::Resend,
        (Sent::Maybe, _) => Unreceipted::Unknown,
    }
}

/// The longest a delivery waits out a platform's rate limits, in total, before it is given up
/// as not sent.
pub const MAX_RATE_LIMITED: Duration = Duration::from_secs(600);

/// Attempts at a delivery that never reached its platform (1 s, doubling to a minute, between
/// them: about four minutes) before it is given up as not sent.
pub const NOT_SENT_ATTEMPTS: u32 = 10;

/// Attempts at a delivery whose request failed with an unknown fate, on a platform that drops a
/// resend with the same id, before its fate is given up as unknown.
pub const RESEND_ATTEMPTS: u32 = 3;

/// How one attempt at a delivery failed, as far as trying again goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// The platform asked to wait this long; the message was not posted.
    RateLimited { retry_after: Duration },
    /// The platform refused this message for good.
    Rejected,
    /// The request failed; whether the message was posted is unknown.
    Failed,
    /// The request never reached the platform; the message was certainly not posted.
    NotSent,
}

/// What a delivery went through so far: the attempts made and the rate-limit waits taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempts {
    /// Attempts made, the one that just failed included.
    pub made: u32,
    /// The platform's rate-limit waits already waited out, in total.
    pub rate_limited: Duration,
    /// Whether an attempt failed in a way that leaves it unknown whether it was posted.
    pub maybe_posted: bool,
}

impl Attempts {
    /// Whether no attempt so far may have posted the delivery (every one was rate-limited or
    /// never reached the platform), so that while it waits to try again the outbox can say it
    /// is certainly not posted, and a restart sends it on any platform.
    pub fn certainly_not_posted(&self) -> bool {
        !self.maybe_posted
    }
}

/// What to do after a failed attempt at a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Send again, with the same id, after waiting this long (zero: at once).
    After(Duration),
    /// Give up: the message was certainly not posted (recorded as `dropped`).
    NotSent(NotSentBecause),
    /// Give up: whether the message was posted is unknown (recorded as `unknown`, reported, and
    /// never resent, so nothing is posted twice).
    Unknown,
}

/// Why a delivery was given up as not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSentBecause {
    /// The platform kept asking to wait for longer than [`MAX_RATE_LIMITED`] in total.
    RateLimitedTooLong,
    /// The platform refused the message for good.
    Rejected,
    /// It never reached the platform in this many attempts.
    NeverReached { attempts: u32 },
}

impl NotSentBecause {
    /// The reason recorded with the dropped delivery; `message` is the platform's or the
    /// connection's last error.
    pub fn reason(&self, message: &str) -> String {
        match self {
            NotSentBecause::RateLimitedTooLong => format!(
                "not sent: the platform kept asking to wait for over {} s",
                MAX_RATE_LIMITED.as_secs()
            ),
            NotSentBecause::Rejected => message.to_owned(),
            NotSentBecause::NeverReached { attempts } => {
                format!("never reached the platform in {attempts} attempts: {message}")
            }
        }
    }
}

/// Decides what follows a failed attempt. `before` is the history before it (so `before.made` is
/// the number of earlier attempts); `resends` says whether the platform drops a resend with the
/// same id inside its deduplication window. Returns the history including this attempt beside
/// the decision.
///
/// A rate limit means the message was not posted: it is waited out however often, up to
/// [`MAX_RATE_LIMITED`] in total, and never makes a delivery's fate unknown. A request that never
/// reached the platform is tried [`NOT_SENT_ATTEMPTS`] times, 1 s doubling to a minute apart. A
/// failed request is resent at once with the same id only where the platform deduplicates, up to
/// [`RESEND_ATTEMPTS`] in all; otherwise its fate is unknown.
pub fn after_failure(
    before: Attempts,
    failure: AttemptFailure,
    resends: bool,
) -> (Attempts, Retry) {
    let made = before.made.saturating_add(1);
    let mut now = Attempts {
        made,
        rate_limited: before.rate_limited,
        maybe_posted: before.maybe_posted || failure == AttemptFailure::Failed,
    };
    let retry = match failure {
        AttemptFailure::RateLimited { retry_after } => {
            now.rate_limited = before.rate_limited.saturating_add(retry_after);
            if now.rate_limited > MAX_RATE_LIMITED {
                Retry::NotSent(NotSentBecause::RateLimitedTooLong)
            } else {
                Retry::After(retry_after)
            }
        }
        AttemptFailure::Rejected => Retry::NotSent(NotSentBecause::Rejected),
        AttemptFailure::NotSent if made < NOT_SENT_ATTEMPTS => {
            Retry::After(Duration::from_secs(1 << (made - 1).min(6)).min(Duration::from_secs(60)))
        }
        AttemptFailure::NotSent => Retry::NotSent(NotSentBecause::NeverReached { attempts: made }),
        AttemptFailure::Failed if resends && made < RESEND_ATTEMPTS => Retry::After(Duration::ZERO),
        AttemptFailure::Failed => Retry::Unknown,
    };
    (now, retry)
}

/// Splits `text` into pieces of at most `max_chars` characters, preferring paragraph breaks,
/// then line breaks, then spaces, and never cutting inside a fenced code block unless the block
/// alone is longer than the limit (then it is closed and reopened around the cut, so every piece
/// renders).
pub fn split_message(text: &str, max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(16);
    let mut pieces = Vec::new();
    let mut current = String::new();
    for block in blocks(text) {
        let joined = if current.is_empty() {
            block.clone()
        } else {
            format!("{current}\n\n{block}")
        };
        if joined.chars().count() <= max_chars {
            current = joined;
            continue;
        }
        if !current.is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
        if block.chars().count() <= max_chars {
            current = block;
        } else {
            let mut parts = cut_long(&block, max_chars);
            if let Some(last) = parts.pop() {
                pieces.extend(parts);
                current = last;
            }
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// Paragraphs, with each fenced code block kept whole as one block.
fn blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut in_code = false;
    for line in text.split('\n') {
        let fence = line.trim_start().starts_with("```");
        if !in_code && line.trim().is_empty() {
            if !current.is_empty() {
                blocks.push(current.join("\n"));
                current.clear();
            }
            continue;
        }
        current.push(line);
        if fence {
            in_code = !in_code;
        }
    }
    if !current.is_empty() {
        blocks.push(current.join("\n"));
    }
    blocks
}

/// A block longer than the limit, cut at line breaks, then spaces, then anywhere; a code block
/// is closed before each cut and reopened after it.
fn cut_long(block: &str, max_chars: usize) -> Vec<String> {
    let code_fence = block
        .lines()
        .next()
        .filter(|line| line.trim_start().starts_with("```"))
        .map(|line| line.trim().to_owned());
    let (open, close) = match &code_fence {
        Some(fence) => (format!("{fence}\n"), "\n```".to_owned()),
        None => (String::new(), String::new()),
    };
    let budget = max_chars
        .saturating_sub(open.chars().count() + close.chars().count())
        .max(8);
    let body = match &code_fence {
        Some(_) => {
            let inner = block.split_once('\n').map_or("", |(_, rest)| rest);
            inner
                .strip_suffix("```")
                .unwrap_or(inner)
                .trim_end_matches('\n')
        }
        None => block,
    };
    let mut pieces = Vec::new();
    let mut rest = body;
    while rest.chars().count() > budget {
        let limit = rest
            .char_indices()
            .nth(budget)
            .map_or(rest.len(), |(index, _)| index);
        let window = &rest[..limit];
        let cut = window
            .rfind('\n')
            .or_else(|| window.rfind(' '))
            .filter(|&at| at > 0)
            .unwrap_or(limit);
        pieces.push(format!("{open}{}{close}", &rest[..cut]));
        rest = rest[cut..].trim_start_matches(['\n', ' ']);
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(format!("{open}{rest}{close}"));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn ids_fit_discords_nonce() {
        let id = delivery_id([0xab; 16]);
        assert_eq!(id.len(), DELIVERY_ID_LEN);
        assert!(id.is_ascii());
    }

    #[test]
    fn unreceipted_deliveries_are_resent_only_inside_the_window() {
        let at = chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap();
        let later = |secs| at + chrono::Duration::seconds(secs);
        let window = Some(Duration::from_secs(300));
        let ttl = Duration::from_secs(3600);
        let table = [
            (10, window, Sent::Maybe, Unreceipted::Resend),
            (400, window, Sent::Maybe, Unreceipted::Unknown),
            (10, None, Sent::Maybe, Unreceipted::Unknown),
            (4000, window, Sent::Maybe, Unreceipted::Expired),
            (10, None, Sent::Not, Unreceipted::Resend),
            (400, window, Sent::Not, Unreceipted::Resend),
            (3600, None, Sent::Not, Unreceipted::Resend),
            (3601, None, Sent::Not, Unreceipted::Expired),
        ];
        for (after, window, sent, expected) in table {
            assert_eq!(
                unreceipted(at, later(after), window, ttl, sent),
                expected,
                "{after} s later, window {window:?}, sent {sent:?}"
            );
        }
    }

    /// Runs a sequence of failures through [`after_failure`], returning every decision.
    fn decisions(failures: &[AttemptFailure], resends: bool) -> Vec<Retry> {
        let mut attempts = Attempts::default();
        failures
            .iter()
            .map(|failure| {
                let (next, retry) = after_failure(attempts, *failure, resends);
                attempts = next;
                retry
            })
            .collect()
    }

    #[test]
    fn a_delivery_is_certainly_not_posted_until_an_attempt_fails_with_an_unknown_fate() {
        use AttemptFailure::*;
        let limited = RateLimited {
            retry_after: Duration::from_secs(3),
        };
        let table: [(&[AttemptFailure], bool); 5] = [
            (&[], true),
            (&[limited], true),
            (&[NotSent, limited], true),
            (&[Failed], false),
            (&[Failed, limited], false),
        ];
        for (failures, expected) in table {
            let attempts = failures
                .iter()
                .fold(Attempts::default(), |before, failure| {
                    after_failure(before, *failure, true).0
                });
            assert_eq!(attempts.certainly_not_posted(), expected, "{failures:?}");
        }
    }

    #[test]
    fn the_retry_policy_by_failure_and_history() {
        use AttemptFailure::*;
        let secs = Duration::from_secs;
        let limited = |s| RateLimited {
            retry_after: secs(s),
        };
        let table: Vec<(&str, Vec<AttemptFailure>, bool, Vec<Retry>)> = vec![
            (
                "a rate limit is waited out as told",
                vec![limited(30)],
                false,
                vec![Retry::After(secs(30))],
            ),
            (
                "rate limits add up to the bound and no further",
                vec![limited(300), limited(300), limited(1)],
                true,
                vec![
                    Retry::After(secs(300)),
                    Retry::After(secs(300)),
                    Retry::NotSent(NotSentBecause::RateLimitedTooLong),
                ],
            ),
            (
                "one wait longer than the bound gives up at once",
                vec![limited(601)],
                false,
                vec![Retry::NotSent(NotSentBecause::RateLimitedTooLong)],
            ),
            (
                "a refusal is final",
                vec![Rejected],
                true,
                vec![Retry::NotSent(NotSentBecause::Rejected)],
            ),
            (
                "a failure without deduplication is unknown at once",
                vec![Failed],
                false,
                vec![Retry::Unknown],
            ),
            (
                "a failure with deduplication is resent at once, three attempts in all",
                vec![Failed, Failed, Failed],
                true,
                vec![
                    Retry::After(Duration::ZERO),
                    Retry::After(Duration::ZERO),
                    Retry::Unknown,
                ],
            ),
            (
                "rate limits count as attempts for a later failure",
                vec![limited(1), limited(1), Failed],
                true,
                vec![Retry::After(secs(1)), Retry::After(secs(1)), Retry::Unknown],
            ),
        ];
        for (what, failures, resends, expected) in table {
            assert_eq!(decisions(&failures, resends), expected, "{what}");
        }
    }

    #[test]
    fn a_delivery_that_never_reaches_its_platform_backs_off_then_is_not_sent() {
        let decided = decisions(
            &[AttemptFailure::NotSent; NOT_SENT_ATTEMPTS as usize],
            false,
        );
        let waits: Vec<u64> = decided
            .iter()
            .filter_map(|retry| match retry {
                Retry::After(wait) => Some(wait.as_secs()),
                _ => None,
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(
            decided.last(),
            Some(&Retry::NotSent(NotSentBecause::NeverReached {
                attempts: NOT_SENT_ATTEMPTS
            }))
        );
    }

    #[test]
    fn not_sent_reasons_name_the_cause() {
        assert_eq!(
            NotSentBecause::RateLimitedTooLong.reason("429"),
            "not sent: the platform kept asking to wait for over 600 s"
        );
        assert_eq!(
            NotSentBecause::Rejected.reason("chat not found"),
            "chat not found"
        );
        assert_eq!(
            NotSentBecause::NeverReached { attempts: 10 }.reason("connection refused"),
            "never reached the platform in 10 attempts: connection refused"
        );
    }

    #[test]
    fn splitting_prefers_paragraphs_and_keeps_code_blocks_whole() {
        let text = format!(
            "{}\n\n```\n{}\n```\n\n{}",
            "a".repeat(30),
            "code line\n".repeat(3).trim_end(),
            "b".repeat(30)
        );
        let pieces = split_message(&text, 40);
        assert_eq!(pieces[0], "a".repeat(30));
        assert!(
            pieces[1].starts_with("```") && pieces[1].ends_with("```"),
            "{pieces:?}"
        );
        assert_eq!(pieces[2], "b".repeat(30));
        assert!(pieces.iter().all(|piece| piece.chars().count() <= 40));
    }

    #[test]
    fn a_code_block_longer_than_the_limit_is_closed_and_reopened() {
        let text = format!("```rust\n{}\n```", "let x = 1;\n".repeat(20).trim_end());
        let pieces = split_message(&text, 60);
        assert!(pieces.len() > 1);
        for piece in &pieces {
            assert!(
                piece.starts_with("```rust\n") && piece.ends_with("\n```"),
                "{piece:?}"
            );
            assert!(piece.chars().count() <= 60, "{piece:?}");
        }
    }
}
