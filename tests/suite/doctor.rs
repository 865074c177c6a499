//! `perch doctor` and `doctor::require` against fake machines, never the real host.

use super::support::fake_discord::{self, FakeDiscord};
use super::support::fake_model::FakeModel;
use super::support::fake_slack::{self, FakeSlack};
use super::support::fake_telegram::{self, FakeTelegram};
use super::support::{new_agent, perch, stderr, stdout, write};
use perch::agent::AgentDir;
use perch::cli::doctor::{self, Status};
use perch::host::Places;
use perch::sandbox::SandboxError;
use perch_core::config::Api;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A runtime home with `bin/msb` (reporting 0.7.11), `bin/msb-0.7.13`, `bin/msb-standin`
/// (answering like perch's test stand-in, tests/msb) and the library, written
/// once per test process: scripts written and run at once by parallel tests can fail with
/// "text file busy".
fn msb_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doctor-msb");
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::create_dir_all(home.join("lib")).unwrap();
        for (name, version) in [
            ("msb", "0.7.11"),
            ("msb-0.7.13", "0.7.13"),
            ("msb-standin", "0.7.11 (perch test stand-in)"),
        ] {
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
        env_file: None,
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
    assert!(
        fix.contains("VT-x") && !fix.contains("PERCH_ASSUME_KVM"),
        "guests crash under kvm_pvm, so the override is not offered: {fix}"
    );
}

#[test]
fn x86_64_without_vmx_or_svm_fails() {
    let dir = tempfile::tempdir().unwrap();
    let places = good_machine(dir.path());
    std::fs::write(&places.cpuinfo, "flags\t\t: fpu sse sse2 hypervisor\n").unwrap();
    let check = doctor::virtualization(&places);
    assert_eq!(check.status, Status::Fail, "{check}");
    assert!(check.detail.contains("no vmx/svm"), "{check}");
    assert!(
        check.fix.as_deref().unwrap().contains("PERCH_ASSUME_KVM=1"),
        "the flags may be wrong, so the override is offered: {check}"
    );
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
    let missing = doctor::require(&places).unwrap_err().to_string();
    assert!(missing.contains("cannot run"), "{missing}");
    assert!(
        missing.contains("deploy/install-runtime.sh") && !missing.contains(".ci/"),
        "the fix names the runtime's installer, not CI's setup: {missing}"
    );
}

