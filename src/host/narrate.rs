//! `perch run`'s narration on stderr: one line per event an operator cares about, in words
//! perch-core chooses ([`perch_core::narration`]). How lines look is decided once, at start: on
//! a terminal, local time and colour (no colour with `NO_COLOR`); under systemd's journal
//! (`$JOURNAL_STREAM` names stderr), a `<N>` priority prefix and no time; otherwise plain. The
//! structured log ([`super::logging`]) is separate and unchanged.

use perch_core::Timestamp;
use perch_core::narration::{Event, Level, Line, RefusalKey, RefusalLimiter, Verbosity};
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Mutex, OnceLock};

/// How narrated lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A terminal: `HH:MM:SS` local time first, the line coloured by its level unless
    /// `colour` is off.
    Terminal { colour: bool },
    /// systemd's journal: `<N>` (the syslog priority) first, which journald reads and strips.
    Journal,
    /// A pipe or a file: the words alone.
    Plain,
}

impl Output {
    /// Decides from what stderr is: `journal_stream` is `$JOURNAL_STREAM` (`device:inode`),
    /// `stderr_id` stderr's own device and inode, `no_color` whether `NO_COLOR` is set to
    /// something.
    pub fn decide(
        stderr_is_terminal: bool,
        no_color: bool,
        journal_stream: Option<&str>,
        stderr_id: Option<(u64, u64)>,
    ) -> Output {
        let journal = journal_stream
            .and_then(|stream| stream.trim().split_once(':'))
            .and_then(|(device, inode)| Some((device.parse().ok()?, inode.parse().ok()?)));
        if journal.is_some() && journal == stderr_id {
            return Output::Journal;
        }
        if stderr_is_terminal {
            return Output::Terminal { colour: !no_color };
        }
        Output::Plain
    }

    /// Decides for this process's stderr and environment.
    pub fn detect() -> Output {
        let stderr = std::io::stderr();
        let stderr_id = nix::sys::stat::fstat(&stderr)
            .ok()
            .map(|stat| (stat.st_dev, stat.st_ino));
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        let journal_stream = std::env::var("JOURNAL_STREAM").ok();
        Output::decide(
            stderr.is_terminal(),
            no_color,
            journal_stream.as_deref(),
            stderr_id,
        )
    }

    /// This process's stderr, decided once.
    pub fn of_stderr() -> Output {
        static STDERR: OnceLock<Output> = OnceLock::new();
        *STDERR.get_or_init(Output::detect)
    }

    /// The `<N>` prefix that gives a line of `level` its priority in systemd's journal (which
    /// reads and strips it); nothing for a terminal, a pipe or a file. For the lines perch writes
    /// on stderr outside the narration: the log's and the errors that end a command.
    pub fn priority_prefix(self, level: Level) -> String {
        match self {
            Output::Journal => format!("<{}>", level.priority()),
            Output::Terminal { .. } | Output::Plain => String::new(),
        }
    }

    /// `line` as written, newline-terminated; `local_time` is shown on a terminal.
    pub fn format(self, line: &Line, local_time: &str) -> String {
        let worded = match line.level {
            Level::Error => format!("error: {}", line.text),
            Level::Warning => format!("warning: {}", line.text),
            Level::Notice | Level::Info | Level::Debug => line.text.clone(),
        };
        match self {
            Output::Plain => format!("{worded}\n"),
            Output::Journal => format!("<{}>{worded}\n", line.level.priority()),
            Output::Terminal { colour: false } => format!("{local_time} {worded}\n"),
            Output::Terminal { colour: true } => {
                let paint = match line.level {
                    Level::Error => "\x1b[1;31m",
                    Level::Warning => "\x1b[33m",
                    Level::Notice => "\x1b[36m",
                    Level::Info => "",
                    Level::Debug => "\x1b[2m",
                };
                let reset = if paint.is_empty() { "" } else { "\x1b[0m" };
                format!("\x1b[2m{local_time}\x1b[0m {paint}{worded}{reset}\n")
            }
        }
    }
}

/// The process's narrator: how lines look, how many are shown, and the refusals held back.
#[derive(Debug)]
struct Narrator {
    output: Output,
    verbosity: Verbosity,
    refusals: Mutex<RefusalLimiter>,
}

static NARRATOR: OnceLock<Narrator> = OnceLock::new();

/// Starts narrating on stderr, as `output` and `verbosity` say. Until this is called (and in
/// every command but `perch run`), narration says nothing. Returns `false` if it was started
/// already.
pub fn start(output: Output, verbosity: Verbosity) -> bool {
    NARRATOR
        .set(Narrator {
            output,
            verbosity,
            refusals: Mutex::new(RefusalLimiter::default()),
        })
        .is_ok()
}

