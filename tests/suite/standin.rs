//! perch's real microVM adapter and microsandbox end to end against the stand-in runtime.
//!
//! The unmodified microsandbox crate spawns the stand-in (tests/msb) as `msb` exactly as it
//! would spawn the real one, and it runs the guest's commands in Linux namespaces instead of a
//! VM. What perch handed the runtime is read back from `<home>/standin/launches.jsonl`, one line
//! per launch.
//!
//! Every test here starts with [`standin_setup`] (most through [`standin_agent`]): on a host
//! without the prerequisites it prints `skipped: <reason>` and returns, except under `CI=true`,
//! where a missing prerequisite fails the test (the suite can never silently stop running these).

use super::sandbox::{SECRET_VALUE, cancel_once_exists, load, lookup, machine_when_free, text};
use super::standin_home::{Preparation, prepare};
use super::support::fake_model::{Reply, Script};
use super::support::fake_telegram::TOKEN;
use super::support::wait::Poll;
use super::support::{new_agent, write};
use perch::agent::LoadedAgent;
use perch::host::Places;
use perch::sandbox::microvm::Microvm;
use perch::sandbox::{
    self, Backend, Boot, Command, DEFAULT_IDLE, End, LastBoot, Machine, MachineSetup, Sandbox,
    SandboxError, Spec, State,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

/// The stand-in's places for this run, or why there are none.
static PLACES: OnceCell<Result<Places, String>> = OnceCell::const_new();

/// Set for a test's child process: it uses the home its parent prepared.
const CHILD_AGENT: &str = "PERCH_STANDIN_CHILD_AGENT";
/// The argument of the `sleep` the child leaves running in its guest.
const CHILD_MARKER: &str = "PERCH_STANDIN_CHILD_MARKER";

/// [`standin_setup`], and a fresh agent directory to run on it.
async fn standin_agent() -> Option<(MachineSetup, tempfile::TempDir)> {
    Some((standin_setup().await?, new_agent()))
}

/// A machine setup on the stand-in runtime, or `None` after printing why this host cannot run
/// it (a panic instead under `CI=true`). The home is prepared once per test run.
#[allow(clippy::print_stdout)] // The skip reason, printed like a test's own output.
pub(super) async fn standin_setup() -> Option<MachineSetup> {
    let preparation = if std::env::var_os(CHILD_AGENT).is_some() {
        Preparation::Attach
    } else {
        Preparation::Fresh
    };
    let places = PLACES
        .get_or_init(|| async move {
            let places = prepare(preparation).await?;
            // microsandbox resolves a secret's value from this process's environment at boot.
            if std::env::var("JOURNEY_SOURCE").as_deref() != Ok(SECRET_VALUE) {
                return Err(format!(
                    "JOURNEY_SOURCE is not {SECRET_VALUE:?} (.ci/test exports it; the machine reads the journey's secret from it)"
                ));
            }
            Ok(places)
        })
        .await;
    match places {
        Ok(places) => Some(MachineSetup {
            backend: Backend::Microvm,
            places: places.clone(),
            idle: DEFAULT_IDLE,
        }),
        Err(reason) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the stand-in tests cannot run here, and CI=true: {reason}"
            );
            println!("skipped: the stand-in runtime: {reason}");
            None
        }
    }
}