#[test]
fn the_test_stand_in_is_refused_by_name_with_the_real_runtimes_installer() {
    let dir = tempfile::tempdir().unwrap();
    let mut places = good_machine(dir.path());
    places.msb_path = Some(msb_home().join("bin/msb-standin"));
    let check = doctor::runtime(&places);
    assert_eq!(check.status, Status::Fail, "{check}");
    assert!(check.detail.contains("perch's test stand-in"), "{check}");
    assert!(
        check
            .fix
            .as_deref()
            .unwrap()
            .contains("deploy/install-runtime.sh"),
        "{check}"
    );
    let error = doctor::require(&places).unwrap_err().to_string();
    assert!(error.contains("test stand-in"), "{error}");
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

    use perch_core::image::{Blob, BuildRecord, DefaultImage, Flavour, PackedArchive, Recipe};
    let recipe = Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap();
    let key = recipe.key();
    std::fs::create_dir_all(places.cache.join(format!("images/{key}/rootfs"))).unwrap();
    let blob = Blob {
        digest: "sha256:1111".into(),
        size: 1,
    };
    let build = BuildRecord {
        key: key.clone(),
        canonical: recipe.canonical(),
        recipe,
        mirror: None,
        rootfs_built: None,
        archive: Some(PackedArchive {
            reference: "perch:default".into(),
            manifest: blob.clone(),
            config: blob.clone(),
            layer: blob,
            packed: chrono::Utc::now(),
        }),
    };
    std::fs::write(
        places.cache.join(format!("images/{key}/recipe.json")),
        serde_json::to_string(&build).unwrap(),
    )
    .unwrap();
    let default = DefaultImage {
        reference: "perch:default".into(),
        key,
        recipe: Flavour::Minimal,
        suite: "bookworm".into(),
        arch: "amd64".into(),
        recorded: chrono::Utc::now(),
    };
    std::fs::write(
        places.cache.join("images/default.json"),
        serde_json::to_string(&default).unwrap(),
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

const MODEL_KEY: &str = "sk-doctor-good-key-0123456789";
const WRONG_TOKEN: &str = "7357001:AAWrongToken_never-printed-0123456789";
const WRONG_DISCORD_TOKEN: &str = "MTA5OD.wrong.discord-token-never-printed";
const WRONG_KEY: &str = "sk-doctor-wrong-key-never-printed-42";

/// An agent whose model is on `model` (key in `$FAKE_KEY`), with the channels in `channels`
/// (file name, contents).
fn online_agent(model: &FakeModel, channels: &[(&str, String)]) -> tempfile::TempDir {
    let dir = new_agent();
    write(
        dir.path(),
        "models.yml",
        &model.models_yml_with_key("fake", "m1", "FAKE_KEY"),
    );
    write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
    for (file, text) in channels {
        write(dir.path(), &format!("channels/{file}"), text);
    }
    dir
}

fn telegram_channel(api_url: &str) -> String {
    format!(
        "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {api_url:?} }}\n"
    )
}

fn discord_channel(api_url: &str) -> String {
    format!(
        "channel {{ kind = \"discord\", token = env \"DISCORD_TOKEN\", api_url = {api_url:?} }}\n"
    )
}

/// The line of `text` whose check is `name` and whose detail starts with `label`.
fn line<'a>(text: &'a str, name: &str, label: &str) -> &'a str {
    text.lines()
        .find(|line| {
            let mut words = line.split_whitespace();
            words.nth(1) == Some(name) && words.next() == Some(label)
        })
        .unwrap_or_else(|| panic!("no {name} {label} line in:\n{text}"))
}

/// [`line`] for the check `name` and the detail `label`, which must start with `verdict` and
/// say `says`.
fn checked<'a>(text: &'a str, [name, label]: [&str; 2], verdict: &str, says: &str) -> &'a str {
    let found = line(text, name, label);
    assert!(found.starts_with(verdict), "{text}");
    assert!(found.contains(says), "{text}");
    found
}

/// Checks that no one of `secrets` is in doctor's output `text` or its stderr `err`.
fn shows_none_of(secrets: &[&str], text: &str, err: &str) {
    for secret in secrets {
        assert!(
            !text.contains(secret) && !err.contains(secret),
            "{text}{err}"
        );
    }
}

/// The fix printed under the line of `text` that starts with `first`.
fn fix_after<'a>(text: &'a str, first: &str) -> &'a str {
    let mut lines = text.lines().skip_while(|line| !line.starts_with(first));
    lines.next();
    lines
        .next()
        .and_then(|line| line.trim().strip_prefix("fix: "))
        .unwrap_or_else(|| panic!("no fix after {first:?} in:\n{text}"))
}

fn doctor_online(dir: &Path, env: &[(&str, &str)]) -> (std::process::Output, String, String) {
    let cache = tempfile::tempdir().unwrap();
    let mut env = env.to_vec();
    env.push(("PERCH_CACHE", cache.path().to_str().unwrap()));
    let output = perch(&["doctor", "--online", dir.to_str().unwrap()], &env);
    let (out, err) = (stdout(&output), stderr(&output));
    (output, out, err)
}

