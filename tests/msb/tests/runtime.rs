//! The built `msb` as the crate first meets it, before any launch: the version stamp it reads
//! from the ELF to choose the launch contract, `--version` (perch's doctor runs it before every
//! effect) and `__launch-protocol`. Being an integration test of this package also makes
//! `cargo test --workspace` build the plain `msb` binary, which perch's stand-in tests install.

use microsandbox_runtime::launch::LaunchCapabilities;
use std::process::Command;

const MSB: &str = env!("CARGO_BIN_EXE_msb");

#[test]
fn msb_reports_the_crates_version_and_carries_the_elf_stamp() {
    let output = Command::new(MSB).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "msb 0.7.11\n");
    let elf = std::fs::read(MSB).unwrap();
    assert_eq!(
        &elf[..4],
        b"\x7fELF",
        "a script cannot stand in for msb 0.7.11"
    );
    let names = elf.windows(8).any(|window| window == b".msbver\0");
    assert!(names, "no .msbver section name in {MSB}");
}

#[test]
fn the_launch_protocol_is_json_the_crate_reads_and_allows_perchs_deny_response() {
    let output = Command::new(MSB).arg("__launch-protocol").output().unwrap();
    assert!(output.status.success());
    let capabilities: LaunchCapabilities = serde_json::from_slice(&output.stdout).unwrap();
    let json = serde_json::to_value(&capabilities).unwrap();
    assert!(
        json["http_deny_message"] == true || json["http_deny_json"] == true,
        "the crate refuses perch's network config without an HTTP deny capability: {json}"
    );
}

#[test]
fn unknown_arguments_are_refused() {
    let output = Command::new(MSB).arg("no-such-command").output().unwrap();
    assert!(!output.status.success());
}
