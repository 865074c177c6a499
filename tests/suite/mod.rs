mod agent_dir;
mod catalog;
mod config;
mod journal;
mod log;
mod support;
