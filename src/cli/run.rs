//! `perch run`: the agent as a service, until SIGINT or SIGTERM.

use super::{dir_or_current, load_agent, runtime};
use crate::agent::{self, AgentDir, LoadedAgent};
use crate::heartbeat;
use crate::host::clock::system_clock;
use crate::host::logging::LogFormat;
use crate::host::narrate;
use crate::host::notify::Notifier;
use crate::host::signals::StopSignals;
use crate::lane::RunLimits;
use crate::model;
use crate::sandbox::MachineSetup;
use crate::service::{HeartbeatOnce, ServiceSetup};
use perch_core::narration::Verbosity;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// Run the agent as a service, until SIGINT or SIGTERM
///
/// Recovers, connects every channel in channels/, and answers. Holds the agent directory's lock while it runs.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
    /// How log lines on stderr are written
    #[arg(long, value_enum, value_name = "FORMAT", default_value = "human")]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics at http://ADDR/metrics (off without this flag; `--metrics`
    /// alone listens on 127.0.0.1:9464). They are not authenticated: an address other than
    /// loopback is warned about
    #[arg(
        long,
        value_name = "ADDR",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = crate::host::metrics::DEFAULT_ADDR
    )]
    pub metrics: Option<std::net::SocketAddr>,
    /// Narrate only warnings and errors
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Narrate everything, also each message taken in and each reply delivered
    #[arg(short, long)]
    pub verbose: bool,
}

/// The service as a command line runs it, on this machine, the agent's model at `endpoint`
/// and its channels' connectors, with the settings a deployment does not change.
pub(super) fn service_setup(
    agent: &LoadedAgent,
    endpoint: model::Endpoint,
    notifier: Notifier,
    metrics_listener: Option<tokio::net::TcpListener>,
    once: Option<HeartbeatOnce>,
) -> ServiceSetup {
    let agent_dir = agent.dir.clone();
    ServiceSetup {
        machine: MachineSetup::from_environment(),
        model: model::connect(endpoint),
        connectors: std::sync::Arc::new(move |channel: &crate::agent::LoadedChannel| {
            crate::channel::connect(channel, &agent_dir, |name| std::env::var(name).ok())
        }),
        clock: system_clock(),
        limits: RunLimits::default(),
        lanes: crate::service::LaneLimits::default(),
        reconnect: std::time::Duration::from_secs(1),
        heartbeat_reload: heartbeat::RELOAD_EVERY,
        notifier,
        drain: std::time::Duration::from_secs(30),
        metrics: std::sync::Arc::new(crate::host::metrics::Metrics::default()),
        metrics_listener,
        once,
    }
}

/// The target of `perch run`'s own log lines: the binary's name, as for every line `main`
/// writes.
const RUN_TARGET: &str = "perch";

/// `perch run`. It narrates what it does on stderr (see [`narrate`]), besides the log lines;
/// with `--log-format json` it does not narrate, and its failures are log lines too, so that
/// everything it writes on stderr is JSON.
pub fn run(args: RunArgs) -> Result<ExitCode, String> {
    let RunArgs {
        dir,
        log_format,
        metrics,
        quiet,
        verbose,
    } = args;
    let dir = dir_or_current(dir);
    if log_format == LogFormat::Human {
        let verbosity = match (quiet, verbose) {
            (true, _) => Verbosity::Quiet,
            (false, true) => Verbosity::Verbose,
            (false, false) => Verbosity::Normal,
        };
        narrate::start(narrate::Output::detect(), verbosity);
    }
    match (serve(dir, log_format, metrics), log_format) {
        (Err(message), LogFormat::Json) => {
            tracing::error!(target: RUN_TARGET, "{message}");
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
                    tracing::error!(target: RUN_TARGET, "{problem}");
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
            tracing::warn!(target: RUN_TARGET, "not notifying systemd: {error}");
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
        let setup = service_setup(&agent, endpoint, notifier, metrics_listener, None);
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        let mut signals = StopSignals::listen()?;
        tokio::spawn(async move {
            signals.next().await;
            tracing::info!(
                target: RUN_TARGET,
                "stopping: finishing the runs in progress (a second signal exits now)"
            );
            on_signal.cancel();
            signals.next().await;
            tracing::warn!(
                target: RUN_TARGET,
                "second signal: exiting now; the next start recovers what was open"
            );
            std::process::exit(130);
        });
        tracing::info!(target: RUN_TARGET, "running {}", dir.display());
        if let Some(listener) = &setup.metrics_listener {
            let address = listener.local_addr().map_err(|error| error.to_string())?;
            tracing::info!(target: RUN_TARGET, %address, "metrics on http://{address}/metrics");
            if !address.ip().is_loopback() {
                tracing::warn!(
                    target: RUN_TARGET,
                    %address,
                    "the metrics listen on {address}, which is not a loopback address: anyone \
                     who can reach it can read them"
                );
            }
        }
        crate::service::run(agent, setup, shutdown).await?;
        tracing::info!(target: RUN_TARGET, "stopped");
        Ok(ExitCode::SUCCESS)
    })
}