#[test]
fn online_checks_accept_good_credentials_and_report_refused_ones_without_showing_them() {
    let telegram = FakeTelegram::start();
    let discord = FakeDiscord::start();
    let model = FakeModel::start(Api::OpenAiCompletions);
    model.require_key(MODEL_KEY);
    let agent = online_agent(
        &model,
        &[
            ("tg.lua", telegram_channel(&telegram.api_url())),
            ("dc.lua", discord_channel(&discord.url())),
        ],
    );

    let (_, text, err) = doctor_online(
        agent.path(),
        &[
            ("TELEGRAM_TOKEN", fake_telegram::TOKEN),
            ("DISCORD_TOKEN", fake_discord::TOKEN),
            ("FAKE_KEY", MODEL_KEY),
        ],
    );
    for (check, says) in [
        (
            ["channel", "tg"],
            "getMe: the token is accepted for @perch_test_bot",
        ),
        (["channel", "dc"], "GET /users/@me: the token is accepted"),
        (["model", "fake"], "the key is accepted, 1 models listed"),
    ] {
        checked(&text, check, "ok", says);
    }
    let keys = model.requests();
    let listed = keys
        .iter()
        .find(|request| request.path == "/v1/models")
        .unwrap();
    assert_eq!(
        listed.header("authorization"),
        Some(format!("Bearer {MODEL_KEY}").as_str())
    );
    shows_none_of(
        &[fake_telegram::TOKEN, fake_discord::TOKEN, MODEL_KEY],
        &text,
        &err,
    );

    let (output, text, err) = doctor_online(
        agent.path(),
        &[
            ("TELEGRAM_TOKEN", WRONG_TOKEN),
            ("DISCORD_TOKEN", WRONG_DISCORD_TOKEN),
            ("FAKE_KEY", WRONG_KEY),
        ],
    );
    assert!(!output.status.success());
    let [tg, _, fake] = [
        (["channel", "tg"], "refused: Telegram refused the bot token"),
        (
            ["channel", "dc"],
            "refused: Discord refused the bot token (401)",
        ),
        (
            ["model", "fake"],
            "refused (401): Incorrect API key provided: <redacted>",
        ),
    ]
    .map(|(check, says)| checked(&text, check, "FAIL", says));
    assert!(fix_after(&text, tg).contains("check TELEGRAM_TOKEN, which channels/tg.lua names"));
    assert_eq!(fix_after(&text, fake), "check the key in FAKE_KEY");
    shows_none_of(&[WRONG_TOKEN, WRONG_DISCORD_TOKEN, WRONG_KEY], &text, &err);
}

/// An agent with the Slack channel `sl` pointed at `slack`.
fn slack_agent(slack: &FakeSlack, model: &FakeModel) -> tempfile::TempDir {
    let channel = format!(
        "channel {{ kind = \"slack\", app_token = env \"SLACK_APP_TOKEN\", \
         bot_token = env \"SLACK_BOT_TOKEN\", api_url = {:?} }}\n",
        slack.api_url()
    );
    online_agent(model, &[("sl.lua", channel)])
}

#[test]
fn online_slack_checks_both_tokens_and_never_connects_to_the_socket() {
    let slack = FakeSlack::start();
    let model = FakeModel::start(Api::OpenAiCompletions);
    let agent = slack_agent(&slack, &model);
    let good = [
        ("SLACK_APP_TOKEN", fake_slack::APP_TOKEN),
        ("SLACK_BOT_TOKEN", fake_slack::BOT_TOKEN),
        ("FAKE_KEY", MODEL_KEY),
    ];
    let (_, text, err) = doctor_online(agent.path(), &good);
    checked(
        &text,
        ["channel", "sl"],
        "ok",
        "auth.test: SLACK_BOT_TOKEN accepts the bot token for @perch",
    );
    assert!(
        text.contains("apps.connections.open: SLACK_APP_TOKEN is accepted for Socket Mode"),
        "{text}"
    );
    assert_eq!(slack.calls_of("apps.connections.open"), 1);
    assert_eq!(
        slack.connections_opened(),
        0,
        "doctor connected to the socket"
    );
    shows_none_of(&[fake_slack::APP_TOKEN, fake_slack::BOT_TOKEN], &text, &err);

    let wrong_bot = "xoxb-1-2-wrongBotTokenNeverPrinted";
    let (output, text, err) = doctor_online(
        agent.path(),
        &[good[0], ("SLACK_BOT_TOKEN", wrong_bot), good[2]],
    );
    assert!(!output.status.success());
    checked(
        &text,
        ["channel", "sl"],
        "FAIL",
        "refused: auth.test: Slack refused the bot token (invalid_auth): set it to the app's \
         xoxb-… token (OAuth & Permissions, Bot User OAuth Token) (the token in SLACK_BOT_TOKEN)",
    );
    shows_none_of(&[wrong_bot, fake_slack::APP_TOKEN], &text, &err);

    let (output, text, err) = doctor_online(
        agent.path(),
        &[("SLACK_APP_TOKEN", fake_slack::BOT_TOKEN), good[1], good[2]],
    );
    assert!(!output.status.success());
    checked(
        &text,
        ["channel", "sl"],
        "FAIL",
        "refused: apps.connections.open: the socket needs an app-level token (xapp-…), not a \
         bot or user token (not_allowed_token_type) (the token in SLACK_APP_TOKEN)",
    );
    shows_none_of(&[fake_slack::BOT_TOKEN], &text, &err);

    slack.fail_next(
        "auth.test",
        fake_slack::Failure::Error("missing_scope".into()),
    );
    let (_, text, _) = doctor_online(agent.path(), &good);
    checked(&text, ["channel", "sl"], "FAIL", "(missing_scope)");
    assert_eq!(slack.connections_opened(), 0);
}

