//! `deploy/` under a real systemd: a Debian container booted with systemd as its PID 1
//! ([`Container`]), perch installed in it with `deploy/install.sh` as README says, two agents,
//! each its own user, driven with `systemctl`. On a host that cannot boot the container the test prints
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
use super::support::fake_telegram::{self, Chat, FakeTelegram, Pushed, User};
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

    fn ask(&self, text: &str) -> Pushed {
        let person = User::human(42, "Ada");
        self.telegram
            .push_message(&Chat::private(&person), &person, text)
    }

    fn wait_for_replies(&self, count: usize) {
        poll().until(&format!("{} to send {count} replies", self.name), || {
            self.telegram.sent_count() >= count
        });
    }
}

/// Fills in agent `name`, which `install.sh --agent` made: `perch init` as its user, its model
/// and channel pointed at the fakes on the host's loopback, and its environment file.
fn add_agent(container: &Container, name: &str, model: &FakeModel, telegram: &FakeTelegram) {
    let dir = format!("/var/lib/perch/agents/{name}");
    container.sh_ok(&format!(
        "cd / && runuser -u perch-{name} -- perch init {dir} >/dev/null"
    ));
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
        "chown -R perch-{name}:perch {dir} && chmod 0600 /etc/perch/{name}.env"
    ));
}

