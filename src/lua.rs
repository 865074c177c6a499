//! The Lua evaluator: runs one configuration file in a restricted state and records the calls it
//! makes to the declaring functions (`agent { ... }`, `tool("x", { ... })`) as [`Node`] trees.
//!
//! This is the only module that names `mlua`. The state it builds cannot touch files, processes,
//! the environment or stdout, cannot load bytecode, and stops when it exceeds its [`Limits`].

use crate::sandbox::{Command, End, GUEST_WORKSPACE, Machine};
use mlua::LuaSerdeExt;
use mlua::chunk::ChunkMode;
use mlua::debug::Debug as HookDebug;
use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MetaMethod, MultiValue, StdLib, Table, UserData,
    UserDataMethods, Value as LuaValue, VmState,
};
use perch_core::config::Declaration;
use perch_core::lua_pattern::{Capture, Match, MatchError, Pattern, Steps, find_plain, is_plain};
use perch_core::name::EnvName;
use perch_core::problem::{Pos, Problem};
use perch_core::tree::{FunctionId, Key, Node, Path, Value};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Resource limits for one Lua state.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most memory the state may allocate. Declared values held on the Rust side are held
    /// to the same amount.
    pub memory_bytes: usize,
    /// The most Lua instructions the state may run, counted across everything it runs. The
    /// work of pattern matching and of the table and string functions that loop in C counts
    /// too, about one instruction per element or step.
    pub instructions: u64,
    /// The longest the state may run, checked every thousand instructions; `None` for calls
    /// that spend most of their time waiting (tools, whose commands have their own timeouts).
    pub time: Option<Duration>,
}

impl Limits {
    /// The limits for a configuration file, which runs once when the agent loads.
    pub const CONFIG: Limits = Limits {
        memory_bytes: 32 << 20,
        instructions: 20_000_000,
        time: Some(Duration::from_secs(10)),
    };
}

impl Limits {
    /// The limits for one call of a tool's function; the instruction count starts afresh for
    /// every call, the memory limit covers the whole state.
    pub const TOOL_CALL: Limits = Limits {
        memory_bytes: 64 << 20,
        instructions: 100_000_000,
        time: None,
    };

    /// The limits for one call of a channel's hook (`on_message`, `format`), which runs for
    /// every message and must be quick.
    pub const HOOK_CALL: Limits = Limits {
        memory_bytes: 32 << 20,
        instructions: 10_000_000,
        time: Some(Duration::from_secs(2)),
    };
}

/// A Lua file after it ran: the declarations it made, and the state that holds their functions.
pub struct Evaluation {
    file: String,
    lua: Lua,
    /// Indexed by [`FunctionId`].
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
/// that cannot become a [`Node`].
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
        problems.push(problem_from_error(file, &error, limits));
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

fn prepare_state(
    file: &str,
    declare: &[&str],
    limits: Limits,
    recorder: &Arc<Mutex<Recorder>>,
    budget: &Arc<InstructionBudget>,
) -> mlua::Result<Lua> {
    let libraries = StdLib::STRING
        | StdLib::TABLE
        | StdLib::MATH
        | StdLib::UTF8
        | StdLib::COROUTINE
        | StdLib::OS;
    let lua = Lua::new_with(libraries, LuaOptions::default())?;
    let globals = lua.globals();

    for unsafe_global in ["dofile", "loadfile", "load", "loadstring", "collectgarbage"] {
        globals.raw_remove(unsafe_global)?;
    }
    globals.get::<Table>("string")?.raw_remove("dump")?;

    let full_os: Table = globals.get("os")?;
    let os = lua.create_table()?;
    for harmless in ["time", "clock", "date", "difftime"] {
        os.raw_set(harmless, full_os.get::<Function>(harmless)?)?;
    }
    globals.raw_set("os", os)?;

    let (setmetatable, getmetatable) = metatables_held_apart(&lua, file, budget)?;
    globals.raw_set("setmetatable", setmetatable)?;
    globals.raw_set("getmetatable", getmetatable)?;
    counted_string_functions(&lua, file, limits, budget)?;
    counted_table_functions(&lua, budget)?;
    globals.raw_set("xpcall", xpcall_after_unwinding(&lua, file)?)?;
    globals.raw_set("print", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    lua.set_warning_function(|_, _, _| Ok(()));
    globals.raw_set("env", env_function(&lua, file)?)?;
    for function in declare {
        globals.raw_set(*function, declaring_function(&lua, function, recorder)?)?;
    }

    lua.set_memory_limit(limits.memory_bytes)?;
    budget.install(&lua)?;
    Ok(lua)
}

/// `setmetatable` refusing `__gc` and `__close`, which Lua runs with hooks off (finalizers;
/// the to-be-closed variables of a function the instruction limit stops), outside the limit;
/// and `getmetatable`, which never hands out a metatable in use.
///
/// The metatable a table gets is a copy of the one given, taken at the call, so a metatable
/// changed afterwards (`mt.__close = f`) cannot give a table `__close` later. `getmetatable`
/// returns the table that was given (or its `__metatable` field, as in Lua), and nil for
/// metatables perch set itself (strings', deserialized lists').
fn metatables_held_apart(
    lua: &Lua,
    file: &str,
    budget: &Arc<InstructionBudget>,
) -> mlua::Result<(Function, Function)> {
    let given = lua.create_table()?;
    let weak_keys = lua.create_table()?;
    weak_keys.raw_set("__mode", "k")?;
    given.set_metatable(Some(weak_keys))?;

    let file = file.to_owned();
    let (budget, given_by_copy) = (Arc::clone(budget), given.clone());
    let setmetatable =
        lua.create_function(move |lua, (table, metatable): (LuaValue, LuaValue)| {
            let fix = "call it as setmetatable(table, metatable)";
            let LuaValue::Table(table) = table else {
                let message = format!("setmetatable takes a table, got {}", table.type_name());
                return Err(CallError::raise(lua, &file, message, fix));
            };
            let metatable = match metatable {
                LuaValue::Nil => None,
                LuaValue::Table(metatable) => Some(metatable),
                other => {
                    let message = format!(
                        "setmetatable takes a table or nil as the metatable, got {}",
                        other.type_name()
                    );
                    return Err(CallError::raise(lua, &file, message, fix));
                }
            };
            if let Some(current) = table.metatable()
                && !current.raw_get::<LuaValue>("__metatable")?.is_nil()
            {
                let message = "cannot change a protected metatable".to_owned();
                return Err(CallError::raise(
                    lua,
                    &file,
                    message,
                    "leave that table's metatable as it is",
                ));
            }
            let Some(metatable) = metatable else {
                table.set_metatable(None)?;
                return Ok(table);
            };
            for (refused, fix) in [
                ("__gc", "remove __gc from the metatable"),
                ("__close", "remove __close from the metatable"),
            ] {
                if !metatable.raw_get::<LuaValue>(refused)?.is_nil() {
                    let message = format!("{refused} metamethods are not allowed in configuration");
                    return Err(CallError::raise(lua, &file, message, fix));
                }
            }
            let copy = lua.create_table()?;
            let mut fields = 0;
            for pair in metatable.pairs::<LuaValue, LuaValue>() {
                let (key, value) = pair?;
                copy.raw_set(key, value)?;
                fields += 1;
            }
            budget.charge(lua, fields)?;
            given_by_copy.raw_set(copy.clone(), metatable)?;
            table.set_metatable(Some(copy))?;
            Ok(table)
        })?;

    let getmetatable = lua.create_function(move |_, value: LuaValue| {
        let LuaValue::Table(table) = value else {
            return Ok(LuaValue::Nil);
        };
        let Some(metatable) = table.metatable() else {
            return Ok(LuaValue::Nil);
        };
        let protected: LuaValue = metatable.raw_get("__metatable")?;
        if !protected.is_nil() {
            return Ok(protected);
        }
        given.raw_get(metatable)
    })?;
    Ok((setmetatable, getmetatable))
}

/// The longest string `string.find`, `match`, `gmatch` and `gsub` search. Their work is counted
/// against the instruction limit, so this is not what bounds their time; it is the size of one
/// command's output stream, so a tool can search everything a command printed.
const MAX_PATTERN_SUBJECT_BYTES: usize = 1 << 20;

/// `string.find`, `match`, `gmatch` and `gsub` by [`perch_core::lua_pattern`], whose every step
/// is counted, and `string.rep`, whose repetitions are counted before it runs. Lua's own
/// versions loop in C, where the instruction hook cannot stop them. `("x"):find` is the same
/// function: strings index the `string` table.
fn counted_string_functions(
    lua: &Lua,
    file: &str,
    limits: Limits,
    budget: &Arc<InstructionBudget>,
) -> mlua::Result<()> {
    let string: Table = lua.globals().get("string")?;
    let matching = Arc::new(Matching {
        file: file.to_owned(),
        budget: Arc::clone(budget),
        max_result_bytes: limits.memory_bytes,
    });

    let find = Arc::clone(&matching);
    string.raw_set(
        "find",
        lua.create_function(
            move |lua, (subject, pattern, init, plain): (LuaValue, LuaValue, Option<i64>, LuaValue)| {
                let plain = !matches!(plain, LuaValue::Nil | LuaValue::Boolean(false));
                find.find(lua, &subject, &pattern, init, plain, true)
            },
        )?,
    )?;
    let matcher = Arc::clone(&matching);
    string.raw_set(
        "match",
        lua.create_function(
            move |lua, (subject, pattern, init): (LuaValue, LuaValue, Option<i64>)| {
                matcher.find(lua, &subject, &pattern, init, false, false)
            },
        )?,
    )?;
    let gmatch = Arc::clone(&matching);
    string.raw_set(
        "gmatch",
        lua.create_function(
            move |lua, (subject, pattern, init): (LuaValue, LuaValue, Option<i64>)| {
                gmatch.gmatch(lua, &subject, &pattern, init)
            },
        )?,
    )?;
    let gsub = Arc::clone(&matching);
    string.raw_set(
        "gsub",
        lua.create_function(
            move |lua,
                  (subject, pattern, replacement, most): (
                LuaValue,
                LuaValue,
                LuaValue,
                Option<i64>,
            )| { gsub.gsub(lua, &subject, &pattern, &replacement, most) },
        )?,
    )?;

    let original_rep: Function = string.get("rep")?;
    let rep_budget = Arc::clone(budget);
    string.raw_set(
        "rep",
        lua.create_function(move |lua, args: MultiValue| {
            let times = integer_arg(args.get(1)).unwrap_or(0).max(0);
            let piece = args.iter().take(3).step_by(2).map(|value| match value {
                LuaValue::String(text) => text.as_bytes().len() as u64,
                _ => 0,
            });
            let bytes: u64 = piece.sum();
            let times = times.unsigned_abs();
            let work = 1 + times / 8 + times.saturating_mul(bytes) / 256;
            rep_budget.charge(lua, work)?;
            original_rep.call::<MultiValue>(args)
        })?,
    )?;
    Ok(())
}

/// `table.insert`, `remove`, `move`, `concat` and `sort`, with the elements they go through in
/// C counted before they run: one call could otherwise shift or visit billions of elements
/// (`table.move({}, 1, 1e12, 2)`) on a single instruction.
fn counted_table_functions(lua: &Lua, budget: &Arc<InstructionBudget>) -> mlua::Result<()> {
    let table: Table = lua.globals().get("table")?;
    type Work = fn(&MultiValue) -> mlua::Result<u64>;
    let counted: [(&str, Work); 5] = [
        ("insert", |args| {
            if args.len() < 3 {
                return Ok(1);
            }
            let length = table_length(args)?;
            let position = integer_arg(args.get(1)).unwrap_or(length);
            Ok(distance(position, length))
        }),
        ("remove", |args| {
            if args.len() < 2 {
                return Ok(1);
            }
            let length = table_length(args)?;
            let position = integer_arg(args.get(1)).unwrap_or(length);
            Ok(distance(position, length))
        }),
        ("move", |args| {
            let first = integer_arg(args.get(1)).unwrap_or(1);
            let last = integer_arg(args.get(2)).unwrap_or(0);
            Ok(distance(first, last))
        }),
        ("concat", |args| {
            let first = integer_arg(args.get(2)).unwrap_or(1);
            let last = match integer_arg(args.get(3)) {
                Some(last) => last,
                None => table_length(args)?,
            };
            Ok(distance(first, last))
        }),
        ("sort", |args| {
            let length = table_length(args)?.max(1).unsigned_abs();
            Ok(length.saturating_mul(u64::from(64 - length.leading_zeros())))
        }),
    ];
    for (name, work) in counted {
        let original: Function = table.get(name)?;
        let budget = Arc::clone(budget);
        table.raw_set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                budget.charge(lua, work(&args)?)?;
                original.call::<MultiValue>(args)
            })?,
        )?;
    }
    Ok(())
}

