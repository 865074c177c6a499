//! What a file's declaring calls record: each call's arguments converted to a [`Node`] tree
//! with the call's line, bounded in depth, size and functions; and the errors perch's functions
//! raise in Lua with the line that caused them, and the reference `env "NAME"` records.

use super::limits::mebibytes;
use mlua::{
    Function, Lua, MetaMethod, MultiValue, Table, UserData, UserDataMethods, Value as LuaValue,
};
use perch_core::config::Declaration;
use perch_core::name::EnvName;
use perch_core::problem::{Pos, Problem};
use perch_core::tree::{FunctionId, Key, Node, Path, Value};
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// An error a perch function raises in Lua, with the line of the Lua call that caused it.
#[derive(Debug)]
pub(super) struct CallError {
    file: String,
    pub(super) line: u32,
    pub(super) message: String,
    pub(super) fix: &'static str,
}

impl CallError {
    pub(super) fn raise(lua: &Lua, file: &str, message: String, fix: &'static str) -> mlua::Error {
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
pub(super) fn calling_line(lua: &Lua) -> u32 {
    const LEVELS_SEARCHED: usize = 8;
    (1..=LEVELS_SEARCHED)
        .find_map(|level| {
            lua.inspect_stack(level, |frame| frame.current_line())
                .flatten()
        })
        .and_then(|line| u32::try_from(line).ok())
        .unwrap_or(0)
}

pub(super) fn declaring_function(
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
pub(super) struct Recorder {
    file: String,
    pub(super) declarations: Vec<Declaration>,
    pub(super) functions: Vec<Function>,
    pub(super) problems: Vec<Problem>,
    memory_limit: usize,
    remaining_bytes: usize,
}

impl Recorder {
    pub(super) fn new(file: &str, memory_limit: usize) -> Self {
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

pub(super) fn lock(recorder: &Mutex<Recorder>) -> MutexGuard<'_, Recorder> {
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

/// What `env "NAME"` returns: the name of a host environment variable, never its value.
pub(super) struct EnvReference(pub(super) EnvName);

impl UserData for EnvReference {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::ToString, |_, reference, ()| {
            Ok(format!("env(\"{}\")", reference.0))
        });
    }
}
