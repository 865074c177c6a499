//! The built-in tools (`bash`, `read`, `write`, `edit`) through the Toolbox, on the double.

use super::support::new_agent;
use perch::agent::{self, AgentDir};
use perch::host::Places;
use perch::sandbox::{self, Backend, MachineSetup, State};
use perch::tools::ToolOutcome;
use perch::tools::toolbox::Toolbox;
use perch_core::config::Replay;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

struct Harness {
    dir: tempfile::TempDir,
    toolbox: Toolbox,
    machine: sandbox::Machine,
}

fn harness() -> Harness {
    let dir = new_agent();
    let agent = agent::load(&AgentDir::open(dir.path()).unwrap())
        .unwrap_or_else(|problems| panic!("{problems}"));
    let setup = MachineSetup {
        backend: Backend::NamespaceDouble,
        places: Places::from_environment(),
        idle: Duration::from_secs(30),
    };
    let machine = sandbox::machine_for(&agent, &setup, |_| None).unwrap();
    Harness {
        dir,
        toolbox: Toolbox::new(Arc::new(agent), machine.clone()),
        machine,
    }
}

impl Harness {
    async fn call(&self, name: &str, arguments: serde_json::Value) -> ToolOutcome {
        self.toolbox
            .call(name, &arguments, CancellationToken::new())
            .await
    }

    async fn ok(&self, name: &str, arguments: serde_json::Value) -> String {
        let outcome = self.call(name, arguments).await;
        assert!(!outcome.is_error, "{}", outcome.output);
        outcome.output
    }

