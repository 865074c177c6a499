//! Agent configuration checked at load: each problem named with its file, line and fix.

use super::support::{new_agent, perch, stderr, write};
use perch::agent::{self, AgentDir};

/// Loads the agent in `dir` and returns its problems, rendered.
fn problems(dir: &std::path::Path) -> Vec<String> {
    match agent::load(&AgentDir::open(dir).unwrap()) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(ToString::to_string).collect(),
    }
}

fn problems_with(file: &str, text: &str) -> Vec<String> {
    let dir = new_agent();
    problems_in(dir.path(), file, text)
}

fn problems_in(dir: &std::path::Path, file: &str, text: &str) -> Vec<String> {
    write(dir, file, text);
    problems(dir)
}

fn assert_one(problems: &[String], expected_start: &str) {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].starts_with(expected_start),
        "expected {expected_start:?}, got:\n{}",
        problems[0]
    );
}

#[test]
fn the_starter_agent_has_no_problems() {
    let dir = new_agent();
    assert_eq!(problems(dir.path()), Vec::<String>::new());
}

#[test]
fn a_bad_thinking_level_does_not_hide_a_model_models_yml_lacks() {
    let found = problems_with(
        "agent.lua",
        "agent {\n  model = \"openai/gpt-6\",\n  thinking = \"extreme\",\n}\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|problem| problem.contains("model openai/gpt-6 is not in models.yml")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|problem| problem.contains("unknown thinking level \"extreme\"")),
        "{found:#?}"
    );
}

#[test]
fn lua_syntax_errors_name_their_line() {
    let found = problems_with(
        "agent.lua",
        "agent {\n  model = \"openai/gpt-5-mini\"\n  thinking = \"low\",\n}\n",
    );
    assert_one(&found, "agent.lua:3: ");
}

#[test]
fn perch_info_points_a_key_problem_and_a_missing_comma_at_their_lines() {
    let dir = new_agent();
    let key = [("OPENAI_API_KEY", "sk-test")];
    write(
        dir.path(),
        "agent.lua",
        "-- spend = { tokens_per_dya = 1 }\nagent {\n  model = \"openai/gpt-5-mini\",\n  spend = {\n    \
         tokens_per_day = 1000000,\n    tokens_per_dya = 5,\n  },\n}\n",
    );
    let output = perch(&["info", dir.path().to_str().unwrap()], &key);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains(
            "agent.lua:6: spend.tokens_per_dya: unknown key\n  fix: did you mean tokens_per_day?"
        ),
        "{}",
        stderr(&output)
    );

    write(
        dir.path(),
        "agent.lua",
        "agent {\n  model = \"openai/gpt-5-mini\",\n  spend = {\n    tokens_per_day = 1000000,\n  }\n\n  \
         -- how hard it thinks\n  thinking = \"low\",\n}\n",
    );
    let output = perch(&["info", dir.path().to_str().unwrap()], &key);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains(
            "agent.lua:8: syntax error: '}' expected (to close '{' at line 1) near 'thinking'\n  \
             fix: a comma may be missing after line 5"
        ),
        "{}",
        stderr(&output)
    );
}

#[test]
fn lua_runtime_errors_name_their_line_without_a_traceback() {
    let found = problems_with(
        "sandbox.lua",
        "local cpus = 2\n\nsandbox { cpus = cpus + nil }\n",
    );
    assert_one(&found, "sandbox.lua:3: ");
    assert!(!found[0].contains("traceback"), "{}", found[0]);
}

#[test]
fn unknown_keys_and_wrong_types_name_the_line_of_the_key() {
    let found = problems_with(
        "agent.lua",
        "\n\nagent {\n  model = \"openai/gpt-5-mini\",\n  thinkin = \"low\",\n}\n",
    );
    assert_one(
        &found,
        "agent.lua:5: thinkin: unknown key\n  fix: did you mean thinking?",
    );
    let found = problems_with("sandbox.lua", "sandbox {\n  memory = \"lots\",\n}\n");
    assert_one(
        &found,
        "sandbox.lua:2: memory: expected an integer, found a string",
    );
    let found = problems_with("sandbox.lua", "sandbox {\n\n  workspace_disk = 32,\n}\n");
    assert_one(
        &found,
        "sandbox.lua:3: workspace_disk: 32 is out of range; use a value from 64 to 1048576",
    );
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  workspace_disk = \"4GiB\",\n}\n",
    );
    assert_one(
        &found,
        "sandbox.lua:2: workspace_disk: expected an integer, found a string",
    );
}