/// `#t` for the table a table function was given (its `__len` included, as the C code uses it).
fn table_length(args: &MultiValue) -> mlua::Result<i64> {
    match args.front() {
        Some(LuaValue::Table(table)) => table.len(),
        _ => Ok(0),
    }
}

/// The elements from `first` to `last`, at least one.
fn distance(first: i64, last: i64) -> u64 {
    last.saturating_sub(first)
        .saturating_add(1)
        .max(1)
        .unsigned_abs()
}

/// An integer argument as Lua would read it, when it is one.
fn integer_arg(value: Option<&LuaValue>) -> Option<i64> {
    match value? {
        LuaValue::Integer(number) => Some(*number),
        LuaValue::Number(number) if number.is_finite() => Some(*number as i64),
        _ => None,
    }
}

/// What the counted pattern functions share: the file for errors and the budget they spend.
struct Matching {
    file: String,
    budget: Arc<InstructionBudget>,
    /// The longest string `gsub` builds, as the state's memory limit would allow.
    max_result_bytes: usize,
}

impl Matching {
    fn error(&self, lua: &Lua, function: &str, message: String) -> mlua::Error {
        CallError::raise(
            lua,
            &self.file,
            format!("string.{function}: {message}"),
            "correct the call on that line",
        )
    }

    /// A string argument (numbers become their text, as in Lua), at most
    /// [`MAX_PATTERN_SUBJECT_BYTES`] long.
    fn text(
        &self,
        lua: &Lua,
        function: &str,
        position: usize,
        value: &LuaValue,
    ) -> mlua::Result<Vec<u8>> {
        let text = match value {
            LuaValue::String(text) => text.as_bytes().to_vec(),
            LuaValue::Integer(_) | LuaValue::Number(_) => match lua.coerce_string(value.clone())? {
                Some(text) => text.as_bytes().to_vec(),
                None => Vec::new(),
            },
            other => {
                let message = format!(
                    "bad argument #{position} (string expected, got {})",
                    other.type_name()
                );
                return Err(self.error(lua, function, message));
            }
        };
        if text.len() > MAX_PATTERN_SUBJECT_BYTES {
            let message = format!(
                "argument #{position} is {} bytes; patterns work on strings of at most {}",
                text.len(),
                mebibytes(MAX_PATTERN_SUBJECT_BYTES)
            );
            return Err(self.error(lua, function, message));
        }
        Ok(text)
    }

    /// Runs `work` with what is left of the budget, and counts what it used.
    fn counted<T>(
        &self,
        lua: &Lua,
        function: &str,
        work: impl FnOnce(&mut Steps) -> Result<T, MatchError>,
    ) -> mlua::Result<T> {
        let mut steps = Steps {
            left: self.budget.remaining(),
        };
        let before = steps.left;
        let result = work(&mut steps);
        match result {
            Ok(value) => {
                self.budget.charge(lua, before - steps.left)?;
                Ok(value)
            }
            Err(MatchError::OutOfSteps) => Err(self.budget.stop(lua, calling_line(lua))),
            Err(MatchError::Pattern(message)) => Err(self.error(lua, function, message)),
        }
    }

    fn capture_value(lua: &Lua, subject: &[u8], capture: Capture) -> mlua::Result<LuaValue> {
        Ok(match capture {
            Capture::Text { start, end } => {
                LuaValue::String(lua.create_string(&subject[start..end])?)
            }
            Capture::Position(at) => LuaValue::Integer(i64::try_from(at + 1).unwrap_or(i64::MAX)),
        })
    }

    fn values(
        lua: &Lua,
        subject: &[u8],
        captures: impl IntoIterator<Item = Capture>,
    ) -> mlua::Result<MultiValue> {
        captures
            .into_iter()
            .map(|capture| Self::capture_value(lua, subject, capture))
            .collect()
    }

    /// `string.find` (`find` true) and `string.match`.
    fn find(
        &self,
        lua: &Lua,
        subject: &LuaValue,
        pattern: &LuaValue,
        init: Option<i64>,
        plain: bool,
        find: bool,
    ) -> mlua::Result<MultiValue> {
        let function = if find { "find" } else { "match" };
        let subject = self.text(lua, function, 1, subject)?;
        let pattern = self.text(lua, function, 2, pattern)?;
        let Some(init) = start_index(init, subject.len()) else {
            return Ok(MultiValue::from_iter([LuaValue::Nil]));
        };
        let one_based = |at: usize| LuaValue::Integer(i64::try_from(at).unwrap_or(i64::MAX));
        if find && (plain || is_plain(&pattern)) {
            let found = self.counted(lua, function, |steps| {
                find_plain(&subject, &pattern, init, steps)
            })?;
            return Ok(match found {
                Some(at) => {
                    MultiValue::from_iter([one_based(at + 1), one_based(at + pattern.len())])
                }
                None => MultiValue::from_iter([LuaValue::Nil]),
            });
        }
        let found = self.counted(lua, function, |steps| {
            Pattern::new(&pattern).find(&subject, init, steps)
        })?;
        let Some(found) = found else {
            return Ok(MultiValue::from_iter([LuaValue::Nil]));
        };
        if find {
            let mut values =
                MultiValue::from_iter([one_based(found.start + 1), one_based(found.end)]);
            values.extend(Self::values(lua, &subject, found.captures.iter().copied())?);
            Ok(values)
        } else {
            Self::values(lua, &subject, found.values())
        }
    }

    fn gmatch(
        self: &Arc<Self>,
        lua: &Lua,
        subject: &LuaValue,
        pattern: &LuaValue,
        init: Option<i64>,
    ) -> mlua::Result<Function> {
        let subject = self.text(lua, "gmatch", 1, subject)?;
        let pattern = self.text(lua, "gmatch", 2, pattern)?;
        let start = start_index(init, subject.len()).unwrap_or(subject.len() + 1);
        let position = Mutex::new((start, None::<usize>));
        let matching = Arc::clone(self);
        lua.create_function(move |lua, ()| {
            let mut position = position.lock().unwrap_or_else(PoisonError::into_inner);
            let (mut at, last_match) = *position;
            while at <= subject.len() {
                let found = matching.counted(lua, "gmatch", |steps| {
                    Pattern::without_anchor(&pattern).match_at(&subject, at, steps)
                })?;
                if let Some(found) = found
                    && Some(found.end) != last_match
                {
                    *position = (found.end, Some(found.end));
                    return Self::values(lua, &subject, found.values());
                }
                at += 1;
            }
            *position = (at, last_match);
            Ok(MultiValue::new())
        })
    }

