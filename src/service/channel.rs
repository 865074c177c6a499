//! One connected channel and how it is doing.

use crate::agent::LoadedChannel;
use crate::channel::Connector;
use crate::host::alert::Alerts;
use perch_core::alert::AlertKind;
use perch_core::connection::Connection;
use perch_core::control::ChannelHealth;
use std::collections::HashMap;
use std::sync::Arc;

/// Every connected channel, by name, fixed at start.
pub(super) type Channels = Arc<HashMap<String, Arc<Channel>>>;

/// One connected channel. Its hooks (the channel file's Lua state) are intake's.
pub(super) struct Channel {
    pub(super) loaded: LoadedChannel,
    pub(super) connector: Arc<dyn Connector>,
    /// The channel's hook calls still running, abandoned ones included (the hooks count them).
    pub(super) hook_calls_running: Arc<std::sync::atomic::AtomicUsize>,
    /// A std lock: set by the channel's receiving task and its hooks' owner, read by status;
    /// only read and set, never held across an await.
    pub(super) health: std::sync::Mutex<Health>,
    /// Told when the channel stops or turns unhealthy.
    pub(super) alerts: Alerts,
}

/// How a channel is doing, for `perch status`.
#[derive(Debug, Clone)]
pub(super) struct Health {
    pub(super) connection: Connection,
    /// `on_message` failures in a row; from [`UNHEALTHY_AFTER`] on, the channel is reported
    /// unhealthy.
    pub(super) hook_failures: u32,
    pub(super) last_hook_error: Option<String>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            connection: Connection::Connecting,
            hook_failures: 0,
            last_hook_error: None,
        }
    }
}

/// Hook failures in a row after which a channel is reported unhealthy.
const UNHEALTHY_AFTER: u32 = 5;

impl Channel {
    pub(super) fn set_connection(&self, connection: Connection) {
        let previous = {
            let mut health = self
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::replace(&mut health.connection, connection.clone())
        };
        if connection.alerts_after(&previous) {
            self.alerts.alert(
                AlertKind::ChannelUnhealthy,
                format!(
                    "channel {} is {connection}; the other channels keep working. Fix it, then \
                     restart perch.",
                    self.loaded.config.name
                ),
            );
        }
    }

    pub(super) fn hook_result(&self, error: Option<&str>) {
        let turned_unhealthy = {
            let mut health = self
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match error {
                Some(error) => {
                    health.hook_failures += 1;
                    health.last_hook_error = Some(error.to_owned());
                }
                None => health.hook_failures = 0,
            }
            health.hook_failures == UNHEALTHY_AFTER
        };
        if let (true, Some(error)) = (turned_unhealthy, error) {
            self.alerts.alert(
                AlertKind::ChannelUnhealthy,
                format!(
                    "channel {} is unhealthy: its on_message hook failed {UNHEALTHY_AFTER} times \
                     in a row; the last error: {error}",
                    self.loaded.config.name
                ),
            );
        }
    }

    pub(super) fn status(&self) -> ChannelHealth {
        let health = self
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let hook_calls_running = self
            .hook_calls_running
            .load(std::sync::atomic::Ordering::SeqCst);
        ChannelHealth {
            name: self.loaded.config.name.to_string(),
            kind: self.loaded.config.kind().as_str().to_owned(),
            healthy: health.hook_failures < UNHEALTHY_AFTER
                && hook_calls_running < crate::channel::hooks::MAX_ABANDONED
                && health.connection.is_receiving(),
            connection: health.connection.to_string(),
            hook_calls_running,
            hook_failures_in_a_row: health.hook_failures,
            last_hook_error: health.last_hook_error,
        }
    }
}
