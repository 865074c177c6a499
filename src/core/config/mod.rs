//! An agent's configuration after checking: each file's typed value, and the whole definition
//! once the files agree with each other.

mod agent;
mod channel;
pub mod environment;
mod models;
mod sandbox;
mod tool;

pub use agent::{AgentConfig, AgentRefused, Thinking, check_agent};
pub use channel::{
    Access, BusyPolicy, ChannelConfig, ChannelKind, DmPolicy, GroupPolicy, Platform,
    TERMINAL_CHANNEL, ThreadPolicy, channel_secret_problems, channel_stem, check_channel,
};
pub use models::{Api, ModelSpec, ModelsFile, Provider, check_models};
pub use sandbox::{
    DEFAULT_IMAGE, DEFAULT_WORKSPACE_DISK, SandboxPolicy, SecretGrant, check_sandbox,
};
pub use tool::{
    BUILTIN_TOOLS, Param, ParamType, Replay, ToolDecl, arguments_schema, check_tool,
    prepare_arguments,
};

use crate::name::ModelRef;
use crate::problem::{Pos, Problem};
use crate::tree::{Checker, Node};

/// One call of a declaring function (`agent { ... }`, `tool("x", { ... })`) made while a Lua
/// file ran, with the line it was made on.
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    pub function: String,
    pub pos: Pos,
    pub args: Vec<Node>,
}

/// Takes the one declaration a file must make, reporting a missing or repeated one.
fn single<'d>(
    checker: &mut Checker,
    declarations: &'d [Declaration],
    function: &str,
    example: &str,
) -> Option<&'d Declaration> {
    match declarations {
        [] => {
            checker.push(
                Problem::new(
                    checker.file(),
                    Pos::default(),
                    format!("{function} {{ ... }} is never called"),
                )
                .with_fix(format!("declare it: {example}")),
            );
            None
        }
        [only] => Some(only),
        [first, rest @ ..] => {
            for extra in rest {
                checker.push(
                    Problem::new(
                        checker.file(),
                        extra.pos,
                        format!(
                            "{function} is called again (first call on line {})",
                            first.pos.line
                        ),
                    )
                    .with_fix(format!("keep one {function} {{ ... }} call")),
                );
            }
            None
        }
    }
}

/// The single table argument of a declaration.
fn table_argument<'d>(
    checker: &mut Checker,
    declaration: &'d Declaration,
    usage: &str,
) -> Option<&'d Node> {
    match declaration.args.as_slice() {
        [table] => Some(table),
        _ => {
            checker.push(
                Problem::new(
                    checker.file(),
                    declaration.pos,
                    format!(
                        "{} takes one table, got {} arguments",
                        declaration.function,
                        declaration.args.len()
                    ),
                )
                .with_fix(format!("write it as {usage}")),
            );
            None
        }
    }
}

/// The problem with `agent.lua` naming a model that `models.yml` does not list, if it does.
pub fn model_problem(model: &ModelRef, agent_pos: Pos, models: &ModelsFile) -> Option<Problem> {
    if models.model(model).is_some() {
        return None;
    }
    let known: Vec<String> = models.all_refs().iter().map(ToString::to_string).collect();
    let fix = if known.is_empty() {
        "add the model to models.yml".to_owned()
    } else {
        format!("use one of {} or add it to models.yml", known.join(", "))
    };
    Some(
        Problem::new(
            "agent.lua",
            agent_pos,
            format!("model {model} is not in models.yml"),
        )
        .with_path("model")
        .with_fix(fix),
    )
}

