//! A channel's hooks called in their file's state, and the store they keep between calls.

use super::limits::mebibytes;
use super::record::CallError;
use super::{Evaluation, Limits, problem_from_error};
use mlua::LuaSerdeExt;
use mlua::{Lua, Table, Value as LuaValue};
use perch_core::problem::Problem;
use perch_core::tree::FunctionId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The small key-value store a channel's hooks see as their `store` argument: string keys,
/// JSON values, at most [`HookStore::MAX_BYTES`] as JSON. The shell keeps one per channel and
/// persists it; a hook call works on it directly, so the caller decides whether to keep what a
/// call changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookStore {
    entries: BTreeMap<String, serde_json::Value>,
    /// The length of the store as a JSON object, give or take one byte.
    pub(super) bytes: usize,
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
    let (get_live, get_file) = (Arc::clone(live), file.to_owned());
    table.raw_set(
        "get",
        lua.create_function(move |lua, key: LuaValue| {
            let key = open_key(lua, &get_live, &get_file, "get", key)?;
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
            let key = open_key(lua, &set_live, &set_file, "set", key)?;
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
            let key = open_key(lua, &delete_live, &delete_file, "delete", key)?;
            lock_store(&delete_live).store.delete(&key);
            Ok(())
        })?,
    )?;
    Ok(table)
}

/// The key a store function `function` of `file` was called with, once the store is found
/// still open (usable only while the hook runs) and the key a UTF-8 string.
fn open_key(
    lua: &Lua,
    live: &Arc<Mutex<LiveStore>>,
    file: &str,
    function: &str,
    key: LuaValue,
) -> mlua::Result<String> {
    if lock_store(live).closed {
        return Err(CallError::raise(
            lua,
            file,
            format!("store.{function}: the store is usable only while the hook runs"),
            "use the store argument of the current call",
        ));
    }
    match key {
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
    }
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
