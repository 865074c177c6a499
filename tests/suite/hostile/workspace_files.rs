//! A guest writing hostile files into `workspace/`: deep YAML, huge files, FIFOs, symlinks, hard
//! links.

use super::super::support::fake_model::Script;
use super::super::support::procfs::status_kib;
use super::super::support::scenario::{Perch, Scenario, alice};
use super::super::support::status;
use super::super::support::wait::wait_until;
use super::super::support::{new_agent, write};
use super::{exits_within, perch_isolated};
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a command that must return promptly may take on a loaded CI machine.
const PROMPT: Duration = Duration::from_secs(20);

/// How much memory `perch run` may reach while a guest plays these files against it.
const MEMORY_BOUND_KIB: u64 = 256 * 1024;

/// A line only a host file holds, to show that its content never reaches perch's output.
const HOST_MARKER: &str = "host-only-marker-5f1c";

/// SIGTERM, then the exit, which must be clean and come within [`PROMPT`] and half a minute.
fn stop(service: Perch) -> String {
    service.stop_within(PROMPT + Duration::from_secs(30))
}

/// `perch ARGS`, which must end within [`PROMPT`] (a FIFO once hung it for good).
fn perch_promptly(args: &[&str]) -> Output {
    let child = perch_isolated(args).spawn().unwrap();
    exits_within(child, PROMPT, &format!("perch {args:?}"))
}

/// Why HEARTBEAT.yml does not check, from `perch status --json`'s output.
fn reload_error(status: &Output) -> Option<String> {
    match status::read(&String::from_utf8_lossy(&status.stdout)).heartbeats {
        status::Heartbeats::Listed(list) => list.reload_error,
        status::Heartbeats::Unlisted { .. } => None,
    }
}

fn shown(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The peak resident memory of process `pid`, from `/proc/<pid>/status`.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status_kib(&status, "VmHWM:").unwrap()
}

fn heartbeat_file(dir: &Path) -> std::path::PathBuf {
    dir.join("workspace/HEARTBEAT.yml")
}

/// One way a guest can leave `workspace/HEARTBEAT.yml`, and what perch must say about it.
struct Hostile {
    name: &'static str,
    plant: fn(&Path, &Path),
    expected: &'static str,
}

fn remove(file: &Path) {
    match std::fs::remove_file(file) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => panic!("{error}"),
    }
}

fn many_tasks(count: usize) -> String {
    let mut text = String::from("tasks:\n");
    for index in 0..count {
        text.push_str(&format!(
            "  - {{name: t{index}, prompt: p, cron: '0 9 * * Mon-Fri', tz: Pacific/Chatham, active_hours: '10:00-11:00'}}\n"
        ));
    }
    text
}

