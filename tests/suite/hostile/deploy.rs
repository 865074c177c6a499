//! A second local user, or the service user itself, against deploy and the host's limits.
//!
//! Root never executes, follows or writes through a path the service user can change;
//! descriptors and connections are bounded.

use super::super::support::fake_model::Script;
use super::super::support::fake_telegram::User;
use super::super::support::procfs;
use super::super::support::scenario::{Scenario, Watched};
use super::super::support::wait::{Poll, wait_until};
use super::super::support::{perch, stderr, stdout};
use super::{exits_within, on_the_double, perch_isolated};
use perch_core::image::{Flavour, Recipe};
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The user `nobody`, standing in for the service user `perch`.
const NOBODY: u32 = 65_534;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

/// One action of `install.sh --plan`.
#[derive(Debug, Clone)]
struct Action {
    actor: String,
    verb: String,
    target: String,
    owner_user: String,
}

fn parse_plan(text: &str) -> Vec<Action> {
    text.lines()
        .filter_map(|line| line.strip_prefix("plan "))
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields.len(), 4, "a plan line has 4 fields: {line}");
            Action {
                actor: fields[0].to_owned(),
                verb: fields[1].to_owned(),
                target: fields[2].to_owned(),
                owner_user: fields[3].split(':').next().unwrap().to_owned(),
            }
        })
        .collect()
}

/// Whether `user` is a service user: the shared `perch` of older installs or an agent's own
/// `perch-NAME`.
fn service_user(user: &str) -> bool {
    user == "perch" || user.starts_with("perch-")
}

/// Every root action that touches a path under a directory the plan gives to a service user, or
/// that executes, reads or writes a path a service user owns. Creating or renaming a directory
/// of theirs inside one of root's is allowed (they cannot swap the name, only what is under
/// it), and so is `walk`, `perch chown`'s descriptor-relative walk that follows no link.
fn root_actions_on_perchs_paths(plan: &[Action]) -> Vec<String> {
    let owners: BTreeMap<&str, &str> = plan
        .iter()
        .filter(|action| ["mkdir", "write"].contains(&action.verb.as_str()))
        .map(|action| (action.target.as_str(), action.owner_user.as_str()))
        .collect();
    let mut found = Vec::new();
    for action in plan.iter().filter(|action| action.actor == "root") {
        if !action.target.starts_with('/') {
            continue;
        }
        let target = Path::new(&action.target);
        for ancestor in target.ancestors().skip(1) {
            if owners
                .get(ancestor.to_str().unwrap())
                .is_some_and(|owner| service_user(owner))
            {
                found.push(format!(
                    "root {} {} is under {}, which a service user owns",
                    action.verb,
                    action.target,
                    ancestor.display()
                ));
            }
        }
        let own = ["exec", "read", "write"].contains(&action.verb.as_str());
        if own && service_user(&action.owner_user) {
            found.push(format!(
                "root {} {}, which a service user owns",
                action.verb, action.target
            ));
        }
    }
    found
}

