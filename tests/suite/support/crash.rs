//! What the SIGKILL tests share: a seeded schedule that a failing run prints so it can be
//! replayed, and restarts that wait until `perch run` has recovered before the next kill.

use super::scenario::{Agent, Perch};
use super::wait::wait_until;
use perch_core::journal::JournalLine;
use perch_core::journal::outbox::OutboxRecord;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// A small deterministic generator (splitmix64), so a failing kill schedule can be replayed.
pub struct Seeded {
    seed: u64,
    state: u64,
}

impl Seeded {
    /// The schedule `PERCH_TEST_SEED` names, else one from the clock; its seed is printed.
    #[allow(clippy::print_stderr)] // The seed, printed like a test's own output.
    pub fn from_env() -> Seeded {
        let seed = std::env::var("PERCH_TEST_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("kill schedule: PERCH_TEST_SEED={seed}");
        Seeded { seed, state: seed }
    }

    /// The seed that replays this schedule.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    /// A moment 200 ms to 1.8 s away: long enough to land anywhere in a run of the echo model.
    pub fn moment(&mut self) -> Duration {
        Duration::from_millis(200 + self.below(1600))
    }
}

/// How many resumed runs the agent's lanes record, and whether every one has finished.
pub fn resumptions(dir: &Path) -> (usize, bool) {
    let mut resumed = HashSet::new();
    let mut finished = HashSet::new();
    for line in super::journal_lines(&dir.join(".perch/sessions")) {
        let op = line["op"].as_str().unwrap_or_default().to_owned();
        match line["type"].as_str() {
            Some("operation_started") if line["resumed"] == true => {
                resumed.insert(op);
            }
            Some("operation_finished") => {
                finished.insert(op);
            }
            _ => {}
        }
    }
    (resumed.len(), resumed.is_subset(&finished))
}

/// The start `perch run` last recorded, once it has resumed its inbox.
pub fn last_start(dir: &Path) -> serde_json::Value {
    std::fs::read(dir.join(".perch/last-start.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Starts `perch run` and waits until it has recorded a start later than the last one.
pub fn restart(agent: &Agent) -> Perch {
    let before = last_start(agent.path())["started"].clone();
    let service = agent.start();
    wait_until("the restart to resume its inbox", || {
        let started = last_start(agent.path());
        started["started"] != before && started["started"].is_string()
    });
    service
}

/// [`restart`], then waits until every run it resumed has finished, adding their number to
/// `resumed`. A run is resumed once: a kill that comes after this cuts none of them twice.
pub fn restart_past_resumptions(agent: &Agent, resumed: &mut usize) -> Perch {
    let service = restart(agent);
    *resumed += last_start(agent.path())["inbox"]["resumed"]
        .as_u64()
        .unwrap_or(0) as usize;
    wait_until("the resumed runs to finish", || {
        let (recorded, finished) = resumptions(agent.path());
        recorded >= *resumed && finished
    });
    service
}

/// The deliveries of unknown fate in the agent's outbox (perch died between recording one and
/// its receipt, so it is reported and never resent): for each, the platform id of the message it
/// answers.
pub fn unknown_deliveries(dir: &Path) -> Vec<Option<String>> {
    let mut answering = HashMap::new();
    let mut unknown = Vec::new();
    for line in super::journal_lines(&dir.join(".perch/outbox")) {
        let Ok(JournalLine::Item { seq, body, .. }) = serde_json::from_value(line) else {
            continue;
        };
        match OutboxRecord::read(&body) {
            Ok(OutboxRecord::Intent { delivery, .. }) => {
                answering.insert(seq, delivery.reply_to);
            }
            Ok(OutboxRecord::Unknown { intent, .. }) => unknown.push(intent),
            _ => {}
        }
    }
    unknown
        .iter()
        .map(|intent| answering.get(intent).cloned().flatten())
        .collect()
}