fn hostile_heartbeat_files() -> Vec<Hostile> {
    vec![
        Hostile {
            name: "a FIFO",
            plant: |file, _| {
                remove(file);
                nix::unistd::mkfifo(file, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml: is not a regular file",
        },
        Hostile {
            name: "a symlink to /dev/zero",
            plant: |file, _| {
                remove(file);
                std::os::unix::fs::symlink("/dev/zero", file).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml: is a symlink",
        },
        Hostile {
            name: "a symlink to a host file",
            plant: |file, host| {
                remove(file);
                std::os::unix::fs::symlink(host.join("host.yml"), file).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml: is a symlink",
        },
        Hostile {
            name: "a hard link to a host file",
            plant: |file, host| {
                remove(file);
                std::fs::hard_link(host.join("host.yml"), file).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml: has 2 hard links",
        },
        Hostile {
            name: "a 300 KiB file",
            plant: |file, _| {
                remove(file);
                let comment = format!("# {}\n", "x".repeat(1021));
                std::fs::write(file, comment.repeat(300)).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml: is 300 KiB, larger than the limit of 256 KiB",
        },
        Hostile {
            name: "2,000 tasks",
            plant: |file, _| {
                remove(file);
                std::fs::write(file, many_tasks(2000)).unwrap();
            },
            expected: "holds 2000 tasks, more than the 100 a heartbeat file may hold",
        },
        Hostile {
            name: "20,000 levels of nesting",
            plant: |file, _| {
                remove(file);
                std::fs::write(file, format!("{}x\n", "- ".repeat(20_000))).unwrap();
            },
            expected: "workspace/HEARTBEAT.yml:1:",
        },
    ]
}

/// A host file the guest cannot read but can point a symlink at (or someone on the host can link
/// into the workspace), holding a schedule of its own.
fn host_file(host: &Path) {
    std::fs::write(
        host.join("host.yml"),
        format!("tasks:\n  - name: {HOST_MARKER}\n    prompt: {HOST_MARKER}\n    every: 1h\n"),
    )
    .unwrap();
}

const GOOD: &str = "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 1h\n";

#[test]
fn hostile_heartbeat_files_leave_the_commands_prompt_and_name_the_file() {
    let host = tempfile::tempdir().unwrap();
    host_file(host.path());
    let agent = new_agent();
    let dir = agent.path().to_str().unwrap();
    let file = heartbeat_file(agent.path());
    for hostile in hostile_heartbeat_files() {
        (hostile.plant)(&file, host.path());
        let says_what_is_wrong = |args: &[&str], what: &str| {
            let output = perch_promptly(args);
            let text = shown(&output);
            let name = hostile.name;
            // perch info reports the file as a problem perch run would have, and exits 1 for
            // it; heartbeat list shows it and succeeds.
            let fails = args[0] == "info";
            assert_eq!(!output.status.success(), fails, "{name}: {what}: {text}");
            assert!(text.contains(hostile.expected), "{name}: {what}: {text}");
            output
        };
        let info = says_what_is_wrong(&["info", dir], "perch info");
        let list = says_what_is_wrong(&["heartbeat", "list", dir], "heartbeat list");
        let status = perch_promptly(&["status", dir, "--json"]);
        let text = shown(&status);
        assert_eq!(
            status.status.code(),
            Some(3),
            "{}: status, not running: {text}",
            hostile.name
        );
        let error = reload_error(&status).unwrap_or_default();
        assert!(
            error.contains(hostile.expected),
            "{}: status: {text}",
            hostile.name
        );
        for output in [&info, &list, &status] {
            assert!(!shown(output).contains(HOST_MARKER), "{}", hostile.name);
        }
    }
}

/// A HEARTBEAT.yml nested 20,000 levels deep, a skill whose frontmatter is longer than 16 KiB
/// (`long`) and one nested 8,000 levels deep (`deep`), in the workspace of the agent `dir`.
fn plant_deep_yaml(dir: &Path) {
    std::fs::write(heartbeat_file(dir), format!("{}x\n", "- ".repeat(20_000))).unwrap();
    for (name, depth) in [("long", 15_000), ("deep", 8_000)] {
        write(
            dir,
            &format!("workspace/skills/{name}/SKILL.md"),
            &format!(
                "---\nname: {name}\ndescription: d\nx:\n  {}y\n---\n",
                "- ".repeat(depth)
            ),
        );
    }
}

#[test]
fn deep_yaml_is_a_problem_naming_the_file_and_the_limit() {
    let agent = new_agent();
    let dir = agent.path().to_str().unwrap();
    plant_deep_yaml(agent.path());
    write(
        agent.path(),
        "workspace/skills/fine/SKILL.md",
        "---\nname: fine\ndescription: A skill that checks out.\n---\nBody.\n",
    );
    let info = perch_promptly(&["info", dir]);
    let text = shown(&info);
    assert!(
        !info.status.success(),
        "the heartbeat file is a problem: {text}"
    );
    assert!(
        text.contains("workspace/HEARTBEAT.yml:1:")
            && text.contains("lists and maps nest more than 32 levels deep"),
        "{text}"
    );
    assert!(
        text.contains("workspace/skills/long/SKILL.md:1: the frontmatter is longer than 16 KiB"),
        "{text}"
    );
    assert!(
        text.contains("workspace/skills/deep/SKILL.md:5:")
            && String::from_utf8_lossy(&info.stdout)
                .matches("nest more than 32 levels deep")
                .count()
                == 2,
        "{text}"
    );
    assert!(text.contains("skills     fine"), "{text}");
}

#[test]
fn perch_run_keeps_answering_through_hostile_workspace_files() {
    let host = tempfile::tempdir().unwrap();
    host_file(host.path());
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let dir = agent.arg();
    let file = heartbeat_file(agent.path());
    plant_deep_yaml(agent.path());
    let service = agent.start();
    let mut answered = 0;
    let mut ask = |text: &str| {
        answered += 1;
        model.push(Script::text(&format!("answer {answered}")));
        agent.send(&alice(), text);
        wait_until(&format!("the answer to {text:?}"), || {
            telegram.sent().len() == answered
        });
    };
    ask("with deep YAML in the workspace");
    ask("and once more");

    let reported = || reload_error(&perch_promptly(&["status", dir, "--json"]));
    for hostile in hostile_heartbeat_files() {
        (hostile.plant)(&file, host.path());
        wait_until(&format!("the service to report {}", hostile.name), || {
            reported().is_some_and(|error| error.contains(hostile.expected))
        });
        ask(&format!("with {} as HEARTBEAT.yml", hostile.name));
        let list = perch_promptly(&["heartbeat", "list", dir]);
        assert!(!shown(&list).contains(HOST_MARKER), "{}", shown(&list));

        // The read fails; the same good file afterwards clears the error.
        remove(&file);
        std::fs::write(&file, GOOD).unwrap();
        wait_until("the error to clear", || reported().is_none());
    }

    let rewriting = Arc::new(AtomicBool::new(true));
    let writer = {
        let rewriting = Arc::clone(&rewriting);
        let variants = [many_tasks(100), many_tasks(99), GOOD.to_owned()];
        std::thread::spawn(move || {
            let mut written = 0;
            while rewriting.load(Ordering::Relaxed) {
                let next = file.with_extension("tmp");
                std::fs::write(&next, &variants[written % variants.len()]).unwrap();
                std::fs::rename(&next, &file).unwrap();
                written += 1;
            }
            written
        })
    };
    ask("while HEARTBEAT.yml is rewritten in a loop");
    ask("still rewritten");
    rewriting.store(false, Ordering::Relaxed);
    let rewrites = writer.join().unwrap();
    assert!(rewrites > 10, "the file was rewritten {rewrites} times");

    let peak = peak_rss_kib(service.id());
    assert!(
        peak < MEMORY_BOUND_KIB,
        "perch run reached {peak} KiB, more than {MEMORY_BOUND_KIB} KiB"
    );
    let stderr = stop(service);
    assert!(!stderr.contains(HOST_MARKER), "{stderr}");
    eprintln!("perch run peaked at {peak} KiB");
}

/// What a guest writes to act on the operator's terminal: clear the screen, set its title, ring,
/// and turn what follows right to left.
const TERMINAL_ATTACK: &str = "\u{1b}[2J\u{1b}]0;owned\u{7}\u{202e}";

/// `text` holds none of [`TERMINAL_ATTACK`]'s characters raw, and shows `shown` (its escaped
/// form in that output) when it is given.
fn escaped_in(what: &str, text: &str, shown: Option<&str>) {
    for raw in ['\u{1b}', '\u{7}', '\u{202e}'] {
        assert!(!text.contains(raw), "{what} prints {raw:?} raw: {text:?}");
    }
    if let Some(shown) = shown {
        assert!(
            text.contains(shown),
            "{what} does not show {shown:?}: {text:?}"
        );
    }
}

/// The escaped form of [`TERMINAL_ATTACK`] in human output, and in JSON.
const SHOWN: &str = "\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\u{202e}";
const SHOWN_IN_JSON: &str = "\\u001b[2J\\u001b]0;owned\\u0007\\u202e";

#[test]
fn a_heartbeat_yml_key_a_skill_directory_and_model_text_reach_the_terminal_escaped() {
    let agent = Scenario::telegram_dm().build();
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: p\n    every: 1h\n    \"\\e[2J\\e]0;owned\\a\\u202Ekey\": 1\n",
    );
    agent.write(
        &format!("workspace/skills/skill{TERMINAL_ATTACK}/SKILL.md"),
        "no frontmatter here\n",
    );
    for args in [
        &["status"][..],
        &["heartbeat", "list"],
        &["info"],
        &["status", "--json"],
        &["heartbeat", "list", "--json"],
        &["info", "--json"],
    ] {
        let output = agent.perch(args);
        let what = format!("perch {}", args.join(" "));
        let json = args.contains(&"--json");
        let said = shown(&output);
        escaped_in(&what, &said, Some(if json { SHOWN_IN_JSON } else { SHOWN }));
        if json {
            let value: serde_json::Value = serde_json::from_slice(&output.stdout)
                .unwrap_or_else(|error| panic!("{what}: {error}: {said}"));
            assert!(
                value.to_string().contains("\\u001b[2J"),
                "{what} decodes to the key as written: {value}"
            );
        }
    }
    let info = shown(&agent.perch(&["info"]));
    assert!(info.contains(&format!("skill{SHOWN}/SKILL.md")), "{info}");
    let info = stdout(&agent.perch(&["info", "--json"]));
    assert!(
        info.contains(&format!("skill{SHOWN_IN_JSON}/SKILL.md")),
        "{info}"
    );

    agent.model.push(Script::text(&format!(
        "line one{TERMINAL_ATTACK}\nline two"
    )));
    let chat = agent.perch_alone_with_input(&["chat"], "hello\n");
    let said = shown(&chat);
    escaped_in("perch chat", &said, Some(SHOWN));
    assert!(
        stdout(&chat).contains(&format!("line one{SHOWN}\nline two")),
        "model text keeps its lines: {said}"
    );
    assert!(
        stderr_text(&chat).contains(&format!("skill{SHOWN}/SKILL.md")),
        "the skill left out is named: {said}"
    );

    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: p\n    every: 1h\n",
    );
    for json in [false, true] {
        agent
            .model
            .push(Script::text(&format!("Message: hi{TERMINAL_ATTACK}")));
        let mut args = vec!["heartbeat", "run", "digest", "--dry-run"];
        if json {
            args.push("--json");
        }
        let output = agent.perch_alone(&args);
        escaped_in(
            &args.join(" "),
            &shown(&output),
            Some(if json { SHOWN_IN_JSON } else { SHOWN }),
        );
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
