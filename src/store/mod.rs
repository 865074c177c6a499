//! What perch keeps under `.perch/` besides the session log: the inbox and outbox journals, the
//! record of its starts, the day's spend, the pairing state, the control socket, and the one
//! way a small state file is replaced.

pub mod atomic_file;
pub mod control;
pub mod generations;
pub mod inbox;
pub mod outbox;
pub mod pairing;
pub mod spend;
pub mod starts;
