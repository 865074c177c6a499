//! A channel's Lua hooks: `on_message(msg, store)` turns an inbound message into the inbox item
//! (rewritten, routed to another lane, or dropped) and `format(reply, store)` shapes outgoing
//! text. Both run in the channel file's restricted Lua state, one call at a time, with their own
//! instruction budget. The store they share persists in `.perch/channels/<name>/store.json`,
//! and what a call changes in it is kept only when the call succeeds.

use super::InboundEvent;
use crate::agent::{AgentDir, LoadedChannel};
use crate::lua::HookStore;
use perch_core::config::ChannelConfig;
use perch_core::name::{ChannelName, LaneName};
use perch_core::tree::FunctionId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

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
    store_path: PathBuf,
    store: HookStore,
}

/// What `on_message` receives as `msg` for `event`: the event's fields, plus `channel` (the
/// channel's name) and `alias` (the room's name in the channel file, or null).
pub fn message_input(config: &ChannelConfig, event: &InboundEvent) -> serde_json::Value {
    let mut input = serde_json::to_value(event).unwrap_or_default();
    if let serde_json::Value::Object(fields) = &mut input {
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

/// Where the store of channel `name` is kept.
pub fn store_path(dir: &AgentDir, name: &ChannelName) -> PathBuf {
    dir.state_dir()
        .join("channels")
        .join(name.as_str())
        .join("store.json")
}

impl ChannelHooks {
    /// The hooks of `channel`, with its store as `.perch/` last kept it (empty if it never was).
    pub fn open(dir: &AgentDir, channel: &LoadedChannel) -> Result<ChannelHooks, String> {
        let store_path = store_path(dir, &channel.config.name);
        let store = read_store(&store_path)?;
        Ok(ChannelHooks {
            channel: channel.clone(),
            store_path,
            store,
        })
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
    /// text is returned as it is.
    pub async fn run_format(&mut self, text: &str) -> Result<String, String> {
        let Some(function) = self.channel.config.format else {
            return Ok(text.to_owned());
        };
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

    async fn call(
        &self,
        function: FunctionId,
        input: &serde_json::Value,
    ) -> Result<(serde_json::Value, HookStore), String> {
        let mut draft = self.store.clone();
        let returned = self
            .channel
            .code
            .call_hook(function, input, &mut draft)
            .await?;
        Ok((returned, draft))
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
                Some(LaneName::try_from(lane.as_str()).map_err(|_| {
                    format!(
                        "{file}: on_message returned the lane {lane:?}, which is not a lane name: {}",
                        LaneName::RULE
                    )
                })?)
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

/// Writes the store under a temporary name, fsyncs it and renames it into place, so the file
/// is always either the old store or the new one.
fn write_store(path: &Path, store: &HookStore) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let temporary = path.with_extension("json.tmp");
    let text = serde_json::to_vec(store.entries()).map_err(io::Error::other)?;
    let mut file = File::create(&temporary)?;
    file.write_all(&text)?;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    File::open(parent)?.sync_all()
}