#[test]
fn online_slack_names_the_bot_scopes_the_token_lacks_and_how_to_add_them() {
    let slack = FakeSlack::start();
    let model = FakeModel::start(Api::OpenAiCompletions);
    let agent = slack_agent(&slack, &model);
    let env = [
        ("SLACK_APP_TOKEN", fake_slack::APP_TOKEN),
        ("SLACK_BOT_TOKEN", fake_slack::BOT_TOKEN),
        ("FAKE_KEY", MODEL_KEY),
    ];
    let (_, text, _) = doctor_online(agent.path(), &env);
    checked(
        &text,
        ["channel", "sl"],
        "ok",
        "it holds every bot scope of the app manifest",
    );

    slack.remove_scopes(&["mpim:history", "files:write"]);
    let (_, text, err) = doctor_online(agent.path(), &env);
    let found = checked(
        &text,
        ["channel", "sl"],
        "FAIL",
        "incomplete: auth.test: the bot token lacks mpim:history (group DMs) and files:write \
         (uploading a reply's files) (the token in SLACK_BOT_TOKEN)",
    );
    assert_eq!(
        fix_after(&text, found),
        "add mpim:history and files:write under OAuth & Permissions > Bot Token Scopes at \
         https://api.slack.com/apps, then reinstall the app to the workspace (the token gets \
         them only then)"
    );
    assert!(
        !found.contains("app_mentions:read") && !found.contains("chat:write"),
        "only the missing scopes are named: {found}"
    );
    shows_none_of(&[fake_slack::APP_TOKEN, fake_slack::BOT_TOKEN], &text, &err);

    slack.list_no_scopes();
    let (_, text, _) = doctor_online(agent.path(), &env);
    let found = checked(
        &text,
        ["channel", "sl"],
        "ok",
        "could not see the token's scopes",
    );
    assert!(!found.contains("lacks"), "{found}");
    assert_eq!(slack.connections_opened(), 0);
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn online_checks_report_an_unreachable_address_at_once() {
    let port = closed_port();
    let dir = new_agent();
    write(
        dir.path(),
        "models.yml",
        &format!(
            "providers:\n  gone:\n    baseUrl: http://127.0.0.1:{port}/v1\n    api: anthropic-messages\n    apiKey: $GONE_KEY\n    models:\n      - id: m1\n        contextWindow: 8192\n        maxTokens: 1024\n        reasoning: false\n"
        ),
    );
    write(dir.path(), "agent.lua", "agent { model = \"gone/m1\" }\n");
    write(
        dir.path(),
        "channels/tg.lua",
        &telegram_channel(&format!("http://127.0.0.1:{port}")),
    );
    let started = Instant::now();
    let (output, text, err) = doctor_online(
        dir.path(),
        &[("TELEGRAM_TOKEN", WRONG_TOKEN), ("GONE_KEY", WRONG_KEY)],
    );
    assert!(
        started.elapsed() < doctor::ONLINE_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    assert!(!output.status.success());
    let tg = checked(&text, ["channel", "tg"], "FAIL", "unreachable: ");
    assert!(
        fix_after(&text, tg).contains("the api_url in channels/tg.lua"),
        "{text}"
    );
    let gone = checked(&text, ["model", "gone"], "FAIL", "unreachable: ");
    assert!(fix_after(&text, gone).contains("baseUrl"), "{text}");
    shows_none_of(&[WRONG_TOKEN, WRONG_KEY], &text, &err);
}

#[test]
fn online_checks_time_out_on_a_server_that_never_answers() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap();
    let dir = new_agent();
    write(
        dir.path(),
        "models.yml",
        &format!(
            "providers:\n  slow:\n    baseUrl: http://{address}/v1\n    api: openai-responses\n    models:\n      - id: m1\n        contextWindow: 8192\n        maxTokens: 1024\n        reasoning: false\n"
        ),
    );
    write(dir.path(), "agent.lua", "agent { model = \"slow/m1\" }\n");
    write(
        dir.path(),
        "channels/dc.lua",
        &discord_channel(&format!("http://{address}")),
    );
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let checks = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(doctor::online(
            dir.path(),
            |name| (name == "DISCORD_TOKEN").then(|| WRONG_DISCORD_TOKEN.to_owned()),
            timeout,
        ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let names: Vec<_> = checks
        .iter()
        .map(|check| (check.name, check.status))
        .collect();
    assert_eq!(names, [("channel", Status::Fail), ("model", Status::Fail)]);
    for check in &checks {
        assert!(
            check.detail.contains("timeout: no answer within 0.3 s"),
            "{check}"
        );
        assert!(!check.to_string().contains(WRONG_DISCORD_TOKEN), "{check}");
    }
    drop(silent);
}

#[test]
fn online_reports_an_unset_credential_and_an_unused_provider_without_a_key() {
    let telegram = FakeTelegram::start();
    let model = FakeModel::start(Api::OpenAiResponses);
    let agent = online_agent(&model, &[("tg.lua", telegram_channel(&telegram.api_url()))]);
    let models = std::fs::read_to_string(agent.path().join("models.yml")).unwrap();
    write(
        agent.path(),
        "models.yml",
        &format!(
            "{models}  other:\n    baseUrl: http://127.0.0.1:{}/v1\n    api: anthropic-messages\n    apiKey: $OTHER_KEY\n    models:\n      - id: m2\n        contextWindow: 8192\n        maxTokens: 1024\n        reasoning: false\n",
            closed_port()
        ),
    );
    let checks = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(doctor::online(
            agent.path(),
            |_| None,
            doctor::ONLINE_TIMEOUT,
        ));
    let summary: Vec<_> = checks
        .iter()
        .map(|check| (check.name, check.status))
        .collect();
    assert_eq!(
        summary,
        [
            ("channel", Status::Fail),
            ("model", Status::Fail),
            ("model", Status::Warn)
        ]
    );
    assert!(
        checks[0].detail.contains("TELEGRAM_TOKEN is not set"),
        "{}",
        checks[0]
    );
    assert!(
        checks[1].detail.contains("FAKE_KEY is not set"),
        "{}",
        checks[1]
    );
    assert!(
        checks[2].detail.contains("OTHER_KEY is not set"),
        "{}",
        checks[2]
    );
    assert!(
        checks[2].detail.contains("another provider's"),
        "{}",
        checks[2]
    );
    assert!(telegram.calls().is_empty());
    assert!(model.requests().is_empty());
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn secrets_open_to_others_are_warned_with_the_chmod_that_closes_them() {
    let agent = new_agent();
    let root = agent.path().canonicalize().unwrap();
    let state = root.join(".perch");
    let store = state.join("matrix/ops");
    std::fs::create_dir_all(&store).unwrap();
    chmod(&state, 0o755);
    chmod(&state.join("matrix"), 0o700);
    chmod(&store, 0o700);
    std::fs::write(store.join("session.json"), "{}").unwrap();
    chmod(&store.join("session.json"), 0o644);
    std::fs::write(store.join("matrix-sdk-crypto.sqlite3"), "").unwrap();
    chmod(&store.join("matrix-sdk-crypto.sqlite3"), 0o600);
    let socket = std::os::unix::net::UnixListener::bind(state.join("control.sock")).unwrap();
    chmod(&state.join("control.sock"), 0o660);
    let env_dir = tempfile::tempdir().unwrap();
    let env_file = env_dir.path().join("ops.env");
    std::fs::write(&env_file, "TELEGRAM_TOKEN=x\n").unwrap();
    chmod(&env_file, 0o640);

    let cache = tempfile::tempdir().unwrap();
    let output = perch(
        &["doctor", root.to_str().unwrap()],
        &[
            ("PERCH_CACHE", cache.path().to_str().unwrap()),
            ("PERCH_ENV_FILE", env_file.to_str().unwrap()),
        ],
    );
    let text = stdout(&output);
    let warned: Vec<_> = text
        .lines()
        .filter(|line| line.starts_with("warn  secrets"))
        .collect();
    assert_eq!(warned.len(), 4, "{text}");
    let expect = [
        (
            format!(
                "{} is 0755: open to its group and everyone else",
                state.display()
            ),
            format!("chmod 700 {}", state.display()),
        ),
        (
            format!("{} is 0644", store.join("session.json").display()),
            format!("chmod 600 {}", store.join("session.json").display()),
        ),
        (
            format!(
                "{} is 0660: open to its group",
                state.join("control.sock").display()
            ),
            format!("chmod 600 {}", state.join("control.sock").display()),
        ),
        (
            format!(
                "{} is 0640: open to its group, and it holds the agent's tokens and keys",
                env_file.display()
            ),
            format!("chmod 600 {}", env_file.display()),
        ),
    ];
    for (detail, fix) in expect {
        let line = warned
            .iter()
            .find(|line| line.contains(&detail))
            .unwrap_or_else(|| panic!("no warning {detail:?} in:\n{text}"));
        assert_eq!(fix_after(&text, line), fix, "{text}");
    }

    chmod(&state, 0o700);
    chmod(&store.join("session.json"), 0o600);
    chmod(&state.join("control.sock"), 0o600);
    chmod(&env_file, 0o600);
    let checks = doctor::secrets(&AgentDir::open(&root).unwrap(), Some(&env_file));
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0].status, Status::Ok, "{}", checks[0]);
    assert!(
        checks[0].detail.contains(&format!(
            "private to their owner: .perch/, 4 entries in .perch/matrix/, .perch/control.sock, {}",
            env_file.display()
        )),
        "{}",
        checks[0]
    );
    drop(socket);
}

#[test]
fn a_missing_env_file_named_by_perch_env_file_is_a_warning() {
    let agent = new_agent();
    let missing = agent.path().join("nowhere.env");
    let checks = doctor::secrets(&AgentDir::open(agent.path()).unwrap(), Some(&missing));
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0].status, Status::Warn, "{}", checks[0]);
    assert!(checks[0].detail.contains("PERCH_ENV_FILE"), "{}", checks[0]);
    let checks = doctor::secrets(&AgentDir::open(agent.path()).unwrap(), None);
    assert_eq!(checks[0].status, Status::Ok, "{}", checks[0]);
    assert!(
        checks[0].detail.contains("nothing to check"),
        "{}",
        checks[0]
    );
}

