//! Refused messages as `perch log --refused` and `perch status` show them: found in the inbox's
//! records (an event and the disposition journaled for it), told in narration's words with the
//! same fix, so the operator reads one wording everywhere. A refusal is what narration calls
//! one: admission's refused, pairing, stale and loop-guard outcomes, never a group line kept as
//! context. Never a message's text; names and ids are escaped for the terminal in text, and
//! `--json` escapes control and bidi characters as `perch log --json` does.

use crate::Timestamp;
use crate::journal::inbox::{Disposition, InboxRecord};
use crate::narration::Refusal;
use crate::terminal::shown;
use crate::transcript::Selection;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How a refusal of an unknown sender's direct message under `dm = "pair"` begins, as intake
/// journals it (a code offered, or one that could not be).
pub const PAIRING_REASON: &str = "unknown sender in a direct message";

/// How many refusals `perch status` shows: the newest, one per (channel, room, reason).
pub const RECENT_REFUSALS: usize = 5;

/// One refused message, read from the inbox: who, where, when and why; not what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// When its disposition was journaled.
    pub at: Timestamp,
    pub channel: String,
    /// The platform's room id.
    pub room: String,
    /// The sender's platform id.
    pub sender: String,
    /// The sender's display name (empty when the connector refused before looking it up).
    pub name: String,
    pub direct: bool,
    pub refusal: Refusal,
    /// Admission's own reason, as journaled.
    pub reason: String,
}

/// The refusal a journaled disposition is, if it is one; `direct` says whether its event was a
/// direct message.
pub fn refusal_of(disposition: &Disposition, direct: bool) -> Option<Refusal> {
    match disposition {
        Disposition::Stale => Some(Refusal::Stale),
        Disposition::Refused { reason } if reason.starts_with(PAIRING_REASON) => {
            Some(Refusal::AwaitingPairing)
        }
        Disposition::Refused { reason } => Some(Refusal::of_reason(reason, direct)),
        Disposition::Item { .. }
        | Disposition::Context
        | Disposition::Dropped
        | Disposition::Error { .. }
        | Disposition::Command { .. }
        | Disposition::Edited => None,
    }
}

/// What of an event a refusal needs: its text is never kept.
struct Arrived {
    channel: String,
    room: String,
    sender: String,
    name: String,
    direct: bool,
}

/// The refused messages among the inbox's `records` (`(seq, journaled at, record)`, in
/// journal order), oldest first. A disposition whose event is no longer on disk is skipped.
pub fn refused_in(
    records: impl IntoIterator<Item = (u64, Timestamp, InboxRecord)>,
) -> Vec<Refused> {
    let mut arrived: HashMap<u64, Arrived> = HashMap::new();
    let mut refused = Vec::new();
    for (seq, at, record) in records {
        match record {
            InboxRecord::Event { channel, event } => {
                arrived.insert(
                    seq,
                    Arrived {
                        channel,
                        room: event.room,
                        sender: event.sender.id,
                        name: event.sender.name,
                        direct: event.direct,
                    },
                );
            }
            InboxRecord::Disposition { event, disposition } => {
                let Some(event) = arrived.remove(&event) else {
                    continue;
                };
                let Some(refusal) = refusal_of(&disposition, event.direct) else {
                    continue;
                };
                let reason = match disposition {
                    Disposition::Refused { reason } => reason,
                    _ => String::new(),
                };
                refused.push(Refused {
                    at,
                    channel: event.channel,
                    room: event.room,
                    sender: event.sender,
                    name: event.name,
                    direct: event.direct,
                    refusal,
                    reason,
                });
            }
            InboxRecord::Deciding { .. } => {}
        }
    }
    refused
}