#[test]
fn the_install_plan_has_root_touch_nothing_the_service_user_owns() {
    let output = Command::new("sh")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/install.sh"))
        .args([
            "--plan",
            "--binary",
            env!("CARGO_BIN_EXE_perch"),
            "--agent",
            "helpdesk",
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let plan = parse_plan(&text);
    let has = |actor: &str, verb: &str, target: &str| {
        plan.iter()
            .any(|a| a.actor == actor && a.verb == verb && a.target == target)
    };
    for (actor, verb, target) in [
        ("root", "write", "/usr/local/bin/perch"),
        ("root", "mkdir", "/var/lib/perch/msb"),
        ("root", "mkdir", "/var/lib/perch/cache"),
        ("root", "write", "/usr/local/lib/perch/runtime/bin/msb"),
        ("root", "exec", "/usr/local/lib/perch/runtime/bin/msb"),
        ("root", "mkdir", "/var/lib/perch/agents/helpdesk"),
        ("root", "mkdir", "/var/lib/perch/msb/helpdesk"),
        ("perch-helpdesk", "write", "/var/lib/perch/msb/helpdesk"),
    ] {
        assert!(
            has(actor, verb, target),
            "no `{actor} {verb} {target}`:\n{text}"
        );
    }
    assert!(
        !plan.iter().any(|action| action.actor == "root"
            && action.target.starts_with("/var/lib/perch/msb/")
            && action.verb == "write"),
        "the image is loaded into an agent's home by the agent's user alone:\n{text}"
    );
    let found = root_actions_on_perchs_paths(&plan);
    assert!(found.is_empty(), "{found:#?}\n{text}");

    // The check itself: the old layout, where root ran msb from perch's microsandbox home and
    // wrote the cache perch owned, is caught.
    let old = parse_plan(
        "plan root mkdir /var/lib/perch/msb perch:perch\n\
         plan root mkdir /var/lib/perch/cache perch:perch\n\
         plan root exec /var/lib/perch/msb/bin/msb root:root\n\
         plan root write /var/lib/perch/cache/images root:root\n",
    );
    assert_eq!(root_actions_on_perchs_paths(&old).len(), 2);
    let shared_home = parse_plan(
        "plan root mkdir /var/lib/perch/msb/helpdesk perch-helpdesk:perch-helpdesk\n\
         plan root write /var/lib/perch/msb/helpdesk/db root:root\n",
    );
    assert_eq!(root_actions_on_perchs_paths(&shared_home).len(), 1);
}

/// Every path under `root` with its size and modification time, not following links.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            out.insert(path.clone(), (meta.size(), meta.mtime(), meta.mtime_nsec()));
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

/// A build directory for the minimal recipe whose `rootfs` is a link to a directory only root
/// can read and whose `debootstrap.log` is a link to a file of root's; the secret and the
/// victim are returned.
fn hostile_build_dir(cache: &Path, outside: &Path) -> (PathBuf, PathBuf) {
    let secret = outside.join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("shadow"), "root:$6$hash\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    let key = Recipe::new(Flavour::Minimal, "bookworm", std::env::consts::ARCH)
        .unwrap()
        .key();
    let build = cache.join("images").join(key);
    std::fs::create_dir_all(&build).unwrap();
    std::os::unix::fs::symlink(&secret, build.join("rootfs")).unwrap();
    std::os::unix::fs::symlink(&victim, build.join("debootstrap.log")).unwrap();
    (secret, victim)
}

fn image_build(cache: &Path, msb_home: &Path) -> std::process::Output {
    perch(
        &[
            "image",
            "build",
            "--minimal",
            "--suite",
            "bookworm",
            "--mirror",
            "file:/nonexistent",
        ],
        &[
            ("PERCH_CACHE", cache.to_str().unwrap()),
            ("MSB_HOME", msb_home.to_str().unwrap()),
            ("HOME", msb_home.to_str().unwrap()),
        ],
    )
}

#[test]
fn image_build_as_root_follows_no_link_in_a_cache_another_user_owns() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let msb_home = tempfile::tempdir().unwrap();

    // A cache the service user owns: refused before anything is read or written.
    let cache = outside.path().join("perch-cache");
    std::fs::create_dir(&cache).unwrap();
    let (secret, victim) = hostile_build_dir(&cache, outside.path());
    let images = cache.join("images");
    let build = images.read_dir().unwrap().next().unwrap().unwrap().path();
    for path in [
        &cache,
        &images,
        &build,
        &build.join("rootfs"),
        &build.join("debootstrap.log"),
    ] {
        chown(path, NOBODY);
    }
    assert!(secret.join("shadow").exists());
    let before = snapshot(&cache);
    let output = image_build(&cache, msb_home.path());
    let said = stderr(&output);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains("refusing to build the image as root"),
        "{said}"
    );
    assert!(said.contains(cache.to_str().unwrap()), "{said}");
    assert!(said.contains("owned by uid 65534"), "{said}");
    assert_eq!(snapshot(&cache), before, "the build changed the cache");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");

    // A cache of root's that still holds the links (left by an earlier owner): refused too.
    let cache = outside.path().join("root-cache");
    std::fs::create_dir(&cache).unwrap();
    let other = tempfile::tempdir().unwrap();
    let (_, victim) = hostile_build_dir(&cache, other.path());
    let before = snapshot(&cache);
    let output = image_build(&cache, msb_home.path());
    let said = stderr(&output);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("is a symbolic link"), "{said}");
    assert_eq!(snapshot(&cache), before, "the build changed the cache");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
    assert!(
        std::fs::read_dir(msb_home.path()).unwrap().next().is_none(),
        "something was loaded into the microsandbox home"
    );
}

