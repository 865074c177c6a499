//! The sandbox: warm exec latency (one machine, already up, running `true` over and over) on
//! the namespace double, through perch's real microVM adapter over the stand-in runtime
//! (tests/msb), and in a real microVM; and perch's peak memory while a guest command floods its
//! output.

use perch::agent::{self, AgentDir};
use perch::cli::doctor;
use perch::host::Places;
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
        Places::from_environment(),
        runs,
        Some(DOUBLE_P50_TARGET),
    )
    .await;
    #[cfg(not(feature = "sandbox-double"))]
    println!("warm exec, namespace double: skipped: built without the sandbox-double feature");
    // The adapter, the crate and the agent protocol over a socket, with no VM: perch's own
    // share of a microVM exec.
    match crate::standin_home::prepare(crate::standin_home::Preparation::Fresh).await {
        Ok(places) => {
            measure(
                "real adapter over the stand-in runtime",
                Backend::Microvm,
                places,
                runs,
                None,
            )
            .await;
        }
        Err(reason) => println!("warm exec, stand-in runtime: skipped: {reason}"),
    }
    let places = Places::from_environment();
    match doctor::require(&places) {
        Ok(()) => measure("microVM", Backend::Microvm, places, runs, None).await,
        Err(reason) => {
            let first_line = reason.to_string();
            let first_line = first_line.lines().next().unwrap_or_default().to_owned();
            println!("warm exec, microVM: skipped: {first_line}");
        }
    }
}

async fn measure(
    label: &str,
    backend: Backend,
    places: Places,
    runs: usize,
    target: Option<Duration>,
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    agent::init(dir.path()).expect("perch init");
    let loaded = agent::load(&AgentDir::open(dir.path()).expect("an agent")).expect("it loads");
    let setup = MachineSetup {
        backend,
        places,
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

/// Target: perch's peak resident size grows by at most the two streams' caps (1 MiB each) and
/// a constant while a guest command floods stdout, however long it floods.
const FLOOD_GROWTH_TARGET_BYTES: u64 = 2 * (1 << 20) + (16 << 20);

/// Peak RSS while `yes` floods stdout for 30 s (2 s under `--smoke`), on the double.
pub async fn flood_output(smoke: bool) {
    #[cfg(feature = "sandbox-double")]
    {
        let seconds = if smoke { 2 } else { 30 };
        let dir = tempfile::tempdir().expect("a temporary directory");
        agent::init(dir.path()).expect("perch init");
        let loaded = agent::load(&AgentDir::open(dir.path()).expect("an agent")).expect("it loads");
        let setup = MachineSetup {
            backend: Backend::NamespaceDouble,
            places: Places::from_environment(),
            idle: Duration::from_secs(600),
        };
        let machine = sandbox::machine_for(&loaded, &setup, |_| None).expect("a machine");
        machine
            .run(Command::argv(["true"]), CancellationToken::new())
            .await
            .expect("the machine boots");
        // Writing 5 resets the peak (VmHWM) to the current size, so earlier benchmarks'
        // peaks do not count.
        std::fs::write("/proc/self/clear_refs", "5").expect("the peak resets");
        let before = status_bytes("VmRSS:");
        let flood = Command::argv(["yes"]).timeout(Duration::from_secs(seconds));
        let output = machine
            .run(flood, CancellationToken::new())
            .await
            .expect("yes runs");
        let peak = status_bytes("VmHWM:");
        machine.stop().await.expect("the machine stops");
        let growth = peak.saturating_sub(before);
        let verdict = if growth <= FLOOD_GROWTH_TARGET_BYTES {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "output flood, namespace double: `yes` for {seconds} s sent {} MiB; peak RSS {:.1} MiB, {:.1} MiB over the {:.1} MiB before; target growth <= {} MiB (the caps plus a constant, not the flood): {verdict}",
            output.stdout.total() >> 20,
            mib(peak),
            mib(growth),
            mib(before),
            FLOOD_GROWTH_TARGET_BYTES >> 20,
        );
    }
    #[cfg(not(feature = "sandbox-double"))]
    {
        let _ = smoke;
        println!(
            "output flood, namespace double: skipped: built without the sandbox-double feature"
        );
    }
}

#[cfg(feature = "sandbox-double")]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

#[cfg(feature = "sandbox-double")]
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = crate::procfs::status_kib(&status, field).expect("the field is there");
    kib * 1024
}