/// Whether `selection` selects `refused`: its channel and room (the place's room is a
/// platform id here), its sender (id, or display name in any case) and its time. A selection
/// naming a heartbeat task selects no refusal.
pub fn selects(selection: &Selection, refused: &Refused) -> bool {
    if selection.task.is_some() {
        return false;
    }
    if let Some(place) = &selection.place
        && (place.channel != refused.channel
            || place
                .room
                .as_ref()
                .is_some_and(|room| room != &refused.room))
    {
        return false;
    }
    if let Some(sender) = &selection.sender
        && sender != &refused.sender
        && !refused.name.eq_ignore_ascii_case(sender)
    {
        return false;
    }
    if selection.since.is_some_and(|since| refused.at < since) {
        return false;
    }
    selection.until.is_none_or(|until| refused.at < until)
}

/// The reason in words: narration's, or the reason itself where it says more (which
/// organisation) or narration has no words for it.
pub fn reason_words(refusal: Refusal, reason: &str) -> String {
    match refusal {
        Refusal::Other | Refusal::OtherOrganisation => shown(reason),
        known => known.words().to_owned(),
    }
}

/// A refusal's kind, as `--json` names it.
pub fn kind(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::RoomNotAllowed => "room_not_allowed",
        Refusal::DirectRefused => "direct_refused",
        Refusal::UnlistedBot => "unlisted_bot",
        Refusal::LoopGuard => "loop_guard",
        Refusal::Stale => "stale",
        Refusal::AwaitingPairing => "awaiting_pairing",
        Refusal::OtherOrganisation => "other_organisation",
        Refusal::Other => "other",
    }
}

/// One line of `perch log --refused --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedLine {
    pub at: Timestamp,
    pub channel: String,
    pub room: String,
    pub sender: String,
    pub name: String,
    pub direct: bool,
    /// [`kind`]: `room_not_allowed`, `direct_refused`, `unlisted_bot`, `loop_guard`, `stale`,
    /// `awaiting_pairing` or `other`.
    pub kind: String,
    /// The reason in words.
    pub reason: String,
    /// What to change so that such a message is answered, naming the channel's file and key.
    pub fix: String,
}

impl Refused {
    /// As a line of `perch log --refused --json`; `file` is the channel's file.
    pub fn line(&self, file: &str) -> RefusedLine {
        RefusedLine {
            at: self.at,
            channel: self.channel.clone(),
            room: self.room.clone(),
            sender: self.sender.clone(),
            name: self.name.clone(),
            direct: self.direct,
            kind: kind(self.refusal).to_owned(),
            reason: reason_words(self.refusal, &self.reason),
            fix: self.refusal.fix(file, &self.room, &self.sender),
        }
    }

    /// As `perch log --refused` shows it: a heading and the fix; `file` is the channel's file.
    pub fn text(&self, file: &str) -> String {
        format!(
            "{}  {}  room {}  from {}\n  refused: {}\n  fix: {}\n",
            time(self.at),
            shown(&self.channel),
            shown(&self.room),
            sender_shown(&self.sender, &self.name),
            reason_words(self.refusal, &self.reason),
            self.refusal.fix(file, &self.room, &self.sender)
        )
    }
}

/// The refusals of one (channel, room, reason), as `perch status` shows the newest few.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentRefusal {
    pub channel: String,
    pub room: String,
    /// The last refused sender's platform id and display name.
    pub sender: String,
    pub name: String,
    pub kind: String,
    pub reason: String,
    pub fix: String,
    /// How many were refused, as far back as the inbox keeps (a day).
    pub count: u64,
    /// When the last was.
    pub last: Timestamp,
}

impl RecentRefusal {
    /// Its lines in `perch status`'s text.
    pub fn text(&self) -> String {
        format!(
            "  {} room {}: {}, {} time{}, last {}: {}\n    fix: {}\n",
            shown(&self.channel),
            shown(&self.room),
            sender_shown(&self.sender, &self.name),
            self.count,
            if self.count == 1 { "" } else { "s" },
            time(self.last),
            self.reason,
            self.fix
        )
    }
}

