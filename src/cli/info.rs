//! `perch info`: what an agent is, for people and for scripts. Secret values never appear here:
//! a secret is shown by the names of its variables and the hosts it may reach.

use super::agent_checks::loaded_checks;
use super::{dir_or_current, emit, emit_escaped, load_agent, printed};
use crate::agent::{LoadedAgent, LoadedChannel};
use crate::sandbox::preflight::{Check, Status};
use perch_core::config::{
    BusyPolicy, ChannelConfig, ChannelKind, Platform, ThreadPolicy, ToolDecl,
};
use perch_core::spend::{HEARTBEAT_PAUSE_PERCENT, Money, SpendPolicy};
use perch_core::terminal::escaped;
use serde_json::json;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Show what the agent is, and every problem `perch run` would refuse on
///
/// The model, sandbox, egress hosts, secrets (names, never values) and tools, then every
/// problem `perch run` would refuse on (exit 1 when there is one). Reads
/// only; never takes the agent's lock or repairs anything.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InfoArgs) -> Result<ExitCode, String> {
    let loaded = match load_agent(&dir_or_current(args.dir))? {
        Ok(loaded) => loaded,
        Err(code) => return Ok(code),
    };
    if args.json {
        emit(&format!("{}\n", printed(&to_json(&loaded))?))?;
    } else {
        emit_escaped(&to_text(&loaded))?;
    }
    let env_file = crate::host::Places::from_environment().env_file;
    let mut failed = false;
    for check in loaded_checks(&loaded, env_file.as_deref()) {
        match check.status {
            Status::Ok => {}
            Status::Warn => eprintln!("warning: {}", escaped(&check_line(&check))),
            Status::Fail => {
                failed = true;
                eprintln!("error: {}", escaped(&check_line(&check)));
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A check's finding and fix on one line, as `perch info` reports it.
fn check_line(check: &Check) -> String {
    let detail = check
        .detail
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ");
    match &check.fix {
        Some(fix) => format!("{detail} (fix: {fix})"),
        None => detail,
    }
}

/// The agent as one JSON object. Keys are snake_case, but for those echoed from models.yml
/// (`baseUrl`, `apiKey`, `contextWindow`, `maxTokens`), which keep the file's spelling.
pub fn to_json(agent: &LoadedAgent) -> serde_json::Value {
    let definition = &agent.definition;
    let (provider, model) = definition.model();
    let sandbox = &definition.sandbox;
    json!({
        "root": agent.dir.root(),
        "model": definition.agent.model.to_string(),
        "thinking": definition.agent.thinking,
        "provider": {
            "name": definition.agent.model.provider,
            "api": provider.api,
            "baseUrl": provider.base_url,
            "apiKey": provider.api_key.as_ref().map(|key| key.name().as_str()),
        },
        "contextWindow": model.context_window,
        "maxTokens": model.max_tokens,
        "reasoning": model.reasoning,
        "price": model.price.map(|price| json!({
            "input": money(price.input),
            "output": money(price.output),
            "cached": price.cached.map(money),
        })),
        "spend": spend_json(definition.agent.spend),
        "owner": definition.agent.owner.as_ref().map(ToString::to_string),
        "sandbox": {
            "image": sandbox.image,
            "cpus": sandbox.cpus,
            "memory_mib": sandbox.memory,
            "workspace_disk_mib": sandbox.workspace_disk,
            "allow": sandbox.allow,
            "secrets": sandbox.secrets.iter().map(|grant| json!({
                "env": grant.env,
                "source": grant.source.name(),
                "hosts": grant.hosts,
            })).collect::<Vec<_>>(),
            "env": sandbox.env,
            "bootstrap": sandbox.bootstrap,
        },
        "tools": definition.tools.iter().map(tool_json).collect::<Vec<_>>(),
        "channels": agent.channels.iter().map(channel_json).collect::<Vec<_>>(),
        "heartbeats": heartbeats_json(agent),
        "skills": skills_json(agent),
    })
}

/// The skills the workspace holds, and the problem of each file left out (by its name, so a
/// hostile or broken `SKILL.md` is easy to find).
fn skills_json(agent: &LoadedAgent) -> serde_json::Value {
    let (skills, problems) = crate::tools::skills::skills_catalog(&agent.dir.workspace());
    json!({
        "names": skills.iter().map(|skill| skill.name.clone()).collect::<Vec<_>>(),
        "problems": problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// The heartbeat tasks `workspace/HEARTBEAT.yml` holds, or why it does not check. The file is
/// the agent's to edit, so a problem in it is shown, not fatal: a running service keeps its last
/// good schedule.
fn heartbeats_json(agent: &LoadedAgent) -> serde_json::Value {
    let env = crate::heartbeat::heartbeat_env(agent, crate::heartbeat::host_tz());
    match crate::heartbeat::read_file(&agent.dir, &env) {
        Ok(file) => json!({
            "tasks": file.tasks.iter().map(|task| task.name.to_string()).collect::<Vec<_>>(),
        }),
        Err(error) => json!({ "error": error }),
    }
}

/// The daily spend caps and where they come from: `default` (agent.lua sets no spend),
/// `agent.lua`, or `off` (`spend = false`).
fn spend_json(policy: SpendPolicy) -> serde_json::Value {
    let caps = policy.caps();
    let source = match policy {
        SpendPolicy::BuiltIn => "default",
        SpendPolicy::Set(_) => "agent.lua",
        SpendPolicy::Off => "off",
    };
    json!({
        "source": source,
        "tokens_per_day": caps.tokens_per_day,
        "cost_per_day": caps.cost_per_day.map(money),
        "heartbeats_pause_at_percent": HEARTBEAT_PAUSE_PERCENT,
    })
}

/// An amount of money as a JSON number of whole units.
fn money(amount: Money) -> serde_json::Value {
    #[expect(clippy::cast_precision_loss, reason = "shown, not computed with")]
    let units = amount.micros() as f64 / 1_000_000.0;
    json!(units)
}

/// A channel by its settings and the names of its credential variables, never their values.
fn channel_json(channel: &LoadedChannel) -> serde_json::Value {
    let config = &channel.config;
    let credentials: serde_json::Map<String, serde_json::Value> = config
        .platform
        .credentials()
        .into_iter()
        .map(|(key, variable)| (key.to_owned(), json!(variable.name())))
        .collect();
    let (homeserver, user) = match &config.platform {
        Platform::Matrix {
            homeserver, user, ..
        } => (Some(homeserver), Some(user)),
        _ => (None, None),
    };
    let collect_window = match config.busy {
        BusyPolicy::Collect { window } => Some(window.as_secs()),
        _ => None,
    };
    let hooks = declared_hooks(config);
    json!({
        "name": config.name,
        "file": channel.file,
        "kind": config.kind(),
        "credentials": credentials,
        "homeserver": homeserver,
        "user": user,
        "api_url": config.api_url,
        "rooms": config.rooms,
        "allow": {
            "users": config.allow.users,
            "rooms": config.allow.rooms,
        },
        "dm": config.dm,
        "groups": config.groups,
        "busy": config.busy.as_str(),
        "collect_window_seconds": collect_window,
        "threads": (config.kind() != ChannelKind::Discord).then(|| config.threads.as_str()),
        "max_age_seconds": config.max_age.as_secs(),
        "queue_limit": config.queue_limit,
        "allow_bots": config.allow_bots,
        "bot_turns": config.bot_turns,
        "hooks": hooks,
    })
}

/// A channel on one line: kind, rooms, policies and credential variables.
fn channel_text(channel: &LoadedChannel) -> String {
    let config = &channel.config;
    let rooms: Vec<&str> = config.rooms.keys().map(|alias| alias.as_str()).collect();
    let busy = match config.busy {
        BusyPolicy::Collect { window } => format!("collect {} s", window.as_secs()),
        other => other.as_str().to_owned(),
    };
    let credentials: Vec<String> = config
        .platform
        .credentials()
        .into_iter()
        .map(|(key, variable)| format!("{key} from {variable}"))
        .collect();
    let mut line = format!(
        "{}  {}, rooms {}; dm {}, groups {}, busy {}; {}",
        config.name,
        config.kind(),
        list_or_none(&rooms),
        config.dm.as_str(),
        config.groups.as_str(),
        busy,
        credentials.join(", ")
    );
    if config.threads == ThreadPolicy::Room {
        line.push_str("; threads join their room");
    }
    let hooks = declared_hooks(config);
    if !hooks.is_empty() {
        line.push_str(&format!("; hooks {}", hooks.join(", ")));
    }
    line
}

/// The hooks a channel file declares, by name.
fn declared_hooks(config: &ChannelConfig) -> Vec<&'static str> {
    [
        ("on_message", config.on_message.is_some()),
        ("format", config.format.is_some()),
    ]
    .into_iter()
    .filter_map(|(hook, declared)| declared.then_some(hook))
    .collect()
}

fn tool_json(tool: &ToolDecl) -> serde_json::Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "replay": tool.replay,
        "parameters": tool.json_schema(),
    })
}

fn list_or_none<T: ToString>(items: &[T]) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The agent as aligned lines of text.
pub fn to_text(agent: &LoadedAgent) -> String {
    let definition = &agent.definition;
    let (provider, model) = definition.model();
    let sandbox = &definition.sandbox;
    let mut out = String::new();
    let mut row = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<10} {value}");
    };
    row("root", agent.dir.root().display().to_string());
    let key = provider
        .api_key
        .as_ref()
        .map_or_else(|| "no key".to_owned(), |key| format!("key from {key}"));
    row(
        "model",
        format!(
            "{} ({} at {}, {key})",
            definition.agent.model,
            provider.api.as_str(),
            provider.base_url
        ),
    );
    row("thinking", definition.agent.thinking.as_str().to_owned());
    row("spend", definition.agent.spend.describe());
    row(
        "owner",
        definition.agent.owner.as_ref().map_or_else(
            || "(none: alerts go to the log only)".to_owned(),
            |owner| format!("{owner} (alerts go there)"),
        ),
    );
    row(
        "context",
        format!(
            "{} tokens, replies up to {} tokens",
            model.context_window, model.max_tokens
        ),
    );
    let cpus = if sandbox.cpus == 1 { "cpu" } else { "cpus" };
    row(
        "sandbox",
        format!(
            "{}, {} {cpus}, {} MiB, the workspace may grow by {} MiB",
            sandbox.image, sandbox.cpus, sandbox.memory, sandbox.workspace_disk
        ),
    );
    row("egress", list_or_none(&sandbox.allow));
    let secrets: Vec<String> = sandbox
        .secrets
        .iter()
        .map(|grant| {
            format!(
                "{} from {}, sent only to {}",
                grant.env,
                grant.source,
                list_or_none(&grant.hosts)
            )
        })
        .collect();
    row("secrets", list_or_none(&secrets));
    let env: Vec<&str> = sandbox.env.keys().map(|name| name.as_str()).collect();
    row("env", list_or_none(&env));
    row("bootstrap", list_or_none(&sandbox.bootstrap));
    if definition.tools.is_empty() {
        row("tools", "(none)".to_owned());
    }
    for (index, tool) in definition.tools.iter().enumerate() {
        let label = if index == 0 { "tools" } else { "" };
        row(label, format!("{}  {}", tool.name, tool.description));
    }
    if agent.channels.is_empty() {
        row("channels", "(none)".to_owned());
    }
    for (index, channel) in agent.channels.iter().enumerate() {
        let label = if index == 0 { "channels" } else { "" };
        row(label, channel_text(channel));
    }
    let heartbeats = heartbeats_json(agent);
    match (heartbeats["tasks"].as_array(), heartbeats["error"].as_str()) {
        (Some(tasks), _) if tasks.is_empty() => row("heartbeats", "(none)".to_owned()),
        (Some(tasks), _) => row(
            "heartbeats",
            tasks
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (None, Some(error)) => row(
            "heartbeats",
            format!("HEARTBEAT.yml does not check:\n{error}"),
        ),
        (None, None) => {}
    }
    let skills = skills_json(agent);
    let names: Vec<&str> = skills["names"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .collect();
    row("skills", list_or_none(&names));
    for problem in skills["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
    {
        row("", format!("left out: {problem}"));
    }
    out
}
