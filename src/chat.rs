//! `perch chat`: the terminal as a channel. Each line typed is one message through the lane,
//! exactly as a chat message would go; the reply streams back as it is written.

use crate::lane::{Finished, Input, Lane, LaneEvent};
use crate::model::StreamEvent;
use perch_core::log::{Outcome, Trigger};
use std::io::Write;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio::sync::mpsc;

/// Where the conversation is shown: the reply on `out`, tool activity and problems on `notes`.
#[derive(Debug)]
pub struct Screen<O, N> {
    pub out: O,
    pub notes: N,
}

/// Reads lines from `input` until end of file, running each through `lane`. A line of
/// whitespace is skipped. Returns how many runs did not complete.
pub async fn chat<O, N>(
    lane: &Lane,
    input: impl AsyncBufRead + Unpin,
    screen: &mut Screen<O, N>,
    prompt: Option<&str>,
) -> Result<usize, String>
where
    O: Write + Send,
    N: Write + Send,
{
    let mut lines = input.lines();
    let mut unfinished = 0;
    loop {
        if let Some(prompt) = prompt {
            let _ = write!(screen.out, "{prompt}");
            let _ = screen.out.flush();
        }
        let Some(line) = lines
            .next_line()
            .await
            .map_err(|error| format!("cannot read the terminal: {error}"))?
        else {
            return Ok(unfinished);
        };
        if line.trim().is_empty() {
            continue;
        }
        let finished = turn(lane, line, screen).await?;
        if finished.outcome != Outcome::Completed {
            unfinished += 1;
        }
    }
}

async fn turn<O: Write, N: Write>(
    lane: &Lane,
    text: String,
    screen: &mut Screen<O, N>,
) -> Result<Finished, String> {
    let (events, mut shown) = mpsc::unbounded_channel();
    let input = Input {
        text,
        consumes: Vec::new(),
        fresh: false,
        said: Vec::new(),
        trigger: Trigger::Terminal,
    };
    let run = lane.send(input, Some(events));
    tokio::pin!(run);
    let mut wrote_text = false;
    let finished = loop {
        tokio::select! {
            event = shown.recv() => {
                if let Some(event) = event {
                    wrote_text |= show(&event, screen);
                }
            }
            finished = &mut run => break finished.map_err(|error| error.to_string())?,
        }
    };
    while let Ok(event) = shown.try_recv() {
        wrote_text |= show(&event, screen);
    }
    if wrote_text {
        let _ = writeln!(screen.out);
    }
    match &finished.outcome {
        Outcome::Completed => {}
        Outcome::Cancelled => {
            let _ = writeln!(screen.notes, "(aborted)");
        }
        Outcome::Failed { reason } | Outcome::Interrupted { reason } => {
            let _ = writeln!(screen.notes, "error: {reason}");
        }
    }
    let _ = screen.out.flush();
    Ok(finished)
}

/// Shows one event; true when it wrote reply text.
fn show<O: Write, N: Write>(event: &LaneEvent, screen: &mut Screen<O, N>) -> bool {
    match event {
        LaneEvent::Model(StreamEvent::Text(text)) => {
            let _ = write!(screen.out, "{text}");
            let _ = screen.out.flush();
            return true;
        }
        LaneEvent::Model(StreamEvent::Reasoning(_) | StreamEvent::ToolCall { .. }) => {}
        LaneEvent::ToolStarted { name, arguments } => {
            let _ = writeln!(screen.notes, "[{name} {arguments}]");
        }
        LaneEvent::ToolFinished { name, is_error } => {
            if *is_error {
                let _ = writeln!(screen.notes, "[{name} failed]");
            }
        }
        LaneEvent::Retrying {
            attempt,
            error,
            after,
        } => {
            let _ = writeln!(
                screen.notes,
                "[attempt {attempt} failed: {error}; retrying in {:.1} s]",
                after.as_secs_f64()
            );
        }
        LaneEvent::Steered => {}
        LaneEvent::Compacted => {
            let _ = writeln!(screen.notes, "[the conversation was compacted]");
        }
    }
    false
}
