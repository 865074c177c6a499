//! A tool's function called in its file's state with its `ctx`: `ctx.sh` running a command in
//! the sandbox, `ctx.workdir`, `ctx.shellescape`.

use super::{Evaluation, Limits, problem_from_error};
use crate::sandbox::{Command, End, GUEST_WORKSPACE, Machine};
use mlua::LuaSerdeExt;
use mlua::{Lua, Table, Value as LuaValue};
use perch_core::tree::FunctionId;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What a tool's function can reach through its `ctx` argument.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub machine: Machine,
    pub cancel: CancellationToken,
    /// Set by each `ctx.sh` to its command's exit status (cleared when it was killed).
    pub last_exit: LastExit,
}

/// The exit status of the last command a tool's `ctx.sh` ran, shared with whoever called it.
#[derive(Debug, Clone, Default)]
pub struct LastExit(Arc<Mutex<Option<i32>>>);

impl LastExit {
    pub fn get(&self) -> Option<i32> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, code: Option<i32>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = code;
    }
}

impl Evaluation {
    /// Calls `function`, declared by this file as a tool's `run`, as `run(args, ctx)`.
    ///
    /// `ctx.sh(line[, {timeout = seconds}])` runs a shell line in the agent's sandbox and returns
    /// its stdout (followed by its stderr when there is any) and its exit code. It is killed
    /// after [`CTX_SH_DEFAULT_TIMEOUT_SECS`] (the option allows up to
    /// [`BASH_MAX_TIMEOUT_SECS`](perch_core::builtin::BASH_MAX_TIMEOUT_SECS)) and ends with exit
    /// code 124 and a line saying so; of each stream it returns at most the first and last
    /// 512 KiB, with a line saying how many bytes were left out. `ctx.workdir` is the guest's working
    /// directory; `ctx.shellescape(s)` quotes `s` for a shell line. A string result is returned
    /// as it is, `nil` as an empty string, anything else as JSON. A Lua error, the instruction
    /// limit and the memory limit become an error naming the file and line.
    pub async fn call_tool(
        &self,
        function: FunctionId,
        arguments: &serde_json::Value,
        context: ToolContext,
    ) -> Result<serde_json::Value, String> {
        let _one_at_a_time = self.calls.lock().await;
        let limits = Limits::TOOL_CALL;
        let file = self.file.as_str();
        let function = self
            .functions
            .get(function.0)
            .cloned()
            .ok_or_else(|| format!("{file}: the tool's function is missing"))?;
        let prepared = (|| {
            self.budget.renew(&self.lua, limits)?;
            let arguments = self.lua.to_value(arguments)?;
            let ctx = tool_context_table(&self.lua, context.clone())?;
            Ok::<_, mlua::Error>((arguments, ctx))
        })();
        let (arguments, ctx) =
            prepared.map_err(|error| format!("{file}: cannot prepare the call: {error}"))?;
        let returned = function.call_async::<LuaValue>((arguments, ctx)).await;
        if self.budget.is_exhausted() {
            return Err(self.budget.problem(file).to_string());
        }
        if context.cancel.is_cancelled() {
            return Err(format!("{file}: cancelled"));
        }
        let value =
            returned.map_err(|error| problem_from_error(file, &error, limits).to_string())?;
        match value {
            LuaValue::Nil => Ok(serde_json::Value::String(String::new())),
            LuaValue::String(text) => Ok(serde_json::Value::String(text.to_string_lossy())),
            other => self
                .lua
                .from_value::<serde_json::Value>(other)
                .map_err(|error| {
                    format!("{file}: the tool returned a value that is not JSON: {error}")
                }),
        }
    }
}

fn tool_context_table(lua: &Lua, context: ToolContext) -> mlua::Result<Table> {
    let ctx = lua.create_table()?;
    ctx.raw_set("workdir", GUEST_WORKSPACE)?;
    ctx.raw_set(
        "shellescape",
        lua.create_function(|_, text: String| Ok(shell_quote(&text)))?,
    )?;
    let sh = lua.create_async_function(move |_, (line, options): (String, Option<Table>)| {
        let ToolContext {
            machine,
            cancel,
            last_exit,
        } = context.clone();
        async move {
            let timeout = ctx_sh_timeout(options.as_ref())?;
            let output = machine
                .run(Command::shell(line).timeout(timeout), cancel.clone())
                .await
                .map_err(|error| mlua::Error::runtime(error.to_string()))?;
            last_exit.set(match output.end {
                End::Exited(code) => Some(code),
                End::Signalled(_) | End::Cancelled | End::TimedOut(_) => None,
            });
            if cancel.is_cancelled() {
                return Err(mlua::Error::runtime("cancelled"));
            }
            let mut text = output.stdout.marked_text("stdout");
            if !output.stderr.is_empty() {
                text.push_str(&output.stderr.marked_text("stderr"));
            }
            if let End::TimedOut(_) = output.end {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&format!("[ctx.sh {}]", output.end));
            }
            Ok((text, output.end.code()))
        }
    })?;
    ctx.raw_set("sh", sh)?;
    Ok(ctx)
}

/// How long a `ctx.sh` command may run unless its options say otherwise.
pub const CTX_SH_DEFAULT_TIMEOUT_SECS: u64 = perch_core::builtin::BASH_DEFAULT_TIMEOUT_SECS;

fn ctx_sh_timeout(options: Option<&Table>) -> mlua::Result<Duration> {
    use perch_core::builtin::BASH_MAX_TIMEOUT_SECS;
    let seconds = match options {
        None => return Ok(Duration::from_secs(CTX_SH_DEFAULT_TIMEOUT_SECS)),
        Some(options) => options.raw_get::<Option<f64>>("timeout")?,
    };
    match seconds {
        None => Ok(Duration::from_secs(CTX_SH_DEFAULT_TIMEOUT_SECS)),
        Some(seconds) if seconds > 0.0 && seconds <= BASH_MAX_TIMEOUT_SECS as f64 => {
            Ok(Duration::from_secs_f64(seconds))
        }
        Some(seconds) => Err(mlua::Error::runtime(format!(
            "ctx.sh: timeout must be more than 0 and at most {BASH_MAX_TIMEOUT_SECS} seconds, not {seconds}"
        ))),
    }
}

/// `text` as one word for a POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}
