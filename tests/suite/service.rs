//! `perch run` end to end through the real binary: a chat platform's fake, the fake model
//! server and the namespace double; crashes placed with failpoints.

use super::fake_model::{FakeModel, Script};
use super::fake_telegram::{Chat, FakeTelegram, TOKEN, User};
use super::support::{new_agent, write};
use perch::doctor::Places;
use perch_core::config::Api;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn telegram_agent(model: &FakeModel, telegram: &FakeTelegram) -> tempfile::TempDir {
    let dir = new_agent();
    write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
    write(dir.path(), "agent.lua", "agent { model = \"fake/m1\" }\n");
    write(
        dir.path(),
        "channels/tg.lua",
        &format!(
            "channel {{\n  kind = \"telegram\",\n  token = env \"TELEGRAM_TOKEN\",\n  api_url = {:?},\n  dm = \"allow\",\n}}\n",
            telegram.api_url()
        ),
    );
    dir
}

fn start(dir: &Path, failpoint: Option<&str>) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(["run", dir.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_SANDBOX", "namespace-double")
        .env("PERCH_CACHE", Places::from_environment().cache)
        .env("TELEGRAM_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(point) = failpoint {
        command.env("PERCH_FAILPOINT", point);
    }
    command.spawn().unwrap()
}

fn stop(child: Child) -> String {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "perch run did not stop cleanly: {stderr}"
    );
    stderr
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_telegram_message_is_answered_in_its_chat_as_a_reply() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = telegram_agent(&model, &telegram);
    model.push(Script::text("Hello **Alice**!"));
    let child = start(dir.path(), None);
    let alice = User::human(42, "Alice");
    let pushed = telegram.push_message(&Chat::private(&alice), &alice, "hi there");
    wait_until("the reply", || !telegram.sent().is_empty());
    let sent = telegram.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].chat_id, 42);
    assert_eq!(sent[0].reply_to, Some(pushed.message_id));
    assert_eq!(sent[0].shown, "Hello Alice!");
    assert!(model.last_request().body.to_string().contains("hi there"));
    stop(child);

    // A restart neither loses nor repeats anything.
    model.push(Script::text("second answer"));
    let child = start(dir.path(), None);
    telegram.push_message(&Chat::private(&alice), &alice, "and again");
    wait_until("the second reply", || telegram.sent().len() == 2);
    stop(child);
    assert_eq!(telegram.sent()[1].shown, "second answer");
    assert_eq!(model.requests().len(), 2, "nothing was answered twice");
}

#[test]
fn a_crash_between_journal_and_acknowledgement_loses_and_doubles_nothing() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = telegram_agent(&model, &telegram);
    let alice = User::human(42, "Alice");
    telegram.push_message(&Chat::private(&alice), &alice, "are you there?");
    let child = start(dir.path(), Some("after:inbox_journaled"));
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "the failpoint fired");
    assert!(telegram.sent().is_empty());

    model.push(Script::text("yes, once"));
    let child = start(dir.path(), None);
    wait_until("the answer", || !telegram.sent().is_empty());
    stop(child);
    assert_eq!(telegram.sent().len(), 1);
    assert_eq!(model.requests().len(), 1);
}

#[test]
fn a_crash_after_the_delivery_intent_is_reported_not_resent_on_telegram() {
    let model = FakeModel::start(Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = telegram_agent(&model, &telegram);
    let alice = User::human(42, "Alice");
    model.push(Script::text("this may or may not have been posted"));
    telegram.push_message(&Chat::private(&alice), &alice, "hello");
    let child = start(dir.path(), Some("after:delivery_intent"));
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "the failpoint fired");

    let child = start(dir.path(), None);
    let stderr = {
        wait_until("the outbox to settle", || {
            std::fs::read_dir(dir.path().join(".perch/outbox"))
                .map(|entries| {
                    entries.filter_map(Result::ok).any(|entry| {
                        std::fs::read_to_string(entry.path())
                            .is_ok_and(|text| text.contains("\"unknown\""))
                    })
                })
                .unwrap_or(false)
        });
        stop(child)
    };
    assert!(telegram.sent().is_empty(), "never resent on Telegram");
    assert!(stderr.contains("unknown"), "{stderr}");
    assert_eq!(
        model.requests().len(),
        1,
        "the message was not answered again"
    );
}
