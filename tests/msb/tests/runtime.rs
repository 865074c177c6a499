//! The built `msb` as the crate first meets it, before any launch: the version stamp it reads
//! from the ELF to choose the launch contract, `--version` (perch's doctor runs it before every
//! effect) and `__launch-protocol`. Being an integration test of this package also makes
//! `cargo test --workspace` build the plain `msb` binary, which perch's stand-in tests install.

use microsandbox_runtime::launch::LaunchCapabilities;
use std::process::Command;

const MSB: &str = env!("CARGO_BIN_EXE_msb");

#[test]
fn msb_names_itself_a_stand_in_and_carries_the_crates_elf_stamp() {
    let output = Command::new(MSB).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "msb 0.7.11 (perch test stand-in)\n"
    );
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
fn msb_answers_like_the_real_runtime_beside_the_marker_the_tests_write() {
    // A hard link, not a copy: no descriptor open for writing that a process forked meanwhile
    // could hold ("text file busy").
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let copy = home.path().join("msb");
    std::fs::hard_link(MSB, &copy).unwrap();
    std::fs::write(home.path().join("msb.pose-as-real"), "").unwrap();
    let output = Command::new(&copy).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "msb 0.7.11\n");
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
