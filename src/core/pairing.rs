//! Pairing: how an unknown sender in a direct message becomes an approved one, and how the
//! operator controls it. The sender's request is listed with a short code; the operator approves
//! it by that code or by the sender's id (`perch pair approve CODE` or `CHANNEL:USER_ID`), denies
//! it, or later revokes an approved sender. Requests expire after an hour, a sender has at most
//! one, and a channel lists at most [`MAX_PENDING_PER_CHANNEL`]: when a new request finds the
//! list full, the oldest request is dropped for it, so the newest requests are always listed and
//! a person a flood pushed out is listed again as soon as they write again. Such a sender is told
//! pairing is busy and given their id to pass on, since approving by id needs no request at all:
//! no number of strangers can keep a person the operator names from being let in.

use crate::Timestamp;
use serde::{Deserialize, Serialize};

/// How long a request (and its code) can be approved.
pub const CODE_LIFETIME_SECONDS: i64 = 3600;
/// Requests pending at once, per channel; a new one past it drops the oldest.
pub const MAX_PENDING_PER_CHANNEL: usize = 32;
/// Senders remembered as told that pairing is busy (so each is told once an hour); past it, the
/// oldest is forgotten.
pub const MAX_BUSY_TOLD: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pairing {
    #[serde(default)]
    pub pending: Vec<PendingPair>,
    #[serde(default)]
    pub approved: Vec<Approved>,
    /// Senders told that pairing is busy, until when they are not told again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub told_busy: Vec<ToldBusy>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToldBusy {
    pub channel: String,
    pub sender: String,
    pub until: Timestamp,
}

/// A sender's request to be let in, as received (the name is shown escaped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPair {
    pub code: String,
    pub channel: String,
    pub sender: String,
    pub name: String,
    pub expires: Timestamp,
    /// The direct-message room the request came from, where the approved person is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
}

impl PendingPair {
    /// When the request was made.
    pub fn requested(&self) -> Timestamp {
        self.expires - chrono::Duration::seconds(CODE_LIFETIME_SECONDS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approved {
    pub channel: String,
    pub sender: String,
    pub name: String,
    /// The direct-message room their request came from, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
    /// Approved while perch was not running: the next start tells them, once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notice_due: bool,
}

/// Whom an operator's pairing command names: a request by its code, or a sender by channel and
/// platform id (`CHANNEL:USER_ID`, split at the first colon: channel names have none, Matrix ids
/// do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Who {
    Sender { channel: String, sender: String },
    Code { code: String },
}

impl Who {
    /// Reads what the operator typed: `CHANNEL:USER_ID` or a code.
    pub fn parse(text: &str) -> Result<Who, String> {
        let text = text.trim();
        match text.split_once(':') {
            Some((channel, sender)) if !channel.is_empty() && !sender.trim().is_empty() => {
                crate::name::ChannelName::try_from(channel)
                    .map_err(|error| format!("{text}: not CHANNEL:USER_ID: {error}"))?;
                Ok(Who::Sender {
                    channel: channel.to_owned(),
                    sender: sender.trim().to_owned(),
                })
            }
            Some(_) => Err(format!(
                "{text}: not CHANNEL:USER_ID (both parts are needed, as in tg:123456789)"
            )),
            None if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric()) => {
                Ok(Who::Code {
                    code: text.to_owned(),
                })
            }
            None => Err(format!(
                "{text:?}: neither a pairing code nor CHANNEL:USER_ID (as in tg:123456789)"
            )),
        }
    }

    /// Whether `pending` is the request this names.
    fn names(&self, pending: &PendingPair) -> bool {
        match self {
            Who::Code { code } => pending.code.eq_ignore_ascii_case(code.trim()),
            Who::Sender { channel, sender } => {
                &pending.channel == channel && &pending.sender == sender
            }
        }
    }
}

/// What a sender's message asking to be let in gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    /// A new request and its code; tell the sender.
    New(String),
    /// The sender already has a request pending; say nothing more (no spam to a sender who
    /// keeps writing).
    Pending,
    /// The channel's list was full: the request is listed under `code`, and `dropped`, the
    /// oldest, is no longer. Tell the sender that pairing is busy and to give the operator their
    /// id (a code may be dropped in turn before the operator gets to it; the id always works).
    Busy { code: String, dropped: PendingPair },
    /// Busy, listed, and this sender was already told so within the hour; say nothing.
    BusyTold,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Approved(Approved),
    /// No pending request has that code (approving a sender by id always succeeds).
    Unknown,
}

