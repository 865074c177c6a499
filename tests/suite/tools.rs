//! Lua tools on the sandbox (the namespace double here), and `perch exec` and `perch tool`.

use super::support::{new_agent, perch, stderr, stdout, write};
use perch::agent::{self, AgentDir, LoadedAgent};
use perch::host::Places;
use perch::sandbox::{self, Backend, Machine, MachineSetup, State};
use perch::tools::lua_tool::run_tool;
use serde_json::json;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TOOLS: &str = r#"
tool("greet", {
  description = "Greets someone from the sandbox",
  params = {
    { name = "who", type = "string", required = true },
    { name = "times", type = "integer", default = 2 },
    { name = "tone", type = "string", enum = { "warm", "dry" } },
  },
  run = function(args, ctx)
    local out, code = ctx.sh("printf '%s|' " .. ctx.shellescape(args.who) .. " && pwd")
    return { out = out, code = code, times = args.times, workdir = ctx.workdir }
  end,
})

tool("noisy", {
  description = "Writes to both streams and fails",
  run = function(args, ctx)
    local out, code = ctx.sh("echo out; echo err >&2; exit 4")
    return out .. "code " .. code
  end,
})

tool("broken", {
  description = "Indexes nil",
  run = function(args, ctx)
    local missing = nil
    return missing.field
  end,
})

tool("spin", {
  description = "Never returns",
  run = function(args, ctx)
    while true do end
  end,
})

tool("flood", {
  description = "Prints more than the model may see",
  run = function(args, ctx)
    return (ctx.sh("seq 1 20000"))
  end,
})
"#;

fn agent_with_tools() -> (tempfile::TempDir, LoadedAgent) {
    let dir = new_agent();
    write(dir.path(), "tools/more.lua", TOOLS);
    let loaded = agent::load(&AgentDir::open(dir.path()).unwrap())
        .unwrap_or_else(|problems| panic!("{problems}"));
    (dir, loaded)
}

fn machine(agent: &LoadedAgent) -> Machine {
    let setup = MachineSetup {
        backend: Backend::NamespaceDouble,
        places: Places::from_environment(),
        idle: Duration::from_secs(30),
    };
    sandbox::machine_for(agent, &setup, |_| None).unwrap()
}

async fn call(
    agent: &LoadedAgent,
    machine: &Machine,
    name: &str,
    args: serde_json::Value,
) -> Result<String, String> {
    run_tool(agent, machine, name, &args, CancellationToken::new()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_are_checked_before_the_tool_runs() {
    let (_dir, agent) = agent_with_tools();
    let machine = machine(&agent);
    let error = call(
        &agent,
        &machine,
        "greet",
        json!({ "times": "3", "extra": 1, "tone": "loud" }),
    )
    .await
    .unwrap_err();
    assert!(error.contains("`who` is required"), "{error}");
    assert!(error.contains("`times` must be integer"), "{error}");
    assert!(
        error.contains("`tone` must be one of [\"warm\",\"dry\"]"),
        "{error}"
    );
    assert!(error.contains("`extra` is not a parameter"), "{error}");
    assert_eq!(
        machine.state().await.unwrap().0,
        State::Stopped,
        "nothing ran"
    );
    let error = call(&agent, &machine, "nope", json!({})).await.unwrap_err();
    assert!(
        error.contains("there is no tool \"nope\"") && error.contains("greet"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_runs_its_commands_in_the_sandbox_with_defaults_applied() {
    let (_dir, agent) = agent_with_tools();
    let machine = machine(&agent);
    let result = call(&agent, &machine, "greet", json!({ "who": "it's me" }))
        .await
        .unwrap();
    let result: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(
        result,
        json!({ "out": "it's me|/workspace\n", "code": 0, "times": 2, "workdir": "/workspace" })
    );
    let result = call(&agent, &machine, "noisy", json!({})).await.unwrap();
    assert_eq!(result, "out\nerr\ncode 4");
    let starter = call(&agent, &machine, "workspace_summary", json!({}))
        .await
        .unwrap();
    assert!(
        starter.contains("branch: (not a git repository)"),
        "{starter}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_or_endless_tool_is_an_error_with_its_file_and_line() {
    let (_dir, agent) = agent_with_tools();
    let machine = machine(&agent);
    let error = call(&agent, &machine, "broken", json!({}))
        .await
        .unwrap_err();
    assert!(error.starts_with("tools/more.lua:27:"), "{error}");
    assert!(error.contains("attempt to index"), "{error}");
    let error = call(&agent, &machine, "spin", json!({})).await.unwrap_err();
    assert!(error.starts_with("tools/more.lua:34:"), "{error}");
    assert!(error.contains("stopped after"), "{error}");
    let after = call(&agent, &machine, "noisy", json!({})).await.unwrap();
    assert_eq!(
        after, "out\nerr\ncode 4",
        "the state is usable after a runaway call"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn long_tool_output_is_shortened_and_kept_in_the_guest() {
    let (_dir, agent) = agent_with_tools();
    let machine = machine(&agent);
    let result = call(&agent, &machine, "flood", json!({})).await.unwrap();
    assert!(result.chars().count() < 24_200, "{}", result.len());
    assert!(result.starts_with("1\n2\n3\n") && result.ends_with("19999\n20000\n"));
    assert!(
        result.contains("the whole output is in /var/tmp/perch/"),
        "{}",
        &result[11_000..13_000]
    );
}

fn cli_env(cache: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("PERCH_SANDBOX", "namespace-double".into()),
        ("PERCH_CACHE", cache.display().to_string()),
    ]
}

fn run_perch(args: &[&str]) -> std::process::Output {
    let cache = Places::from_environment().cache;
    let env = cli_env(&cache);
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(key, value)| (*key, value.as_str()))
        .collect();
    perch(args, &env)
}

#[test]
fn perch_exec_runs_through_a_login_shell_and_exits_with_its_status() {
    let dir = new_agent();
    let path = dir.path().to_str().unwrap();
    let output = run_perch(&["exec", path, "--", "echo", "$0", ";", "pwd;", "exit", "7"]);
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    assert_eq!(stdout(&output), "/bin/sh\n/workspace\n");
    let output = run_perch(&["exec", path, "--", "no-such-command"]);
    assert_eq!(output.status.code(), Some(127));
    assert!(
        stderr(&output).contains("no-such-command"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn perch_tool_lists_and_runs_tools() {
    let dir = new_agent();
    write(dir.path(), "tools/more.lua", TOOLS);
    let path = dir.path().to_str().unwrap();
    let output = run_perch(&["tool", path]);
    assert!(output.status.success(), "{}", stderr(&output));
    let listing = stdout(&output);
    assert!(
        listing.contains("greet  Greets someone from the sandbox"),
        "{listing}"
    );
    assert!(listing.contains("workspace_summary"), "{listing}");
    let output = run_perch(&["tool", path, "noisy"]);
    assert_eq!(stdout(&output), "out\nerr\ncode 4\n", "{}", stderr(&output));
    let output = run_perch(&["tool", path, "greet", "--args", "{\"times\": 1}"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("`who` is required"),
        "{}",
        stderr(&output)
    );
}
