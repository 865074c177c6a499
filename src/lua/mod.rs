//! The Lua evaluator: runs one configuration file in a restricted state and records the calls it
//! makes to the declaring functions (`agent { ... }`, `tool("x", { ... })`) as
//! [`Node`](perch_core::tree::Node) trees.
//!
//! This folder is the only place that names `mlua`. The state it builds cannot touch files,
//! processes, the environment or stdout, cannot load bytecode, and stops when it exceeds its
//! [`Limits`]. Here: evaluating a file; `limits` (what a state may use), `state` (the restricted
//! state), `counted` (the string and table functions whose work is counted), `budget` (the
//! instruction budget and deadline), `record` (recording declarations and converting their
//! values), `tool` (a tool's call, its `ctx` and `ctx.sh`), `hooks` (a channel's hook calls and
//! their store).

mod budget;
mod counted;
mod hooks;
mod limits;
mod record;
mod state;
#[cfg(test)]
mod tests;
mod tool;

pub use hooks::HookStore;
pub use limits::Limits;
pub use tool::{CTX_SH_DEFAULT_TIMEOUT_SECS, LastExit, ToolContext};

use budget::InstructionBudget;
use limits::mebibytes;
use mlua::chunk::ChunkMode;
use mlua::{Function, Lua};
use perch_core::config::Declaration;
use perch_core::lua_source;
use perch_core::problem::{Pos, Problem};
use record::{CallError, Recorder, lock};
use state::prepare_state;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A Lua file after it ran: the declarations it made, and the state that holds their functions.
pub struct Evaluation {
    file: String,
    lua: Lua,
    /// Indexed by [`FunctionId`](perch_core::tree::FunctionId).
    functions: Vec<Function>,
    declarations: Vec<Declaration>,
    budget: Arc<InstructionBudget>,
    /// One call at a time per state, so that each call has its own instruction budget.
    calls: tokio::sync::Mutex<()>,
}

impl Evaluation {
    /// The declaring calls in the order the file made them.
    pub fn declarations(&self) -> &[Declaration] {
        &self.declarations
    }

    /// The declarations alone, for files whose functions are not needed; the state is dropped.
    pub fn into_declarations(self) -> Vec<Declaration> {
        self.declarations
    }
}

impl fmt::Debug for Evaluation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evaluation")
            .field("declarations", &self.declarations)
            .field("functions", &self.functions.len())
            .finish_non_exhaustive()
    }
}

/// Runs `source` (the text of `file`, a path relative to the agent directory such as
/// "sandbox.lua" or "tools/example.lua") in a restricted state in which each name in
/// `declare` is a global function that records its call.
///
/// The state has the base library without `dofile`, `loadfile`, `load` and `collectgarbage`;
/// `string` (without `dump`), `table`, `math`, `utf8` and `coroutine`; an `os` with only `time`,
/// `clock`, `date` and `difftime`; `print`, which discards its output because stdout carries
/// perch's own output; `setmetatable`, which refuses `__gc` and `__close` and sets a copy of
/// the metatable; `getmetatable`, which returns the metatable given, never the one in use;
/// `xpcall`, whose message handler runs after the error unwound; `string` and `table`
/// functions that loop in C counted against the instruction limit; and `env "NAME"`, a reference to a host environment variable that
/// never reads it.
///
/// Every problem is returned: a file that fails to run, and every value its declarations hold
/// that cannot become a [`Node`](perch_core::tree::Node).
pub fn evaluate(
    file: &str,
    source: &str,
    declare: &[&str],
    limits: Limits,
) -> Result<Evaluation, Vec<Problem>> {
    let recorder = Arc::new(Mutex::new(Recorder::new(file, limits.memory_bytes)));
    let budget = Arc::new(InstructionBudget::new(limits));
    let lua = prepare_state(file, declare, limits, &recorder, &budget).map_err(|error| {
        vec![Problem::new(
            file,
            Pos::default(),
            format!("could not prepare the Lua state: {error}"),
        )]
    })?;

    let outcome = lua
        .load(source)
        .set_name(format!("@{file}"))
        .set_mode(ChunkMode::Text)
        .exec();

    let (declarations, functions, mut problems) = {
        let mut recorder = lock(&recorder);
        (
            std::mem::take(&mut recorder.declarations),
            std::mem::take(&mut recorder.functions),
            std::mem::take(&mut recorder.problems),
        )
    };
    if budget.is_exhausted() {
        problems.push(budget.problem(file));
    } else if let Err(error) = outcome {
        let mut problem = unknown_declaration(file, &error, declare)
            .unwrap_or_else(|| problem_from_error(file, &error, limits));
        if matches!(root_cause(&error), mlua::Error::SyntaxError { .. }) {
            problem.fix = Some(syntax_fix(source, problem.pos.line, &problem.message));
        }
        problems.push(problem);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Evaluation {
        file: file.to_owned(),
        lua,
        functions,
        declarations,
        budget,
        calls: tokio::sync::Mutex::new(()),
    })
}

