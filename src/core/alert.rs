//! Owner alerts: what they are about, and the rate limit that keeps them from becoming noise.
//!
//! At most one message per kind is sent per [`WINDOW`]. Alerts of a kind that arrive inside the
//! window are counted, not sent; when the window ends, one message says how many there were and
//! what the last one said.

use crate::Timestamp;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How long after a kind's message the next one of that kind waits.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlertKind {
    /// A channel stopped (refused credentials) or its hook keeps failing.
    ChannelUnhealthy,
    /// A delivery ended `unknown`: it may or may not have been posted.
    DeliveryUnknown,
    /// A heartbeat task stopped until it is resumed.
    HeartbeatStopped,
    /// The daily spend guard paused runs.
    Spend,
    /// The crash-loop breaker engaged.
    CrashLoop,
    /// Every pairing slot of a channel is taken: later senders are told pairing is busy.
    PairingFull,
    /// An arriving message could not be journaled or decided (a state file could not be
    /// written); perch went on with the next one.
    Intake,
}

impl AlertKind {
    /// The kind in a word or two, as alerts are headed.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::ChannelUnhealthy => "channel",
            AlertKind::DeliveryUnknown => "delivery",
            AlertKind::HeartbeatStopped => "heartbeat",
            AlertKind::Spend => "spend",
            AlertKind::CrashLoop => "crash loop",
            AlertKind::PairingFull => "pairing",
            AlertKind::Intake => "intake",
        }
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An alert as it is posted: `perch alert (spend): ...`.
pub fn alert_text(kind: AlertKind, text: &str) -> String {
    format!("perch alert ({kind}): {text}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct KindState {
    last_sent: Timestamp,
    suppressed: u32,
    last_text: String,
}

/// The rate limit's state: when each kind was last sent, and what was held back since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertLimiter {
    kinds: BTreeMap<AlertKind, KindState>,
}

impl AlertLimiter {
    pub fn new() -> AlertLimiter {
        AlertLimiter::default()
    }

    /// An alert at `now`: the message to send, or `None` when its kind was sent within the
    /// window (it is counted, for the summary).
    pub fn offer(&mut self, kind: AlertKind, text: &str, now: Timestamp) -> Option<String> {
        let window = window();
        match self.kinds.get_mut(&kind) {
            Some(state) if now < state.last_sent + window => {
                state.suppressed += 1;
                state.last_text = text.to_owned();
                None
            }
            Some(state) => {
                let mut message = alert_text(kind, text);
                if state.suppressed > 0 {
                    message.push_str(&format!(
                        "\n({} more {kind} alert(s) were suppressed before this one)",
                        state.suppressed
                    ));
                }
                *state = KindState {
                    last_sent: now,
                    suppressed: 0,
                    last_text: text.to_owned(),
                };
                Some(message)
            }
            None => {
                self.kinds.insert(
                    kind,
                    KindState {
                        last_sent: now,
                        suppressed: 0,
                        last_text: text.to_owned(),
                    },
                );
                Some(alert_text(kind, text))
            }
        }
    }

    /// The summaries due at `now`: for each kind whose window has ended with alerts held back,
    /// one message saying how many and what the last said. Each counts as that kind's message.
    pub fn due(&mut self, now: Timestamp) -> Vec<String> {
        let window = window();
        let mut due = Vec::new();
        for (kind, state) in &mut self.kinds {
            if state.suppressed > 0 && now >= state.last_sent + window {
                due.push(alert_text(
                    *kind,
                    &format!(
                        "{} more {kind} alert(s) in the last hour were suppressed; the last: {}",
                        state.suppressed, state.last_text
                    ),
                ));
                state.last_sent = now;
                state.suppressed = 0;
            }
        }
        due
    }

    /// When the next summary is due, if any alert is held back.
    pub fn next_due(&self) -> Option<Timestamp> {
        let window = window();
        self.kinds
            .values()
            .filter(|state| state.suppressed > 0)
            .map(|state| state.last_sent + window)
            .min()
    }
}

fn window() -> chrono::Duration {
    chrono::Duration::from_std(WINDOW).unwrap_or(chrono::Duration::hours(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn one_message_per_kind_per_hour_then_a_summary() {
        let mut limiter = AlertLimiter::new();
        assert_eq!(
            limiter.offer(
                AlertKind::ChannelUnhealthy,
                "tg stopped",
                at("2026-03-02T10:00:00Z")
            ),
            Some("perch alert (channel): tg stopped".into())
        );
        assert_eq!(
            limiter.offer(AlertKind::Spend, "cap reached", at("2026-03-02T10:01:00Z")),
            Some("perch alert (spend): cap reached".into()),
            "another kind has its own window"
        );
        for minute in 2..5 {
            let now = at(&format!("2026-03-02T10:0{minute}:00Z"));
            assert_eq!(
                limiter.offer(AlertKind::ChannelUnhealthy, "dc stopped", now),
                None
            );
        }
        assert_eq!(limiter.next_due(), Some(at("2026-03-02T11:00:00Z")));
        assert!(limiter.due(at("2026-03-02T10:59:59Z")).is_empty());
        assert_eq!(
            limiter.due(at("2026-03-02T11:00:00Z")),
            vec![
                "perch alert (channel): 3 more channel alert(s) in the last hour were \
                 suppressed; the last: dc stopped"
                    .to_owned()
            ]
        );
        assert_eq!(limiter.next_due(), None);
        assert_eq!(
            limiter.offer(
                AlertKind::ChannelUnhealthy,
                "again",
                at("2026-03-02T11:30:00Z")
            ),
            None,
            "the summary counts as the hour's message"
        );
        assert_eq!(
            limiter.offer(
                AlertKind::ChannelUnhealthy,
                "later",
                at("2026-03-02T12:30:00Z")
            ),
            Some(
                "perch alert (channel): later\n(1 more channel alert(s) were suppressed before \
                 this one)"
                    .into()
            )
        );
    }
}
