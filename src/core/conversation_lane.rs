//! Which lane a conversation (a channel, a room in it, a thread in that) uses.
//!
//! A conversation's lane is named `<channel>-<room>[-<thread>]`, made safe and cut to 35
//! characters so an operator can tell it apart, then `-` and 16 hex digits (64 bits) of a SHA-256
//! of the three, so that no two conversations share a lane and no chat user can make theirs
//! share someone else's. Such a name is never a heartbeat lane's (see [`LaneKind`]): where the
//! readable part would make it look like one (a channel named `heartbeat`), it starts `chat-`.
//!
//! Earlier versions named it `<channel>-<room>[-<thread>]` when that was a valid lane name
//! ("exact"), else a 48-character prefix and a CRC32, which anyone can forge. An agent directory
//! written by them keeps its conversations: the earlier lane is adopted when it is certainly the
//! conversation's own ([`adoption`]), and the decision is recorded once ([`EarlierLane`]).

use crate::name::{LaneKind, LaneName};
use crate::origin::MessageOrigin;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// One conversation: a room of a channel, and a thread in it where the platform has threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conversation<'a> {
    /// The channel's name (its file stem).
    pub channel: &'a str,
    /// The platform's room id.
    pub room: &'a str,
    pub thread: Option<&'a str>,
}

/// Hex digits of the conversation's digest in its lane's name: 64 bits.
pub const DIGEST_HEX: usize = 16;

/// The longest readable part of a conversation lane's name, before its digest: the name is then
/// at most 52 characters, so its `/new` generations (`-n<generation>`) stay whole within a lane
/// name's 64.
const READABLE_MAX: usize = 35;

/// What starts a conversation lane's name when its readable part alone would look like a
/// heartbeat lane.
const CHAT_PREFIX: &str = "chat-";

impl Conversation<'_> {
    /// The conversation's lane, as perch names it now.
    pub fn lane(&self) -> LaneName {
        let digest = self.digest();
        let readable = readable(&self.raw());
        let named = |readable: &str| {
            let readable: String = readable.chars().take(READABLE_MAX).collect();
            LaneName::try_from(format!("{readable}-{digest}"))
                .expect("letters, digits, '-' and '_' from a letter or digit make a lane name")
        };
        let lane = named(&readable);
        if lane.kind() == LaneKind::Conversation {
            lane
        } else {
            named(&format!("{CHAT_PREFIX}{readable}"))
        }
    }

    /// The lane earlier versions gave the conversation, and whether its name is exact (the
    /// conversation's own words) rather than hashed; `None` only when even that was not a valid
    /// lane name.
    pub fn earlier_lane(&self) -> Option<EarlierName> {
        let raw = self.raw();
        let cleaned: String = raw.chars().map(safe_char).collect();
        let trimmed = cleaned.trim_start_matches(['-', '_']);
        if trimmed == raw
            && let Ok(lane) = LaneName::try_from(trimmed)
        {
            return Some(EarlierName { lane, exact: true });
        }
        let hash = crc32fast::hash(raw.as_bytes());
        let prefix: String = trimmed.chars().take(48).collect();
        LaneName::try_from(format!("{prefix}-{hash:08x}"))
            .or_else(|_| LaneName::try_from(format!("lane-{hash:08x}")))
            .ok()
            .map(|lane| EarlierName { lane, exact: false })
    }

    /// Whether a user message that came from `origin` came from this conversation. The origin
    /// names its room by the channel file's `alias` for it where there is one.
    pub fn is_origin_of(&self, origin: &MessageOrigin, alias: Option<&str>) -> bool {
        origin.channel == self.channel
            && (origin.room == self.room || alias.is_some_and(|alias| origin.room == alias))
            && origin.thread.as_deref() == self.thread
    }

    fn raw(&self) -> String {
        match self.thread {
            Some(thread) => format!("{}-{}-{thread}", self.channel, self.room),
            None => format!("{}-{}", self.channel, self.room),
        }
    }

    /// The first [`DIGEST_HEX`] hex digits of a SHA-256 over the three parts, each with its
    /// length, so no two conversations are hashed from the same bytes.
    fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"perch conversation lane\0");
        for part in [Some(self.channel), Some(self.room), self.thread] {
            match part {
                Some(text) => {
                    hasher.update([1]);
                    hasher.update((text.len() as u64).to_be_bytes());
                    hasher.update(text.as_bytes());
                }
                None => hasher.update([0]),
            }
        }
        let mut hex = String::with_capacity(DIGEST_HEX);
        for byte in &hasher.finalize()[..DIGEST_HEX / 2] {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

fn safe_char(c: char) -> char {
    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
        c
    } else {
        '_'
    }
}

