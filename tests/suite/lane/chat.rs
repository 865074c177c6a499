//! `perch chat` through the real binary: memory, CA-less models, redaction, crash recovery.

use super::*;
use crate::suite::support::scenario::on_the_double;

/// Runs `perch chat DIR` on the namespace double with `input` on stdin.
fn chat(dir: &Path, input: &str, failpoint: Option<&str>) -> Output {
    let failpoint = failpoint.map(|point| ("PERCH_FAILPOINT", point));
    chat_with(dir, input, failpoint.as_slice())
}

/// [`chat`] with `env` added to its environment.
fn chat_with(dir: &Path, input: &str, env: &[(&str, &str)]) -> Output {
    let mut command = perch_chat(dir);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command.envs(env.iter().copied());
    let mut child = command.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `perch chat DIR` on the namespace double, its stdin piped.
fn perch_chat(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    on_the_double(command.args(["chat", dir.to_str().unwrap()])).stdin(Stdio::piped());
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn perch_chat_talks_through_the_lane_and_remembers() {
    let fake = FakeModel::start(Api::OpenAiCompletions);
    let dir = agent_for(&fake);
    fake.push(Reply::bash("c1", "echo 42 > answer.txt"));
    fake.push(Script::text("I wrote the answer."));
    let output = chat(dir.path(), "write the answer\n", None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "I wrote the answer.\n");
    assert!(
        text(&output.stderr).contains("[bash "),
        "{}",
        text(&output.stderr)
    );
    fake.push(Script::text("You asked me to write the answer."));
    let output = chat(dir.path(), "what did I ask?\n", None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let history = fake.last_request().body.to_string();
    assert!(history.contains("write the answer") && history.contains("I wrote the answer."));
}

/// A machine without CA certificates, as the platform verifier sees it: `SSL_CERT_FILE` and
/// `SSL_CERT_DIR`, when set, are the only places it reads.
struct NoCaCertificates {
    places: tempfile::TempDir,
}

impl NoCaCertificates {
    fn new() -> NoCaCertificates {
        let places = tempfile::tempdir().unwrap();
        std::fs::write(places.path().join("empty.pem"), "").unwrap();
        std::fs::create_dir(places.path().join("certs")).unwrap();
        NoCaCertificates { places }
    }

    fn env(&self) -> [(&'static str, String); 2] {
        let place = |name: &str| self.places.path().join(name).display().to_string();
        [
            ("SSL_CERT_FILE", place("empty.pem")),
            ("SSL_CERT_DIR", place("certs")),
        ]
    }
}

#[test]
fn without_ca_certificates_a_loopback_http_model_answers_and_an_https_one_says_why_once() {
    let machine = NoCaCertificates::new();
    let env = machine.env();
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(key, value)| (*key, value.as_str()))
        .collect();
    let fake = FakeModel::start(Api::OpenAiCompletions);
    let dir = agent_for(&fake);
    fake.push(Script::text("answered over plain http"));
    let output = chat_with(dir.path(), "hello\n", &env);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "answered over plain http\n");

    let https = fake.models_yml("fake", "m1").replace(
        &fake.base_url(),
        &fake.base_url().replace("http://", "https://"),
    );
    assert!(https.contains("baseUrl: https://127.0.0.1:"), "{https}");
    write(dir.path(), "models.yml", &https);
    let requests = fake.requests().len();
    let output = chat_with(dir.path(), "hello again\n", &env);
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr
            .matches("this machine has no CA certificates")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("apt-get install ca-certificates"),
        "{stderr}"
    );
    assert!(!stderr.contains("[attempt"), "retried: {stderr}");
    assert!(!stderr.contains("attempts)"), "retried: {stderr}");
    assert!(!stderr.contains("connection lost"), "{stderr}");
    assert_eq!(fake.requests().len(), requests, "nothing reached a server");
    let attempts: usize = std::fs::read_dir(dir.path().join(".perch/sessions/terminal"))
        .unwrap()
        .map(|file| std::fs::read_to_string(file.unwrap().path()).unwrap_or_default())
        .map(|text| text.matches(r#""type":"attempt_started""#).count())
        .sum();
    assert_eq!(attempts, 2, "one attempt per turn, none repeated");
    let (branch, _) = on_disk(dir.path(), "terminal");
    let last = branch.last().unwrap();
    assert!(
        matches!(&last.body, EntryBody::Message(message) if message.role == Role::User),
        "the failed turn leaves only the question: {last:?}"
    );

    let mut doctor_env = env.clone();
    let cache = Places::from_environment().cache.display().to_string();
    doctor_env.push(("PERCH_CACHE", &cache));
    let doctor =
        crate::suite::support::perch(&["doctor", dir.path().to_str().unwrap()], &doctor_env);
    let shown = text(&doctor.stdout);
    let trust = shown
        .lines()
        .find(|line| line.contains("trust"))
        .unwrap_or_else(|| panic!("no trust check in:\n{shown}"));
    assert!(
        trust.starts_with("FAIL") && trust.contains("no CA certificates"),
        "{shown}"
    );
    assert!(shown.contains("apt-get install ca-certificates"), "{shown}");

    let doctor = crate::suite::support::perch(
        &["doctor", dir.path().to_str().unwrap()],
        &[("PERCH_CACHE", &cache)],
    );
    let shown = text(&doctor.stdout);
    assert!(
        shown
            .lines()
            .any(|line| line.starts_with("ok") && line.contains("trust")),
        "this machine has CA certificates:\n{shown}"
    );
}

#[test]
fn a_one_character_key_is_redacted_without_cutting_the_words_around_it() {
    let fake = FakeModel::start(Api::OpenAiCompletions);
    let dir = agent_for(&fake);
    write(
        dir.path(),
        "models.yml",
        &fake.models_yml_with_key("fake", "m1", "FAKE_KEY"),
    );
    fake.push(Script::status(
        401,
        "Incorrect API key provided: x. Unexpected, exhausting: x-api-key x",
    ));
    let output = chat_with(dir.path(), "hello\n", &[("FAKE_KEY", "x")]);
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(
            "Incorrect API key provided: <redacted>. Unexpected, exhausting: x-api-key <redacted>"
        ),
        "{stderr}"
    );
    assert_eq!(
        fake.last_request().header("authorization"),
        Some("Bearer x")
    );
}

/// A process killed at each step of the sequence leaves a lane that the next start recovers:
/// valid, complete, every call answered, nothing run twice.
#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn a_crash_at_every_step_is_recovered_on_the_next_start() {
    for point in [
        "after:operation_started",
        "after:user_entry",
        "after:attempt_started",
        "after:assistant_entry",
        "after:tool_started",
        "after:tool_result",
        "before:operation_finished",
    ] {
        let first = FakeModel::start(Api::OpenAiCompletions);
        let dir = agent_for(&first);
        first.push(Reply::bash("crash-call", "echo ran >> ran.txt"));
        first.push(Script::text("done"));
        let output = chat(dir.path(), "run it\n", Some(point));
        assert!(
            !output.status.success(),
            "{point}: the failpoint did not fire"
        );

        let second = FakeModel::start(Api::OpenAiCompletions);
        point_at(dir.path(), &second);
        second.push(Script::text("after the crash"));
        let output = chat(dir.path(), "hello again\n", None);
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{point}: {stderr}");
        assert_eq!(text(&output.stdout), "after the crash\n", "{point}");
        assert!(
            stderr.contains("recovered lane terminal: 1 unfinished operation"),
            "{point}: {stderr}"
        );

        let (branch, open) = on_disk(dir.path(), "terminal");
        assert_eq!(open, 0, "{point}");
        assert_paired(&branch);
        let ran = std::fs::read_to_string(dir.path().join("workspace/ran.txt")).unwrap_or_default();
        let expected_runs =
            usize::from(point == "after:tool_result" || point == "before:operation_finished");
        assert_eq!(
            ran.lines().count(),
            expected_runs,
            "{point}: the tool ran {ran:?}"
        );
        if point == "after:tool_started" {
            let (_, output, is_error) = results(&branch).pop().unwrap();
            assert!(
                is_error && output.contains("interrupted"),
                "{point}: {output}"
            );
        }
        let request = second.last_request().body.to_string();
        assert!(request.contains("hello again"), "{point}");
    }
}

#[test]
fn a_perch_killed_inside_a_tool_is_recovered() {
    let first = FakeModel::start(Api::AnthropicMessages);
    let dir = agent_for(&first);
    first.push(Reply::bash("inside", "touch inside; sleep 301.5"));
    let mut child = perch_chat(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"start the long job\n").unwrap();
    wait_for(&dir.path().join("workspace/inside"));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);

    let second = FakeModel::start(Api::AnthropicMessages);
    point_at(dir.path(), &second);
    second.push(Script::text("recovered"));
    let output = chat(dir.path(), "what happened?\n", None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let branch = closed_and_paired(dir.path(), "terminal");
    let (call, result, is_error) = results(&branch)
        .into_iter()
        .find(|(call, _, _)| call == "inside")
        .unwrap();
    assert!(
        is_error && result.contains("interrupted"),
        "{call}: {result}"
    );
}
