//! From a loaded agent to its [`Machine`]: the backend, the image, the secrets read from the
//! host environment, the name and the fingerprint.

use super::machine::{DEFAULT_IDLE, Machine, MachineOptions};
use super::microvm::{self, Microvm};
use super::preflight;
use super::{ImageRef, ResolvedSecret, Sandbox, SandboxError, Spec};
use crate::agent::LoadedAgent;
use crate::host::Places;
use perch_core::config::DEFAULT_IMAGE;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Which implementation of the sandbox contract runs the agent's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A microsandbox microVM: the only backend of an installed perch.
    Microvm,
    /// Linux namespaces over the same root filesystem, for tests on machines without KVM.
    #[cfg(feature = "sandbox-double")]
    NamespaceDouble,
}

impl Backend {
    /// The microVM. A test build (feature `sandbox-double`) uses the namespace double when
    /// `PERCH_SANDBOX=namespace-double`; no agent file can choose it.
    pub fn from_environment() -> Backend {
        #[cfg(feature = "sandbox-double")]
        if std::env::var("PERCH_SANDBOX").as_deref() == Ok("namespace-double") {
            return Backend::NamespaceDouble;
        }
        Backend::Microvm
    }
}

/// Everything [`machine_for`] needs besides the agent.
#[derive(Debug, Clone)]
pub struct MachineSetup {
    pub backend: Backend,
    /// The checks before a microVM boots, and the microsandbox home it boots from
    /// ([`Places::msb_home`]): its catalog, images and runtime.
    pub places: Places,
    pub idle: Duration,
}

impl MachineSetup {
    pub fn from_environment() -> MachineSetup {
        MachineSetup {
            backend: Backend::from_environment(),
            places: Places::from_environment(),
            idle: DEFAULT_IDLE,
        }
    }
}

/// Builds the agent's machine without booting it. Fails fast, before any boot attempt, when
/// this host cannot run the backend, the image is missing, or a secret's variable is unset.
pub fn machine_for(
    agent: &LoadedAgent,
    setup: &MachineSetup,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Machine, SandboxError> {
    if setup.backend == Backend::Microvm {
        preflight::require(&setup.places)?;
    }
    let policy = &agent.definition.sandbox;
    let image = if policy.image == DEFAULT_IMAGE {
        crate::sandbox::image::resolve_default_image(&setup.places.cache)?
    } else {
        ImageRef::Registry(policy.image.clone())
    };
    let image_identity = match &image {
        ImageRef::Local {
            reference, layer, ..
        } => format!("{reference}@{layer}"),
        ImageRef::Registry(reference) => reference.clone(),
    };
    let mut secrets = Vec::new();
    for grant in &policy.secrets {
        let value = grant
            .source
            .resolve(&lookup)
            .map_err(|_| SandboxError::MissingSecret {
                env: grant.env.clone(),
                source: grant.source.name().to_string(),
            })?;
        secrets.push(ResolvedSecret {
            env: grant.env.clone(),
            source: grant.source.name().clone(),
            placeholder: grant
                .placeholder
                .clone()
                .unwrap_or_else(|| microvm::default_placeholder(&grant.env)),
            value,
            hosts: grant.hosts.clone(),
        });
    }
    let state = agent.dir.sandbox_state_dir();
    let spec = Spec {
        name: machine_name(agent.dir.root()),
        image,
        cpus: policy.cpus,
        memory: policy.memory,
        workspace: agent.dir.workspace(),
        workspace_disk: policy.workspace_disk,
        allow: policy.allow.clone(),
        secrets,
        env: policy
            .env
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        state: state.clone(),
    };
    let sandbox: Arc<dyn Sandbox> = match setup.backend {
        Backend::Microvm => Arc::new(Microvm::new(spec, &setup.places.msb_home)?),
        #[cfg(feature = "sandbox-double")]
        Backend::NamespaceDouble => Arc::new(super::double::NamespaceDouble::new(spec)),
    };
    Machine::start(
        sandbox,
        MachineOptions {
            idle: setup.idle,
            state,
            fingerprint: policy.fingerprint(&image_identity),
            bootstrap: policy.bootstrap.clone(),
        },
    )
}

/// `perch-<directory name>-<12 hex digits of the directory's path>`: readable, and unique per
/// directory on this host.
pub fn machine_name(root: &Path) -> String {
    let digest = Sha256::digest(root.as_os_str().as_encoded_bytes());
    let hex: String = digest
        .iter()
        .take(6)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let base: String = root
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(24)
        .collect();
    let base = base.trim_matches('-');
    if base.is_empty() {
        format!("perch-{hex}")
    } else {
        format!("perch-{base}-{hex}")
    }
}
