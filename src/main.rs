//! The `perch` command line.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use clap::{Parser, Subcommand};
use perch::agent::{self, AgentDir, InitStatus};
use perch::heartbeat;
use perch::host::clock::system_clock;
use perch::host::logging::LogFormat;
use perch::host::notify::Notifier;
use perch::host::signals::StopSignals;
use perch::lane::Runtime;
use perch::lane::{Lane, RunLimits};
use perch::model;
use perch::model::ToolSpec;
use perch::sandbox::{self, End, Machine, MachineSetup};
use perch::service::ServiceSetup;
use perch::store::control::{self, ControlRequest};
use perch::store::inbox::InboxRecord;
use perch::store::outbox::OutboxRecord;
use perch::store::pairing;
use perch::tools::toolbox::Toolbox;
use perch::{doctor, image, info};
use perch_core::config::{ChannelKind, Platform};
use perch_core::control::{
    Approved, HeartbeatList, HeartbeatListed, HeartbeatRan, Heartbeats, LastEvent, LiveStatus,
    PendingPairing, Resumed, RunEnd, SpendStatus, StatusReport, UnknownDelivery,
};
use perch_core::image::Flavour;
use perch_core::log::Outcome;
use perch_core::name::{ChannelName, LaneName};
use perch_core::pairing::Approval;
use perch_core::prompt::Origin;
use perch_core::terminal::shown;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

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
    /// Create an agent directory, or fill in what it lacks. Idempotent: files you edited are
    /// kept, and nothing outside DIR is written.
    Init {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
    /// Show what the agent is: model, sandbox, egress hosts, secrets (names, never values) and
    /// tools. Reads only; never takes the agent's lock or repairs anything.
    Info {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Check that this machine can run perch's microVMs: KVM, hardware virtualization, the
    /// microsandbox runtime, the cache directory, the image and the clock; with an agent
    /// directory, also the permissions of its secrets. Quick and local: nothing is booted or
    /// downloaded, and nothing is sent unless --online. PERCH_ASSUME_KVM=1 turns a failed
    /// virtualization check into a warning; PERCH_ENV_FILE names the agent's environment file
    /// when it is not /etc/perch/NAME.env.
    Doctor {
        /// An agent directory: check the image its sandbox.lua names instead of perch:default,
        /// and its secrets [default: the current directory, if it is an agent directory]
        dir: Option<PathBuf>,
        /// Also check, over the network, every channel's credentials and every model provider's
        /// key (all at once, 5 s each); never prints a credential
        #[arg(long)]
        online: bool,
    },
    /// perch's own image, perch:default
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Run a command in the agent's sandbox, through `sh -lc` in /workspace, and exit with its
    /// status. The words after `--` are joined with spaces into one shell line, as ssh does.
    /// Standard input is passed on when it is not a terminal. Ctrl-C cancels (exit 130).
    Exec {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// The command line
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// Run the agent as a service: recover, connect every channel in channels/, and answer until
    /// SIGINT or SIGTERM. Holds the agent directory's lock while it runs.
    Run {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// How log lines on stderr are written
        #[arg(long, value_enum, value_name = "FORMAT", default_value = "human")]
        log_format: LogFormat,
        /// Serve Prometheus metrics at http://ADDR/metrics (off without this flag; `--metrics`
        /// alone listens on 127.0.0.1:9464). They are not authenticated: an address other than
        /// loopback is warned about
        #[arg(
            long,
            value_name = "ADDR",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = perch::host::metrics::DEFAULT_ADDR
        )]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Show what a running (or stopped) service holds: channels, inbox items waiting, deliveries
    /// waiting or of unknown fate, pending pairings. Read-only: takes no lock.
    Status {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show what the agent did and why: each turn (a chat message or a heartbeat firing, and
    /// everything the run it started did up to its delivery) with its time, channel, room,
    /// sender and text, the model's replies (reasoning folded), each tool call with its
    /// arguments, exit code, duration and the head of its output, each delivery's state, and
    /// tokens and cost per turn and per lane. Read-only: takes no lock and repairs nothing; a
    /// damaged line is shown with its file and line. Paged through $PAGER (default `less -FRX`)
    /// when standard output is a terminal.
    Log(perch::log_command::LogArgs),
    /// Approve the sender who was given CODE, so they may talk to the agent in direct messages.
    /// Reaches a running `perch run` through .perch/control.sock; acts directly otherwise.
    Pair {
        #[command(subcommand)]
        command: PairCommand,
    },
    /// Talk to the agent from the terminal. Each line is one message, through the same durable
    /// lane a chat message takes; the reply streams back. The conversation (lane `terminal`)
    /// persists in .perch/ and continues on the next start. Ctrl-C aborts the reply in progress.
    Chat {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
    /// Summarise a lane's conversation into one entry, so the next run starts from it. The
    /// history stays in the log.
    Compact {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// The lane to compact
        #[arg(long, default_value = "terminal")]
        lane: String,
    },
    /// List the agent's tools, or run one with JSON arguments and print its result.
    Tool {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// The tool to run; without it, the tools are listed
        name: Option<String>,
        /// The arguments, as one JSON object
        #[arg(long, value_name = "JSON")]
        args: Option<String>,
    },
    /// The agent's chat channels (channels/*.lua)
    Channel {
        #[command(subcommand)]
        command: ChannelCommand,
    },
    /// The scheduled tasks in workspace/HEARTBEAT.yml
    Heartbeat {
        #[command(subcommand)]
        command: HeartbeatCommand,
    },
}

#[derive(Debug, Subcommand)]
enum HeartbeatCommand {
    /// List each task with its schedule, its next firing, its last outcome, and the error of an
    /// edit that did not check (the last good schedule keeps running). Read-only.
    List {
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Run a task now, without consuming a slot, and print the reply and its judgement. Goes
    /// through the running `perch run` when there is one; otherwise this process takes the
    /// directory, connects the channels to deliver (never to receive) and stops after the run.
    /// With --dry-run, the whole turn runs, tools included, in the task's dry-run lane, and
    /// nothing is delivered.
    Run {
        /// The task's name
        name: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
    },
    /// Resume a task that stopped on an authentication or quota error. Editing the task's entry
    /// in HEARTBEAT.yml resumes it too.
    Resume {
        /// The task's name
        name: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ChannelCommand {
    /// Copy the stock adapter for KIND (discord, telegram or matrix), with every option
    /// explained in comments, into DIR/channels/KIND.lua, and say which environment variables
    /// to set. Never overwrites a file.
    Add {
        /// discord, telegram or matrix
        kind: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
        /// Name the channel (and its file, channels/NAME.lua) otherwise than after its kind
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum PairCommand {
    /// Approve the pairing code a sender was given
    Approve {
        /// The code, as the sender received it
        code: String,
        /// The agent directory [default: the current directory]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build perch:default offline from this host's Debian mirror and load it into
    /// microsandbox: debootstrap (minbase) makes the root filesystem, which is packed as an OCI
    /// archive under $PERCH_CACHE/images/. A build for the same recipe is reused. Needs root
    /// and debootstrap.
    Build {
        /// Minbase alone, without git, ripgrep, fd-find, jq, curl, ca-certificates,
        /// build-essential and python3 (for tests and small machines)
        #[arg(long)]
        minimal: bool,
        /// The Debian archive to build from [default: the first Debian mirror in apt's sources
        /// that is not a security mirror]
        #[arg(long, value_name = "URL")]
        mirror: Option<String>,
        /// The release to build [default: VERSION_CODENAME in /etc/os-release]
        #[arg(long, value_name = "NAME")]
        suite: Option<String>,
        /// Build the root filesystem and the archive again even if they exist
        #[arg(long)]
        rebuild: bool,
    },
    /// Load the built perch:default into this user's microsandbox home ($MSB_HOME). `perch
    /// image build` as root leaves this to the user that owns the home.
    Load,
}

fn main() -> ExitCode {
    perch::host::metrics::tune_allocator();
    let cli = Cli::parse();
    perch::host::logging::init(match &cli.command {
        Command::Run { log_format, .. } => *log_format,
        _ => LogFormat::Human,
    });
    if let Err(error) = perch::host::limits::raise_open_files() {
        tracing::warn!("{error}");
    }
    let result = match cli.command {
        Command::Init { dir } => init(dir.unwrap_or_else(|| PathBuf::from("."))),
        Command::Info { dir, json } => show_info(dir.unwrap_or_else(|| PathBuf::from(".")), json),
        Command::Doctor { dir, online } => run_doctor(dir, online),
        Command::Image {
            command:
                ImageCommand::Build {
                    minimal,
                    mirror,
                    suite,
                    rebuild,
                },
        } => build_image(image::BuildOptions {
            flavour: if minimal {
                Flavour::Minimal
            } else {
                Flavour::Default
            },
            mirror,
            suite,
            rebuild,
        }),
        Command::Image {
            command: ImageCommand::Load,
        } => load_image(),
        Command::Status { dir, json } => status(dir.unwrap_or_else(|| PathBuf::from(".")), json),
        Command::Log(args) => perch::log_command::run(args),
        Command::Pair {
            command: PairCommand::Approve { code, dir },
        } => pair_approve(dir.unwrap_or_else(|| PathBuf::from(".")), &code),
        Command::Run {
            dir,
            log_format,
            metrics,
        } => run_service(
            dir.unwrap_or_else(|| PathBuf::from(".")),
            log_format,
            metrics,
        ),
        Command::Heartbeat { command } => match command {
            HeartbeatCommand::List { dir, json } => {
                heartbeat_list(dir.unwrap_or_else(|| PathBuf::from(".")), json)
            }
            HeartbeatCommand::Run {
                name,
                dir,
                dry_run,
                json,
            } => heartbeat_run(
                dir.unwrap_or_else(|| PathBuf::from(".")),
                &name,
                dry_run,
                json,
            ),
            HeartbeatCommand::Resume { name, dir } => {
                heartbeat_resume(dir.unwrap_or_else(|| PathBuf::from(".")), &name)
            }
        },
        Command::Chat { dir } => chat(dir.unwrap_or_else(|| PathBuf::from("."))),
        Command::Compact { dir, lane } => compact(dir.unwrap_or_else(|| PathBuf::from(".")), &lane),
        Command::Exec { dir, command } => exec(dir.unwrap_or_else(|| PathBuf::from(".")), &command),
        Command::Channel {
            command: ChannelCommand::Add { kind, dir, name },
        } => add_channel(
            &kind,
            dir.unwrap_or_else(|| PathBuf::from(".")),
            name.as_deref(),
        ),
        Command::Tool { dir, name, args } => tool(
            dir.unwrap_or_else(|| PathBuf::from(".")),
            name.as_deref(),
            args.as_deref(),
        ),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Writes to stdout; a closed pipe (`perch info | head`) is not an error.
fn emit(text: &str) -> Result<(), String> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write output: {error}"))
        }
        _ => Ok(()),
    }
}

fn init(dir: PathBuf) -> Result<ExitCode, String> {
    let (root, items) =
        agent::init(&dir).map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    let mut out = format!("initialised {}\n", root.display());
    let mut refused = false;
    for item in &items {
        let (word, note) = match &item.status {
            InitStatus::Created => ("created", String::new()),
            InitStatus::Unchanged => ("unchanged", String::new()),
            InitStatus::Changed => ("changed", "  (yours, kept as it is)".to_owned()),
            InitStatus::Refused { reason } => {
                refused = true;
                ("refused", format!("  ({reason})"))
            }
        };
        out.push_str(&format!("  {word:<10} {}{note}\n", item.path));
    }
    out.push_str("\nedit instructions.md and models.yml, then check the agent with `perch info`\n");
    emit(&out)?;
    Ok(if refused {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn add_channel(kind: &str, dir: PathBuf, name: Option<&str>) -> Result<ExitCode, String> {
    let kind = ChannelKind::parse(kind).ok_or_else(|| {
        format!("unknown channel kind {kind:?}; use one of discord, telegram, matrix")
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
        "\nthen edit {}: {matrix}add the rooms and the people allowed, and check the agent with `perch info`\n",
        added.channel.file
    ));
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn show_info(dir: PathBuf, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let loaded = match agent::load(&agent_dir) {
        Ok(loaded) => loaded,
        Err(problems) => {
            for problem in problems.iter() {
                eprintln!("error: {problem}");
            }
            let count = problems.len();
            let noun = if count == 1 { "problem" } else { "problems" };
            eprintln!("{count} {noun} in {}", agent_dir.root().display());
            return Ok(ExitCode::FAILURE);
        }
    };
    if json {
        let text = serde_json::to_string_pretty(&info::to_json(&loaded))
            .map_err(|error| error.to_string())?;
        emit(&format!("{text}\n"))?;
    } else {
        emit(&info::to_text(&loaded))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_doctor(dir: Option<PathBuf>, online: bool) -> Result<ExitCode, String> {
    let dir = dir.or_else(|| {
        perch::agent::AgentDir::open(std::path::Path::new("."))
            .is_ok()
            .then(|| PathBuf::from("."))
    });
    let mut checks = doctor::run(&perch::host::Places::from_environment(), dir.as_deref());
    if online {
        match &dir {
            Some(dir) => checks.extend(runtime()?.block_on(doctor::online(
                dir,
                |name| std::env::var(name).ok(),
                doctor::ONLINE_TIMEOUT,
            ))),
            None => checks.push(doctor::Check {
                name: "online",
                status: doctor::Status::Fail,
                detail: "nothing checked: no agent directory".to_owned(),
                fix: Some("pass the agent's directory, or run in it".to_owned()),
            }),
        }
    }
    let mut out = String::new();
    for check in &checks {
        out.push_str(&format!("{check}\n"));
    }
    emit(&out)?;
    let failed = checks
        .iter()
        .any(|check| check.status == doctor::Status::Fail);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn build_image(options: image::BuildOptions) -> Result<ExitCode, String> {
    let started = std::time::Instant::now();
    let places = perch::host::Places::from_environment();
    let cache = places.cache.clone();
    let mut progress = |line: &str| {
        let _ = emit(&format!("image: {line}\n"));
    };
    let prepared = image::prepare(&cache, &image::Host::system(), &options, &mut progress)
        .map_err(|error| error.to_string())?;
    progress(&format!(
        "loading {} into microsandbox as {} ...",
        prepared.dir.archive().display(),
        perch_core::image::DEFAULT_REFERENCE
    ));
    if let Some(reason) = perch::host::trust::refusal_as_root(&places.msb_home) {
        image::record(&cache, &prepared).map_err(|error| error.to_string())?;
        progress(&format!(
            "built, not loaded: this is root, and {reason}; load it as the user that owns {}: perch image load",
            places.msb_home.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let loading = std::time::Instant::now();
    let image = runtime()?
        .block_on(image::install(&places, &prepared))
        .map_err(|error| error.to_string())?;
    progress(&format!(
        "loaded in {:.1} s; {} is ready (recorded in {})",
        loading.elapsed().as_secs_f64(),
        image.reference(),
        image::default_record(&cache).display()
    ));
    progress(&format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(ExitCode::SUCCESS)
}

fn load_image() -> Result<ExitCode, String> {
    let places = perch::host::Places::from_environment();
    if let Some(reason) = perch::host::trust::refusal_as_root(&places.msb_home) {
        return Err(format!(
            "not loading the image as root: {reason}\n  fix: run it as the user that owns {}",
            places.msb_home.display()
        ));
    }
    let image = runtime()?
        .block_on(image::load_recorded(&places))
        .map_err(|error| error.to_string())?;
    emit(&format!(
        "image: {} is loaded into {}\n",
        image.reference(),
        places.msb_home.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn load_agent(dir: &Path) -> Result<Result<agent::LoadedAgent, ExitCode>, String> {
    let agent_dir = AgentDir::open(dir).map_err(|error| error.to_string())?;
    match agent::load(&agent_dir) {
        Ok(loaded) => Ok(Ok(loaded)),
        Err(problems) => {
            for problem in problems.iter() {
                eprintln!("error: {problem}");
            }
            let count = problems.len();
            let noun = if count == 1 { "problem" } else { "problems" };
            eprintln!("{count} {noun} in {}", agent_dir.root().display());
            Ok(Err(ExitCode::FAILURE))
        }
    }
}

/// The most async worker threads a process starts: an agent mostly waits on the network, its
/// model and its VM, so more cores do not need more workers (each holds a stack and an arena).
const WORKERS_MAX: usize = 2;

/// The most threads for blocking work (file I/O, SQLite), and how long an idle one lingers.
const BLOCKING_MAX: usize = 64;
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(2);

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(WORKERS_MAX))
        .max_blocking_threads(BLOCKING_MAX)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))
}

/// A token cancelled by the first Ctrl-C.
fn cancel_on_interrupt() -> CancellationToken {
    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    cancel
}

fn machine(agent: &agent::LoadedAgent) -> Result<Machine, String> {
    sandbox::machine_for(agent, &MachineSetup::from_environment(), |name| {
        std::env::var(name).ok()
    })
    .map_err(|error| error.to_string())
}

fn exec(dir: PathBuf, words: &[String]) -> Result<ExitCode, String> {
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let mut stdin = None;
    if !io::stdin().is_terminal() {
        let mut bytes = Vec::new();
        io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|error| format!("cannot read standard input: {error}"))?;
        stdin = Some(bytes);
    }
    runtime()?.block_on(async {
        let machine = machine(&agent)?;
        let mut command = sandbox::Command::argv(["/bin/sh", "-lc", &words.join(" ")]);
        command.stdin = stdin;
        let result = machine.run(command, cancel_on_interrupt()).await;
        let stopped = machine.stop().await;
        let output = result.map_err(|error| error.to_string())?;
        write_captured(&mut io::stdout(), &output.stdout, "stdout");
        write_captured(&mut io::stderr(), &output.stderr, "stderr");
        if !matches!(output.end, End::Exited(_)) {
            eprintln!("perch: the command was {}", output.end);
        }
        stopped.map_err(|error| error.to_string())?;
        Ok(ExitCode::from(u8::try_from(output.end.code()).unwrap_or(1)))
    })
}

/// Writes what perch kept of a stream; a line on stderr says how much of it was left out.
fn write_captured(out: &mut impl Write, stream: &sandbox::Captured, name: &str) {
    out.write_all(stream.head()).and_then(|()| out.flush()).ok();
    if !stream.is_complete() {
        eprintln!(
            "\nperch: {} of {} bytes of {name} left out (perch keeps the first and last {} KiB of each stream)",
            stream.omitted(),
            stream.total(),
            sandbox::StreamCap::HOST_DEFAULT.head >> 10
        );
        out.write_all(stream.tail()).and_then(|()| out.flush()).ok();
    }
}

fn tool(dir: PathBuf, name: Option<&str>, args: Option<&str>) -> Result<ExitCode, String> {
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    let Some(name) = name else {
        let mut out = String::new();
        let lua_tools = agent.definition.tools.iter().map(|tool| ToolSpec {
            name: tool.name.to_string(),
            description: tool.description.clone(),
            parameters: tool.json_schema(),
        });
        for tool in perch::tools::builtin::builtin_specs()
            .into_iter()
            .chain(lua_tools)
        {
            out.push_str(&format!(
                "{}  {}\n",
                tool.name,
                first_line(&tool.description)
            ));
            out.push_str(&format!(
                "    arguments: {}\n",
                tool.parameters["properties"]
            ));
        }
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    };
    let arguments: serde_json::Value = match args {
        Some(text) => {
            serde_json::from_str(text).map_err(|error| format!("--args is not JSON: {error}"))?
        }
        None => serde_json::Value::Object(serde_json::Map::new()),
    };
    runtime()?.block_on(async {
        let machine = machine(&agent)?;
        let toolbox = Toolbox::new(std::sync::Arc::new(agent), machine.clone());
        let outcome = toolbox.call(name, &arguments, cancel_on_interrupt()).await;
        let stopped = machine.stop().await;
        let mut text = outcome.output;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        stopped.map_err(|error| error.to_string())?;
        if outcome.is_error {
            eprint!("error: {text}");
            return Ok(ExitCode::FAILURE);
        }
        emit(&text)?;
        Ok(ExitCode::SUCCESS)
    })
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The agent's runtime and its terminal lane, opened and recovered.
async fn open_terminal(agent: agent::LoadedAgent, lane: &str) -> Result<(Runtime, Lane), String> {
    let lookup = |name: &str| std::env::var(name).ok();
    let endpoint = model::endpoint_for(&agent, lookup)?;
    let runtime = Runtime::start(
        agent,
        &MachineSetup::from_environment(),
        model::connect(endpoint),
        system_clock(),
        lookup,
    )?;
    let origin = Origin::terminal();
    for problem in runtime.prompt_problems(&origin) {
        eprintln!("warning: {problem}");
    }
    let name = LaneName::try_from(lane).map_err(|error| format!("--lane: {error}"))?;
    let (lane, report) = runtime
        .open_lane(&name, origin, RunLimits::default())
        .await
        .map_err(|error| error.to_string())?;
    if report.operations_closed > 0 {
        eprintln!(
            "recovered lane {name}: {} unfinished operation(s) closed, {} tool(s) run again, {} tool(s) marked interrupted",
            report.operations_closed, report.tools_rerun, report.tools_interrupted
        );
    }
    Ok((runtime, lane))
}

fn chat(dir: PathBuf) -> Result<ExitCode, String> {
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    runtime()?.block_on(async {
        let (runtime, lane) = open_terminal(agent, "terminal").await?;
        let on_interrupt = lane.clone();
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                let _ = on_interrupt.abort();
            }
        });
        let interactive = io::stdin().is_terminal();
        let mut screen = perch::chat::Screen {
            out: io::stdout(),
            notes: io::stderr(),
        };
        let result = perch::chat::chat(
            &lane,
            tokio::io::BufReader::new(tokio::io::stdin()),
            &mut screen,
            interactive.then_some("> "),
        )
        .await;
        let closed = lane.close().await;
        let stopped = runtime.machine().stop().await;
        result?;
        closed.map_err(|error| error.to_string())?;
        stopped.map_err(|error| error.to_string())?;
        Ok(ExitCode::SUCCESS)
    })
}

fn compact(dir: PathBuf, lane_name: &str) -> Result<ExitCode, String> {
    let agent = match load_agent(&dir)? {
        Ok(agent) => agent,
        Err(code) => return Ok(code),
    };
    runtime()?.block_on(async {
        let (runtime, lane) = open_terminal(agent, lane_name).await?;
        let finished = lane.compact(None).await.map_err(|error| error.to_string());
        let closed = lane.close().await;
        let stopped = runtime.machine().stop().await;
        let finished = finished?;
        closed.map_err(|error| error.to_string())?;
        stopped.map_err(|error| error.to_string())?;
        match finished.outcome {
            Outcome::Completed => {
                emit(&format!("compacted lane {lane_name}:\n{}\n", finished.text))?;
                Ok(ExitCode::SUCCESS)
            }
            other => Err(format!("compaction did not complete: {other:?}")),
        }
    })
}

/// `perch run`. With `--log-format json` its failures are log lines too, so that everything it
/// writes on stderr is JSON.
fn run_service(
    dir: PathBuf,
    log_format: LogFormat,
    metrics: Option<std::net::SocketAddr>,
) -> Result<ExitCode, String> {
    match (serve(dir, log_format, metrics), log_format) {
        (Err(message), LogFormat::Json) => {
            tracing::error!("{message}");
            Ok(ExitCode::FAILURE)
        }
        (served, _) => served,
    }
}

fn serve(
    dir: PathBuf,
    log_format: LogFormat,
    metrics: Option<std::net::SocketAddr>,
) -> Result<ExitCode, String> {
    let agent = match log_format {
        LogFormat::Human => match load_agent(&dir)? {
            Ok(agent) => agent,
            Err(code) => return Ok(code),
        },
        LogFormat::Json => {
            let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
            agent::load(&agent_dir).map_err(|problems| {
                for problem in problems.iter() {
                    tracing::error!("{problem}");
                }
                format!(
                    "{} problem(s) in {}",
                    problems.len(),
                    agent_dir.root().display()
                )
            })?
        }
    };
    runtime()?.block_on(async {
        let lookup = |name: &str| std::env::var(name).ok();
        let endpoint = model::endpoint_for(&agent, lookup)?;
        let notifier = Notifier::from_env().unwrap_or_else(|error| {
            tracing::warn!("not notifying systemd: {error}");
            Notifier::disabled()
        });
        let metrics_listener = match metrics {
            None => None,
            Some(address) => Some(
                tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|error| format!("--metrics={address}: cannot listen: {error}"))?,
            ),
        };
        let setup = ServiceSetup {
            machine: MachineSetup::from_environment(),
            model: model::connect(endpoint),
            connectors: {
                let agent_dir = agent.dir.clone();
                std::sync::Arc::new(move |channel: &perch::agent::LoadedChannel| {
                    perch::channel::connect(channel, &agent_dir, |name| std::env::var(name).ok())
                })
            },
            clock: system_clock(),
            limits: RunLimits::default(),
            lanes: perch::service::LaneLimits::default(),
            reconnect: std::time::Duration::from_secs(1),
            heartbeat_reload: heartbeat::RELOAD_EVERY,
            notifier,
            drain: std::time::Duration::from_secs(30),
            metrics: std::sync::Arc::new(perch::host::metrics::Metrics::default()),
            metrics_listener,
            once: None,
        };
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        let mut signals = StopSignals::listen()?;
        tokio::spawn(async move {
            signals.next().await;
            tracing::info!("stopping: finishing the runs in progress (a second signal exits now)");
            on_signal.cancel();
            signals.next().await;
            tracing::warn!("second signal: exiting now; the next start recovers what was open");
            std::process::exit(130);
        });
        tracing::info!("running {}", dir.display());
        if let Some(listener) = &setup.metrics_listener {
            let address = listener.local_addr().map_err(|error| error.to_string())?;
            tracing::info!(%address, "metrics on http://{address}/metrics");
            if !address.ip().is_loopback() {
                tracing::warn!(
                    %address,
                    "the metrics listen on {address}, which is not a loopback address: anyone \
                     who can reach it can read them"
                );
            }
        }
        perch::service::run(agent, setup, shutdown).await?;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

fn pair_approve(dir: PathBuf, code: &str) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::PairApprove {
        code: code.to_owned(),
    };
    let approved: Approved = match runtime()?.block_on(control::ask(&agent_dir, &request)) {
        Some(answer) => answer?,
        None => {
            let _lock = perch::agent::OwnerLock::acquire(&agent_dir).map_err(|error| {
                format!("{error}; its control socket does not answer, so the code cannot be approved now")
            })?;
            let path = agent_dir.pairing_file();
            let mut pairing = pairing::read_pairing(&path)?;
            match pairing.approve(code, chrono::Utc::now()) {
                Approval::Approved(approved) => {
                    pairing::write_pairing(&path, &pairing)?;
                    approved
                }
                Approval::Unknown => return Err(pairing::no_pending_pairing(code)),
            }
        }
    };
    emit(&format!(
        "approved {} ({}) on channel {}\n",
        shown(&approved.name),
        shown(&approved.sender),
        shown(&approved.channel)
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The heartbeat tasks as the running service sees them, or, when none runs, as the file and
/// the ledger say.
fn heartbeat_listing(agent_dir: &AgentDir) -> Result<HeartbeatList, String> {
    let live = runtime()?.block_on(control::ask_within::<HeartbeatListed>(
        agent_dir,
        &ControlRequest::HeartbeatList,
        STATUS_TIMEOUT,
    ));
    if let Some(Ok(answer)) = live {
        return Ok(answer.list);
    }
    let loaded = agent::load(agent_dir).map_err(|problems| {
        format!(
            "{} problem(s) in the agent's files: run `perch info`",
            problems.len()
        )
    })?;
    let env = heartbeat::heartbeat_env(&loaded, heartbeat::host_tz());
    let (tasks, error) = match heartbeat::read_file(agent_dir, &env) {
        Ok(file) => (file.tasks, None),
        Err(error) => (Vec::new(), Some(error)),
    };
    let state = heartbeat::peek_ledger(agent_dir)?;
    let now = chrono::Utc::now();
    Ok(heartbeat::listing(
        &tasks,
        &state,
        &heartbeat::first_seen_now(&tasks, now),
        now,
        error.as_deref(),
    ))
}

fn heartbeat_list(dir: PathBuf, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let list = heartbeat_listing(&agent_dir)?;
    if json {
        emit(&format!("{}\n", printed(&list)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = String::new();
    if list.tasks.is_empty() {
        text.push_str("no heartbeat tasks\n");
    }
    for task in &list.tasks {
        text.push_str(&format!(
            "{}  {}  {}{}\n",
            task.name,
            task.schedule,
            task.status,
            task.next
                .as_deref()
                .map(|next| format!(", next {next}"))
                .unwrap_or_default(),
        ));
        if let Some(last) = &task.last {
            text.push_str(&format!("    last: {} ({})\n", last.outcome, last.at));
        }
    }
    if let Some(error) = &list.reload_error {
        text.push_str(&format!(
            "the last edit of workspace/HEARTBEAT.yml does not check; the last good schedule keeps running:\n{error}\n"
        ));
    }
    emit(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn heartbeat_run(dir: PathBuf, name: &str, dry_run: bool, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::HeartbeatRun {
        task: name.to_owned(),
        dry_run,
    };
    let end = match runtime()?.block_on(control::ask::<HeartbeatRan>(&agent_dir, &request)) {
        Some(answer) => answer?.end,
        None => heartbeat_run_here(&dir, name, dry_run)?,
    };
    if json {
        emit(&format!("{}\n", printed(&end)?))?;
    } else {
        let judgement = if end.valid {
            "valid verdict"
        } else {
            "invalid verdict"
        };
        emit(&format!("{}\n{judgement}: {}\n", end.reply, end.outcome))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A heartbeat run with no service running: this process takes the directory, connects the
/// channels (to deliver, never to receive), runs the task once through the same scheduler and
/// outbox `perch run` uses, and stops. No scheduled slot fires meanwhile.
fn heartbeat_run_here(dir: &Path, name: &str, dry_run: bool) -> Result<RunEnd, String> {
    let agent = match load_agent(dir)? {
        Ok(agent) => agent,
        Err(_) => return Err("the agent's files do not check: run `perch info`".into()),
    };
    runtime()?.block_on(async {
        let lookup = |name: &str| std::env::var(name).ok();
        let endpoint = model::endpoint_for(&agent, lookup)?;
        let (end, ended) = tokio::sync::oneshot::channel();
        let setup = ServiceSetup {
            machine: MachineSetup::from_environment(),
            model: model::connect(endpoint),
            connectors: {
                let agent_dir = agent.dir.clone();
                std::sync::Arc::new(move |channel: &perch::agent::LoadedChannel| {
                    perch::channel::connect(channel, &agent_dir, |name| std::env::var(name).ok())
                })
            },
            clock: system_clock(),
            limits: RunLimits::default(),
            lanes: perch::service::LaneLimits::default(),
            reconnect: std::time::Duration::from_secs(1),
            heartbeat_reload: heartbeat::RELOAD_EVERY,
            notifier: Notifier::disabled(),
            drain: std::time::Duration::from_secs(30),
            metrics: std::sync::Arc::new(perch::host::metrics::Metrics::default()),
            metrics_listener: None,
            once: Some(perch::service::HeartbeatOnce {
                task: name.to_owned(),
                dry_run,
                end,
            }),
        };
        perch::service::run(agent, setup, CancellationToken::new()).await?;
        let end = ended
            .await
            .map_err(|_| "the heartbeat run ended without a result".to_owned())??;
        Ok(heartbeat::run_end(&end))
    })
}

fn heartbeat_resume(dir: PathBuf, name: &str) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let request = ControlRequest::HeartbeatResume {
        task: name.to_owned(),
    };
    match runtime()?.block_on(control::ask::<Resumed>(&agent_dir, &request)) {
        Some(answer) => {
            answer?;
        }
        None => {
            let _lock =
                perch::agent::OwnerLock::acquire(&agent_dir).map_err(|error| error.to_string())?;
            runtime()?.block_on(heartbeat::resume_here(&agent_dir, name))?;
        }
    }
    emit(&format!("resumed {name}\n"))?;
    Ok(ExitCode::SUCCESS)
}

/// How long `perch status` (and `perch heartbeat list`) waits for each answer of the running
/// service before it shows what `.perch/` holds.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

fn status(dir: PathBuf, json: bool) -> Result<ExitCode, String> {
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let live = runtime()?.block_on(control::ask_within::<LiveStatus>(
        &agent_dir,
        &ControlRequest::Status,
        STATUS_TIMEOUT,
    ));
    let inbox =
        perch::log::peek_journal(&agent_dir.inbox_dir()).map_err(|error| error.to_string())?;
    let outbox =
        perch::log::peek_journal(&agent_dir.outbox_dir()).map_err(|error| error.to_string())?;
    let unknown: Vec<UnknownDelivery> = outbox
        .consumed
        .iter()
        .chain(&outbox.pending)
        .filter_map(|item| match OutboxRecord::read(&item.body) {
            Ok(OutboxRecord::Unknown { intent, reason }) => {
                Some(UnknownDelivery::Unknown { intent, reason })
            }
            _ => None,
        })
        .collect();
    let (pairing, pairing_error) = match pairing::read_pairing(&agent_dir.pairing_file()) {
        Ok(pairing) => (pairing, None),
        Err(error) => (perch_core::pairing::Pairing::default(), Some(error)),
    };
    let mut undecryptable = std::collections::BTreeMap::new();
    let channels: Vec<String> = match agent::load(&agent_dir) {
        Ok(loaded) => loaded
            .channels
            .iter()
            .map(|channel| {
                if channel.config.kind() == perch_core::config::ChannelKind::Matrix {
                    let name = channel.config.name.to_string();
                    let report = perch::channel::matrix::read_undecryptable(
                        &agent_dir.matrix_store_dir(&name),
                    );
                    undecryptable.insert(name, report.events.len());
                }
                format!(
                    "{} ({})",
                    channel.config.name,
                    channel.config.kind().as_str()
                )
            })
            .collect(),
        Err(problems) => vec![format!(
            "{} problem(s) in the agent's files: run `perch info`",
            problems.len()
        )],
    };
    let mut last_events = std::collections::BTreeMap::new();
    for item in inbox.consumed.iter().chain(&inbox.pending) {
        if let Ok(InboxRecord::Event { channel, event }) = InboxRecord::read(&item.body) {
            last_events.insert(
                channel,
                LastEvent {
                    at: item.at.to_rfc3339(),
                    platform_id: Some(event.platform_id),
                },
            );
        }
    }
    let (live, live_error) = match live {
        Some(Ok(live)) => (Some(live), None),
        Some(Err(error)) => (None, Some(error)),
        None => (None, None),
    };
    let report = StatusReport {
        running: live.is_some(),
        live_error,
        channels,
        channel_health: live.as_ref().map(|live| live.channels.clone()),
        undecryptable,
        inbox_pending: inbox.pending.len(),
        inbox_unreadable: inbox.unreadable.iter().map(ToString::to_string).collect(),
        outbox_unreadable: outbox.unreadable.iter().map(ToString::to_string).collect(),
        outbox_pending: outbox.pending.len(),
        deliveries_unknown: unknown,
        pairings_pending: pairing
            .pending
            .iter()
            .map(|pending| PendingPairing {
                channel: pending.channel.clone(),
                sender: pending.sender.clone(),
                name: pending.name.clone(),
                expires: pending.expires,
            })
            .collect(),
        approved_senders: pairing.approved.len(),
        pairing_unreadable: pairing_error
            .as_ref()
            .map(|error| format!("cannot read {error}; {}", pairing::PAIRING_UNREADABLE_FIX)),
        heartbeats: match heartbeat_listing(&agent_dir) {
            Ok(list) => Heartbeats::Listed(list),
            Err(error) => Heartbeats::Unlisted { error },
        },
        inbox_oldest_waiting: inbox
            .pending
            .iter()
            .map(|item| item.at)
            .min()
            .map(|at| at.to_rfc3339()),
        last_events,
        lanes_with_open_operations: perch::store::starts::open_operations(
            &agent_dir.sessions_dir(),
        ),
        vm: live.as_ref().map_or_else(
            || "stopped (no perch run holds it)".to_owned(),
            |live| live.vm.clone(),
        ),
        channels_paused: live.as_ref().and_then(|live| live.channels_paused.clone()),
        restart_needed: live
            .as_ref()
            .map(|live| live.restart_needed.clone())
            .unwrap_or_default(),
        last_start: perch::store::starts::read_last_start(&agent_dir),
        spend_today: match perch::store::spend::peek_today(&agent_dir, chrono::Utc::now()) {
            Ok(today) => SpendStatus::Known(today),
            Err(error) => SpendStatus::Unknown { error },
        },
    };
    if json {
        emit(&format!("{}\n", printed(&report)?))?;
    } else {
        emit(&status_text(
            &report,
            (&pairing, pairing_error.as_deref()),
            !inbox.unreadable.is_empty(),
            !outbox.unreadable.is_empty(),
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `perch status` as text.
fn status_text(
    report: &StatusReport,
    (pairing, pairing_error): (&perch_core::pairing::Pairing, Option<&str>),
    inbox_unreadable: bool,
    outbox_unreadable: bool,
) -> String {
    let at_least = |unreadable: bool| if unreadable { "at least " } else { "" };
    let mut out = String::new();
    out.push_str(&format!(
        "running            {}\n",
        match (&report.live_error, report.running) {
            (_, true) => "yes".to_owned(),
            (Some(error), false) => format!("unknown: {error}; the rest is read from .perch/"),
            (None, false) => "no".to_owned(),
        }
    ));
    out.push_str(&format!(
        "channels           {}\n",
        if report.channels.is_empty() {
            "(none)".to_owned()
        } else {
            report.channels.join(", ")
        }
    ));
    for channel in report.channel_health.iter().flatten() {
        out.push_str(&format!(
            "  {:<16} {}{}\n",
            channel.name,
            channel.connection,
            if channel.healthy {
                String::new()
            } else {
                format!(
                    "; UNHEALTHY: {}",
                    shown(
                        channel
                            .last_hook_error
                            .as_deref()
                            .unwrap_or("not receiving")
                    )
                )
            }
        ));
    }
    for (channel, count) in &report.undecryptable {
        out.push_str(&format!(
            "undecryptable      {count} event(s) in Matrix channel {channel}\n"
        ));
    }
    out.push_str(&format!(
        "inbox pending      {}{}{}\n",
        at_least(inbox_unreadable),
        report.inbox_pending,
        report
            .inbox_oldest_waiting
            .as_deref()
            .map(|at| format!(" (oldest since {at})"))
            .unwrap_or_default()
    ));
    for (journal, unreadable) in [
        ("inbox", &report.inbox_unreadable),
        ("outbox", &report.outbox_unreadable),
    ] {
        for line in unreadable {
            out.push_str(&format!(
                "{:<19}{}; `perch run` does not open the {journal} until it is repaired\n",
                format!("{journal} corrupt"),
                shown(line)
            ));
        }
    }
    for (channel, event) in &report.last_events {
        out.push_str(&format!("last event         {channel}: {}\n", event.at));
    }
    for (lane, open) in &report.lanes_with_open_operations {
        out.push_str(&format!("open operations    {lane}: {open}\n"));
    }
    out.push_str(&format!("vm                 {}\n", report.vm));
    if let Some(reason) = &report.channels_paused {
        out.push_str(&format!("channels paused    {reason}\n"));
    }
    if !report.restart_needed.is_empty() {
        out.push_str(&format!(
            "restart needed     {} changed since perch run started\n",
            report.restart_needed.join(", ")
        ));
    }
    if let Some(last) = &report.last_start {
        out.push_str(&format!("last start         {last}\n"));
    }
    if let SpendStatus::Known(today) = &report.spend_today {
        out.push_str(&format!("spend today        {}\n", today.summary()));
    }
    out.push_str(&format!(
        "outbox pending     {}{}\n",
        at_least(outbox_unreadable),
        report.outbox_pending
    ));
    out.push_str(&format!(
        "unknown deliveries {}\n",
        report.deliveries_unknown.len()
    ));
    for delivery in &report.deliveries_unknown {
        out.push_str(&format!("  {}\n", delivery.reason()));
    }
    match pairing_error {
        Some(error) => out.push_str(&format!(
            "pairings pending   unknown: cannot read {}\n  fix: {}\n",
            shown(error),
            pairing::PAIRING_UNREADABLE_FIX
        )),
        None => out.push_str(&format!("pairings pending   {}\n", pairing.pending.len())),
    }
    let mut pending: Vec<_> = pairing.pending.iter().collect();
    pending.sort_by_key(|pending| pending.expires);
    for pending in pending {
        out.push_str(&format!(
            "  {} ({}) on {}, until {}\n",
            shown(&pending.name),
            shown(&pending.sender),
            shown(&pending.channel),
            pending.expires.to_rfc3339()
        ));
    }
    if let Heartbeats::Listed(list) = &report.heartbeats {
        for task in &list.tasks {
            out.push_str(&format!(
                "heartbeat          {}: {}{}{}\n",
                task.name,
                task.status,
                task.next
                    .as_deref()
                    .map(|next| format!(", next {next}"))
                    .unwrap_or_default(),
                task.last
                    .as_ref()
                    .map(|last| format!(", last {}", last.outcome))
                    .unwrap_or_default(),
            ));
        }
        if let Some(error) = &list.reload_error {
            out.push_str(&format!("heartbeat file     does not check: {error}\n"));
        }
    }
    out
}

/// `value` as perch prints JSON: pretty, keys sorted.
fn printed<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_value(value)
        .and_then(|tree| serde_json::to_string_pretty(&tree))
        .map_err(|error| error.to_string())
}