/// The problem with `agent.lua`'s `owner` naming a room no channel declares, if it does.
/// `targets` are the rooms the agent's channels declare.
pub fn owner_problem(
    agent: &AgentConfig,
    agent_pos: Pos,
    targets: &[crate::heartbeat::TargetSpec],
) -> Option<Problem> {
    let owner = agent.owner.as_ref()?;
    if owner.is_declared(targets) {
        return None;
    }
    let fix = if targets.is_empty() {
        "no channel declares a room; give a channel file rooms = { owner = \"...\" } first, \
         or leave owner out to send alerts to the log only"
            .to_owned()
    } else {
        let declared: Vec<String> = targets
            .iter()
            .map(|spec| format!("{}:{}", spec.channel, spec.room))
            .collect();
        format!("use a declared room: {}", declared.join(", "))
    };
    Some(
        Problem::new(
            "agent.lua",
            agent_pos,
            format!(
                "{}:{} is not a room the agent's channels declare",
                owner.channel, owner.room
            ),
        )
        .with_path("owner")
        .with_fix(fix),
    )
}

/// The problem with a `cost_per_day` cap when `models.yml` gives the agent's model no price,
/// so that its replies would cost nothing and the cap would never trip.
pub fn spend_problem(agent: &AgentConfig, agent_pos: Pos, models: &ModelsFile) -> Option<Problem> {
    agent.spend.caps().cost_per_day?;
    let (_, spec) = models.model(&agent.model)?;
    if spec.price.is_some() {
        return None;
    }
    Some(
        Problem::new(
            "agent.lua",
            agent_pos,
            format!(
                "models.yml gives {} no price, so its cost cannot be counted",
                agent.model
            ),
        )
        .with_path("spend.cost_per_day")
        .with_fix(format!(
            "add price: {{ input: ..., output: ... }} (per million tokens) to {} in models.yml, \
             or cap tokens_per_day instead",
            agent.model
        )),
    )
}

/// A problem for every tool whose name an earlier file (or declaration) already took.
pub fn duplicate_tools(tools: &[(String, ToolDecl)]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (index, (file, tool)) in tools.iter().enumerate() {
        if let Some((first_file, _)) = tools[..index]
            .iter()
            .find(|(_, earlier)| earlier.name == tool.name)
        {
            problems.push(
                Problem::new(
                    file.clone(),
                    tool.pos,
                    format!("tool {} is already declared in {first_file}", tool.name),
                )
                .with_fix("give one of them another name"),
            );
        }
    }
    problems
}

/// The rooms the channels declare, which an owner (and a heartbeat's delivery) may name.
pub fn declared_targets<'c>(
    channels: impl IntoIterator<Item = &'c ChannelConfig>,
) -> Vec<crate::heartbeat::TargetSpec> {
    channels
        .into_iter()
        .flat_map(|channel| {
            channel
                .rooms
                .keys()
                .map(|room| crate::heartbeat::TargetSpec {
                    channel: channel.name.clone(),
                    room: room.clone(),
                })
        })
        .collect()
}

/// The whole agent once every file checked out and the files agree.
#[derive(Debug)]
pub struct Definition {
    pub agent: AgentConfig,
    pub sandbox: SandboxPolicy,
    pub tools: Vec<ToolDecl>,
    pub models: ModelsFile,
}

impl Definition {
    /// Checks what no single file can: the model exists, tool names are unique.
    /// `agent_pos` is where `agent { ... }` was declared.
    pub fn assemble(
        agent: AgentConfig,
        agent_pos: Pos,
        sandbox: SandboxPolicy,
        tools: Vec<(String, ToolDecl)>,
        models: ModelsFile,
    ) -> Result<Definition, Vec<Problem>> {
        let mut problems: Vec<Problem> = model_problem(&agent.model, agent_pos, &models)
            .into_iter()
            .collect();
        problems.extend(duplicate_tools(&tools));
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Definition {
            agent,
            sandbox,
            tools: tools.into_iter().map(|(_, tool)| tool).collect(),
            models,
        })
    }

    /// The model `agent.lua` selects; present by construction.
    pub fn model(&self) -> (&Provider, &ModelSpec) {
        self.models
            .model(&self.agent.model)
            .expect("assemble checked that the agent's model is in models.yml")
    }
}
