//! What the end of one Socket Mode connection leads to, inside the receive attempt the
//! connection machine ([`crate::connection::Link`]) steps.
//!
//! Slack replaces its connections routinely (`disconnect` with `refresh_requested`, or
//! `warning` ten seconds before it closes one): perch opens the next at once, and the attempt
//! goes on, so `perch status` keeps showing `receiving`. Everything else ends the attempt as the
//! other platforms' do: a refusal (`link_disabled`, a refused app-level token) waits long and
//! shows as `stopped: …`, not as a loop; a lost socket backs off.

use crate::connection::AttemptEnd;
use crate::slack::envelope::DisconnectReason;
use crate::slack::web::WebFailure;

/// How many connections in a row perch opens at once at Slack's request, with no event
/// between them, before it takes the next request for a failing connection and backs off.
pub const MAX_HANDOVERS_IN_A_ROW: u32 = 5;

/// How one connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketEnd {
    /// Slack sent `disconnect`.
    Disconnect(DisconnectReason),
    /// `apps.connections.open` failed, so no connection was opened.
    OpenFailed(WebFailure),
    /// The socket closed or failed with no `disconnect` first (a dropped network, a missed
    /// pong, a close frame), for `reason`.
    Lost { reason: String },
}

/// What follows the end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextSocket {
    /// Open the next connection now, inside the same receive attempt.
    ReconnectNow,
    /// End the receive attempt so: the connection machine backs off or waits out a refusal.
    End(AttemptEnd),
}

/// The connections one receive attempt opened at Slack's request, for [`Handovers::after`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handovers {
    in_a_row: u32,
}

impl Handovers {
    /// A receive attempt that has opened no connection yet.
    pub fn new() -> Handovers {
        Handovers::default()
    }

    /// An envelope arrived over the current connection: the connections before it worked.
    pub fn envelope_received(&mut self) {
        self.in_a_row = 0;
    }

    /// Decides what follows `end`; `said_hello` tells whether the connection that ended had
    /// sent `hello`. A refresh is followed at once only on a connection that came up, and at
    /// most [`MAX_HANDOVERS_IN_A_ROW`] times with no envelope between.
    pub fn after(&mut self, end: &SocketEnd, said_hello: bool) -> NextSocket {
        let next = match end {
            SocketEnd::Disconnect(
                reason @ (DisconnectReason::RefreshRequested | DisconnectReason::Warning),
            ) => {
                if !said_hello {
                    dropped(format!(
                        "Slack closed the connection ({}) before it said hello",
                        reason.as_str()
                    ))
                } else if self.in_a_row >= MAX_HANDOVERS_IN_A_ROW {
                    dropped(format!(
                        "Slack asked for a new connection {} times in a row with no event between",
                        self.in_a_row + 1
                    ))
                } else {
                    self.in_a_row += 1;
                    return NextSocket::ReconnectNow;
                }
            }
            SocketEnd::Disconnect(DisconnectReason::LinkDisabled) => {
                NextSocket::End(AttemptEnd::Refused {
                    reason: "Socket Mode is turned off for this app (link_disabled): turn it on \
                             under Socket Mode in the app's settings"
                        .to_owned(),
                })
            }
            SocketEnd::Disconnect(DisconnectReason::Other(reason)) => {
                dropped(format!("Slack closed the connection ({reason})"))
            }
            SocketEnd::OpenFailed(failure) => match open_refusal(failure) {
                Some(reason) => NextSocket::End(AttemptEnd::Refused { reason }),
                None => dropped(format!("apps.connections.open failed: {failure}")),
            },
            SocketEnd::Lost { reason } => dropped(reason.clone()),
        };
        self.in_a_row = 0;
        next
    }
}

fn dropped(reason: String) -> NextSocket {
    NextSocket::End(AttemptEnd::Dropped { reason })
}

