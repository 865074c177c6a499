//! `deploy/`: install and uninstall scripts on a staged tree, and the systemd unit's promises.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Runs `deploy/NAME ARGS` with `sh`, DESTDIR set and nothing else from the environment but
/// PATH.
fn script(name: &str, destdir: &Path, args: &[&str]) -> Output {
    Command::new("sh")
        .arg(deploy().join(name))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DESTDIR", destdir)
        .output()
        .expect("sh runs")
}

fn succeeded(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The step lines of a script's output, `  STATE  WHAT`, as (state, what).
fn steps(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|line| line.starts_with("  "))
        .map(|line| {
            let (state, what) = line.trim_start().split_once(' ').unwrap();
            (state.to_owned(), what.trim_start().to_owned())
        })
        .collect()
}

fn has_step(stdout: &str, state: &str, what: &str) -> bool {
    steps(stdout)
        .iter()
        .any(|(s, w)| s == state && (w == what || w.starts_with(&format!("{what} "))))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut a, mut b) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut left, mut right) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let read = a.read(&mut left).unwrap();
        let mut filled = 0;
        while filled < read {
            let more = b.read(&mut right[filled..read]).unwrap();
            if more == 0 {
                return false;
            }
            filled += more;
        }
        if left[..read] != right[..read] {
            return false;
        }
        if read == 0 {
            return b.read(&mut right[..1]).unwrap() == 0;
        }
    }
}

/// What a rewrite, a chmod or a chown changes about a path.
#[derive(Debug, PartialEq)]
struct Stamp {
    mode: u32,
    owner: (u32, u32),
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

/// Every path under `root`, with its stamp.
fn snapshot(root: &Path) -> BTreeMap<String, Stamp> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Stamp>) {
        for item in std::fs::read_dir(dir).unwrap() {
            let path = item.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            out.insert(
                path.strip_prefix(root).unwrap().display().to_string(),
                Stamp {
                    mode: meta.mode(),
                    owner: (meta.uid(), meta.gid()),
                    size: meta.size(),
                    modified: (meta.mtime(), meta.mtime_nsec()),
                    changed: (meta.ctime(), meta.ctime_nsec()),
                },
            );
            if meta.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A systemd unit file as sections of `Key=Value` lines; a key may repeat.
struct Unit {
    sections: BTreeMap<String, Vec<(String, String)>>,
}

impl Unit {
    fn parse(text: &str) -> Unit {
        let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        let mut current = None;
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            assert!(
                !line.ends_with('\\'),
                "line {}: continuation lines are not expected",
                number + 1
            );
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                sections.entry(name.to_owned()).or_default();
                current = Some(name.to_owned());
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("line {}: not Key=Value: {line}", number + 1));
            let section = current
                .clone()
                .unwrap_or_else(|| panic!("line {}: a key before any section", number + 1));
            sections
                .entry(section)
                .or_default()
                .push((key.trim().to_owned(), value.trim().to_owned()));
        }
        Unit { sections }
    }

    fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.sections
            .get(section)
            .unwrap_or_else(|| panic!("no [{section}] section"))
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The one value of `key`; fails if it is missing or set twice.
    fn one(&self, section: &str, key: &str) -> &str {
        match self.all(section, key).as_slice() {
            [value] => value,
            [] => panic!("[{section}] {key}= is missing"),
            values => panic!("[{section}] {key}= is set {} times", values.len()),
        }
    }
}

fn unit() -> Unit {
    Unit::parse(&std::fs::read_to_string(deploy().join("perch@.service")).unwrap())
}

