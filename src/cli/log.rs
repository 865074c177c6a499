//! `perch log`: the command around the reader ([`crate::log::transcript`]) and the renderings
//! (`perch_core::transcript`): which directory and selection the arguments name, the pager,
//! `--follow` and `--lanes`.

use super::emit;
use crate::agent::AgentDir;
use crate::host::signals::StopSignals;
use perch_core::name::LaneName;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// Show what the agent did and why, turn by turn
///
/// Each turn (a chat message or a heartbeat firing, and everything the run it started did up to its delivery) with its time, channel, room,
/// sender and text, the model's replies (reasoning folded), each tool call with its
/// arguments, exit code, duration and the head of its output, each delivery's state, and
/// tokens and cost per turn and per lane. Read-only: takes no lock and repairs nothing; a
/// damaged line is shown with its file and line. Paged through $PAGER (default `less -FRX`)
/// when standard output is a terminal.
#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// The agent directory, and/or CHANNEL[:ROOM] to show only turns from that channel
    /// (and room: its alias, or the platform's room id), as in `telegram:team`
    /// [default directory: the current directory]
    #[arg(value_name = "DIR|CHANNEL[:ROOM]", num_args = 0..=2)]
    pub targets: Vec<String>,
    /// Only this lane
    #[arg(long, value_name = "NAME")]
    pub lane: Option<String>,
    /// Only turns from CHANNEL[:ROOM]
    #[arg(long, value_name = "CHANNEL[:ROOM]")]
    pub channel: Option<String>,
    /// Only turns with a message from this sender (platform id, or display name in any case)
    #[arg(long, value_name = "ID|NAME")]
    pub sender: Option<String>,
    /// Only firings of this heartbeat task
    #[arg(long, value_name = "NAME")]
    pub task: Option<String>,
    /// Only turns that began at or after WHEN: a duration before now (30m, 2h, 3d, 1w) or
    /// a time (2026-12-02T09:00:00Z; 2026-12-02 for midnight UTC)
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Only turns that began before WHEN (as --since)
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
    /// How many of the last selected turns to show
    #[arg(short = 'n', long = "last", value_name = "N", default_value_t = 20)]
    pub last: usize,
    /// List the lanes instead: last activity, size on disk, lines and spend
    #[arg(long)]
    pub lanes: bool,
    /// List the refused messages instead (not answered: a room or sender not allowed, a
    /// direct message refused, a pairing not approved, too old, the loop guard), as far back
    /// as the inbox keeps them (a day): time, channel, room id, sender id and name, the reason
    /// and the fix; never the message's text. Takes CHANNEL[:ROOM], --sender, --since,
    /// --until, -n and --json
    #[arg(long, conflicts_with_all = ["lane", "task", "lanes", "follow"])]
    pub refused: bool,
    /// Print one JSON object per event (src/core/transcript/perch-log.schema.json), one a line
    #[arg(long)]
    pub json: bool,
    /// After the last turns, keep printing new events as `perch run` writes them, until
    /// Ctrl-C or SIGTERM
    #[arg(short, long)]
    pub follow: bool,
}

