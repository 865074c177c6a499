//! `perch channel add`: a stock chat adapter copied into the agent directory.

use super::{dir_or_current, emit};
use crate::agent::{self, AgentDir};
use clap::Subcommand;
use perch_core::config::{ChannelKind, Platform};
use perch_core::name::ChannelName;
use std::path::PathBuf;
use std::process::ExitCode;

/// The agent's chat channels (channels/*.lua)
#[derive(Debug, clap::Args)]
pub struct ChannelArgs {
    #[command(subcommand)]
    pub command: ChannelCommand,
}

#[derive(Debug, Subcommand)]
pub enum ChannelCommand {
    /// Copy the stock adapter for KIND into DIR/channels/KIND.lua
    ///
    /// KIND is discord, telegram, matrix or slack; every option is explained in comments. Says which
    /// environment variables to set. Never overwrites a file.
    Add {
        /// discord, telegram, matrix or slack
        kind: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Name the channel (and its file, channels/NAME.lua) otherwise than after its kind
        #[arg(long)]
        name: Option<String>,
    },
}

impl ChannelCommand {
    /// The agent directory this command's DIR argument names.
    pub fn dir_mut(&mut self) -> &mut Option<PathBuf> {
        match self {
            ChannelCommand::Add { dir, .. } => dir,
        }
    }
}

pub fn run(args: ChannelArgs) -> Result<ExitCode, String> {
    match args.command {
        ChannelCommand::Add { kind, dir, name } => {
            add_channel(&kind, dir_or_current(dir), name.as_deref())
        }
    }
}

fn add_channel(kind: &str, dir: PathBuf, name: Option<&str>) -> Result<ExitCode, String> {
    let kind = ChannelKind::parse(kind).ok_or_else(|| {
        format!("unknown channel kind {kind:?}; use one of discord, telegram, matrix, slack")
    })?;
    let name = name
        .map(|name| ChannelName::try_from(name).map_err(|error| format!("--name: {error}")))
        .transpose()?;
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let added = agent::add_channel(&agent_dir, kind, name.as_ref())?;
    let config = &added.channel.config;
    let mut out = format!(
        "created {} (channel {}, {kind})\n\nset in the service's environment:\n",
        added.path.display(),
        config.name
    );
    for (key, variable) in config.platform.credentials() {
        out.push_str(&format!("  {:<24} {key}\n", variable.name().as_str()));
    }
    let matrix = if matches!(config.platform, Platform::Matrix { .. }) {
        "set homeserver and user, "
    } else {
        ""
    };
    out.push_str(&format!(
        "\nthen edit {}: {matrix}add the rooms and the people allowed\n",
        added.channel.file
    ));
    let variables: Vec<String> = config
        .platform
        .credentials()
        .into_iter()
        .map(|(_, variable)| variable.name().as_str().to_owned())
        .collect();
    out.push_str(&super::next_line(
        &dir,
        &variables,
        &["perch doctor --online", "perch run"],
    ));
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
