//! A channel's Lua hooks: `on_message(msg, store)` turns an inbound message into the inbox item
//! (rewritten, routed to another lane, or dropped) and `format(reply, store)` shapes outgoing
//! text. Both run in the channel file's restricted Lua state, one call at a time, with their own
//! instruction budget. The store they share persists in `.perch/channels/<name>/store.json`,
//! and what a call changes in it is kept only when the call succeeds.
//!
//! A call runs on a thread of its own, off the async runtime, and is waited for at most
//! [`HOOK_DEADLINE`]. A call that overruns it is abandoned with its Lua state (the thread
//! finishes under the state's limits) and the next call gets a fresh state made from the file.
//! While [`MAX_ABANDONED`] abandoned calls are still running, calls are refused.

use super::InboundEvent;
use crate::agent::{AgentDir, LoadedChannel};
use crate::lua::HookStore;
use perch_core::config::ChannelConfig;
use perch_core::name::{LaneKind, LaneName};
use perch_core::tree::FunctionId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The longest perch waits for one hook call: the hook's own 2 s limit, which Lua checks every
/// thousand instructions, and a second for one long step in C.
pub const HOOK_DEADLINE: Duration = Duration::from_secs(3);

/// Abandoned hook calls of one channel that may still be running before the channel refuses
/// to start more.
pub const MAX_ABANDONED: usize = 2;

/// The most message text `on_message` is handed; longer text is cut, with [`CUT_MARKER`].
pub const MAX_HOOK_TEXT_BYTES: usize = 64 << 10;

/// Ends text cut to [`MAX_HOOK_TEXT_BYTES`] for a hook.
pub const CUT_MARKER: &str = "\n[message cut: hooks see its first 64 KiB]";

/// What the inbox receives for one message: its text and, when the hook routes it elsewhere,
/// the lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookItem {
    /// What the agent reads: the message's text, or what the hook made of it.
    pub text: String,
    /// The lane the hook routed the message to, instead of the one of its room and thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<LaneName>,
}

/// What `on_message` decided for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookVerdict {
    /// Put this item in the inbox.
    Item(HookItem),
    /// The hook returned `nil`: the message is not answered.
    Drop,
    /// The hook failed or returned something that is not an item; the message is rejected.
    /// The text names the file and, where known, the line.
    Error(String),
}

/// The hooks of one channel and its store, owned by the task that handles the channel.
#[derive(Debug)]
pub struct ChannelHooks {
    channel: LoadedChannel,
    /// The state the next call runs in; `None` after a call was abandoned, until a fresh one
    /// is made.
    code: Option<Arc<crate::lua::Evaluation>>,
    /// Hook calls of this channel whose thread is still running, abandoned ones included.
    running: Arc<AtomicUsize>,
    store_path: PathBuf,
    store: HookStore,
}

/// What `on_message` receives as `msg` for `event`: the event's fields, plus `channel` (the
/// channel's name) and `alias` (the room's name in the channel file, or null). When the
/// channel has an `on_message` hook, text longer than [`MAX_HOOK_TEXT_BYTES`] is cut.
pub fn message_input(config: &ChannelConfig, event: &InboundEvent) -> serde_json::Value {
    let mut input = serde_json::to_value(event).unwrap_or_default();
    if let serde_json::Value::Object(fields) = &mut input {
        if config.on_message.is_some()
            && let Some(serde_json::Value::String(text)) = fields.get_mut("text")
        {
            cut_for_hook(text);
        }
        fields.insert("channel".into(), config.name.as_str().into());
        fields.insert(
            "alias".into(),
            config
                .room_alias(&event.room)
                .map_or(serde_json::Value::Null, |alias| alias.as_str().into()),
        );
    }
    input
}

/// Cuts `text` to [`MAX_HOOK_TEXT_BYTES`] at a character boundary, marking the cut.
pub fn cut_for_hook(text: &mut String) {
    if text.len() <= MAX_HOOK_TEXT_BYTES {
        return;
    }
    let mut end = MAX_HOOK_TEXT_BYTES - CUT_MARKER.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(CUT_MARKER);
}

impl ChannelHooks {
    /// The hooks of `channel`, with its store as `.perch/` last kept it (empty if it never was).
    pub fn open(dir: &AgentDir, channel: &LoadedChannel) -> Result<ChannelHooks, String> {
        let store_path = dir.channel_store_file(channel.config.name.as_str());
        let store = read_store(&store_path)?;
        Ok(ChannelHooks {
            channel: channel.clone(),
            code: Some(Arc::clone(&channel.code)),
            running: Arc::new(AtomicUsize::new(0)),
            store_path,
            store,
        })
    }

