//! Who may talk to the agent: the decision on one inbound message, from the channel's file,
//! the approved senders and the clock. The hook runs only on what is admitted.

use crate::Timestamp;
use crate::config::{ChannelConfig, DmPolicy, GroupPolicy};
use std::collections::BTreeSet;

/// What one arriving message is, as far as the agent is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived<'a> {
    pub sender: &'a str,
    pub sender_is_bot: bool,
    pub direct: bool,
    pub addressed: bool,
    pub room: &'a str,
    pub sent_at: Timestamp,
    /// The connector's refusal, made by [`Gate::precheck`] before it looked the message up:
    /// the message carries no more than that check needed.
    pub refused: Option<&'a str>,
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
    if let Some(reason) = arrived.refused {
        return Admission::Refused {
            reason: reason.to_owned(),
        };
    }
    if arrived.sender_is_bot {
        if !config.allow_bots.iter().any(|bot| bot == arrived.sender) {
            return Admission::Refused {
                reason: UNLISTED_BOT.into(),
            };
        }
        if bot_turns >= config.bot_turns {
            return Admission::Refused {
                reason: format!(
                    "{LOOP_GUARD}: {} bot-to-bot exchanges in a row in this room",
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
                reason: DM_REFUSED.into(),
            },
        };
    }
    let room_allowed = config
        .room_alias(arrived.room)
        .is_some_and(|alias| config.allow.rooms.contains(alias));
    if !room_allowed && !known {
        return Admission::Refused {
            reason: NOT_ALLOWED.into(),
        };
    }
    if config.groups == GroupPolicy::Mention && !arrived.addressed {
        return Admission::Context;
    }
    Admission::Answer
}

pub(crate) const UNLISTED_BOT: &str = "messages from bots are ignored unless allow_bots lists them";
pub(crate) const NOT_ALLOWED: &str = "neither the room nor the sender is allowed";
pub(crate) const DM_REFUSED: &str = "direct messages from senders not in allow.users are refused";
/// How the loop guard's refusal begins.
pub(crate) const LOOP_GUARD: &str = "loop guard";
/// How the refusal of a person of another organisation (Slack Connect) not in `allow.users`
/// begins; the connector adds which organisation.
pub const OTHER_ORGANISATION: &str = "a person of another organisation";

/// The part of [`admit`] a connector applies on its own, before it asks its platform anything
/// more about a message (the message it quotes, the room's members): the channel's allowlists
/// and the senders pairing approved. The service hands it to the connector at start and again
/// whenever pairing approves someone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    users: BTreeSet<String>,
    bots: BTreeSet<String>,
    /// The platform ids of the rooms in `allow.rooms`.
    rooms: BTreeSet<String>,
    dm: DmPolicy,
    approved: BTreeSet<String>,
}

/// What [`Gate::precheck`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precheck {
    /// It may be admitted: look it up in full.
    Look,
    /// Only as a direct message could it be admitted: look it up in full if the room is one
    /// (under `dm = "pair"` an unknown sender's direct message is offered pairing); otherwise
    /// hand it on unlooked-at, refused for the reason given.
    LookIfDirect { otherwise: String },
    /// Refused whatever a lookup would find: hand it on unlooked-at, with the reason.
    Refuse { reason: String },
}

impl Gate {
    /// The gate of `config`'s channel, with the senders pairing approved on it.
    pub fn new(config: &ChannelConfig, approved: impl IntoIterator<Item = String>) -> Gate {
        Gate {
            users: config.allow.users.iter().cloned().collect(),
            bots: config.allow_bots.iter().cloned().collect(),
            rooms: config
                .rooms
                .iter()
                .filter(|(alias, _)| config.allow.rooms.contains(alias))
                .map(|(_, id)| id.clone())
                .collect(),
            dm: config.dm,
            approved: approved.into_iter().collect(),
        }
    }

