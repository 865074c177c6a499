//! The sandbox contract as one journey, on the double, on the stand-in runtime, in a microVM.
//!
//! The double and the stand-in runtime (`suite::standin`) on every CI run; a real microVM where
//! hardware KVM exists (`--include-ignored`, which `.ci/test` adds when `perch doctor` passes).

use super::support::wait::Poll;
use super::support::{new_agent, write};
use perch::agent::{self, AgentDir, LoadedAgent};
use perch::host::Places;
use perch::sandbox::{
    self, Backend, Command, End, LastBoot, Machine, MachineSetup, SandboxError, State,
};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The journey's secret value; `.ci/test` exports it as `JOURNEY_SOURCE`, where microsandbox
/// reads it at boot.
pub(super) const SECRET_VALUE: &str = "sk-journey-4c1d2e9f-never-in-the-guest";
const IDLE: Duration = Duration::from_millis(400);

fn setup(backend: Backend) -> MachineSetup {
    MachineSetup {
        backend,
        places: Places::from_environment(),
        idle: IDLE,
    }
}

fn sandbox_lua(allow: &[&str]) -> String {
    let allow: Vec<String> = allow.iter().map(|host| format!("{host:?}")).collect();
    format!(
        r#"sandbox {{
  allow = {{ {} }},
  secrets = {{
    {{ env = "JOURNEY_TOKEN", source = env "JOURNEY_SOURCE", placeholder = "perch-journey-token", hosts = {{ "host.microsandbox.internal" }} }},
  }},
  env = {{ GREETING = "hello from sandbox.lua" }},
}}
"#,
        allow.join(", ")
    )
}

/// A token cancelled as soon as `marker` exists (a command has started), or after 20 s, and the
/// task that watches for it.
pub(super) fn cancel_once_exists(
    marker: std::path::PathBuf,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let watcher = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            Poll::within(Duration::from_secs(20))
                .every(Duration::from_millis(10))
                .holds_async(|| std::future::ready(marker.exists()))
                .await;
            cancel.cancel();
        })
    };
    (cancel, watcher)
}

pub(super) fn load(dir: &Path) -> LoadedAgent {
    agent::load(&AgentDir::open(dir).unwrap()).unwrap_or_else(|problems| panic!("{problems}"))
}

pub(super) fn lookup(name: &str) -> Option<String> {
    (name == "JOURNEY_SOURCE").then(|| SECRET_VALUE.to_owned())
}

async fn run(machine: &Machine, line: &str) -> sandbox::Output {
    machine
        .run(Command::shell(line), CancellationToken::new())
        .await
        .unwrap()
}

pub(super) fn text(stream: &sandbox::Captured) -> String {
    stream.marked_text("stream")
}

async fn wait_for_state(machine: &Machine, wanted: State) {
    Poll::within(Duration::from_secs(20))
        .until_async(&format!("the machine to be {wanted:?}"), || async {
            machine.state().await.unwrap().0 == wanted
        })
        .await;
}

/// Whether a host TCP listener accepts a connection from the guest within the command.
async fn guest_connects(machine: &Machine, host: &str, port: u16) -> bool {
    let line = format!("exec 3<>/dev/tcp/{host}/{port} && echo connected >&3 && echo connected");
    let output = machine
        .run(
            Command::argv(["bash", "-c", &line]).timeout(Duration::from_secs(10)),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    output.end == End::Exited(0) && text(&output.stdout).contains("connected")
}

/// Which way the journey goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The namespace double.
    Double,
    /// The real adapter and crate over the stand-in runtime.
    Standin,
    /// The real adapter and crate in a real microVM.
    Microvm,
}

