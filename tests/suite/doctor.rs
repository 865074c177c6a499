//! `perch doctor` and `doctor::require` against fake machines: every place doctor looks is a
//! file in a temporary directory, so nothing here depends on the real host.

use super::support::{new_agent, perch, stdout, write};
use perch::doctor::{self, Places, Status};
use perch::sandbox::SandboxError;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A runtime home with `bin/msb` (reporting 0.7.11), `bin/msb-0.7.13` and the library, written
/// once per test process: scripts written and run at once by parallel tests can fail with
/// "text file busy".
fn msb_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doctor-msb");
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::create_dir_all(home.join("lib")).unwrap();
        for (name, version) in [("msb", "0.7.11"), ("msb-0.7.13", "0.7.13")] {
            let partial = home.join(format!("{name}.{}", std::process::id()));
            std::fs::write(&partial, format!("#!/bin/sh\necho 'msb {version}'\n")).unwrap();
            std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&partial, home.join("bin").join(name)).unwrap();
        }
        std::fs::write(home.join("lib/libkrunfw.so.5.6.1"), "").unwrap();
        home
    })
}

/// A machine that passes every check unless a test changes it: a KVM device that opens, an
/// x86_64 CPU with vmx, no kvm_pvm, a runtime pair of the right version.
fn good_machine(dir: &Path) -> Places {
    std::fs::write(dir.join("kvm"), "").unwrap();
    std::fs::write(
        dir.join("cpuinfo"),
        "processor\t: 0\nflags\t\t: fpu vme de pse vmx sse sse2\n",
    )
    .unwrap();
    Places {
        kvm: dir.join("kvm"),
        cpuinfo: dir.join("cpuinfo"),
        pvm_module: dir.join("sys-module-kvm_pvm"),
        arch: "x86_64".into(),
        assume_kvm: false,
        msb_path: None,
        msb_home: msb_home().to_owned(),
        cache: dir.join("cache"),
    }
}

#[test]
fn a_good_machine_passes_require() {
    let dir = tempfile::tempdir().unwrap();
    let places = good_machine(dir.path());
    for check in doctor::machine(&places) {
        assert_eq!(check.status, Status::Ok, "{check}");
    }
    doctor::require(&places).unwrap();
}

#[test]
fn kvm_pvm_fails_by_name_even_with_vmx() {
    let dir = tempfile::tempdir().unwrap();
    let places = good_machine(dir.path());
    std::fs::create_dir(&places.pvm_module).unwrap();
    let check = doctor::virtualization(&places);
    assert_eq!(check.status, Status::Fail);
    assert!(check.detail.contains("kvm_pvm"), "{check}");
    assert!(check.fix.as_deref().unwrap().contains("VT-x"), "{check}");
    let error = doctor::require(&places).unwrap_err();
    let SandboxError::Unavailable { what, fix } = &error else {
        panic!("{error:?}");
    };
    assert!(what.contains("kvm_pvm"), "{what}");
    assert!(fix.contains("PERCH_ASSUME_KVM"), "{fix}");
}

#[test]
fn x86_64_without_vmx_or_svm_fails() {
    let dir = tempfile::tempdir().unwrap();
    let places = good_machine(dir.path());
    std::fs::write(&places.cpuinfo, "flags\t\t: fpu sse sse2 hypervisor\n").unwrap();
    let check = doctor::virtualization(&places);
    assert_eq!(check.status, Status::Fail, "{check}");
    assert!(check.detail.contains("no vmx/svm"), "{check}");
    assert!(doctor::require(&places).is_err());
    std::fs::write(&places.cpuinfo, "flags\t\t: fpu svm\n").unwrap();
    assert_eq!(doctor::virtualization(&places).status, Status::Ok);
}

#[test]
fn aarch64_is_not_failed_for_missing_flags() {
    let dir = tempfile::tempdir().unwrap();
    let mut places = good_machine(dir.path());
    places.arch = "aarch64".into();
    std::fs::write(&places.cpuinfo, "Features\t: fp asimd evtstrm aes\n").unwrap();
    let check = doctor::virtualization(&places);
    assert_eq!(check.status, Status::Ok, "{check}");
    doctor::require(&places).unwrap();
    std::fs::create_dir(&places.pvm_module).unwrap();
    assert_eq!(doctor::virtualization(&places).status, Status::Fail);
}

