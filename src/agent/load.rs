//! Reading an agent's configuration: every file is read and checked, the files that loaded are
//! checked against each other, and every problem found anywhere is reported together.

use super::AgentDir;
use crate::lua::{self, Limits};
use perch_core::Problem;
use perch_core::config::{
    ChannelConfig, Definition, ToolDecl, channel_secret_problems, check_agent, check_channel,
    check_models, check_sandbox, check_tool, declared_targets, duplicate_tools, model_problem,
    owner_problem, spend_problem,
};
use perch_core::lua_source::point_at_keys;
use perch_core::problem::{Pos, Problems};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// An agent directory whose configuration checked out.
#[derive(Debug)]
pub struct LoadedAgent {
    pub dir: AgentDir,
    pub definition: Definition,
    /// The contents of `instructions.md`, if there is one.
    pub instructions: Option<String>,
    /// The Lua state of the file that declared each tool, by tool name.
    pub tool_code: BTreeMap<String, Arc<lua::Evaluation>>,
    /// Every `channels/*.lua`, in file name order.
    pub channels: Vec<LoadedChannel>,
}

/// One `channels/<name>.lua` that checked out, with the Lua state its hooks run in.
#[derive(Debug, Clone)]
pub struct LoadedChannel {
    /// The file, relative to the agent directory (`channels/ops.lua`).
    pub file: String,
    /// The checked declaration; its `on_message` and `format` are functions of `code`.
    pub config: ChannelConfig,
    /// The file's Lua state, in which its hooks run.
    pub code: Arc<lua::Evaluation>,
    /// The file's text as loaded, to make a fresh state from when a hook's is abandoned.
    pub source: Arc<str>,
}

/// Loads and checks `agent.lua`, `sandbox.lua`, `models.yml`, `tools/*.lua` and
/// `channels/*.lua`.
pub fn load(dir: &AgentDir) -> Result<LoadedAgent, Problems> {
    let root = dir.root();
    let mut problems = Vec::new();
    let mut sources = Vec::new();

    let mut refused_agent_model = None;
    let agent = lua_file(root, "agent.lua", "agent", &mut sources, &mut problems).and_then(
        |declarations| match check_agent(&declarations) {
            Ok(agent) => Some(agent),
            Err(refused) => {
                problems.extend(refused.problems);
                refused_agent_model = refused.model;
                None
            }
        },
    );
    let sandbox = lua_file(root, "sandbox.lua", "sandbox", &mut sources, &mut problems)
        .and_then(|declarations| keep(check_sandbox(&declarations), &mut problems));
    let models = read(
        root,
        "models.yml",
        "run `perch init` to create it",
        &mut problems,
    )
    .and_then(|text| keep(check_models(&text), &mut problems));
    let (tools, tool_code) = load_tools(root, &mut sources, &mut problems);
    let channels = load_channels(root, &mut problems);
    sources.extend(channels.iter().map(|channel| LuaSource {
        file: channel.file.clone(),
        text: Arc::clone(&channel.source),
        function: "channel",
    }));
    let instructions = fs::read_to_string(root.join("instructions.md")).ok();

    let named_model = agent
        .as_ref()
        .map(|(agent, agent_pos)| (agent.model.clone(), *agent_pos))
        .or(refused_agent_model);
    if let (Some((model, agent_pos)), Some(models)) = (&named_model, &models) {
        problems.extend(model_problem(model, *agent_pos, models));
    }
    if let (Some((agent, agent_pos)), Some(models)) = (&agent, &models) {
        problems.extend(spend_problem(agent, *agent_pos, models));
    }
    if let Some((agent, agent_pos)) = &agent {
        let targets = declared_targets(channels.iter().map(|channel| &channel.config));
        problems.extend(owner_problem(agent, *agent_pos, &targets));
    }
    problems.extend(duplicate_tools(&tools));
    if let Some(sandbox) = &sandbox {
        problems.extend(channel_secret_problems(
            sandbox,
            channels
                .iter()
                .map(|channel| (channel.file.as_str(), &channel.config)),
        ));
    }
    let (Some((agent, agent_pos)), Some(sandbox), Some(models)) = (agent, sandbox, models) else {
        return Err(pointed_at_keys(problems, &sources));
    };
    if !problems.is_empty() {
        return Err(pointed_at_keys(problems, &sources));
    }
    match Definition::assemble(agent, agent_pos, sandbox, tools, models) {
        Ok(definition) => Ok(LoadedAgent {
            dir: dir.clone(),
            definition,
            instructions,
            tool_code,
            channels,
        }),
        Err(found) => Err(pointed_at_keys(found, &sources)),
    }
}

/// A Lua file's text as it was run, and the function its declarations call.
struct LuaSource {
    file: String,
    text: Arc<str>,
    function: &'static str,
}

/// The problems, each about a key of a declaration moved from the declaring call's line to the
/// key's own, in file and line order.
fn pointed_at_keys(mut problems: Vec<Problem>, sources: &[LuaSource]) -> Problems {
    for source in sources {
        point_at_keys(&mut problems, &source.file, &source.text, source.function);
    }
    Problems::from(problems).sorted()
}

