//! A connector's `receive` as the contract tests drive it: spawned with perch's side of the inbox,
//! each event taken (and acknowledged as journaled, or not), then cancelled or left to end.

use perch::channel::{
    Arrival, AttemptUp, Connector, ConnectorError, InboundEvent, Quote, ReceiveAttempt,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a platform's tests give its connector.
#[derive(Debug, Clone, Copy)]
pub struct Within {
    /// For the next event to arrive, and for `receive` to end by itself.
    pub event: Duration,
    /// For `receive` to stop once cancelled.
    pub stop: Duration,
}

/// A running `receive`, with perch's side of the inbox.
pub struct Receiving {
    pub arrivals: mpsc::Receiver<Arrival>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ConnectorError>>,
    within: Within,
}

impl Receiving {
    /// Spawns `connector.receive` from `resume` and the rooms' last journaled events `since`.
    pub fn start<C: Connector + 'static>(
        connector: &Arc<C>,
        resume: Option<String>,
        since: Vec<(String, String)>,
        within: Within,
    ) -> Receiving {
        let (inbound, arrivals) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let connector = Arc::clone(connector);
            let cancel = cancel.clone();
            async move {
                let attempt = ReceiveAttempt {
                    resume,
                    since,
                    inbound,
                    up: AttemptUp::pair().0,
                    cancel,
                };
                connector.receive(attempt).await
            }
        });
        Receiving {
            arrivals,
            cancel,
            task,
            within,
        }
    }

    /// The next arrival, not acknowledged.
    pub async fn arrival(&mut self) -> Arrival {
        tokio::time::timeout(self.within.event, self.arrivals.recv())
            .await
            .expect("an event arrives in time")
            .expect("receive is still running")
    }

    /// The next event, acknowledged as journaled.
    pub async fn next_acked(&mut self) -> InboundEvent {
        let arrival = self.arrival().await;
        arrival.journaled.send(()).unwrap();
        arrival.event
    }

    /// Events until `platform_id`, each acknowledged; panics if it does not come.
    pub async fn until(&mut self, platform_id: &str) -> InboundEvent {
        loop {
            let event = self.next_acked().await;
            if event.platform_id == platform_id {
                return event;
            }
        }
    }

    /// The next event that is not `again` (one the platform may hand over a second time),
    /// acknowledged, as are the repeats before it.
    pub async fn next_besides(&mut self, again: &str) -> InboundEvent {
        let mut next = self.next_acked().await;
        while next.platform_id == again {
            next = self.next_acked().await;
        }
        next
    }

    /// Nothing arrives for `wait`, and `receive` goes on.
    pub async fn quiet_for(&mut self, wait: Duration) {
        match tokio::time::timeout(wait, self.arrivals.recv()).await {
            Err(_) => {}
            Ok(None) => panic!("receive ended"),
            Ok(Some(arrival)) => panic!("unexpected event {:?}", arrival.event),
        }
    }

    /// Whether `receive` has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Cancels and returns what `receive` returned; it must stop promptly.
    pub async fn stop(self) -> Result<(), ConnectorError> {
        self.cancel.cancel();
        tokio::time::timeout(self.within.stop, self.task)
            .await
            .expect("receive stops promptly when cancelled")
            .unwrap()
    }

    /// Gives `receive` at most `limit` to end by itself, whatever it returns.
    pub async fn ends_within(self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.task).await;
    }

    /// Waits for `receive` to end by itself.
    pub async fn ended(self) -> Result<(), ConnectorError> {
        tokio::time::timeout(self.within.event, self.task)
            .await
            .expect("receive ends by itself")
            .unwrap()
    }
}

/// The quote `event` carries of the message `original`, its text cut to
/// [`perch::channel::QUOTE_MAX_CHARS`] characters ending in an ellipsis.
pub fn shortened_quote(event: InboundEvent, original: &str) -> Quote {
    let quote = event.replying_to.expect("the reply quotes its original");
    assert_eq!(quote.platform_id, original);
    assert_eq!(quote.text.chars().count(), perch::channel::QUOTE_MAX_CHARS);
    assert!(quote.text.ends_with('…'), "{quote:?}");
    *quote
}