    /// Counts this channel's hook calls that were abandoned and are still running (and the
    /// call running now, if any), for `perch status`.
    pub fn running_calls(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.running)
    }

    /// The store as the last successful call left it.
    pub fn store(&self) -> &HookStore {
        &self.store
    }

    /// Runs `on_message(msg, store)` on `message` (an object with at least a string `text`).
    /// Without the hook the item is the message's text. The hook returns a table with a
    /// string `text` and an optional string `lane` (other keys are ignored, so it may return
    /// `msg` itself), or `nil` to drop the message; anything else is an error.
    pub async fn run_on_message(&mut self, message: &serde_json::Value) -> HookVerdict {
        let Some(function) = self.channel.config.on_message else {
            return match message.get("text").and_then(serde_json::Value::as_str) {
                Some(text) => HookVerdict::Item(HookItem {
                    text: text.to_owned(),
                    lane: None,
                }),
                None => {
                    HookVerdict::Error(format!("{}: the message has no text", self.channel.file))
                }
            };
        };
        let returned = match self.call(function, message).await {
            Ok(returned) => returned,
            Err(error) => return HookVerdict::Error(error),
        };
        match self.item(returned.0) {
            Ok(verdict) => match self.keep(returned.1) {
                Ok(()) => verdict,
                Err(error) => HookVerdict::Error(error),
            },
            Err(error) => HookVerdict::Error(error),
        }
    }

    /// Runs `format(reply, store)` on `text`; it must return a string. Without the hook the
    /// text is returned as it is, and so is text longer than [`MAX_HOOK_TEXT_BYTES`], which
    /// is not handed to the hook (an error says so).
    pub async fn run_format(&mut self, text: &str) -> Result<String, String> {
        let Some(function) = self.channel.config.format else {
            return Ok(text.to_owned());
        };
        if text.len() > MAX_HOOK_TEXT_BYTES {
            return Err(format!(
                "{}: the reply is {} bytes, more than the {} KiB format is handed; it is sent as written",
                self.channel.file,
                text.len(),
                MAX_HOOK_TEXT_BYTES >> 10
            ));
        }
        let (returned, store) = self
            .call(function, &serde_json::Value::String(text.to_owned()))
            .await?;
        match returned {
            serde_json::Value::String(formatted) => {
                self.keep(store)?;
                Ok(formatted)
            }
            other => Err(format!(
                "{}: format must return a string, but it returned {}",
                self.channel.file,
                describe(&other)
            )),
        }
    }

    /// Calls `function` on a thread of its own and waits for it at most [`HOOK_DEADLINE`].
    async fn call(
        &mut self,
        function: FunctionId,
        input: &serde_json::Value,
    ) -> Result<(serde_json::Value, HookStore), String> {
        let file = self.channel.file.clone();
        let abandoned = self.running.load(Ordering::SeqCst);
        if abandoned >= MAX_ABANDONED {
            return Err(format!(
                "{file}: {abandoned} earlier hook calls overran their {} s deadline and are still \
                 running; the channel refuses messages until they finish (restart perch if they \
                 never do)",
                HOOK_DEADLINE.as_secs()
            ));
        }
        let code = self.code.clone();
        let channel = self.channel.clone();
        let mut draft = self.store.clone();
        let input = input.clone();
        let running = Arc::clone(&self.running);
        running.fetch_add(1, Ordering::SeqCst);
        let (sender, answer) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("perch-hook".into())
            .spawn(move || {
                let running = Running(running);
                crate::host::failpoint::stall("stall:hook");
                let outcome = fresh_or(code, &channel).map(|code| {
                    let returned = code.call_hook_blocking(function, &input, &mut draft);
                    (code, returned.map(|returned| (returned, draft)))
                });
                // Counted out before the answer goes: a call answered in time was never
                // abandoned, however late this thread then gets to exit.
                drop(running);
                let _ = sender.send(outcome);
            });
        if let Err(error) = spawned {
            self.running.fetch_sub(1, Ordering::SeqCst);
            return Err(format!("{file}: cannot start the hook's thread: {error}"));
        }
        match tokio::time::timeout(HOOK_DEADLINE, answer).await {
            Ok(Ok(Ok((code, returned)))) => {
                self.code = Some(code);
                returned
            }
            Ok(Ok(Err(error))) => {
                self.code = None;
                Err(error)
            }
            Ok(Err(_)) => {
                self.code = None;
                Err(format!(
                    "{file}: the hook's thread stopped without an answer"
                ))
            }
            Err(_) => {
                self.code = None;
                Err(format!(
                    "{file}: the hook did not finish within {} s; its Lua state is abandoned and \
                     the next call gets a fresh one",
                    HOOK_DEADLINE.as_secs()
                ))
            }
        }
    }

    fn item(&self, returned: serde_json::Value) -> Result<HookVerdict, String> {
        let file = &self.channel.file;
        let expected = "on_message must return a table with a string text (and optionally a string lane), or nil to drop the message";
        let fields = match returned {
            serde_json::Value::Null => return Ok(HookVerdict::Drop),
            serde_json::Value::Object(fields) => fields,
            other => {
                return Err(format!(
                    "{file}: {expected}, but it returned {}",
                    describe(&other)
                ));
            }
        };
        let Some(serde_json::Value::String(text)) = fields.get("text") else {
            let found = fields
                .get("text")
                .map_or_else(|| "no text".to_owned(), describe);
            return Err(format!(
                "{file}: {expected}, but it returned a table with {found}"
            ));
        };
        let lane = match fields.get("lane") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(lane)) => {
                let lane = LaneName::try_from(lane.as_str()).map_err(|_| {
                    format!(
                        "{file}: on_message returned the lane {lane:?}, which is not a lane name: {}",
                        LaneName::RULE
                    )
                })?;
                if let LaneKind::Heartbeat(task) | LaneKind::DryRun(task) = lane.kind() {
                    return Err(format!(
                        "{file}: on_message returned the lane {lane}, which belongs to the heartbeat \
                         task {task}; a message can go only to a conversation's lane"
                    ));
                }
                Some(lane)
            }
            Some(other) => {
                return Err(format!(
                    "{file}: on_message returned a lane that is {}, not a string",
                    describe(other)
                ));
            }
        };
        Ok(HookVerdict::Item(HookItem {
            text: text.clone(),
            lane,
        }))
    }

    /// Keeps what a successful call left in the store, writing it only when it changed.
    fn keep(&mut self, store: HookStore) -> Result<(), String> {
        if store == self.store {
            return Ok(());
        }
        write_store(&self.store_path, &store).map_err(|error| {
            format!(
                "{}: the store could not be saved in {}: {error}",
                self.channel.file,
                self.store_path.display()
            )
        })?;
        self.store = store;
        Ok(())
    }
}

