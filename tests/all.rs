//! perch's integration tests, in one binary so the build links once.
#![allow(clippy::unwrap_used)]

mod suite;