    fn gsub(
        &self,
        lua: &Lua,
        subject_value: &LuaValue,
        pattern: &LuaValue,
        replacement: &LuaValue,
        most: Option<i64>,
    ) -> mlua::Result<(LuaValue, i64)> {
        let subject = self.text(lua, "gsub", 1, subject_value)?;
        let pattern = self.text(lua, "gsub", 2, pattern)?;
        let replacement = match replacement {
            LuaValue::String(_) | LuaValue::Integer(_) | LuaValue::Number(_) => {
                Replacement::Text(self.text(lua, "gsub", 3, replacement)?)
            }
            LuaValue::Table(table) => Replacement::Table(table.clone()),
            LuaValue::Function(function) => Replacement::Function(function.clone()),
            other => {
                let message = format!(
                    "bad argument #3 (string/function/table expected, got {})",
                    other.type_name()
                );
                return Err(self.error(lua, "gsub", message));
            }
        };
        let most = most.unwrap_or(i64::MAX);
        let pattern = Pattern::new(&pattern);
        let mut built: Vec<u8> = Vec::new();
        let (mut at, mut last_match, mut count, mut changed) = (0, None, 0_i64, false);
        while count < most {
            let found = self.counted(lua, "gsub", |steps| pattern.match_at(&subject, at, steps))?;
            match found {
                Some(found) if Some(found.end) != last_match => {
                    count += 1;
                    changed |= self.replace(lua, &subject, &found, &replacement, &mut built)?;
                    at = found.end;
                    last_match = Some(found.end);
                }
                _ if at < subject.len() => {
                    built.push(subject[at]);
                    at += 1;
                }
                _ => break,
            }
            if built.len() > self.max_result_bytes {
                let message = format!(
                    "the result would be larger than {}",
                    mebibytes(self.max_result_bytes)
                );
                return Err(self.error(lua, "gsub", message));
            }
            if pattern.is_anchored() {
                break;
            }
        }
        if !changed {
            return Ok((LuaValue::String(lua.create_string(&subject)?), count));
        }
        built.extend_from_slice(&subject[at..]);
        Ok((LuaValue::String(lua.create_string(&built)?), count))
    }

    /// Appends what replaces `found`; false when the original text was kept.
    fn replace(
        &self,
        lua: &Lua,
        subject: &[u8],
        found: &Match,
        replacement: &Replacement,
        built: &mut Vec<u8>,
    ) -> mlua::Result<bool> {
        let whole = &subject[found.start..found.end];
        let value = match replacement {
            Replacement::Text(text) => {
                let mut rest = text.as_slice();
                while let Some(percent) = rest.iter().position(|byte| *byte == b'%') {
                    built.extend_from_slice(&rest[..percent]);
                    let escaped = rest.get(percent + 1).copied();
                    match escaped {
                        Some(b'%') => built.push(b'%'),
                        Some(b'0') => built.extend_from_slice(whole),
                        Some(digit @ b'1'..=b'9') => {
                            let capture = found
                                .capture(usize::from(digit - b'1'))
                                .map_err(|error| self.pattern_error(lua, error))?;
                            match capture {
                                Capture::Text { start, end } => {
                                    built.extend_from_slice(&subject[start..end]);
                                }
                                Capture::Position(at) => {
                                    built.extend_from_slice((at + 1).to_string().as_bytes());
                                }
                            }
                        }
                        _ => {
                            let message = "invalid use of '%' in replacement string".to_owned();
                            return Err(self.error(lua, "gsub", message));
                        }
                    }
                    rest = &rest[(percent + 2).min(rest.len())..];
                }
                built.extend_from_slice(rest);
                self.budget.charge(lua, 1 + text.len() as u64 / 64)?;
                return Ok(true);
            }
            Replacement::Table(table) => {
                let first = found
                    .capture(0)
                    .map_err(|error| self.pattern_error(lua, error))?;
                table.get::<LuaValue>(Self::capture_value(lua, subject, first)?)?
            }
            Replacement::Function(function) => {
                function.call::<LuaValue>(Self::values(lua, subject, found.values())?)?
            }
        };
        match value {
            LuaValue::Nil | LuaValue::Boolean(false) => {
                built.extend_from_slice(whole);
                Ok(false)
            }
            LuaValue::String(_) | LuaValue::Integer(_) | LuaValue::Number(_) => {
                if let Some(text) = lua.coerce_string(value)? {
                    built.extend_from_slice(&text.as_bytes());
                    self.budget.charge(lua, 1 + built.len() as u64 / 4096)?;
                }
                Ok(true)
            }
            other => {
                let message = format!("invalid replacement value (a {})", other.type_name());
                Err(self.error(lua, "gsub", message))
            }
        }
    }

    fn pattern_error(&self, lua: &Lua, error: MatchError) -> mlua::Error {
        match error {
            MatchError::OutOfSteps => self.budget.stop(lua, calling_line(lua)),
            MatchError::Pattern(message) => self.error(lua, "gsub", message),
        }
    }
}

enum Replacement {
    Text(Vec<u8>),
    Table(Table),
    Function(Function),
}

/// Lua's `init` argument (1-based, negative from the end) as a 0-based offset; `None` when it
/// starts past the end.
fn start_index(init: Option<i64>, length: usize) -> Option<usize> {
    let length_i = i64::try_from(length).unwrap_or(i64::MAX);
    let one_based = match init.unwrap_or(1) {
        positive if positive > 0 => positive,
        0 => 1,
        negative if negative < -length_i => 1,
        negative => length_i + negative + 1,
    };
    let offset = usize::try_from(one_based - 1).ok()?;
    (offset <= length).then_some(offset)
}

/// `xpcall` running its message handler once the error has unwound, like `pcall` and then a call.
/// Lua runs a message handler with hooks off when the error came from a hook, which would let
/// the handler run outside the instruction limit.
fn xpcall_after_unwinding(lua: &Lua, file: &str) -> mlua::Result<Function> {
    let pcall: Function = lua.globals().get("pcall")?;
    let file = file.to_owned();
    lua.create_function(move |lua, mut args: MultiValue| {
        let function = args.pop_front().unwrap_or(LuaValue::Nil);
        let handler = args.pop_front().unwrap_or(LuaValue::Nil);
        let LuaValue::Function(handler) = handler else {
            let message = format!(
                "xpcall takes a message handler function, got {}",
                handler.type_name()
            );
            return Err(CallError::raise(
                lua,
                &file,
                message,
                "call it as xpcall(f, handler, ...)",
            ));
        };
        args.push_front(function);
        let mut results: MultiValue = pcall.call(args)?;
        if matches!(results.front(), Some(LuaValue::Boolean(true))) {
            return Ok(results);
        }
        let error = results
            .get_mut(1)
            .map(std::mem::take)
            .unwrap_or(LuaValue::Nil);
        let handled: LuaValue = handler.call(error)?;
        Ok(MultiValue::from_iter([LuaValue::Boolean(false), handled]))
    })
}

/// What `env "NAME"` returns: the name of a host environment variable, never its value.
struct EnvReference(EnvName);

impl UserData for EnvReference {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::ToString, |_, reference, ()| {
            Ok(format!("env(\"{}\")", reference.0))
        });
    }
}

fn env_function(lua: &Lua, file: &str) -> mlua::Result<Function> {
    let file = file.to_owned();
    lua.create_function(move |lua, name: LuaValue| {
        let text = match &name {
            LuaValue::String(text) => text.to_str().ok().map(|text| text.to_owned()),
            _ => None,
        };
        let Some(text) = text else {
            return Err(CallError::raise(
                lua,
                &file,
                format!(
                    "env takes a variable name as a string, got {}",
                    name.type_name()
                ),
                "write it as env \"GITHUB_TOKEN\"",
            ));
        };
        match EnvName::try_from(text.as_str()) {
            Ok(name) => lua.create_userdata(EnvReference(name)),
            Err(_) => Err(CallError::raise(
                lua,
                &file,
                format!(
                    "env {text:?}: not a valid variable name ({})",
                    EnvName::RULE
                ),
                "use the variable's exact name, such as GITHUB_TOKEN",
            )),
        }
    })
}

/// An error a perch function raises in Lua, with the line of the Lua call that caused it.
#[derive(Debug)]
struct CallError {
    file: String,
    line: u32,
    message: String,
    fix: &'static str,
}

impl CallError {
    fn raise(lua: &Lua, file: &str, message: String, fix: &'static str) -> mlua::Error {
        mlua::Error::external(CallError {
            file: file.to_owned(),
            line: calling_line(lua),
            message,
            fix,
        })
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

impl std::error::Error for CallError {}

/// The line of the nearest Lua code on the stack of a Rust function called from Lua; 0 when
/// there is none.
fn calling_line(lua: &Lua) -> u32 {
    const LEVELS_SEARCHED: usize = 8;
    (1..=LEVELS_SEARCHED)
        .find_map(|level| {
            lua.inspect_stack(level, |frame| frame.current_line())
                .flatten()
        })
        .and_then(|line| u32::try_from(line).ok())
        .unwrap_or(0)
}

fn declaring_function(
    lua: &Lua,
    function: &str,
    recorder: &Arc<Mutex<Recorder>>,
) -> mlua::Result<Function> {
    let function = function.to_owned();
    let recorder = Arc::clone(recorder);
    lua.create_function(move |lua, args: MultiValue| {
        let pos = Pos::line(calling_line(lua));
        let mut conversion = Conversion {
            recorder: &recorder,
            pos,
            open_tables: Vec::new(),
        };
        let args = args
            .into_iter()
            .map(|arg| conversion.node(arg, &Path::root()))
            .collect();
        lock(&recorder).declarations.push(Declaration {
            function: function.clone(),
            pos,
            args,
        });
        Ok(())
    })
}

/// What the declaring functions collect while the file runs.
struct Recorder {
    file: String,
    declarations: Vec<Declaration>,
    functions: Vec<Function>,
    problems: Vec<Problem>,
    memory_limit: usize,
    remaining_bytes: usize,
}

impl Recorder {
    fn new(file: &str, memory_limit: usize) -> Self {
        Recorder {
            file: file.to_owned(),
            declarations: Vec::new(),
            functions: Vec::new(),
            problems: Vec::new(),
            memory_limit,
            remaining_bytes: memory_limit,
        }
    }
}

fn lock(recorder: &Mutex<Recorder>) -> MutexGuard<'_, Recorder> {
    recorder.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How deep tables may nest inside one declaration.
const MAX_DEPTH: usize = 32;

/// How many functions one file may declare; each holds a slot in the Lua state for as long as
/// the evaluation lives.
const MAX_FUNCTIONS: usize = 10_000;

/// Converts the arguments of one declaring call. Every node gets the line of the call.
struct Conversion<'r> {
    recorder: &'r Mutex<Recorder>,
    pos: Pos,
    /// The tables enclosing the value being converted, to find cycles.
    open_tables: Vec<*const c_void>,
}

impl Conversion<'_> {
    fn node(&mut self, value: LuaValue, path: &Path) -> Node {
        Node {
            pos: self.pos,
            value: self.value(value, path),
        }
    }

