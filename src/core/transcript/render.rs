//! Turns and events drawn: the JSON line `perch log --json` prints and the text it shows, every
//! platform-given name and text escaped for the terminal.

use super::{EventKind, TranscriptEvent, Turn, TurnFacts};
use crate::Timestamp;
use crate::log::Trigger;
use crate::terminal::{escaped, for_terminal};
use std::fmt::Write as _;

/// How many lines of a tool's output the text shows.
pub const OUTPUT_HEAD_LINES: usize = 4;

/// How many characters of one shown line the text keeps.
const LINE_CHARS: usize = 300;

/// `event` as one line of `perch log --json`. Characters a terminal would act on (controls, bidi
/// and other invisible format characters) are written as `\uXXXX` escapes, so the line is safe
/// to print and still decodes to exactly the text that was logged.
pub fn json_line(event: &TranscriptEvent) -> String {
    crate::terminal::json_escaped(&serde_json::to_string(event).unwrap_or_default())
}

/// Money in millionths, as text: `0.0031`, `12`.
pub fn money(micros: u64) -> String {
    crate::spend::Money::from_micros(micros).to_string()
}

fn time(at: Timestamp) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// One line shown safely: escaped and cut.
fn safe(text: &str) -> String {
    for_terminal(text, LINE_CHARS)
}

/// A turn's heading line.
pub fn heading(turn: &Turn) -> String {
    let facts = &turn.facts;
    let mut out = facts.at.map_or_else(|| "(no time)".to_owned(), time);
    let _ = write!(out, "  {}", turn.lane);
    if let Some(task) = &facts.task {
        let _ = write!(out, "  heartbeat {}", safe(task));
        if let Some(slot) = &facts.slot {
            let _ = write!(out, " (slot {})", safe(slot));
        }
    }
    if let Some((task, slot)) = &facts.steered_by {
        let _ = write!(
            out,
            "  steered by heartbeat {} (slot {})",
            safe(task),
            safe(slot)
        );
    }
    let mut places: Vec<String> = Vec::new();
    let mut senders: Vec<String> = Vec::new();
    for origin in &facts.origins {
        let place = format!(
            "{}:{}{}",
            safe(&origin.channel),
            safe(&origin.room),
            origin
                .thread
                .as_ref()
                .map(|thread| format!(" thread {}", safe(thread)))
                .unwrap_or_default()
        );
        if !places.contains(&place) {
            places.push(place);
        }
        let sender = format!(
            "{} ({})",
            safe(&origin.sender_name),
            safe(&origin.sender_id)
        );
        if !senders.contains(&sender) {
            senders.push(sender);
        }
    }
    if !places.is_empty() {
        let _ = write!(out, "  {}", places.join(", "));
    }
    if !senders.is_empty() {
        let _ = write!(out, "  {}", senders.join(", "));
    }
    if turn.start.is_none() {
        out.push_str("  (before the first turn read)");
    }
    out
}

/// A turn's closing line: its tokens and cost.
pub fn footing(facts: &TurnFacts) -> Option<String> {
    if facts.model_calls == 0 {
        return None;
    }
    let mut out = format!(
        "  {:<10}{} model call{}, {} tokens in, {} out",
        "usage",
        facts.model_calls,
        if facts.model_calls == 1 { "" } else { "s" },
        facts.input_tokens,
        facts.output_tokens
    );
    if facts.priced {
        let _ = write!(out, ", cost {}", money(facts.cost_micros));
    }
    Some(out)
}

