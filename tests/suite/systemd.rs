//! `deploy/` under a real systemd: a Debian container booted with systemd as its PID 1
//! ([`Container`]), perch installed in it with `deploy/install.sh` as README says, two agents
//! driven with `systemctl`. On a host that cannot boot the container the test prints
//! `skipped: <reason>`, and fails under `CI=true`, like the stand-in runtime's tests.
//!
//! What the test adds to the shipped unit, all of it in one drop-in it writes
//! (`/etc/systemd/system/perch@.service.d/journey.conf`): `PERCH_ASSUME_KVM=1` (this host's
//! `/dev/kvm` boots no guest; the agents' scripted model never calls a tool, so no VM is asked
//! for), and shorter `WatchdogSec=` and `RestartSec=`, so a hang and a restart take seconds. The
//! `/dev/kvm` the unit allows is a node made inside the container (a bind of the host's would
//! share its inode, and the test's `chgrp` would change the host's), in the group `kvm` the
//! installer makes.

use super::support::container::{Bind, Container, StdoutText as _, unavailable};
use super::support::fake_model::{FakeModel, Gate, Script};
use super::support::fake_telegram::{self, Chat, FakeTelegram, User};
use super::support::wait::Poll;
use perch::host::Places;
use perch_core::config::Api;
use std::path::Path;
use std::time::Duration;

/// The drop-in the journey adds; listed here and in the module's doc.
const DROP_IN: &str = "[Service]\nEnvironment=PERCH_ASSUME_KVM=1\nWatchdogSec=4\nRestartSec=1\n";

/// How long systemd and perch get for each step.
const STEP: Duration = Duration::from_secs(60);

fn poll() -> Poll {
    Poll::within(STEP).every(Duration::from_millis(100))
}

#[allow(clippy::print_stdout)] // The skip reason, printed like a test's own output.
fn skipped(reason: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the systemd journey cannot run here, and CI=true: {reason}"
    );
    println!("skipped: the systemd journey: {reason}");
}

/// One agent in the container: its name, its Telegram fake and its person.
struct Deployed<'a> {
    name: &'a str,
    telegram: &'a FakeTelegram,
}

impl Deployed<'_> {
    fn unit(&self) -> String {
        format!("perch@{}", self.name)
    }

    fn main_pid(&self, container: &Container) -> u32 {
        container
            .sh_ok(&format!(
                "systemctl show -p MainPID --value {}",
                self.unit()
            ))
            .trim()
            .parse()
            .unwrap()
    }

    fn property(&self, container: &Container, name: &str) -> String {
        container
            .sh_ok(&format!("systemctl show -p {name} --value {}", self.unit()))
            .trim()
            .to_owned()
    }

    fn ask(&self, text: &str) {
        let person = User::human(42, "Ada");
        self.telegram
            .push_message(&Chat::private(&person), &person, text);
    }

    fn wait_for_replies(&self, count: usize) {
        poll().until(&format!("{} to send {count} replies", self.name), || {
            self.telegram.sent_count() >= count
        });
    }
}

/// Writes agent `name` into the container's `/var/lib/perch/agents`, its model and channel
/// pointed at the fakes on the host's loopback, and its environment file.
fn add_agent(container: &Container, name: &str, model: &FakeModel, telegram: &FakeTelegram) {
    let dir = format!("/var/lib/perch/agents/{name}");
    container.sh_ok(&format!("runuser -u perch -- perch init {dir} >/dev/null"));
    container.write(
        &format!("{dir}/models.yml"),
        &model.models_yml_with_key("fake", "m1", "FAKE_MODEL_KEY"),
    );
    container.write(
        &format!("{dir}/agent.lua"),
        "agent { model = \"fake/m1\" }\n",
    );
    container.write(
        &format!("{dir}/channels/tg.lua"),
        &format!(
            "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {:?}, dm = \"allow\" }}\n",
            telegram.api_url()
        ),
    );
    container.write(
        &format!("/etc/perch/{name}.env"),
        &format!(
            "TELEGRAM_TOKEN={}\nFAKE_MODEL_KEY=journey-key-{name}\n",
            fake_telegram::TOKEN
        ),
    );
    container.sh_ok(&format!(
        "chown -R perch:perch {dir} && chmod 0600 /etc/perch/{name}.env"
    ));
}

/// The unit's environment, for commands run as the service user by hand.
const UNIT_ENV: &str = "MSB_HOME=/var/lib/perch/msb PERCH_CACHE=/var/lib/perch/cache \
    MSB_PATH=/usr/local/lib/perch/runtime/bin/msb \
    MSB_LIBKRUNFW_PATH=/usr/local/lib/perch/runtime/lib/libkrunfw.so.5.6.1";

