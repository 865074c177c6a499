//! `.perch/pairing.json`: the pending pairing codes and the approved senders (the core's
//! [`Pairing`]), read whole and replaced whole.

use perch_core::pairing::{Pairing, Who};
use perch_core::terminal::shown;
use std::io;
use std::path::Path;

/// The pairing state as `.perch/pairing.json` holds it (empty if there is none).
pub fn read_pairing(path: &Path) -> Result<Pairing, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|error| format!("{}: not a pairing file: {error}", path.display())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Pairing::default()),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

/// What `perch status` says to do about a pairing file it cannot read.
pub const PAIRING_UNREADABLE_FIX: &str = "make it readable by this user and valid JSON again, \
     or move it aside (that forgets the pending codes and the approved senders, who pair again); \
     `perch run` does not start until then";

/// Writes the pairing state, durably: an approval or an offer is reported only after it.
pub fn write_pairing(path: &Path, pairing: &Pairing) -> Result<(), String> {
    crate::store::atomic_file::write_json(path, pairing)
}

/// The refusal of a code no pending pairing has.
pub fn no_pending_pairing(code: &str) -> String {
    format!(
        "no pending pairing has the code {code} (requests expire after an hour, and a full list \
         drops its oldest); `perch pair list` shows them, and `perch pair approve \
         CHANNEL:USER_ID` lets a sender in without one"
    )
}

/// The refusal of a deny that names no pending request.
pub fn no_pending_request(who: &Who) -> String {
    format!(
        "no pending pairing request is {}; `perch pair list` shows them",
        shown_who(who)
    )
}

/// The refusal of a revoke that names no approved sender.
pub fn not_approved(channel: &str, sender: &str) -> String {
    format!(
        "{} is not an approved sender; `perch pair list` shows them",
        shown_who(&Who::Sender {
            channel: channel.to_owned(),
            sender: sender.to_owned(),
        })
    )
}

/// `who` as the operator would type it, made safe for a terminal.
pub fn shown_who(who: &Who) -> String {
    match who {
        Who::Code { code } => format!("the code {}", shown(code)),
        Who::Sender { channel, sender } => format!("{}:{}", shown(channel), shown(sender)),
    }
}

/// What the approved person is told, in their direct messages.
pub const APPROVED_NOTICE: &str = "You are in: my owner approved you, so I will answer you here \
     from now on.";