    fn value(&mut self, value: LuaValue, path: &Path) -> Value {
        if !self.charge(size_of::<Node>(), path) {
            return Value::Nil;
        }
        match value {
            LuaValue::Nil => Value::Nil,
            LuaValue::Boolean(flag) => Value::Bool(flag),
            LuaValue::Integer(number) => Value::Int(number),
            LuaValue::Number(number) => Value::Float(number),
            LuaValue::String(text) => match text.to_str() {
                Ok(text) if self.charge(text.len(), path) => Value::Str(text.to_owned()),
                Ok(_) => Value::Nil,
                Err(_) => {
                    self.report(
                        path,
                        "a string is not valid UTF-8",
                        "write text as UTF-8; encode binary data, e.g. as hex",
                    );
                    Value::Nil
                }
            },
            LuaValue::Table(table) => self.table(&table, path),
            LuaValue::Function(function) => self.function(function, path),
            LuaValue::UserData(userdata) => match userdata.borrow::<EnvReference>() {
                Ok(reference) => Value::Env(reference.0.to_string()),
                Err(_) => self.unsupported("a userdata value", path),
            },
            LuaValue::LightUserData(_) => self.unsupported("a light userdata value", path),
            LuaValue::Thread(_) => self.unsupported("a coroutine", path),
            LuaValue::Error(_) => self.unsupported("an error value", path),
            _ => self.unsupported("this kind of value", path),
        }
    }

    fn function(&mut self, function: Function, path: &Path) -> Value {
        let mut recorder = lock(self.recorder);
        if recorder.functions.len() >= MAX_FUNCTIONS {
            drop(recorder);
            self.report(
                path,
                &format!("the file declares more than {MAX_FUNCTIONS} functions"),
                "declare fewer functions",
            );
            return Value::Nil;
        }
        recorder.functions.push(function);
        Value::Function(FunctionId(recorder.functions.len() - 1))
    }

    fn table(&mut self, table: &Table, path: &Path) -> Value {
        let pointer = table.to_pointer();
        if self.open_tables.contains(&pointer) {
            self.report(
                path,
                "a table contains itself",
                "remove the reference back to the enclosing table",
            );
            return Value::Nil;
        }
        if self.open_tables.len() >= MAX_DEPTH {
            self.report(
                path,
                &format!("tables nest deeper than {MAX_DEPTH} levels"),
                "flatten the declaration",
            );
            return Value::Nil;
        }
        self.open_tables.push(pointer);
        let value = self.table_entries(table, path);
        self.open_tables.pop();
        value
    }

    /// Reads the keys first and converts the values in key order, so function ids and problems
    /// do not depend on Lua's hash order.
    fn table_entries(&mut self, table: &Table, path: &Path) -> Value {
        let mut indexes: Vec<i64> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let mut odd_key: Option<String> = None;
        for pair in table.pairs::<LuaValue, LuaValue>() {
            let Ok((key, _)) = pair else {
                self.report(path, "a table could not be read", "simplify the table");
                return Value::Nil;
            };
            match key {
                LuaValue::Integer(index) if index >= 1 => indexes.push(index),
                LuaValue::String(name) => match name.to_str() {
                    Ok(name) if self.charge(name.len(), path) => names.push(name.to_owned()),
                    Ok(_) => return Value::Nil,
                    Err(_) => odd_key = Some("a key that is not valid UTF-8".to_owned()),
                },
                LuaValue::Integer(index) => odd_key = Some(format!("the key [{index}]")),
                LuaValue::Number(number) => odd_key = Some(format!("the key [{number}]")),
                other => odd_key = Some(format!("a {} key", other.type_name())),
            }
        }

        if let Some(odd_key) = odd_key {
            self.report(
                path,
                &format!("a table has {odd_key}; keys must be names or list positions 1, 2, 3..."),
                "use a list { a, b } or named keys { a = 1 }",
            );
            return Value::Nil;
        }
        if !indexes.is_empty() && !names.is_empty() {
            self.report(
                path,
                "a table mixes list items and named keys",
                "use either a list { a, b } or named keys { a = 1 }, not both",
            );
            return Value::Nil;
        }
        if !indexes.is_empty() {
            indexes.sort_unstable();
            let numbered_from_one = indexes
                .iter()
                .zip(1_i64..)
                .all(|(index, expected)| *index == expected);
            if !numbered_from_one {
                self.report(
                    path,
                    "a list has gaps: its items must be numbered 1, 2, 3... without holes",
                    "remove the nil items and explicit indexes from the list",
                );
                return Value::Nil;
            }
            let mut items = Vec::with_capacity(indexes.len());
            for (zero_based, index) in indexes.into_iter().enumerate() {
                let item_path = path.index(zero_based);
                let Some(value) = self.raw_get(table, index, &item_path) else {
                    return Value::Nil;
                };
                items.push(self.node(value, &item_path));
            }
            return Value::List(items);
        }
        names.sort_unstable();
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            let entry_path = path.key(&name);
            let Some(value) = self.raw_get(table, name.as_str(), &entry_path) else {
                return Value::Nil;
            };
            let node = self.node(value, &entry_path);
            entries.push((
                Key {
                    name,
                    pos: self.pos,
                },
                node,
            ));
        }
        Value::Map(entries)
    }

    fn raw_get(&mut self, table: &Table, key: impl mlua::IntoLua, path: &Path) -> Option<LuaValue> {
        match table.raw_get(key) {
            Ok(value) => Some(value),
            Err(_) => {
                self.report(path, "a value could not be read", "simplify the table");
                None
            }
        }
    }

    fn unsupported(&mut self, what: &str, path: &Path) -> Value {
        self.report(
            path,
            &format!("{what} cannot be declared"),
            "use nil, booleans, numbers, strings, tables, functions or env \"NAME\"",
        );
        Value::Nil
    }

    /// Counts `bytes` against the data all declarations of the file may hold; false, reported
    /// once, when they would hold more than the memory limit.
    fn charge(&mut self, bytes: usize, path: &Path) -> bool {
        let mut recorder = lock(self.recorder);
        if let Some(remaining) = recorder.remaining_bytes.checked_sub(bytes) {
            recorder.remaining_bytes = remaining;
            return true;
        }
        let first_time = recorder.remaining_bytes > 0;
        recorder.remaining_bytes = 0;
        let limit = mebibytes(recorder.memory_limit);
        drop(recorder);
        if first_time {
            self.report(
                path,
                &format!("the declarations hold more than {limit} of data"),
                "declare less: configuration should be small",
            );
        }
        false
    }

    fn report(&mut self, path: &Path, message: &str, fix: &str) {
        let mut recorder = lock(self.recorder);
        let problem = Problem::new(recorder.file.clone(), self.pos, message)
            .with_path(path.as_str())
            .with_fix(fix);
        recorder.problems.push(problem);
    }
}

/// Counts the instructions a state runs and stops it when they pass the limit or the call
/// runs past its deadline.
struct InstructionBudget {
    limit: AtomicU64,
    used: AtomicU64,
    exhausted: AtomicBool,
    /// The line running when the limit was passed; 0 when unknown.
    stopped_on_line: AtomicU32,
    /// When the running call must stop, and how long it was given.
    deadline: Mutex<Option<(Instant, Duration)>>,
    /// Set when the deadline rather than the instruction count stopped the call.
    overtime: AtomicBool,
}

impl InstructionBudget {
    /// Instructions between two checks of the budget while it lasts.
    const STEP: u32 = 1000;

    fn new(limits: Limits) -> Self {
        InstructionBudget {
            limit: AtomicU64::new(limits.instructions),
            used: AtomicU64::new(0),
            exhausted: AtomicBool::new(false),
            stopped_on_line: AtomicU32::new(0),
            deadline: Mutex::new(Self::deadline_for(limits)),
            overtime: AtomicBool::new(false),
        }
    }

    fn deadline_for(limits: Limits) -> Option<(Instant, Duration)> {
        limits.time.map(|time| (Instant::now() + time, time))
    }

    fn is_overtime(&self) -> bool {
        let deadline = *self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        deadline.is_some_and(|(at, _)| Instant::now() >= at)
    }

