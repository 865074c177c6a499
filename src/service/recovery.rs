//! Restart recovery of the lanes a crash left with an operation open.

use crate::lane::RunLimits;
use crate::lane::Runtime;
use crate::store::starts;
use perch_core::name::LaneName;
use perch_core::prompt::Origin;
use perch_core::starts::LaneRecovered;
use std::collections::BTreeMap;

/// Opens every lane a crash left with an operation open, so recovery closes it now rather than
/// at the lane's next message; returns what recovery did, per lane.
pub(super) async fn recover_lanes(
    runtime: &Runtime,
    limits: RunLimits,
) -> Result<BTreeMap<String, LaneRecovered>, String> {
    let sessions = runtime.agent().dir.sessions_dir();
    let mut recovered = BTreeMap::new();
    for (lane, _) in starts::open_operations(&sessions) {
        let Ok(name) = LaneName::try_from(lane.as_str()) else {
            continue;
        };
        let origin = Origin {
            channel: "recovery".into(),
            room: None,
        };
        let (opened, report) = runtime
            .open_lane(&name, origin, limits)
            .await
            .map_err(|error| format!("lane {lane}: {error}"))?;
        opened.close().await.map_err(|error| error.to_string())?;
        tracing::info!(
            "recovered lane {lane}: {} operation(s) closed, {} tool(s) run again, {} marked interrupted",
            report.operations_closed,
            report.tools_rerun,
            report.tools_interrupted
        );
        recovered.insert(
            lane,
            LaneRecovered {
                operations_closed: report.operations_closed,
                tools_rerun: report.tools_rerun,
                tools_interrupted: report.tools_interrupted,
            },
        );
    }
    Ok(recovered)
}
