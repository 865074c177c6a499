//! Running the agent's Lua tools: arguments checked against the declaration (defaults filled
//! in) before the tool runs, its function called with a `ctx` that reaches the sandbox, and the
//! result shaped for the model. The tool's Lua runs on a thread of its own, off the async
//! runtime's workers.

use crate::agent::LoadedAgent;
use crate::lua::{LastExit, ToolContext};
use crate::sandbox::{self, Machine};
use crate::tools::Ran;
use perch_core::config::ToolDecl;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs the tool `name` with `arguments` (a JSON object). The error is text for the model and
/// the operator: which tool, which file and line, what went wrong.
pub async fn run_tool(
    agent: &LoadedAgent,
    machine: &Machine,
    name: &str,
    arguments: &serde_json::Value,
    cancel: CancellationToken,
) -> Result<String, String> {
    run_tool_coded(agent, machine, name, arguments, cancel)
        .await
        .result
}

/// [`run_tool`], with the exit status of the tool's last `ctx.sh` command that exited.
pub async fn run_tool_coded(
    agent: &LoadedAgent,
    machine: &Machine,
    name: &str,
    arguments: &serde_json::Value,
    cancel: CancellationToken,
) -> Ran {
    let last_exit = LastExit::default();
    let result = run(agent, machine, name, arguments, cancel, last_exit.clone()).await;
    Ran {
        result,
        exit_code: last_exit.get(),
    }
}

async fn run(
    agent: &LoadedAgent,
    machine: &Machine,
    name: &str,
    arguments: &serde_json::Value,
    cancel: CancellationToken,
    last_exit: LastExit,
) -> Result<String, String> {
    let (decl, code) = find(agent, name)?;
    let arguments = decl.prepare_arguments(arguments)?;
    let context = ToolContext {
        machine: machine.clone(),
        cancel: cancel.clone(),
        last_exit,
    };
    let (code, function) = (Arc::clone(code), decl.run);
    let runtime = tokio::runtime::Handle::current();
    let (sender, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("perch-tool".into())
        .spawn(move || {
            let value = runtime.block_on(code.call_tool(function, &arguments, context));
            let _ = sender.send(value);
        })
        .map_err(|error| format!("cannot start the tool's thread: {error}"))?;
    let value = answer
        .await
        .map_err(|_| format!("the tool {name} stopped without an answer"))??;
    let text = match value {
        serde_json::Value::String(text) => text,
        other => serde_json::to_string_pretty(&other).map_err(|error| error.to_string())?,
    };
    sandbox::for_model(machine, text, cancel)
        .await
        .map_err(|error| error.to_string())
}

fn find<'a>(
    agent: &'a LoadedAgent,
    name: &str,
) -> Result<(&'a ToolDecl, &'a Arc<crate::lua::Evaluation>), String> {
    let decl = agent
        .definition
        .tools
        .iter()
        .find(|tool| tool.name.as_str() == name);
    match (decl, agent.tool_code.get(name)) {
        (Some(decl), Some(code)) => Ok((decl, code)),
        _ => {
            let known: Vec<&str> = agent
                .definition
                .tools
                .iter()
                .map(|tool| tool.name.as_str())
                .collect();
            Err(format!(
                "there is no tool {name:?}; the agent's tools are: {}",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        }
    }
}
