//! Pairing: how an unknown sender in a direct message becomes an approved one. The sender gets
//! a short code; the owner approves it with `perch pair approve CODE`. Codes expire, a sender
//! has at most one, and a channel has only a few pending at once. When they are all taken (a few
//! throwaway accounts can do that), a later sender is told that pairing is busy, once an hour,
//! and the owner is shown who holds the codes, so no sender is left without an answer.

use crate::Timestamp;
use serde::{Deserialize, Serialize};

/// How long a code can be approved.
pub const CODE_LIFETIME_SECONDS: i64 = 3600;
/// Codes pending at once, per channel.
pub const MAX_PENDING_PER_CHANNEL: usize = 3;
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPair {
    pub code: String,
    pub channel: String,
    pub sender: String,
    pub name: String,
    pub expires: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approved {
    pub channel: String,
    pub sender: String,
    pub name: String,
}

/// What asking for a code gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    /// A new code; tell the sender.
    New(String),
    /// The sender already has a code pending; say nothing more (no spam to a sender who
    /// keeps writing).
    Pending,
    /// Every code of this channel is taken: tell the sender that pairing is busy and when the
    /// oldest code expires; tell the owner who holds them (`oldest` is the first to expire).
    Busy { oldest: PendingPair },
    /// Busy, and this sender was already told so within the hour; say nothing.
    BusyTold,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Approved(Approved),
    Unknown,
}

impl Pairing {
    pub fn is_approved(&self, channel: &str, sender: &str) -> bool {
        self.approved
            .iter()
            .any(|approved| approved.channel == channel && approved.sender == sender)
    }

    /// Forgets expired codes, and busy notices that may be given again.
    pub fn expire(&mut self, now: Timestamp) {
        self.pending.retain(|pending| pending.expires > now);
        self.told_busy.retain(|told| told.until > now);
    }

    /// Issues `code` (random, from the caller) for an unknown sender, unless one is pending.
    pub fn issue(
        &mut self,
        channel: &str,
        sender: &str,
        name: &str,
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
        let holders: Vec<&PendingPair> = self
            .pending
            .iter()
            .filter(|pending| pending.channel == channel)
            .collect();
        if holders.len() >= MAX_PENDING_PER_CHANNEL {
            let Some(oldest) = holders
                .into_iter()
                .min_by_key(|pending| pending.expires)
                .cloned()
            else {
                return Issued::BusyTold;
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
            return Issued::Busy { oldest };
        }
        self.pending.push(PendingPair {
            code: code.clone(),
            channel: channel.to_owned(),
            sender: sender.to_owned(),
            name: name.to_owned(),
            expires: now + chrono::Duration::seconds(CODE_LIFETIME_SECONDS),
        });
        Issued::New(code)
    }

    /// Approves the sender holding `code` (case-insensitive), if it has not expired.
    pub fn approve(&mut self, code: &str, now: Timestamp) -> Approval {
        self.expire(now);
        let Some(index) = self
            .pending
            .iter()
            .position(|pending| pending.code.eq_ignore_ascii_case(code.trim()))
        else {
            return Approval::Unknown;
        };
        let pending = self.pending.remove(index);
        let approved = Approved {
            channel: pending.channel,
            sender: pending.sender,
            name: pending.name,
        };
        if !self.is_approved(&approved.channel, &approved.sender) {
            self.approved.push(approved.clone());
        }
        Approval::Approved(approved)
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
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(minutes: i64) -> Timestamp {
        chrono::Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
            + chrono::Duration::minutes(minutes)
    }

    #[test]
    fn a_code_is_issued_once_approved_once_and_expires() {
        let mut pairing = Pairing::default();
        assert_eq!(
            pairing.issue("tg", "42", "Alice", "ABC234".into(), at(0)),
            Issued::New("ABC234".into())
        );
        assert_eq!(
            pairing.issue("tg", "42", "Alice", "ZZZ999".into(), at(1)),
            Issued::Pending
        );
        assert!(!pairing.is_approved("tg", "42"));
        assert!(matches!(
            pairing.approve("abc234", at(2)),
            Approval::Approved(_)
        ));
        assert!(pairing.is_approved("tg", "42"));
        assert_eq!(pairing.approve("ABC234", at(3)), Approval::Unknown);
        pairing.issue("tg", "7", "Bob", "BOB234".into(), at(0));
        assert_eq!(
            pairing.approve("BOB234", at(61)),
            Approval::Unknown,
            "expired"
        );
    }

    #[test]
    fn a_channel_has_only_a_few_codes_pending() {
        let mut pairing = Pairing::default();
        for sender in 0..MAX_PENDING_PER_CHANNEL {
            let issued = pairing.issue("tg", &sender.to_string(), "x", format!("C{sender}"), at(0));
            assert!(matches!(issued, Issued::New(_)));
        }
        assert!(
            matches!(
                pairing.issue("tg", "99", "x", "C99".into(), at(1)),
                Issued::Busy { oldest } if oldest.sender == "0"
            ),
            "a later sender is told pairing is busy"
        );
        assert_eq!(
            pairing.issue("tg", "99", "x", "C99".into(), at(2)),
            Issued::BusyTold,
            "once an hour"
        );
        assert!(!pairing.pending.iter().any(|pending| pending.sender == "99"));
        assert!(matches!(
            pairing.issue("dc", "99", "x", "D99".into(), at(0)),
            Issued::New(_)
        ));
        assert_eq!(pairing_code([0, 1, 2, 3, 4, 255]).len(), 6);
    }

    #[test]
    fn busy_notices_are_bounded_and_given_again_after_the_hour() {
        let mut pairing = Pairing::default();
        for sender in 0..MAX_PENDING_PER_CHANNEL {
            pairing.issue(
                "tg",
                &format!("t{sender}"),
                "x",
                format!("C{sender}"),
                at(0),
            );
        }
        for sender in 0..MAX_BUSY_TOLD + 5 {
            let issued = pairing.issue("tg", &sender.to_string(), "x", "X".into(), at(1));
            assert!(matches!(issued, Issued::Busy { .. }), "{sender}");
        }
        assert_eq!(pairing.told_busy.len(), MAX_BUSY_TOLD);
        assert!(matches!(
            pairing.issue("tg", "7", "x", "X".into(), at(59)),
            Issued::BusyTold
        ));
        assert!(
            matches!(
                pairing.issue("tg", "7", "x", "NEW234".into(), at(62)),
                Issued::New(_)
            ),
            "the throwaway codes expired: the sender gets one"
        );
        assert!(pairing.told_busy.is_empty());
    }
}
