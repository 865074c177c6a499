//! perch's benchmarks. Run with `cargo bench`; each prints its figures beside the target to
//! beat. Targets are for a release build on the project's 2-core machine; a debug build (as CI
//! runs it, once, as a smoke run) prints slower figures. Words after `--` other than `--smoke`
//! pick the benchmarks to run by their group (`log`, `inbox`, `sandbox`, `lane`, `scale`), as in
//! `cargo bench --bench bench -- scale`; none runs them all.
#![allow(clippy::print_stdout)]

mod inbox;
mod lane;
mod log;
#[path = "../suite/support/procfs.rs"]
mod procfs;
mod sandbox;
mod scale;
#[path = "../suite/standin_home.rs"]
#[allow(dead_code)] // The suite uses all of it; the benchmarks only prepare a fresh home.
mod standin_home;

fn main() {
    let smoke = std::env::args().any(|arg| arg == "--smoke");
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let runs = |group: &str| picked.is_empty() || picked.iter().any(|name| name == group);
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "perch benchmarks ({profile} build{})",
        if smoke { ", smoke run" } else { "" }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if runs("log") {
        runtime.block_on(log::group_commit(smoke));
        runtime.block_on(log::reopen(smoke));
    }
    if runs("inbox") {
        runtime.block_on(inbox::ingest(smoke));
        runtime.block_on(inbox::arrival_to_lane(smoke));
    }
    if runs("sandbox") {
        runtime.block_on(sandbox::warm_exec(smoke));
        runtime.block_on(sandbox::flood_output(smoke));
    }
    if runs("lane") {
        runtime.block_on(lane::host_overhead(smoke));
    }
    if runs("scale") {
        runtime.block_on(scale::conversations(smoke));
    }
}