async fn journey(way: Way, setup: MachineSetup) {
    let setup = MachineSetup {
        idle: IDLE,
        ..setup
    };
    let agent_dir = new_agent();
    let root = agent_dir.path();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    write(
        root,
        "sandbox.lua",
        &sandbox_lua(&["host.microsandbox.internal"]),
    );
    write(root, "workspace/note.txt", "written on the host\n");
    let agent = load(root);
    let machine = sandbox::machine_for(&agent, &setup, lookup).unwrap();
    assert_eq!(
        machine.state().await.unwrap().0,
        State::Stopped,
        "boots lazily"
    );

    // Boot, working directory, workspace both ways.
    let output = run(
        &machine,
        "pwd; cat note.txt; echo from the guest > reply.txt",
    )
    .await;
    assert_eq!(output.end, End::Exited(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "/workspace\nwritten on the host\n");
    assert_eq!(
        std::fs::read_to_string(root.join("workspace/reply.txt")).unwrap(),
        "from the guest\n"
    );
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Created);

    // Exit codes are data; argv, env and stdin travel as given.
    assert_eq!(run(&machine, "exit 3").await.end, End::Exited(3));
    let output = machine
        .run(
            Command::argv(["sh", "-c", "echo \"$GREETING/$EXTRA\""]).env("EXTRA", "per command"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(text(&output.stdout), "hello from sandbox.lua/per command\n");
    let big = "0123456789abcdef".repeat(200 * 1024 / 16 * 5); // 1000 KiB: far past ARG_MAX's 128 KiB
    let output = machine
        .run(
            Command::argv(["sh", "-c", "cat > big.txt && wc -c < big.txt"]).stdin(big.clone()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(text(&output.stdout).trim(), big.len().to_string());
    assert_eq!(
        std::fs::read_to_string(root.join("workspace/big.txt")).unwrap(),
        big
    );

    // A missing binary is an exit status, not an error.
    let output = machine
        .run(
            Command::argv(["no-such-binary-here"]),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(output.end, End::Exited(127));
    assert!(text(&output.stderr).contains("no-such-binary-here"));

    // Secrets: the guest holds only the placeholder.
    let output = run(
        &machine,
        "echo \"$JOURNEY_TOKEN\"; env; cat /proc/1/environ",
    )
    .await;
    assert!(text(&output.stdout).starts_with("perch-journey-token\n"));
    assert!(!text(&output.stdout).contains(SECRET_VALUE));

    // Isolation: nothing of the agent directory but workspace/, no host processes.
    let host_root = root.display().to_string();
    let output = run(
        &machine,
        &format!(
            "ls -a /; test -e '{host_root}/agent.lua' && echo LEAK; test -e /agent.lua && echo LEAK; \
             test -e /.perch && echo LEAK; ln -sf ../agent.lua escape; cat escape && echo LEAK; \
             ln -sf '{host_root}/sandbox.lua' escape2; cat escape2 && echo LEAK; true"
        ),
    )
    .await;
    assert!(
        !text(&output.stdout).contains("LEAK"),
        "{}",
        text(&output.stdout)
    );
    let mut marker = std::process::Command::new("sleep")
        .arg("4711.25")
        .spawn()
        .unwrap();
    let output = run(&machine, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").await;
    marker.kill().unwrap();
    marker.wait().unwrap();
    assert!(
        !text(&output.stdout).contains("4711.25"),
        "a host process is visible"
    );

    // Egress: host.microsandbox.internal is listed. The microVM lets it through; the double and
    // the stand-in have no egress at all (stricter, never wider). The host's loopback and
    // another private address stay out of reach either way.
    let reached = guest_connects(&machine, "host.microsandbox.internal", port).await;
    assert_eq!(
        reached,
        way == Way::Microvm,
        "listed host reachable only in the VM"
    );
    assert!(!guest_connects(&machine, "127.0.0.1", port).await);
    assert!(!guest_connects(&machine, "10.0.2.2", port).await);
    assert!(!guest_connects(&machine, "169.254.169.254", 80).await);
    if way != Way::Microvm {
        assert!(listener.accept().is_err(), "{way:?} let a connection out");
    }

    // Cancel kills the command (exit 130) and leaves the machine usable.
    let (cancel, canceller) = cancel_once_exists(root.join("workspace/started"));
    let output = machine
        .run(
            Command::shell("touch started; sleep 300; echo not cancelled"),
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
            Command::shell("sleep 300").timeout(Duration::from_millis(300)),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(output.end, End::TimedOut(Duration::from_millis(300)));
    assert_eq!(
        text(&run(&machine, "echo still usable").await.stdout),
        "still usable\n"
    );

    // Long output: shortened for the model, whole in the guest.
    let long = "line of output\n".repeat(3000);
    let shown = sandbox::for_model(&machine, long.clone(), CancellationToken::new())
        .await
        .unwrap();
    assert!(shown.len() < 25_000);
    let path = shown
        .split_whitespace()
        .find(|word| word.starts_with("/var/tmp/perch/"))
        .unwrap();
    let output = run(&machine, &format!("wc -c < {path}")).await;
    assert_eq!(text(&output.stdout).trim(), long.len().to_string());

    // Idle stop keeps the disk; the next command restarts the same machine.
    run(&machine, "echo kept > /root/disk-marker").await;
    wait_for_state(&machine, State::Stopped).await;
    let output = run(&machine, "cat /root/disk-marker").await;
    assert_eq!(text(&output.stdout), "kept\n");
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Resumed);
    machine.stop().await.unwrap();
    drop(machine);

    // Same fingerprint: reused. Changed allowlist: recreated, old disk gone.
    let machine = machine_when_free(&agent, &setup).await;
    assert_eq!(
        text(&run(&machine, "cat /root/disk-marker").await.stdout),
        "kept\n"
    );
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Resumed);
    machine.stop().await.unwrap();
    drop(machine);
    write(
        root,
        "sandbox.lua",
        &sandbox_lua(&["host.microsandbox.internal", "example.org"]),
    );
    let agent = load(root);
    let machine = machine_when_free(&agent, &setup).await;
    let output = run(&machine, "cat /root/disk-marker 2>/dev/null || echo gone").await;
    assert_eq!(text(&output.stdout), "gone\n");
    assert_eq!(machine.state().await.unwrap().1, LastBoot::Created);
    machine.stop().await.unwrap();
}

/// The previous handle's task releases the lock as it ends; wait for that, with a deadline.
pub(super) async fn machine_when_free(agent: &LoadedAgent, setup: &MachineSetup) -> Machine {
    Poll::within(Duration::from_secs(20))
        .every(Duration::from_millis(10))
        .value_async(
            "the machine's lock to be let go",
            || match sandbox::machine_for(agent, setup, lookup) {
                Ok(machine) => Some(machine),
                Err(SandboxError::Held { .. }) => None,
                Err(error) => panic!("{error}"),
            },
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn journey_in_the_namespace_double() {
    journey(Way::Double, setup(Backend::NamespaceDouble)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn journey_through_the_standin() {
    let Some(setup) = super::standin::standin_setup().await else {
        return;
    };
    journey(Way::Standin, setup).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs hardware KVM"]
async fn journey_in_the_microvm() {
    assert_eq!(
        std::env::var("JOURNEY_SOURCE").as_deref(),
        Ok(SECRET_VALUE),
        "microsandbox reads the secret from the environment at boot: run this through .ci/test"
    );
    journey(Way::Microvm, setup(Backend::Microvm)).await;
}

/// Processes on this host whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(needle))
        .count()
}

fn wait_until_no_process_mentions(needle: &str) {
    Poll::within(Duration::from_secs(20)).until(
        &format!("the processes mentioning {needle} to end with their owner"),
        || processes_mentioning(needle) == 0,
    );
}

fn double() -> MachineSetup {
    setup(Backend::NamespaceDouble)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_bootstrap_leaves_nothing_running_and_is_retried() {
    let agent_dir = new_agent();
    let root = agent_dir.path();
    write(
        root,
        "sandbox.lua",
        "sandbox { allow = {}, bootstrap = { \"echo first > /root/one\", \"echo broken >&2; exit 9\" } }\n",
    );
    let agent = load(root);
    let machine = sandbox::machine_for(&agent, &double(), lookup).unwrap();
    let error = machine
        .run(Command::shell("echo never"), CancellationToken::new())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("sandbox.lua: bootstrap"), "{message}");
    assert!(
        message.contains("exit code 9") && message.contains("broken"),
        "{message}"
    );
    assert_eq!(machine.state().await.unwrap().0, State::Stopped);
    let state_dir = root.join(".perch/sandbox");
    wait_until_no_process_mentions(&state_dir.display().to_string());
    assert!(!state_dir.join("fingerprint.json").exists());
    let again = machine
        .run(Command::shell("echo never"), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        again.to_string().contains("exit code 9"),
        "bootstrap runs again: {again}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_gone_behind_a_matching_fingerprint_is_bootstrapped_again() {
    let agent_dir = new_agent();
    let root = agent_dir.path();
    write(
        root,
        "sandbox.lua",
        "sandbox { allow = {}, bootstrap = { \"echo ready > /root/bootstrapped\" } }\n",
    );
    let agent = load(root);
    let machine = sandbox::machine_for(&agent, &double(), lookup).unwrap();
    let first = machine
        .run(
            Command::shell("cat /root/bootstrapped"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(text(&first.stdout), "ready\n");
    machine.stop().await.unwrap();
    drop(machine);
    let state_dir = root.join(".perch/sandbox");
    wait_until_no_process_mentions(&state_dir.display().to_string());
    // The directory was restored on a host that never held its machine: the fingerprint is
    // there, the machine's disk is not.
    assert!(state_dir.join("fingerprint.json").exists());
    std::fs::remove_dir_all(state_dir.join("disk")).unwrap();
    let machine = machine_when_free(&agent, &double()).await;
    let again = machine
        .run(
            Command::shell("cat /root/bootstrapped"),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        text(&again.stdout),
        "ready\n",
        "bootstrap ran on the recreated machine: {}",
        text(&again.stderr)
    );
    machine.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_image_is_refused_before_anything_starts() {
    let agent_dir = new_agent();
    let empty_cache = tempfile::tempdir().unwrap();
    let agent = load(agent_dir.path());
    let mut setup = double();
    setup.places.cache = empty_cache.path().to_owned();
    let error = sandbox::machine_for(&agent, &setup, lookup).unwrap_err();
    assert!(
        matches!(error, SandboxError::Unavailable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("perch image build"), "{error}");
    assert!(!agent_dir.path().join(".perch/sandbox").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_secret_variable_is_named() {
    let agent_dir = new_agent();
    write(
        agent_dir.path(),
        "sandbox.lua",
        &sandbox_lua(&["host.microsandbox.internal"]),
    );
    let agent = load(agent_dir.path());
    let error = sandbox::machine_for(&agent, &double(), |_| None).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("JOURNEY_SOURCE") && message.contains("JOURNEY_TOKEN"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_never_adopts_a_held_machine() {
    let agent_dir = new_agent();
    let agent = load(agent_dir.path());
    let first = sandbox::machine_for(&agent, &double(), lookup).unwrap();
    let error = sandbox::machine_for(&agent, &double(), lookup).unwrap_err();
    assert!(matches!(error, SandboxError::Held { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&std::process::id().to_string()),
        "{error}"
    );
    drop(first);
}

/// Boots a machine, leaves a detached guest process behind, says so, and waits to be killed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of a_killed_perch_leaves_no_guest_process"]
async fn machine_child() {
    let Ok(dir) = std::env::var("PERCH_MACHINE_CHILD_AGENT") else {
        return;
    };
    let agent = load(Path::new(&dir));
    let machine = sandbox::machine_for(&agent, &double(), lookup).unwrap();
    let output = run(
        &machine,
        "setsid sleep 4242.75 </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!(text(&output.stdout), "started\n");
    println!("machine is up");
    std::future::pending::<()>().await;
}

#[test]
fn a_killed_perch_leaves_no_guest_process() {
    use std::io::{BufRead, BufReader};
    let agent_dir = new_agent();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "suite::sandbox::machine_child",
            "--nocapture",
        ])
        .env("PERCH_MACHINE_CHILD_AGENT", agent_dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("machine is up"));
    assert!(up, "the child never booted its machine");
    // The guest's `sleep` may still be between `setsid` and its own exec, when the kernel
    // shows an empty command line for it.
    Poll::within(Duration::from_secs(20)).until("the guest's sleep to be running", || {
        processes_mentioning("4242.75") > 0
    });
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until_no_process_mentions("4242.75");
    wait_until_no_process_mentions(&agent_dir.path().join(".perch").display().to_string());
}

#[tokio::test(flavor = "multi_thread")]
async fn without_kvm_the_microvm_is_refused_at_once_with_the_fix() {
    let agent_dir = new_agent();
    let agent = load(agent_dir.path());
    let missing = tempfile::tempdir().unwrap();
    let mut setup = setup(Backend::Microvm);
    setup.places.kvm = missing.path().join("kvm");
    let error = sandbox::machine_for(&agent, &setup, lookup).unwrap_err();
    assert!(
        matches!(error, SandboxError::Unavailable { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("/kvm") && message.contains("fix:"),
        "{message}"
    );
    assert!(
        !agent_dir.path().join(".perch/sandbox").exists(),
        "nothing was started"
    );
}