/// Copies the image CI built (its archive, records and root tree) into the service's cache,
/// root's, where `install.sh --agent` finds it and loads it into each agent's home as the
/// agent's user.
fn copy_the_image(container: &Container, built: &Path) {
    let record = std::fs::read_to_string(built.join("default.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let key = record["key"].as_str().unwrap();
    let cache = "/var/lib/perch/cache/images";
    container.sh_ok(&format!(
        "install -d -m 0755 {cache} {cache}/{key} \
         && install -m 0644 /opt/perch/images/default.json {cache}/ \
         && install -m 0644 /opt/perch/images/{key}/image.tar /opt/perch/images/{key}/recipe.json {cache}/{key}/ \
         && cp -a /opt/perch/images/{key}/rootfs {cache}/{key}/"
    ));
}

/// What each container is given, read-only: CI's perch, `deploy/`, the image CI built, the
/// runtime pair from the wheel, and, for the second container, a backup made in the first.
fn binds(places: &Places, backup: Option<&Path>) -> Vec<Bind> {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut binds = vec![
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
    ];
    if let Some(backup) = backup {
        binds.push(Bind {
            host: backup.to_owned(),
            inside: "/opt/backup/a.tar".into(),
        });
    }
    binds
}

/// `deploy/install.sh` as README says, with CI's binary and runtime and the agents `names`.
fn install(container: &Container, names: &[&str]) -> String {
    let agents: String = names
        .iter()
        .map(|name| format!(" --agent {name}"))
        .collect();
    container.sh_ok(&format!(
        "/opt/perch/deploy/install.sh --binary /opt/perch/bin/perch --runtime-from /opt/msb --no-image{agents} 2>&1"
    ))
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
    let container = Container::boot(&binds(&places, None));

    container.sh_ok("mknod -m 0660 /dev/kvm c 10 232");
    copy_the_image(&container, &places.cache.join("images"));
    let installed = install(&container, &["a", "b"]);
    for step in [
        "installed  /usr/local/bin/perch",
        "installed  /etc/systemd/system/perch@.service",
        "created    user perch-a (home /var/lib/perch/agents/a, no login)",
        "created    /var/lib/perch/agents/b/ (2750 perch-b:perch)",
        "created    /var/lib/perch/msb/b/ (0700 perch-b:perch-b)",
        "loaded     image perch:default in /var/lib/perch/msb/a (as perch-a)",
    ] {
        assert!(installed.contains(step), "{step:?} in:\n{installed}");
    }
    container.sh_ok("chgrp kvm /dev/kvm");
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
    agents_are_kept_apart(&container, &b);

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
    let again = install(&container, &["a", "b", "c"]);
    for step in [
        "unchanged  user perch-a",
        "unchanged  image perch:default in /var/lib/perch/msb/b",
        "created    user perch-c",
    ] {
        assert!(again.contains(step), "{step:?} in:\n{again}");
    }
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

    an_agent_of_the_shared_user_moves_to_its_own(&container);
    record_what_this_host_enforces(&container);
    upgraded_under_traffic(&container, &model, [&a, &b]);
    backed_up_running_and_restored_elsewhere(&container, &places, &model, &a);
}

/// `deploy/upgrade.sh` with a new binary while both agents run and people write to them: each
/// stops (draining), the binary is replaced, each starts again, and every message sent during
/// the upgrade is answered exactly once.
fn upgraded_under_traffic(container: &Container, model: &FakeModel, agents: [&Deployed; 2]) {
    let [a, b] = agents;
    container.sh_ok("systemctl start perch@a");
    // The upgrade moves an agent an older install left to the shared user, as the install does.
    plant_an_agent_of_the_shared_user(container, "older");
    // A binary that differs from the installed one by a byte past its end, and runs the same.
    container.sh_ok("cp /usr/local/bin/perch /root/perch-next && printf '\\0' >> /root/perch-next");
    let before = [a.telegram.sent_count(), b.telegram.sent_count()];
    let mut asked: [Vec<Pushed>; 2] = [Vec::new(), Vec::new()];
    let upgraded = std::thread::scope(|scope| {
        let upgrade = scope.spawn(|| {
            container.sh(
                "/opt/perch/deploy/upgrade.sh --binary /root/perch-next --runtime-from /opt/msb --no-image 2>&1",
            )
        });
        poll().until("the upgrade to stop perch@a", || {
            a.property(container, "ActiveState") != "active"
        });
        for (agent, asked) in [a, b].into_iter().zip(&mut asked) {
            for text in ["one, during the upgrade", "two, during the upgrade"] {
                model.push(Script::text(&format!("heard: {text}")));
                asked.push(agent.ask(text));
            }
        }
        upgrade.join().unwrap()
    });
    let said = upgraded.stdout_text();
    assert!(upgraded.status.success(), "{said}");
    for line in [
        "stopped    perch@a.service perch@b.service",
        "updated    /usr/local/bin/perch",
        "unchanged  user perch-a",
        "started    perch@a.service perch@b.service",
        "upgraded",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    moved_without_the_plants(container, "older", &said);
    for ((agent, before), asked) in [a, b].into_iter().zip(before).zip(&asked) {
        assert_eq!(agent.property(container, "ActiveState"), "active");
        agent.wait_for_replies(before + 2);
        let sent = agent.telegram.sent();
        for message in asked {
            let replies = sent
                .iter()
                .filter(|reply| reply.reply_to == Some(message.message_id))
                .count();
            assert_eq!(
                replies, 1,
                "message {} of {}: {sent:?}",
                message.message_id, agent.name
            );
        }
    }
}

/// `deploy/backup.sh` of the running agent a (stopped for the copy and started again), restored
/// with `deploy/restore.sh` into a second container as its user there, where it answers and
/// holds the conversation it had.
fn backed_up_running_and_restored_elsewhere(
    container: &Container,
    places: &Places,
    model: &FakeModel,
    a: &Deployed,
) {
    let backed_up = container.sh_ok("/opt/perch/deploy/backup.sh a /root/a.tar 2>&1");
    assert!(
        backed_up.contains("started    perch@a (stopped for"),
        "{backed_up}"
    );
    assert_eq!(a.property(container, "ActiveState"), "active");
    assert_eq!(
        container.sh_ok("stat -c '%a %U' /root/a.tar").trim(),
        "600 root"
    );
    let archive = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(archive.path(), container.sh("cat /root/a.tar").stdout).unwrap();
    // One runner per agent: the original stops before its copy starts elsewhere.
    container.sh_ok("systemctl stop perch@a");

    let elsewhere = Container::boot(&binds(places, Some(archive.path())));
    elsewhere.sh_ok("mknod -m 0660 /dev/kvm c 10 232");
    copy_the_image(&elsewhere, &places.cache.join("images"));
    let restored = elsewhere.sh_ok(
        "/opt/perch/deploy/restore.sh /opt/backup/a.tar a --binary /opt/perch/bin/perch --runtime-from /opt/msb --no-image 2>&1",
    );
    assert!(
        restored.contains("restored    a into /var/lib/perch/agents/a (as perch-a)"),
        "{restored}"
    );
    elsewhere.sh_ok("chgrp kvm /dev/kvm");
    elsewhere.write("/etc/systemd/system/perch@.service.d/journey.conf", DROP_IN);
    let owners = elsewhere.sh_ok(
        "find /var/lib/perch/agents/a ! -user perch-a | head -5; stat -c '%a %U:%G' /var/lib/perch/agents/a",
    );
    assert_eq!(
        owners.trim(),
        "2750 perch-a:perch",
        "every file is perch-a's"
    );
    let started = elsewhere.sh("systemctl daemon-reload && systemctl start perch@a");
    assert!(
        started.status.success(),
        "{}",
        elsewhere
            .sh("journalctl -u perch@a --no-pager -n 40")
            .stdout_text()
    );
    let before = a.telegram.sent_count();
    model.push(Script::text("answered from the restored copy"));
    a.ask("where are you now?");
    a.wait_for_replies(before + 1);
    let history =
        elsewhere.sh_ok("cd / && runuser -u perch-a -- perch log -n 50 /var/lib/perch/agents/a");
    for earlier in [
        "hello from a",
        "two, during the upgrade",
        "answered from the restored copy",
    ] {
        assert!(
            history.contains(earlier),
            "{earlier:?} in the restored log:\n{history}"
        );
    }
}

/// Plants an agent `name` of an older install, owned by the shared user perch (created once),
/// with a symbolic link to a root-only file, a hard link to another agent's file and a file of
/// root's in it.
fn plant_an_agent_of_the_shared_user(container: &Container, name: &str) {
    let old = format!("/var/lib/perch/agents/{name}");
    let other = format!("/var/lib/perch/another-agents-file-{name}");
    container.sh_ok(&format!(
        "(getent passwd perch >/dev/null || useradd --system --gid perch --no-create-home perch) \
         && mkdir -p {old}/workspace {old}/.perch \
         && echo 'agent {{}}' > {old}/agent.lua \
         && echo 'b' > {other} \
         && ln -s /etc/shadow {old}/workspace/link \
         && ln {other} {old}/workspace/hard \
         && chown -hR perch:perch {old} \
         && touch {old}/workspace/planted-by-root"
    ));
}

/// What a walk over an agent [`plant_an_agent_of_the_shared_user`] planted must have said and
/// left: the rest given to `perch-NAME:perch`, the three plants listed and unchanged, and what
/// they point at unchanged.
fn moved_without_the_plants(container: &Container, name: &str, said: &str) {
    let old = format!("/var/lib/perch/agents/{name}");
    for line in [
        format!("moving     {old}/ from the user perch to perch-{name}"),
        "skipped  workspace/link: a symbolic link, not followed".to_owned(),
        "skipped  workspace/hard: a file with 2 hard links, which may name a file outside the agent"
            .to_owned(),
        "skipped  workspace/planted-by-root: owned by uid 0, not the old service user".to_owned(),
        format!("moved      {old}/ to perch-{name}:perch"),
    ] {
        assert!(said.contains(&line), "{line:?} in:\n{said}");
    }
    let owner = |path: &str| {
        container
            .sh_ok(&format!("stat -c %U:%G {path}"))
            .trim()
            .to_owned()
    };
    let user = format!("perch-{name}:perch");
    assert_eq!(owner(&format!("{old}/agent.lua")), user);
    assert_eq!(owner(&format!("{old}/.perch")), user);
    assert_eq!(owner("/etc/shadow"), "root:shadow");
    assert_eq!(
        owner(&format!("/var/lib/perch/another-agents-file-{name}")),
        "perch:perch"
    );
    assert_eq!(
        owner(&format!("{old}/workspace/planted-by-root")),
        "root:root"
    );
    assert_eq!(
        container.sh_ok(&format!("stat -c %a {old}")).trim(),
        "2750",
        "the directory is set-group-id for the operators"
    );
}

/// An agent of an older install, owned by the shared user perch, with links and a file of
/// root's planted in it: `install.sh --agent old` gives it to perch-old and skips and reports
/// all three.
fn an_agent_of_the_shared_user_moves_to_its_own(container: &Container) {
    plant_an_agent_of_the_shared_user(container, "old");
    let said = install(container, &["old"]);
    moved_without_the_plants(container, "old", &said);
}

/// Agent a's user reaches nothing of agent b's: not its directory, its microsandbox home, its
/// process's environment or its control socket. An operator in the group perch reaches the
/// control socket; another user does not.
fn agents_are_kept_apart(container: &Container, b: &Deployed) {
    assert_eq!(
        container
            .sh_ok("ps -o user= -p $(systemctl show -p MainPID --value perch@a)")
            .trim(),
        "perch-a"
    );
    let b_pid = b.main_pid(container);
    for (what, command) in [
        ("b's directory", "ls /var/lib/perch/agents/b".to_owned()),
        (
            "b's configuration",
            "cat /var/lib/perch/agents/b/models.yml".to_owned(),
        ),
        (
            "b's journals",
            "ls /var/lib/perch/agents/b/.perch".to_owned(),
        ),
        (
            "b's microsandbox home",
            "ls /var/lib/perch/msb/b".to_owned(),
        ),
        ("b's environment", format!("cat /proc/{b_pid}/environ")),
        ("b's tokens", "cat /etc/perch/b.env".to_owned()),
    ] {
        let tried = container.sh(&format!("cd / && runuser -u perch-a -- {command}"));
        assert!(
            !tried.status.success(),
            "perch-a read {what}: {}",
            tried.stdout_text()
        );
    }
    let status_as = |user: &str| {
        let output = container.sh(&format!(
            "cd / && runuser -u {user} -- perch status --json /var/lib/perch/agents/b"
        ));
        format!(
            "{}{}",
            output.stdout_text(),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let running = |json: &str| {
        serde_json::from_str::<serde_json::Value>(json)
            .is_ok_and(|status| status["running"] == true)
    };
    assert!(
        !running(&status_as("perch-a")),
        "perch-a reached b's control socket"
    );
    container
        .sh_ok("useradd --no-create-home --groups perch alice && useradd --no-create-home mallory");
    assert!(
        running(&status_as("alice")),
        "an operator in the group perch: {}",
        status_as("alice")
    );
    assert!(
        !running(&status_as("mallory")),
        "a user outside the group perch"
    );
    let text = container
        .sh("cd / && runuser -u alice -- perch status /var/lib/perch/agents/b")
        .stdout_text();
    assert!(
        text.contains("inbox not read") && !text.contains("corrupt"),
        "an operator is told the journals are closed to them, not that they are broken:\n{text}"
    );
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
