//! The `perch` command line: parses the arguments and dispatches to the command's module in
//! `perch::cli`, where each command's arguments are defined.
#![allow(clippy::print_stderr)]

use clap::{Parser, Subcommand};
use perch::cli;
use perch::host::logging::{self, LogFormat};
use std::process::ExitCode;

/// perch hosts one AI agent per directory, headless, with every command the model authors
/// running inside a microVM.
#[derive(Debug, Parser)]
#[command(name = "perch", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Init(cli::init::InitArgs),
    Info(cli::info::InfoArgs),
    Doctor(cli::doctor::DoctorArgs),
    Image(cli::image::ImageArgs),
    Exec(cli::tool::ExecArgs),
    Run(cli::run::RunArgs),
    Status(cli::status::StatusArgs),
    Log(cli::log::LogArgs),
    Pair(cli::pair::PairArgs),
    Chat(cli::chat::ChatArgs),
    Compact(cli::chat::CompactArgs),
    Tool(cli::tool::ToolArgs),
    Channel(cli::channel::ChannelArgs),
    Heartbeat(cli::heartbeat::HeartbeatArgs),
}

fn main() -> ExitCode {
    perch::host::metrics::tune_allocator();
    let cli = Cli::parse();
    logging::init(match &cli.command {
        Command::Run(args) => args.log_format,
        _ => LogFormat::Human,
    });
    if let Err(error) = perch::host::limits::raise_open_files() {
        tracing::warn!("{error}");
    }
    let result = match cli.command {
        Command::Init(args) => cli::init::run(args),
        Command::Info(args) => cli::info::run(args),
        Command::Doctor(args) => cli::doctor::command(args),
        Command::Image(args) => cli::image::run(args),
        Command::Exec(args) => cli::tool::exec(args),
        Command::Run(args) => cli::run::run(args),
        Command::Status(args) => cli::status::run(args),
        Command::Log(args) => cli::log::run(args),
        Command::Pair(args) => cli::pair::run(args),
        Command::Chat(args) => cli::chat::run(args),
        Command::Compact(args) => cli::chat::compact(args),
        Command::Tool(args) => cli::tool::tool(args),
        Command::Channel(args) => cli::channel::run(args),
        Command::Heartbeat(args) => cli::heartbeat::run(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("{}error: {message}", cli::error_prefix());
            ExitCode::FAILURE
        }
    }
}