#[test]
fn assume_kvm_turns_the_virtualization_failure_into_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut places = good_machine(dir.path());
    std::fs::create_dir(&places.pvm_module).unwrap();
    places.assume_kvm = true;
    let check = doctor::virtualization(&places);
    assert_eq!(check.status, Status::Warn, "{check}");
    assert!(check.detail.contains("PERCH_ASSUME_KVM=1"), "{check}");
    assert!(check.detail.contains("kvm_pvm"), "{check}");
    assert!(check.to_string().starts_with("warn  cpu"), "{check}");
    doctor::require(&places).unwrap();
}

#[test]
fn require_reports_the_first_failure_with_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut places = good_machine(dir.path());
    places.kvm = dir.path().join("no-kvm");
    let error = doctor::require(&places).unwrap_err();
    assert!(
        error.to_string().contains("no-kvm cannot be opened"),
        "{error}"
    );
    assert!(
        error.to_string().contains("read-write access to /dev/kvm"),
        "{error}"
    );

    let mut places = good_machine(dir.path());
    places.msb_path = Some(msb_home().join("bin/msb-0.7.13"));
    let error = doctor::require(&places).unwrap_err();
    assert!(
        error.to_string().contains("perch needs msb 0.7.11"),
        "{error}"
    );
    places.msb_path = Some(dir.path().join("missing-msb"));
    assert!(
        doctor::require(&places)
            .unwrap_err()
            .to_string()
            .contains("cannot run")
    );
}

#[test]
fn the_image_check_reads_the_cache_record() {
    let dir = tempfile::tempdir().unwrap();
    let places = good_machine(dir.path());
    let checks = doctor::run(&places, None);
    let image = checks.iter().find(|check| check.name == "image").unwrap();
    assert_eq!(image.status, Status::Fail, "{image}");
    assert!(
        image.detail.contains("perch:default is not built"),
        "{image}"
    );
    assert!(
        image.fix.as_deref().unwrap().contains("perch image build"),
        "{image}"
    );

    let key =
        perch_core::image::Recipe::new(perch_core::image::Flavour::Minimal, "bookworm", "x86_64")
            .unwrap()
            .key();
    std::fs::create_dir_all(places.cache.join(format!("images/{key}/rootfs"))).unwrap();
    std::fs::write(
        places.cache.join("images/default.json"),
        format!(r#"{{"reference":"perch:default","key":"{key}"}}"#),
    )
    .unwrap();
    let image = doctor::image(&places.cache);
    assert_eq!(image.status, Status::Ok, "{image}");
}

#[test]
fn doctor_with_an_agent_names_its_registry_image_without_checking_it() {
    let agent = new_agent();
    let sandbox = std::fs::read_to_string(agent.path().join("sandbox.lua")).unwrap();
    write(
        agent.path(),
        "sandbox.lua",
        &sandbox.replace("\"perch:default\"", "\"docker.io/library/debian:bookworm\""),
    );
    let cache = tempfile::tempdir().unwrap();
    let output = perch(
        &["doctor", agent.path().to_str().unwrap()],
        &[("PERCH_CACHE", cache.path().to_str().unwrap())],
    );
    let text = stdout(&output);
    let line = text
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some("image"))
        .unwrap();
    assert!(line.starts_with("warn"), "{text}");
    assert!(line.contains("docker.io/library/debian:bookworm"), "{text}");
    assert!(line.contains("pulls it at boot"), "{text}");
}

#[test]
fn doctor_with_a_default_image_agent_checks_perch_default() {
    let agent = new_agent();
    let cache = tempfile::tempdir().unwrap();
    let output = perch(
        &["doctor", agent.path().to_str().unwrap()],
        &[("PERCH_CACHE", cache.path().to_str().unwrap())],
    );
    let text = stdout(&output);
    assert!(!output.status.success());
    assert!(
        text.lines()
            .any(|line| line.starts_with("FAIL  image")
                && line.contains("perch:default is not built")),
        "{text}"
    );
}
