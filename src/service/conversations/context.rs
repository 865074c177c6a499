//! What every conversation's task, and the conversations' owner, work with.

use super::super::Common;
use super::super::deliveries::Deliveries;
use super::super::lanes::{LaneLease, LanePool};
use crate::lane::Runtime;
use crate::lane::{Lane, RunLimits};
use crate::store::inbox::Inbox;
use perch_core::name::{LaneName, ModelRef};
use perch_core::prompt::Origin;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub(super) struct Context {
    pub(super) runtime: Arc<Runtime>,
    pub(super) inbox: Inbox,
    pub(super) deliveries: Deliveries,
    /// The open lanes, shared with the conversations' tasks, and with nothing else.
    pub(super) pool: LanePool,
    pub(super) limits: RunLimits,
    /// Its tasks are every conversation's task and run, waited for at shutdown.
    pub(super) common: Common,
    pub(super) workspace: PathBuf,
}

/// How long a heartbeat waits for a lane slot when every open lane is held.
const HOLD_WAIT: Duration = Duration::from_secs(60);

impl Context {
    /// Opens (and recovers) the lane `name` on `model` or the agent's.
    pub(super) async fn open_lane(
        &self,
        name: &LaneName,
        origin: Origin,
        model: Option<&ModelRef>,
    ) -> Result<Lane, String> {
        Ok(match model {
            None => {
                self.runtime
                    .open_lane(name, origin, self.limits)
                    .await
                    .map_err(|error| error.to_string())?
                    .0
            }
            Some(model) => {
                self.runtime
                    .open_lane_with_model(name, origin, self.limits, model)
                    .await?
                    .0
            }
        })
    }

    /// Holds the lane `name` for a heartbeat: joined when someone holds it, else in the next
    /// slot within [`HOLD_WAIT`], opened first if it is not open.
    pub(super) async fn hold(
        &self,
        name: &LaneName,
        origin: Origin,
        model: Option<&ModelRef>,
    ) -> Result<LaneLease, String> {
        if let Some(lease) = self.pool.join(name) {
            return Ok(lease);
        }
        let permit = tokio::time::timeout(HOLD_WAIT, self.pool.turn())
            .await
            .map_err(|_| {
                format!(
                    "all {} open lanes stayed in use for {HOLD_WAIT:?}",
                    self.pool.limits().open_max
                )
            })?;
        self.pool
            .hold(name, permit, || self.open_lane(name, origin, model))
            .await
    }
}
