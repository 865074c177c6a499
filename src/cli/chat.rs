//! `perch chat`: the terminal as a channel. Each line typed is one message through the lane,
//! exactly as a chat message would go; the reply streams back as it is written. And
//! `perch compact`, which summarises a lane from the terminal.

use super::{dir_or_current, emit, load_agent, runtime};
use crate::agent::LoadedAgent;
use crate::host::clock::system_clock;
use crate::lane::{Finished, Input, Lane, LaneEvent, RunLimits, Runtime};
use crate::model::{self, StreamEvent};
use crate::sandbox::MachineSetup;
use perch_core::log::{Outcome, Trigger};
use perch_core::name::LaneName;
use perch_core::prompt::Origin;
use perch_core::terminal::{escaped, escaped_lines};
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::sync::mpsc;

/// Talk to the agent from the terminal
///
/// Each line is one message, through the same durable
/// lane a chat message takes; the reply streams back. The conversation (lane `terminal`)
/// persists in .perch/ and continues on the next start. Ctrl-C aborts the reply in progress.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
}

/// Summarise a lane's conversation into one entry
///
/// The next run starts from it. The history stays in the log.
#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
    /// The lane to compact
    #[arg(long, default_value = "terminal")]
    pub lane: String,
}

/// The agent's runtime and its terminal lane, opened and recovered.
async fn open_terminal(agent: LoadedAgent, lane: &str) -> Result<(Runtime, Lane), String> {
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
        eprintln!("warning: {}", escaped_lines(&problem.to_string()));
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

pub fn run(args: ChatArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
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
        let mut screen = Screen {
            out: io::stdout(),
            notes: io::stderr(),
        };
        let result = chat(
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

pub fn compact(args: CompactArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
    let lane_name = args.lane.as_str();
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
                emit(&format!(
                    "compacted lane {lane_name}:\n{}\n",
                    escaped_lines(&finished.text)
                ))?;
                Ok(ExitCode::SUCCESS)
            }
            other => Err(format!("compaction did not complete: {other:?}")),
        }
    })
}

/// Where the conversation is shown: the reply on `out`, tool activity and problems on `notes`.
#[derive(Debug)]
pub struct Screen<O, N> {
    pub out: O,
    pub notes: N,
}

/// Reads lines from `input` until end of file, running each through `lane`. A line of
/// whitespace is skipped. Returns how many runs did not complete.
pub async fn chat<O, N>(
    lane: &Lane,
    input: impl AsyncBufRead + Unpin,
    screen: &mut Screen<O, N>,
    prompt: Option<&str>,
) -> Result<usize, String>
where
    O: Write + Send,
    N: Write + Send,
{
    let mut lines = input.lines();
    let mut unfinished = 0;
    loop {
        if let Some(prompt) = prompt {
            let _ = write!(screen.out, "{prompt}");
            let _ = screen.out.flush();
        }
        let Some(line) = lines
            .next_line()
            .await
            .map_err(|error| format!("cannot read the terminal: {error}"))?
        else {
            return Ok(unfinished);
        };
        if line.trim().is_empty() {
            continue;
        }
        let finished = turn(lane, line, screen).await?;
        if finished.outcome != Outcome::Completed {
            unfinished += 1;
        }
    }
}

async fn turn<O: Write, N: Write>(
    lane: &Lane,
    text: String,
    screen: &mut Screen<O, N>,
) -> Result<Finished, String> {
    let (events, mut shown) = mpsc::unbounded_channel();
    let input = Input {
        text,
        consumes: Vec::new(),
        fresh: false,
        said: Vec::new(),
        trigger: Trigger::Terminal,
    };
    let run = lane.send(input, Some(events));
    tokio::pin!(run);
    let mut wrote_text = false;
    let finished = loop {
        tokio::select! {
            event = shown.recv() => {
                if let Some(event) = event {
                    wrote_text |= show(&event, screen);
                }
            }
            finished = &mut run => break finished.map_err(|error| error.to_string())?,
        }
    };
    while let Ok(event) = shown.try_recv() {
        wrote_text |= show(&event, screen);
    }
    if wrote_text {
        let _ = writeln!(screen.out);
    }
    match &finished.outcome {
        Outcome::Completed => {}
        Outcome::Cancelled => {
            let _ = writeln!(screen.notes, "(aborted)");
        }
        Outcome::Failed { reason } | Outcome::Interrupted { reason } => {
            let _ = writeln!(screen.notes, "error: {}", escaped_lines(reason));
        }
    }
    let _ = screen.out.flush();
    Ok(finished)
}

/// Shows one event; true when it wrote reply text. What the model wrote (its text, the tools it
/// names and their arguments) is shown with control and bidi characters escaped and its lines
/// kept, so a reply cannot act on the terminal.
fn show<O: Write, N: Write>(event: &LaneEvent, screen: &mut Screen<O, N>) -> bool {
    match event {
        LaneEvent::Model(StreamEvent::Text(text)) => {
            let _ = write!(screen.out, "{}", escaped_lines(text));
            let _ = screen.out.flush();
            return true;
        }
        LaneEvent::Model(StreamEvent::Reasoning(_) | StreamEvent::ToolCall { .. }) => {}
        LaneEvent::ToolStarted { name, arguments } => {
            let _ = writeln!(
                screen.notes,
                "[{} {}]",
                escaped(name),
                escaped(&arguments.to_string())
            );
        }
        LaneEvent::ToolFinished { name, is_error } => {
            if *is_error {
                let _ = writeln!(screen.notes, "[{} failed]", escaped(name));
            }
        }
        LaneEvent::Retrying {
            attempt,
            error,
            after,
        } => {
            let _ = writeln!(
                screen.notes,
                "[attempt {attempt} failed: {}; retrying in {:.1} s]",
                escaped(error),
                after.as_secs_f64()
            );
        }
        LaneEvent::Steered => {}
        LaneEvent::Compacted => {
            let _ = writeln!(screen.notes, "[the conversation was compacted]");
        }
    }
    false
}
