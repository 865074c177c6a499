//! README's Quick start, run as README writes it. The commands are read from README.md's text (not
//! copied here) and run in order, from a fresh home directory, against the Telegram fake and the
//! scripted model; every output line README shows under a command must be in what that command
//! printed, in order, and each message README quotes from the bot must be one the bot sent.
//!
//! What the test changes, and only that: the two endpoints (`models.yml`'s OpenAI `baseUrl` and
//! the channel's `api_url`) point at the fakes, rewritten just before `perch run` so every
//! earlier command sees the files as `perch init` wrote them; `TELEGRAM_TOKEN` is the fake's token
//! (README's is a placeholder); `PERCH_ASSUME_KVM=1` lets `perch doctor` pass on a machine whose
//! `/dev/kvm` cannot boot a microVM (for tests only: README says so), and README's `ok    cpu`
//! line, which only such a machine prints, is not looked for; the pairing code README shows is
//! the one the bot gave.

use super::support::fake_model::{FakeModel, Script};
use super::support::fake_telegram::{self, BOT_USERNAME, Chat, FakeTelegram, User};
use super::support::scenario::Watched;
use super::support::wait::wait_until;
use perch::host::Places;
use perch_core::config::Api;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// README's placeholders and what stands for them in the test.
const README_HOME: &str = "/home/you";
const README_BOT: &str = "my_agent_bot";

/// The person in README's Quick start, with the Telegram id README shows.
fn ada() -> User {
    User::human(123_456_789, "Ada")
}

/// What the model answers Ada once she is let in.
const ANSWER: &str = "Hello Ada! I am your new agent. Tell me what to work on.";

/// One `$ command` of the Quick start and the lines README shows it printing.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// The Quick start section of README: its console steps and the bot's messages it quotes
/// (`text` blocks).
fn quick_start() -> (Vec<Step>, Vec<String>) {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme
        .find("\n## Quick start")
        .expect("README has a Quick start");
    let section = &readme[start + 1..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    let mut steps: Vec<Step> = Vec::new();
    let mut quoted = Vec::new();
    let mut block: Option<&str> = None;
    for line in section.lines() {
        match (block, line.strip_prefix("```")) {
            (None, Some(kind)) => block = Some(if kind.is_empty() { "plain" } else { kind }),
            (Some(_), Some(_)) => block = None,
            (Some("console"), None) => match line.strip_prefix("$ ") {
                Some(command) => steps.push(Step {
                    command: command.split(" # ").next().unwrap().trim().to_owned(),
                    shown: Vec::new(),
                }),
                None => steps
                    .last_mut()
                    .expect("output after a command")
                    .shown
                    .push(line.to_owned()),
            },
            (Some("text"), None) => quoted.push(line.to_owned()),
            _ => {}
        }
    }
    (steps, quoted)
}

/// `text` with what differs between runs made alike: long hex runs (hashes, lane suffixes)
/// and every number.
fn normalised(text: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 16 && run.chars().all(|ch| ch.is_ascii_hexdigit()) {
            out.push_str("<hex>");
        } else {
            let mut digits = false;
            for ch in run.chars() {
                if ch.is_ascii_digit() {
                    if !digits {
                        out.push('#');
                    }
                    digits = true;
                } else {
                    out.push(ch);
                    digits = false;
                }
            }
        }
        run.clear();
    };
    for ch in text.chars() {
        if ch.is_ascii_alphanumeric() {
            run.push(ch);
        } else {
            flush(&mut run, &mut out);
            out.push(ch);
        }
    }
    flush(&mut run, &mut out);
    durations_alike(out.trim_end())
}

/// Human durations (`just now`, `2s`, `1 min`, `1min 32s`, `3h 12min`) written alike, as `#s`.
fn durations_alike(text: &str) -> String {
    let mut text = text.replace("just now", "#s ago");
    for (from, to) in [
        ("#d #h", "#s"),
        ("#h #min", "#s"),
        ("#min #s", "#s"),
        ("# min", "#s"),
        ("#min", "#s"),
        ("#h", "#s"),
        ("#d", "#s"),
    ] {
        text = text.replace(from, to);
    }
    text
}