fn problem_from_error(file: &str, error: &mlua::Error, limits: Limits) -> Problem {
    let cause = root_cause(error);
    if let Some(call) = cause.downcast_ref::<CallError>() {
        return Problem::new(file, Pos::line(call.line), call.message.clone()).with_fix(call.fix);
    }
    match cause {
        mlua::Error::MemoryError(_) => Problem::new(
            file,
            Pos::default(),
            format!(
                "stopped: the file needs more than the {} memory limit",
                mebibytes(limits.memory_bytes)
            ),
        )
        .with_fix("build smaller tables and strings: configuration should be small"),
        mlua::Error::SyntaxError { message, .. } => {
            let (pos, message) = split_position(file, without_traceback(message));
            Problem::new(file, pos, format!("syntax error: {message}"))
                .with_fix("correct the Lua syntax on that line")
        }
        mlua::Error::RuntimeError(message) => {
            let (pos, message) = split_position(file, without_traceback(message));
            Problem::new(file, pos, message).with_fix("correct the Lua code on that line")
        }
        other => {
            let text = other.to_string();
            let (pos, message) = split_position(file, without_traceback(&text));
            Problem::new(file, pos, message).with_fix("correct the Lua code on that line")
        }
    }
}

/// A file's call of a global nothing defines (Lua's `attempt to call a nil value (global
/// 'NAME')`), as a misspelt declaration (`agnet { ... }`) is: the declaration it is nearest to,
/// or the declarations the file may make.
fn unknown_declaration(file: &str, error: &mlua::Error, declare: &[&str]) -> Option<Problem> {
    let mlua::Error::RuntimeError(message) = root_cause(error) else {
        return None;
    };
    let (pos, message) = split_position(file, without_traceback(message));
    let name = message
        .strip_prefix("attempt to call a nil value (global '")?
        .strip_suffix("')")?;
    let known: Vec<&str> = declare.iter().copied().chain(["env"]).collect();
    let fix = match perch_core::tree::closest(name, &known) {
        Some(near) => format!("did you mean {near}?"),
        None => format!(
            "{file} declares with {}; a function of your own must be defined before it is called",
            declare.join(", ")
        ),
    };
    Some(
        Problem::new(
            file,
            pos,
            format!(
                "{} is not a perch declaration",
                perch_core::terminal::shown(name)
            ),
        )
        .with_fix(fix),
    )
}

/// What to do about a syntax error Lua noticed on `line`: where a missing comma between two
/// table fields would be, or else the line of the last complete token before the one Lua
/// stopped at, when that is an earlier line.
fn syntax_fix(source: &str, line: u32, message: &str) -> String {
    if line == 0 {
        return "correct the Lua syntax".to_owned();
    }
    if let Some(comma) = lua_source::missing_separator(source, line) {
        return format!(
            "a comma may be missing after line {comma}: separate a table's fields with , or ;"
        );
    }
    let near = message.rsplit_once(" near ").map(|(_, near)| near);
    let before = match near {
        Some("<eof>") => lua_source::line_before_failure(source, line, None),
        Some(near) => near
            .strip_prefix('\'')
            .and_then(|near| near.strip_suffix('\''))
            .and_then(|near| lua_source::line_before_failure(source, line, Some(near))),
        None => None,
    };
    match before {
        Some(before) => format!(
            "correct the Lua syntax on that line, or at the end of line {before}, the last \
             complete code before it"
        ),
        None => "correct the Lua syntax on that line".to_owned(),
    }
}

/// The error a chain of callback and context wrappers was raised for.
fn root_cause(error: &mlua::Error) -> &mlua::Error {
    match error {
        mlua::Error::CallbackError { cause, .. }
        | mlua::Error::WithContext { cause, .. }
        | mlua::Error::BadArgument { cause, .. } => root_cause(cause),
        other => other,
    }
}

fn without_traceback(message: &str) -> &str {
    let end = message.find("stack traceback:").unwrap_or(message.len());
    message[..end].trim_end()
}

/// Splits Lua's `file:LINE: message` into the line and the message. Lua shortens a long chunk
/// name to `...` and its end.
fn split_position<'m>(file: &str, message: &'m str) -> (Pos, &'m str) {
    let mut searched = 0;
    while let Some(offset) = message[searched..].find(':') {
        let colon = searched + offset;
        let rest = &message[colon + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(':') && names_file(&message[..colon], file) {
            let line = rest[..digits].parse().unwrap_or(0);
            return (Pos::line(line), rest[digits + 1..].trim_start());
        }
        searched = colon + 1;
    }
    (Pos::default(), message)
}

fn names_file(prefix: &str, file: &str) -> bool {
    prefix == file
        || prefix
            .strip_prefix("...")
            .is_some_and(|tail| !tail.is_empty() && file.ends_with(tail))
}