#[test]
fn a_clock_before_this_perch_was_written_fails_and_one_gone_back_warns() {
    let long_ago = UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    let check = doctor::clock(long_ago, None);
    assert_eq!(check.status, Status::Fail, "{check}");
    assert!(
        check.detail.contains("the clock says 2020-09-13"),
        "{check}"
    );
    assert!(
        check
            .detail
            .contains("before this perch was written (2026-11-01"),
        "{check}"
    );
    assert!(
        check.fix.as_deref().unwrap().contains("timedatectl"),
        "{check}"
    );

    let now = SystemTime::now();
    assert_eq!(doctor::clock(now, None).status, Status::Ok);
    let agent = new_agent();
    let state = agent.path().join(".perch");
    std::fs::create_dir_all(state.join("sessions")).unwrap();
    let file = std::fs::File::create(state.join("sessions/written")).unwrap();
    assert_eq!(doctor::clock(now, Some(&state)).status, Status::Ok);
    file.set_modified(now + Duration::from_secs(3 * 86_400))
        .unwrap();
    let check = doctor::clock(now, Some(&state));
    assert_eq!(check.status, Status::Warn, "{check}");
    assert!(
        check.detail.contains("sessions/written was written at"),
        "{check}"
    );
    assert!(
        check.detail.contains("3 days later: the clock went back"),
        "{check}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_matrix_checks_the_saved_session_and_never_logs_in() {
    let synapse = super::support::synapse::Synapse::from_env();
    let bot = synapse.register("doctorbot").await;
    let agent = new_agent();
    write(
        agent.path(),
        "channels/mx.lua",
        &format!(
            "channel {{ kind = \"matrix\", homeserver = {:?}, user = {:?}, password = env \"MATRIX_PASSWORD\", store_passphrase = env \"MATRIX_STORE_PASSPHRASE\" }}\n",
            bot.url, bot.user_id
        ),
    );
    let env = [
        ("MATRIX_PASSWORD", bot.password.as_str()),
        ("MATRIX_STORE_PASSPHRASE", "doctor-passphrase"),
    ];
    let devices = || async {
        bot.call(reqwest::Method::GET, "/devices", None).await["devices"]
            .as_array()
            .unwrap()
            .len()
    };
    let before = devices().await;

    let (_, text1, err1) = doctor_online(agent.path(), &env);
    let mx = checked(
        &text1,
        ["channel", "mx"],
        "warn",
        "the homeserver answers (Matrix up to v1.",
    );
    assert!(
        mx.contains("is not logged in yet: perch run logs in once"),
        "{text1}"
    );
    assert!(!agent.path().join(".perch").exists(), "{text1}");

    let whoami = bot
        .call(reqwest::Method::GET, "/account/whoami", None)
        .await;
    let device = whoami["device_id"].as_str().unwrap().to_owned();
    let store = agent.path().join(".perch/matrix/mx");
    std::fs::create_dir_all(&store).unwrap();
    let session = |token: &str| {
        serde_json::json!({"user_id": bot.user_id, "device_id": device, "access_token": token})
            .to_string()
    };
    std::fs::write(store.join("session.json"), session(&bot.access_token)).unwrap();
    let (_, text2, err2) = doctor_online(agent.path(), &env);
    let mx = line(&text2, "channel", "mx");
    assert!(mx.starts_with("ok"), "{text2}");
    assert!(
        mx.contains(&format!(
            "whoami accepts the saved session of {} (device {device})",
            bot.user_id
        )),
        "{text2}"
    );

    let wrong = "syt_d3JvbmctdG9rZW4_never-printed-0123456789";
    std::fs::write(store.join("session.json"), session(wrong)).unwrap();
    let (refused, text3, err3) = doctor_online(agent.path(), &env);
    assert!(!refused.status.success());
    let mx = checked(
        &text3,
        ["channel", "mx"],
        "FAIL",
        "refused: the homeserver no longer accepts the saved session",
    );
    assert!(mx.contains("M_UNKNOWN_TOKEN"), "{text3}");
    assert!(
        fix_after(&text3, mx).contains("to log in again as a new device"),
        "{text3}"
    );

    assert_eq!(devices().await, before, "doctor logged in");
    let all = format!("{text1}{err1}{text2}{err2}{text3}{err3}");
    for secret in [bot.password.as_str(), bot.access_token.as_str(), wrong] {
        assert!(!all.contains(secret), "{all}");
    }
}

/// An agent whose `perch run` would refuse to start: the model's key and a channel's token
/// unset, and a HEARTBEAT.yml that does not check.
fn agent_run_would_refuse() -> tempfile::TempDir {
    let agent = new_agent();
    write(
        agent.path(),
        "channels/tg.lua",
        "channel { kind = \"telegram\", token = env \"PERCH_TEST_TG_TOKEN\" }\n",
    );
    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 1m\n",
    );
    agent
}