#[test]
fn missing_and_repeated_declarations_are_reported() {
    let found = problems_with("agent.lua", "-- nothing here\n");
    assert_one(&found, "agent.lua: agent { ... } is never called");
    let found = problems_with("sandbox.lua", "sandbox {}\nsandbox {}\n");
    assert_one(
        &found,
        "sandbox.lua:2: sandbox is called again (first call on line 1)",
    );
}

#[test]
fn an_unscoped_secret_is_refused_at_load() {
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  allow = { \"api.github.com\" },\n  secrets = {\n    { env = \"GITHUB_TOKEN\", source = env \"GITHUB_TOKEN\" },\n  },\n}\n",
    );
    assert_one(&found, "sandbox.lua:4: secrets[1]: missing hosts");
}

#[test]
fn a_secret_for_a_host_the_guest_cannot_reach_is_refused() {
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  secrets = { { env = \"T\", source = env \"T\", hosts = { \"api.github.com\" } } },\n}\n",
    );
    assert_one(
        &found,
        "sandbox.lua:2: secrets[1].hosts: api.github.com is not in allow",
    );
}

#[test]
fn a_secret_for_the_host_alias_and_another_host_is_refused_with_a_second_secret_suggested() {
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  allow = { \"api.github.com\", \"host.microsandbox.internal\" },\n  secrets = { { env = \"T\", source = env \"T\", hosts = { \"api.github.com\", \"host.microsandbox.internal\" } } },\n}\n",
    );
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(
            "sandbox.lua:3: secrets[1].hosts: host.microsandbox.internal cannot share a secret with other hosts"
        ),
        "{found:#?}"
    );
    assert!(
        found[0].contains(
            "fix: declare a second secret, with its own env, for host.microsandbox.internal alone"
        ),
        "{found:#?}"
    );
    let alone = problems_with(
        "sandbox.lua",
        "sandbox {\n  allow = { \"api.github.com\", \"host.microsandbox.internal\" },\n  secrets = {\n    { env = \"T\", source = env \"T\", hosts = { \"api.github.com\" } },\n    { env = \"L\", source = env \"T\", hosts = { \"host.microsandbox.internal\" } },\n  },\n}\n",
    );
    assert!(alone.is_empty(), "{alone:#?}");
}

#[test]
fn a_secret_for_a_wildcard_host_is_refused() {
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  allow = { \"*.github.io\" },\n  secrets = { { env = \"T\", source = env \"T\", hosts = { \"*.github.io\" } } },\n}\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with(
            "sandbox.lua:3: secrets[1].hosts: *.github.io is a wildcard; a secret is sent only to hosts named exactly"
        ),
        "{found:#?}"
    );
    assert!(found[0].contains("fix: name each host"), "{found:#?}");
    assert!(
        found[1].starts_with("sandbox.lua:3: secrets[1].hosts: hosts is empty"),
        "{found:#?}"
    );
    let found = problems_with(
        "sandbox.lua",
        "sandbox {\n  allow = { \"api.github.com\" },\n  secrets = { { env = \"T\", source = env \"T\", hosts = { \"api.github.com/x\" } } },\n}\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found.iter().any(|problem| problem.starts_with(
            "sandbox.lua:3: secrets[1].hosts[1]: \"api.github.com/x\" is not a host name"
        )),
        "{found:#?}"
    );
}

#[test]
fn a_literal_secret_value_is_refused_and_not_echoed() {
    let value = "ghp_LiteralTokenValue123";
    let found = problems_with(
        "sandbox.lua",
        &format!(
            "sandbox {{\n  allow = {{ \"api.github.com\" }},\n  secrets = {{ {{ env = \"T\", source = \"{value}\", hosts = {{ \"api.github.com\" }} }} }},\n}}\n"
        ),
    );
    assert_one(
        &found,
        "sandbox.lua:3: secrets[1].source: a literal secret value is not allowed here",
    );
    assert!(!found[0].contains(value));
}

#[test]
fn a_literal_api_key_is_refused_and_not_echoed() {
    let dir = new_agent();
    let models = std::fs::read_to_string(dir.path().join("models.yml")).unwrap();
    write(
        dir.path(),
        "models.yml",
        &models.replace("$OPENAI_API_KEY", "sk-proj-LITERALKEY42"),
    );
    let output = perch(&["info", dir.path().to_str().unwrap()], &[]);
    assert!(!output.status.success());
    let shown = stderr(&output);
    assert!(
        shown.contains(
            "error: models.yml:10:13: providers.openai.apiKey: a literal API key is not allowed"
        ),
        "{shown}"
    );
    assert!(!shown.contains("LITERALKEY42"), "{shown}");
}

