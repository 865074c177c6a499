//! Intake's handle, and the requests it sends intake's task.

use super::super::ask::ask;
use super::super::deliveries::Format;
use crate::store::inbox::Backlog;
use perch_core::control::{PairApproved, PairListed, PairSender};
use perch_core::pairing::Who;
use perch_core::starts::InboxRecovered;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What intake's task is asked besides the arrivals it takes.
pub(super) enum Request {
    /// Run `channel`'s `format` hook on a reply.
    Format {
        channel: String,
        text: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// `perch pair approve`, from the control socket.
    Approve {
        who: Who,
        reply: oneshot::Sender<Result<PairApproved, String>>,
    },
    /// `perch pair deny`.
    Deny {
        who: Who,
        reply: oneshot::Sender<Result<PairSender, String>>,
    },
    /// `perch pair revoke`.
    Revoke {
        channel: String,
        sender: String,
        reply: oneshot::Sender<Result<PairSender, String>>,
    },
    /// `perch pair list`.
    PairList { reply: oneshot::Sender<PairListed> },
    /// How many pairing codes are pending, for `perch status`.
    PairingsPending { reply: oneshot::Sender<usize> },
    /// After a restart: the inbox's backlog, answered, resumed, queued again or decided again.
    Recover {
        backlog: Box<Backlog>,
        replied_to: HashSet<(String, String)>,
        reply: oneshot::Sender<Result<InboxRecovered, String>>,
    },
}

/// Intake: its task's requests. Clones share them.
#[derive(Clone)]
pub(in crate::service) struct Intake {
    pub(super) requests: mpsc::UnboundedSender<Request>,
}

impl Intake {
    /// What formats replies for the deliveries: a request to intake, which owns the hooks.
    pub(in crate::service) fn formatter(&self) -> Format {
        let intake = self.clone();
        Arc::new(move |channel: String, text: String| {
            let intake = intake.clone();
            Box::pin(async move {
                ask(&intake.requests, |reply| Request::Format {
                    channel,
                    text,
                    reply,
                })
                .await
                .ok_or_else(stopped)?
            })
        })
    }

    /// Approves whom `who` names: they may talk to the agent from now on, and are told so.
    pub(in crate::service) async fn approve(&self, who: Who) -> Result<PairApproved, String> {
        ask(&self.requests, |reply| Request::Approve { who, reply })
            .await
            .ok_or_else(stopped)?
    }

    /// Drops the pending request `who` names.
    pub(in crate::service) async fn deny(&self, who: Who) -> Result<PairSender, String> {
        ask(&self.requests, |reply| Request::Deny { who, reply })
            .await
            .ok_or_else(stopped)?
    }

    /// Removes an approved sender.
    pub(in crate::service) async fn revoke(
        &self,
        channel: String,
        sender: String,
    ) -> Result<PairSender, String> {
        ask(&self.requests, |reply| Request::Revoke {
            channel,
            sender,
            reply,
        })
        .await
        .ok_or_else(stopped)?
    }

    /// The pending requests and the approved senders.
    pub(in crate::service) async fn pair_list(&self) -> Result<PairListed, String> {
        ask(&self.requests, |reply| Request::PairList { reply })
            .await
            .ok_or_else(stopped)
    }

    /// How many pairing codes are pending.
    pub(in crate::service) async fn pairings_pending(&self) -> usize {
        ask(&self.requests, |reply| Request::PairingsPending { reply })
            .await
            .unwrap_or(0)
    }

    /// Recovers the inbox's `backlog` (see intake's recovery); `replied_to` are the events a
    /// reply was recorded to before the crash.
    pub(in crate::service) async fn recover(
        &self,
        backlog: Backlog,
        replied_to: HashSet<(String, String)>,
    ) -> Result<InboxRecovered, String> {
        ask(&self.requests, |reply| Request::Recover {
            backlog: Box::new(backlog),
            replied_to,
            reply,
        })
        .await
        .ok_or_else(stopped)?
    }
}

fn stopped() -> String {
    "intake has stopped".to_owned()
}