/// A microsandbox home whose `bin/msb` reports 0.7.11 and leaves a mark when it runs.
fn marking_msb_home(owner: u32) -> (tempfile::TempDir, PathBuf) {
    let home = tempfile::tempdir().unwrap();
    let marker = home.path().join("ran");
    std::fs::create_dir_all(home.path().join("bin")).unwrap();
    std::fs::create_dir_all(home.path().join("lib")).unwrap();
    let msb = home.path().join("bin/msb");
    std::fs::write(
        &msb,
        format!(
            "#!/bin/sh\nid -u > {}\necho 'msb 0.7.11'\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&msb, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(home.path().join("lib/libkrunfw.so.5.6.1"), "").unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for path in [home.path().to_owned(), home.path().join("bin"), msb] {
        chown(&path, owner);
    }
    (home, marker)
}

#[test]
fn doctor_as_root_does_not_run_an_msb_the_service_user_can_replace() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let doctor = |home: &Path| {
        let cache = tempfile::tempdir().unwrap();
        perch(
            &["doctor"],
            &[
                ("MSB_HOME", home.to_str().unwrap()),
                ("PERCH_CACHE", cache.path().to_str().unwrap()),
                ("HOME", cache.path().to_str().unwrap()),
            ],
        )
    };
    let (home, marker) = marking_msb_home(NOBODY);
    let output = doctor(home.path());
    let said = stdout(&output);
    assert!(!marker.exists(), "root ran the service user's msb:\n{said}");
    assert!(said.contains("is not run: this is root"), "{said}");
    assert!(said.contains("owned by uid 65534"), "{said}");

    // The same runtime, root's: doctor runs it (so the mark above would have shown a run).
    let (home, marker) = marking_msb_home(0);
    let said = stdout(&doctor(home.path()));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default().trim(),
        "0",
        "{said}"
    );
}

