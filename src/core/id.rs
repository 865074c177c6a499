//! Identifiers. The shell mints them (time-ordered UUIDs); the core only carries them.
//! An id is minted before the effect it names, so the record of intent can carry it.

use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            pub fn from_uuid(uuid: Uuid) -> Self {
                $name(uuid)
            }

            pub fn from_bytes(bytes: [u8; 16]) -> Self {
                $name(Uuid::from_bytes(bytes))
            }

            pub fn as_bytes(&self) -> [u8; 16] {
                *self.0.as_bytes()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(text).map($name)
            }
        }
    };
}

uuid_id!(
    /// One session: the chain of segment files that hold one lane.
    SessionId
);
uuid_id!(
    /// One node of the conversation tree.
    EntryId
);
uuid_id!(
    /// One operation (a run, a recovery): opened by a record, closed by another.
    OperationId
);