/// Counts a hook thread as running until it ends.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `code`, or a fresh state made from the channel file when there is none. The file must
/// declare the same again, so that the hooks' function ids still hold.
fn fresh_or(
    code: Option<Arc<crate::lua::Evaluation>>,
    channel: &LoadedChannel,
) -> Result<Arc<crate::lua::Evaluation>, String> {
    if let Some(code) = code {
        return Ok(code);
    }
    let file = &channel.file;
    let fresh = crate::lua::evaluate(
        file,
        &channel.source,
        &["channel"],
        crate::lua::Limits::CONFIG,
    )
    .map_err(|problems| {
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        format!(
            "{file}: a fresh Lua state could not be made: {}",
            shown.join("; ")
        )
    })?;
    if fresh.declarations() != channel.code.declarations() {
        return Err(format!(
            "{file}: a fresh Lua state declared something else than the file did at start; \
             restart perch"
        ));
    }
    Ok(Arc::new(fresh))
}

/// A returned value in a few words, for errors.
fn describe(value: &serde_json::Value) -> String {
    const SHOWN: usize = 60;
    let kind = match value {
        serde_json::Value::Null => return "nil".to_owned(),
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a table",
    };
    let mut shown = value.to_string();
    if shown.chars().count() > SHOWN {
        shown = shown.chars().take(SHOWN).collect::<String>() + "...";
    }
    format!("{kind} ({shown})")
}

/// The most a store file may be on disk before perch refuses to read it.
const MAX_FILE_BYTES: u64 = 2 * HookStore::MAX_BYTES as u64;

fn read_store(path: &Path) -> Result<HookStore, String> {
    let shown = path.display();
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(HookStore::default()),
        Err(error) => return Err(format!("cannot open {shown}: {error}")),
    };
    let mut text = String::new();
    Read::by_ref(&mut file)
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|error| format!("cannot read {shown}: {error}"))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{shown} is larger than a hook store may be; move it away to start with an empty store"
        ));
    }
    let entries: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(|error| {
            format!(
                "{shown} is not a JSON object ({error}); move it away to start with an empty store"
            )
        })?;
    HookStore::new(entries).map_err(|error| format!("{shown}: {error}"))
}

/// Writes the store whole and durably ([`crate::store::atomic_file`]), so the file is always either
/// the old store or the new one.
fn write_store(path: &Path, store: &HookStore) -> io::Result<()> {
    fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    let text = serde_json::to_vec(store.entries()).map_err(io::Error::other)?;
    crate::store::atomic_file::replace(path, &text, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_for_a_hook_is_cut_at_a_character_boundary_with_a_marker() {
        let mut short = "é".repeat(100);
        cut_for_hook(&mut short);
        assert_eq!(short, "é".repeat(100));

        let mut long = format!("a{}", "é".repeat(MAX_HOOK_TEXT_BYTES));
        cut_for_hook(&mut long);
        assert!(long.len() <= MAX_HOOK_TEXT_BYTES, "{}", long.len());
        assert!(long.len() > MAX_HOOK_TEXT_BYTES - CUT_MARKER.len() - 2);
        assert!(long.ends_with(CUT_MARKER));
        assert!(long.starts_with("aé"));
    }
}
