//! perch and the machine it runs on: the clock, signals, process limits, file locks, systemd's
//! notify protocol, the log lines and `perch run`'s narration on stderr, metrics, failpoints, the
//! trust of paths as root, the workspace's files read and written on the host, owner alerts, and
//! the places perch looks.

pub mod alert;
pub mod clock;
pub mod failpoint;
pub mod file_lock;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod narrate;
pub mod notify;
pub mod ownership;
mod places;
pub mod signals;
pub mod trust;
pub mod workspace;

pub use places::Places;
