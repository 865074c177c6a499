//! The integration suite. `support` is the harness (the fakes, waiting, the status reader and the
//! `perch run` scenario); the other modules are the scenarios, grouped by journey (`intake`,
//! `conversations`, `delivery`, `recovery`, `lifecycle`, `heartbeat`, `status`, ...) and, for
//! each chat platform, its connector's contract (`telegram`, `discord`, `matrix`; `slack` so far
//! holds only its fake's rules).
mod agent_dir;
mod attachments;
mod builtin;
mod catalog;
mod channel_files;
mod cli_shape;
mod config;
mod conversations;
mod delivery;
mod deploy;
mod discord;
mod docs;
mod doctor;
mod figures;
mod follow;
mod heartbeat;
mod hostile;
mod image;
mod inbox;
mod intake;
mod journal;
mod lane;
mod lane_records;
mod lifecycle;
mod log;
mod log_view;
mod matrix;
mod metrics;
mod model;
mod narration;
mod origin;
mod ownership;
mod pairing;
mod prompt;
mod quick_start;
mod recovery;
mod sandbox;
#[cfg(feature = "sandbox-double")]
mod scale;
mod slack;
mod spend;
mod standin;
mod standin_home;
mod status;
mod support;
mod systemd;
mod telegram;
mod thousand;
mod tools;
