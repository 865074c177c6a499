//! A second local user, or the service user itself, against deploy and the host's limits: root
//! never executes, follows or writes through a path the service user can change; descriptors
//! and connections are bounded.
