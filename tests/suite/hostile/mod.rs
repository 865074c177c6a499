//! The standing adversarial suite: each test plays an attacker through the real binary (a guest
//! writing into `workspace/` or running commands, a chat user sending messages through the
//! platform fakes, a second local user) and asserts that perch stays bounded and keeps working.
//! A new guest-reachable or chat-reachable input gets a case here.

mod chat;
mod deploy;
mod lua;
mod output;
mod workspace_files;
