//! A channel's connection to its platform, as `perch run` keeps it and `perch status` shows it.

use crate::Timestamp;
use std::fmt;
use std::time::Duration;

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

/// The longest wait between two attempts after failures: the backoff doubles up to it.
pub const RECONNECT_MAX: Duration = Duration::from_secs(60);

/// How long a channel whose credentials were refused waits before it tries again: long enough
/// not to hammer the platform, short enough to recover from the platform's own mistake.
pub const REFUSED_WAIT: Duration = Duration::from_secs(600);

/// A channel's receiving as its reconnect loop steps it: the [`Connection`] `perch status`
/// shows, and the failed attempts in a row, which survive an attempt that came up and then
/// dropped (so a connection that keeps dropping backs off) and are forgotten after a clean end
/// or a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub connection: Connection,
    failures: u32,
}

/// How a channel's receiving starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Connect now.
    Now,
    /// The crash-loop breaker holds every channel until `until`; it is `now`.
    Paused { until: Timestamp, now: Timestamp },
    /// This process serves one heartbeat run: never receive.
    OneHeartbeatRun,
}

/// How a receive attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The connector returned without an error (it was cancelled, or the platform let go).
    Clean,
    /// The attempt failed, or the connection dropped, for `reason`.
    Dropped { reason: String },
    /// The platform refused the credentials, saying `reason`.
    Refused { reason: String },
}

/// What happened to a channel's receiving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// The loop starts.
    Begin(Begin),
    /// The platform answered in the current attempt.
    Up,
    /// The current attempt ended.
    Ended(AttemptEnd),
    /// The wait before the next attempt is over.
    WaitOver,
    /// perch is stopping.
    Shutdown,
}

/// What the reconnect loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkAction {
    /// Start a receive attempt.
    Attempt,
    /// Let the current attempt go on.
    KeepReceiving,
    /// Wait this long, then report [`LinkEvent::WaitOver`].
    Wait(Duration),
    /// End the loop.
    Stop,
}

impl Link {
    /// A channel about to connect, with no failed attempt behind it.
    pub fn new() -> Link {
        Link {
            connection: Connection::Connecting,
            failures: 0,
        }
    }

    /// The failed attempts in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Moves on from `event`; `first_wait` is the wait after the first failure, which doubles
    /// with each failure in a row up to [`RECONNECT_MAX`]. After a clean end the next attempt
    /// comes after `first_wait` and the doubling starts again; after a refusal it comes after
    /// [`REFUSED_WAIT`]. A channel serving one heartbeat run never leaves that state.
    pub fn step(&mut self, event: LinkEvent, first_wait: Duration) -> LinkAction {
        if self.connection == Connection::OneHeartbeatRun && !matches!(event, LinkEvent::Begin(_)) {
            return LinkAction::Stop;
        }
        match event {
            LinkEvent::Begin(Begin::Now) => {
                *self = Link::new();
                LinkAction::Attempt
            }
            LinkEvent::Begin(Begin::Paused { until, now }) => {
                *self = Link {
                    connection: Connection::Paused { until },
                    failures: 0,
                };
                LinkAction::Wait((until - now).to_std().unwrap_or_default())
            }
            LinkEvent::Begin(Begin::OneHeartbeatRun) => {
                *self = Link {
                    connection: Connection::OneHeartbeatRun,
                    failures: 0,
                };
                LinkAction::Stop
            }
            LinkEvent::Up => {
                self.connection = Connection::Receiving;
                LinkAction::KeepReceiving
            }
            LinkEvent::Ended(AttemptEnd::Clean) => {
                self.failures = 0;
                LinkAction::Wait(first_wait)
            }
            LinkEvent::Ended(AttemptEnd::Dropped { reason }) => {
                self.failures = self.failures.saturating_add(1);
                self.connection = Connection::Reconnecting {
                    reason,
                    attempt: self.failures,
                };
                LinkAction::Wait(backoff(first_wait, self.failures))
            }
            LinkEvent::Ended(AttemptEnd::Refused { reason }) => {
                self.failures = 0;
                self.connection = Connection::Refused { reason };
                LinkAction::Wait(REFUSED_WAIT)
            }
            LinkEvent::WaitOver => {
                self.connection = Connection::Connecting;
                LinkAction::Attempt
            }
            LinkEvent::Shutdown => LinkAction::Stop,
        }
    }
}

