use super::*;
use crate::sandbox::ResolvedSecret;
use microsandbox::sandbox::HostPattern;
use serde_json::Value;

fn hosts(names: &[&str]) -> Vec<HostName> {
    names
        .iter()
        .map(|name| HostName::try_from(*name).unwrap())
        .collect()
}

/// Each egress rule as `action destination protocols ports`.
fn rules(policy: &NetworkPolicy) -> Vec<String> {
    let json = serde_json::to_value(policy).unwrap();
    assert_eq!(json["default_egress"], "deny");
    assert_eq!(json["default_ingress"], "deny");
    json["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            assert_eq!(rule["direction"], "egress");
            let destination = match &rule["destination"] {
                Value::Object(map) => map
                    .iter()
                    .map(|(kind, value)| format!("{kind}:{}", value.as_str().unwrap()))
                    .collect::<String>(),
                other => other.to_string(),
            };
            let protocols: Vec<&str> = rule["protocols"]
                .as_array()
                .unwrap()
                .iter()
                .map(|protocol| protocol.as_str().unwrap())
                .collect();
            let ports: Vec<String> = rule["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|range| format!("{}-{}", range["start"], range["end"]))
                .collect();
            format!(
                "{} {destination} {} {}",
                rule["action"].as_str().unwrap(),
                protocols.join(","),
                ports.join(",")
            )
            .trim_end()
            .to_owned()
        })
        .collect()
}

const GUARDS: [&str; 7] = [
    "deny group:loopback",
    "deny group:private",
    "deny group:link_local",
    "deny group:metadata",
    "deny group:multicast",
    "deny cidr:0.0.0.0/8",
    "deny cidr:::/128",
];

#[test]
fn the_policy_denies_private_ranges_before_any_listed_name() {
    let policy = network_policy(&hosts(&["api.github.com", "*.githubusercontent.com"])).unwrap();
    let mut expected = vec!["allow group:host tcp,udp 53-53".to_owned()];
    expected.extend(GUARDS.map(str::to_owned));
    expected.extend([
        "deny group:host".to_owned(),
        "allow domain:api.github.com".to_owned(),
        "allow domain_suffix:githubusercontent.com".to_owned(),
    ]);
    assert_eq!(rules(&policy), expected);
}

#[test]
fn the_host_is_reachable_only_when_its_alias_is_listed() {
    let policy = network_policy(&hosts(&[HOST_ALIAS, "pypi.org"])).unwrap();
    let rules = rules(&policy);
    assert!(rules.contains(&"allow group:host".to_owned()), "{rules:?}");
    assert!(!rules.contains(&"deny group:host".to_owned()), "{rules:?}");
    assert!(
        !rules.iter().any(|rule| rule.contains(HOST_ALIAS)),
        "{rules:?}"
    );
    assert_eq!(
        rules.last().map(String::as_str),
        Some("allow domain:pypi.org")
    );
}

#[test]
fn an_empty_allowlist_leaves_only_dns() {
    let rules = rules(&network_policy(&[]).unwrap());
    assert_eq!(
        rules.first().map(String::as_str),
        Some("allow group:host tcp,udp 53-53")
    );
    assert!(
        rules.iter().skip(1).all(|rule| rule.starts_with("deny ")),
        "{rules:?}"
    );
}

#[test]
fn command_env_replaces_spec_env_in_place() {
    let spec = vec![
        (EnvName::try_from("LANG").unwrap(), "C.UTF-8".to_owned()),
        (EnvName::try_from("MODE").unwrap(), "spec".to_owned()),
    ];
    let command = vec![
        ("MODE".to_owned(), "command".to_owned()),
        ("EXTRA".to_owned(), "1".to_owned()),
        ("EXTRA".to_owned(), "2".to_owned()),
    ];
    assert_eq!(
        exec_env(&spec, &command),
        vec![
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ("MODE".to_owned(), "command".to_owned()),
            ("EXTRA".to_owned(), "2".to_owned()),
        ]
    );
}

#[test]
fn spawn_failures_end_like_a_shell_with_the_reason_on_stderr() {
    let failure = |kind| {
        ExecEvent::Failed(ExecFailed {
            kind,
            errno: Some(2),
            errno_name: Some("ENOENT".into()),
            message: "spawn \"nope\": No such file or directory".into(),
            stage: Some("execvp".into()),
        })
    };
    let fresh = || Collected::new(StreamCap::HOST_DEFAULT);
    let mut collected = fresh();
    assert_eq!(
        collected.take(failure(ExecFailureKind::NotFound)),
        Ok(Some(End::Exited(127)))
    );
    let output = collected.into_output(End::Exited(127));
    assert!(output.stderr.marked_text("stderr").contains("nope"));
    assert_eq!(
        fresh().take(failure(ExecFailureKind::NotExecutable)),
        Ok(Some(End::Exited(126)))
    );
    assert!(fresh().take(failure(ExecFailureKind::BadCwd)).is_err());
}