/// The newest [`RECENT_REFUSALS`] (channel, room, reason)s among `refused` (oldest first), each
/// with its count and its last sender, newest first; `file` names each channel's file.
pub fn recent(refused: &[Refused], file: impl Fn(&str) -> String) -> Vec<RecentRefusal> {
    let mut newest: Vec<RecentRefusal> = Vec::new();
    let mut counts: HashMap<(&str, &str, Refusal), u64> = HashMap::new();
    for one in refused {
        *counts
            .entry((&one.channel, &one.room, one.refusal))
            .or_default() += 1;
    }
    for one in refused.iter().rev() {
        if newest.len() == RECENT_REFUSALS {
            break;
        }
        let kind = kind(one.refusal);
        if newest
            .iter()
            .any(|seen| seen.channel == one.channel && seen.room == one.room && seen.kind == kind)
        {
            continue;
        }
        newest.push(RecentRefusal {
            channel: one.channel.clone(),
            room: one.room.clone(),
            sender: one.sender.clone(),
            name: one.name.clone(),
            kind: kind.to_owned(),
            reason: reason_words(one.refusal, &one.reason),
            fix: one.refusal.fix(&file(&one.channel), &one.room, &one.sender),
            count: counts
                .get(&(one.channel.as_str(), one.room.as_str(), one.refusal))
                .copied()
                .unwrap_or(1),
            last: one.at,
        });
    }
    newest
}

/// `Name (id)`, or the id alone when no name is known; both escaped.
fn sender_shown(id: &str, name: &str) -> String {
    if name.is_empty() {
        shown(id)
    } else {
        format!("{} ({})", shown(name), shown(id))
    }
}