    /// The instructions left to the running call.
    fn remaining(&self) -> u64 {
        if self.is_exhausted() {
            return 0;
        }
        self.limit
            .load(Ordering::Relaxed)
            .saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// Counts `work` done in C on behalf of the running call; an error, as when the hook stops
    /// the call, when it does not fit in what is left.
    fn charge(self: &Arc<Self>, lua: &Lua, work: u64) -> mlua::Result<()> {
        let used = self
            .used
            .fetch_add(work, Ordering::Relaxed)
            .saturating_add(work);
        if used <= self.limit.load(Ordering::Relaxed) && !self.is_exhausted() {
            return Ok(());
        }
        Err(self.stop(lua, calling_line(lua)))
    }

    /// Marks the budget spent and makes every further instruction fail.
    fn stop(self: &Arc<Self>, lua: &Lua, line: u32) -> mlua::Error {
        if !self.exhausted.swap(true, Ordering::Relaxed) {
            self.stopped_on_line.store(line, Ordering::Relaxed);
        }
        // A `pcall` may catch the error; failing again on the very next instruction, wherever it
        // is, leaves the file no instruction to carry on with.
        if let Err(error) = self.install_every(lua, 1) {
            return error;
        }
        mlua::Error::runtime(self.message())
    }

    /// A global hook reaches the coroutines the file creates as well as the main chunk.
    fn install(self: &Arc<Self>, lua: &Lua) -> mlua::Result<()> {
        self.install_every(lua, Self::STEP)
    }

    fn install_every(self: &Arc<Self>, lua: &Lua, instructions: u32) -> mlua::Result<()> {
        let budget = Arc::clone(self);
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(instructions),
            move |lua, frame| budget.spend(lua, frame, instructions),
        )
    }

    fn spend(
        self: &Arc<Self>,
        lua: &Lua,
        frame: &HookDebug,
        instructions: u32,
    ) -> mlua::Result<VmState> {
        let used = self
            .used
            .fetch_add(u64::from(instructions), Ordering::Relaxed)
            .saturating_add(u64::from(instructions));
        let overtime = !self.is_exhausted() && self.is_overtime();
        if used <= self.limit.load(Ordering::Relaxed) && !self.is_exhausted() && !overtime {
            return Ok(VmState::Continue);
        }
        if overtime {
            self.overtime.store(true, Ordering::Relaxed);
        }
        let line = frame
            .current_line()
            .and_then(|line| u32::try_from(line).ok())
            .unwrap_or(0);
        Err(self.stop(lua, line))
    }

    /// A fresh budget for the next call.
    fn renew(self: &Arc<Self>, lua: &Lua, limits: Limits) -> mlua::Result<()> {
        self.limit.store(limits.instructions, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
        self.exhausted.store(false, Ordering::Relaxed);
        self.overtime.store(false, Ordering::Relaxed);
        self.stopped_on_line.store(0, Ordering::Relaxed);
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = Self::deadline_for(limits);
        self.install(lua)
    }

    fn is_exhausted(&self) -> bool {
        self.exhausted.load(Ordering::Relaxed)
    }

    fn message(&self) -> String {
        let deadline = *self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        match deadline {
            Some((_, time)) if self.overtime.load(Ordering::Relaxed) => format!(
                "stopped after running for {} s (an endless loop, or work too slow for Lua?)",
                time.as_secs_f64()
            ),
            _ => format!(
                "stopped after {} Lua instructions (an endless loop?)",
                self.limit.load(Ordering::Relaxed)
            ),
        }
    }

    fn problem(&self, file: &str) -> Problem {
        let line = self.stopped_on_line.load(Ordering::Relaxed);
        Problem::new(file, Pos::line(line), self.message())
            .with_fix("make the file finish: configuration runs once at load")
    }
}

fn mebibytes(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        #[expect(clippy::cast_precision_loss, reason = "a rounded size for a message")]
        let mib = bytes as f64 / MIB as f64;
        format!("{mib:.2} MiB")
    }
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
            Problem::new(file, pos, message).with_fix("correct the Lua syntax on that line")
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

/// The small key-value store a channel's hooks see as their `store` argument: string keys,
/// JSON values, at most [`HookStore::MAX_BYTES`] as JSON. The shell keeps one per channel and
/// persists it; a hook call works on it directly, so the caller decides whether to keep what a
/// call changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookStore {
    entries: BTreeMap<String, serde_json::Value>,
    /// The length of the store as a JSON object, give or take one byte.
    bytes: usize,
}

impl HookStore {
    /// The most the store may hold, as JSON text.
    pub const MAX_BYTES: usize = 1 << 20;
    /// The longest key, in bytes.
    pub const MAX_KEY_BYTES: usize = 256;

    /// A store holding `entries`; refused when they are more than [`HookStore::MAX_BYTES`].
    pub fn new(entries: BTreeMap<String, serde_json::Value>) -> Result<HookStore, String> {
        let mut store = HookStore::default();
        for (key, value) in entries {
            store.set(key, value)?;
        }
        Ok(store)
    }

    /// Every entry, in key order.
    pub fn entries(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.entries
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.entries.get(key)
    }

    /// Sets `key` to `value` (`null` deletes it); refused, leaving the store as it was, when
    /// the key is empty or too long or the store would grow past [`HookStore::MAX_BYTES`].
    pub fn set(&mut self, key: String, value: serde_json::Value) -> Result<(), String> {
        if key.is_empty() || key.len() > HookStore::MAX_KEY_BYTES {
            return Err(format!(
                "a store key must be 1 to {} bytes long",
                HookStore::MAX_KEY_BYTES
            ));
        }
        if value.is_null() {
            self.delete(&key);
            return Ok(());
        }
        let old = self
            .entries
            .get(&key)
            .map_or(0, |old| entry_bytes(&key, old));
        let new = entry_bytes(&key, &value);
        let total = self.bytes.max(2) - old + new;
        if total > HookStore::MAX_BYTES {
            return Err(format!(
                "the store would hold more than {} (it holds {} bytes)",
                mebibytes(HookStore::MAX_BYTES),
                self.bytes
            ));
        }
        self.bytes = total;
        self.entries.insert(key, value);
        Ok(())
    }

    /// Removes `key`, if it is there.
    pub fn delete(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= entry_bytes(key, &old);
        }
    }
}

/// The bytes one entry takes in the store's JSON: the quoted key, a colon, the value, a comma.
fn entry_bytes(key: &str, value: &serde_json::Value) -> usize {
    let key = serde_json::to_string(key).map_or(key.len() + 2, |quoted| quoted.len());
    let value = serde_json::to_string(value).map_or(0, |text| text.len());
    key + value + 2
}

/// The store as the hook sees it, for the length of one call.
struct LiveStore {
    store: HookStore,
    /// Set when the call is over: a hook that kept `store` somewhere cannot use it later.
    closed: bool,
}

fn lock_store(store: &Mutex<LiveStore>) -> MutexGuard<'_, LiveStore> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// JSON null becomes `nil`, so absent values read as absent.
const TO_LUA: mlua::serde::SerializeOptions = mlua::serde::SerializeOptions::new()
    .serialize_none_to_null(false)
    .serialize_unit_to_null(false);

fn from_lua_options() -> mlua::serde::DeserializeOptions {
    mlua::serde::DeserializeOptions::new().sort_keys(true)
}

/// `store.get(key)`, `store.set(key, value)` and `store.delete(key)`.
fn store_table(lua: &Lua, file: &str, live: &Arc<Mutex<LiveStore>>) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    let open = |lua: &Lua, live: &Arc<Mutex<LiveStore>>, file: &str, function: &str| {
        if lock_store(live).closed {
            return Err(CallError::raise(
                lua,
                file,
                format!("store.{function}: the store is usable only while the hook runs"),
                "use the store argument of the current call",
            ));
        }
        Ok(())
    };
    let key_of = |lua: &Lua, file: &str, function: &str, key: LuaValue| match key {
        LuaValue::String(text) => text.to_str().map(|text| text.to_owned()).map_err(|_| {
            CallError::raise(
                lua,
                file,
                format!("store.{function}: the key is not UTF-8"),
                "use a text key",
            )
        }),
        other => Err(CallError::raise(
            lua,
            file,
            format!(
                "store.{function} takes a string key, got {}",
                other.type_name()
            ),
            "call it as store.get(\"key\"), with a dot",
        )),
    };

    let (get_live, get_file) = (Arc::clone(live), file.to_owned());
    table.raw_set(
        "get",
        lua.create_function(move |lua, key: LuaValue| {
            open(lua, &get_live, &get_file, "get")?;
            let key = key_of(lua, &get_file, "get", key)?;
            match lock_store(&get_live).store.get(&key) {
                Some(value) => lua.to_value_with(value, TO_LUA),
                None => Ok(LuaValue::Nil),
            }
        })?,
    )?;

    let (set_live, set_file) = (Arc::clone(live), file.to_owned());
    table.raw_set(
        "set",
        lua.create_function(move |lua, (key, value): (LuaValue, LuaValue)| {
            open(lua, &set_live, &set_file, "set")?;
            let key = key_of(lua, &set_file, "set", key)?;
            let value: serde_json::Value = match value {
                LuaValue::Nil => serde_json::Value::Null,
                value => lua
                    .from_value_with(value, from_lua_options())
                    .map_err(|error| {
                        CallError::raise(
                            lua,
                            &set_file,
                            format!("store.set({key:?}): the value cannot be stored: {error}"),
                            "store strings, numbers, booleans and tables of them",
                        )
                    })?,
            };
            lock_store(&set_live)
                .store
                .set(key, value)
                .map_err(|message| {
                    CallError::raise(
                        lua,
                        &set_file,
                        format!("store.set: {message}"),
                        "keep less in the store; delete what is no longer needed",
                    )
                })
        })?,
    )?;

    let (delete_live, delete_file) = (Arc::clone(live), file.to_owned());
    table.raw_set(
        "delete",
        lua.create_function(move |lua, key: LuaValue| {
            open(lua, &delete_live, &delete_file, "delete")?;
            let key = key_of(lua, &delete_file, "delete", key)?;
            lock_store(&delete_live).store.delete(&key);
            Ok(())
        })?,
    )?;
    Ok(table)
}