/// Every launch of the machine named `name`, oldest first: `{name, sandbox_id, argv, config}`.
pub(super) fn launches(setup: &MachineSetup, name: &str) -> Vec<Value> {
    let path = setup.places.msb_home.join("standin/launches.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    text.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|launch| launch["name"] == name)
        .collect()
}

fn name_of(agent: &LoadedAgent) -> String {
    sandbox::machine_name(agent.dir.root())
}

async fn run(machine: &Machine, line: &str) -> sandbox::Output {
    machine
        .run(Command::shell(line), CancellationToken::new())
        .await
        .unwrap()
}

async fn argv(machine: &Machine, args: &[&str]) -> sandbox::Output {
    machine
        .run(
            Command::argv(args.iter().copied()),
            CancellationToken::new(),
        )
        .await
        .unwrap()
}

/// The options of the launch's directory mount of the agent's `workspace/` (`tag:host:options`),
/// such as `["rw", "quota=4096"]`.
fn workspace_mount_options(launch: &Value) -> Vec<String> {
    let mounts: Vec<&str> = launch["config"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|mount| mount.as_str().unwrap())
        .collect();
    let workspace: Vec<&str> = mounts
        .iter()
        .filter_map(|mount| {
            let (_tag, rest) = mount.split_once(':')?;
            let (host, options) = rest.rsplit_once(':')?;
            host.ends_with("/workspace").then_some(options)
        })
        .collect();
    assert_eq!(workspace.len(), 1, "one workspace mount: {mounts:?}");
    workspace[0].split(',').map(str::to_owned).collect()
}

/// The quota, in MiB, of the launch's workspace mount.
fn workspace_quota(launch: &Value) -> Option<String> {
    workspace_mount_options(launch)
        .iter()
        .find_map(|option| option.strip_prefix("quota=").map(str::to_owned))
}

/// Each egress rule of a launch's network policy as `action destination protocols ports`.
fn rules(network: &Value) -> Vec<String> {
    let policy = &network["policy"];
    assert_eq!(policy["default_egress"], "deny", "{policy}");
    assert_eq!(policy["default_ingress"], "deny", "{policy}");
    policy["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("no rules in {policy}"))
        .iter()
        .map(|rule| {
            assert_eq!(rule["direction"], "egress", "{rule}");
            let destination = match &rule["destination"] {
                Value::Object(map) => map
                    .iter()
                    .map(|(kind, value)| format!("{kind}:{}", value.as_str().unwrap_or_default()))
                    .collect::<String>(),
                other => other
                    .as_str()
                    .map_or_else(|| other.to_string(), str::to_owned),
            };
            let list = |field: &str, each: &dyn Fn(&Value) -> String| {
                rule[field]
                    .as_array()
                    .map(|items| items.iter().map(each).collect::<Vec<_>>().join(","))
                    .unwrap_or_default()
            };
            let protocols = list("protocols", &|protocol| {
                protocol.as_str().unwrap_or_default().to_owned()
            });
            let ports = list("ports", &|range| {
                format!("{}-{}", range["start"], range["end"])
            });
            format!(
                "{} {destination} {protocols} {ports}",
                rule["action"].as_str().unwrap_or_default()
            )
            .trim_end()
            .to_owned()
        })
        .collect()
}

/// Every file of the catalog, byte for byte, together.
fn catalog_bytes(setup: &MachineSetup) -> Vec<u8> {
    let db = setup.places.msb_home.join("db");
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(&db).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("msb.db") {
            bytes.extend(std::fs::read(entry.path()).unwrap_or_default());
        }
    }
    assert!(!bytes.is_empty(), "no catalog in {}", db.display());
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// Every file under `dir`, byte for byte, together.
fn tree_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(kind) if kind.is_file() => {
                    bytes.extend(std::fs::read(&path).unwrap_or_default())
                }
                _ => {}
            }
        }
    }
    bytes
}

