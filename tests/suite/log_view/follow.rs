//! `perch log`'s tail from the index, across segment rolls, and `--follow` beside `perch run`.

use super::*;

/// `perch log DIR --follow` with `args`, its output gathered as it comes.
struct Follower {
    child: std::process::Child,
    seen: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Follower {
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Follower {
        use std::io::Read;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_perch"))
            .args(["log", dir.to_str().unwrap(), "--follow"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let reader = std::thread::spawn({
            let seen = std::sync::Arc::clone(&seen);
            move || {
                let mut buffer = [0u8; 4096];
                while let Ok(read) = stdout.read(&mut buffer) {
                    if read == 0 {
                        break;
                    }
                    seen.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..read]));
                }
            }
        });
        Follower {
            child,
            seen,
            reader,
        }
    }

    fn wait_for(&self, what: &str, text: &str) {
        wait_until(what, || self.seen.lock().unwrap().contains(text));
    }

    /// Stops it with SIGTERM; what it printed, once it exited cleanly.
    fn stop(mut self) -> String {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        assert!(status.success(), "{status:?}");
        self.seen.lock().unwrap().clone()
    }
}

#[test]
fn follow_prints_the_last_turns_and_stops_on_sigterm() {
    let agent = agent_with_lanes();
    let follower = Follower::start(agent.path(), &["-n", "1"], &[]);
    follower.wait_for("the last turn", "lane heartbeat-digest: 1 turn shown");
    let seen = follower.stop();
    assert!(!seen.contains("telegram-team"), "only the last turn");
}

#[test]
fn the_tail_is_read_from_the_index_without_parsing_what_comes_before() {
    let agent = agent_with_lanes();
    let sessions = agent.path().join(".perch/sessions");
    let lane = LaneName::try_from("telegram-team").unwrap();
    let segment = sessions.join("telegram-team/000001.jsonl");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = offset_of(&bytes, b"why is the build red");
    bytes[at] = b'\x00';
    std::fs::write(&segment, &bytes).unwrap();

    let last = perch::log::transcript::read_lane(&sessions, &lane, Some(1), None).unwrap();
    assert!(!last.from_start);
    let first = &last.lines[0];
    assert!(
        matches!(
            &first.1,
            perch_core::log::ReadLine::Line(Line::Record(Record::OperationStarted { op: started, .. }))
                if *started == op(8)
        ),
        "the read begins at the last run's start: {first:?}"
    );
    assert!(
        last.lines
            .iter()
            .all(|(_, line)| !matches!(line, perch_core::log::ReadLine::Damaged { .. })),
        "the damaged line before it is never read"
    );
    let whole = perch::log::transcript::read_lane(&sessions, &lane, None, None).unwrap();
    assert!(whole.from_start);
    assert_eq!(whole.lines.len(), 24);
    assert!(matches!(
        &whole.lines[2].1,
        perch_core::log::ReadLine::Damaged { line: 3, .. }
    ));
}

#[test]
fn the_last_turns_reach_back_across_a_segment_roll() {
    let agent = new_agent();
    let sessions = agent.path().join(".perch/sessions");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let lane = LaneName::try_from("terminal").unwrap();
        let (log, _) = LaneLog::open(&sessions, &lane, system_clock()).unwrap();
        for n in 0..6u8 {
            if n == 4 {
                log.roll().await.unwrap();
            }
            let base = 10 * (n + 1);
            for line in [
                started(base, false, u32::from(n)),
                entry(
                    base + 1,
                    None,
                    Role::User,
                    vec![text(&format!("question {n}"))],
                    vec![],
                    u32::from(n),
                ),
                entry(
                    base + 2,
                    Some(base + 1),
                    Role::Assistant,
                    vec![text(&format!("answer {n}"))],
                    vec![],
                    u32::from(n),
                ),
                finished(base, Outcome::Completed, u32::from(n)),
            ] {
                log.append(&line).await.unwrap();
            }
        }
        log.close().await.unwrap();
    });
    let text = ok(&log(agent.path(), &["-n", "3"]));
    let questions: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("  user      "))
        .collect();
    assert_eq!(
        questions,
        vec!["question 3", "question 4", "question 5"],
        "{text}"
    );
    assert!(
        text.contains("log       segment 2, continuing 000001.jsonl"),
        "{text}"
    );
    let json = ok(&log(agent.path(), &["-n", "3", "--json"]));
    let segments: std::collections::BTreeSet<u64> = json
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["position"]["segment"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(segments, [1, 2].into_iter().collect());
}

/// `--follow` beside `perch run`: a message answered while it follows shows once, across the
/// segment roll its compaction makes.
#[test]
fn follow_shows_a_message_answered_while_it_runs_across_a_segment_roll() {
    use crate::suite::support::fake_model::Script;
    let agent = Scenario::telegram_dm().build();
    let model = &agent.model;
    let small = model
        .models_yml("fake", "m1")
        .replace("contextWindow: 128000", "contextWindow: 2048")
        .replace("maxTokens: 4096", "maxTokens: 512");
    agent.write("models.yml", &small);
    let service = agent.start();
    model.push(Script::text("first answer"));
    agent.send(&alice(), &format!("hello {}", "long words ".repeat(700)));
    agent.wait_for_replies(1);

    let follower = Follower::start(agent.path(), &["-n", "5"], &[("TELEGRAM_TOKEN", TOKEN)]);
    follower.wait_for("the tail", "reply     first answer");

    model.push(Script::text("SUMMARY-X"));
    model.push(Script::text("second answer"));
    agent.send(&alice(), "and again");
    follower.wait_for("the second answer, followed", "reply     second answer");
    let seen = follower.stop();
    service.stop();
    let lane = agent.path().join(".perch/sessions/tg-42-a69b25403314d72a");
    assert!(
        lane.join("000002.jsonl").exists(),
        "the compaction rolled the lane"
    );
    for (once, what) in [
        ("reply     first answer", "the tail"),
        ("user      Alice: and again", "the new message"),
        ("reply     second answer", "its answer"),
        ("log       segment 2", "the roll"),
    ] {
        assert_eq!(seen.matches(once).count(), 1, "{what} once:\n{seen}");
    }
    assert!(!seen.contains(TOKEN), "{seen}");
}
