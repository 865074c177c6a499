//! `perch status`: what a running (or stopped) service holds, read from its control socket and
//! from `.perch/`.

use super::heartbeat::heartbeat_listing;
use super::human;
use super::{STATUS_TIMEOUT, dir_or_current, emit, emit_escaped, printed, runtime};
use crate::agent::{self, AgentDir};
use crate::store::control::{self, ControlRequest};
use crate::store::inbox::InboxRecord;
use crate::store::outbox::OutboxRecord;
use crate::store::pairing::{PAIRING_UNREADABLE_FIX, read_pairing};
use perch_core::Timestamp;
use perch_core::control::{
    Heartbeats, LastEvent, LiveStatus, PendingPairing, SpendStatus, StatusReport, UnknownDelivery,
};
use perch_core::terminal::shown;
use std::path::PathBuf;
use std::process::ExitCode;

/// Show whether the agent runs, and what its service holds
///
/// The state (running, with its pid and uptime, or stopped), each channel's state, inbox items
/// waiting, deliveries waiting or of unknown fate, pending pairings, the newest refusals (with
/// room and sender ids and the fix). Read-only: takes no lock. Exits 3 when perch is not
/// running and 4 when its state is unknown (its control socket does not answer), as
/// `systemctl status` does; --json prints the report all the same.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatusArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
    let json = args.json;
    let agent_dir = AgentDir::open(&dir).map_err(|error| error.to_string())?;
    let live = runtime()?.block_on(control::ask_within::<LiveStatus>(
        &agent_dir,
        &ControlRequest::Status,
        STATUS_TIMEOUT,
    ));
    let (inbox, inbox_closed) = peek(&agent_dir.inbox_dir());
    let (outbox, outbox_closed) = peek(&agent_dir.outbox_dir());
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
    let (pairing, pairing_error) = match read_pairing(&agent_dir.pairing_file()) {
        Ok(pairing) => (pairing, None),
        Err(error) => (perch_core::pairing::Pairing::default(), Some(error)),
    };
    let mut undecryptable = std::collections::BTreeMap::new();
    let mut channel_files = std::collections::BTreeMap::new();
    let channels: Vec<String> = match agent::load(&agent_dir) {
        Ok(loaded) => loaded
            .channels
            .iter()
            .map(|channel| {
                channel_files.insert(channel.config.name.to_string(), channel.file.clone());
                if channel.config.kind() == perch_core::config::ChannelKind::Matrix {
                    let name = channel.config.name.to_string();
                    let report = crate::channel::matrix::read_undecryptable(
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
    let now = chrono::Utc::now();
    let state = match (&live, &live_error) {
        (Some(_), _) => "running",
        (None, Some(_)) => "unknown",
        (None, None) => "stopped",
    };
    let started = live.as_ref().and_then(|live| live.started);
    let report = StatusReport {
        running: live.is_some(),
        state: state.to_owned(),
        pid: live.as_ref().and_then(|live| live.pid),
        started,
        uptime_seconds: started
            .map(|started| u64::try_from((now - started).num_seconds()).unwrap_or(0)),
        live_error,
        channels,
        channel_health: live.as_ref().map(|live| live.channels.clone()),
        undecryptable,
        inbox_pending: inbox.pending.len(),
        inbox_unreadable: inbox_closed
            .iter()
            .cloned()
            .chain(inbox.unreadable.iter().map(ToString::to_string))
            .collect(),
        outbox_unreadable: outbox_closed
            .iter()
            .cloned()
            .chain(outbox.unreadable.iter().map(ToString::to_string))
            .collect(),
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
            .map(|error| format!("cannot read {error}; {PAIRING_UNREADABLE_FIX}")),
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
        lanes_with_open_operations: crate::store::starts::open_operations(
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
        last_start: crate::store::starts::read_last_start(&agent_dir),
        spend_today: match crate::store::spend::peek_today(&agent_dir, chrono::Utc::now()) {
            Ok(today) => SpendStatus::Known(today),
            Err(error) => SpendStatus::Unknown { error },
        },
        refusals: perch_core::refusals::recent(&crate::store::inbox::refused(&inbox), |channel| {
            channel_file(&channel_files, channel)
        }),
    };
    if json {
        emit(&format!("{}\n", printed(&report)?))?;
    } else {
        let channel_names: Vec<&str> = channel_files.keys().map(String::as_str).collect();
        emit_escaped(&status_text(
            &report,
            &channel_names,
            (&pairing, pairing_error.as_deref()),
            [inbox_closed.as_deref(), outbox_closed.as_deref()],
            now,
        ))?;
    }
    Ok(ExitCode::from(match report.state.as_str() {
        "running" => 0,
        "stopped" => NOT_RUNNING,
        _ => STATE_UNKNOWN,
    }))
}

/// A journal's contents, or nothing and why it could not be read: an operator who reaches the
/// control socket through the operators' group may not read the agent's journals, and still
/// sees what the service says.
fn peek(dir: &std::path::Path) -> (crate::log::JournalContents, Option<String>) {
    match crate::log::peek_journal(dir) {
        Ok(contents) => (contents, None),
        Err(error) => (
            crate::log::JournalContents::default(),
            Some(error.to_string()),
        ),
    }
}

/// `perch status`'s exit status when perch is not running, as `systemctl status` (LSB) has it.
pub const NOT_RUNNING: u8 = 3;

/// `perch status`'s exit status when the control socket takes the request and gives no answer.
pub const STATE_UNKNOWN: u8 = 4;

/// The file that declares `channel`, relative to the agent directory: as loaded, or where
/// `perch channel add` puts it when the agent's files do not load.
pub(super) fn channel_file(
    files: &std::collections::BTreeMap<String, String>,
    channel: &str,
) -> String {
    files
        .get(channel)
        .cloned()
        .unwrap_or_else(|| format!("channels/{channel}.lua"))
}

/// `perch status` as text, as `systemctl status` reads: the state first, each channel's state,
/// then what waits, and human times throughout; every name a guest or chat user chose escaped.
fn status_text(
    report: &StatusReport,
    channel_names: &[&str],
    (pairing, pairing_error): (&perch_core::pairing::Pairing, Option<&str>),
    closed: [Option<&str>; 2],
    now: Timestamp,
) -> String {
    let inbox_unreadable = !report.inbox_unreadable.is_empty();
    let outbox_unreadable = !report.outbox_unreadable.is_empty();
    let at_least = |unreadable: bool| if unreadable { "at least " } else { "" };
    let mut out = String::new();
    let mut line = |label: &str, value: &str| out.push_str(&format!("{label:<18} {value}\n"));
    line(
        "state",
        &match (&report.live_error, report.running) {
            (_, true) => match report.started {
                Some(started) => format!(
                    "running since {}, up {}",
                    human::local_time(started),
                    human::span(report.uptime_seconds.unwrap_or(0))
                ),
                None => "running".to_owned(),
            },
            (Some(error), false) => {
                format!("unknown: {}; the rest is read from .perch/", shown(error))
            }
            (None, false) => "stopped (no perch run answers on .perch/control.sock)".to_owned(),
        },
    );
    if let Some(pid) = report.pid {
        line("pid", &pid.to_string());
    }
    line(
        "channels",
        &if report.channels.is_empty() {
            "(none)".to_owned()
        } else {
            report.channels.join(", ")
        },
    );
    let mut names: std::collections::BTreeSet<&str> = channel_names.iter().copied().collect();
    names.extend(report.last_events.keys().map(String::as_str));
    names.extend(
        report
            .channel_health
            .iter()
            .flatten()
            .map(|channel| channel.name.as_str()),
    );
    for name in names {
        let health = report
            .channel_health
            .iter()
            .flatten()
            .find(|channel| channel.name == name);
        let state = match health {
            Some(channel) if channel.healthy => shown(&channel.connection),
            Some(channel) => format!(
                "{}; UNHEALTHY: {}",
                shown(&channel.connection),
                shown(
                    channel
                        .last_hook_error
                        .as_deref()
                        .unwrap_or("not receiving")
                )
            ),
            None if !channel_names.contains(&name) => "not loaded".to_owned(),
            None if report.running => "not connected: restart perch run to load it".to_owned(),
            None => "stopped".to_owned(),
        };
        let last_event = report
            .last_events
            .get(name)
            .map(|event| format!("; last event {}", human::when_text(&event.at, now)))
            .unwrap_or_default();
        line(
            &format!("  {}", shown(name)),
            &format!("{state}{last_event}"),
        );
    }
    for (channel, count) in &report.undecryptable {
        line(
            "undecryptable",
            &format!("{count} event(s) in Matrix channel {}", shown(channel)),
        );
    }
    line(
        "inbox pending",
        &format!(
            "{}{}{}",
            at_least(inbox_unreadable),
            report.inbox_pending,
            report
                .inbox_oldest_waiting
                .as_deref()
                .map(|at| format!(", the oldest since {}", human::when_text(at, now)))
                .unwrap_or_default()
        ),
    );
    for ((journal, unreadable), closed) in [
        ("inbox", &report.inbox_unreadable),
        ("outbox", &report.outbox_unreadable),
    ]
    .into_iter()
    .zip(closed)
    {
        if let Some(closed) = closed {
            line(
                &format!("{journal} not read"),
                &format!(
                    "{}; this user cannot read the agent's journals (root or the agent's own user can)",
                    shown(closed)
                ),
            );
        }
        for problem in unreadable
            .iter()
            .filter(|problem| Some(problem.as_str()) != closed)
        {
            line(
                &format!("{journal} corrupt"),
                &format!(
                    "{}; `perch run` does not open the {journal} until it is repaired",
                    shown(problem)
                ),
            );
        }
    }
    for (lane, open) in &report.lanes_with_open_operations {
        line("open operations", &format!("{}: {open}", shown(lane)));
    }
    line("vm", &report.vm);
    if let Some(reason) = &report.channels_paused {
        line("channels paused", reason);
    }
    if !report.restart_needed.is_empty() {
        line(
            "restart needed",
            &format!(
                "{} changed since perch run started",
                report.restart_needed.join(", ")
            ),
        );
    }
    if let Some(last) = &report.last_start {
        line(
            "last start",
            &format!("{}: {last}", human::when(last.started, now)),
        );
    }
    if let SpendStatus::Known(today) = &report.spend_today {
        line("spend today", &today.summary());
    }
    line(
        "outbox pending",
        &format!("{}{}", at_least(outbox_unreadable), report.outbox_pending),
    );
    line(
        "unknown deliveries",
        &report.deliveries_unknown.len().to_string(),
    );
    for delivery in &report.deliveries_unknown {
        out.push_str(&format!("  {}\n", shown(delivery.reason())));
    }
    match pairing_error {
        Some(error) => out.push_str(&format!(
            "{:<18} unknown: cannot read {}\n  fix: {}\n",
            "pairings pending",
            shown(error),
            PAIRING_UNREADABLE_FIX
        )),
        None => out.push_str(&format!(
            "{:<18} {}\n",
            "pairings pending",
            pairing.pending.len()
        )),
    }
    let mut pending: Vec<_> = pairing.pending.iter().collect();
    pending.sort_by_key(|pending| pending.expires);
    for pending in pending {
        out.push_str(&format!(
            "  {} ({}) on {}, until {}\n",
            shown(&pending.name),
            shown(&pending.sender),
            shown(&pending.channel),
            human::when(pending.expires, now)
        ));
    }
    if !report.refusals.is_empty() {
        out.push_str(&format!(
            "{:<18} the newest, one per room and reason (`perch log --refused` lists them all)\n",
            "refused"
        ));
        for refusal in &report.refusals {
            out.push_str(&refusal.text());
        }
    }
    if let Heartbeats::Listed(list) = &report.heartbeats {
        for task in &list.tasks {
            out.push_str(&format!(
                "{:<18} {}: {}{}{}\n",
                "heartbeat",
                shown(&task.name),
                task.status,
                task.next
                    .as_deref()
                    .map(|next| format!(", next {}", human::when_text(next, now)))
                    .unwrap_or_default(),
                task.last
                    .as_ref()
                    .map(|last| format!(", last {}", last.outcome))
                    .unwrap_or_default(),
            ));
        }
        if let Some(error) = &list.reload_error {
            out.push_str(&format!(
                "{:<18} does not check: {error}\n",
                "heartbeat file"
            ));
        }
    }
    out
}