#[tokio::test(flavor = "multi_thread")]
async fn the_runtime_gets_the_exact_policy_and_one_entry_per_secret_with_its_host() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let root = agent_dir.path();
    write(
        root,
        "sandbox.lua",
        r#"sandbox {
  workspace_disk = 2048,
  allow = { "api.github.com", "*.githubusercontent.com", "host.microsandbox.internal" },
  secrets = {
    { env = "GITHUB_TOKEN", source = env "JOURNEY_SOURCE", placeholder = "perch-github-token", hosts = { "api.github.com" } },
    { env = "HOST_TOKEN", source = env "JOURNEY_SOURCE", placeholder = "perch-host-token", hosts = { "host.microsandbox.internal" } },
  },
}
"#,
    );
    let agent = load(root);
    let name = name_of(&agent);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    let output = run(&machine, "echo \"$GITHUB_TOKEN $HOST_TOKEN\"").await;
    assert_eq!(output.end, End::Exited(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "perch-github-token perch-host-token\n"
    );
    machine.stop().await.unwrap();

    let launched = launches(&setup, &name);
    assert_eq!(launched.len(), 1, "{launched:?}");
    assert_eq!(
        workspace_quota(&launched[0]).as_deref(),
        Some("2048"),
        "workspace_disk is the workspace bind's quota"
    );
    let network = &launched[0]["config"]["network"]["config"];
    assert_eq!(network["strict"], true, "{network}");
    assert_eq!(network["dns"]["rebind_protection"], true, "{network}");
    assert_eq!(
        rules(network),
        [
            "allow group:host tcp,udp 53-53",
            "deny group:loopback",
            "deny group:private",
            "deny group:link_local",
            "deny group:metadata",
            "deny group:multicast",
            "deny cidr:0.0.0.0/8",
            "deny cidr:::/128",
            "allow group:host",
            "allow domain:api.github.com",
            "allow domain_suffix:githubusercontent.com",
        ],
        "{network}"
    );
    // Two secrets, two entries, each with its own host: the one for api.github.com keeps it and
    // its TLS identity. Before b5ec3db one secret could name both hosts; perch sent two entries
    // with the same env, and microsandbox kept only the later: the alias, without TLS, so this
    // launch would have held one entry and no api.github.com. sandbox.lua now refuses that mix.
    let entry = |env: &str, placeholder: &str, host: &str, tls: bool| {
        serde_json::json!({
            "allowed_hosts": [{ "exact": host }],
            "env_var": env,
            "passthrough_hosts": [],
            "placeholder": placeholder,
            "require_tls_identity": tls,
            "source": { "kind": "env", "var": "JOURNEY_SOURCE" },
            "substitution": { "body": false, "headers": true, "query": false },
            "value": SECRET_VALUE,
        })
    };
    assert_eq!(
        network["secrets"]["secrets"],
        serde_json::json!([
            entry("GITHUB_TOKEN", "perch-github-token", "api.github.com", true),
            entry(
                "HOST_TOKEN",
                "perch-host-token",
                "host.microsandbox.internal",
                false
            ),
        ]),
        "{network}"
    );

    // At rest nothing holds the value: not the catalog, not perch's state.
    assert!(!contains(&catalog_bytes(&setup), SECRET_VALUE));
    assert!(!contains(&tree_bytes(&root.join(".perch")), SECRET_VALUE));
    drop(machine);

    // The mix that lost the host is refused before any launch.
    write(
        root,
        "sandbox.lua",
        r#"sandbox {
  allow = { "api.github.com", "host.microsandbox.internal" },
  secrets = {
    { env = "GITHUB_TOKEN", source = env "JOURNEY_SOURCE", hosts = { "api.github.com", "host.microsandbox.internal" } },
  },
}
"#,
    );
    let refused = perch::agent::load(&perch::agent::AgentDir::open(root).unwrap())
        .err()
        .map(|problems| problems.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("host.microsandbox.internal"),
        "{refused:?}"
    );
    assert_eq!(launches(&setup, &name).len(), 1);
}

