//! A thousand conversations at once through `perch run`, the Telegram fake and the fake model,
//! under `ulimit -n 1024`: every one answered once, and the process's descriptors and threads
//! as they were after a smaller burst, so nothing is held per conversation.

use super::support::fake_telegram::{Chat, FakeTelegram, User};
use super::support::scenario::{Agent, Perch, Scenario};
use super::support::wait::Poll;
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

/// `perch run` for `agent` on the namespace double, its open files limited to 1,024 (soft and
/// hard, so perch cannot raise it).
fn start_limited(agent: &Agent) -> Perch {
    let run = agent.command();
    let mut limited = Command::new("sh");
    limited
        .args(["-c", "ulimit -n 1024 && exec \"$0\" \"$@\""])
        .arg(run.get_program())
        .args(run.get_args())
        .env_clear()
        .envs(
            run.get_envs()
                .filter_map(|(key, value)| Some((key, value?))),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    Perch::spawn(limited)
}

/// The open descriptors and the threads of process `pid`.
fn held(pid: u32) -> (usize, usize) {
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .unwrap()
            .count()
    };
    (count("fd"), count("task"))
}

/// The soft and hard open-files limits of process `pid`.
fn open_files_limit(pid: u32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends one message from each of `people` in their private chat, and waits until each chat
/// has its answer.
fn burst(telegram: &FakeTelegram, people: &[User], answered_before: usize) {
    for person in people {
        telegram.push_message(
            &Chat::private(person),
            person,
            &format!("hello from {}", person.id),
        );
    }
    let total = answered_before + people.len();
    Poll::within(Duration::from_secs(60))
        .until(&format!("{} conversations answered", people.len()), || {
            telegram.sent_count() >= total
        });
}

#[test]
fn a_thousand_conversations_under_1024_descriptors_are_answered_with_descriptors_and_threads_flat()
{
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    model.echo_after(Duration::ZERO);
    let service = start_limited(&agent);
    let pid = service.id();
    let perch = std::fs::canonicalize(env!("CARGO_BIN_EXE_perch")).unwrap();
    Poll::within(Duration::from_secs(10)).until("the shell to exec perch", || {
        std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == perch)
    });
    assert_eq!(open_files_limit(pid), "1024 1024");
    let person = |id: i64| User::human(id, &format!("P{id}"));
    let warm_up: Vec<User> = (1..=100).map(person).collect();
    burst(telegram, &warm_up, 0);
    let before = held(pid);
    let crowd: Vec<User> = (1001..=2000).map(person).collect();
    burst(telegram, &crowd, warm_up.len());
    let settled = Poll::within(Duration::from_secs(30)).holds(|| {
        let after = held(pid);
        after.0 <= before.0 && after.1 <= before.1
    });
    assert!(
        settled,
        "(descriptors, threads) were {before:?} after 100 conversations and are still {:?} \
         after 1,000 more",
        held(pid)
    );
    let stderr = service.stop();
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    let mut answers: HashMap<i64, Vec<String>> = HashMap::new();
    for sent in telegram.sent() {
        answers.entry(sent.chat_id).or_default().push(sent.shown);
    }
    assert_eq!(answers.len(), 1100, "every conversation answered");
    for (chat, texts) in &answers {
        assert_eq!(texts.len(), 1, "chat {chat} answered once: {texts:?}");
        assert!(
            texts[0].starts_with("echo: ") && texts[0].ends_with(&format!("hello from {chat}")),
            "chat {chat} got {texts:?}"
        );
    }
    assert_eq!(model.requests().len(), 1100, "one model request each");
}