/// `raw` with every character a lane name cannot hold made `_`, from its first letter or digit
/// (`lane` when it has none).
fn readable(raw: &str) -> String {
    let cleaned: String = raw.chars().map(safe_char).collect();
    let trimmed = cleaned.trim_start_matches(['-', '_']);
    if trimmed.is_empty() {
        "lane".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The name earlier versions gave a conversation's lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierName {
    pub lane: LaneName,
    /// The conversation's own words (`tg-4242`), not a prefix and a CRC32.
    pub exact: bool,
}

/// What was decided, once, about an earlier lane of a conversation: kept in
/// `.perch/earlier-lanes/<the conversation's lane>.json`, written when the conversation first
/// met its earlier lane, and read at every later message instead of deciding again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlierLane {
    pub channel: String,
    pub room: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The lane earlier versions gave the conversation.
    pub lane: LaneName,
    pub adoption: Adoption,
}

/// Whether a conversation keeps the lane earlier versions gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "adopted", rename_all = "snake_case", deny_unknown_fields)]
pub enum Adoption {
    /// Kept: its name is exactly the conversation's (no hash), and no message in it came from
    /// another conversation.
    ExactName,
    /// Kept: its name is hashed, and every one of its `messages` user messages (at least one)
    /// says it came from this conversation.
    SameOrigins { messages: u64 },
    /// Not certainly the conversation's own: the conversation continues in its own lane, and
    /// the earlier one stays on disk.
    #[serde(rename = "no")]
    Refused { reason: String },
}

impl EarlierLane {
    /// The record of `adoption` of `lane` by `conversation`.
    pub fn new(conversation: &Conversation<'_>, lane: LaneName, adoption: Adoption) -> EarlierLane {
        EarlierLane {
            channel: conversation.channel.to_owned(),
            room: conversation.room.to_owned(),
            thread: conversation.thread.map(str::to_owned),
            lane,
            adoption,
        }
    }

    /// Whether the record is about `conversation`.
    pub fn is_for(&self, conversation: &Conversation<'_>) -> bool {
        self.channel == conversation.channel
            && self.room == conversation.room
            && self.thread.as_deref() == conversation.thread
    }

    /// The lane the conversation uses: the earlier one when it was adopted, else `own`.
    pub fn lane_in_use(&self, own: LaneName) -> LaneName {
        match self.adoption {
            Adoption::ExactName | Adoption::SameOrigins { .. } => self.lane.clone(),
            Adoption::Refused { .. } => own,
        }
    }
}

/// What an earlier lane holds, as far as adopting it goes: read from it and from its `/new`
/// generations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EarlierContents {
    /// Where each of its user messages says it came from; lanes written before origins were
    /// kept have none.
    pub origins: Vec<MessageOrigin>,
    /// Its lines that could not be read.
    pub damaged: u64,
}