/// A copy of the cache whose `perch:default` build names another layer digest: what
/// `perch image build --rebuild` leaves behind, without building (the image microsandbox holds
/// is unchanged; only perch's record of it differs).
fn rebuilt_cache(places: &Places) -> tempfile::TempDir {
    let images = places.cache.join("images");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(images.join("default.json")).unwrap())
            .unwrap();
    let key = record["key"].as_str().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let build = copy.path().join("images").join(key);
    std::fs::create_dir_all(&build).unwrap();
    std::fs::copy(
        images.join("default.json"),
        copy.path().join("images/default.json"),
    )
    .unwrap();
    for file in ["rootfs", "image.tar"] {
        std::os::unix::fs::symlink(images.join(key).join(file), build.join(file)).unwrap();
    }
    let mut recipe: Value = serde_json::from_str(
        &std::fs::read_to_string(images.join(key).join("recipe.json")).unwrap(),
    )
    .unwrap();
    recipe["archive"]["layer"]["digest"] = Value::from(format!("sha256:{}", "0".repeat(64)));
    std::fs::write(build.join("recipe.json"), recipe.to_string()).unwrap();
    copy
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_resumes_with_its_disk_and_is_recreated_with_bootstrap_when_its_fingerprint_changes()
 {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let root = agent_dir.path();
    write(
        root,
        "sandbox.lua",
        "sandbox { allow = {}, bootstrap = { \"echo booted >> /root/bootstraps\" } }\n",
    );
    let agent = load(root);
    let name = name_of(&agent);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    assert_eq!(
        text(&run(&machine, "cat /root/bootstraps").await.stdout),
        "booted\n"
    );
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Created);
    run(&machine, "echo kept > /root/disk-marker").await;
    machine.stop().await.unwrap();
    drop(machine);

    // Same fingerprint: the stored machine starts again with its disk, no bootstrap.
    let machine = machine_when_free(&agent, &setup).await;
    let output = run(&machine, "cat /root/disk-marker /root/bootstraps").await;
    assert_eq!(text(&output.stdout), "kept\nbooted\n");
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Resumed);
    machine.stop().await.unwrap();
    drop(machine);
    let launches_so_far = launches(&setup, &name);
    assert_eq!(launches_so_far.len(), 2, "{launches_so_far:?}");
    assert_eq!(
        launches_so_far[0]["sandbox_id"], launches_so_far[1]["sandbox_id"],
        "resumed, not recreated"
    );
    for launch in &launches_so_far {
        assert_eq!(
            workspace_quota(launch).as_deref(),
            Some("4096"),
            "without workspace_disk, microsandbox's default quota"
        );
    }

    // A rebuilt image (another layer digest): a new machine, bootstrapped on an empty disk.
    let cache = rebuilt_cache(&setup.places);
    let mut rebuilt = setup.clone();
    rebuilt.places.cache = cache.path().to_owned();
    let machine = machine_when_free(&agent, &rebuilt).await;
    let output = run(
        &machine,
        "cat /root/disk-marker 2>/dev/null || echo gone; cat /root/bootstraps",
    )
    .await;
    assert_eq!(text(&output.stdout), "gone\nbooted\n");
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Created);
    machine.stop().await.unwrap();
    let all = launches(&setup, &name);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_ne!(all[1]["sandbox_id"], all[2]["sandbox_id"], "recreated");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_that_cannot_start_ends_as_127_or_126_with_the_reason() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    write(
        agent_dir.path(),
        "workspace/not-executable",
        "#!/bin/sh\necho ran\n",
    );
    let agent = load(agent_dir.path());
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    let missing = argv(&machine, &["no-such-program-here", "--flag"]).await;
    assert_eq!(missing.end, End::Exited(127), "{}", text(&missing.stderr));
    assert!(
        text(&missing.stderr).contains("no-such-program-here"),
        "{}",
        text(&missing.stderr)
    );
    let denied = argv(&machine, &["/workspace/not-executable"]).await;
    assert_eq!(denied.end, End::Exited(126), "{}", text(&denied.stderr));
    assert!(!text(&denied.stdout).contains("ran"));
    assert_eq!(
        argv(&machine, &["sh", "-c", "exit 7"]).await.end,
        End::Exited(7)
    );
    machine.stop().await.unwrap();
}