/// Every line of `shown` (README's placeholders replaced by `names`) is in `printed`, in order;
/// `...` stands for lines README leaves out.
fn assert_shown(command: &str, shown: &[String], printed: &str, names: &[(String, String)]) {
    let printed: Vec<String> = printed.lines().map(normalised).collect();
    let mut from = 0;
    for line in shown {
        let line = line.trim_end();
        let line = strip_clock(line);
        if line.is_empty() || line == "..." || line.starts_with("ok    cpu ") {
            continue;
        }
        let mut line = line.to_owned();
        for (placeholder, actual) in names {
            line = line.replace(placeholder.as_str(), actual);
        }
        let wanted = normalised(&line);
        match printed[from..]
            .iter()
            .position(|candidate| *candidate == wanted)
        {
            Some(at) => from += at + 1,
            None => panic!(
                "README shows `{command}` printing\n  {line}\nbut after the lines matched so far it printed:\n{}",
                printed[from..].join("\n")
            ),
        }
    }
}

/// A narration line as README shows it from a terminal, `HH:MM:SS ` first, as a pipe gets it.
fn strip_clock(line: &str) -> &str {
    let bytes = line.as_bytes();
    let clock = bytes.len() > 9
        && bytes[..8].iter().enumerate().all(|(at, byte)| {
            if at % 3 == 2 {
                *byte == b':'
            } else {
                byte.is_ascii_digit()
            }
        })
        && bytes[8] == b' ';
    if clock { &line[9..] } else { line }
}

