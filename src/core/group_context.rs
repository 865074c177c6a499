//! Group context: the last lines said in a group room that did not address the agent, offered to
//! the model with the next message there that does. Bounded three ways: a few lines per room,
//! lines no older than a day, and a cap on rooms (the room spoken in longest ago goes first).

use crate::Timestamp;
use std::collections::{HashMap, VecDeque};

/// Lines kept per room.
pub const LINES_PER_ROOM: usize = 5;

/// Rooms kept at once; past it, the room whose newest line is oldest is forgotten.
pub const MAX_ROOMS: usize = 1024;

/// How old a line may be and still be offered.
pub const MAX_AGE: chrono::TimeDelta = chrono::TimeDelta::days(1);

/// The lines kept per (channel, room).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupContext {
    rooms: HashMap<(String, String), VecDeque<(Timestamp, String)>>,
}

impl GroupContext {
    /// Keeps `line`, said at `at` in `room` of `channel`. Lines older than a day are dropped
    /// everywhere first, then the room over the cap spoken in longest ago.
    pub fn push(&mut self, channel: &str, room: &str, line: String, at: Timestamp) {
        self.forget_before(at - MAX_AGE);
        let key = (channel.to_owned(), room.to_owned());
        if !self.rooms.contains_key(&key) && self.rooms.len() >= MAX_ROOMS {
            let stalest = self
                .rooms
                .iter()
                .min_by_key(|(_, lines)| lines.back().map(|(at, _)| *at))
                .map(|(key, _)| key.clone());
            if let Some(stalest) = stalest {
                self.rooms.remove(&stalest);
            }
        }
        let lines = self.rooms.entry(key).or_default();
        lines.push_back((at, line));
        while lines.len() > LINES_PER_ROOM {
            lines.pop_front();
        }
    }

    /// Takes the lines of `room` of `channel` no older than a day at `now`, oldest first; the
    /// room keeps none.
    pub fn take(&mut self, channel: &str, room: &str, now: Timestamp) -> Vec<String> {
        self.rooms
            .remove(&(channel.to_owned(), room.to_owned()))
            .into_iter()
            .flatten()
            .filter(|(at, _)| *at >= now - MAX_AGE)
            .map(|(_, line)| line)
            .collect()
    }

    /// How many rooms have lines kept.
    pub fn rooms(&self) -> usize {
        self.rooms.len()
    }

    fn forget_before(&mut self, oldest: Timestamp) {
        self.rooms.retain(|_, lines| {
            while lines.front().is_some_and(|(at, _)| *at < oldest) {
                lines.pop_front();
            }
            !lines.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(hours: i64) -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::TimeDelta::hours(hours)
    }

    #[test]
    fn a_room_keeps_its_last_lines_until_taken() {
        let mut context = GroupContext::default();
        for n in 0..7 {
            context.push("tg", "r", format!("line {n}"), at(0));
        }
        context.push("tg", "other", "elsewhere".into(), at(0));
        context.push("dc", "r", "another channel".into(), at(0));
        assert_eq!(
            context.take("tg", "r", at(1)),
            ["line 2", "line 3", "line 4", "line 5", "line 6"]
        );
        assert!(context.take("tg", "r", at(1)).is_empty(), "taken once");
        assert_eq!(context.rooms(), 2, "the other rooms keep theirs");
    }

    #[test]
    fn lines_older_than_a_day_are_neither_offered_nor_kept() {
        let mut context = GroupContext::default();
        context.push("tg", "r", "old".into(), at(0));
        context.push("tg", "r", "newer".into(), at(20));
        assert_eq!(context.take("tg", "r", at(25)), ["newer"]);

        context.push("tg", "quiet", "said once".into(), at(0));
        context.push("tg", "busy", "much later".into(), at(30));
        assert_eq!(context.rooms(), 1, "a room silent for a day is forgotten");
        assert!(context.take("tg", "quiet", at(30)).is_empty());
    }

    #[test]
    fn the_rooms_kept_are_capped_the_stalest_going_first() {
        let mut context = GroupContext::default();
        context.push("tg", "first", "the stalest".into(), at(0));
        context.push("tg", "second", "kept".into(), at(1));
        for room in 0..MAX_ROOMS {
            context.push("tg", &format!("room {room}"), "hi".into(), at(2));
        }
        assert_eq!(context.rooms(), MAX_ROOMS);
        assert!(context.take("tg", "first", at(2)).is_empty());
        assert!(context.take("tg", "second", at(2)).is_empty());
        assert_eq!(context.take("tg", "room 0", at(2)), ["hi"]);
    }
}
