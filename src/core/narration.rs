//! What `perch run` tells its operator, one line per event: each line's words and how loud it
//! is, why a message was refused and the fix for it, and the limiter that lets one refusal line
//! through per (channel, room, reason) in ten minutes and counts the rest. Never a message's
//! text; every name or id a platform, a chat user or a guest chose is escaped for the terminal.

use crate::Timestamp;
use crate::admission::{
    Admission, DM_REFUSED, LOOP_GUARD, NOT_ALLOWED, OTHER_ORGANISATION, UNLISTED_BOT,
};
use crate::heartbeat::SlotOutcome;
use crate::terminal::shown;
use std::collections::HashMap;
use std::time::Duration;

/// How loud a line is, as syslog's priorities (`<N>` under journald).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warning,
    /// Worth a look, not wrong in itself: a refusal.
    Notice,
    Info,
    /// Shown with `-v` only: each message taken in, each delivery sent.
    Debug,
}

impl Level {
    /// The syslog priority: 3 (error) to 7 (debug).
    pub fn priority(self) -> u8 {
        match self {
            Level::Error => 3,
            Level::Warning => 4,
            Level::Notice => 5,
            Level::Info => 6,
            Level::Debug => 7,
        }
    }
}

/// How much `perch run` narrates: `-q` only warnings and errors, `-v` everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verbosity {
    Quiet,
    #[default]
    Normal,
    Verbose,
}

impl Verbosity {
    /// Whether a line at `level` is shown.
    pub fn shows(self, level: Level) -> bool {
        match self {
            Verbosity::Quiet => level <= Level::Warning,
            Verbosity::Normal => level <= Level::Info,
            Verbosity::Verbose => true,
        }
    }
}

/// Why a message was not answered, in the operator's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A group message: neither the room is in `allow.rooms` nor the sender in `allow.users`.
    RoomNotAllowed,
    /// A direct message from a sender not in `allow.users`, under `dm = "refuse"`.
    DirectRefused,
    /// A bot not in `allow_bots`.
    UnlistedBot,
    /// The loop guard: `bot_turns` bot-to-bot exchanges in a row in the room.
    LoopGuard,
    /// Older than the channel's `max_age` when perch saw it.
    Stale,
    /// An unknown sender in a direct message whose pairing is waiting for the operator.
    AwaitingPairing,
    /// A person of another organisation (Slack Connect) not in `allow.users`.
    OtherOrganisation,
    /// Any other reason (a channel that is no longer loaded, say).
    Other,
}

impl Refusal {
    /// The refusal an admission is, if it is one; `direct` says whether the message was a
    /// direct one. A message answered or kept as group context is none.
    pub fn of(admission: &Admission, direct: bool) -> Option<Refusal> {
        match admission {
            Admission::Answer | Admission::Context => None,
            Admission::Stale => Some(Refusal::Stale),
            Admission::Pair => Some(Refusal::AwaitingPairing),
            Admission::Refused { reason } => Some(Refusal::of_reason(reason, direct)),
        }
    }

    /// The refusal admission's `reason` names.
    pub fn of_reason(reason: &str, direct: bool) -> Refusal {
        match reason {
            NOT_ALLOWED if direct => Refusal::DirectRefused,
            NOT_ALLOWED => Refusal::RoomNotAllowed,
            DM_REFUSED => Refusal::DirectRefused,
            UNLISTED_BOT => Refusal::UnlistedBot,
            reason if reason.starts_with(LOOP_GUARD) => Refusal::LoopGuard,
            reason if reason.starts_with(OTHER_ORGANISATION) => Refusal::OtherOrganisation,
            _ => Refusal::Other,
        }
    }

