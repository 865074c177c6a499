//! Warm exec latency: one machine, already up, running `true` over and over.

use perch::agent::{self, AgentDir};
use perch::doctor::{self, Places};
use perch::sandbox::{self, Backend, Command, MachineSetup};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Target: the double enters an existing set of namespaces, so a warm exec must cost far less
/// than the ~30 ms of creating namespaces afresh.
const DOUBLE_P50_TARGET: Duration = Duration::from_millis(15);

pub async fn warm_exec(smoke: bool) {
    let runs = if smoke { 20 } else { 200 };
    #[cfg(feature = "sandbox-double")]
    measure(
        "namespace double",
        Backend::NamespaceDouble,
        runs,
        Some(DOUBLE_P50_TARGET),
    )
    .await;
    #[cfg(not(feature = "sandbox-double"))]
    println!("warm exec, namespace double: skipped: built without the sandbox-double feature");
    let places = Places::from_environment();
    match doctor::require(&places) {
        Ok(()) => measure("microVM", Backend::Microvm, runs, None).await,
        Err(reason) => {
            let first_line = reason.to_string();
            let first_line = first_line.lines().next().unwrap_or_default().to_owned();
            println!("warm exec, microVM: skipped: {first_line}");
        }
    }
}

async fn measure(label: &str, backend: Backend, runs: usize, target: Option<Duration>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    agent::init(dir.path()).expect("perch init");
    let loaded = agent::load(&AgentDir::open(dir.path()).expect("an agent")).expect("it loads");
    let setup = MachineSetup {
        backend,
        places: Places::from_environment(),
        idle: Duration::from_secs(600),
    };
    let machine = sandbox::machine_for(&loaded, &setup, |_| None).expect("a machine");
    let boot = Instant::now();
    machine
        .run(Command::argv(["true"]), CancellationToken::new())
        .await
        .expect("the first command boots the machine");
    let boot = boot.elapsed();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let output = machine
            .run(Command::argv(["true"]), CancellationToken::new())
            .await
            .expect("true runs");
        samples.push(started.elapsed());
        assert_eq!(output.end.code(), 0);
    }
    machine.stop().await.expect("the machine stops");
    samples.sort();
    let p50 = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    let verdict = target.map_or(String::new(), |target| {
        format!(
            "; target p50 < {target:?}: {}",
            if p50 < target { "met" } else { "MISSED" }
        )
    });
    println!(
        "warm exec, {label}: {runs} runs of `true`: p50 {p50:.2?}, p99 {p99:.2?} (first command with boot {boot:.2?}){verdict}"
    );
}
