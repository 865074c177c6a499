use super::{Declaration, single, table_argument};
use crate::name::{EnvName, HOST_ALIAS, HostName};
use crate::problem::Problem;
use crate::secret::EnvRef;
use crate::tree::{Checker, Fields, Node, Path, Value};
use serde::Serialize;
use std::collections::BTreeMap;

/// perch's own image, built offline by `perch image build`.
pub const DEFAULT_IMAGE: &str = "perch:default";

/// How many MiB the guest may add to the workspace unless `sandbox.lua` says otherwise:
/// microsandbox's own default quota for a bind mount (4 GiB).
pub const DEFAULT_WORKSPACE_DISK: u32 = 4096;

/// `sandbox.lua`: the microVM every command runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxPolicy {
    /// `perch:default` or an OCI image reference.
    pub image: String,
    pub cpus: u8,
    /// MiB.
    pub memory: u32,
    /// MiB the guest may add to the workspace beyond what it held at boot: the quota of its
    /// bind mount.
    pub workspace_disk: u32,
    /// Hosts the guest may reach; nothing else is reachable.
    pub allow: Vec<HostName>,
    pub secrets: Vec<SecretGrant>,
    /// Plain environment for every command; values are not secret.
    pub env: BTreeMap<EnvName, String>,
    /// Commands run once per image fingerprint.
    pub bootstrap: Vec<String>,
}

/// A credential the guest can use without holding it: the guest sees `placeholder` in `env`,
/// and the network boundary swaps in the value of `source` for requests to `hosts` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretGrant {
    pub env: EnvName,
    pub source: EnvRef,
    pub placeholder: Option<String>,
    pub hosts: Vec<HostName>,
}

impl SandboxPolicy {
    /// What a machine is made of: when any of it changes, a stopped machine must be recreated
    /// rather than restarted, because a restarted machine keeps the configuration it was created
    /// with (a tightened allowlist must never be silently ignored). `image` identifies the exact
    /// image, not just its name. Plain `env` and secret values are not part of it: they are
    /// applied to every command and resolved at every boot.
    pub fn fingerprint(&self, image: &str) -> serde_json::Value {
        let mut allow: Vec<&str> = self.allow.iter().map(HostName::as_str).collect();
        allow.sort_unstable();
        let secrets: Vec<serde_json::Value> = self
            .secrets
            .iter()
            .map(|secret| {
                let mut hosts: Vec<&str> = secret.hosts.iter().map(HostName::as_str).collect();
                hosts.sort_unstable();
                serde_json::json!({
                    "env": secret.env.as_str(),
                    "placeholder": secret.placeholder,
                    "hosts": hosts,
                })
            })
            .collect();
        let mut fingerprint = serde_json::json!({
            "image": image,
            "bootstrap": self.bootstrap,
            "cpus": self.cpus,
            "memory": self.memory,
            "allow": allow,
            "secrets": secrets,
        });
        // Only when set: the default is the quota machines made before the key existed had, so
        // they are resumed rather than recreated.
        if self.workspace_disk != DEFAULT_WORKSPACE_DISK {
            fingerprint["workspace_disk"] = self.workspace_disk.into();
        }
        fingerprint
    }
}

const USAGE: &str = "sandbox { image = \"perch:default\", cpus = 1, memory = 1024, allow = { } }";
const KEYS: &[&str] = &[
    "image",
    "cpus",
    "memory",
    "workspace_disk",
    "allow",
    "secrets",
    "env",
    "bootstrap",
];
const SECRET_KEYS: &[&str] = &["env", "source", "placeholder", "hosts"];

/// Checks the declarations `sandbox.lua` made.
pub fn check_sandbox(declarations: &[Declaration]) -> Result<SandboxPolicy, Vec<Problem>> {
    let mut checker = Checker::new("sandbox.lua");
    let policy = single(&mut checker, declarations, "sandbox", USAGE).and_then(|declaration| {
        let table = table_argument(&mut checker, declaration, USAGE)?;
        let mut fields = checker.fields(table, &Path::root())?;
        let policy = read_policy(&mut checker, &mut fields);
        fields.finish(&mut checker, KEYS);
        Some(policy)
    });
    match policy {
        Some(policy) if !checker.has_problems() => Ok(policy),
        _ => Err(checker.into_problems()),
    }
}