/// A whole turn as text: heading, events, usage.
pub fn render_turn(turn: &Turn, out: &mut String) {
    out.push_str(&heading(turn));
    out.push('\n');
    for event in &turn.events {
        for line in render_event(event) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let Some(line) = footing(&turn.facts) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
}

fn labelled(label: &str, text: &str, lines: &mut Vec<String>) {
    let mut first = true;
    for piece in text.split('\n') {
        let piece = piece.strip_suffix('\r').unwrap_or(piece);
        lines.push(format!(
            "  {:<10}{}",
            if first { label } else { "" },
            safe(piece)
        ));
        first = false;
    }
}

/// One event as text lines (none for the bookkeeping a reader need not see).
pub fn render_event(event: &TranscriptEvent) -> Vec<String> {
    let mut lines = Vec::new();
    match &event.kind {
        EventKind::SegmentStarted { segment, previous } => lines.push(format!(
            "  {:<10}segment {segment}{}",
            "log",
            previous
                .as_ref()
                .map(|file| format!(", continuing {}", safe(file)))
                .unwrap_or_default()
        )),
        EventKind::RunStarted { resumed: true, .. } => lines.push(format!(
            "  {:<10}resumed after a restart: the interrupted run continues",
            "recovery"
        )),
        EventKind::RunStarted { .. }
        | EventKind::LeafSet { .. }
        | EventKind::AttemptStarted { retry: false, .. } => {}
        EventKind::CompactionStarted { trigger, .. } => lines.push(format!(
            "  {:<10}compaction started{}",
            "compact",
            match trigger {
                Some(Trigger::ContextFull) =>
                    ", since the conversation neared the model's context window",
                Some(Trigger::CompactCommand) => ", asked for with perch compact",
                _ => "",
            }
        )),
        EventKind::UserMessage {
            steer, messages, ..
        } => {
            for said in messages {
                let who = match &said.origin {
                    Some(origin) => format!("{}: ", safe(&origin.sender_name)),
                    None => String::new(),
                };
                labelled(
                    if *steer { "steer" } else { "user" },
                    &format!("{who}{}", said.text),
                    &mut lines,
                );
                if let Some(origin) = &said.origin
                    && let Some(quoted) = &origin.replying_to
                {
                    lines.push(format!(
                        "  {:<10}replying to {}{}{}",
                        "",
                        safe(quoted),
                        origin
                            .replying_to_author
                            .as_ref()
                            .map(|author| format!(" by {}", safe(author)))
                            .unwrap_or_default(),
                        origin
                            .replying_to_text
                            .as_ref()
                            .map(|text| format!(": \"{}\"", for_terminal(text, 80)))
                            .unwrap_or_default()
                    ));
                }
            }
        }
        EventKind::HeartbeatPrompt { task, slot, .. } => lines.push(format!(
            "  {:<10}task {} fired for slot {}",
            "heartbeat",
            safe(task),
            safe(slot)
        )),
        EventKind::HeartbeatCorrection { reason, .. } => lines.push(format!(
            "  {:<10}asked again for a verdict, since {}",
            "corrected",
            safe(reason)
        )),
        EventKind::HeartbeatSteer {
            task, slot, text, ..
        } => {
            lines.push(format!(
                "  {:<10}from heartbeat {} (slot {})",
                "steer",
                safe(task),
                safe(slot)
            ));
            labelled("", text, &mut lines);
        }
        EventKind::AttemptStarted { attempt, .. } => lines.push(format!(
            "  {:<10}request {attempt} after the last one got no reply",
            "retry"
        )),
        EventKind::ModelReplied {
            model,
            input,
            output,
            cached,
            cost_micros,
            ..
        } => lines.push(format!(
            "  {:<10}{}: {input} in{}, {output} out{}",
            "model",
            safe(model),
            if *cached > 0 {
                format!(" ({cached} cached)")
            } else {
                String::new()
            },
            cost_micros
                .map(|cost| format!(", cost {}", money(cost)))
                .unwrap_or_default()
        )),
        EventKind::AssistantMessage {
            text,
            reasoning_chars,
            verdict,
            ..
        } => {
            if *reasoning_chars > 0 {
                lines.push(format!(
                    "  {:<10}[reasoning: {reasoning_chars} chars]",
                    "reasoning"
                ));
            }
            if !text.is_empty() {
                labelled("reply", text, &mut lines);
            }
            if let Some(verdict) = verdict {
                lines.push(match (&verdict.verdict, &verdict.reason) {
                    (Some(kind), _) => format!("  {:<10}valid: {kind}", "verdict"),
                    (None, Some(reason)) => {
                        format!("  {:<10}invalid: {}", "verdict", safe(reason))
                    }
                    (None, None) => format!("  {:<10}invalid", "verdict"),
                });
            }
        }
        EventKind::ToolStarted {
            tool, arguments, ..
        } => {
            let arguments = serde_json::to_string(arguments).unwrap_or_default();
            lines.push(format!(
                "  {:<10}{} {}",
                "tool",
                safe(tool),
                for_terminal(&arguments, LINE_CHARS)
            ));
        }
        EventKind::ToolResult {
            tool,
            output,
            is_error,
            call_id,
            ..
        } => {
            let shown: Vec<&str> = output.lines().collect();
            lines.push(format!(
                "  {:<10}{}{} ({} line{})",
                "output",
                tool.as_deref().map_or_else(|| safe(call_id), safe),
                if *is_error { ", error" } else { "" },
                shown.len(),
                if shown.len() == 1 { "" } else { "s" }
            ));
            for line in shown.iter().take(OUTPUT_HEAD_LINES) {
                lines.push(format!("  {:<10}│ {}", "", safe(line)));
            }
            if shown.len() > OUTPUT_HEAD_LINES {
                lines.push(format!(
                    "  {:<10}│ … {} more",
                    "",
                    shown.len() - OUTPUT_HEAD_LINES
                ));
            }
        }
        EventKind::ToolFinished {
            duration_ms,
            exit_code,
            is_error,
            ..
        } => lines.push(format!(
            "  {:<10}{}, {}{}",
            "ended",
            exit_code.map_or_else(|| "no exit code".to_owned(), |code| format!("exit {code}")),
            duration(*duration_ms),
            if *is_error { ", error" } else { "" }
        )),
        EventKind::DeliverySettled {
            delivery,
            channel,
            answers,
            state,
            platform_id,
            reason,
            ..
        } => {
            let mut line = format!("  {:<10}{}", "delivery", safe(state));
            if let Some(id) = platform_id {
                let _ = write!(line, " as message {}", safe(id));
            }
            let _ = write!(line, " on {} ({})", safe(channel), safe(delivery));
            if let Some(answers) = answers {
                let _ = write!(line, ", answering {}", safe(answers));
            }
            if let Some(reason) = reason {
                let _ = write!(line, ": {}", safe(reason));
            }
            lines.push(line);
        }
        EventKind::OperationFinished {
            intent,
            outcome,
            reason,
            ..
        } => {
            let what = match (intent.as_deref(), outcome.as_str()) {
                (Some("compact"), "completed") => "compaction completed".to_owned(),
                (Some("compact"), other) => format!("compaction {other}"),
                (_, "cancelled") => "cancelled (aborted)".to_owned(),
                (_, "interrupted") => "interrupted (closed on recovery)".to_owned(),
                (_, other) => other.to_owned(),
            };
            lines.push(format!(
                "  {:<10}{what}{}",
                "end",
                reason
                    .as_ref()
                    .map(|reason| format!(": {}", safe(reason)))
                    .unwrap_or_default()
            ));
        }
        EventKind::CompactionSummary { chars, .. } => lines.push(format!(
            "  {:<10}summary of {chars} chars; the lane continues from it",
            "compact"
        )),
        EventKind::HeartbeatOutcome {
            task,
            slot,
            mode,
            outcome,
            text,
            target,
            delivery,
            steered_lane,
            reason,
            ..
        } => {
            let mut line = format!(
                "  {:<10}{} ({} run of {} for slot {})",
                "outcome",
                safe(outcome),
                safe(mode),
                safe(task),
                safe(slot)
            );
            if let Some(target) = target {
                let _ = write!(line, " to {}", safe(target));
            }
            if let Some(delivery) = delivery {
                let _ = write!(line, " as delivery {}", safe(delivery));
            }
            if let Some(lane) = steered_lane {
                let _ = write!(line, " into lane {}", safe(lane));
            }
            if let Some(reason) = reason {
                let _ = write!(line, ": {}", safe(reason));
            }
            lines.push(line);
            if let Some(text) = text {
                labelled("", text, &mut lines);
            }
        }
        EventKind::Note { name, value, .. } => lines.push(format!(
            "  {:<10}{} {}",
            "note",
            safe(name),
            for_terminal(&serde_json::to_string(value).unwrap_or_default(), LINE_CHARS)
        )),
        EventKind::TailRepaired {
            truncated_bytes,
            offset,
        } => lines.push(format!(
            "  {:<10}a torn last line ({truncated_bytes} bytes at offset {offset}) was cut off on open",
            "repair"
        )),
        EventKind::Damaged { file, line, reason } => lines.push(format!(
            "  {:<10}{}:{line}: {}",
            "DAMAGED",
            escaped(file),
            safe(reason)
        )),
    }
    lines
}

fn duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{}.{} s", ms / 1_000, (ms % 1_000) / 100)
    }
}