#[test]
fn collected_output_is_held_within_the_cap_while_events_arrive() {
    let mut collected = Collected::new(StreamCap { head: 8, tail: 8 });
    for _ in 0..10_000 {
        let event = ExecEvent::Stdout(vec![b'y'; 4096].into());
        assert_eq!(collected.take(event), Ok(None));
    }
    let output = collected.into_output(End::Exited(0));
    assert_eq!(output.stdout.total(), 4096 * 10_000);
    assert_eq!(output.stdout.head(), b"yyyyyyyy");
    assert_eq!(output.stdout.tail(), b"yyyyyyyy");
}

const VALUE: &str = "sk-very-secret-value";

fn spec(allow: &[&str], secret_hosts: &[&str]) -> Spec {
    let env = EnvName::try_from("GITHUB_TOKEN").unwrap();
    let value = perch_core::secret::EnvRef::new(env.clone())
        .resolve(|_| Some(VALUE.into()))
        .unwrap();
    Spec {
        name: "perch-test".into(),
        image: ImageRef::Local {
            reference: "perch:default".into(),
            rootfs: "/nonexistent".into(),
            layer: "sha256:0".into(),
        },
        cpus: 1,
        memory: 512,
        workspace: "/nonexistent/workspace".into(),
        workspace_disk: 4096,
        allow: hosts(allow),
        secrets: vec![ResolvedSecret {
            env: env.clone(),
            source: env,
            placeholder: "perch-github-token".into(),
            value,
            hosts: hosts(secret_hosts),
        }],
        env: Vec::new(),
        state: "/nonexistent/state".into(),
    }
}

#[test]
fn a_secret_is_one_entry_that_keeps_every_host_and_needs_tls() {
    let spec = spec(
        &["api.github.com", "uploads.github.com"],
        &["api.github.com", "uploads.github.com"],
    );
    let network = guest_network(&spec).unwrap();
    let entries = &network.secrets.secrets;
    assert_eq!(
        entries.len(),
        1,
        "one entry per env: microsandbox keeps only the last"
    );
    let entry = &entries[0];
    assert_eq!(entry.env_var, "GITHUB_TOKEN");
    assert_eq!(entry.placeholder, "perch-github-token");
    assert_eq!(entry.value.as_str(), "", "no value at rest");
    assert_eq!(
        entry.source,
        Some(SecretSource::env("GITHUB_TOKEN")),
        "read from the host variable at boot"
    );
    assert_eq!(
        entry.allowed_hosts,
        vec![
            HostPattern::Exact("api.github.com".into()),
            HostPattern::Exact("uploads.github.com".into())
        ]
    );
    assert!(entry.require_tls_identity);
}

#[test]
fn a_secret_for_the_host_alias_alone_goes_over_plain_http_and_never_beside_other_hosts() {
    let network = guest_network(&spec(&[HOST_ALIAS], &[HOST_ALIAS])).unwrap();
    let entries = &network.secrets.secrets;
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].allowed_hosts,
        vec![HostPattern::Exact(HOST_ALIAS.into())]
    );
    assert!(!entries[0].require_tls_identity);
    let mixed = spec(
        &["api.github.com", HOST_ALIAS],
        &["api.github.com", HOST_ALIAS],
    );
    let refused = guest_network(&mixed).unwrap_err().to_string();
    assert!(
        refused.contains("give host.microsandbox.internal a secret of its own"),
        "{refused}"
    );
}

#[test]
fn wildcard_secret_hosts_stay_wildcards_and_need_tls() {
    let network = guest_network(&spec(&["*.example.com"], &["*.example.com"])).unwrap();
    let entries = &network.secrets.secrets;
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].allowed_hosts,
        vec![HostPattern::Wildcard("*.example.com".into())]
    );
    assert!(entries[0].require_tls_identity);
}

#[test]
fn a_secret_without_hosts_is_refused_not_a_panic() {
    assert!(guest_network(&spec(&["pypi.org"], &[])).is_err());
}

#[test]
fn secret_values_never_show() {
    let spec = spec(&["api.github.com"], &["api.github.com"]);
    let network = guest_network(&spec).unwrap();
    let home = tempfile::tempdir().unwrap();
    let microvm = Microvm::new(spec, home.path()).unwrap();
    let shown = format!("{microvm:?} {network:?}");
    assert!(!shown.contains(VALUE), "{shown}");
    let error = SandboxError::Failed {
        action: "boot",
        reason: microvm.redact(format!("json error: unexpected \"{VALUE}\"")),
    };
    assert!(!error.to_string().contains(VALUE), "{error}");
    assert!(error.to_string().contains("<redacted>"));
}

#[test]
fn default_placeholders_follow_microsandbox() {
    assert_eq!(
        default_placeholder(&EnvName::try_from("GITHUB_TOKEN").unwrap()),
        "$MSB_GITHUB_TOKEN"
    );
}