fn read_policy(checker: &mut Checker, fields: &mut Fields<'_>) -> SandboxPolicy {
    let root = Path::root();
    let image = fields
        .optional("image")
        .and_then(|node| {
            let image = checker.non_empty_str(node, &root.key("image"))?;
            if is_path(image) {
                checker.report_fix(
                    node.pos,
                    &root.key("image"),
                    format!("{image:?} is a path, not an image: perch never boots a root filesystem directory or disk file, because every agent's writes would land in it"),
                    "use image = \"perch:default\" (built by `perch image build`) or an OCI reference such as \"debian:bookworm\"",
                );
                return None;
            }
            Some(image)
        })
        .unwrap_or(DEFAULT_IMAGE)
        .to_owned();
    let cpus = fields
        .optional("cpus")
        .and_then(|node| checker.int_in(node, &root.key("cpus"), 1..=64))
        .and_then(|n| u8::try_from(n).ok())
        .unwrap_or(1);
    let memory = fields
        .optional("memory")
        .and_then(|node| checker.int_in(node, &root.key("memory"), 256..=262_144))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1024);
    let workspace_disk = fields
        .optional("workspace_disk")
        .and_then(|node| checker.int_in(node, &root.key("workspace_disk"), 64..=1_048_576))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(DEFAULT_WORKSPACE_DISK);
    let allow = fields
        .optional("allow")
        .map(|node| hosts(checker, node, &root.key("allow")))
        .unwrap_or_default();
    let secrets = fields
        .optional("secrets")
        .map(|node| secrets(checker, node, &root.key("secrets"), &allow))
        .unwrap_or_default();
    let env = fields
        .optional("env")
        .map(|node| plain_env(checker, node, &root.key("env"), &secrets))
        .unwrap_or_default();
    let bootstrap = fields
        .optional("bootstrap")
        .map(|node| {
            checker
                .str_list(node, &root.key("bootstrap"))
                .into_iter()
                .map(|(_, _, command)| command)
                .collect()
        })
        .unwrap_or_default();
    SandboxPolicy {
        image,
        cpus,
        memory,
        workspace_disk,
        allow,
        secrets,
        env,
        bootstrap,
    }
}

/// What microsandbox would take for a root filesystem on the host rather than an image.
fn is_path(image: &str) -> bool {
    image.starts_with('/')
        || image.starts_with("./")
        || image.starts_with("../")
        || [".img", ".raw", ".qcow2"]
            .iter()
            .any(|suffix| image.ends_with(suffix))
}

fn hosts(checker: &mut Checker, node: &Node, path: &Path) -> Vec<HostName> {
    let mut hosts: Vec<HostName> = Vec::new();
    for (pos, item_path, text) in checker.str_list(node, path) {
        match HostName::try_from(text.as_str()) {
            Ok(host) if hosts.contains(&host) => {
                checker.report_fix(
                    pos,
                    &item_path,
                    format!("{host} is listed twice"),
                    "remove one",
                );
            }
            Ok(host) => hosts.push(host),
            Err(_) => checker.report_fix(
                pos,
                &item_path,
                format!("{text:?} is not a host name"),
                format!("write {}", HostName::RULE),
            ),
        }
    }
    hosts
}

fn secrets(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    allow: &[HostName],
) -> Vec<SecretGrant> {
    let Some(items) = checker.list(node, path) else {
        return Vec::new();
    };
    let mut grants: Vec<SecretGrant> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = path.index(index);
        let Some(mut fields) = checker.fields(item, &path) else {
            continue;
        };
        let env = fields
            .required(
                checker,
                "env",
                "name the variable the guest sees: env = \"GITHUB_TOKEN\"",
            )
            .and_then(|node| env_name(checker, node, &path.key("env")));
        let source = fields
            .required(
                checker,
                "source",
                "name the host variable holding the value: source = env \"GITHUB_TOKEN\"",
            )
            .and_then(|node| match &node.value {
                Value::Env(name) => EnvName::try_from(name.as_str()).ok().map(EnvRef::new),
                Value::Str(_) => {
                    checker.report_fix(
                        node.pos,
                        &path.key("source"),
                        "a literal secret value is not allowed here (value not shown)",
                        "reference the host environment instead: source = env \"NAME\"",
                    );
                    None
                }
                other => {
                    checker.report_fix(
                        node.pos,
                        &path.key("source"),
                        format!("expected env \"NAME\", found {}", other.kind()),
                        "write source = env \"NAME\"",
                    );
                    None
                }
            });
        let placeholder = fields.optional("placeholder").and_then(|node| {
            let text = checker.str(node, &path.key("placeholder"))?;
            if text.len() < 8 || text.chars().any(char::is_whitespace) {
                checker.report_fix(
                    node.pos,
                    &path.key("placeholder"),
                    "a placeholder must be at least 8 characters without spaces",
                    "use a distinctive word such as perch-github-token",
                );
                return None;
            }
            Some(text.to_owned())
        });
        let secret_hosts = match fields.optional("hosts") {
            None => {
                checker.report_fix(
                    item.pos,
                    &path,
                    "missing hosts",
                    "name the hosts this secret may be sent to: hosts = { \"api.github.com\" }",
                );
                None
            }
            Some(node) => {
                let mut list = hosts(checker, node, &path.key("hosts"));
                list.retain(|host| {
                    let exact = !host.as_str().starts_with("*.");
                    if !exact {
                        checker.report_fix(
                            node.pos,
                            &path.key("hosts"),
                            format!(
                                "{host} is a wildcard; a secret is sent only to hosts named exactly, since a wildcard also matches hosts that others run"
                            ),
                            format!(
                                "name each host the secret is for, such as \"api.{}\"",
                                host.as_str().trim_start_matches("*.")
                            ),
                        );
                    }
                    exact
                });
                if list.len() > 1 && list.iter().any(|host| host.as_str() == HOST_ALIAS) {
                    checker.report_fix(
                        node.pos,
                        &path.key("hosts"),
                        format!(
                            "{HOST_ALIAS} cannot share a secret with other hosts: microsandbox keeps one rule per secret, TLS-checked or not, so the other hosts would lose it"
                        ),
                        format!(
                            "declare a second secret, with its own env, for {HOST_ALIAS} alone"
                        ),
                    );
                }
                if list.is_empty() {
                    checker.report_fix(
                        node.pos,
                        &path.key("hosts"),
                        "hosts is empty, so the secret could never be used",
                        "name at least one host",
                    );
                }
                for host in list.iter().filter(|host| !allow.contains(host)) {
                    checker.report_fix(
                        node.pos,
                        &path.key("hosts"),
                        format!("{host} is not in allow, so the guest cannot reach it"),
                        format!("add \"{host}\" to allow, or remove it here"),
                    );
                }
                Some(list)
            }
        };
        fields.finish(checker, SECRET_KEYS);
        if let Some(env) = &env
            && grants.iter().any(|grant| &grant.env == env)
        {
            checker.report_fix(
                item.pos,
                &path.key("env"),
                format!("{env} is granted twice"),
                "keep one",
            );
        }
        if let (Some(env), Some(source), Some(hosts)) = (env, source, secret_hosts) {
            grants.push(SecretGrant {
                env,
                source,
                placeholder,
                hosts,
            });
        }
    }
    grants
}

