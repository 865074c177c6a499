//! perch's pure core.
//!
//! Everything here is a function of its inputs: names and ids, configuration values after
//! parsing, the session log's line types, the fold that reduces a log to its state, and the
//! recovery plan. Nothing here touches files, the network, the environment or the clock;
//! callers pass the time in. The I/O shell is the `perch` package.

pub mod admission;
pub mod alert;
pub mod attachment;
pub mod builtin;
pub mod chat;
pub mod clock;
pub mod config;
pub mod connection;
pub mod control;
pub mod conversation;
pub mod conversation_lane;
pub mod converse;
pub mod delivery;
pub mod edit;
pub mod error_chain;
pub mod escape;
pub mod group_context;
pub mod heartbeat;
pub mod id;
pub mod image;
pub mod journal;
pub mod lanes;
pub mod log;
pub mod lua_pattern;
pub mod lua_source;
pub mod markdown;
pub mod name;
pub mod narration;
pub mod origin;
pub mod output;
pub mod ownership;
pub mod pairing;
pub mod problem;
pub mod prompt;
pub mod redact;
pub mod refusals;
pub mod secret;
pub mod skill;
pub mod slack;
pub mod spend;
pub mod sse;
pub mod starts;
pub mod terminal;
pub mod transcript;
pub mod tree;
pub mod trust;
pub mod yaml;

pub use problem::{Problem, Problems};

/// A point in time, always passed in by the caller.
pub type Timestamp = chrono::DateTime<chrono::Utc>;