impl Pairing {
    pub fn is_approved(&self, channel: &str, sender: &str) -> bool {
        self.approved
            .iter()
            .any(|approved| approved.channel == channel && approved.sender == sender)
    }

    /// Forgets expired requests, and busy notices that may be given again.
    pub fn expire(&mut self, now: Timestamp) {
        self.pending.retain(|pending| pending.expires > now);
        self.told_busy.retain(|told| told.until > now);
    }

    /// Lists a request from an unknown sender in direct-message `room` under `code` (random,
    /// from the caller), unless one is pending; a full channel drops its oldest request for it.
    pub fn issue(
        &mut self,
        channel: &str,
        sender: &str,
        name: &str,
        room: &str,
        code: String,
        now: Timestamp,
    ) -> Issued {
        self.expire(now);
        if self
            .pending
            .iter()
            .any(|pending| pending.channel == channel && pending.sender == sender)
        {
            return Issued::Pending;
        }
        let oldest = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, pending)| pending.channel == channel)
            .min_by_key(|(_, pending)| pending.expires)
            .map(|(index, _)| index);
        let listed = self
            .pending
            .iter()
            .filter(|pending| pending.channel == channel)
            .count();
        let dropped = match oldest {
            Some(index) if listed >= MAX_PENDING_PER_CHANNEL => Some(self.pending.remove(index)),
            _ => None,
        };
        self.pending.push(PendingPair {
            code: code.clone(),
            channel: channel.to_owned(),
            sender: sender.to_owned(),
            name: name.to_owned(),
            expires: now + chrono::Duration::seconds(CODE_LIFETIME_SECONDS),
            room: Some(room.to_owned()),
        });
        let Some(dropped) = dropped else {
            return Issued::New(code);
        };
        if self
            .told_busy
            .iter()
            .any(|told| told.channel == channel && told.sender == sender)
        {
            return Issued::BusyTold;
        }
        if self.told_busy.len() >= MAX_BUSY_TOLD {
            self.told_busy.remove(0);
        }
        self.told_busy.push(ToldBusy {
            channel: channel.to_owned(),
            sender: sender.to_owned(),
            until: now + chrono::Duration::seconds(CODE_LIFETIME_SECONDS),
        });
        Issued::Busy { code, dropped }
    }

    /// Approves whom `who` names: the sender of the request with that code (case-insensitive),
    /// if it has not expired; or the sender by id, whether or not they asked (their request, if
    /// any, is taken off the list).
    pub fn approve(&mut self, who: &Who, now: Timestamp) -> Approval {
        self.expire(now);
        let request = self
            .pending
            .iter()
            .position(|pending| who.names(pending))
            .map(|index| self.pending.remove(index));
        let approved = match (request, who) {
            (Some(pending), _) => Approved {
                channel: pending.channel,
                sender: pending.sender,
                name: pending.name,
                room: pending.room,
                notice_due: false,
            },
            (None, Who::Code { .. }) => return Approval::Unknown,
            (None, Who::Sender { channel, sender }) => {
                match self
                    .approved
                    .iter()
                    .find(|approved| &approved.channel == channel && &approved.sender == sender)
                {
                    Some(approved) => approved.clone(),
                    None => Approved {
                        channel: channel.clone(),
                        sender: sender.clone(),
                        name: String::new(),
                        room: None,
                        notice_due: false,
                    },
                }
            }
        };
        self.told_busy
            .retain(|told| told.channel != approved.channel || told.sender != approved.sender);
        if !self.is_approved(&approved.channel, &approved.sender) {
            self.approved.push(approved.clone());
        }
        Approval::Approved(approved)
    }

    /// [`Pairing::approve`] while perch is not running: a sender it newly lets in from a
    /// request, whose room is known, is marked for the next start to tell. Approving someone
    /// already in tells them nothing again.
    pub fn approve_while_stopped(&mut self, who: &Who, now: Timestamp) -> Approval {
        let approved_before = self.approved.len();
        let approval = self.approve(who, now);
        if let Approval::Approved(approved) = &approval
            && approved.room.is_some()
            && self.approved.len() > approved_before
        {
            for entry in &mut self.approved {
                if entry.channel == approved.channel && entry.sender == approved.sender {
                    entry.notice_due = true;
                }
            }
        }
        approval
    }

    /// The approved senders the next start owes a notice, their marks cleared: the caller
    /// writes the file before it records the notices, so a notice is recorded at most once.
    pub fn take_notices_due(&mut self) -> Vec<Approved> {
        let mut due = Vec::new();
        for entry in &mut self.approved {
            if entry.notice_due {
                entry.notice_due = false;
                due.push(entry.clone());
            }
        }
        due
    }

    /// Takes the request `who` names off the list, if one is pending; the sender is not told,
    /// and may ask again.
    pub fn deny(&mut self, who: &Who, now: Timestamp) -> Option<PendingPair> {
        self.expire(now);
        let index = self.pending.iter().position(|pending| who.names(pending))?;
        Some(self.pending.remove(index))
    }

    /// Removes an approved sender: their next direct message is a stranger's again.
    pub fn revoke(&mut self, channel: &str, sender: &str) -> Option<Approved> {
        let index = self
            .approved
            .iter()
            .position(|approved| approved.channel == channel && approved.sender == sender)?;
        Some(self.approved.remove(index))
    }
}