/// Tells `event`.
pub fn tell(event: &Event) {
    if let Some(narrator) = NARRATOR.get() {
        narrator.write(&event.line());
    }
}

/// Tells a refusal (an [`Event::Refused`]) at `now`, unless one like it was told within the
/// window; the count of those held back comes with the next one told.
pub fn refused(event: &Event, now: Timestamp) {
    let Some(narrator) = NARRATOR.get() else {
        return;
    };
    let Event::Refused {
        channel,
        room,
        refusal,
        ..
    } = event
    else {
        narrator.write(&event.line());
        return;
    };
    let key = RefusalKey {
        channel: channel.clone(),
        room: room.clone(),
        refusal: *refusal,
    };
    let noted = match narrator.refusals.lock() {
        Ok(mut limiter) => limiter.note(key, now),
        Err(_) => return,
    };
    for held in noted.held {
        narrator.write(&Event::RefusedMore(held).line());
    }
    if noted.say {
        narrator.write(&event.line());
    }
}

/// Tells the counts of refusals still held back, when perch stops at `now`.
pub fn finish(now: Timestamp) {
    let Some(narrator) = NARRATOR.get() else {
        return;
    };
    let held = match narrator.refusals.lock() {
        Ok(mut limiter) => limiter.finish(now),
        Err(_) => return,
    };
    for held in held {
        narrator.write(&Event::RefusedMore(held).line());
    }
}

impl Narrator {
    fn write(&self, line: &Line) {
        if !self.verbosity.shows(line.level) {
            return;
        }
        let local_time = match self.output {
            Output::Terminal { .. } => chrono::Local::now().format("%H:%M:%S").to_string(),
            Output::Journal | Output::Plain => String::new(),
        };
        let text = self.output.format(line, &local_time);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_journal_gets_priority_prefixes_on_other_lines() {
        assert_eq!(Output::Journal.priority_prefix(Level::Error), "<3>");
        assert_eq!(Output::Journal.priority_prefix(Level::Warning), "<4>");
        assert_eq!(Output::Plain.priority_prefix(Level::Error), "");
        assert_eq!(
            Output::Terminal { colour: true }.priority_prefix(Level::Error),
            ""
        );
    }

    #[test]
    fn the_output_follows_what_stderr_is() {
        /// Whether stderr is a terminal, `NO_COLOR`, `JOURNAL_STREAM`, stderr's id; the output.
        type Case<'a> = (bool, bool, Option<&'a str>, Option<(u64, u64)>, Output);
        let cases: &[Case] = &[
            (
                true,
                false,
                None,
                Some((1, 2)),
                Output::Terminal { colour: true },
            ),
            (
                true,
                true,
                None,
                Some((1, 2)),
                Output::Terminal { colour: false },
            ),
            (false, false, None, Some((1, 2)), Output::Plain),
            (false, true, None, Some((1, 2)), Output::Plain),
            (false, false, Some("1:2"), Some((1, 2)), Output::Journal),
            (true, false, Some("1:2"), Some((1, 2)), Output::Journal),
            (false, false, Some("1:3"), Some((1, 2)), Output::Plain),
            (
                true,
                false,
                Some("1:3"),
                Some((1, 2)),
                Output::Terminal { colour: true },
            ),
            (false, false, Some("garbage"), Some((1, 2)), Output::Plain),
            (false, false, Some("1:2"), None, Output::Plain),
        ];
        for (terminal, no_color, stream, id, expected) in cases {
            assert_eq!(
                Output::decide(*terminal, *no_color, *stream, *id),
                *expected,
                "{terminal} {no_color} {stream:?} {id:?}"
            );
        }
    }

    #[test]
    fn each_output_writes_its_own_shape() {
        let warning = Line {
            level: Level::Warning,
            text: "nothing can reach the agent".into(),
        };
        let info = Line {
            level: Level::Info,
            text: "tg: connected as @perch_bot".into(),
        };
        assert_eq!(
            Output::Plain.format(&warning, "09:00:00"),
            "warning: nothing can reach the agent\n"
        );
        assert_eq!(
            Output::Journal.format(&warning, ""),
            "<4>warning: nothing can reach the agent\n"
        );
        assert_eq!(
            Output::Journal.format(&info, ""),
            "<6>tg: connected as @perch_bot\n"
        );
        assert_eq!(
            Output::Terminal { colour: false }.format(&info, "09:00:00"),
            "09:00:00 tg: connected as @perch_bot\n"
        );
        assert_eq!(
            Output::Terminal { colour: true }.format(&warning, "09:00:00"),
            "\x1b[2m09:00:00\x1b[0m \x1b[33mwarning: nothing can reach the agent\x1b[0m\n"
        );
    }
}