#[test]
fn info_and_doctor_report_every_variable_run_needs_and_the_heartbeat_file_at_once() {
    let agent = agent_run_would_refuse();
    let dir = agent.path().to_str().unwrap();
    let info = perch(&["info", dir], &[]);
    let said = stderr(&info);
    assert!(!info.status.success(), "{said}");
    for expected in [
        "error: OPENAI_API_KEY (models.yml: providers.openai.apiKey) is not set",
        "error: PERCH_TEST_TG_TOKEN (channels/tg.lua: token) is not set",
        "error: workspace/HEARTBEAT.yml:4",
    ] {
        assert!(said.contains(expected), "{expected}: {said}");
    }
    let doctor = perch(&["doctor", dir], &[]);
    let shown = stdout(&doctor);
    assert!(!doctor.status.success(), "{shown}");
    for expected in [
        "FAIL  env       OPENAI_API_KEY (models.yml: providers.openai.apiKey) is not set",
        "FAIL  env       PERCH_TEST_TG_TOKEN (channels/tg.lua: token) is not set",
        "FAIL  heartbeat workspace/HEARTBEAT.yml:4",
    ] {
        assert!(shown.contains(expected), "{expected}: {shown}");
    }

    write(
        agent.path(),
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: hourly\n    prompt: Look around.\n    every: 1h\n",
    );
    let env_file = agent.path().join("agent.env");
    std::fs::write(
        &env_file,
        "# the service's file\nOPENAI_API_KEY=sk-from-the-file\nexport PERCH_TEST_TG_TOKEN=\"1:x\"\n",
    )
    .unwrap();
    let fixed = perch(
        &["info", dir],
        &[("PERCH_ENV_FILE", env_file.to_str().unwrap())],
    );
    assert!(fixed.status.success(), "{}", stderr(&fixed));
    let doctor = perch(
        &["doctor", dir],
        &[("PERCH_ENV_FILE", env_file.to_str().unwrap())],
    );
    let shown = stdout(&doctor);
    assert!(
        shown.contains("ok    env       set: OPENAI_API_KEY, PERCH_TEST_TG_TOKEN"),
        "{shown}"
    );
    assert!(
        shown.contains("ok    heartbeat HEARTBEAT.yml: 1 task(s)"),
        "{shown}"
    );
    assert!(!shown.contains("sk-from-the-file"), "{shown}");
}

