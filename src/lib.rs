//! perch's I/O shell: the agent directory on disk, the Lua evaluator, the session log's writer,
//! the sandbox every command runs in, and the command-line interface built on them. Decisions
//! live in `perch-core`.

pub mod agent;
pub mod channel;
pub mod cli;
pub mod heartbeat;
pub mod host;
pub mod lane;
pub mod log;
pub mod lua;
pub mod model;
pub mod sandbox;
pub mod service;
pub mod store;
pub mod tools;