fn time(at: Timestamp) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::event::{InboundEvent, Sender};
    use crate::transcript::Place;
    use chrono::TimeZone;

    fn at(seconds: i64) -> Timestamp {
        chrono::Utc
            .with_ymd_and_hms(2026, 12, 3, 9, 0, 0)
            .unwrap()
            .checked_add_signed(chrono::TimeDelta::seconds(seconds))
            .unwrap()
    }

    fn event(room: &str, sender: &str, name: &str, direct: bool) -> InboxRecord {
        InboxRecord::Event {
            channel: "tg".into(),
            event: Box::new(InboundEvent {
                platform_id: format!("{room}:{sender}"),
                cursor: None,
                room: room.into(),
                thread: None,
                sender: Sender {
                    id: sender.into(),
                    name: name.into(),
                    is_bot: false,
                },
                direct,
                addressed: true,
                text: "the launch code is hunter2".into(),
                sent_at: at(0),
                attachments: Vec::new(),
                replying_to: None,
                edit_of: None,
                refused: None,
            }),
        }
    }

    fn disposition(event: u64, disposition: Disposition) -> InboxRecord {
        InboxRecord::Disposition { event, disposition }
    }

    fn refused(reason: &str) -> Disposition {
        Disposition::Refused {
            reason: reason.into(),
        }
    }

    #[test]
    fn which_dispositions_are_refusals() {
        let loop_guard = format!("{}: 3 bot-to-bot exchanges", crate::admission::LOOP_GUARD);
        let table: Vec<(Disposition, bool, Option<Refusal>)> = vec![
            (Disposition::Context, false, None),
            (
                Disposition::Item {
                    lane: "tg-42".into(),
                    text: "hi".into(),
                },
                true,
                None,
            ),
            (Disposition::Dropped, false, None),
            (
                Disposition::Error {
                    reason: "boom".into(),
                },
                false,
                None,
            ),
            (
                Disposition::Command {
                    command: "/new".into(),
                },
                true,
                None,
            ),
            (Disposition::Edited, true, None),
            (Disposition::Stale, false, Some(Refusal::Stale)),
            (
                refused(crate::admission::NOT_ALLOWED),
                false,
                Some(Refusal::RoomNotAllowed),
            ),
            (
                refused(crate::admission::DM_REFUSED),
                true,
                Some(Refusal::DirectRefused),
            ),
            (
                refused(crate::admission::UNLISTED_BOT),
                false,
                Some(Refusal::UnlistedBot),
            ),
            (refused(&loop_guard), false, Some(Refusal::LoopGuard)),
            (
                refused("unknown sender in a direct message; pairing offered"),
                true,
                Some(Refusal::AwaitingPairing),
            ),
            (
                refused("unknown sender in a direct message; pairing could not be offered: disk"),
                true,
                Some(Refusal::AwaitingPairing),
            ),
            (refused("no channel old"), false, Some(Refusal::Other)),
        ];
        for (disposition, direct, expected) in table {
            assert_eq!(
                refusal_of(&disposition, direct),
                expected,
                "{disposition:?}"
            );
        }
    }

    #[test]
    fn refusals_are_found_by_their_event_and_keep_no_text() {
        let records = vec![
            (1, at(1), event("-200", "77", "Eve", false)),
            (
                2,
                at(1),
                disposition(1, refused(crate::admission::NOT_ALLOWED)),
            ),
            (3, at(2), event("-100", "43", "Bob", false)),
            (4, at(2), disposition(3, Disposition::Context)),
            (5, at(3), event("42", "42", "Alice", true)),
            (
                6,
                at(3),
                InboxRecord::Deciding {
                    event: 5,
                    hook: "channels/tg.lua".into(),
                },
            ),
            (7, at(4), disposition(5, Disposition::Stale)),
            (8, at(5), disposition(99, refused("its event is gone"))),
        ];
        let found = refused_in(records);
        assert_eq!(
            found,
            vec![
                Refused {
                    at: at(1),
                    channel: "tg".into(),
                    room: "-200".into(),
                    sender: "77".into(),
                    name: "Eve".into(),
                    direct: false,
                    refusal: Refusal::RoomNotAllowed,
                    reason: crate::admission::NOT_ALLOWED.into(),
                },
                Refused {
                    at: at(4),
                    channel: "tg".into(),
                    room: "42".into(),
                    sender: "42".into(),
                    name: "Alice".into(),
                    direct: true,
                    refusal: Refusal::Stale,
                    reason: String::new(),
                },
            ]
        );
        let shown = format!("{}{}", found[0].text("channels/tg.lua"), found[1].text("x"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    fn eve(at_seconds: i64, room: &str, refusal: Refusal) -> Refused {
        Refused {
            at: at(at_seconds),
            channel: "tg".into(),
            room: room.into(),
            sender: "77".into(),
            name: "Eve".into(),
            direct: false,
            refusal,
            reason: String::new(),
        }
    }

    #[test]
    fn the_selection_picks_by_place_sender_and_time() {
        let one = eve(60, "-200", Refusal::RoomNotAllowed);
        let place = |text: &str| Some(Place::parse(text).unwrap());
        let table = [
            (Selection::default(), true),
            (
                Selection {
                    place: place("tg"),
                    ..Selection::default()
                },
                true,
            ),
            (
                Selection {
                    place: place("tg:-200"),
                    ..Selection::default()
                },
                true,
            ),
            (
                Selection {
                    place: place("tg:-100"),
                    ..Selection::default()
                },
                false,
            ),
            (
                Selection {
                    place: place("dc"),
                    ..Selection::default()
                },
                false,
            ),
            (
                Selection {
                    sender: Some("77".into()),
                    ..Selection::default()
                },
                true,
            ),
            (
                Selection {
                    sender: Some("eve".into()),
                    ..Selection::default()
                },
                true,
            ),
            (
                Selection {
                    sender: Some("bob".into()),
                    ..Selection::default()
                },
                false,
            ),
            (
                Selection {
                    since: Some(at(60)),
                    until: Some(at(61)),
                    ..Selection::default()
                },
                true,
            ),
            (
                Selection {
                    since: Some(at(61)),
                    ..Selection::default()
                },
                false,
            ),
            (
                Selection {
                    until: Some(at(60)),
                    ..Selection::default()
                },
                false,
            ),
            (
                Selection {
                    task: Some("digest".into()),
                    ..Selection::default()
                },
                false,
            ),
        ];
        for (selection, expected) in table {
            assert_eq!(selects(&selection, &one), expected, "{selection:?}");
        }
    }

    #[test]
    fn a_refusal_is_told_in_narration_s_words_with_its_fix() {
        let mut one = eve(0, "-200", Refusal::RoomNotAllowed);
        one.name = "Mallory\u{1b}[2J\u{202e}".into();
        assert_eq!(
            one.text("channels/tg.lua"),
            "2026-12-03 09:00:00 UTC  tg  room -200  from Mallory\\u{1b}[2J\\u{202e} (77)\n  \
             refused: the room is not in allow.rooms and the sender not in allow.users\n  fix: \
             channels/tg.lua: rooms (name it: team = \"-200\") and allow.rooms (add the name), or \
             allow.users (add \"77\")\n"
        );
        let line = one.line("channels/tg.lua");
        assert_eq!(line.kind, "room_not_allowed");
        assert_eq!(line.reason, Refusal::RoomNotAllowed.words());
        assert_eq!(
            line.fix,
            Refusal::RoomNotAllowed.fix("channels/tg.lua", "-200", "77")
        );
        let json = crate::terminal::json_escaped(&serde_json::to_string(&line).unwrap());
        assert!(
            json.contains(r#""name":"Mallory\u001b[2J\u202e""#),
            "{json}"
        );
        let read: RefusedLine = serde_json::from_str(&json).unwrap();
        assert_eq!(read, line, "the escapes decode to the name");
        let other = Refused {
            refusal: Refusal::Other,
            reason: "no channel old\u{7}".into(),
            ..eve(0, "-200", Refusal::Other)
        };
        assert_eq!(other.line("x").reason, "no channel old\\u{7}");
    }

    #[test]
    fn recent_keeps_the_newest_few_one_per_room_and_reason_with_counts() {
        let mut all = vec![
            eve(0, "-100", Refusal::RoomNotAllowed),
            eve(1, "-200", Refusal::RoomNotAllowed),
            eve(2, "-200", Refusal::RoomNotAllowed),
            eve(3, "-200", Refusal::Stale),
        ];
        for room in 0..5 {
            all.push(eve(
                10 + room,
                &format!("-3{room}"),
                Refusal::RoomNotAllowed,
            ));
        }
        let mut last = eve(20, "-200", Refusal::RoomNotAllowed);
        last.sender = "78".into();
        last.name = "Mallory".into();
        all.push(last);
        let newest = recent(&all, |channel| format!("channels/{channel}.lua"));
        let rooms: Vec<(&str, u64)> = newest
            .iter()
            .map(|one| (one.room.as_str(), one.count))
            .collect();
        assert_eq!(
            rooms,
            vec![("-200", 3), ("-34", 1), ("-33", 1), ("-32", 1), ("-31", 1)]
        );
        assert_eq!(newest[0].sender, "78", "the last sender");
        assert_eq!(newest[0].last, at(20));
        assert_eq!(
            newest[0].fix,
            Refusal::RoomNotAllowed.fix("channels/tg.lua", "-200", "78")
        );
        assert_eq!(
            newest[0].text(),
            format!(
                "  tg room -200: Mallory (78), 3 times, last 2026-12-03 09:00:20 UTC: {}\n    fix: {}\n",
                Refusal::RoomNotAllowed.words(),
                newest[0].fix
            )
        );
        let stale_and_allowed = recent(&all[..4], |_| "f".into());
        assert_eq!(
            stale_and_allowed
                .iter()
                .map(|one| (one.room.as_str(), one.kind.as_str(), one.count))
                .collect::<Vec<_>>(),
            vec![
                ("-200", "stale", 1),
                ("-200", "room_not_allowed", 2),
                ("-100", "room_not_allowed", 1)
            ]
        );
        assert!(recent(&[], |_| "f".into()).is_empty());
    }
}