#[test]
fn an_environment_file_this_user_cannot_read_is_a_warning_not_a_failure() {
    let agent = new_agent();
    let dir = agent.path().to_str().unwrap();
    let unreadable = agent.path().join("a-directory.env");
    std::fs::create_dir(&unreadable).unwrap();
    let env = [("PERCH_ENV_FILE", unreadable.to_str().unwrap())];
    let info = perch(&["info", dir], &env);
    let said = stderr(&info);
    assert!(info.status.success(), "{said}");
    assert!(
        said.contains("warning: cannot check OPENAI_API_KEY (models.yml: providers.openai.apiKey)"),
        "{said}"
    );
    let shown = stdout(&perch(&["doctor", dir], &env));
    assert!(
        shown.contains("warn  env       cannot check OPENAI_API_KEY"),
        "{shown}"
    );
    assert!(!shown.contains("FAIL  env"), "{shown}");

    let fifo = agent.path().join("a-fifo.env");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_perch"))
        .args(["info", dir])
        .env_clear()
        .env("PERCH_ENV_FILE", &fifo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let info = super::support::scenario::exits_within(
        child,
        Duration::from_secs(20),
        "perch info with a FIFO for its environment file",
    );
    let said = stderr(&info);
    assert!(info.status.success(), "a FIFO is never waited on: {said}");
    assert!(said.contains("not a regular file"), "{said}");
}