#[test]
fn the_unit_keeps_its_promises() {
    let unit = unit();
    let service = "Service";
    for (key, value) in [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "60"),
        (
            "ExecStart",
            "/usr/local/bin/perch run /var/lib/perch/agents/%i",
        ),
        ("User", "perch-%i"),
        ("Group", "perch-%i"),
        ("EnvironmentFile", "/etc/perch/%i.env"),
        ("Restart", "on-failure"),
        ("RestartSec", "5"),
        ("KillSignal", "SIGTERM"),
        ("KillMode", "mixed"),
        ("DevicePolicy", "closed"),
        ("DeviceAllow", "/dev/kvm rw"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("UMask", "0077"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("LimitNOFILE", "65536"),
    ] {
        assert_eq!(unit.one(service, key), value, "[Service] {key}=");
    }
    let environment = unit.all(service, "Environment");
    for variable in [
        "MSB_HOME=/var/lib/perch/msb/%i",
        "MSB_PATH=/usr/local/lib/perch/runtime/bin/msb",
        "MSB_LIBKRUNFW_PATH=/usr/local/lib/perch/runtime/lib/libkrunfw.so.5.6.1",
        "PERCH_CACHE=/var/lib/perch/cache",
    ] {
        assert!(
            environment.contains(&variable),
            "Environment={variable} is missing"
        );
    }
    let writable: Vec<&str> = unit
        .one(service, "ReadWritePaths")
        .split_whitespace()
        .map(|path| path.trim_start_matches('-'))
        .collect();
    assert_eq!(
        writable,
        ["/var/lib/perch/agents/%i", "/var/lib/perch/msb/%i"]
    );
    let drain = 30;
    let machine_stop_grace = 20;
    let stop: u32 = unit.one(service, "TimeoutStopSec").parse().unwrap();
    assert!(
        stop > drain + machine_stop_grace,
        "TimeoutStopSec={stop} leaves no time after the drain and the VM's stop"
    );
    for absent in ["PrivateDevices", "ProcSubset", "DynamicUser"] {
        assert!(
            unit.all(service, absent).is_empty(),
            "{absent}= would break perch's microVMs or its shared runtime"
        );
    }
    assert_eq!(unit.one("Install", "WantedBy"), "multi-user.target");
}

/// The group the udev rule gives /dev/kvm is the one the unit runs with.
#[test]
fn the_udev_rule_gives_kvm_to_the_units_group() {
    let rule = std::fs::read_to_string(deploy().join("99-perch-kvm.rules")).unwrap();
    let rules: Vec<&str> = rule
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .collect();
    assert_eq!(rules.len(), 1, "{rules:?}");
    let fields: Vec<&str> = rules[0].split(", ").collect();
    assert!(fields.contains(&r#"KERNEL=="kvm""#), "{fields:?}");
    assert!(fields.contains(&r#"MODE="0660""#), "{fields:?}");
    let group = fields
        .iter()
        .find_map(|field| field.strip_prefix("GROUP=\""))
        .and_then(|group| group.strip_suffix('"'))
        .expect("the rule sets GROUP");
    assert_eq!(unit().one("Service", "SupplementaryGroups"), group);
}

#[test]
fn install_reinstall_uninstall_and_purge_a_staged_tree() {
    let binary = Path::new(env!("CARGO_BIN_EXE_perch"));
    let destdir = tempfile::tempdir().unwrap();
    let root = destdir.path();
    let args = [
        "--binary",
        binary.to_str().unwrap(),
        "--no-systemd",
        "--no-runtime",
        "--no-image",
    ];

    let first = succeeded(&script("install.sh", root, &args));
    for (state, what) in [
        ("installed", "/usr/local/bin/perch"),
        ("installed", "/etc/systemd/system/perch@.service"),
        ("installed", "/etc/udev/rules.d/99-perch-kvm.rules"),
        ("installed", "/etc/perch/env.example"),
        ("created", "/etc/perch/"),
        ("created", "/var/lib/perch/agents/"),
        ("skipped", "groups perch and kvm"),
        ("skipped", "runtime"),
        ("skipped", "image perch:default"),
        ("skipped", "systemd and udev reload"),
    ] {
        assert!(
            has_step(&first, state, what),
            "no `{state} {what}` in:\n{first}"
        );
    }
    assert!(!first.contains("nothing changed"), "{first}");

    let installed = |path: &str| root.join(path.trim_start_matches('/'));
    for (path, expected_mode) in [
        ("/usr/local/bin/perch", 0o755),
        ("/etc/systemd/system/perch@.service", 0o644),
        ("/etc/udev/rules.d/99-perch-kvm.rules", 0o644),
        ("/etc/perch", 0o700),
        ("/etc/perch/env.example", 0o600),
        ("/var/lib/perch", 0o755),
        ("/var/lib/perch/agents", 0o755),
        ("/var/lib/perch/msb", 0o755),
        ("/var/lib/perch/cache", 0o755),
    ] {
        assert_eq!(
            mode(&installed(path)),
            expected_mode,
            "{path} has mode {:o}",
            mode(&installed(path))
        );
    }
    for (path, source) in [
        ("/etc/systemd/system/perch@.service", "perch@.service"),
        ("/etc/udev/rules.d/99-perch-kvm.rules", "99-perch-kvm.rules"),
        ("/etc/perch/env.example", "env.example"),
    ] {
        assert_eq!(
            std::fs::read_to_string(installed(path)).unwrap(),
            std::fs::read_to_string(deploy().join(source)).unwrap(),
            "{path}"
        );
    }
    assert!(same_bytes(&installed("/usr/local/bin/perch"), binary));
    let version = Command::new(installed("/usr/local/bin/perch"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());

    let unit = unit();
    for path in unit
        .one("Service", "ReadWritePaths")
        .split_whitespace()
        .filter(|path| !path.starts_with('-'))
    {
        assert!(
            installed(path).is_dir(),
            "{path} is writable in the unit but the installer does not create it"
        );
    }

    let before = snapshot(root);
    let second = succeeded(&script("install.sh", root, &args));
    let states = steps(&second);
    assert!(!states.is_empty());
    for (state, what) in &states {
        assert!(
            state == "unchanged" || state == "skipped",
            "a second install did `{state} {what}`:\n{second}"
        );
    }
    assert!(has_step(&second, "unchanged", "/usr/local/bin/perch"));
    assert!(has_step(&second, "unchanged", "/etc/perch/"));
    assert_eq!(second.lines().last(), Some("nothing changed"), "{second}");
    assert_eq!(snapshot(root), before, "a second install changed the tree");

    let agent = installed("/var/lib/perch/agents/helpdesk");
    std::fs::create_dir_all(agent.join(".perch")).unwrap();
    std::fs::write(agent.join("agent.lua"), "agent { model = \"m/m\" }\n").unwrap();
    let env_file = installed("/etc/perch/helpdesk.env");
    std::fs::write(&env_file, "TELEGRAM_TOKEN=t\n").unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let wants = installed("/etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink(
        "/etc/systemd/system/perch@.service",
        wants.join("perch@helpdesk.service"),
    )
    .unwrap();

    let removed = succeeded(&script("uninstall.sh", root, &["--no-systemd"]));
    for path in [
        "/usr/local/bin/perch",
        "/etc/systemd/system/perch@.service",
        "/etc/udev/rules.d/99-perch-kvm.rules",
        "/etc/perch/env.example",
        "/etc/systemd/system/multi-user.target.wants/perch@helpdesk.service",
    ] {
        assert!(has_step(&removed, "removed", path), "{path}:\n{removed}");
        assert!(
            std::fs::symlink_metadata(installed(path)).is_err(),
            "{path} is still there"
        );
    }
    assert!(has_step(&removed, "kept", "/var/lib/perch/agents"));
    assert!(has_step(&removed, "kept", "/etc/perch"));
    assert!(agent.join("agent.lua").is_file());
    assert!(agent.join(".perch").is_dir());
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap(),
        "TELEGRAM_TOKEN=t\n"
    );

    let again = succeeded(&script("uninstall.sh", root, &["--no-systemd"]));
    for (state, what) in steps(&again) {
        assert!(
            ["absent", "kept", "skipped"].contains(&state.as_str()),
            "a second uninstall did `{state} {what}`:\n{again}"
        );
    }
    assert_eq!(again.lines().last(), Some("nothing changed"), "{again}");

    let purged = succeeded(&script("uninstall.sh", root, &["--purge", "--no-systemd"]));
    assert!(has_step(&purged, "removed", "/var/lib/perch"), "{purged}");
    assert!(has_step(&purged, "removed", "/etc/perch"), "{purged}");
    assert!(!installed("/var/lib/perch").exists());
    assert!(!installed("/etc/perch").exists());
}

/// Without `--binary` the installer builds the binary the published figures measure: the dist
/// profile, `target/dist/perch` (under CARGO_TARGET_DIR). A `cargo` on PATH records how it was
/// run and leaves a small program where the dist build leaves perch.
#[test]
fn install_builds_the_dist_profile_when_given_no_binary() {
    let destdir = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    let ran = tools.path().join("cargo-ran");
    let cargo = tools.path().join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\necho \"$*\" > {}\nmkdir -p \"$CARGO_TARGET_DIR/dist\"\n\
             printf '#!/bin/sh\\necho dist\\n' > \"$CARGO_TARGET_DIR/dist/perch\"\n\
             chmod 0755 \"$CARGO_TARGET_DIR/dist/perch\"\n",
            ran.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::join_paths(std::iter::once(tools.path().to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let output = Command::new("sh")
        .arg(deploy().join("install.sh"))
        .args(["--no-systemd", "--no-runtime", "--no-image"])
        .env_clear()
        .env("PATH", path)
        .env("DESTDIR", destdir.path())
        .env("CARGO_TARGET_DIR", target.path())
        .output()
        .unwrap();
    let stdout = succeeded(&output);
    assert_eq!(
        std::fs::read_to_string(&ran).unwrap(),
        "build --profile dist --locked --quiet\n"
    );
    assert!(
        has_step(&stdout, "building", "cargo build --profile dist --locked"),
        "{stdout}"
    );
    assert!(same_bytes(
        &destdir.path().join("usr/local/bin/perch"),
        &target.path().join("dist/perch")
    ));
}

#[test]
fn the_scripts_explain_themselves_and_refuse_unknown_flags() {
    let root = tempfile::tempdir().unwrap();
    for name in [
        "install.sh",
        "uninstall.sh",
        "install-runtime.sh",
        "upgrade.sh",
        "backup.sh",
        "restore.sh",
    ] {
        let help = succeeded(&script(name, root.path(), &["--help"]));
        assert!(help.starts_with("usage: "), "{name}: {help}");
        let wrong = script(name, root.path(), &["--frobnicate"]);
        assert!(!wrong.status.success(), "{name} took --frobnicate");
        assert!(
            String::from_utf8_lossy(&wrong.stderr).contains("--frobnicate"),
            "{name} did not name the flag it refused"
        );
    }
    assert!(
        std::fs::read_dir(root.path()).unwrap().next().is_none(),
        "--help or a refused flag wrote into DESTDIR"
    );
}

/// The name install-runtime.sh looks for in its wheel directory on this machine.
fn wheel_name() -> String {
    format!(
        "microsandbox-0.7.11-cp310-abi3-manylinux_2_28_{}.whl",
        std::env::consts::ARCH
    )
}

/// A zip named like the microsandbox wheel, in a fresh directory of its own, holding an `msb`
/// that answers `msb 0.7.11` and leaves a mark when it runs, and the library: everything but
/// the pinned SHA-256. Returns the directory, the wheel and the mark.
fn impostor_wheel() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    let bundled = tree.join("microsandbox/_bundled");
    std::fs::create_dir_all(bundled.join("bin")).unwrap();
    std::fs::create_dir_all(bundled.join("lib")).unwrap();
    let marker = dir.path().join("ran");
    std::fs::write(
        bundled.join("bin/msb"),
        format!(
            "#!/bin/sh
touch {}
echo 'msb 0.7.11'
",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::write(bundled.join("lib/libkrunfw.so.5.6.1"), "").unwrap();
    let wheels = dir.path().join("wheels");
    std::fs::create_dir(&wheels).unwrap();
    let wheel = wheels.join(wheel_name());
    let zipped = Command::new("python3")
        .args(["-m", "zipfile", "-c"])
        .arg(&wheel)
        .arg(tree.join("microsandbox"))
        .output()
        .unwrap();
    assert!(zipped.status.success(), "{zipped:?}");
    (dir, wheel, marker)
}

/// Runs install-runtime.sh with ARGS, expects it to fail, and returns what it said.
fn runtime_install_refused(args: &[&Path]) -> String {
    let output = Command::new("sh")
        .arg(deploy().join("install-runtime.sh"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{said}");
    said
}

#[test]
fn install_runtime_unpacks_no_wheel_without_the_pinned_hash() {
    let (dir, wheel, marker) = impostor_wheel();
    let target = dir.path().join("runtime");
    let wheels = wheel.parent().unwrap();
    for said in [
        runtime_install_refused(&[Path::new("--wheels"), wheels, &target]),
        runtime_install_refused(&[Path::new("--wheel"), &wheel, &target]),
    ] {
        assert!(said.contains(wheel.to_str().unwrap()), "{said}");
        assert!(said.contains("has SHA-256"), "{said}");
        assert!(said.contains("nothing was installed"), "{said}");
        assert!(!marker.exists(), "the impostor's msb ran: {said}");
        assert!(!target.exists(), "something was installed: {said}");
    }
}

#[test]
fn install_runtime_as_root_takes_no_wheel_another_user_can_change() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: needs root");
        return;
    }
    let (dir, wheel, marker) = impostor_wheel();
    let target = dir.path().join("runtime");
    let wheels = wheel.parent().unwrap();

    std::fs::set_permissions(wheels, std::fs::Permissions::from_mode(0o777)).unwrap();
    for said in [
        runtime_install_refused(&[Path::new("--wheels"), wheels, &target]),
        runtime_install_refused(&[Path::new("--wheel"), &wheel, &target]),
    ] {
        assert!(
            said.contains(&format!(
                "{} is writable by its group or by others (mode 777)",
                wheels.display()
            )),
            "{said}"
        );
        assert!(said.contains("writable by no one else"), "{said}");
        assert!(!marker.exists(), "the wheel's msb ran: {said}");
        assert!(!target.exists(), "something was installed: {said}");
    }

    std::fs::set_permissions(wheels, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::lchown(&wheel, Some(65_534), Some(65_534)).unwrap();
    for said in [
        runtime_install_refused(&[Path::new("--wheels"), wheels, &target]),
        runtime_install_refused(&[Path::new("--wheel"), &wheel, &target]),
    ] {
        assert!(
            said.contains(&format!("{} is owned by uid 65534", wheel.display())),
            "{said}"
        );
        assert!(!marker.exists(), "the wheel's msb ran: {said}");
        assert!(!target.exists(), "something was installed: {said}");
    }
}

/// perch's test stand-in (tests/msb) carries the real runtime's `.msbver` stamp, but its
/// `--version` says what it is: `perch doctor` and install-runtime.sh refuse it by name. Beside
/// the marker the suite's stand-in home holds, it answers like the real runtime.
#[test]
fn doctor_and_the_runtime_installer_refuse_the_stand_in() {
    let standin = match super::standin_home::built_standin() {
        Ok(standin) => standin,
        Err(reason) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the stand-in is not built, and CI=true: {reason}"
            );
            println!("skipped: {reason}");
            return;
        }
    };
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("bin")).unwrap();
    std::fs::create_dir_all(home.path().join("lib")).unwrap();
    std::fs::copy(&standin, home.path().join("bin/msb")).unwrap();
    std::fs::write(home.path().join("lib/libkrunfw.so.5.6.1"), "").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let doctor = || {
        let output = Command::new(env!("CARGO_BIN_EXE_perch"))
            .arg("doctor")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("MSB_HOME", home.path())
            .env("PERCH_CACHE", cache.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .skip_while(|line| !line.contains(" runtime "))
            .take(2)
            .collect::<Vec<_>>()
            .join("\n")
    };

    let said = doctor();
    assert!(said.starts_with("FAIL  runtime"), "{said}");
    assert!(said.contains("is perch's test stand-in"), "{said}");
    assert!(
        said.contains("fix: install the real runtime pair"),
        "{said}"
    );

    let target = home.path().join("installed");
    let said = runtime_install_refused(&[Path::new("--from"), home.path(), &target]);
    assert!(said.contains("is perch's test stand-in"), "{said}");
    assert!(said.contains("install the real msb 0.7.11"), "{said}");
    assert!(!target.exists(), "the stand-in was installed: {said}");

    std::fs::write(home.path().join("bin/msb.pose-as-real"), "").unwrap();
    let said = doctor();
    assert!(said.starts_with("ok    runtime"), "{said}");
}

/// `systemd-analyze verify` on the unit, with ExecStart pointing at the binary under test
/// (the unit names /usr/local/bin/perch, which this machine need not have). Any warning fails.
#[test]
fn systemd_analyze_verifies_the_unit() {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join("systemd-analyze").is_file()))
        .unwrap_or(false);
    if !found {
        println!("skipped: systemd-analyze not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(deploy().join("perch@.service"))
        .unwrap()
        .replace("/usr/local/bin/perch", env!("CARGO_BIN_EXE_perch"));
    let unit = dir.path().join("perch@.service");
    std::fs::write(&unit, text).unwrap();
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{said}");
    assert_eq!(said, "", "systemd-analyze verify has warnings");
}