impl Default for Link {
    fn default() -> Link {
        Link::new()
    }
}

/// The wait after the `failures`th failure in a row: `first_wait` doubled for each failure
/// after the first, up to [`RECONNECT_MAX`] (or `first_wait`, if that is longer).
fn backoff(first_wait: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first_wait
        .saturating_mul(1 << doublings)
        .min(RECONNECT_MAX.max(first_wait))
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

    /// Every state of the table below, by row: a new [`Connection`] variant does not compile
    /// here until it has a row.
    fn row(state: &Connection) -> usize {
        match state {
            Connection::Connecting => 0,
            Connection::Receiving => 1,
            Connection::Reconnecting { .. } => 2,
            Connection::Refused { .. } => 3,
            Connection::Paused { .. } => 4,
            Connection::OneHeartbeatRun => 5,
        }
    }

    /// Every event of the table below, by column: a new [`LinkEvent`], [`Begin`] or
    /// [`AttemptEnd`] variant does not compile here until it has a column.
    fn column(event: &LinkEvent) -> usize {
        match event {
            LinkEvent::Begin(Begin::Now) => 0,
            LinkEvent::Begin(Begin::Paused { .. }) => 1,
            LinkEvent::Begin(Begin::OneHeartbeatRun) => 2,
            LinkEvent::Up => 3,
            LinkEvent::Ended(AttemptEnd::Clean) => 4,
            LinkEvent::Ended(AttemptEnd::Dropped { .. }) => 5,
            LinkEvent::Ended(AttemptEnd::Refused { .. }) => 6,
            LinkEvent::WaitOver => 7,
            LinkEvent::Shutdown => 8,
        }
    }

    fn at(minute: u32) -> Timestamp {
        chrono::Utc
            .with_ymd_and_hms(2026, 12, 2, 6, minute, 0)
            .unwrap()
    }

    /// A link in each state, with the failures in a row it would have there.
    fn links() -> Vec<Link> {
        let failures = [0, 2, 6, 0, 0, 0];
        every_state()
            .into_iter()
            .zip(failures)
            .map(|(connection, failures)| Link {
                connection,
                failures,
            })
            .collect()
    }

    fn events() -> Vec<LinkEvent> {
        vec![
            LinkEvent::Begin(Begin::Now),
            LinkEvent::Begin(Begin::Paused {
                until: at(15),
                now: at(13),
            }),
            LinkEvent::Begin(Begin::OneHeartbeatRun),
            LinkEvent::Up,
            LinkEvent::Ended(AttemptEnd::Clean),
            LinkEvent::Ended(AttemptEnd::Dropped {
                reason: "the gateway closed".into(),
            }),
            LinkEvent::Ended(AttemptEnd::Refused {
                reason: "401".into(),
            }),
            LinkEvent::WaitOver,
            LinkEvent::Shutdown,
        ]
    }

    fn shown(link: &Link, action: LinkAction) -> String {
        let state = match &link.connection {
            Connection::Reconnecting { reason, attempt } => {
                format!("reconnecting #{attempt}: {reason}")
            }
            Connection::Paused { .. } => "paused".to_owned(),
            other => other.to_string(),
        };
        let action = match action {
            LinkAction::Attempt => "attempt".to_owned(),
            LinkAction::KeepReceiving => "keep receiving".to_owned(),
            LinkAction::Wait(wait) => format!("wait {}s", wait.as_secs()),
            LinkAction::Stop => "stop".to_owned(),
        };
        format!("{state} ({}) / {action}", link.failures)
    }

    /// Rows: the states of [`links`] (connecting; receiving after 2 failures; reconnecting
    /// after 6; refused; paused; one heartbeat run). Columns: the events of [`events`]
    /// (begin now, begin paused 2 minutes, begin for one heartbeat run, up, clean end,
    /// dropped, refused, wait over, shutdown). The first wait is 1 s.
    const TABLE: [[&str; 9]; 6] = [
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "receiving (0) / keep receiving",
            "connecting (0) / wait 1s",
            "reconnecting #1: the gateway closed (1) / wait 1s",
            "stopped: 401 (0) / wait 600s",
            "connecting (0) / attempt",
            "connecting (0) / stop",
        ],
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "receiving (2) / keep receiving",
            "receiving (0) / wait 1s",
            "reconnecting #3: the gateway closed (3) / wait 4s",
            "stopped: 401 (0) / wait 600s",
            "connecting (2) / attempt",
            "receiving (2) / stop",
        ],
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "receiving (6) / keep receiving",
            "reconnecting #3: disconnected: the gateway closed (0) / wait 1s",
            "reconnecting #7: the gateway closed (7) / wait 60s",
            "stopped: 401 (0) / wait 600s",
            "connecting (6) / attempt",
            "reconnecting #3: disconnected: the gateway closed (6) / stop",
        ],
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "receiving (0) / keep receiving",
            "stopped: Telegram refused the bot token (401 Unauthorized) (0) / wait 1s",
            "reconnecting #1: the gateway closed (1) / wait 1s",
            "stopped: 401 (0) / wait 600s",
            "connecting (0) / attempt",
            "stopped: Telegram refused the bot token (401 Unauthorized) (0) / stop",
        ],
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "receiving (0) / keep receiving",
            "paused (0) / wait 1s",
            "reconnecting #1: the gateway closed (1) / wait 1s",
            "stopped: 401 (0) / wait 600s",
            "connecting (0) / attempt",
            "paused (0) / stop",
        ],
        [
            "connecting (0) / attempt",
            "paused (0) / wait 120s",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
            "not receiving: this process serves one heartbeat run (0) / stop",
        ],
    ];

    #[test]
    fn every_state_meets_every_event_as_the_table_says() {
        let links = links();
        let events = events();
        assert_eq!(
            links
                .iter()
                .map(|link| row(&link.connection))
                .collect::<Vec<_>>(),
            (0..TABLE.len()).collect::<Vec<_>>(),
            "one row per state, in order"
        );
        assert_eq!(
            events.iter().map(column).collect::<Vec<_>>(),
            (0..TABLE[0].len()).collect::<Vec<_>>(),
            "one column per event, in order"
        );
        for (link, expected_row) in links.iter().zip(TABLE) {
            for (event, expected) in events.iter().zip(expected_row) {
                let mut next = link.clone();
                let action = next.step(event.clone(), Duration::from_secs(1));
                assert_eq!(
                    shown(&next, action),
                    expected,
                    "{} meets {event:?}",
                    link.connection
                );
            }
        }
    }

    #[test]
    fn drops_in_a_row_double_the_wait_up_to_a_minute_and_a_clean_end_starts_again() {
        let mut link = Link::new();
        let mut waits = Vec::new();
        for _ in 0..9 {
            link.step(LinkEvent::WaitOver, Duration::from_secs(1));
            link.step(LinkEvent::Up, Duration::from_secs(1));
            let dropped = AttemptEnd::Dropped {
                reason: "gone".into(),
            };
            waits.push(link.step(LinkEvent::Ended(dropped), Duration::from_secs(1)));
        }
        let seconds = [1, 2, 4, 8, 16, 32, 60, 60, 60];
        assert_eq!(
            waits,
            seconds.map(|s| LinkAction::Wait(Duration::from_secs(s)))
        );
        assert_eq!(
            link.step(LinkEvent::Ended(AttemptEnd::Clean), Duration::from_secs(1)),
            LinkAction::Wait(Duration::from_secs(1))
        );
        let dropped = AttemptEnd::Dropped {
            reason: "gone".into(),
        };
        assert_eq!(
            link.step(LinkEvent::Ended(dropped), Duration::from_secs(1)),
            LinkAction::Wait(Duration::from_secs(1)),
            "the first failure after a clean end waits the first wait again"
        );
    }

    #[test]
    fn a_breaker_that_already_expired_waits_nothing_and_a_long_first_wait_is_not_cut() {
        let mut link = Link::new();
        let begin = Begin::Paused {
            until: at(1),
            now: at(2),
        };
        assert_eq!(
            link.step(LinkEvent::Begin(begin), Duration::from_secs(1)),
            LinkAction::Wait(Duration::ZERO)
        );
        let dropped = AttemptEnd::Dropped {
            reason: "gone".into(),
        };
        assert_eq!(
            link.step(LinkEvent::Ended(dropped), Duration::from_secs(90)),
            LinkAction::Wait(Duration::from_secs(90))
        );
    }
}