    /// The reason, in words.
    pub fn words(self) -> &'static str {
        match self {
            Refusal::RoomNotAllowed => {
                "the room is not in allow.rooms and the sender not in allow.users"
            }
            Refusal::DirectRefused => "a direct message from a sender not in allow.users",
            Refusal::UnlistedBot => "a bot not in allow_bots",
            Refusal::LoopGuard => "the loop guard: too many bot-to-bot exchanges in a row",
            Refusal::Stale => "older than max_age when perch saw it",
            Refusal::AwaitingPairing => "an unknown sender whose pairing is not approved",
            Refusal::OtherOrganisation => {
                "a person of another organisation (Slack Connect) not in allow.users"
            }
            Refusal::Other => "refused",
        }
    }

    /// What to change so that such a message is answered, naming the channel's `file` and key.
    pub fn fix(self, file: &str, room: &str, sender: &str) -> String {
        let (room, sender) = (shown(room), shown(sender));
        match self {
            Refusal::RoomNotAllowed => format!(
                "{file}: rooms (name it: team = \"{room}\") and allow.rooms (add the name), or \
                 allow.users (add \"{sender}\")"
            ),
            Refusal::DirectRefused => format!(
                "{file}: allow.users (add \"{sender}\"), or dm = \"pair\" to let strangers ask"
            ),
            Refusal::UnlistedBot => format!("{file}: allow_bots (add \"{sender}\")"),
            Refusal::LoopGuard => format!("{file}: bot_turns (raise it to let bots talk longer)"),
            Refusal::Stale => format!("{file}: max_age (raise it to answer older messages)"),
            Refusal::AwaitingPairing => format!(
                "perch pair approve CODE (`perch pair list` shows it), or {file}: allow.users \
                 (add \"{sender}\")"
            ),
            Refusal::OtherOrganisation => format!(
                "{file}: allow.users (add \"{sender}\"); people of another organisation are \
                 answered only when listed there"
            ),
            Refusal::Other => format!("{file}: see the reason"),
        }
    }
}

/// What the operator decided about a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairingDecision {
    /// Approved, and told so in their direct messages.
    ApprovedTold,
    /// Approved; no direct message from them is known, so they were not told.
    ApprovedUntold,
    /// Their request was dropped.
    Denied,
    /// No longer approved.
    Revoked,
}

/// Something `perch run` tells the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A channel's connection came up; `account` is who the platform says perch is.
    Connected {
        channel: String,
        account: Option<String>,
    },
    /// Every channel's first connection attempt is over.
    Ready {
        channels: Vec<String>,
        heartbeats: usize,
        model: String,
    },
    /// No channel and no heartbeat task: nothing will ever start a run.
    Unreachable,
    /// A message was taken in (only with `-v`).
    Received {
        channel: String,
        room: String,
        sender: String,
    },
    /// A run answered its messages and the reply was recorded for delivery.
    Answered {
        channel: String,
        lane: String,
        took: Duration,
    },
    /// A message was not answered.
    Refused {
        channel: String,
        /// The channel's file, relative to the agent directory.
        file: String,
        room: String,
        sender: String,
        refusal: Refusal,
        /// Admission's own reason, shown for [`Refusal::Other`].
        reason: String,
    },
    /// The refusals the limiter held back for one key.
    RefusedMore(Held),
    /// An unknown sender was given a pairing code.
    Pairing {
        channel: String,
        sender: String,
        name: String,
        code: String,
    },
    /// The operator approved, denied or revoked a sender through the running service.
    PairingDecided {
        channel: String,
        sender: String,
        name: String,
        decision: PairingDecision,
    },
    /// A heartbeat slot started its run.
    HeartbeatFiring { task: String, slot: Timestamp },
    /// A heartbeat run ended.
    HeartbeatVerdict { task: String, outcome: SlotOutcome },
    /// A reply reached the platform (only with `-v`).
    Delivered { channel: String, room: String },
    /// A reply was certainly not posted, and will not be sent again.
    NotDelivered {
        channel: String,
        room: String,
        reason: String,
    },
    /// A reply may or may not have been posted, and will not be sent again.
    DeliveryUnknown {
        channel: String,
        room: String,
        reason: String,
    },
}

/// One narrated line: how loud, and its words (one line, no newline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    pub text: String,
}