/// Why `apps.connections.open`'s failure is a refusal of the app-level token, with the fix;
/// `None` when trying again later may help.
pub fn open_refusal(failure: &WebFailure) -> Option<String> {
    if !failure.refuses_credentials() {
        return None;
    }
    let WebFailure::Error { error, .. } = failure else {
        return Some(format!(
            "apps.connections.open was refused ({failure}): check the app-level token (xapp-…)"
        ));
    };
    Some(match error.as_str() {
        "invalid_auth" | "not_authed" => format!(
            "Slack refused the app-level token ({error}): set it to the app's xapp-… token \
             (Basic Information, App-Level Tokens)"
        ),
        "account_inactive" | "token_revoked" | "token_expired" => format!(
            "the app-level token no longer works ({error}): generate a new one under Basic \
             Information, App-Level Tokens"
        ),
        "not_allowed_token_type" => format!(
            "the socket needs an app-level token (xapp-…), not a bot or user token ({error})"
        ),
        "missing_scope" => format!(
            "the app-level token lacks the connections:write scope ({error}): generate one \
             with it under Basic Information, App-Level Tokens"
        ),
        _ => format!("Slack refused to open a socket for this app ({error})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Connection, Link, LinkAction, LinkEvent, REFUSED_WAIT};
    use crate::slack::envelope::{Frame, read_frame};
    use crate::slack::fixture;
    use crate::slack::web::read_answer;
    use std::time::Duration;

    type Expected = Box<dyn Fn(&NextSocket) -> bool>;

    fn refused(reason: &str) -> impl Fn(&NextSocket) -> bool + '_ {
        move |next| matches!(next, NextSocket::End(AttemptEnd::Refused { reason: said }) if said.contains(reason))
    }

    fn dropped_with(reason: &str) -> impl Fn(&NextSocket) -> bool + '_ {
        move |next| matches!(next, NextSocket::End(AttemptEnd::Dropped { reason: said }) if said.contains(reason))
    }

    fn disconnect(frame: &str) -> SocketEnd {
        match read_frame(frame) {
            Frame::Disconnect { reason } => SocketEnd::Disconnect(reason),
            other => panic!("not a disconnect: {other:?}"),
        }
    }

    fn open_failed(error: &str) -> SocketEnd {
        SocketEnd::OpenFailed(WebFailure::Error {
            error: error.into(),
            needed: None,
        })
    }

    #[test]
    fn every_end_has_its_next_step() {
        let refresh = disconnect(&fixture!("socket-disconnect-refresh-requested.json").text());
        let warning = disconnect(&fixture!("socket-disconnect-warning.json").text());
        let disabled = disconnect(&fixture!("socket-disconnect-link-disabled.json").text());
        let invalid_auth = fixture!("web-apps.connections.open-invalid_auth.json");
        let invalid_auth =
            SocketEnd::OpenFailed(read_answer(200, None, &invalid_auth.text()).unwrap_err());
        let reconnect = |next: &NextSocket| *next == NextSocket::ReconnectNow;
        let cases: Vec<(SocketEnd, bool, Expected)> = vec![
            (refresh.clone(), true, Box::new(reconnect)),
            (warning.clone(), true, Box::new(reconnect)),
            (
                refresh,
                false,
                Box::new(dropped_with("refresh_requested) before it said hello")),
            ),
            (
                warning,
                false,
                Box::new(dropped_with("(warning) before it said hello")),
            ),
            (disabled.clone(), true, Box::new(refused("link_disabled"))),
            (disabled, false, Box::new(refused("turn it on"))),
            (invalid_auth, false, Box::new(refused("xapp-"))),
            (
                open_failed("not_authed"),
                false,
                Box::new(refused("(not_authed)")),
            ),
            (
                open_failed("account_inactive"),
                false,
                Box::new(refused("(account_inactive)")),
            ),
            (
                open_failed("not_allowed_token_type"),
                false,
                Box::new(refused("not a bot or user token")),
            ),
            (
                open_failed("missing_scope"),
                false,
                Box::new(refused("connections:write")),
            ),
            (
                open_failed("internal_error"),
                false,
                Box::new(dropped_with(
                    "apps.connections.open failed: Slack answered internal_error",
                )),
            ),
            (
                SocketEnd::OpenFailed(WebFailure::RateLimited {
                    retry_after: Duration::from_secs(9),
                }),
                false,
                Box::new(dropped_with("rate limited")),
            ),
            (
                SocketEnd::OpenFailed(WebFailure::Status { status: 401 }),
                false,
                Box::new(refused("HTTP 401")),
            ),
            (
                SocketEnd::OpenFailed(WebFailure::Status { status: 503 }),
                false,
                Box::new(dropped_with("HTTP 503")),
            ),
            (
                SocketEnd::Disconnect(DisconnectReason::Other("too_many_websockets".into())),
                true,
                Box::new(dropped_with("(too_many_websockets)")),
            ),
            (
                SocketEnd::Lost {
                    reason: "no pong in 30 s".into(),
                },
                true,
                Box::new(dropped_with("no pong in 30 s")),
            ),
        ];
        for (end, said_hello, expected) in cases {
            let next = Handovers::new().after(&end, said_hello);
            assert!(
                expected(&next),
                "{end:?} (hello: {said_hello}) led to {next:?}"
            );
        }
    }

    #[test]
    fn refreshes_in_a_row_with_no_event_between_back_off() {
        let refresh = SocketEnd::Disconnect(DisconnectReason::RefreshRequested);
        let mut handovers = Handovers::new();
        for _ in 0..MAX_HANDOVERS_IN_A_ROW {
            assert_eq!(handovers.after(&refresh, true), NextSocket::ReconnectNow);
        }
        assert!(dropped_with("6 times in a row")(
            &handovers.after(&refresh, true)
        ));
        assert_eq!(handovers.after(&refresh, true), NextSocket::ReconnectNow);

        let mut handovers = Handovers::new();
        for _ in 0..3 * MAX_HANDOVERS_IN_A_ROW {
            assert_eq!(handovers.after(&refresh, true), NextSocket::ReconnectNow);
            handovers.envelope_received();
        }
    }

    #[test]
    fn a_refusal_reaches_the_connection_machine_as_a_long_wait_not_a_loop() {
        let mut link = Link::new();
        let first_wait = Duration::from_secs(1);
        link.step(LinkEvent::Up, first_wait);
        let NextSocket::End(end) =
            Handovers::new().after(&SocketEnd::Disconnect(DisconnectReason::LinkDisabled), true)
        else {
            panic!("link_disabled reconnected");
        };
        assert_eq!(
            link.step(LinkEvent::Ended(end), first_wait),
            LinkAction::Wait(REFUSED_WAIT)
        );
        assert!(
            link.connection
                .to_string()
                .starts_with("stopped: Socket Mode is turned off")
        );

        let NextSocket::End(end) = Handovers::new().after(
            &SocketEnd::Lost {
                reason: "connection reset".into(),
            },
            true,
        ) else {
            panic!("a lost socket reconnected at once");
        };
        link.step(LinkEvent::Up, first_wait);
        assert_eq!(
            link.step(LinkEvent::Ended(end), first_wait),
            LinkAction::Wait(first_wait)
        );
        assert_eq!(
            link.connection,
            Connection::Reconnecting {
                reason: "connection reset".into(),
                attempt: 1
            }
        );
    }
}
