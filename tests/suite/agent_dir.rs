//! `perch init` and the agent directory: what init writes and keeps, the owner lock, perch info.

use super::support::{new_agent, perch, stderr, stdout, tree, write};
use perch::agent::{AgentDir, LockError, OwnerLock};
use std::fs;

const SCAFFOLD: [&str; 16] = [
    ".gitignore",
    "agent.lua",
    "channels/",
    "instructions.md",
    "models.yml",
    "sandbox.lua",
    "tools/",
    "tools/example.lua",
    "workspace/",
    "workspace/AGENTS.md",
    "workspace/HEARTBEAT.yml",
    "workspace/KNOWLEDGE.md",
    "workspace/SOUL.md",
    "workspace/knowledge/",
    "workspace/notes/",
    "workspace/skills/",
];

fn statuses(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            (
                words.next().unwrap().to_owned(),
                words.next().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn init_writes_exactly_the_agent_and_nothing_outside_it() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("agent");
    let output = perch(&["init", dir.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(tree(&dir), SCAFFOLD);
    let beside: Vec<_> = fs::read_dir(parent.path())
        .unwrap()
        .map(|item| item.unwrap().file_name())
        .collect();
    assert_eq!(
        beside,
        ["agent"],
        "nothing is written beside the agent directory"
    );
    assert!(
        statuses(&stdout(&output))
            .iter()
            .all(|(status, _)| status == "created"),
        "{}",
        stdout(&output)
    );
    assert!(
        stdout(&output).ends_with(&format!(
            "\nnext: cd {}; export OPENAI_API_KEY=…; perch channel add telegram; perch doctor; \
             perch run\n",
            dir.display()
        )),
        "init ends with the commands to type next: {}",
        stdout(&output)
    );
    assert_eq!(
        fs::read_to_string(dir.join(".gitignore"))
            .unwrap()
            .lines()
            .last(),
        Some(".perch/")
    );
}

#[test]
fn init_is_idempotent_and_keeps_what_the_user_edited() {
    let dir = new_agent();
    let path = dir.path().to_str().unwrap();
    let again = perch(&["init", path], &[]);
    assert!(again.status.success());
    assert!(
        statuses(&stdout(&again))
            .iter()
            .all(|(status, _)| status == "unchanged"),
        "{}",
        stdout(&again)
    );

    write(
        dir.path(),
        "agent.lua",
        "agent { model = \"anthropic/claude-sonnet-4-5\" }\n",
    );
    fs::remove_file(dir.path().join("workspace/SOUL.md")).unwrap();
    let third = perch(&["init", path], &[]);
    assert!(third.status.success());
    let statuses = statuses(&stdout(&third));
    assert!(
        statuses.contains(&("changed".into(), "agent.lua".into())),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&("created".into(), "workspace/SOUL.md".into())),
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|(status, _)| status == "unchanged")
            .count(),
        statuses.len() - 2
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("agent.lua")).unwrap(),
        "agent { model = \"anthropic/claude-sonnet-4-5\" }\n"
    );
}

#[test]
fn init_never_follows_a_symlink_out_of_the_directory() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("workspace")).unwrap();
    let output = perch(&["init", dir.path().to_str().unwrap()], &[]);
    assert!(!output.status.success());
    assert!(
        stdout(&output).contains("refused    workspace/AGENTS.md"),
        "{}",
        stdout(&output)
    );
    assert!(
        tree(outside.path()).is_empty(),
        "wrote outside: {:?}",
        tree(outside.path())
    );
    assert!(
        dir.path().join("agent.lua").is_file(),
        "the rest is still written"
    );
}

#[test]
fn init_never_reads_a_workspace_file_hard_linked_from_elsewhere() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    fs::write(&secret, "host secret").unwrap();
    fs::create_dir(dir.path().join("workspace")).unwrap();
    fs::hard_link(&secret, dir.path().join("workspace/SOUL.md")).unwrap();
    let output = perch(&["init", dir.path().to_str().unwrap()], &[]);
    assert!(!output.status.success());
    assert!(
        stdout(&output).contains(
            "refused    workspace/SOUL.md  (it has 2 hard links, and perch reads no workspace file \
             linked from elsewhere; replace it with a copy of its own)"
        ),
        "{}",
        stdout(&output)
    );
    assert_eq!(fs::read_to_string(&secret).unwrap(), "host secret");
}