/// Guest processes whose command line contains `needle`, as the guest sees them.
async fn guest_processes(machine: &Machine, needle: &str) -> String {
    let line = format!(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -F -- '{needle}' | grep -v grep || true"
    );
    text(&run(machine, &line).await.stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_and_timeout_kill_the_command_and_leave_the_machine_usable() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let root = agent_dir.path();
    let agent = load(root);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    let (cancel, canceller) = cancel_once_exists(root.join("workspace/started"));
    let output = machine
        .run(
            Command::shell("touch started; sleep 301.5 & sleep 302.5; echo not cancelled"),
            cancel,
        )
        .await
        .unwrap();
    canceller.await.unwrap();
    assert_eq!(output.end, End::Cancelled);
    assert_eq!(output.end.code(), 130);
    assert!(!text(&output.stdout).contains("not cancelled"));
    let output = machine
        .run(
            Command::shell("sleep 303.5").timeout(Duration::from_millis(300)),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(output.end, End::TimedOut(Duration::from_millis(300)));
    assert_eq!(output.end.code(), 124);
    // The whole process group went, background child included; the machine still runs.
    let left = std::cell::RefCell::new(String::new());
    let (seen, guest) = (&left, &machine);
    let gone = Poll::within(Duration::from_secs(10))
        .every(Duration::from_millis(50))
        .holds_async(move || async move {
            let found = guest_processes(guest, "sleep 30").await;
            let none = found.is_empty();
            *seen.borrow_mut() = found;
            none
        })
        .await;
    assert!(gone, "still running in the guest: {}", left.borrow());
    assert_eq!(
        text(&run(&machine, "echo still usable").await.stdout),
        "still usable\n"
    );
    assert_eq!(machine.boots(), 1, "the machine never restarted");
    machine.stop().await.unwrap();
}

/// The stand-in ignores a graceful stop of the sandbox `name` while this file exists (a knob
/// of tests/msb, for the kill fallback).
fn ignore_shutdown(setup: &MachineSetup, name: &str) -> PathBuf {
    setup
        .places
        .msb_home
        .join("standin/ignore-shutdown")
        .join(name)
}

/// Host processes whose command line contains `needle`.
fn host_processes(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(needle))
        .count()
}

fn wait_until_no_host_process(needle: &str, within: Duration) {
    Poll::within(within).until(
        &format!("the processes mentioning {needle} to end with their owner"),
        || host_processes(needle) == 0,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_the_runtime_ignores_ends_in_a_kill_and_the_disk_stays() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let agent = load(agent_dir.path());
    let name = name_of(&agent);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    run(&machine, "echo kept > /root/disk-marker; sync").await;
    let knob = ignore_shutdown(&setup, &name);
    std::fs::create_dir_all(knob.parent().unwrap()).unwrap();
    std::fs::write(&knob, "").unwrap();
    let stopping = Instant::now();
    machine.stop().await.unwrap();
    let took = stopping.elapsed();
    std::fs::remove_file(&knob).unwrap();
    assert!(
        took >= Duration::from_secs(19),
        "stopped after {took:?}: the runtime was not made to ignore the stop, so the kill fallback did not run"
    );
    wait_until_no_host_process(&format!("--name {name}"), Duration::from_secs(10));
    wait_until_no_host_process(&name, Duration::from_secs(10));
    let output = run(&machine, "cat /root/disk-marker").await;
    assert_eq!(text(&output.stdout), "kept\n", "{}", text(&output.stderr));
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Resumed);
    machine.stop().await.unwrap();
}

/// Boots a machine on the stand-in, leaves a detached guest process behind, says so, and waits
/// to be killed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the stand-in tests"]
async fn standin_machine_child() {
    let (Ok(dir), Ok(marker)) = (std::env::var(CHILD_AGENT), std::env::var(CHILD_MARKER)) else {
        return;
    };
    let setup = standin_setup().await.unwrap();
    let agent = load(Path::new(&dir));
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    let output = run(
        &machine,
        &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo started"),
    )
    .await;
    assert_eq!(
        text(&output.stdout),
        "started\n",
        "{}",
        text(&output.stderr)
    );
    println!("machine is up");
    std::future::pending::<()>().await;
}

/// [`standin_machine_child`] for the agent in `dir`, once its machine is up with
/// `sleep <marker>` running in it.
fn child_holding(dir: &Path, marker: &str) -> std::process::Child {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "suite::standin::standin_machine_child",
            "--nocapture",
        ])
        .env(CHILD_AGENT, dir)
        .env(CHILD_MARKER, marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("machine is up"));
    assert!(up, "the child never booted its machine");
    child
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_perch_leaves_no_guest_process_and_no_runtime() {
    let Some((_setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let agent = load(agent_dir.path());
    let name = name_of(&agent);
    let mut child = tokio::task::spawn_blocking({
        let dir = agent_dir.path().to_owned();
        move || child_holding(&dir, "4343.75")
    })
    .await
    .unwrap();
    assert!(host_processes("4343.75") > 0);
    assert!(host_processes(&name) > 0, "no runtime for {name}");
    child.kill().unwrap();
    child.wait().unwrap();
    tokio::task::spawn_blocking(move || {
        wait_until_no_host_process("4343.75", Duration::from_secs(20));
        wait_until_no_host_process(&name, Duration::from_secs(20));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_held_by_another_process_is_refused_and_left_running() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let agent = load(agent_dir.path());
    let mut child = tokio::task::spawn_blocking({
        let dir = agent_dir.path().to_owned();
        move || child_holding(&dir, "4444.25")
    })
    .await
    .unwrap();

    // perch's own lock refuses first, naming the holder.
    let error = sandbox::machine_for(&agent, &setup, lookup).unwrap_err();
    assert!(matches!(error, SandboxError::Held { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&child.id().to_string()),
        "{error}"
    );

    // Below that lock, microsandbox's: the adapter alone never adopts the running machine.
    let spec = Spec {
        name: name_of(&agent),
        image: perch::sandbox::image::resolve_default_image(&setup.places.cache).unwrap(),
        cpus: 1,
        memory: 512,
        workspace: agent.dir.workspace(),
        workspace_disk: 4096,
        allow: Vec::new(),
        secrets: Vec::new(),
        env: Vec::new(),
        state: agent_dir.path().join(".perch/sandbox"),
    };
    let adapter = Microvm::new(spec, &setup.places.msb_home).unwrap();
    let error = adapter.up(Boot::Resume).await.unwrap_err();
    assert!(matches!(error, SandboxError::Held { .. }), "{error:?}");
    assert!(
        host_processes("4444.25") > 0,
        "the held machine was disturbed"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    wait_until_no_host_process("4444.25", Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_boot_failure_is_a_readable_error() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let agent = load(agent_dir.path());
    let name = name_of(&agent);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    assert_eq!(text(&run(&machine, "echo first").await.stdout), "first\n");
    machine.stop().await.unwrap();
    // The machine's disk is no longer a filesystem: the boot stops with the reason, and the
    // crate's text reaches perch's error whole.
    let disk = setup
        .places
        .msb_home
        .join("sandboxes")
        .join(&name)
        .join("upper.ext4");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let error = machine
        .run(Command::shell("echo never"), CancellationToken::new())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("cannot boot the sandbox"), "{message}");
    assert!(
        message.contains("upper.ext4") && message.contains("bad superblock magic"),
        "{message}"
    );
    machine.stop().await.unwrap();
}

/// A boot the runtime itself fails (its `boot-error.json`, after the startup line, as the real
/// runtime reports a guest that cannot start): perch's error carries the runtime's words, nothing
/// is left running, and the next boot, once the cause is gone, works.
#[tokio::test(flavor = "multi_thread")]
async fn a_boot_the_runtime_fails_is_reported_in_its_words_and_the_next_boot_works() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let agent = load(agent_dir.path());
    let name = name_of(&agent);
    let knob = setup.places.msb_home.join("standin/fail-boot").join(&name);
    std::fs::create_dir_all(knob.parent().unwrap()).unwrap();
    std::fs::write(&knob, "").unwrap();
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    let error = machine
        .run(Command::shell("echo never"), CancellationToken::new())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("cannot boot the sandbox"), "{message}");
    assert!(
        message.contains("the stand-in runtime was asked to fail this boot"),
        "the runtime's boot-error.json reaches perch: {message}"
    );
    assert_eq!(machine.state().await.unwrap().0, State::Stopped);
    std::fs::remove_file(&knob).unwrap();
    assert_eq!(text(&run(&machine, "echo booted").await.stdout), "booted\n");
    machine.stop().await.unwrap();
}

/// `perch run` with the real adapter on the stand-in (no `PERCH_SANDBOX`): a Telegram message
/// whose model reply calls `bash` and `write` in the guest.
#[test]
fn perch_run_answers_a_chat_with_tools_run_through_the_standin() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(setup) = runtime.block_on(standin_setup()) else {
        return;
    };
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        // `perch run` checks the real /dev/kvm (PERCH_ASSUME_KVM only waives the CPU check).
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "perch run needs /dev/kvm to open, and CI=true"
        );
        println!("skipped: perch run checks /dev/kvm, which does not open here");
        return;
    }
    let agent = super::support::scenario::Scenario::telegram_dm().build();
    let (model, telegram, dir) = (&agent.model, agent.telegram(), &agent.dir);
    model.push(
        Reply::new()
            .with_call(
                "c1",
                "bash",
                serde_json::json!({ "command": "echo \"$(id -un) in $(pwd)\" > where.txt; uname -s" }),
            )
            .with_call(
                "c2",
                "write",
                serde_json::json!({ "path": "notes/hello.txt", "content": "written by the model\n" }),
            ),
    );
    model.push(Script::text("Done, Alice."));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(["run", dir.path().to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_CACHE", &setup.places.cache)
        .env("MSB_HOME", &setup.places.msb_home)
        .env("PERCH_ASSUME_KVM", "1")
        .env("TELEGRAM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let service = super::support::scenario::Perch::spawn(command);
    agent.send(&super::support::scenario::alice(), "where are you?");
    agent.wait_for_a_reply();
    let stderr = service.stop();
    let sent = telegram.sent();
    assert_eq!(sent.len(), 1, "{stderr}");
    assert_eq!(sent[0].shown, "Done, Alice.", "{stderr}");
    let workspace = dir.path().join("workspace");
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes/hello.txt")).unwrap(),
        "written by the model\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("where.txt")).unwrap(),
        "root in /workspace\n"
    );
    // The model saw the guest's answer to the bash call.
    let second = model.requests()[1].body.to_string();
    assert!(second.contains("Linux"), "{second}");
    let name = name_of(&load(dir.path()));
    assert_eq!(launches(&setup, &name).len(), 1, "{stderr}");
    wait_until_no_host_process(&name, Duration::from_secs(20));
}

/// A read-only bind mount of `path` over itself, undone on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(path: &Path) -> Self {
        for args in [
            vec!["--bind", path.to_str().unwrap(), path.to_str().unwrap()],
            vec!["-o", "remount,bind,ro", path.to_str().unwrap()],
        ] {
            let status = std::process::Command::new("mount")
                .args(&args)
                .status()
                .unwrap();
            assert!(status.success(), "mount {args:?}");
        }
        Self(path.to_owned())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Whether agents could share one image cache that root loaded and they cannot write: no.
/// microsandbox 0.7.11 takes lock files and storage leases in `<home>/cache/` when it creates a
/// machine (microsandbox-image's `cache/lock.rs`, `cache/lease.rs`), so a boot from a
/// read-only cache fails. Each agent's user therefore loads the image into its own home
/// (deploy/README.md, "One user per agent"); should a later microsandbox boot here, this test
/// fails and the shared cache becomes possible.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_does_not_boot_from_an_image_cache_it_cannot_write() {
    let Some((setup, agent_dir)) = standin_agent().await else {
        return;
    };
    let shared = &setup.places.msb_home;
    let home = tempfile::tempdir_in(&setup.places.cache).unwrap();
    for dir in ["bin", "lib"] {
        std::fs::create_dir_all(home.path().join(dir)).unwrap();
    }
    for file in ["bin/msb", "bin/msb.pose-as-real"] {
        std::fs::copy(shared.join(file), home.path().join(file)).unwrap();
    }
    std::fs::copy(
        shared.join("lib/libkrunfw.so.5.6.1"),
        home.path().join("lib/libkrunfw.so.5.6.1"),
    )
    .unwrap();
    let perch::sandbox::ImageRef::Local {
        reference, rootfs, ..
    } = perch::sandbox::image::resolve_default_image(&setup.places.cache).unwrap()
    else {
        panic!("perch:default is not a local build");
    };
    perch::sandbox::microvm::load_image(
        home.path(),
        &rootfs.with_file_name("image.tar"),
        &reference,
    )
    .await
    .unwrap();
    let read_only = ReadOnly::mount(&home.path().join("cache"));
    let mut own_home = setup.clone();
    own_home.places.msb_home = home.path().to_owned();
    let agent = load(agent_dir.path());
    let machine = sandbox::machine_for(&agent, &own_home, lookup).unwrap();
    let boot = machine
        .run(Command::shell("echo booted"), CancellationToken::new())
        .await;
    let _ = machine.stop().await;
    drop(read_only);
    match boot {
        Err(SandboxError::Failed { action, reason }) => {
            assert_eq!(action, "boot");
            assert!(reason.contains("Read-only file system"), "{reason}");
        }
        other => panic!("a boot from a read-only image cache: {other:?}"),
    }
    drop(machine);
}
