//! Who may talk to the agent: the decision on one inbound message, from the channel's file,
//! the approved senders and the clock. The hook runs only on what is admitted.

use crate::Timestamp;
use crate::config::{ChannelConfig, DmPolicy, GroupPolicy};

/// What one arriving message is, as far as the agent is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived<'a> {
    pub sender: &'a str,
    pub sender_is_bot: bool,
    pub direct: bool,
    pub addressed: bool,
    pub room: &'a str,
    pub sent_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Goes to the hook and then to a lane.
    Answer,
    /// A group message not addressed to the agent: kept as context, starts no run.
    Context,
    /// Older than the channel's `max_age`: not answered, so an outage ends without a storm.
    Stale,
    /// An unknown sender in a direct message, on a channel with `dm = "pair"`.
    Pair,
    Refused {
        reason: String,
    },
}

/// Decides on one message. `approved` says whether a sender was approved by pairing;
/// `bot_turns` is how many bot-to-bot exchanges this room has had in a row.
pub fn admit(
    config: &ChannelConfig,
    arrived: &Arrived<'_>,
    now: Timestamp,
    approved: impl Fn(&str) -> bool,
    bot_turns: u32,
) -> Admission {
    let age = (now - arrived.sent_at).to_std().unwrap_or_default();
    if age > config.max_age {
        return Admission::Stale;
    }
    if arrived.sender_is_bot {
        if !config.allow_bots.iter().any(|bot| bot == arrived.sender) {
            return Admission::Refused {
                reason: "messages from bots are ignored unless allow_bots lists them".into(),
            };
        }
        if bot_turns >= config.bot_turns {
            return Admission::Refused {
                reason: format!(
                    "loop guard: {} bot-to-bot exchanges in a row in this room",
                    config.bot_turns
                ),
            };
        }
    }
    let known = config.allow.users.iter().any(|user| user == arrived.sender)
        || approved(arrived.sender)
        || config.allow_bots.iter().any(|bot| bot == arrived.sender);
    if arrived.direct {
        return match (known, config.dm) {
            (true, _) | (false, DmPolicy::Allow) => Admission::Answer,
            (false, DmPolicy::Pair) => Admission::Pair,
            (false, DmPolicy::Refuse) => Admission::Refused {
                reason: "direct messages from senders not in allow.users are refused".into(),
            },
        };
    }
    let room_allowed = config
        .room_alias(arrived.room)
        .is_some_and(|alias| config.allow.rooms.contains(alias));
    if !room_allowed && !known {
        return Admission::Refused {
            reason: "neither the room nor the sender is allowed".into(),
        };
    }
    if config.groups == GroupPolicy::Mention && !arrived.addressed {
        return Admission::Context;
    }
    Admission::Answer
}