/// `file:line: message`, without the fix.
fn located(problem: &Problem) -> String {
    if problem.pos.line > 0 {
        format!("{}:{}: {}", problem.file, problem.pos.line, problem.message)
    } else {
        format!("{}: {}", problem.file, problem.message)
    }
}

impl Evaluation {
    /// Calls `function`, declared by this channel file as a hook, as `function(input, store)`,
    /// with a fresh budget of [`Limits::HOOK_CALL`] instructions.
    ///
    /// `input` arrives as Lua values (JSON null as `nil`); `store` is the channel's store, with
    /// `store.get(key)`, `store.set(key, value)` (`nil` deletes) and `store.delete(key)`, values
    /// converted through JSON. What the call changes in `store` is kept only when the call
    /// succeeds. The result comes back as JSON (`nil` as null). A Lua error, the instruction
    /// limit and the memory limit become `Err("channels/ops.lua:12: message")`.
    pub async fn call_hook(
        &self,
        function: FunctionId,
        input: &serde_json::Value,
        store: &mut HookStore,
    ) -> Result<serde_json::Value, String> {
        let _one_at_a_time = self.calls.lock().await;
        self.call_hook_now(function, input, store)
    }

    /// [`Evaluation::call_hook`] for a thread outside the async runtime: it blocks while
    /// another call runs in this state.
    pub fn call_hook_blocking(
        &self,
        function: FunctionId,
        input: &serde_json::Value,
        store: &mut HookStore,
    ) -> Result<serde_json::Value, String> {
        let _one_at_a_time = self.calls.blocking_lock();
        self.call_hook_now(function, input, store)
    }

    fn call_hook_now(
        &self,
        function: FunctionId,
        input: &serde_json::Value,
        store: &mut HookStore,
    ) -> Result<serde_json::Value, String> {
        let limits = Limits::HOOK_CALL;
        let file = self.file.as_str();
        let function = self
            .functions
            .get(function.0)
            .cloned()
            .ok_or_else(|| format!("{file}: the hook's function is missing"))?;
        let live = Arc::new(Mutex::new(LiveStore {
            store: store.clone(),
            closed: false,
        }));
        let prepared = (|| {
            self.lua.set_memory_limit(limits.memory_bytes)?;
            self.budget.renew(&self.lua, limits)?;
            let input = self.lua.to_value_with(input, TO_LUA)?;
            let table = store_table(&self.lua, file, &live)?;
            Ok::<_, mlua::Error>((input, table))
        })();
        let (input, table) =
            prepared.map_err(|error| format!("{file}: cannot prepare the call: {error}"))?;
        let returned = function.call::<LuaValue>((input, table));
        lock_store(&live).closed = true;
        if self.budget.is_exhausted() {
            return Err(located(&self.budget.problem(file)));
        }
        let value = returned.map_err(|error| located(&problem_from_error(file, &error, limits)))?;
        let json = match value {
            LuaValue::Nil => serde_json::Value::Null,
            LuaValue::String(text) => serde_json::Value::String(text.to_string_lossy()),
            other => {
                let kind = other.type_name();
                self.lua
                    .from_value_with::<serde_json::Value>(other, from_lua_options())
                    .map_err(|error| {
                        format!("{file}: the hook returned {kind} that is not JSON: {error}")
                    })?
            }
        };
        *store = std::mem::take(&mut lock_store(&live).store);
        Ok(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECLARE: &[&str] = &["agent", "tool"];

    fn run(file: &str, source: &str) -> Result<Evaluation, Vec<Problem>> {
        evaluate(file, source, DECLARE, Limits::CONFIG)
    }

    fn only_problem(result: Result<Evaluation, Vec<Problem>>) -> Problem {
        let problems = result.expect_err("the file should fail");
        assert_eq!(problems.len(), 1, "{problems:?}");
        problems.into_iter().next().expect("one problem")
    }

    fn node(line: u32, value: Value) -> Node {
        Node {
            pos: Pos::line(line),
            value,
        }
    }

    fn entry(line: u32, name: &str, value: Value) -> (Key, Node) {
        (
            Key {
                name: name.to_owned(),
                pos: Pos::line(line),
            },
            node(line, value),
        )
    }

    fn field<'n>(map: &'n Node, name: &str) -> &'n Value {
        let Value::Map(entries) = &map.value else {
            panic!("not a map: {map:?}");
        };
        &entries
            .iter()
            .find(|(key, _)| key.name == name)
            .unwrap_or_else(|| panic!("no key {name} in {map:?}"))
            .1
            .value
    }

    #[test]
    fn declarations_record_their_line_and_converted_arguments() {
        let source = r#"
local shared = "x"
agent { model = "openai/gpt-5", tags = { "a", "b" }, limits = { cpus = 2, ratio = 1.0 }, empty = {} }
tool("search", {
  run = function(args) return args end,
  check = function() end,
})
"#;
        let evaluation = run("agent.lua", source).unwrap();
        let declarations = evaluation.declarations();
        assert_eq!(declarations.len(), 2);

        let agent = &declarations[0];
        assert_eq!(agent.function, "agent");
        assert_eq!(agent.pos, Pos::line(3));
        assert_eq!(
            agent.args,
            vec![node(
                3,
                Value::Map(vec![
                    entry(3, "empty", Value::Map(vec![])),
                    entry(
                        3,
                        "limits",
                        Value::Map(vec![
                            entry(3, "cpus", Value::Int(2)),
                            entry(3, "ratio", Value::Float(1.0)),
                        ])
                    ),
                    entry(3, "model", Value::Str("openai/gpt-5".into())),
                    entry(
                        3,
                        "tags",
                        Value::List(vec![
                            node(3, Value::Str("a".into())),
                            node(3, Value::Str("b".into())),
                        ])
                    ),
                ])
            )]
        );

        let tool = &declarations[1];
        assert_eq!(tool.function, "tool");
        assert_eq!(tool.pos, Pos::line(4));
        assert_eq!(tool.args.len(), 2);
        assert_eq!(tool.args[0], node(4, Value::Str("search".into())));
        assert_eq!(
            field(&tool.args[1], "check"),
            &Value::Function(FunctionId(0))
        );
        assert_eq!(field(&tool.args[1], "run"), &Value::Function(FunctionId(1)));
        assert_eq!(evaluation.functions.len(), 2);
    }

    #[test]
    fn declarations_made_from_a_helper_take_the_helper_call_line() {
        let source = "local function declare(name)\n  tool(name, {})\nend\ndeclare('a')\n";
        let evaluation = run("tools/a.lua", source).unwrap();
        assert_eq!(evaluation.declarations()[0].pos, Pos::line(2));
        assert_eq!(evaluation.into_declarations().len(), 1);
    }

    #[test]
    fn unsafe_globals_are_absent() {
        for global in [
            "io",
            "os.execute",
            "os.exit",
            "os.remove",
            "os.rename",
            "os.getenv",
            "os.tmpname",
            "os.setlocale",
            "require",
            "dofile",
            "loadfile",
            "load",
            "loadstring",
            "collectgarbage",
            "debug",
            "string.dump",
            "('').dump",
            "package",
        ] {
            let source = format!("assert({global} == nil, [[{global} is present]])");
            let result = run("agent.lua", &source);
            assert!(result.is_ok(), "{global}: {result:?}");
        }
    }

    #[test]
    fn safe_libraries_and_print_work() {
        let source = r#"
print("x", 1, {})
assert(type(os.time()) == "number" and type(os.clock()) == "number")
assert(type(os.date("%Y")) == "string" and os.difftime(2, 1) == 1)
assert(string.upper("a") == "A" and table.concat({ "a", "b" }) == "ab")
assert(math.max(1, 2) == 2 and utf8.char(72) == "H")
assert(coroutine.wrap(function() coroutine.yield(7) end)() == 7)
"#;
        run("agent.lua", source).unwrap();
    }

    #[test]
    fn bytecode_cannot_be_loaded() {
        let problem = only_problem(run("agent.lua", "\x1bLua\x54\x00"));
        assert!(problem.message.contains("binary"), "{problem}");
    }

    #[test]
    fn an_endless_loop_stops_with_its_line() {
        let problem = only_problem(run("agent.lua", "local x = 1\n\nwhile true do end\n"));
        assert_eq!(
            problem.to_string(),
            "agent.lua:3: stopped after 20000000 Lua instructions (an endless loop?)\n  \
             fix: make the file finish: configuration runs once at load"
        );
    }

    #[test]
    fn pcall_cannot_swallow_the_instruction_limit() {
        let limits = Limits {
            instructions: 100_000,
            ..Limits::CONFIG
        };
        for source in [
            "while true do pcall(function() while true do end end) end",
            "while true do pcall(function() for i = 1, 997 do end end) end",
            "while true do xpcall(function() while true do end end, function() while true do end end) end",
            "local co = coroutine.wrap(function() while true do end end)\nwhile true do pcall(co) end",
            "while true do pcall(coroutine.wrap(function() while true do end end)) end",
            "local co = coroutine.create(function() while true do pcall(error) end end)\n\
             while true do coroutine.resume(co) end",
        ] {
            let problems = evaluate("agent.lua", source, DECLARE, limits).expect_err(source);
            assert_eq!(problems.len(), 1, "{source}: {problems:?}");
            assert_eq!(
                problems[0].message, "stopped after 100000 Lua instructions (an endless loop?)",
                "{source}"
            );
        }
    }