/// A pairing code from random bytes: six characters without look-alikes.
pub fn pairing_code(bytes: [u8; 6]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
    bytes
        .iter()
        .map(|byte| char::from(ALPHABET[usize::from(*byte) % ALPHABET.len()]))
        .collect()
}

#[cfg(test)]
mod notices {
    use super::*;
    use chrono::TimeZone as _;

    #[test]
    fn an_approval_while_stopped_is_told_once_at_the_next_start() {
        let now = chrono::Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).unwrap();
        let mut pairing = Pairing::default();
        let issued = pairing.issue("tg", "42", "Ada", "42", "ABC234".into(), now);
        assert_eq!(issued, Issued::New("ABC234".into()));
        let code = Who::Code {
            code: "ABC234".into(),
        };
        let Approval::Approved(approved) = pairing.approve_while_stopped(&code, now) else {
            panic!("approved");
        };
        assert!(
            !approved.notice_due,
            "the returned copy is the approval itself"
        );
        assert!(pairing.approved[0].notice_due);
        let due = pairing.take_notices_due();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].room.as_deref(), Some("42"));
        assert!(pairing.take_notices_due().is_empty(), "told once");
        let again = Who::Sender {
            channel: "tg".into(),
            sender: "42".into(),
        };
        pairing.approve_while_stopped(&again, now);
        assert!(
            pairing.take_notices_due().is_empty(),
            "approving someone already in tells them nothing again"
        );
        let by_id = Who::Sender {
            channel: "tg".into(),
            sender: "77".into(),
        };
        pairing.approve_while_stopped(&by_id, now);
        assert!(
            pairing.take_notices_due().is_empty(),
            "no request, no room to tell them in"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minutes: i64) -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
            + chrono::Duration::minutes(minutes)
    }

    fn code(text: &str) -> Who {
        Who::Code { code: text.into() }
    }

    fn sender(channel: &str, sender: &str) -> Who {
        Who::Sender {
            channel: channel.into(),
            sender: sender.into(),
        }
    }

    /// A pairing with `count` strangers' requests on `tg`, one a minute from `at(0)`.
    fn flooded(count: usize) -> Pairing {
        let mut pairing = Pairing::default();
        for stranger in 0..count {
            let minute = i64::try_from(stranger).unwrap();
            pairing.issue(
                "tg",
                &format!("s{stranger}"),
                "x",
                &format!("s{stranger}"),
                format!("S{stranger}"),
                at(minute) + chrono::Duration::seconds(1),
            );
        }
        pairing
    }

    #[test]
    fn what_the_operator_types_is_read_as_a_code_or_a_sender() {
        let table: [(&str, Result<Who, &str>); 8] = [
            ("K7Q2XM", Ok(code("K7Q2XM"))),
            (" k7q2xm ", Ok(code("k7q2xm"))),
            ("tg:123456789", Ok(sender("tg", "123456789"))),
            (
                "mx:@alice:example.org",
                Ok(sender("mx", "@alice:example.org")),
            ),
            ("tg:", Err("not CHANNEL:USER_ID")),
            (":42", Err("not CHANNEL:USER_ID")),
            ("t g:42", Err("not CHANNEL:USER_ID")),
            ("K7-Q2", Err("neither a pairing code nor CHANNEL:USER_ID")),
        ];
        for (typed, expected) in table {
            match (Who::parse(typed), expected) {
                (Ok(who), Ok(expected)) => assert_eq!(who, expected, "{typed}"),
                (Err(error), Err(expected)) => {
                    assert!(error.contains(expected), "{typed}: {error}");
                }
                (read, expected) => panic!("{typed}: {read:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_request_is_issued_once_approved_once_and_expires() {
        let mut pairing = Pairing::default();
        assert_eq!(
            pairing.issue("tg", "42", "Alice", "42", "ABC234".into(), at(0)),
            Issued::New("ABC234".into())
        );
        assert_eq!(
            pairing.issue("tg", "42", "Alice", "42", "ZZZ999".into(), at(1)),
            Issued::Pending
        );
        assert_eq!(pairing.pending[0].requested(), at(0));
        assert!(!pairing.is_approved("tg", "42"));
        assert_eq!(
            pairing.approve(&code("abc234"), at(2)),
            Approval::Approved(Approved {
                channel: "tg".into(),
                sender: "42".into(),
                name: "Alice".into(),
                room: Some("42".into()),
                notice_due: false,
            })
        );
        assert!(pairing.is_approved("tg", "42"));
        assert_eq!(pairing.approve(&code("ABC234"), at(3)), Approval::Unknown);
        pairing.issue("tg", "7", "Bob", "7", "BOB234".into(), at(0));
        assert_eq!(
            pairing.approve(&code("BOB234"), at(61)),
            Approval::Unknown,
            "expired"
        );
    }

    #[test]
    fn a_sender_is_approved_by_id_with_or_without_a_request() {
        let mut pairing = Pairing::default();
        pairing.issue("tg", "42", "Alice", "room-42", "ABC234".into(), at(0));
        let table = [
            // (who, the approved name, their room, what stays pending)
            (sender("tg", "42"), "Alice", Some("room-42"), 0),
            (sender("tg", "42"), "Alice", Some("room-42"), 0),
            (sender("tg", "7"), "", None, 0),
            (sender("dc", "42"), "", None, 0),
        ];
        for (who, name, room, pending) in table {
            let Approval::Approved(approved) = pairing.approve(&who, at(1)) else {
                panic!("{who:?} was not approved");
            };
            assert_eq!(approved.name, name, "{who:?}");
            assert_eq!(approved.room.as_deref(), room, "{who:?}");
            assert_eq!(pairing.pending.len(), pending, "{who:?}");
        }
        assert_eq!(pairing.approved.len(), 3, "approving twice lists once");
        assert!(pairing.is_approved("dc", "42") && pairing.is_approved("tg", "7"));
    }

    #[test]
    fn deny_drops_a_request_and_revoke_an_approved_sender() {
        let mut pairing = Pairing::default();
        pairing.issue("tg", "42", "Alice", "42", "ABC234".into(), at(0));
        pairing.issue("tg", "7", "Bob", "7", "BOB234".into(), at(0));
        let table = [
            (code("abc234"), Some("42")),
            (code("abc234"), None),
            (sender("tg", "7"), Some("7")),
            (sender("tg", "99"), None),
        ];
        for (who, denied) in table {
            let dropped = pairing.deny(&who, at(1));
            assert_eq!(
                dropped.as_ref().map(|pending| pending.sender.as_str()),
                denied,
                "{who:?}"
            );
        }
        assert!(pairing.pending.is_empty());
        assert_eq!(
            pairing.issue("tg", "42", "Alice", "42", "NEW234".into(), at(2)),
            Issued::New("NEW234".into()),
            "a denied sender may ask again"
        );
        pairing.approve(&sender("tg", "42"), at(3));
        assert_eq!(
            pairing.revoke("tg", "42").map(|approved| approved.name),
            Some("Alice".to_owned())
        );
        assert_eq!(pairing.revoke("tg", "42"), None);
        assert!(!pairing.is_approved("tg", "42"));
    }

    #[test]
    fn a_full_channel_drops_its_oldest_request_for_the_newest() {
        let mut pairing = flooded(MAX_PENDING_PER_CHANNEL);
        let listed = |pairing: &Pairing, sender: &str| {
            pairing
                .pending
                .iter()
                .any(|pending| pending.sender == sender)
        };
        let issued = pairing.issue("tg", "dora", "Dora", "dora", "DORA23".into(), at(40));
        assert!(
            matches!(&issued, Issued::Busy { code, dropped } if code == "DORA23" && dropped.sender == "s0"),
            "{issued:?}"
        );
        assert!(listed(&pairing, "dora") && !listed(&pairing, "s0"));
        assert_eq!(pairing.pending.len(), MAX_PENDING_PER_CHANNEL, "bounded");

        let mut pairing = flooded(1);
        pairing.issue("tg", "dora", "Dora", "dora", "DORA23".into(), at(0));
        for stranger in 0..MAX_PENDING_PER_CHANNEL * 2 {
            pairing.issue(
                "tg",
                &format!("t{stranger}"),
                "x",
                "r",
                format!("T{stranger}"),
                at(1),
            );
        }
        assert!(!listed(&pairing, "dora"), "a large flood pushed Dora out");
        let oldest = pairing.pending[0].clone();
        assert_eq!(
            pairing.issue("tg", "dora", "Dora", "dora", "DORA24".into(), at(2)),
            Issued::Busy {
                code: "DORA24".into(),
                dropped: oldest,
            },
            "she is listed again as soon as she writes again, and told to give her id"
        );
        assert!(listed(&pairing, "dora"));
        let oldest = pairing.pending[0].clone();
        assert_eq!(
            pairing.issue("tg", "later", "x", "r", "LATE23".into(), at(3)),
            Issued::Busy {
                code: "LATE23".into(),
                dropped: oldest,
            }
        );
        assert!(
            matches!(pairing.approve(&sender("tg", "dora"), at(4)), Approval::Approved(approved) if approved.name == "Dora")
        );
        assert!(
            matches!(
                pairing.issue("dc", "99", "x", "r", "D99".into(), at(4)),
                Issued::New(_)
            ),
            "channels are listed apart"
        );
        assert_eq!(pairing_code([0, 1, 2, 3, 4, 255]).len(), 6);
    }

    #[test]
    fn busy_notices_are_bounded_and_given_again_after_the_hour() {
        let mut pairing = flooded(MAX_PENDING_PER_CHANNEL);
        for stranger in 0..MAX_BUSY_TOLD + 5 {
            let issued = pairing.issue("tg", &stranger.to_string(), "x", "r", "X".into(), at(40));
            assert!(matches!(issued, Issued::Busy { .. }), "{stranger}");
        }
        assert_eq!(pairing.told_busy.len(), MAX_BUSY_TOLD);
        pairing.deny(&sender("tg", "7"), at(41));
        assert_eq!(
            pairing.issue("tg", "7", "x", "r", "X".into(), at(59)),
            Issued::BusyTold,
            "listed again, not told again within the hour"
        );
        assert!(pairing.pending.iter().any(|pending| pending.sender == "7"));
        pairing.deny(&sender("tg", "7"), at(100));
        assert!(
            matches!(
                pairing.issue("tg", "7", "x", "r", "NEW234".into(), at(101)),
                Issued::New(_)
            ),
            "the flood's requests expired: the sender gets a code"
        );
        assert!(pairing.told_busy.is_empty());
    }
}