    async fn error(&self, name: &str, arguments: serde_json::Value) -> String {
        let outcome = self.call(name, arguments).await;
        assert!(outcome.is_error, "{}", outcome.output);
        outcome.output
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_sees_the_built_in_tools_first_and_only_read_is_replayed() {
    let h = harness();
    let names: Vec<String> = h
        .toolbox
        .specs()
        .into_iter()
        .map(|spec| spec.name)
        .collect();
    assert_eq!(
        names,
        ["bash", "read", "write", "edit", "workspace_summary"]
    );
    assert_eq!(h.toolbox.replay("read"), Some(Replay::Safe));
    assert_eq!(h.toolbox.replay("bash"), Some(Replay::Never));
    assert_eq!(h.toolbox.replay("edit"), Some(Replay::Never));
    assert_eq!(h.toolbox.replay("workspace_summary"), Some(Replay::Safe));
    assert_eq!(h.toolbox.replay("nope"), None);
    let read = &h.toolbox.specs()[1];
    assert_eq!(read.parameters["required"], json!(["path"]));
    assert!(read.description.contains("offset="), "{}", read.description);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_tools_and_bad_arguments_are_error_outcomes_and_nothing_runs() {
    let h = harness();
    let unknown = h.error("nope", json!({})).await;
    assert_eq!(
        unknown,
        "there is no tool \"nope\"; the tools are: bash, read, write, edit, workspace_summary"
    );
    let bad = h
        .error("read", json!({ "offset": "3", "extra": true }))
        .await;
    assert!(bad.contains("`path` is required"), "{bad}");
    assert!(bad.contains("`offset` must be integer"), "{bad}");
    assert!(bad.contains("`extra` is not a parameter"), "{bad}");
    assert!(
        h.error("read", json!("notes"))
            .await
            .contains("must be a JSON object")
    );
    let zero = h.error("read", json!({ "path": "a", "offset": 0 })).await;
    assert!(zero.contains("`offset` counts from 1"), "{zero}");
    let long = h
        .error("bash", json!({ "command": "true", "timeout": 0 }))
        .await;
    assert!(long.contains("`timeout` must be from 1 to 3600"), "{long}");
    assert_eq!(
        h.machine.state().await.unwrap().0,
        State::Stopped,
        "nothing ran"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bash_reports_output_exit_codes_and_timeouts() {
    let h = harness();
    assert_eq!(
        h.ok(
            "bash",
            json!({ "command": "pwd; echo $0 >/dev/null; echo err >&2" })
        )
        .await,
        "/workspace\nerr\n"
    );
    assert_eq!(
        h.ok("bash", json!({ "command": "printf out; exit 3" }))
            .await,
        "out\n[exit code 3]",
        "a failing command is a result, not an error"
    );
    assert_eq!(
        h.ok("bash", json!({ "command": "true" })).await,
        "(no output)"
    );
    assert_eq!(
        h.ok(
            "bash",
            json!({ "command": "[[ -n x ]] && cat && echo read-nothing" })
        )
        .await,
        "read-nothing\n",
        "bash syntax works and stdin is empty"
    );
    let started = Instant::now();
    let timed_out = h
        .error(
            "bash",
            json!({ "command": "echo begun; sleep 30", "timeout": 1 }),
        )
        .await;
    assert_eq!(timed_out, "begun\n[timed out after 1 s and killed]");
    assert!(started.elapsed() < Duration::from_secs(10));
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let cancelled = h
        .toolbox
        .call("bash", &json!({ "command": "sleep 30" }), cancel)
        .await;
    assert_eq!(
        cancelled,
        ToolOutcome {
            output: "[cancelled (exit 130)]".into(),
            is_error: true,
            exit_code: None,
        }
    );
    let script = format!("echo {}", "x".repeat(200_000));
    let long = h.ok("bash", json!({ "command": script })).await;
    assert!(
        long.contains("the whole output is in /var/tmp/perch/"),
        "a command longer than argv allows runs, and its long output is shortened"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn read_pages_through_a_file_by_offset_and_limit() {
    let h = harness();
    let ten: String = (1..=10).map(|n| format!("line {n}\n")).collect();
    assert_eq!(
        h.ok("write", json!({ "path": "notes/ten.txt", "content": ten }))
            .await,
        "wrote 71 bytes to notes/ten.txt"
    );
    assert_eq!(
        h.ok(
            "read",
            json!({ "path": "notes/ten.txt", "offset": 3, "limit": 2 })
        )
        .await,
        "[notes/ten.txt: lines 3-4 of 10]\nline 3\nline 4\n[6 more lines: continue with offset=5]"
    );
    assert_eq!(
        h.ok(
            "read",
            json!({ "path": "/workspace/notes/ten.txt", "offset": 9 })
        )
        .await,
        "[/workspace/notes/ten.txt: lines 9-10 of 10]\nline 9\nline 10"
    );
    assert_eq!(
        h.error("read", json!({ "path": "notes/ten.txt", "offset": 11 }))
            .await,
        "offset 11 is past the end of notes/ten.txt, which has 10 lines; use an offset from 1 to 10"
    );
    h.ok("write", json!({ "path": "empty", "content": "" }))
        .await;
    assert_eq!(
        h.ok("read", json!({ "path": "empty" })).await,
        "[empty: empty, 0 lines]"
    );
    h.ok("write", json!({ "path": "no-newline", "content": "a\nb" }))
        .await;
    assert_eq!(
        h.ok("read", json!({ "path": "no-newline" })).await,
        "[no-newline: lines 1-2 of 2]\na\nb"
    );
    assert_eq!(
        h.error("read", json!({ "path": "missing.txt" })).await,
        "missing.txt does not exist in the sandbox"
    );
    assert!(
        h.error("read", json!({ "path": "notes" }))
            .await
            .contains("notes is a directory")
    );
    h.ok(
        "bash",
        json!({ "command": "printf 'ELF\\000\\001' > blob" }),
    )
    .await;
    assert!(
        h.error("read", json!({ "path": "blob" }))
            .await
            .starts_with("blob is a binary file (5 bytes)")
    );
    h.ok(
        "bash",
        json!({ "command": "head -c 5000 /dev/zero | tr '\\000' y > wide; echo >> wide; echo end >> wide" }),
    )
    .await;
    let wide = h.ok("read", json!({ "path": "wide" })).await;
    assert_eq!(
        wide,
        format!(
            "[wide: lines 1-2 of 2]\n{} [... line cut after 2000 of 5000 bytes]\nend",
            "y".repeat(2000)
        )
    );
    let odd = "we'ird $(name) \"x\".txt";
    h.ok("write", json!({ "path": odd, "content": "odd\n" }))
        .await;
    assert_eq!(
        h.ok("read", json!({ "path": odd })).await,
        format!("[{odd}: lines 1-1 of 1]\nodd"),
        "paths are arguments, never part of a script"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_file_goes_through_stdin_and_reads_back_intact_page_by_page() {
    let h = harness();
    let content: String = (0..1600)
        .map(|n| format!("{n:05} {}é\n", "abcdefghij".repeat(9)))
        .collect();
    assert!(content.len() > 128 * 1024);
    let wrote = h
        .ok(
            "write",
            json!({ "path": "deep/er/big.txt", "content": content }),
        )
        .await;
    assert_eq!(
        wrote,
        format!("wrote {} bytes to deep/er/big.txt", content.len())
    );
    assert_eq!(
        std::fs::read_to_string(h.dir.path().join("workspace/deep/er/big.txt")).unwrap(),
        content
    );
    let mut read_back = String::new();
    let mut offset = 1;
    let mut pages = 0;
    loop {
        let page = h
            .ok(
                "read",
                json!({ "path": "deep/er/big.txt", "offset": offset }),
            )
            .await;
        assert!(
            page.chars().count() < 24_000,
            "a page fits the model's limit"
        );
        pages += 1;
        let (header, rest) = page.split_once('\n').unwrap();
        assert!(header.starts_with(&format!("[deep/er/big.txt: lines {offset}-")));
        match rest.rsplit_once("\n[") {
            Some((lines, footer)) if footer.contains("continue with offset=") => {
                read_back.push_str(lines);
                read_back.push('\n');
                offset = footer
                    .rsplit_once("offset=")
                    .unwrap()
                    .1
                    .trim_end_matches(']')
                    .parse()
                    .unwrap();
            }
            _ => {
                read_back.push_str(rest);
                read_back.push('\n');
                break;
            }
        }
    }
    assert!(pages > 1);
    assert_eq!(read_back, content);
}

#[tokio::test(flavor = "multi_thread")]
async fn edit_replaces_exactly_one_occurrence() {
    let h = harness();
    h.ok(
        "write",
        json!({ "path": "todo.md", "content": "- milk\n- eggs\n- milk\n" }),
    )
    .await;
    let twice = h
        .error(
            "edit",
            json!({ "path": "todo.md", "old_text": "milk", "new_text": "oat milk" }),
        )
        .await;
    assert_eq!(
        twice,
        "todo.md was not changed: old_text occurs 2 times (starting on lines 1, 3); include more of the surrounding text so that it occurs exactly once"
    );
    let never = h
        .error(
            "edit",
            json!({ "path": "todo.md", "old_text": "bread", "new_text": "rye" }),
        )
        .await;
    assert!(
        never.starts_with("todo.md was not changed: old_text occurs 0 times"),
        "{never}"
    );
    assert_eq!(
        h.ok(
            "edit",
            json!({ "path": "todo.md", "old_text": "- eggs\n- milk", "new_text": "- eggs\n- oat milk\n- rye" }),
        )
        .await,
        "edited todo.md: replaced the text at line 2"
    );
    assert_eq!(
        std::fs::read_to_string(h.dir.path().join("workspace/todo.md")).unwrap(),
        "- milk\n- eggs\n- oat milk\n- rye\n"
    );
    assert!(
        h.error(
            "edit",
            json!({ "path": "nowhere.md", "old_text": "a", "new_text": "b" }),
        )
        .await
        .contains("nowhere.md does not exist in the sandbox; create it with write")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_made_in_the_guest_never_reaches_host_files() {
    let h = harness();
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("host-secret.txt");
    std::fs::write(&secret, "host-only-5f2c9e\n").unwrap();
    let agent_lua = h.dir.path().join("agent.lua");
    let agent_text = std::fs::read_to_string(&agent_lua).unwrap();
    let link = format!(
        "ln -s {} escape && ln -s ../agent.lua up && ln -s {} agent-link && ls -l escape up",
        secret.display(),
        agent_lua.display()
    );
    h.ok("bash", json!({ "command": link })).await;
    for path in ["escape", "up", "agent-link"] {
        let refused = h.error("read", json!({ "path": path })).await;
        assert_eq!(refused, format!("{path} does not exist in the sandbox"));
        let refused = h
            .error(
                "edit",
                json!({ "path": path, "old_text": "model", "new_text": "x" }),
            )
            .await;
        assert!(!refused.contains("host-only") && !refused.contains("thinking"));
    }
    for path in ["escape", "agent-link"] {
        h.call(
            "write",
            json!({ "path": path, "content": "written in the guest\n" }),
        )
        .await;
    }
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "host-only-5f2c9e\n"
    );
    assert_eq!(std::fs::read_to_string(&agent_lua).unwrap(), agent_text);
}