    #[test]
    fn finalizers_cannot_escape_the_instruction_limit() {
        let forever = "function() while true do end end";
        let problem = only_problem(run(
            "agent.lua",
            &format!("local a = 1\nsetmetatable({{}}, {{ __gc = {forever} }})"),
        ));
        assert_eq!(problem.pos, Pos::line(2));
        assert!(problem.message.contains("__gc"), "{problem}");

        let late = format!(
            "local mt = {{}}\nlocal t = setmetatable({{}}, mt)\nmt.__gc = {forever}\nt = nil\n\
             for i = 1, 100000 do local garbage = {{ i }} end\nagent {{}}"
        );
        let evaluation = run("agent.lua", &late).unwrap();
        drop(evaluation);
    }

    #[test]
    fn setmetatable_and_xpcall_still_work() {
        let source = r#"
local t = setmetatable({}, { __index = function(_, key) return key .. "!" end })
assert(t.hi == "hi!")
local protected = setmetatable({}, { __metatable = "locked" })
assert(not pcall(setmetatable, protected, {}))
local ok, handled = xpcall(function(a) error({ code = a }) end, function(e) return e.code end, 7)
assert(not ok and handled == 7)
local ok2, a, b = xpcall(function(x) return x, 2 end, print, 1)
assert(ok2 and a == 1 and b == 2)
agent { t = getmetatable(t) ~= nil }
"#;
        let evaluation = run("agent.lua", source).unwrap();
        assert_eq!(
            evaluation.declarations()[0].args[0],
            node(10, Value::Map(vec![entry(10, "t", Value::Bool(true))]))
        );
    }

    #[test]
    fn a_memory_bomb_stops_at_the_memory_limit() {
        let source = r#"local t = {} for i=1,1e9 do t[i] = string.rep("x", 1000) end"#;
        let problem = only_problem(run("agent.lua", source));
        assert_eq!(problem.pos, Pos::default());
        assert!(problem.message.contains("32 MiB memory limit"), "{problem}");
        assert!(problem.fix.is_some());
    }

