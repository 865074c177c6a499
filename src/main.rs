//! The `perch` command line: parses the arguments and dispatches to the command's module in
//! `perch::cli`, where each command's arguments are defined.
#![allow(clippy::print_stderr)]

use clap::{Parser, Subcommand};
use perch::cli;
use perch::cli::given_dir;
use perch::host::logging::{self, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;

/// perch hosts one AI agent per directory, headless, with every command the model authors
/// running inside a microVM.
#[derive(Debug, Parser)]
#[command(name = "perch", version, about, long_about = None)]
struct Cli {
    /// The agent directory [default: the current directory]
    ///
    /// Taken by every command. A command's own DIR argument is still taken; given both, they
    /// must name the same directory
    #[arg(
        id = "agent_dir",
        short = 'C',
        long = "dir",
        value_name = "DIR",
        global = true
    )]
    dir: Option<PathBuf>,
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
    Chown(cli::chown::ChownArgs),
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
    match dispatch(cli.dir, cli.command) {
        Ok(code) => code,
        Err(message) => {
            eprintln!(
                "{}error: {}",
                cli::error_prefix(),
                perch_core::terminal::escaped_lines(&message)
            );
            ExitCode::FAILURE
        }
    }
}

/// Runs `command` on the agent directory `-C` names (`flag`), or the one its own DIR argument
/// names.
fn dispatch(flag: Option<PathBuf>, command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Init(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::init::run(args)
        }
        Command::Info(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::info::run(args)
        }
        Command::Doctor(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::doctor::command(args)
        }
        Command::Image(args) => cli::image::run(args),
        Command::Exec(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::tool::exec(args)
        }
        Command::Run(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::run::run(args)
        }
        Command::Status(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::status::run(args)
        }
        Command::Log(args) => cli::log::run(args, flag),
        Command::Pair(mut args) => {
            let dir = args.command.dir_mut();
            *dir = given_dir(flag, dir.take())?;
            cli::pair::run(args)
        }
        Command::Chat(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::chat::run(args)
        }
        Command::Compact(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::chat::compact(args)
        }
        Command::Tool(args) => cli::tool::tool(args, flag),
        Command::Channel(mut args) => {
            let dir = args.command.dir_mut();
            *dir = given_dir(flag, dir.take())?;
            cli::channel::run(args)
        }
        Command::Heartbeat(mut args) => {
            let dir = args.command.dir_mut();
            *dir = given_dir(flag, dir.take())?;
            cli::heartbeat::run(args)
        }
        Command::Chown(mut args) => {
            args.dir = given_dir(flag, args.dir)?;
            cli::chown::run(args)
        }
    }
}
