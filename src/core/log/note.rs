//! Notes: what a lane keeps in its tree besides messages. On disk each is a `data` entry,
//! `{"type":"data","name":…,"value":…}`, whose `name` says which note it is; [`Note::from_data`]
//! is the one place a `data` entry becomes a note, for every shape perch has written.

use crate::Timestamp;
use crate::heartbeat::SlotOutcome;
use crate::id::EntryId;
use crate::name::TaskName;
use serde::{Deserialize, Serialize};

/// The `data` name of a compaction's summary.
pub const SUMMARY: &str = "summary";

/// The `data` name of a heartbeat run's outcome.
pub const HEARTBEAT_OUTCOME: &str = "heartbeat_outcome";

/// A note kept in a lane's tree. The model never sees one as it is; a summary is shown to it as
/// the conversation it replaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "Data", into = "Data")]
pub enum Note {
    /// A compaction's summary: the new root the lane continues from, and the leaf it replaces.
    Summary {
        text: String,
        replaces: Option<EntryId>,
    },
    /// How a heartbeat run ended, in the lane it ran in.
    HeartbeatOutcome(HeartbeatNote),
    /// What a Lua hook keeps: any name but [`SUMMARY`] and [`HEARTBEAT_OUTCOME`], any JSON value.
    /// A `data` entry of one of those names whose value is not that note's reads as this too,
    /// as it is.
    Hook {
        name: String,
        value: serde_json::Value,
    },
}

/// A heartbeat run's outcome as its lane keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatNote {
    pub task: TaskName,
    /// The scheduled instant, or when a manual run was asked for.
    pub slot: Timestamp,
    /// The ledger's id for the run; empty in notes written before it was kept.
    #[serde(default)]
    pub run: String,
    /// None in notes written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RunMode>,
    pub outcome: SlotOutcome,
}

/// How a heartbeat run was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// For a slot of its schedule.
    Scheduled,
    /// By `perch heartbeat run`: recorded, but consuming no slot.
    Manual,
    /// By `perch heartbeat run --dry-run`: in its own lane, delivering and recording nothing.
    DryRun,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Scheduled => "scheduled",
            RunMode::Manual => "manual",
            RunMode::DryRun => "dry_run",
        }
    }
}

/// A `data` entry's fields, as they are on disk.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Data {
    name: String,
    value: serde_json::Value,
}

/// A summary's value: `{"text", "summarised"}` as written, `replaces` for the leaf in earlier
/// notes, or the text alone.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SummaryValue {
    text: String,
    #[serde(default, alias = "replaces")]
    summarised: Option<EntryId>,
}

impl Note {
    /// The note a `data` entry named `name` holding `value` is.
    pub fn from_data(name: String, value: serde_json::Value) -> Note {
        let typed = match name.as_str() {
            SUMMARY => match &value {
                serde_json::Value::String(text) => Some(Note::Summary {
                    text: text.clone(),
                    replaces: None,
                }),
                _ => serde_json::from_value::<SummaryValue>(value.clone())
                    .ok()
                    .map(|summary| Note::Summary {
                        text: summary.text,
                        replaces: summary.summarised,
                    }),
            },
            HEARTBEAT_OUTCOME => serde_json::from_value::<HeartbeatNote>(value.clone())
                .ok()
                .map(Note::HeartbeatOutcome),
            _ => None,
        };
        typed.unwrap_or(Note::Hook { name, value })
    }

    /// The `data` name this note is written under.
    pub fn name(&self) -> &str {
        match self {
            Note::Summary { .. } => SUMMARY,
            Note::HeartbeatOutcome(_) => HEARTBEAT_OUTCOME,
            Note::Hook { name, .. } => name,
        }
    }

    /// The `data` value this note is written as.
    pub fn value(&self) -> serde_json::Value {
        match self {
            Note::Summary { text, replaces } => serde_json::to_value(SummaryValue {
                text: text.clone(),
                summarised: *replaces,
            }),
            Note::HeartbeatOutcome(note) => serde_json::to_value(note),
            Note::Hook { value, .. } => Ok(value.clone()),
        }
        .expect("a note's value is plain JSON")
    }
}

impl From<Data> for Note {
    fn from(data: Data) -> Note {
        Note::from_data(data.name, data.value)
    }
}

impl From<Note> for Data {
    fn from(note: Note) -> Data {
        Data {
            name: note.name().to_owned(),
            value: note.value(),
        }
    }
}
