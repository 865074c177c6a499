//! The restricted Lua state a file runs in: the libraries it keeps, `setmetatable` and
//! `getmetatable` held apart, `xpcall` after unwinding, `env "NAME"`, and the declaring
//! functions.

use super::budget::InstructionBudget;
use super::counted::{counted_string_functions, counted_table_functions};
use super::limits::Limits;
use super::record::{CallError, EnvReference, Recorder, declaring_function};
use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue};
use perch_core::name::EnvName;
use std::sync::{Arc, Mutex};

pub(super) fn prepare_state(
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
