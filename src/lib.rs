//! perch's I/O shell: the agent directory on disk, the Lua evaluator, the session log's writer,
//! the sandbox every command runs in, and the command-line interface built on them. Decisions
//! live in `perch-core`.

pub mod agent;
pub mod doctor;
pub mod image;
pub mod info;
pub mod log;
pub mod lua;
pub mod sandbox;
pub mod tools;