    /// Decides from the sender, whether it is a bot and the room alone. Never refuses what
    /// [`admit`] could admit, whatever the message turns out to be (direct or not, addressed or
    /// not): a refusal here is one `admit` would make too (or a staleness it makes first).
    pub fn precheck(&self, sender: &str, sender_is_bot: bool, room: &str) -> Precheck {
        if sender_is_bot && !self.bots.contains(sender) {
            return Precheck::Refuse {
                reason: UNLISTED_BOT.into(),
            };
        }
        let known = self.users.contains(sender)
            || self.approved.contains(sender)
            || self.bots.contains(sender);
        if known || self.rooms.contains(room) {
            return Precheck::Look;
        }
        match self.dm {
            DmPolicy::Allow | DmPolicy::Pair => Precheck::LookIfDirect {
                otherwise: NOT_ALLOWED.into(),
            },
            DmPolicy::Refuse => Precheck::Refuse {
                reason: NOT_ALLOWED.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Access, BusyPolicy, Platform, ThreadPolicy};
    use crate::name::{ChannelName, EnvName, RoomAlias};
    use crate::problem::Pos;
    use crate::secret::EnvRef;
    use chrono::TimeZone;
    use std::time::Duration;

    const TEAM: &str = "!team:example.org";
    const OTHER: &str = "!other:example.org";

    fn config(
        dm: DmPolicy,
        groups: GroupPolicy,
        users: &[&str],
        bots: &[&str],
        team_allowed: bool,
    ) -> ChannelConfig {
        let team = RoomAlias::try_from("team").unwrap();
        ChannelConfig {
            name: ChannelName::try_from("mx").unwrap(),
            pos: Pos::line(1),
            platform: Platform::Telegram {
                token: EnvRef::new(EnvName::try_from("TOKEN").unwrap()),
            },
            api_url: None,
            rooms: [(team.clone(), TEAM.to_owned())].into_iter().collect(),
            allow: Access {
                users: users.iter().map(|user| (*user).to_owned()).collect(),
                rooms: if team_allowed { vec![team] } else { Vec::new() },
            },
            dm,
            groups,
            busy: BusyPolicy::Followup,
            threads: ThreadPolicy::Own,
            max_age: Duration::from_secs(3600),
            queue_limit: 20,
            allow_bots: bots.iter().map(|bot| (*bot).to_owned()).collect(),
            bot_turns: 3,
            on_message: None,
            format: None,
        }
    }

    fn now() -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2026, 12, 2, 15, 0, 0).unwrap()
    }

    /// One message as `admit` sees it, with what else decides it.
    struct Shape {
        sender: &'static str,
        sender_is_bot: bool,
        room: &'static str,
        direct: bool,
        addressed: bool,
        bot_turns: u32,
        age: i64,
    }

    fn every_shape() -> Vec<Shape> {
        let mut shapes = Vec::new();
        for sender in ["@u:x", "@b:x", "@p:x", "@stranger:x"] {
            for (sender_is_bot, room, direct, addressed) in [false, true]
                .into_iter()
                .flat_map(|bot| [TEAM, OTHER].map(|room| (bot, room)))
                .flat_map(|(bot, room)| [false, true].map(|direct| (bot, room, direct)))
                .flat_map(|(bot, room, direct)| {
                    [false, true].map(|addressed| (bot, room, direct, addressed))
                })
            {
                for (bot_turns, age) in [(0, 10), (5, 10), (0, 7200), (5, 7200)] {
                    shapes.push(Shape {
                        sender,
                        sender_is_bot,
                        room,
                        direct,
                        addressed,
                        bot_turns,
                        age,
                    });
                }
            }
        }
        shapes
    }

