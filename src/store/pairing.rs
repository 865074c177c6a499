//! `.perch/pairing.json`: the pending pairing codes and the approved senders (the core's
//! [`Pairing`]), read whole and replaced whole.

use perch_core::pairing::Pairing;
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
    format!("no pending pairing has the code {code} (codes expire after an hour)")
}
