//! The signals that stop a long-running command.

/// SIGTERM and SIGINT, as one stream.
#[derive(Debug)]
pub struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn listen() -> Result<StopSignals, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|error| format!("cannot listen for signals: {error}"))
        };
        Ok(StopSignals {
            terminate: listen(SignalKind::terminate())?,
            interrupt: listen(SignalKind::interrupt())?,
        })
    }

    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
