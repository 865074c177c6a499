//! [`Toolbox`]: every tool an agent's model may call, the built-in ones and the agent's Lua
//! tools, behind one entry point for the agent loop. A call always ends in a
//! [`ToolOutcome`] for the model, never in a panic or an `Err`.

use crate::agent::LoadedAgent;
use crate::model::ToolSpec;
use crate::sandbox::{self, Machine};
use crate::tools::builtin::{builtin_specs, run_builtin};
use crate::tools::lua_tool::run_tool_coded;
use crate::tools::{Ran, ToolOutcome};
use perch_core::builtin::{BuiltinTool, builtin_tools};
use perch_core::config::Replay;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The tools of one agent, run in its sandbox.
#[derive(Debug, Clone)]
pub struct Toolbox {
    agent: Arc<LoadedAgent>,
    machine: Machine,
    builtins: Vec<BuiltinTool>,
}

impl Toolbox {
    pub fn new(agent: Arc<LoadedAgent>, machine: Machine) -> Toolbox {
        Toolbox {
            agent,
            machine,
            builtins: builtin_tools(),
        }
    }

    /// Every tool as the model sees it: the built-in tools, then the agent's Lua tools in the
    /// order they were loaded.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut specs = builtin_specs();
        specs.extend(self.agent.definition.tools.iter().map(|tool| ToolSpec {
            name: tool.name.to_string(),
            description: tool.description.clone(),
            parameters: tool.json_schema(),
        }));
        specs
    }

    /// Whether recovery may run the tool `name` again; `None` when there is no such tool.
    pub fn replay(&self, name: &str) -> Option<Replay> {
        self.builtin(name).map(|tool| tool.replay).or_else(|| {
            self.agent
                .definition
                .tools
                .iter()
                .find(|tool| tool.name.as_str() == name)
                .map(|tool| tool.replay)
        })
    }

    /// Calls the tool `name` with `arguments` (a JSON object). Arguments are checked against
    /// the tool's declaration before anything runs; `cancel` kills what is running.
    pub async fn call(
        &self,
        name: &str,
        arguments: &serde_json::Value,
        cancel: CancellationToken,
    ) -> ToolOutcome {
        let ran = match self.builtin(name) {
            Some(tool) => match tool.prepare_arguments(arguments) {
                Ok(prepared) => run_builtin(&self.machine, tool, &prepared, cancel.clone()).await,
                Err(error) => Ran::without_command(Err(error)),
            },
            None if self.replay(name).is_none() => Ran::without_command(Err(format!(
                "there is no tool {name:?}; the tools are: {}",
                self.specs()
                    .iter()
                    .map(|spec| spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            None => {
                run_tool_coded(&self.agent, &self.machine, name, arguments, cancel.clone()).await
            }
        };
        let exit_code = ran.exit_code;
        let (text, is_error) = match ran.result {
            Ok(text) => (text, false),
            Err(text) => (text, true),
        };
        match sandbox::for_model(&self.machine, text, cancel).await {
            Ok(output) => ToolOutcome {
                output,
                is_error,
                exit_code,
            },
            Err(error) => ToolOutcome {
                output: format!(
                    "the result of {name} was too long for the model and could not be kept in the sandbox: {error}"
                ),
                is_error: true,
                exit_code,
            },
        }
    }

    fn builtin(&self, name: &str) -> Option<&BuiltinTool> {
        self.builtins.iter().find(|tool| tool.name == name)
    }
}