/// Copies the image CI built (its archive, records and root tree) into the service's
/// cache, root's and readable by the group `perch` as the installer makes it, and loads it with
/// `perch image load` as the service user, as deploy/README.md says.
fn load_the_image(container: &Container, built: &Path) {
    let record = std::fs::read_to_string(built.join("default.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let key = record["key"].as_str().unwrap();
    let cache = "/var/lib/perch/cache/images";
    container.sh_ok(&format!(
        "install -d -o root -g perch -m 0750 {cache} {cache}/{key} \
         && install -o root -g perch -m 0640 /opt/perch/images/default.json {cache}/ \
         && install -o root -g perch -m 0640 /opt/perch/images/{key}/image.tar /opt/perch/images/{key}/recipe.json {cache}/{key}/ \
         && cp -a /opt/perch/images/{key}/rootfs {cache}/{key}/"
    ));
    let loaded = container.sh_ok(&format!(
        "cd / && runuser -u perch -- env {UNIT_ENV} perch image load 2>&1"
    ));
    assert!(
        loaded.contains("is loaded into /var/lib/perch/msb"),
        "{loaded}"
    );
}

#[test]
fn perch_deployed_under_systemd_starts_answers_restarts_and_drains() {
    if let Some(reason) = unavailable() {
        skipped(&reason);
        return;
    }
    let model = FakeModel::start(Api::OpenAiCompletions);
    let (telegram_a, telegram_b) = (FakeTelegram::start(), FakeTelegram::start());
    let places = Places::from_environment();
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let container = Container::boot(&[
        Bind {
            host: env!("CARGO_BIN_EXE_perch").into(),
            inside: "/opt/perch/bin/perch".into(),
        },
        Bind {
            host: repository.join("deploy"),
            inside: "/opt/perch/deploy".into(),
        },
        Bind {
            host: places.cache.join("images"),
            inside: "/opt/perch/images".into(),
        },
        Bind {
            host: places.msb_home.join("bin"),
            inside: "/opt/msb/bin".into(),
        },
        Bind {
            host: places.msb_home.join("lib"),
            inside: "/opt/msb/lib".into(),
        },
    ]);

    container.sh_ok("mknod -m 0660 /dev/kvm c 10 232");
    let installed = container.sh_ok(
        "/opt/perch/deploy/install.sh --binary /opt/perch/bin/perch --runtime-from /opt/msb --no-image 2>&1",
    );
    assert!(
        installed.contains("installed  /usr/local/bin/perch")
            && installed.contains("installed  /etc/systemd/system/perch@.service"),
        "{installed}"
    );
    container.sh_ok("chgrp kvm /dev/kvm");
    load_the_image(&container, &places.cache.join("images"));
    container.write("/etc/systemd/system/perch@.service.d/journey.conf", DROP_IN);
    add_agent(&container, "a", &model, &telegram_a);
    add_agent(&container, "b", &model, &telegram_b);
    let a = Deployed {
        name: "a",
        telegram: &telegram_a,
    };
    let b = Deployed {
        name: "b",
        telegram: &telegram_b,
    };

    // Start: `systemctl start` of a Type=notify unit returns once perch sent READY=1.
    let started = container.sh("systemctl daemon-reload && systemctl start perch@a perch@b");
    assert!(
        started.status.success(),
        "systemctl start failed:\n{}",
        container
            .sh("journalctl -u perch@a -u perch@b --no-pager -n 60")
            .stdout_text()
    );
    for agent in [&a, &b] {
        assert_eq!(agent.property(&container, "ActiveState"), "active");
        let status = agent.property(&container, "StatusText");
        assert!(status.contains("1 channel"), "{status}");
    }
    let shown = container.sh_ok("systemctl status --no-pager perch@a || true");
    assert!(shown.contains("active (running)"), "{shown}");

    model.push(Script::text("hello from a"));
    a.ask("are you there?");
    a.wait_for_replies(1);
    model.push(Script::text("hello from b"));
    b.ask("and you?");
    b.wait_for_replies(1);

    // journald has perch's lines, at the priority perch gave each.
    let journal = container.sh_ok("journalctl -u perch@a -o json --no-pager");
    let lines: Vec<serde_json::Value> = journal
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let priority_of = |part: &str| {
        lines
            .iter()
            .find(|entry| entry["MESSAGE"].as_str().is_some_and(|m| m.contains(part)))
            .map(|entry| entry["PRIORITY"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("no journal line with {part:?}: {journal}"))
    };
    assert_eq!(priority_of("ready: 1 channel (tg)"), "6");
    assert_eq!(priority_of("tg: answered in lane"), "6");

    // A SIGKILL: Restart=on-failure starts it again, and a message sent meanwhile is answered
    // once.
    let before = a.main_pid(&container);
    container.sh_ok("systemctl kill -s KILL perch@a");
    model.push(Script::text("back again"));
    a.ask("still there?");
    poll().until("perch@a to be restarted", || {
        let pid = a.main_pid(&container);
        pid != 0 && pid != before && a.property(&container, "ActiveState") == "active"
    });
    a.wait_for_replies(2);
    assert_eq!(a.property(&container, "NRestarts"), "1");

    // A hung process: the watchdog kills it and systemd starts it again.
    let hung = a.main_pid(&container);
    container.sh_ok(&format!("kill -STOP {hung}"));
    poll().until("the watchdog to restart perch@a", || {
        let pid = a.main_pid(&container);
        pid != 0 && pid != hung && a.property(&container, "ActiveState") == "active"
    });
    let watchdog = container.sh_ok("journalctl -u perch@a --no-pager");
    assert!(watchdog.contains("Watchdog timeout"), "{watchdog}");

    // Stop drains: a run in progress is finished and delivered before perch exits.
    let gate = Gate::new();
    model.push(Script::held(Script::text("a slow answer"), &gate));
    a.ask("take your time");
    poll().until("the slow run to reach the model", || {
        model.requests().len() >= 4
    });
    std::thread::scope(|scope| {
        let stop = scope.spawn(|| container.sh("systemctl stop perch@a"));
        poll().until("perch@a to be draining", || {
            a.property(&container, "ActiveState") == "deactivating"
        });
        assert_eq!(
            a.telegram.sent_count(),
            2,
            "the slow answer waits on the model"
        );
        gate.open();
        assert!(stop.join().unwrap().status.success());
    });
    assert_eq!(
        a.telegram.sent_count(),
        3,
        "the run in progress was delivered"
    );
    assert_eq!(a.property(&container, "ActiveState"), "inactive");
    assert_eq!(a.property(&container, "Result"), "success");
    assert_eq!(b.property(&container, "ActiveState"), "active");

    // The start-limit breaker: an agent whose configuration perch refuses exits 1 at each start;
    // after StartLimitBurst failures systemd stops restarting it.
    add_agent(&container, "c", &model, &telegram_b);
    container.write(
        "/var/lib/perch/agents/c/agent.lua",
        "agent { modle = \"fake/m1\" }\n",
    );
    assert!(!container.sh("systemctl start perch@c").status.success());
    let c = Deployed {
        name: "c",
        telegram: &telegram_b,
    };
    poll().until("the start limit to stop restarting perch@c", || {
        container
            .sh_ok("journalctl -u perch@c --no-pager")
            .contains("Start request repeated too quickly")
    });
    assert_eq!(c.property(&container, "ActiveState"), "failed");
    let starts = || {
        container
            .sh_ok("journalctl -u perch@c --no-pager")
            .matches("Starting perch@c.service")
            .count()
    };
    let started = starts();
    assert_eq!(started, 5, "StartLimitBurst=5 starts within the interval");
    assert!(!container.sh("systemctl start perch@c").status.success());
    assert_eq!(starts(), started, "past the limit, a start runs nothing");
    let refused = container.sh_ok("journalctl -u perch@c -o json --no-pager");
    let line = refused
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| {
            entry["MESSAGE"]
                .as_str()
                .is_some_and(|message| message.contains("modle: unknown key"))
        })
        .unwrap_or_else(|| panic!("the refusal in the journal: {refused}"));
    assert_eq!(
        line["PRIORITY"], "3",
        "an error at start is an error: {line}"
    );

    record_what_this_host_enforces(&container);
}

/// Prints which resource and device directives this host's cgroups enforce, and the unit's
/// exposure as `systemd-analyze security` rates it: figures deploy/README.md publishes.
#[allow(clippy::print_stdout)] // Figures, printed like a benchmark's.
fn record_what_this_host_enforces(container: &Container) {
    let hierarchy = container.sh_ok("echo $(stat -f -c %T /sys/fs/cgroup): $(ls /sys/fs/cgroup)");
    println!(
        "systemd journey: cgroup hierarchy in the container: {}",
        hierarchy.trim()
    );
    let memory = container.sh("systemd-run --wait --pipe --quiet -p MemoryMax=64M sh -c \
         'p=$(grep -m1 :memory: /proc/self/cgroup | cut -d: -f3); \
          cat /sys/fs/cgroup/memory$p/memory.limit_in_bytes'");
    let limit = memory.stdout_text().trim().to_owned();
    println!(
        "systemd journey: MemoryMax=64M: {} (the unit's memory.limit_in_bytes reads {limit:?})",
        if limit == "67108864" {
            "enforced"
        } else {
            "not enforced"
        }
    );
    let devices = container.sh(
        "systemd-run --wait --quiet -p DevicePolicy=closed sh -c 'exec 3<>/dev/kvm' && echo 'opened: not enforced' || echo 'refused: enforced'",
    );
    println!(
        "systemd journey: DevicePolicy=closed without DeviceAllow=/dev/kvm: /dev/kvm {}",
        devices.stdout_text().trim()
    );
    let security = container.sh("systemd-analyze security --no-pager perch@a.service 2>&1");
    let overall = security
        .stdout_text()
        .lines()
        .rev()
        .find(|line| line.contains("Overall exposure level"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(!overall.is_empty(), "{}", security.stdout_text());
    println!("systemd journey: systemd-analyze security perch@a.service: {overall}");
}