#[test]
fn every_other_command_refuses_a_directory_that_is_not_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "README.md", "some checkout\n");
    let output = perch(&["info", dir.path().to_str().unwrap()], &[]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains(
            "is not a perch agent directory: it has neither agent.lua nor instructions.md"
        )
    );
    assert!(!dir.path().join(".perch").exists());

    write(dir.path(), "instructions.md", "You help.\n");
    let output = perch(&["info", dir.path().to_str().unwrap()], &[]);
    assert!(
        !stderr(&output).contains("not a perch agent directory"),
        "the guard passes"
    );
    assert!(
        stderr(&output).contains("agent.lua: is missing"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn version_and_doctor_need_no_agent_directory() {
    let dir = tempfile::tempdir().unwrap();
    let version = perch(&["--version"], &[]);
    assert!(version.status.success());
    assert_eq!(
        stdout(&version).trim(),
        format!("perch {}", env!("CARGO_PKG_VERSION"))
    );
    let cache = dir.path().join("cache");
    let doctor = perch(
        &["doctor"],
        &[
            ("PERCH_CACHE", cache.to_str().unwrap()),
            ("HOME", dir.path().to_str().unwrap()),
        ],
    );
    let text = stdout(&doctor);
    for check in ["kvm", "cpu", "runtime", "cache"] {
        assert!(
            text.lines()
                .any(|line| line.split_whitespace().nth(1) == Some(check)),
            "{check}: {text}"
        );
    }
    assert!(
        text.contains(&format!("ok    cache     {} is writable", cache.display())),
        "{text}"
    );
    assert!(!stderr(&doctor).contains("not a perch agent directory"));
}

#[test]
fn info_reads_only_and_shows_secrets_by_name() {
    let dir = new_agent();
    write(
        dir.path(),
        "sandbox.lua",
        r#"sandbox {
  allow = { "api.github.com" },
  secrets = { { env = "GITHUB_TOKEN", source = env "HOST_GH_TOKEN", placeholder = "perch-github-token", hosts = { "api.github.com" } } },
}
"#,
    );
    let secret = "ghp_0123456789abcdefSECRETVALUE";
    let env = [
        ("HOST_GH_TOKEN", secret),
        ("OPENAI_API_KEY", "sk-also-secret-987"),
    ];
    let text = perch(&["info", dir.path().to_str().unwrap()], &env);
    assert!(text.status.success(), "{}", stderr(&text));
    let shown = stdout(&text);
    assert!(
        shown.contains("secrets    GITHUB_TOKEN from $HOST_GH_TOKEN, sent only to api.github.com"),
        "{shown}"
    );
    assert!(
        shown.contains("tools      workspace_summary  Summarise the workspace"),
        "{shown}"
    );
    let json = perch(&["info", "--json", dir.path().to_str().unwrap()], &env);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(value["model"], "openai/gpt-5-mini");
    assert_eq!(value["contextWindow"], 400000);
    assert_eq!(value["sandbox"]["secrets"][0]["source"], "HOST_GH_TOKEN");
    assert_eq!(
        value["tools"][0]["parameters"]["properties"]["commits"]["default"],
        5
    );
    for output in [&text, &json] {
        for value in [secret, "sk-also-secret-987"] {
            assert!(!stdout(output).contains(value) && !stderr(output).contains(value));
        }
    }
    assert!(
        !dir.path().join(".perch").exists(),
        "info takes no lock and writes no state"
    );
}

#[test]
fn one_owner_at_a_time() {
    let dir = new_agent();
    let agent = AgentDir::open(dir.path()).unwrap();
    let owner = OwnerLock::acquire(&agent).unwrap();
    assert_eq!(
        fs::read_to_string(owner.path()).unwrap().trim(),
        std::process::id().to_string()
    );
    match OwnerLock::acquire(&agent) {
        Err(
            error @ LockError::Held {
                owner: Some(pid), ..
            },
        ) => {
            assert_eq!(pid, std::process::id());
            assert!(
                error
                    .to_string()
                    .contains(&format!("perch process {pid} owns this agent directory"))
            );
        }
        other => panic!("a second owner was not refused: {other:?}"),
    }
    drop(owner);
    let _again = OwnerLock::acquire(&agent).unwrap();
}

/// An owner lock that another process still holds a moment after its owner let go (a child
/// forked before it did, until it execs) is waited for, not refused.
#[test]
fn an_owner_lock_held_a_moment_longer_is_waited_for() {
    let dir = new_agent();
    let agent = AgentDir::open(dir.path()).unwrap();
    drop(OwnerLock::acquire(&agent).unwrap());
    let holder = super::support::flock::Holder::hold(&agent.owner_lock_file());
    let owner = std::thread::spawn(move || OwnerLock::acquire(&agent).map(|_| ()));
    holder.let_go();
    owner.join().unwrap().unwrap();
}
