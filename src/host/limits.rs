//! Process limits perch sets for itself at start.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft limit on open file descriptors to the hard limit, which is what the
/// administrator (or the unit's `LimitNOFILE=`) allows. Each connection, lane and journal holds
/// descriptors, and the common default soft limit of 1,024 is a few thousand idle connections
/// from exhausted. Returns the soft limit now in force; a hard limit lower than the soft one is
/// left alone.
pub fn raise_open_files() -> Result<u64, String> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|error| format!("cannot read the open-files limit: {error}"))?;
    if soft >= hard {
        return Ok(soft);
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|error| {
        format!("cannot raise the open-files limit from {soft} to {hard}: {error}")
    })?;
    Ok(hard)
}