#[test]
fn yaml_errors_name_line_and_column() {
    let found = problems_with(
        "models.yml",
        "providers:\n  openai:\n    baseUrl: [https://x\n",
    );
    assert_one(&found, "models.yml:4:");
    let found = problems_with(
        "models.yml",
        "providers:\n  openai:\n    baseUrl: https://api.openai.com/v1\n    api: openai-responses\n    models:\n      - id: gpt-5-mini\n        contextWindow: 400000\n        maxTokens: 32000\n        temprature: 0.2\n",
    );
    assert_one(
        &found,
        "models.yml:9:9: providers.openai.models[1].temprature: unknown key",
    );
}

#[test]
fn the_model_must_exist_in_models_yml() {
    let found = problems_with("agent.lua", "agent {\n  model = \"openai/gpt-9\",\n}\n");
    assert_one(
        &found,
        "agent.lua:2: model: model openai/gpt-9 is not in models.yml",
    );
    assert!(
        found[0].contains("use one of openai/gpt-5-mini, anthropic/claude-sonnet-4-5"),
        "{}",
        found[0]
    );
}

#[test]
fn an_endless_loop_in_a_config_file_is_stopped() {
    let found = problems_with(
        "tools/spin.lua",
        "tool(\"spin\", { description = \"x\", run = function() end })\n\nwhile true do end\n",
    );
    assert_one(&found, "tools/spin.lua:3: stopped after");
}

#[test]
fn config_files_cannot_reach_the_host() {
    for (line, code) in [
        "io.open('/etc/passwd')",
        "os.execute('true')",
        "require('os')",
        "dofile('/etc/passwd')",
        "debug.getinfo(1)",
    ]
    .iter()
    .enumerate()
    {
        let text = format!(
            "{}{code}\nagent {{ model = \"openai/gpt-5-mini\" }}\n",
            "\n".repeat(line)
        );
        let found = problems_with("agent.lua", &text);
        assert_one(&found, &format!("agent.lua:{}: ", line + 1));
    }
}

#[test]
fn tool_declarations_are_checked() {
    let dir = new_agent();
    write(
        dir.path(),
        "tools/zz_again.lua",
        "tool(\"workspace_summary\", { description = \"again\", run = function() end })\n",
    );
    let found = problems_in(
        dir.path(),
        "tools/more.lua",
        r#"tool("bash", { description = "mine", run = function() end })

tool("fetch", {
  description = "Fetch a page",
  params = { { name = "url", type = "url" }, { name = "n", type = "integer", default = "five" } },
  run = function() end,
})
"#,
    );
    let expected = [
        "tools/more.lua:1: bash is a built-in tool",
        "tools/more.lua:5: fetch.params[1].type: unknown type \"url\"",
        "tools/more.lua:5: fetch.params[2].default: default \"five\" is not of type integer",
        "tools/zz_again.lua:1: tool workspace_summary is already declared in tools/example.lua",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (problem, start) in found.iter().zip(expected) {
        assert!(
            problem.starts_with(start),
            "{problem} does not start with {start}"
        );
    }
}

#[test]
fn problems_in_several_files_are_reported_together() {
    let dir = new_agent();
    write(
        dir.path(),
        "agent.lua",
        "agent { model = \"openai/gpt-5-mini\", thinking = \"lots\" }\n",
    );
    write(dir.path(), "sandbox.lua", "sandbox { cpus = 0 }\n");
    write(dir.path(), "models.yml", "providers: {}\nextra: 1\n");
    let found = problems(dir.path());
    let files: Vec<&str> = found.iter().map(|p| p.split(':').next().unwrap()).collect();
    assert_eq!(
        files,
        ["agent.lua", "models.yml", "sandbox.lua"],
        "{found:#?}"
    );
}

#[test]
fn a_rootfs_path_is_not_an_image() {
    for image in ["/srv/rootfs", "./rootfs", "disk.qcow2"] {
        let found = problems_with(
            "sandbox.lua",
            &format!("sandbox {{\n  image = {image:?},\n}}\n"),
        );
        assert_one(&found, "sandbox.lua:2: image:");
        assert!(found[0].contains("is a path, not an image"), "{found:?}");
        assert!(
            found[0].contains("fix: use image = \"perch:default\""),
            "{found:?}"
        );
    }
}
