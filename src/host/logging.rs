//! perch's log lines on stderr, one per event, where systemd's journal picks them up: readable
//! (`perch: <message> key=value ...`, warnings and errors saying so), or, with
//! `perch run --log-format json`, one JSON object per line: `timestamp`, `level`, `target`,
//! `message` and `fields`. Only perch's own events at `info` and above are written; the
//! libraries' events are dropped, so nothing they might say about a request reaches the log.

use super::narrate::Output;
use perch_core::narration::Level as Severity;
use std::fmt;
use std::io::Write as _;
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `perch: <message> key=value ...`
    #[default]
    Human,
    /// One JSON object per line: timestamp, level, target, message, fields
    Json,
}

/// Where finished lines go (each ends with a newline).
pub type Sink = Arc<dyn Fn(&str) + Send + Sync>;

/// Installs the process's subscriber, writing to stderr. Returns `false` if one was installed
/// already.
pub fn init(format: LogFormat) -> bool {
    let stderr: Sink = Arc::new(|line: &str| {
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    });
    tracing::subscriber::set_global_default(subscriber(format, stderr)).is_ok()
}

/// A subscriber that writes perch's events in `format` to `sink`.
pub fn subscriber(format: LogFormat, sink: Sink) -> impl Subscriber + Send + Sync {
    let perch_only = Targets::new()
        .with_target("perch", Level::INFO)
        .with_target("perch_core", Level::INFO);
    tracing_subscriber::registry().with(Lines { format, sink }.with_filter(perch_only))
}

struct Lines {
    format: LogFormat,
    sink: Sink,
}

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        let line = match self.format {
            LogFormat::Human => {
                let level = match *metadata.level() {
                    Level::ERROR => Severity::Error,
                    Level::WARN => Severity::Warning,
                    _ => Severity::Info,
                };
                format!(
                    "{}{}",
                    Output::of_stderr().priority_prefix(level),
                    human_line(*metadata.level(), &fields.message, &fields.values)
                )
            }
            LogFormat::Json => json_line(
                &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                *metadata.level(),
                metadata.target(),
                &fields.message,
                &fields.values,
            ),
        };
        (self.sink)(&line);
    }
}

/// `perch: [warning: |error: ]<message>[ key=value ...]`, newline-terminated, the fields in the
/// event's order. A value with spaces, quotes or `=` in it is written as a JSON string. Control
/// and invisible format characters are written escaped (`\u{1b}`), so nothing quoted from a
/// platform can forge a line or drive the terminal.
pub fn human_line(level: Level, message: &str, fields: &[(String, serde_json::Value)]) -> String {
    let mut line = String::from("perch: ");
    if level == Level::ERROR {
        line.push_str("error: ");
    } else if level == Level::WARN {
        line.push_str("warning: ");
    }
    let lines: Vec<String> = message
        .split('\n')
        .map(perch_core::terminal::escaped)
        .collect();
    line.push_str(&lines.join("\n"));
    for (key, value) in fields {
        let shown = match value {
            serde_json::Value::String(text)
                if !text.is_empty()
                    && !text
                        .chars()
                        .any(|c| c.is_whitespace() || c == '"' || c == '=') =>
            {
                text.clone()
            }
            other => other.to_string(),
        };
        let shown = perch_core::terminal::escaped(&shown);
        line.push_str(&format!(" {key}={shown}"));
    }
    line.push('\n');
    line
}

/// One JSON object, newline-terminated: `timestamp`, `level`, `target`, `message`, `fields`.
pub fn json_line(
    timestamp: &str,
    level: Level,
    target: &str,
    message: &str,
    fields: &[(String, serde_json::Value)],
) -> String {
    let string = |text: &str| serde_json::Value::from(text).to_string();
    format!(
        "{{\"timestamp\":{},\"level\":{},\"target\":{},\"message\":{},\"fields\":{}}}\n",
        string(timestamp),
        string(level.as_str()),
        string(target),
        string(message),
        serde_json::Value::Object(fields.iter().cloned().collect())
    )
}

/// An event's message and its other fields.
#[derive(Default)]
struct Fields {
    message: String,
    values: Vec<(String, serde_json::Value)>,
}

impl Fields {
    fn set(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = match value {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
        } else {
            self.values.push((field.name().to_owned(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(field, format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, value.into());
    }
}
