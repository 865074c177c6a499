//! A channel's connection to its platform, as `perch run` keeps it and `perch status` shows it.

use crate::Timestamp;
use std::fmt;

/// Where a channel's receiving stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// A receive attempt started and the platform has not answered in it yet (Telegram's
    /// `getMe` or first `getUpdates`, Discord's gateway READY, Matrix's first sync).
    Connecting,
    /// The platform answered in the current receive attempt.
    Receiving,
    /// The last attempt failed or dropped; the next one starts after a backoff.
    Reconnecting {
        /// Why the last attempt ended.
        reason: String,
        /// The failed attempts in a row, this one included (1 after the first): the backoff
        /// doubles with each.
        attempt: u32,
    },
    /// The platform refused the credentials; reconnecting will not help until they are fixed,
    /// so the next attempt waits long.
    Refused { reason: String },
    /// The crash-loop breaker holds every channel until `until`.
    Paused { until: Timestamp },
    /// This process serves one heartbeat run (`perch heartbeat run` with no service holding the
    /// directory), so no channel receives.
    OneHeartbeatRun,
}

impl Connection {
    /// The platform answers in the current attempt.
    pub fn is_receiving(&self) -> bool {
        matches!(self, Connection::Receiving)
    }

    /// The credentials were refused.
    pub fn is_refused(&self) -> bool {
        matches!(self, Connection::Refused { .. })
    }

    /// Whether moving from `previous` to this state is news for the owner: the credentials
    /// were just refused (again refused is not).
    pub fn alerts_after(&self, previous: &Connection) -> bool {
        self.is_refused() && !previous.is_refused()
    }
}

impl fmt::Display for Connection {
    /// The one line `perch status` shows (its `connection` field): `connecting`, `receiving`,
    /// `reconnecting: <why>`, `stopped: <why>` after the credentials were refused,
    /// `paused until <when>` (RFC 3339), or `not receiving: this process serves one heartbeat
    /// run`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Connection::Connecting => f.write_str("connecting"),
            Connection::Receiving => f.write_str("receiving"),
            Connection::Reconnecting { reason, .. } => write!(f, "reconnecting: {reason}"),
            Connection::Refused { reason } => write!(f, "stopped: {reason}"),
            Connection::Paused { until } => write!(f, "paused until {}", until.to_rfc3339()),
            Connection::OneHeartbeatRun => {
                f.write_str("not receiving: this process serves one heartbeat run")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn every_state() -> Vec<Connection> {
        vec![
            Connection::Connecting,
            Connection::Receiving,
            Connection::Reconnecting {
                reason: "disconnected: the gateway closed".into(),
                attempt: 3,
            },
            Connection::Refused {
                reason: "Telegram refused the bot token (401 Unauthorized)".into(),
            },
            Connection::Paused {
                until: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 6, 15, 0).unwrap(),
            },
            Connection::OneHeartbeatRun,
        ]
    }

    #[test]
    fn each_state_renders_as_perch_status_has_always_shown_it() {
        let golden = [
            "connecting",
            "receiving",
            "reconnecting: disconnected: the gateway closed",
            "stopped: Telegram refused the bot token (401 Unauthorized)",
            "paused until 2026-12-02T06:15:00+00:00",
            "not receiving: this process serves one heartbeat run",
        ];
        let rendered: Vec<String> = every_state().iter().map(ToString::to_string).collect();
        assert_eq!(rendered, golden);
    }

    #[test]
    fn only_receiving_is_receiving() {
        let receiving: Vec<bool> = every_state().iter().map(Connection::is_receiving).collect();
        assert_eq!(receiving, [false, true, false, false, false, false]);
    }

    #[test]
    fn the_owner_hears_of_refused_credentials_once_until_they_are_not_refused() {
        let refused = Connection::Refused {
            reason: "401".into(),
        };
        for previous in every_state() {
            assert_eq!(
                refused.alerts_after(&previous),
                !previous.is_refused(),
                "{previous}"
            );
            for next in every_state().into_iter().filter(|next| !next.is_refused()) {
                assert!(!next.alerts_after(&previous), "{previous} -> {next}");
            }
        }
    }
}