/// `perch run` of a Telegram agent under `prlimit --nofile=SOFT:HARD`, with metrics on a
/// loopback port; its stderr is watched.
fn run_limited(dir: &Path, nofile: &str, metrics: bool) -> Watched {
    let mut command = Command::new("prlimit");
    on_the_double(
        command
            .arg(format!("--nofile={nofile}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_perch"))
            .args(["run", dir.to_str().unwrap()]),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if metrics {
        command.arg("--metrics=127.0.0.1:0");
    }
    Watched::spawn(command)
}

fn metrics_address(perch: &Watched) -> String {
    let mut address = None;
    wait_until("the metrics address", || {
        address = perch
            .lines()
            .iter()
            .find_map(|line| procfs::metrics_address(line));
        address.is_some()
    });
    address.unwrap()
}

/// The status line of `GET /metrics`, or `None` when the connection was closed unanswered.
fn try_scrape(address: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.lines().next().map(str::to_owned)
}

fn limits_line(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap()
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap()
        .to_owned()
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

#[test]
fn idle_metrics_connections_cannot_starve_a_new_conversation() {
    let (soft, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if hard < 4_000 {
        println!("skipped: the test needs 4,000 descriptors of its own (hard limit {hard})");
        return;
    }
    if soft < 4_000 {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
            .unwrap();
    }
    let agent = Scenario::telegram_dm().build();
    let telegram = agent.telegram();
    agent.model.push(Script::text("Hello Bob!"));
    let perch = run_limited(agent.path(), "1024:1024", true);
    let address = metrics_address(&perch);

    let mut idle = Vec::new();
    let mut failed_in_a_row = 0;
    while idle.len() < 3_000 && failed_in_a_row < 50 {
        match std::net::TcpStream::connect_timeout(
            &address.parse().unwrap(),
            Duration::from_millis(200),
        ) {
            Ok(stream) => {
                idle.push(stream);
                failed_in_a_row = 0;
            }
            Err(_) => failed_in_a_row += 1,
        }
    }
    assert!(idle.len() > 1_500, "only {} connections opened", idle.len());
    let pid = perch.id();
    let held = open_descriptors(pid);
    assert!(
        held < 200,
        "perch holds {held} descriptors with idle clients"
    );

    agent.send(&User::human(7, "Bob"), "a new conversation");
    wait_until("the reply to the new conversation", || {
        telegram.sent().iter().any(|sent| sent.chat_id == 7)
    });
    wait_until("metrics to answer again", || {
        try_scrape(&address).as_deref() == Some("HTTP/1.1 200 OK")
    });
    drop(idle);
    let lines = perch.stop();
    assert!(
        lines.iter().any(|line| line.contains("closed unanswered")),
        "{lines:#?}"
    );
}

#[test]
fn the_soft_open_files_limit_is_raised_to_the_hard_limit() {
    let agent = Scenario::telegram_dm().build();
    let perch = run_limited(agent.path(), "1024:4096", true);
    metrics_address(&perch);
    let line = limits_line(perch.id());
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["4096", "4096"], "{line}");
    perch.stop();
}

/// User and system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn the_control_socket_survives_running_out_of_descriptors_without_spinning() {
    let agent = Scenario::telegram_dm().build();
    agent.model.push(Script::text("Hello Carol!"));
    let perch = run_limited(agent.path(), "4096:4096", true);
    metrics_address(&perch);
    let pid = perch.id();
    let socket = agent.path().join(".perch/control.sock");
    // An answered message: every part of the service has started and holds its descriptors.
    agent.send(&User::human(9, "Carol"), "are you up?");
    agent.wait_for_a_reply();

    let limit = open_descriptors(pid) + 2;
    let lowered = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:4096"))
        .status()
        .unwrap();
    assert!(lowered.success());
    let clients: Vec<_> = (0..20)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    let started = cpu_ticks(pid);
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let spent = cpu_ticks(pid) - started;
    let ticks_per_second = 100;
    assert!(
        spent < ticks_per_second / 2,
        "perch used {spent} ticks of CPU in 2 s while out of descriptors"
    );
    drop(clients);
    let raised = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg("--nofile=4096:4096")
        .status()
        .unwrap();
    assert!(raised.success());
    let mut said = String::new();
    let answers = Poll::within(Duration::from_secs(30))
        .every(Duration::from_millis(100))
        .holds(|| {
            said = perch_status(agent.path());
            said.contains("state              running")
        });
    assert!(
        answers,
        "the control socket does not answer again:\n{said}\n{:#?}",
        perch.lines()
    );
    let lines = perch.stop();
    let warnings = lines
        .iter()
        .filter(|line| line.contains("control socket: cannot accept"))
        .count();
    assert!(warnings >= 1, "{lines:#?}");
    assert!(warnings < 5, "one warning per run of failures: {lines:#?}");
}

/// `perch status DIR`'s output; fails the test if it takes more than 20 s.
fn perch_status(dir: &Path) -> String {
    let child = perch_isolated(&["status", dir.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    stdout(&exits_within(
        child,
        Duration::from_secs(20),
        "perch status",
    ))
}

#[test]
fn status_does_not_wait_forever_on_a_service_that_does_not_answer() {
    let dir = super::super::support::new_agent();
    let socket = dir.path().join(".perch/control.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let started = Instant::now();
    let said = perch_status(dir.path());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "perch status took {:?}",
        started.elapsed()
    );
    assert!(said.contains("did not answer within 2 s"), "{said}");
    assert!(said.contains("inbox pending"), "{said}");
}

/// The exploit of finding 4: the service user swaps `bin/msb` in a home it owns, and the next
/// install runs it as root (`msb --version`). install-runtime.sh, as root, refuses a target or a
/// source another user could change, and runs neither.
#[test]
fn install_runtime_as_root_runs_no_msb_the_service_user_can_replace() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/install-runtime.sh");
    let install = |args: &[&Path]| {
        Command::new("sh")
            .arg(&script)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .unwrap()
    };

    let (perchs_home, marker) = marking_msb_home(NOBODY);
    let output = install(&[perchs_home.path()]);
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("owned by uid 65534"), "{said}");
    assert!(!marker.exists(), "root ran the service user's msb: {said}");

    let target = tempfile::tempdir().unwrap();
    let output = install(&[
        Path::new("--from"),
        perchs_home.path(),
        &target.path().join("runtime"),
    ]);
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("owned by uid 65534"), "{said}");
    assert!(!marker.exists(), "root ran the service user's msb: {said}");
    assert!(!target.path().join("runtime").exists());
}