    #[test]
    fn declared_data_is_held_to_the_memory_limit() {
        let limits = Limits {
            memory_bytes: 1 << 20,
            ..Limits::CONFIG
        };
        let source = "local s = string.rep('x', 100000)\nfor i = 1, 20 do agent { s } end";
        let problems = evaluate("agent.lua", source, DECLARE, limits).expect_err("too much");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].message.contains("more than 1 MiB"),
            "{problems:?}"
        );
    }

    #[test]
    fn env_holds_only_the_name() {
        let source = r#"
local path = env "PATH"
assert(not pcall(function() return "x" .. path end))
assert(not pcall(function() return path.value end))
assert(not pcall(function() return path < path end))
agent { token = path, shown = tostring(path) }
"#;
        let evaluation = run("agent.lua", source).unwrap();
        let args = &evaluation.declarations()[0].args;
        assert_eq!(field(&args[0], "token"), &Value::Env("PATH".into()));
        let Value::Str(shown) = field(&args[0], "shown") else {
            panic!("shown is not a string: {args:?}");
        };
        assert_eq!(shown, "env(\"PATH\")");
        if let Ok(value) = std::env::var("PATH") {
            assert!(!value.is_empty() && !shown.contains(&value));
        }
    }

    #[test]
    fn env_refuses_an_invalid_name() {
        let problem = only_problem(run("sandbox.lua", "local a = 1\nlocal t = env \"1X\"\n"));
        assert_eq!(problem.pos, Pos::line(2));
        assert!(problem.message.contains(EnvName::RULE), "{problem}");
        assert!(problem.message.contains("\"1X\""), "{problem}");
        assert!(problem.fix.is_some());

        let problem = only_problem(run("sandbox.lua", "env(42)"));
        assert_eq!(problem.pos, Pos::line(1));
        assert!(problem.message.contains("integer"), "{problem}");
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let problem = only_problem(run("sandbox.lua", "local a = 1\nlocal b = = 2\n"));
        assert_eq!(problem.file, "sandbox.lua");
        assert_eq!(problem.pos, Pos::line(2));
        assert!(problem.message.contains("unexpected symbol"), "{problem}");
        assert!(!problem.message.contains("sandbox.lua"), "{problem}");
        assert_eq!(
            problem.fix.as_deref(),
            Some("correct the Lua syntax on that line")
        );
    }

    #[test]
    fn a_runtime_error_names_its_line_without_a_traceback() {
        let problem = only_problem(run("sandbox.lua", "local a = 1\nerror(\"boom\")\n"));
        assert_eq!(problem.pos, Pos::line(2));
        assert_eq!(problem.message, "boom");
        let shown = problem.to_string();
        assert!(shown.starts_with("sandbox.lua:2: boom"), "{shown}");
        assert!(
            !shown.contains("traceback") && !shown.contains("[string"),
            "{shown}"
        );
    }

    #[test]
    fn long_file_names_still_give_the_line() {
        let file = format!("tools/{}.lua", "x".repeat(80));
        let problem = only_problem(run(&file, "\nerror('boom')"));
        assert_eq!(problem.pos, Pos::line(2));
        assert_eq!(problem.message, "boom");
    }

    #[test]
    fn a_table_mixing_items_and_keys_is_reported_with_its_path() {
        let source = "\n\n\ntool('x', { params = { 'a', { 'b', name = 'c' } } })";
        let problem = only_problem(run("tools/x.lua", source));
        assert_eq!(
            problem.to_string(),
            "tools/x.lua:4: params[2]: a table mixes list items and named keys\n  \
             fix: use either a list { a, b } or named keys { a = 1 }, not both"
        );
    }

    #[test]
    fn every_conversion_problem_of_a_file_is_collected() {
        let source = r#"
local cycle = {}
cycle.self = cycle
agent { gaps = { [1] = "a", [3] = "c" }, odd = { [true] = 1 }, half = { [1.5] = 1 } }
agent { cycle = cycle, thread = coroutine.create(function() end), bytes = "\xff" }
"#;
        let problems = run("agent.lua", source).expect_err("bad values");
        let shown: Vec<String> = problems
            .iter()
            .map(|problem| format!("{}:{}: {}", problem.pos.line, problem.path, problem.message))
            .collect();
        assert_eq!(
            shown,
            vec![
                "4:gaps: a list has gaps: its items must be numbered 1, 2, 3... without holes",
                "4:half: a table has the key [1.5]; keys must be names or list positions 1, 2, 3...",
                "4:odd: a table has a boolean key; keys must be names or list positions 1, 2, 3...",
                "5:bytes: a string is not valid UTF-8",
                "5:cycle.self: a table contains itself",
                "5:thread: a coroutine cannot be declared",
            ]
        );
    }

    #[test]
    fn deep_nesting_is_reported() {
        let source = "local t = {}\nfor i = 1, 40 do t = { t } end\nagent { t }";
        let problem = only_problem(run("agent.lua", source));
        assert!(problem.message.contains("deeper than 32"), "{problem}");
        assert!(problem.path.starts_with("[1]"), "{problem}");
    }

    #[test]
    fn the_hook_store_counts_its_json_size() {
        let mut store = HookStore::default();
        store
            .set("a".into(), serde_json::json!({ "b": [1, "x"] }))
            .unwrap();
        store.set("c\"".into(), serde_json::json!(true)).unwrap();
        let json = serde_json::to_string(store.entries()).unwrap();
        assert!(store.bytes >= json.len() && store.bytes <= json.len() + 1);
        store.set("a".into(), serde_json::Value::Null).unwrap();
        store.delete("c\"");
        assert!(store.entries().is_empty());
        assert_eq!(store.bytes, 2);
        assert!(store.set(String::new(), serde_json::json!(1)).is_err());
        let big = serde_json::json!("x".repeat(HookStore::MAX_BYTES));
        assert!(store.set("big".into(), big).is_err());
        assert!(store.entries().is_empty());
        assert!(HookStore::new(BTreeMap::from([("k".into(), serde_json::json!(1))])).is_ok());
    }

    /// Runs `work` on a thread of its own; a test of a budget escape fails rather than hangs
    /// when the escape works.
    fn within_seconds<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
        let (sender, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(work());
        });
        answer
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the Lua state ran past its limits (a hang)")
    }

    fn stopped_by_the_budget(source: &'static str) -> Vec<Problem> {
        let limits = Limits {
            instructions: 100_000,
            ..Limits::CONFIG
        };
        within_seconds(move || {
            evaluate("agent.lua", source, DECLARE, limits)
                .map(drop)
                .expect_err(source)
        })
    }

    /// A table whose metatable gets a `__close` handler that never returns after
    /// `setmetatable`, past its check.
    const FOREVER: &str = "local mt = {}\nlocal forever = setmetatable({}, mt)\n\
                           mt.__close = function() while true do end end\n";

    const BUDGET: &str = "stopped after 100000 Lua instructions (an endless loop?)";

    #[test]
    fn close_handlers_and_loops_in_c_cannot_escape_the_instruction_limit() {
        let not_closable = "got a non-closable value";
        let escapes: [(&str, &str, &str); 19] = [
            (
                "__close given to setmetatable",
                "setmetatable({}, { __close = function() end })",
                "__close metamethods are not allowed in configuration",
            ),
            (
                "__close on the strings' metatable",
                "getmetatable('').__close = function() end",
                "attempt to index a nil value",
            ),
            (
                "<close> in a wrapped coroutine",
                "coroutine.wrap(function() local x <close> = forever; while true do end end)()",
                not_closable,
            ),
            (
                "<close> in a resumed coroutine",
                "local ok, e = coroutine.resume(coroutine.create(function() local x <close> = forever; while true do end end))\nerror(e)",
                not_closable,
            ),
            (
                "a for loop's closing value",
                "for _ in function() return true end, nil, nil, forever do end",
                not_closable,
            ),
            (
                "<close> at top level",
                "local x <close> = forever\nwhile true do end",
                not_closable,
            ),
            (
                "<close> in pcall",
                "local ok, e = pcall(function() local x <close> = forever; while true do end end)\nerror(e)",
                not_closable,
            ),
            (
                "<close> in xpcall",
                "xpcall(function() local x <close> = forever; while true do end end, function(e) error(e) end)",
                not_closable,
            ),
            (
                "__tostring from string.format",
                "string.format('%s', setmetatable({}, { __tostring = function() while true do end end }))",
                BUDGET,
            ),
            (
                "__index from table.concat",
                "table.concat(setmetatable({}, { __index = function() while true do end end }), '', 1, 2)",
                BUDGET,
            ),
            (
                "a table.sort comparator",
                "table.sort({ 3, 2, 1 }, function() while true do end end)",
                BUDGET,
            ),
            (
                "a gsub replacement function",
                "string.gsub('aaa', 'a', function() while true do end end)",
                BUDGET,
            ),
            (
                "string.rep of nothing, many times",
                "string.rep('', 1e15)",
                BUDGET,
            ),
            (
                "table.move over a huge range",
                "table.move({}, 1, 1e12, 2)",
                BUDGET,
            ),
            (
                "table.insert shifting a huge length",
                "table.insert(setmetatable({}, { __len = function() return 1e12 end }), 1, 1)",
                BUDGET,
            ),
            (
                "table.remove shifting a huge length",
                "table.remove(setmetatable({}, { __len = function() return 1e12 end }), 1)",
                BUDGET,
            ),
            (
                "setmetatable copying a huge metatable",
                "local big = {}\nfor i = 1, 5000 do big[i] = i end\nwhile true do setmetatable({}, big) end",
                BUDGET,
            ),
            (
                "the trim idiom on a run of spaces",
                "local s = 'x' .. string.rep(' ', 60000) .. 'y'\nlocal trimmed = s:match('^%s*(.-)%s*$')",
                BUDGET,
            ),
            (
                "nested quantifiers",
                "string.find(string.rep('a', 5000), '.-.-.-.-b')",
                BUDGET,
            ),
        ];
        for (name, body, expected) in escapes {
            let source: &'static str = Box::leak(format!("{FOREVER}{body}").into_boxed_str());
            let problems = stopped_by_the_budget(source);
            assert_eq!(problems.len(), 1, "{name}: {problems:?}");
            assert!(
                problems[0].message.contains(expected),
                "{name}: {problems:?}"
            );
        }
    }

    #[test]
    fn metatables_perch_set_are_not_handed_out() {
        let source = "channel { hook = function(msg)\n  \
                      return { list = type(getmetatable(msg.list)) ~= 'table', text = getmetatable('') == nil }\nend }";
        let evaluation = evaluate("channels/ops.lua", source, &["channel"], Limits::CONFIG)
            .unwrap_or_else(|problems| panic!("{problems:?}"));
        let Value::Map(entries) = &evaluation.declarations()[0].args[0].value else {
            panic!("not a map");
        };
        let Value::Function(hook) = entries[0].1.value else {
            panic!("not a function");
        };
        let returned = evaluation.call_hook_blocking(
            hook,
            &serde_json::json!({ "list": [1, 2] }),
            &mut HookStore::default(),
        );
        assert_eq!(
            returned,
            Ok(serde_json::json!({ "list": true, "text": true }))
        );
    }

    #[test]
    fn a_call_stops_at_its_deadline() {
        let limits = Limits {
            instructions: u64::MAX,
            time: Some(std::time::Duration::from_millis(200)),
            ..Limits::CONFIG
        };
        let started = std::time::Instant::now();
        let problems = within_seconds(move || {
            evaluate(
                "agent.lua",
                "local a = 1\nwhile true do end",
                DECLARE,
                limits,
            )
            .map(drop)
            .expect_err("a deadline")
        });
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].pos, Pos::line(2));
        assert!(
            problems[0]
                .message
                .starts_with("stopped after running for 0.2 s"),
            "{problems:?}"
        );
    }

    #[test]
    fn the_counted_string_and_table_functions_behave_as_lua_s() {
        let source = r##"
assert(("  hi  "):match("^%s*(.-)%s*$") == "hi")
assert(string.find("hello", "l") == 3)
local a, b = string.find("hello", "ll")
assert(a == 3 and b == 4)
assert(string.find("a.b", ".", 1, true) == 2)
assert(select("#", string.find("hello", "(h)(e)")) == 4)
assert(string.find("abc", "b", -1) == nil and string.find("abc", "c", -1) == 3)
assert(string.find("", "") == 1 and string.find("abc", "", 10) == nil)
assert(string.find(12345, 34) == 3)
assert(string.match("key", "()") == 1)
assert(string.match("2024-01-02", "(%d+)-(%d+)-(%d+)") == "2024")
assert(select(3, string.match("2024-01-02", "(%d+)-(%d+)-(%d+)")) == "02")
local replaced, count = string.gsub("hello world", "o", "0")
assert(replaced == "hell0 w0rld" and count == 2)
assert(string.gsub("abc", "%w", "%0%0") == "aabbcc")
assert(string.gsub("abc", "", "-") == "-a-b-c-")
assert(string.gsub("hello world", "(%w+)", "<%1>") == "<hello> <world>")
assert(string.gsub("$name is $age", "%$(%w+)", { name = "Ann", age = 3 }) == "Ann is 3")
assert(string.gsub("a b", "%w", function(w) return w:upper() end) == "A B")
assert(string.gsub("a b", "%w", function() return nil end) == "a b")
assert(string.gsub("hello", "l", "L", 1) == "heLlo")
assert(string.gsub("  x", "^%s+", "") == "x")
local words = {}
for word in ("one two  three"):gmatch("%a+") do words[#words + 1] = word end
assert(#words == 3 and words[3] == "three")
local pairs_seen = {}
for k, v in string.gmatch("a=1, b=2", "(%w+)=(%w+)") do pairs_seen[#pairs_seen + 1] = k .. v end
assert(table.concat(pairs_seen, ",") == "a1,b2")
assert(not pcall(string.find, "a", "[a"))
assert(not pcall(string.gsub, "a", "a", "%2"))
assert(not pcall(string.gsub, "a", "a", true))
assert(("x"):rep(3, ",") == "x,x,x")
assert(table.concat({ 1, 2, 3 }, ",") == "1,2,3")
local t = { 1, 2, 3 }
table.insert(t, 1, 0)
assert(t[1] == 0 and #t == 4)
table.insert(t, 9)
assert(t[5] == 9)
assert(table.remove(t, 1) == 0 and table.remove(t) == 9 and #t == 3)
table.sort(t, function(x, y) return x > y end)
assert(t[1] == 3 and t[3] == 1)
assert(table.move({ 1, 2, 3 }, 1, 3, 2)[3] == 2)
local co = coroutine.wrap(function(x) local y = coroutine.yield(x + 1) return y * 2 end)
assert(co(1) == 2 and co(5) == 10)
local ok, failure = pcall(coroutine.wrap(function() error("boom") end))
assert(not ok and failure:find("boom"))
local Class = {}
Class.__index = Class
local object = setmetatable({}, Class)
function Class.greet() return "hi" end
assert(object.greet() == "hi" and getmetatable(object) == Class)
local added = {}
local late = setmetatable({}, added)
added.__index = function() return "late" end
assert(late.x == nil, "a metamethod added after setmetatable is not used")
local nothing <close> = nil
agent {}
"##;
        run("agent.lua", source).unwrap_or_else(|problems| panic!("{problems:?}"));
    }

    #[test]
    fn pattern_subjects_are_capped() {
        let source = "local a = 1\nstring.find(string.rep('x', 1024 * 1024 + 1), 'y')";
        let problem = only_problem(run("agent.lua", source));
        assert_eq!(problem.pos, Pos::line(2));
        assert_eq!(
            problem.message,
            "string.find: argument #1 is 1048577 bytes; patterns work on strings of at most 1 MiB"
        );
    }

    #[tokio::test]
    async fn a_store_kept_past_its_call_cannot_be_used() {
        let source = "local kept\nchannel { hook = function(msg, store)\n  if kept then\n    \
                      kept.set('k', 1)\n  end\n  kept = store\n  store.set('n', msg.n)\n  \
                      return { text = store.get('missing') or 'none', n = msg.n }\nend }";
        let evaluation = evaluate("channels/ops.lua", source, &["channel"], Limits::CONFIG)
            .unwrap_or_else(|problems| panic!("{problems:?}"));
        let Value::Map(entries) = &evaluation.declarations()[0].args[0].value else {
            panic!("not a map");
        };
        let Value::Function(hook) = entries[0].1.value else {
            panic!("not a function");
        };
        let mut store = HookStore::default();
        let first = evaluation
            .call_hook(
                hook,
                &serde_json::json!({ "n": 1, "gone": null }),
                &mut store,
            )
            .await;
        assert_eq!(first, Ok(serde_json::json!({ "text": "none", "n": 1 })));
        assert_eq!(store.get("n"), Some(&serde_json::json!(1)));
        let second = evaluation
            .call_hook(hook, &serde_json::json!({ "n": 2 }), &mut store)
            .await;
        assert_eq!(
            second,
            Err(
                "channels/ops.lua:4: store.set: the store is usable only while the hook runs"
                    .into()
            )
        );
        assert_eq!(store.get("n"), Some(&serde_json::json!(1)));
    }

    #[test]
    fn evaluations_debug_without_lua_internals() {
        let evaluation = run("agent.lua", "agent { run = function() end }").unwrap();
        let shown = format!("{evaluation:?}");
        assert!(shown.contains("functions: 1"), "{shown}");
        assert!(!shown.contains("Lua("), "{shown}");
    }
}