/// What a command wrote, stdout then stderr.
fn printed(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The journey's world: a home directory, the fakes, the environment the commands get.
struct World {
    home: tempfile::TempDir,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    telegram: FakeTelegram,
    model: FakeModel,
}

impl World {
    fn command(&self, args: &[&str]) -> Command {
        let places = Places::from_environment();
        let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
        command
            .args(args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("MSB_HOME", &places.msb_home)
            .env("PERCH_CACHE", &places.cache)
            .env("PERCH_ASSUME_KVM", "1")
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null());
        command
    }

    /// Points the agent in the current directory at the fakes.
    fn use_the_fakes(&self) {
        let models = self.cwd.join("models.yml");
        let text = std::fs::read_to_string(&models).unwrap();
        assert!(text.contains("https://api.openai.com/v1"), "{text}");
        std::fs::write(
            &models,
            text.replace("https://api.openai.com/v1", &self.model.base_url()),
        )
        .unwrap();
        let channel = self.cwd.join("channels/telegram.lua");
        let text = std::fs::read_to_string(&channel).unwrap();
        let commented = "-- api_url = \"https://api.telegram.org\",";
        assert!(text.contains(commented), "{text}");
        std::fs::write(
            &channel,
            text.replace(
                commented,
                &format!("api_url = {:?},", self.telegram.api_url()),
            ),
        )
        .unwrap();
    }

    fn replies(&self) -> Vec<String> {
        self.telegram
            .sent()
            .into_iter()
            .map(|sent| sent.shown)
            .collect()
    }
}

#[test]
fn readme_s_quick_start_reaches_a_first_telegram_reply_as_written() {
    let (steps, quoted) = quick_start();
    assert!(
        steps.len() <= 10,
        "the Quick start takes at most ten commands: {steps:#?}"
    );
    let home = tempfile::tempdir().unwrap();
    let mut world = World {
        cwd: home.path().to_owned(),
        home,
        env: Vec::new(),
        telegram: FakeTelegram::start(),
        model: FakeModel::start(Api::OpenAiResponses),
    };
    world.model.push(Script::text(ANSWER));
    let places = Places::from_environment();
    let mut names: Vec<(String, String)> = vec![
        (
            format!("{README_HOME}/.microsandbox"),
            places.msb_home.display().to_string(),
        ),
        (
            format!("{README_HOME}/.cache/perch"),
            places.cache.display().to_string(),
        ),
        (
            README_HOME.to_owned(),
            world.home.path().display().to_string(),
        ),
        (README_BOT.to_owned(), BOT_USERNAME.to_owned()),
    ];
    let mut running: Option<(Watched, Vec<String>)> = None;
    let mut answered = false;
    for step in &steps {
        let words: Vec<&str> = step.command.split_whitespace().collect();
        match words.as_slice() {
            ["cd", dir] => world.cwd = world.cwd.join(dir),
            ["export", assignments @ ..] => {
                for assignment in assignments {
                    let (key, value) = assignment.split_once('=').unwrap();
                    let value = if key == "TELEGRAM_TOKEN" {
                        fake_telegram::TOKEN
                    } else {
                        value
                    };
                    world.env.push((key.to_owned(), value.to_owned()));
                }
            }
            ["perch", "run"] => {
                world.use_the_fakes();
                let mut command = world.command(&["run"]);
                command.stdout(Stdio::null()).stderr(Stdio::piped());
                let watched = Watched::spawn(command);
                wait_until("perch run to be ready", || {
                    watched
                        .lines()
                        .iter()
                        .any(|line| line.starts_with("ready: "))
                });
                world
                    .telegram
                    .push_message(&Chat::private(&ada()), &ada(), "hello");
                wait_until("the pairing offer", || world.replies().len() == 1);
                running = Some((watched, step.shown.clone()));
            }
            ["perch", "pair", "approve", code] => {
                let offer = world.replies()[0].clone();
                let given = offer
                    .split("perch pair approve ")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or_else(|| panic!("a code in {offer:?}"))
                    .trim_end_matches(['.', '`'])
                    .to_owned();
                names.insert(0, ((*code).to_owned(), given.clone()));
                let output = world
                    .command(&["pair", "approve", &given])
                    .output()
                    .unwrap();
                let printed = printed(&output);
                println!("$ {}\n{printed}", step.command);
                assert!(output.status.success(), "{}: {printed}", step.command);
                assert_shown(&step.command, &step.shown, &printed, &names);
                wait_until("Ada told she is in", || world.replies().len() == 2);
                world
                    .telegram
                    .push_message(&Chat::private(&ada()), &ada(), "what can you do?");
                wait_until("the first answer", || world.replies().len() == 3);
                answered = true;
            }
            ["perch", args @ ..] => {
                let output = world.command(args).output().unwrap();
                let printed = printed(&output);
                println!("$ {}\n{printed}", step.command);
                assert!(
                    output.status.success(),
                    "{} failed ({}): {printed}",
                    step.command,
                    output.status
                );
                assert_shown(&step.command, &step.shown, &printed, &names);
            }
            _ => panic!(
                "the Quick start has a command this test cannot run: {}",
                step.command
            ),
        }
    }
    assert!(answered, "the Quick start reaches a first reply");
    assert_eq!(world.replies()[2], ANSWER, "the model's answer reached Ada");
    let bot_said = world.replies().join("\n");
    println!("the bot said:\n{bot_said}");
    let said: Vec<String> = bot_said.lines().map(normalised).collect();
    for line in quoted.iter().filter(|line| !line.trim().is_empty()) {
        let mut line = line.clone();
        for (placeholder, actual) in &names {
            line = line.replace(placeholder.as_str(), actual);
        }
        assert!(
            said.contains(&normalised(&line)),
            "README quotes the bot saying\n  {line}\nbut it said:\n{bot_said}"
        );
    }
    let (watched, shown) = running.expect("the Quick start runs perch run");
    let lines = watched.stop();
    println!("$ perch run\n{}", lines.join("\n"));
    assert_shown("perch run", &shown, &lines.join("\n"), &names);
}