impl Event {
    /// The line the event is told as.
    pub fn line(&self) -> Line {
        let (level, text) = match self {
            Event::Connected { channel, account } => (
                Level::Info,
                match account {
                    Some(account) => format!("{}: connected as {}", shown(channel), shown(account)),
                    None => format!("{}: connected", shown(channel)),
                },
            ),
            Event::Ready {
                channels,
                heartbeats,
                model,
            } => {
                let channels = match channels.len() {
                    0 => "no channels".to_owned(),
                    count => format!(
                        "{count} channel{} ({})",
                        plural(count),
                        channels
                            .iter()
                            .map(|name| shown(name))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                (
                    Level::Info,
                    format!(
                        "ready: {channels}, {heartbeats} heartbeat task{}, model {}",
                        plural(*heartbeats),
                        shown(model)
                    ),
                )
            }
            Event::Unreachable => (
                Level::Warning,
                "nothing can reach the agent: no channel in channels/ and no task in \
                 HEARTBEAT.yml; add a channel with `perch channel add telegram`"
                    .to_owned(),
            ),
            Event::Received {
                channel,
                room,
                sender,
            } => (
                Level::Debug,
                format!(
                    "{}: a message from {} in room {}",
                    shown(channel),
                    shown(sender),
                    shown(room)
                ),
            ),
            Event::Answered {
                channel,
                lane,
                took,
            } => (
                Level::Info,
                format!(
                    "{}: answered in lane {} after {}",
                    shown(channel),
                    shown(lane),
                    duration(*took)
                ),
            ),
            Event::Refused {
                channel,
                file,
                room,
                sender,
                refusal,
                reason,
            } => {
                let words = match refusal {
                    Refusal::Other => shown(reason),
                    known => known.words().to_owned(),
                };
                (
                    Level::Notice,
                    format!(
                        "{}: refused a message from {} in room {}: {words}; fix: {}",
                        shown(channel),
                        shown(sender),
                        shown(room),
                        refusal.fix(file, room, sender)
                    ),
                )
            }
            Event::RefusedMore(held) => (
                Level::Notice,
                format!(
                    "{}: {} more message{} refused in room {} in {}: {}",
                    shown(&held.key.channel),
                    held.count,
                    plural(usize::try_from(held.count).unwrap_or(usize::MAX)),
                    shown(&held.key.room),
                    duration(held.over),
                    held.key.refusal.words()
                ),
            ),
            Event::Pairing {
                channel,
                sender,
                name,
                code,
            } => (
                Level::Notice,
                format!(
                    "{}: pairing requested by {} ({}): code {}; let them in with `perch pair \
                     approve {}` or `perch pair approve {}:{}`",
                    shown(channel),
                    shown(name),
                    shown(sender),
                    shown(code),
                    shown(code),
                    shown(channel),
                    shown(sender)
                ),
            ),
            Event::PairingDecided {
                channel,
                sender,
                name,
                decision,
            } => {
                let decided = match decision {
                    PairingDecision::ApprovedTold => "approved, and told so",
                    PairingDecision::ApprovedUntold => {
                        "approved (not told: no direct message from them is known)"
                    }
                    PairingDecision::Denied => "denied: the pairing request is dropped",
                    PairingDecision::Revoked => "revoked: no longer approved",
                };
                let who = if name.is_empty() {
                    shown(sender)
                } else {
                    format!("{} ({})", shown(name), shown(sender))
                };
                (
                    Level::Notice,
                    format!("{}: {who} {decided}", shown(channel)),
                )
            }
            Event::HeartbeatFiring { task, slot } => (
                Level::Info,
                format!(
                    "heartbeat {}: firing (slot {})",
                    shown(task),
                    slot.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            ),
            Event::HeartbeatVerdict { task, outcome } => {
                let (level, verdict) = verdict(outcome);
                (level, format!("heartbeat {}: {verdict}", shown(task)))
            }
            Event::Delivered { channel, room } => (
                Level::Debug,
                format!("{}: delivered to room {}", shown(channel), shown(room)),
            ),
            Event::NotDelivered {
                channel,
                room,
                reason,
            } => (
                Level::Warning,
                format!(
                    "{}: a reply to room {} was not delivered: {}",
                    shown(channel),
                    shown(room),
                    shown(reason)
                ),
            ),
            Event::DeliveryUnknown {
                channel,
                room,
                reason,
            } => (
                Level::Warning,
                format!(
                    "{}: a reply to room {} may or may not have been posted, and is not sent \
                     again: {}",
                    shown(channel),
                    shown(room),
                    shown(reason)
                ),
            ),
        };
        Line { level, text }
    }
}

/// A heartbeat run's end in words, never the message's text.
fn verdict(outcome: &SlotOutcome) -> (Level, String) {
    match outcome {
        SlotOutcome::Silent => (Level::Info, "verdict SILENCE".to_owned()),
        SlotOutcome::Message { target, .. } if target.is_empty() => (
            Level::Warning,
            "verdict Message, with no delivery target".to_owned(),
        ),
        SlotOutcome::Message { target, .. } => (
            Level::Info,
            format!("verdict Message, to {}", shown(target)),
        ),
        SlotOutcome::Steer { lane, .. } => (
            Level::Info,
            format!("verdict Steer, into lane {}", shown(lane.as_str())),
        ),
        SlotOutcome::Invalid { reason } => (
            Level::Warning,
            format!("invalid verdict: {}", shown(reason)),
        ),
        SlotOutcome::Failed { reason } => (Level::Warning, format!("failed: {}", shown(reason))),
        SlotOutcome::Skipped { reason } => (Level::Info, format!("skipped: {}", shown(reason))),
        SlotOutcome::Interrupted { reason } => {
            (Level::Warning, format!("interrupted: {}", shown(reason)))
        }
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// `0.4 s`, `12 s`, `3 min 5 s`.
fn duration(took: Duration) -> String {
    let millis = took.as_millis();
    if millis < 10_000 {
        format!("{}.{} s", millis / 1000, (millis % 1000) / 100)
    } else if millis < 60_000 {
        format!("{} s", millis / 1000)
    } else {
        let seconds = millis / 1000;
        format!("{} min {} s", seconds / 60, seconds % 60)
    }
}

/// How long after a refusal line the limiter holds back others with the same key.
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(600);

/// How many keys the limiter keeps; past that, the one whose window opened first is let go
/// (with its count, if it held any back).
pub const REFUSAL_KEYS_MAX: usize = 256;

/// What one refusal line is limited by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RefusalKey {
    pub channel: String,
    pub room: String,
    pub refusal: Refusal,
}

/// Refusals held back under one key: how many, over how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub key: RefusalKey,
    pub count: u64,
    pub over: Duration,
}

/// What the limiter says of one refusal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Noted {
    /// Say the refusal's line.
    pub say: bool,
    /// Counts to say first: this key's from its last window, or a key let go to make room.
    pub held: Vec<Held>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    opened: Timestamp,
    held: u64,
}

/// One refusal line per (channel, room, reason) per [`REFUSAL_WINDOW`]; the rest are counted,
/// and the count is said on that key's next line after the window, or when it is let go, or at
/// the end ([`RefusalLimiter::finish`]). Keeps at most [`REFUSAL_KEYS_MAX`] keys.
#[derive(Debug, Clone, Default)]
pub struct RefusalLimiter {
    windows: HashMap<RefusalKey, Window>,
}

impl RefusalLimiter {
    /// Notes a refusal under `key` at `now`.
    pub fn note(&mut self, key: RefusalKey, now: Timestamp) -> Noted {
        if let Some(window) = self.windows.get_mut(&key) {
            let open = (now - window.opened)
                .to_std()
                .is_ok_and(|age| age < REFUSAL_WINDOW);
            if open {
                window.held += 1;
                return Noted::default();
            }
            let earlier = *window;
            *window = Window {
                opened: now,
                held: 0,
            };
            return Noted {
                say: true,
                held: held(&key, earlier, now).into_iter().collect(),
            };
        }
        let mut noted = Noted {
            say: true,
            held: Vec::new(),
        };
        if self.windows.len() >= REFUSAL_KEYS_MAX {
            self.windows.retain(|_, window| {
                window.held > 0
                    || (now - window.opened)
                        .to_std()
                        .is_ok_and(|age| age < REFUSAL_WINDOW)
            });
        }
        if self.windows.len() >= REFUSAL_KEYS_MAX {
            let oldest = self
                .windows
                .iter()
                .min_by_key(|(_, window)| window.opened)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest
                && let Some(window) = self.windows.remove(&oldest)
            {
                noted.held.extend(held(&oldest, window, now));
            }
        }
        self.windows.insert(
            key,
            Window {
                opened: now,
                held: 0,
            },
        );
        noted
    }

    /// Every count still held back, at `now` (when perch stops), oldest window first.
    pub fn finish(&mut self, now: Timestamp) -> Vec<Held> {
        let mut windows: Vec<(RefusalKey, Window)> = self.windows.drain().collect();
        windows.sort_by_key(|(_, window)| window.opened);
        windows
            .into_iter()
            .filter_map(|(key, window)| held(&key, window, now))
            .collect()
    }

    /// How many keys it keeps now.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

fn held(key: &RefusalKey, window: Window, now: Timestamp) -> Option<Held> {
    (window.held > 0).then(|| Held {
        key: key.clone(),
        count: window.held,
        over: (now - window.opened).to_std().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(seconds: i64) -> Timestamp {
        chrono::Utc
            .with_ymd_and_hms(2026, 12, 3, 9, 0, 0)
            .unwrap()
            .checked_add_signed(chrono::TimeDelta::seconds(seconds))
            .unwrap()
    }

    fn key(room: &str, refusal: Refusal) -> RefusalKey {
        RefusalKey {
            channel: "tg".into(),
            room: room.into(),
            refusal,
        }
    }

    #[test]
    fn each_admission_is_the_refusal_it_names() {
        let refused = |reason: &str| Admission::Refused {
            reason: reason.into(),
        };
        let cases: Vec<(Admission, bool, Option<Refusal>)> = vec![
            (Admission::Answer, false, None),
            (Admission::Context, false, None),
            (Admission::Stale, false, Some(Refusal::Stale)),
            (Admission::Pair, true, Some(Refusal::AwaitingPairing)),
            (refused(NOT_ALLOWED), false, Some(Refusal::RoomNotAllowed)),
            (refused(NOT_ALLOWED), true, Some(Refusal::DirectRefused)),
            (refused(DM_REFUSED), true, Some(Refusal::DirectRefused)),
            (refused(UNLISTED_BOT), false, Some(Refusal::UnlistedBot)),
            (
                refused("loop guard: 3 bot-to-bot exchanges in a row in this room"),
                false,
                Some(Refusal::LoopGuard),
            ),
            (
                refused(
                    "a person of another organisation (Slack Connect, workspace T1) not in allow.users",
                ),
                true,
                Some(Refusal::OtherOrganisation),
            ),
            (refused("no channel tg"), false, Some(Refusal::Other)),
        ];
        for (admission, direct, expected) in cases {
            assert_eq!(Refusal::of(&admission, direct), expected, "{admission:?}");
        }
    }

    #[test]
    fn every_fix_names_the_file_and_the_key() {
        let cases = [
            (Refusal::RoomNotAllowed, "allow.rooms"),
            (Refusal::DirectRefused, "allow.users"),
            (Refusal::UnlistedBot, "allow_bots"),
            (Refusal::LoopGuard, "bot_turns"),
            (Refusal::Stale, "max_age"),
            (Refusal::AwaitingPairing, "allow.users"),
        ];
        for (refusal, key) in cases {
            let fix = refusal.fix("channels/tg.lua", "-100123", "42");
            assert!(
                fix.contains(&format!("channels/tg.lua: {key}"))
                    || fix.contains("channels/tg.lua: rooms") && fix.contains(&format!(" {key} ")),
                "{refusal:?}: {fix}"
            );
        }
        let room = Refusal::RoomNotAllowed.fix("channels/tg.lua", "-100123", "42");
        assert_eq!(
            room,
            "channels/tg.lua: rooms (name it: team = \"-100123\") and allow.rooms (add the \
             name), or allow.users (add \"42\")"
        );
    }

    #[test]
    fn lines_say_what_happened_in_words() {
        let cases: Vec<(Event, Level, &str)> = vec![
            (
                Event::Connected {
                    channel: "tg".into(),
                    account: Some("@perch_bot".into()),
                },
                Level::Info,
                "tg: connected as @perch_bot",
            ),
            (
                Event::Ready {
                    channels: vec!["tg".into(), "dc".into()],
                    heartbeats: 1,
                    model: "openai/gpt-5".into(),
                },
                Level::Info,
                "ready: 2 channels (tg, dc), 1 heartbeat task, model openai/gpt-5",
            ),
            (
                Event::Ready {
                    channels: Vec::new(),
                    heartbeats: 0,
                    model: "openai/gpt-5".into(),
                },
                Level::Info,
                "ready: no channels, 0 heartbeat tasks, model openai/gpt-5",
            ),
            (
                Event::Answered {
                    channel: "tg".into(),
                    lane: "tg-42".into(),
                    took: Duration::from_millis(4_250),
                },
                Level::Info,
                "tg: answered in lane tg-42 after 4.2 s",
            ),
            (
                Event::Refused {
                    channel: "tg".into(),
                    file: "channels/tg.lua".into(),
                    room: "-100123".into(),
                    sender: "42".into(),
                    refusal: Refusal::UnlistedBot,
                    reason: UNLISTED_BOT.into(),
                },
                Level::Notice,
                "tg: refused a message from 42 in room -100123: a bot not in allow_bots; fix: \
                 channels/tg.lua: allow_bots (add \"42\")",
            ),
            (
                Event::RefusedMore(Held {
                    key: key("-100123", Refusal::RoomNotAllowed),
                    count: 99,
                    over: Duration::from_secs(75),
                }),
                Level::Notice,
                "tg: 99 more messages refused in room -100123 in 1 min 15 s: the room is not in \
                 allow.rooms and the sender not in allow.users",
            ),
            (
                Event::Pairing {
                    channel: "tg".into(),
                    sender: "42".into(),
                    name: "Mallory\u{1b}[2J".into(),
                    code: "ABCD-2345".into(),
                },
                Level::Notice,
                "tg: pairing requested by Mallory\\u{1b}[2J (42): code ABCD-2345; let them in \
                 with `perch pair approve ABCD-2345` or `perch pair approve tg:42`",
            ),
            (
                Event::PairingDecided {
                    channel: "tg".into(),
                    sender: "42".into(),
                    name: "Ada".into(),
                    decision: PairingDecision::ApprovedTold,
                },
                Level::Notice,
                "tg: Ada (42) approved, and told so",
            ),
            (
                Event::PairingDecided {
                    channel: "tg".into(),
                    sender: "7\u{202e}".into(),
                    name: String::new(),
                    decision: PairingDecision::Revoked,
                },
                Level::Notice,
                "tg: 7\\u{202e} revoked: no longer approved",
            ),
            (
                Event::HeartbeatFiring {
                    task: "daily".into(),
                    slot: at(0),
                },
                Level::Info,
                "heartbeat daily: firing (slot 2026-12-03 09:00:00 UTC)",
            ),
            (
                Event::HeartbeatVerdict {
                    task: "daily".into(),
                    outcome: SlotOutcome::Message {
                        text: "the secret report".into(),
                        target: "tg:team".into(),
                        delivery: "d1".into(),
                    },
                },
                Level::Info,
                "heartbeat daily: verdict Message, to tg:team",
            ),
            (
                Event::HeartbeatVerdict {
                    task: "daily".into(),
                    outcome: SlotOutcome::Failed {
                        reason: "model: 401".into(),
                    },
                },
                Level::Warning,
                "heartbeat daily: failed: model: 401",
            ),
            (
                Event::NotDelivered {
                    channel: "tg".into(),
                    room: "42".into(),
                    reason: "rejected: chat not found".into(),
                },
                Level::Warning,
                "tg: a reply to room 42 was not delivered: rejected: chat not found",
            ),
            (
                Event::DeliveryUnknown {
                    channel: "tg".into(),
                    room: "42".into(),
                    reason: "failed: timed out".into(),
                },
                Level::Warning,
                "tg: a reply to room 42 may or may not have been posted, and is not sent again: \
                 failed: timed out",
            ),
        ];
        for (event, level, text) in cases {
            let line = event.line();
            assert_eq!(line.level, level, "{event:?}");
            assert_eq!(line.text, text);
            assert!(!line.text.contains("secret report"));
        }
        assert_eq!(Event::Unreachable.line().level, Level::Warning);
    }

    #[test]
    fn verbosity_shows_what_it_says() {
        use Level::*;
        for (verbosity, shown_levels) in [
            (Verbosity::Quiet, vec![Error, Warning]),
            (Verbosity::Normal, vec![Error, Warning, Notice, Info]),
            (
                Verbosity::Verbose,
                vec![Error, Warning, Notice, Info, Debug],
            ),
        ] {
            for level in [Error, Warning, Notice, Info, Debug] {
                assert_eq!(
                    verbosity.shows(level),
                    shown_levels.contains(&level),
                    "{verbosity:?} {level:?}"
                );
            }
        }
    }

    #[test]
    fn a_flood_from_one_room_is_one_line_and_a_count() {
        let mut limiter = RefusalLimiter::default();
        let flood = key("-100123", Refusal::RoomNotAllowed);
        let first = limiter.note(flood.clone(), at(0));
        assert!(first.say && first.held.is_empty());
        for second in 1..100 {
            assert_eq!(limiter.note(flood.clone(), at(second)), Noted::default());
        }
        let other_room = limiter.note(key("-100999", Refusal::RoomNotAllowed), at(100));
        assert!(other_room.say, "another room has its own line");
        let other_reason = limiter.note(key("-100123", Refusal::Stale), at(100));
        assert!(other_reason.say, "another reason has its own line");
        assert_eq!(
            limiter.finish(at(120)),
            vec![Held {
                key: flood,
                count: 99,
                over: Duration::from_secs(120),
            }]
        );
        assert!(limiter.is_empty());
    }

    #[test]
    fn after_the_window_the_next_line_brings_the_count() {
        let mut limiter = RefusalLimiter::default();
        let flood = key("-100123", Refusal::RoomNotAllowed);
        limiter.note(flood.clone(), at(0));
        limiter.note(flood.clone(), at(10));
        limiter.note(flood.clone(), at(599));
        let after = limiter.note(flood.clone(), at(600));
        assert_eq!(
            after,
            Noted {
                say: true,
                held: vec![Held {
                    key: flood.clone(),
                    count: 2,
                    over: Duration::from_secs(600),
                }],
            }
        );
        let quiet = limiter.note(flood, at(1300));
        assert_eq!(
            quiet,
            Noted {
                say: true,
                held: Vec::new()
            },
            "nothing held: no count"
        );
        assert!(limiter.finish(at(1400)).is_empty());
    }

    #[test]
    fn the_keys_are_bounded_and_a_key_let_go_says_its_count() {
        let mut limiter = RefusalLimiter::default();
        let first = key("room-0", Refusal::RoomNotAllowed);
        limiter.note(first.clone(), at(0));
        limiter.note(first.clone(), at(1));
        for room in 1..REFUSAL_KEYS_MAX {
            let noted = limiter.note(key(&format!("room-{room}"), Refusal::RoomNotAllowed), at(2));
            assert!(noted.say && noted.held.is_empty());
        }
        assert_eq!(limiter.len(), REFUSAL_KEYS_MAX);
        let full = limiter.note(key("one-more", Refusal::Stale), at(3));
        assert!(full.say);
        assert_eq!(
            full.held,
            vec![Held {
                key: first,
                count: 1,
                over: Duration::from_secs(3),
            }]
        );
        assert_eq!(limiter.len(), REFUSAL_KEYS_MAX);
        for room in 0..10_000 {
            limiter.note(
                key(&format!("later-{room}"), Refusal::Stale),
                at(700 + room),
            );
        }
        assert_eq!(limiter.len(), REFUSAL_KEYS_MAX);
    }
}