/// Runs one of the agent's own Lua files, which `perch init` creates.
fn lua_file(
    root: &Path,
    file: &str,
    function: &'static str,
    sources: &mut Vec<LuaSource>,
    problems: &mut Vec<Problem>,
) -> Option<Vec<perch_core::config::Declaration>> {
    let source = read(root, file, "run `perch init` to create it", problems)?;
    let declarations = evaluate(file, &source, function, problems);
    sources.push(LuaSource {
        file: file.to_owned(),
        text: Arc::from(source),
        function,
    });
    declarations
}

fn read(root: &Path, file: &str, fix: &str, problems: &mut Vec<Problem>) -> Option<String> {
    match fs::read_to_string(root.join(file)) {
        Ok(text) => Some(text),
        Err(error) => {
            let message = match error.kind() {
                io::ErrorKind::NotFound => "is missing".to_owned(),
                io::ErrorKind::InvalidData => "is not UTF-8 text".to_owned(),
                _ => format!("cannot be read: {error}"),
            };
            problems.push(Problem::new(file, Pos::default(), message).with_fix(fix));
            None
        }
    }
}

fn evaluate(
    file: &str,
    source: &str,
    function: &str,
    problems: &mut Vec<Problem>,
) -> Option<Vec<perch_core::config::Declaration>> {
    keep(
        lua::evaluate(file, source, &[function], Limits::CONFIG)
            .map(lua::Evaluation::into_declarations),
        problems,
    )
}

fn keep<T>(result: Result<T, Vec<Problem>>, problems: &mut Vec<Problem>) -> Option<T> {
    result.map_err(|found| problems.extend(found)).ok()
}

/// The tools of every `tools/*.lua` file that checked out, in file name order. A missing
/// `tools/` means no tools.
fn load_tools(
    root: &Path,
    sources: &mut Vec<LuaSource>,
    problems: &mut Vec<Problem>,
) -> (Vec<(String, ToolDecl)>, ToolCode) {
    let mut code = ToolCode::new();
    let listing = match fs::read_dir(root.join("tools")) {
        Ok(listing) => listing,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return (Vec::new(), code),
        Err(error) => {
            problems.push(Problem::new(
                "tools/",
                Pos::default(),
                format!("cannot be listed: {error}"),
            ));
            return (Vec::new(), code);
        }
    };
    let mut files: Vec<String> = listing
        .filter_map(Result::ok)
        .filter_map(|item| item.file_name().into_string().ok())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    files.sort();
    let mut tools = Vec::new();
    for name in files {
        let file = format!("tools/{name}");
        let Some(source) = read(root, &file, "make it a readable text file", problems) else {
            continue;
        };
        let evaluation = keep(
            lua::evaluate(&file, &source, &["tool"], Limits::CONFIG),
            problems,
        )
        .map(Arc::new);
        sources.push(LuaSource {
            file: file.clone(),
            text: Arc::from(source),
            function: "tool",
        });
        let Some(evaluation) = evaluation else {
            continue;
        };
        let declared = keep(check_tool(&file, evaluation.declarations()), problems);
        for tool in declared.into_iter().flatten() {
            code.insert(tool.name.to_string(), Arc::clone(&evaluation));
            tools.push((file.clone(), tool));
        }
    }
    (tools, code)
}

type ToolCode = BTreeMap<String, Arc<lua::Evaluation>>;

/// Every `channels/*.lua` file that checked out, in file name order. A missing `channels/`
/// means no channels.
fn load_channels(root: &Path, problems: &mut Vec<Problem>) -> Vec<LoadedChannel> {
    let listing = match fs::read_dir(root.join("channels")) {
        Ok(listing) => listing,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(error) => {
            problems.push(Problem::new(
                "channels/",
                Pos::default(),
                format!("cannot be listed: {error}"),
            ));
            return Vec::new();
        }
    };
    let mut files: Vec<String> = listing
        .filter_map(Result::ok)
        .filter_map(|item| item.file_name().into_string().ok())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|name| {
            let file = format!("channels/{name}");
            let source = read(root, &file, "make it a readable text file", problems)?;
            load_channel(&file, &source, problems)
        })
        .collect()
}

/// Runs and checks one channel file, `file` being its path in the agent directory
/// (`channels/ops.lua`); the channel is named by the file's stem.
pub fn load_channel(
    file: &str,
    source: &str,
    problems: &mut Vec<Problem>,
) -> Option<LoadedChannel> {
    let before = problems.len();
    let loaded = check_channel_file(file, source, problems);
    point_at_keys(&mut problems[before..], file, source, "channel");
    loaded
}

fn check_channel_file(
    file: &str,
    source: &str,
    problems: &mut Vec<Problem>,
) -> Option<LoadedChannel> {
    let evaluation = keep(
        lua::evaluate(file, source, &["channel"], Limits::CONFIG),
        problems,
    )?;
    let config = keep(check_channel(file, evaluation.declarations()), problems)?;
    Some(LoadedChannel {
        file: file.to_owned(),
        config,
        code: Arc::new(evaluation),
        source: Arc::from(source),
    })
}