/// Runs `perch log`: prints the selected turns, the lanes, or follows them.
/// `dir` is the directory `-C` names; every positional argument is then a CHANNEL[:ROOM].
pub fn run(args: LogArgs, dir: Option<PathBuf>) -> Result<ExitCode, String> {
    use perch_core::transcript::{Place, Selection, parse_when};
    let mut dir = dir;
    let mut place = args.channel.clone();
    for target in &args.targets {
        if dir.is_none() && (Path::new(target).is_dir() || place.is_some()) {
            dir = Some(PathBuf::from(target));
        } else if place.is_none() {
            place = Some(target.clone());
        } else {
            return Err(format!(
                "{target:?} is neither a directory nor the only CHANNEL[:ROOM]; give one \
                 directory and at most one CHANNEL[:ROOM]"
            ));
        }
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from("."));
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let sessions = agent_dir.sessions_dir();
    if args.lanes {
        return list_lanes(&sessions, args.json);
    }
    let now = chrono::Utc::now();
    let when = |text: &Option<String>, flag: &str| {
        text.as_deref()
            .map(|text| parse_when(text, now).map_err(|error| format!("{flag}: {error}")))
            .transpose()
    };
    let lane = args
        .lane
        .as_deref()
        .map(|name| {
            LaneName::try_from(name).map_err(|error| {
                format!("--lane {name:?}: {error}; `perch log --lanes` lists the lanes")
            })
        })
        .transpose()?;
    let context = log_context(&agent_dir);
    if let Some(task) = &args.task {
        unknown_task(task, &context, &sessions)?;
    }
    let rooms = &context.rooms;
    let mut place = place.as_deref().map(Place::parse).transpose()?;
    if args.refused {
        if let Some(place) = &mut place
            && let Some((_, _, id)) = rooms.iter().find(|(channel, alias, _)| {
                channel == &place.channel && place.room.as_ref() == Some(alias)
            })
        {
            place.room = Some(id.clone());
        }
        let selection = Selection {
            place,
            sender: args.sender.clone(),
            task: None,
            since: when(&args.since, "--since")?,
            until: when(&args.until, "--until")?,
        };
        return list_refused(&agent_dir, &selection, args.last, &context, args.json);
    }
    if let Some(place) = &mut place
        && let Some((_, alias, _)) = rooms
            .iter()
            .find(|(channel, _, id)| channel == &place.channel && place.room.as_ref() == Some(id))
    {
        place.room = Some(alias.clone());
    }
    let selection = Selection {
        place,
        sender: args.sender.clone(),
        task: args.task.clone(),
        since: when(&args.since, "--since")?,
        until: when(&args.until, "--until")?,
    };
    let ends = if args.follow {
        crate::log::follow::ends(&sessions).map_err(|error| error.to_string())?
    } else {
        std::collections::BTreeMap::new()
    };
    let unknown = unknown_channel(selection.place.as_ref(), &context);
    let query = crate::log::transcript::Query {
        lane,
        selection,
        last: args.last,
        redaction: context.redaction,
        ends,
    };
    let turns = crate::log::transcript::last_turns(&sessions, &query)?;
    if let Some(unknown) = unknown
        && turns.is_empty()
        && !channel_in_log(&sessions, &query)?
    {
        return Err(unknown);
    }
    let text = if args.json {
        let mut out = String::new();
        for event in turns.iter().flat_map(|turn| &turn.events) {
            out.push_str(&perch_core::transcript::json_line(event));
            out.push('\n');
        }
        out
    } else {
        transcript_text(&turns)
    };
    if args.follow {
        follow_log(&sessions, &query, &text, args.json)?;
    } else {
        page(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The turns as text, then each lane's totals over them.
fn transcript_text(turns: &[perch_core::transcript::Turn]) -> String {
    use perch_core::transcript::{Totals, money, render_turn};
    let mut out = String::new();
    let mut totals: std::collections::BTreeMap<&LaneName, Totals> =
        std::collections::BTreeMap::new();
    for turn in turns {
        render_turn(turn, &mut out);
        if turn.start.is_some() {
            totals.entry(&turn.lane).or_default().add(&turn.facts);
        }
    }
    for (lane, total) in totals {
        out.push_str(&format!(
            "lane {lane}: {} turn{} shown, {} tokens in, {} out{}\n",
            total.turns,
            if total.turns == 1 { "" } else { "s" },
            total.input_tokens,
            total.output_tokens,
            if total.priced {
                format!(", cost {}", money(total.cost_micros))
            } else {
                String::new()
            }
        ));
    }
    if turns.is_empty() {
        out.push_str("no turns to show\n");
    }
    out
}

/// What `perch log` needs of the agent's files.
struct LogContext {
    /// The values of the agent's secrets in this environment (sandbox secrets, provider keys,
    /// channel credentials), to be cut out of everything shown. When the agent's files do not
    /// check, every variable whose name says it holds a credential counts as a secret.
    redaction: perch_core::transcript::Redaction,
    /// Each channel's declared rooms, as (channel, alias, platform id).
    rooms: Vec<(String, String, String)>,
    /// Each channel's file, relative to the agent directory.
    files: std::collections::BTreeMap<String, String>,
    /// The channels the agent declares: as loaded, or, when its files do not check, the stems
    /// of `channels/*.lua`.
    channels: Vec<String>,
    /// The tasks `workspace/HEARTBEAT.yml` holds, when it checks.
    tasks: Vec<String>,
}

/// Pseudo-channels `perch log CHANNEL` also takes: heartbeat runs, and `perch chat`.
const LOG_PLACES: [&str; 2] = ["heartbeat", "terminal"];

/// `names` for an error message: comma-separated, or `none`.
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// An error for a `CHANNEL[:ROOM]` that selected nothing and names no channel the agent
/// declares (a channel removed since still shows its old turns).
fn unknown_channel(
    place: Option<&perch_core::transcript::Place>,
    context: &LogContext,
) -> Option<String> {
    let place = place?;
    let known =
        context.channels.contains(&place.channel) || LOG_PLACES.contains(&place.channel.as_str());
    (!known).then(|| {
        format!(
            "no channel {:?} here and nothing from it in the log; the agent's channels: {} \
             (each is a file in channels/)",
            place.channel,
            listed(&context.channels)
        )
    })
}

/// Whether any turn in the log comes from the channel `query` selects (whatever its room, sender,
/// task or time): a channel no file declares any more still shows its old turns.
fn channel_in_log(sessions: &Path, query: &crate::log::transcript::Query) -> Result<bool, String> {
    let Some(place) = &query.selection.place else {
        return Ok(true);
    };
    let anything_from_it = crate::log::transcript::Query {
        lane: None,
        selection: perch_core::transcript::Selection {
            place: Some(perch_core::transcript::Place {
                channel: place.channel.clone(),
                room: None,
            }),
            ..perch_core::transcript::Selection::default()
        },
        last: 1,
        redaction: perch_core::transcript::Redaction::new(std::iter::empty::<String>()),
        ends: std::collections::BTreeMap::new(),
    };
    Ok(!crate::log::transcript::last_turns(sessions, &anything_from_it)?.is_empty())
}

/// An error for `--task` naming a task that is neither in `workspace/HEARTBEAT.yml` nor has
/// a lane in the log.
fn unknown_task(task: &str, context: &LogContext, sessions: &Path) -> Result<(), String> {
    let mut known: std::collections::BTreeSet<String> = context.tasks.iter().cloned().collect();
    for lane in crate::log::transcript::lane_names(sessions)? {
        if let perch_core::name::LaneKind::Heartbeat(name)
        | perch_core::name::LaneKind::DryRun(name) = lane.kind()
        {
            known.insert(name.to_string());
        }
    }
    if known.contains(task) {
        return Ok(());
    }
    let known: Vec<String> = known.into_iter().collect();
    Err(format!(
        "no heartbeat task {task:?} in workspace/HEARTBEAT.yml or in the log; the tasks: {} \
         (`perch heartbeat list` shows them)",
        listed(&known)
    ))
}

fn log_context(agent_dir: &AgentDir) -> LogContext {
    let mut rooms = Vec::new();
    let mut files = std::collections::BTreeMap::new();
    let channels: Vec<String>;
    let mut tasks = Vec::new();
    let names: Vec<String> = match crate::agent::load(agent_dir) {
        Ok(loaded) => {
            channels = loaded
                .channels
                .iter()
                .map(|channel| channel.config.name.to_string())
                .collect();
            let env = crate::heartbeat::heartbeat_env(&loaded, crate::heartbeat::host_tz());
            if let Ok(file) = crate::heartbeat::read_file(agent_dir, &env) {
                tasks = file
                    .tasks
                    .iter()
                    .map(|task| task.name.to_string())
                    .collect();
            }
            for channel in &loaded.channels {
                files.insert(channel.config.name.to_string(), channel.file.clone());
                for (alias, id) in &channel.config.rooms {
                    rooms.push((
                        channel.config.name.to_string(),
                        alias.to_string(),
                        id.clone(),
                    ));
                }
            }
            let definition = &loaded.definition;
            definition
                .sandbox
                .secrets
                .iter()
                .map(|grant| grant.source.name().as_str().to_owned())
                .chain(
                    definition
                        .models
                        .providers
                        .iter()
                        .filter_map(|(_, provider)| provider.api_key.as_ref())
                        .map(|key| key.name().as_str().to_owned()),
                )
                .chain(loaded.channels.iter().flat_map(|channel| {
                    channel
                        .config
                        .platform
                        .credentials()
                        .into_iter()
                        .map(|(_, reference)| reference.name().as_str().to_owned())
                        .collect::<Vec<_>>()
                }))
                .collect()
        }
        Err(_) => {
            channels = declared_channel_files(agent_dir);
            std::env::vars()
                .map(|(name, _)| name)
                .filter(|name| {
                    let upper = name.to_ascii_uppercase();
                    ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSPHRASE"]
                        .iter()
                        .any(|word| upper.contains(word))
                })
                .collect()
        }
    };
    let redaction = perch_core::transcript::Redaction::new(
        names.iter().filter_map(|name| std::env::var(name).ok()),
    );
    LogContext {
        redaction,
        rooms,
        files,
        channels,
        tasks,
    }
}

/// The stems of `channels/*.lua`, sorted: the channels an agent whose files do not check
/// declares.
fn declared_channel_files(agent_dir: &AgentDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agent_dir.root().join("channels"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            name.strip_suffix(".lua").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// `perch log --refused`: the last `last` refused messages `selection` selects, from the
/// inbox, oldest first.
fn list_refused(
    agent_dir: &AgentDir,
    selection: &perch_core::transcript::Selection,
    last: usize,
    context: &LogContext,
    json: bool,
) -> Result<ExitCode, String> {
    let files = &context.files;
    let inbox =
        crate::log::peek_journal(&agent_dir.inbox_dir()).map_err(|error| error.to_string())?;
    let mut refused = crate::store::inbox::refused(&inbox);
    if let Some(unknown) = unknown_channel(selection.place.as_ref(), context)
        && !refused.iter().any(|one| {
            selection
                .place
                .as_ref()
                .is_some_and(|place| one.channel == place.channel)
        })
    {
        return Err(unknown);
    }
    refused.retain(|one| perch_core::refusals::selects(selection, one));
    let shown = &refused[refused.len().saturating_sub(last)..];
    let mut out = String::new();
    for one in shown {
        let file = super::status::channel_file(files, &one.channel);
        if json {
            let line =
                serde_json::to_string(&one.line(&file)).map_err(|error| error.to_string())?;
            out.push_str(&perch_core::terminal::json_escaped(&line));
            out.push('\n');
        } else {
            out.push_str(&one.text(&file));
        }
    }
    if !json {
        if refused.is_empty() {
            out.push_str("no refused messages in the inbox (it keeps a day)\n");
        } else if shown.len() < refused.len() {
            out.push_str(&format!(
                "the last {} of {} refused messages; -n {} shows them all\n",
                shown.len(),
                refused.len(),
                refused.len()
            ));
        }
        for line in &inbox.unreadable {
            out.push_str(&format!(
                "inbox corrupt: {}\n",
                perch_core::terminal::shown(&line.to_string())
            ));
        }
    }
    page(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `text` through `$PAGER` (default `less -FRX`) when standard output is a terminal.
fn page(text: &str) -> Result<(), String> {
    if !std::io::stdout().is_terminal() {
        return emit(text);
    }
    let pager = std::env::var("PAGER")
        .ok()
        .filter(|pager| !pager.trim().is_empty())
        .unwrap_or_else(|| "less -FRX".to_owned());
    let mut words = pager.split_whitespace();
    let Some(program) = words.next() else {
        return emit(text);
    };
    match std::process::Command::new(program)
        .args(words)
        .stdin(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(text.as_bytes());
            }
            child
                .wait()
                .map_err(|error| format!("the pager {program} failed: {error}"))?;
            Ok(())
        }
        Err(_) => emit(text),
    }
}

/// Prints `tail`, then streams every line appended from the ends `query` was read to, rendered
/// as the tail was, until SIGINT or SIGTERM (listened for before the tail is printed).
fn follow_log(
    sessions: &Path,
    query: &crate::log::transcript::Query,
    tail: &str,
    json: bool,
) -> Result<(), String> {
    use perch_core::transcript::{Assembler, EventKind, footing, heading, render_event};
    let mut assemblers: std::collections::BTreeMap<LaneName, Assembler> =
        std::collections::BTreeMap::new();
    for (lane, end) in &query.ends {
        let mut assembler = Assembler::new(lane.clone(), query.redaction.clone());
        if let Ok(read) = crate::log::transcript::read_lane(sessions, lane, Some(2), Some(end)) {
            for (position, line) in &read.lines {
                assembler.push(position.clone(), line);
            }
        }
        assemblers.insert(lane.clone(), assembler);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))?;
    runtime.block_on(async {
        let mut signals = StopSignals::listen()?;
        emit(tail)?;
        let stop = CancellationToken::new();
        let (sender, mut lines) = tokio::sync::mpsc::channel(1024);
        let following = tokio::spawn({
            let sessions = sessions.to_owned();
            let from = query.ends.clone();
            let stop = stop.clone();
            async move { crate::log::follow::follow(&sessions, from, sender, stop).await }
        });
        loop {
            tokio::select! {
                () = signals.next() => break,
                received = lines.recv() => {
                    let Some((position, line)) = received else { break };
                    if query.lane.as_ref().is_some_and(|lane| lane != &position.lane) {
                        continue;
                    }
                    let lane = position.lane.clone();
                    let assembler = assemblers.entry(lane.clone()).or_insert_with(|| {
                        Assembler::new(lane, query.redaction.clone())
                    });
                    let event = assembler.push(position, &line);
                    let Some(turn) = assembler
                        .turns()
                        .iter()
                        .rev()
                        .find(|turn| turn.start == event.turn)
                    else {
                        continue;
                    };
                    if !query.selection.selects(turn) {
                        continue;
                    }
                    let mut out = String::new();
                    if json {
                        out.push_str(&perch_core::transcript::json_line(&event));
                        out.push('\n');
                    } else {
                        if event.turn.as_ref() == Some(&event.position) {
                            out.push_str(&heading(turn));
                            out.push('\n');
                        }
                        for line in render_event(&event) {
                            out.push_str(&line);
                            out.push('\n');
                        }
                        if let EventKind::OperationFinished { .. } = event.kind
                            && let Some(line) = footing(&turn.facts)
                        {
                            out.push_str(&line);
                            out.push('\n');
                        }
                    }
                    emit(&out)?;
                }
            }
        }
        stop.cancel();
        match following.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) => Err(format!("following the lanes stopped: {error}")),
        }
    })
}

/// `perch log --lanes`: each lane's last activity, size, lines and spend.
fn list_lanes(sessions: &Path, json: bool) -> Result<ExitCode, String> {
    use perch_core::transcript::money;
    let stats = crate::log::transcript::lane_stats(sessions)?;
    let mut out = String::new();
    if json {
        for lane in &stats {
            let line = serde_json::to_string(lane).map_err(|error| error.to_string())?;
            out.push_str(&perch_core::terminal::json_escaped(&line));
            out.push('\n');
        }
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if stats.is_empty() {
        emit(&format!("no lanes in {}\n", sessions.display()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = stats
        .iter()
        .map(|lane| lane.lane.as_str().len())
        .max()
        .unwrap_or(0)
        .max(24);
    out.push_str(&format!(
        "{:<width$} {:<24} {:>10} {:>8} {:>12} {:>10} {:>10}\n",
        "LANE", "LAST ACTIVITY", "SIZE", "LINES", "TOKENS IN", "OUT", "COST"
    ));
    for lane in &stats {
        out.push_str(&format!(
            "{:<width$} {:<24} {:>10} {:>8} {:>12} {:>10} {:>10}{}\n",
            lane.lane.as_str(),
            lane.last_activity.map_or_else(
                || "-".to_owned(),
                |at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
            ),
            size(lane.bytes),
            lane.lines,
            lane.input_tokens,
            lane.output_tokens,
            money(lane.cost_micros),
            if lane.damaged > 0 {
                format!(
                    "  ({} damaged line(s): perch log --lane {} shows them)",
                    lane.damaged, lane.lane
                )
            } else {
                String::new()
            }
        ));
    }
    page(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn size(bytes: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "a size for people to read")]
    let bytes_f = bytes as f64;
    if bytes < 1 << 10 {
        format!("{bytes} B")
    } else if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes_f / 1024.0)
    } else {
        format!("{:.1} MiB", bytes_f / (1024.0 * 1024.0))
    }
}
