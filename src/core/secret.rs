//! Secret values and the references that name them.
//!
//! Configuration never holds a secret value, only an [`EnvRef`] naming the host environment
//! variable it comes from. The shell resolves a reference into a [`Secret`] at the one place the
//! value is used. A `Secret` cannot be printed, serialized or compared by accident.

use crate::name::EnvName;
use serde::Serialize;
use std::fmt;

/// A reference to a host environment variable, written `env "NAME"` in Lua and `$NAME` in
/// YAML. It carries the name only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct EnvRef(EnvName);

impl EnvRef {
    pub fn new(name: EnvName) -> Self {
        EnvRef(name)
    }

    pub fn name(&self) -> &EnvName {
        &self.0
    }

    /// Looks the value up with `lookup` (the shell passes the process environment).
    pub fn resolve(
        &self,
        lookup: impl FnOnce(&str) -> Option<String>,
    ) -> Result<Secret, MissingEnv> {
        match lookup(self.0.as_str()) {
            Some(value) if !value.is_empty() => Ok(Secret(value)),
            _ => Err(MissingEnv(self.0.clone())),
        }
    }
}

impl fmt::Display for EnvRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// The named environment variable is unset or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingEnv(pub EnvName);

impl fmt::Display for MissingEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "environment variable {} is not set; export it in the service's environment",
            self.0
        )
    }
}

impl std::error::Error for MissingEnv {}

/// A secret value. `Debug` prints `Secret(<redacted>)`; there is no `Display`, no `Serialize`
/// and no `PartialEq`, so the value leaves only through [`Secret::expose`].
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one call that must send it (an HTTP header, the sandbox's
    /// network boundary).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with this value replaced by `<redacted>` ([`crate::redact::redact_value`]: a short
    /// value only where it stands as a whole token, so no ordinary word is cut).
    pub fn redact(&self, text: &str) -> String {
        crate::redact::redact_value(text, &self.0, crate::redact::REDACTED)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print_their_value() {
        let reference = EnvRef::new(EnvName::try_from("API_KEY").unwrap());
        let secret = reference
            .resolve(|_| Some("sk-very-secret".into()))
            .unwrap();
        assert_eq!(secret.expose(), "sk-very-secret");
        let shown = format!("{secret:?} {:?}", Some(&secret));
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn a_missing_variable_names_the_variable() {
        let reference = EnvRef::new(EnvName::try_from("API_KEY").unwrap());
        let error = reference.resolve(|_| None).unwrap_err();
        assert!(error.to_string().contains("API_KEY"));
        assert!(reference.resolve(|_| Some(String::new())).is_err());
    }
}