    /// Every channel setting, sender, room and message shape against the full decision: what
    /// the gate refuses, `admit` refuses too (or finds stale first), and with the gate's
    /// reason passed on it decides the same; what the gate looks at only as a direct message,
    /// `admit` refuses when it is not one.
    #[test]
    fn the_gate_never_refuses_what_admission_would_admit() {
        let mut configs = Vec::new();
        for dm in [DmPolicy::Allow, DmPolicy::Pair, DmPolicy::Refuse] {
            for groups in [GroupPolicy::Mention, GroupPolicy::All] {
                for (users, bots) in [(&[][..], &[][..]), (&["@u:x"][..], &["@b:x"][..])] {
                    for team_allowed in [false, true] {
                        configs.push(config(dm, groups, users, bots, team_allowed));
                    }
                }
            }
        }
        let (mut refused, mut looked_if_direct) = (0, 0);
        for config in &configs {
            for approved in [&[][..], &["@p:x"][..]] {
                let gate = Gate::new(config, approved.iter().map(|sender| (*sender).to_owned()));
                let is_approved = |who: &str| approved.contains(&who);
                for shape in every_shape() {
                    let precheck = gate.precheck(shape.sender, shape.sender_is_bot, shape.room);
                    let arrived = Arrived {
                        sender: shape.sender,
                        sender_is_bot: shape.sender_is_bot,
                        direct: shape.direct,
                        addressed: shape.addressed,
                        room: shape.room,
                        sent_at: now() - chrono::Duration::seconds(shape.age),
                        refused: None,
                    };
                    let full = admit(config, &arrived, now(), is_approved, shape.bot_turns);
                    let case = format!(
                        "{:?} {:?} users {:?} bots {:?} rooms {:?} approved {approved:?}: {} \
                         (bot {}) in {}, direct {}, addressed {}, {} bot turns, {} s old: gate \
                         {precheck:?}, admit {full:?}",
                        config.dm,
                        config.groups,
                        config.allow.users,
                        config.allow_bots,
                        config.allow.rooms,
                        shape.sender,
                        shape.sender_is_bot,
                        shape.room,
                        shape.direct,
                        shape.addressed,
                        shape.bot_turns,
                        shape.age
                    );
                    let not_admitted = matches!(full, Admission::Refused { .. } | Admission::Stale);
                    match &precheck {
                        Precheck::Refuse { reason } => {
                            refused += 1;
                            assert!(not_admitted, "{case}");
                            let early = Arrived {
                                refused: Some(reason),
                                ..arrived
                            };
                            let expected = if shape.age > 3600 {
                                Admission::Stale
                            } else {
                                Admission::Refused {
                                    reason: reason.clone(),
                                }
                            };
                            assert_eq!(
                                admit(config, &early, now(), is_approved, shape.bot_turns),
                                expected,
                                "{case}"
                            );
                        }
                        Precheck::LookIfDirect { otherwise } if !shape.direct => {
                            looked_if_direct += 1;
                            assert!(not_admitted, "{case}");
                            let early = Arrived {
                                refused: Some(otherwise),
                                ..arrived
                            };
                            let decided =
                                admit(config, &early, now(), is_approved, shape.bot_turns);
                            assert_eq!(
                                std::mem::discriminant(&decided),
                                std::mem::discriminant(&full),
                                "{case}"
                            );
                        }
                        Precheck::LookIfDirect { .. } | Precheck::Look => {}
                    }
                }
            }
        }
        assert!(
            refused > 500 && looked_if_direct > 500,
            "{refused} {looked_if_direct}"
        );
    }

    #[test]
    fn the_gate_looks_only_at_allowed_rooms_known_senders_and_possible_direct_messages() {
        let pair = config(
            DmPolicy::Pair,
            GroupPolicy::Mention,
            &["@u:x"],
            &["@b:x"],
            true,
        );
        let refuse = config(DmPolicy::Refuse, GroupPolicy::Mention, &["@u:x"], &[], true);
        let approved = || vec!["@p:x".to_owned()];
        let not_allowed = Precheck::Refuse {
            reason: "neither the room nor the sender is allowed".into(),
        };
        let table = [
            (&pair, "@u:x", false, OTHER, Precheck::Look),
            (&pair, "@p:x", false, OTHER, Precheck::Look),
            (&pair, "@b:x", true, OTHER, Precheck::Look),
            (&pair, "@stranger:x", false, TEAM, Precheck::Look),
            (
                &pair,
                "@stranger:x",
                false,
                OTHER,
                Precheck::LookIfDirect {
                    otherwise: "neither the room nor the sender is allowed".into(),
                },
            ),
            (
                &pair,
                "@otherbot:x",
                true,
                TEAM,
                Precheck::Refuse {
                    reason: "messages from bots are ignored unless allow_bots lists them".into(),
                },
            ),
            (&refuse, "@stranger:x", false, OTHER, not_allowed.clone()),
            (&refuse, "@stranger:x", false, TEAM, Precheck::Look),
            (&refuse, "@p:x", false, OTHER, Precheck::Look),
        ];
        for (config, sender, is_bot, room, expected) in table {
            let gate = Gate::new(config, approved());
            assert_eq!(
                gate.precheck(sender, is_bot, room),
                expected,
                "{sender} bot {is_bot} in {room} under {:?}",
                config.dm
            );
        }
        let unapproved = Gate::new(&refuse, Vec::new());
        assert_eq!(unapproved.precheck("@p:x", false, OTHER), not_allowed);
    }
}