fn env_name(checker: &mut Checker, node: &Node, path: &Path) -> Option<EnvName> {
    let text = checker.str(node, path)?;
    match EnvName::try_from(text) {
        Ok(name) => Some(name),
        Err(_) => {
            checker.report_fix(
                node.pos,
                path,
                format!("{text:?} is not a variable name"),
                EnvName::RULE,
            );
            None
        }
    }
}

fn plain_env(
    checker: &mut Checker,
    node: &Node,
    path: &Path,
    secrets: &[SecretGrant],
) -> BTreeMap<EnvName, String> {
    let Some(mut fields) = checker.fields(node, path) else {
        return BTreeMap::new();
    };
    let Value::Map(entries) = &node.value else {
        return BTreeMap::new();
    };
    let mut env = BTreeMap::new();
    for (key, _) in entries {
        let Some(value) = fields.optional(&key.name) else {
            continue;
        };
        let item_path = path.key(&key.name);
        let Ok(name) = EnvName::try_from(key.name.as_str()) else {
            checker.report_fix(key.pos, &item_path, "not a variable name", EnvName::RULE);
            continue;
        };
        if secrets.iter().any(|grant| grant.env == name) {
            checker.report_fix(
                key.pos,
                &item_path,
                format!("{name} is also a secret"),
                "set it in one place",
            );
            continue;
        }
        match &value.value {
            Value::Str(text) => {
                env.insert(name, text.clone());
            }
            Value::Int(n) => {
                env.insert(name, n.to_string());
            }
            Value::Env(_) => checker.report_fix(
                value.pos,
                &item_path,
                "host environment values are not passed into the guest",
                "to lend a credential, declare it under secrets with the hosts it may reach",
            ),
            other => {
                checker.report(
                    value.pos,
                    &item_path,
                    format!("expected a string, found {}", other.kind()),
                );
            }
        }
    }
    fields.finish(checker, &[]);
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_quota_is_in_the_fingerprint_only_when_set() {
        let policy = SandboxPolicy {
            image: DEFAULT_IMAGE.into(),
            cpus: 1,
            memory: 1024,
            workspace_disk: DEFAULT_WORKSPACE_DISK,
            allow: Vec::new(),
            secrets: Vec::new(),
            env: BTreeMap::new(),
            bootstrap: Vec::new(),
        };
        let before = policy.fingerprint("sha256:0");
        assert_eq!(
            before,
            serde_json::json!({
                "image": "sha256:0",
                "bootstrap": [],
                "cpus": 1,
                "memory": 1024,
                "allow": [],
                "secrets": [],
            }),
            "a machine made before workspace_disk existed is resumed"
        );
        let set = SandboxPolicy {
            workspace_disk: 512,
            ..policy
        };
        assert_eq!(set.fingerprint("sha256:0")["workspace_disk"], 512);
    }
}