/// Decides whether `conversation` keeps its earlier lane `earlier`, from what the lane holds;
/// `alias` is the channel file's name for the conversation's room, which origins use. The
/// lane is kept only when that is certain: a line that cannot be read, or a message from
/// anywhere else, refuses it; an exact name needs nothing more; a hashed one (whose CRC32
/// anyone can forge) needs at least one message, and every message, to say it came from this
/// conversation.
pub fn adoption(
    conversation: &Conversation<'_>,
    alias: Option<&str>,
    earlier: &EarlierName,
    contents: &EarlierContents,
) -> Adoption {
    if contents.damaged > 0 {
        return Adoption::Refused {
            reason: format!(
                "{} of its lines cannot be read, so where its messages came from is not certain",
                contents.damaged
            ),
        };
    }
    if let Some(other) = contents
        .origins
        .iter()
        .find(|origin| !conversation.is_origin_of(origin, alias))
    {
        let thread = other
            .thread
            .as_ref()
            .map_or_else(String::new, |thread| format!(" thread {thread}"));
        return Adoption::Refused {
            reason: format!(
                "it holds a message from {} room {}{thread}, another conversation",
                other.channel, other.room
            ),
        };
    }
    if earlier.exact {
        return Adoption::ExactName;
    }
    if contents.origins.is_empty() {
        return Adoption::Refused {
            reason: "its name ends in a CRC32 another conversation can share, and no message in \
                     it says where it came from"
                .to_owned(),
        };
    }
    Adoption::SameOrigins {
        messages: contents.origins.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::origin::Person;
    use chrono::TimeZone;

    fn conversation<'a>(
        channel: &'a str,
        room: &'a str,
        thread: Option<&'a str>,
    ) -> Conversation<'a> {
        Conversation {
            channel,
            room,
            thread,
        }
    }

    fn origin(channel: &str, room: &str, thread: Option<&str>) -> MessageOrigin {
        MessageOrigin {
            sender: Person {
                id: "11".into(),
                name: "Ana".into(),
            },
            channel: channel.into(),
            room: room.into(),
            thread: thread.map(str::to_owned),
            sent_at: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 15, 0, 0).unwrap(),
            direct: false,
            replying_to: None,
            earlier: Vec::new(),
        }
    }

    /// Two thread ids of one Matrix room whose earlier lane names are the same: the CRC32 of
    /// `mx-!hideout:example.org-<thread>` is `4be422ce` for both, and the 48-character prefix
    /// ends before they differ. Found by a birthday search over `$threadroot…<8 digits>`.
    const COLLIDING_THREADS: [&str; 2] = [
        "$threadrootthreadrootthreadroot09685295",
        "$threadrootthreadrootthreadroot12060020",
    ];
    const HIDEOUT: &str = "!hideout:example.org";

    #[test]
    fn two_threads_whose_earlier_lanes_collide_get_lanes_of_their_own() {
        let [first, second] =
            COLLIDING_THREADS.map(|thread| conversation("mx", HIDEOUT, Some(thread)));
        let (old_first, old_second) = (
            first.earlier_lane().unwrap(),
            second.earlier_lane().unwrap(),
        );
        assert_eq!(old_first, old_second, "the earlier names collide");
        assert_eq!(
            old_first.lane.as_str(),
            "mx-_hideout_example_org-_threadrootthreadrootthr-4be422ce"
        );
        assert!(!old_first.exact);
        assert_ne!(first.lane(), second.lane());
        assert_eq!(
            first.lane().as_str(),
            format!("mx-_hideout_example_org-_threadroot-{}", first.digest())
        );
    }

    #[test]
    fn a_brute_forced_crc32_collision_between_threads_is_found_and_told_apart() {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let thread_id = |n: u64| {
            let mut mixed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut id = String::from("$threadrootthreadrootthreadroot");
            for _ in 0..8 {
                id.push(char::from(ALPHABET[(mixed % 62) as usize]));
                mixed /= 62;
            }
            id
        };
        let mut seen = std::collections::HashMap::new();
        let mut pair = None;
        for n in 0..1_000_000 {
            let thread = thread_id(n);
            let earlier = conversation("mx", HIDEOUT, Some(&thread))
                .earlier_lane()
                .unwrap();
            if let Some(other) = seen.insert(earlier.lane, thread.clone()) {
                pair = Some((other, thread));
                break;
            }
        }
        let (one, two) = pair.expect("a CRC32 collision within a million thread ids");
        let (one, two) = (
            conversation("mx", HIDEOUT, Some(&one)),
            conversation("mx", HIDEOUT, Some(&two)),
        );
        assert_eq!(one.earlier_lane(), two.earlier_lane());
        assert_ne!(one.lane(), two.lane());
    }

    #[test]
    fn conversation_lanes_are_readable_distinct_and_never_a_heartbeats() {
        let long_room = "9".repeat(80);
        let table: [(Conversation<'_>, &str); 7] = [
            (conversation("tg", "4242", None), "tg-4242-"),
            (conversation("tg", "-100123", Some("7")), "tg--100123-7-"),
            (
                conversation("mx", "!room:example.org", Some("$ev")),
                "mx-_room_example_org-_ev-",
            ),
            (
                conversation("heartbeat", "digest", None),
                "chat-heartbeat-digest-",
            ),
            (
                conversation("heartbeat", "Digest", None),
                "heartbeat-Digest-",
            ),
            (
                conversation("discord", &long_room, None),
                "discord-999999999999999999999999999-",
            ),
            (conversation("é", "", None), "lane-"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (conversation, prefix) in table {
            let lane = conversation.lane();
            assert!(
                lane.as_str().starts_with(prefix),
                "{lane} for {conversation:?}"
            );
            assert_eq!(lane.as_str().len(), prefix.len() + DIGEST_HEX, "{lane}");
            assert!(lane.as_str().len() <= 52, "{lane}");
            assert_eq!(lane.kind(), LaneKind::Conversation, "{lane}");
            assert_eq!(lane, conversation.lane(), "the same every time");
            assert!(seen.insert(lane));
        }
    }

    #[test]
    fn lane_names_stay_what_they_are_on_disk() {
        let table = [
            (conversation("tg", "42", None), "tg-42-a69b25403314d72a"),
            (
                conversation("tg", "-100123", Some("7")),
                "tg--100123-7-2119b872a96e607b",
            ),
            (
                conversation("mx", HIDEOUT, Some(COLLIDING_THREADS[0])),
                "mx-_hideout_example_org-_threadroot-bbb0601229ef0391",
            ),
            (
                conversation("heartbeat", "digest", None),
                "chat-heartbeat-digest-5fec4e2b8403e815",
            ),
        ];
        for (conversation, name) in table {
            assert_eq!(conversation.lane().as_str(), name, "{conversation:?}");
        }
    }

    #[test]
    fn the_three_parts_are_hashed_apart() {
        let lanes = [
            conversation("a-b", "c", None),
            conversation("a", "b-c", None),
            conversation("a", "b", Some("c")),
            conversation("a", "b-c", Some("")),
            conversation("a", "b", Some("-c")),
        ]
        .map(|conversation| conversation.lane());
        let distinct: std::collections::BTreeSet<_> = lanes.iter().collect();
        assert_eq!(distinct.len(), lanes.len(), "{lanes:?}");
        assert_eq!(
            conversation("a-b", "c", None).earlier_lane(),
            conversation("a", "b-c", None).earlier_lane(),
            "the earlier naming ran them together"
        );
    }

    #[test]
    fn earlier_names_are_what_earlier_versions_wrote() {
        let table = [
            (conversation("ops", "123", None), "ops-123", true),
            (conversation("tg", "-100123", None), "tg--100123", true),
            (
                conversation("tg", "-100123", Some("5")),
                "tg--100123-5",
                true,
            ),
            (
                conversation("ops", "!room:example.org", Some("$thread")),
                "ops-_room_example_org-_thread-6c9dfc95",
                false,
            ),
        ];
        for (conversation, name, exact) in table {
            let earlier = conversation.earlier_lane().unwrap();
            assert_eq!(
                (earlier.lane.as_str(), earlier.exact),
                (name, exact),
                "{conversation:?}"
            );
        }
    }

    #[test]
    fn an_earlier_lane_is_adopted_only_when_certain() {
        let mx = conversation("mx", HIDEOUT, Some(COLLIDING_THREADS[0]));
        let hashed = mx.earlier_lane().unwrap();
        let tg = conversation("tg", "-100123", None);
        let exact = tg.earlier_lane().unwrap();
        let own = origin("mx", HIDEOUT, Some(COLLIDING_THREADS[0]));
        let other_thread = origin("mx", HIDEOUT, Some(COLLIDING_THREADS[1]));
        let contents =
            |origins: Vec<MessageOrigin>, damaged: u64| EarlierContents { origins, damaged };
        let refused = |adoption: &Adoption| matches!(adoption, Adoption::Refused { .. });
        type Case<'a> = (
            &'a str,
            &'a Conversation<'a>,
            Option<&'a str>,
            &'a EarlierName,
            EarlierContents,
            Adoption,
        );
        let table: Vec<Case<'_>> = vec![
            (
                "exact, nothing to say otherwise",
                &tg,
                None,
                &exact,
                contents(vec![], 0),
                Adoption::ExactName,
            ),
            (
                "exact, its messages by the room's alias",
                &tg,
                Some("team"),
                &exact,
                contents(
                    vec![origin("tg", "team", None), origin("tg", "-100123", None)],
                    0,
                ),
                Adoption::ExactName,
            ),
            (
                "hashed, every message its own",
                &mx,
                None,
                &hashed,
                contents(vec![own.clone(), own.clone()], 0),
                Adoption::SameOrigins { messages: 2 },
            ),
            (
                "hashed, and nothing says where it came from",
                &mx,
                None,
                &hashed,
                contents(vec![], 0),
                Adoption::Refused {
                    reason: "its name ends in a CRC32 another conversation can share, and no \
                             message in it says where it came from"
                        .into(),
                },
            ),
            (
                "hashed, one message from the colliding thread",
                &mx,
                None,
                &hashed,
                contents(vec![own, other_thread], 0),
                Adoption::Refused {
                    reason: format!(
                        "it holds a message from mx room {HIDEOUT} thread {}, another conversation",
                        COLLIDING_THREADS[1]
                    ),
                },
            ),
            (
                "exact, but a message from another channel",
                &tg,
                None,
                &exact,
                contents(vec![origin("tg2", "-100123", None)], 0),
                Adoption::Refused {
                    reason: "it holds a message from tg2 room -100123, another conversation".into(),
                },
            ),
            (
                "exact, but a message from a thread of the room",
                &tg,
                None,
                &exact,
                contents(vec![origin("tg", "-100123", Some("5"))], 0),
                Adoption::Refused {
                    reason:
                        "it holds a message from tg room -100123 thread 5, another conversation"
                            .into(),
                },
            ),
            (
                "a damaged line",
                &tg,
                None,
                &exact,
                contents(vec![], 1),
                Adoption::Refused {
                    reason: "1 of its lines cannot be read, so where its messages came from is \
                             not certain"
                        .into(),
                },
            ),
        ];
        for (case, conversation, alias, earlier, contents, expected) in table {
            let decided = adoption(conversation, alias, earlier, &contents);
            assert_eq!(decided, expected, "{case}");
            let record = EarlierLane::new(conversation, earlier.lane.clone(), decided);
            assert!(record.is_for(conversation));
            let own_lane = conversation.lane();
            let in_use = record.lane_in_use(own_lane.clone());
            if refused(&record.adoption) {
                assert_eq!(in_use, own_lane, "{case}");
            } else {
                assert_eq!(in_use, earlier.lane, "{case}");
            }
        }
    }

    #[test]
    fn earlier_lane_records_are_golden_per_variant() {
        let tg = conversation("tg", "4242", None);
        let mx = conversation("mx", "!r:x", Some("$t"));
        let table = [
            (
                EarlierLane::new(
                    &tg,
                    LaneName::try_from("tg-4242").unwrap(),
                    Adoption::ExactName,
                ),
                r#"{"channel":"tg","room":"4242","lane":"tg-4242","adoption":{"adopted":"exact_name"}}"#,
            ),
            (
                EarlierLane::new(
                    &mx,
                    LaneName::try_from("mx-_r_x-_t-0a1b2c3d").unwrap(),
                    Adoption::SameOrigins { messages: 3 },
                ),
                r#"{"channel":"mx","room":"!r:x","thread":"$t","lane":"mx-_r_x-_t-0a1b2c3d","adoption":{"adopted":"same_origins","messages":3}}"#,
            ),
            (
                EarlierLane::new(
                    &mx,
                    LaneName::try_from("mx-_r_x-_t-0a1b2c3d").unwrap(),
                    Adoption::Refused {
                        reason: "why".into(),
                    },
                ),
                r#"{"channel":"mx","room":"!r:x","thread":"$t","lane":"mx-_r_x-_t-0a1b2c3d","adoption":{"adopted":"no","reason":"why"}}"#,
            ),
        ];
        for (record, line) in table {
            assert_eq!(serde_json::to_string(&record).unwrap(), line);
            assert_eq!(serde_json::from_str::<EarlierLane>(line).unwrap(), record);
        }
        assert!(
            serde_json::from_str::<EarlierLane>(
                r#"{"channel":"tg","room":"4242","lane":"../x","adoption":{"adopted":"exact_name"}}"#
            )
            .is_err(),
            "a lane that is not a lane name is refused"
        );
    }
}
