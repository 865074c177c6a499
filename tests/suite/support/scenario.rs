//! `perch run` end to end: a [`Scenario`] makes an agent directory on the fake model with one
//! chat channel (Telegram or Discord on its fake, or any channel Lua), and the [`Agent`] it
//! builds starts the real binary on the namespace double, talks to it through the fakes, reads
//! its status and stops it.

use super::fake_discord::{self, FakeDiscord};
use super::fake_model::{FakeModel, Script};
use super::fake_slack::{self, FakeSlack};
use super::fake_telegram::{self, Chat, FakeTelegram, Pushed, User};
use super::status::{self, StatusReport};
use super::wait::{Poll, wait_until};
use super::{new_agent, perch, write};
use perch::host::Places;
use perch_core::config::Api;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The chat platform a scenario's channel is on.
enum Platform {
    Telegram(FakeTelegram),
    Discord(FakeDiscord),
    Slack(FakeSlack),
    /// The channel Lua names its own place (a Synapse, a port nobody answers on, ...).
    Elsewhere,
}

/// What the channel file holds.
enum Channel {
    /// `kind`, the token's variable and the fake's URL, then the options.
    Fake,
    /// The file as given.
    Lua(String),
}

/// A platform's fake as a scenario uses it.
struct Fake {
    start: fn() -> Platform,
    file: &'static str,
    token: (&'static str, &'static str),
}

const TELEGRAM: Fake = Fake {
    start: || Platform::Telegram(FakeTelegram::start()),
    file: "channels/tg.lua",
    token: ("TELEGRAM_TOKEN", fake_telegram::TOKEN),
};

const DISCORD: Fake = Fake {
    start: || Platform::Discord(FakeDiscord::start()),
    file: "channels/dc.lua",
    token: ("DISCORD_TOKEN", fake_discord::TOKEN),
};

const SLACK: Fake = Fake {
    start: || Platform::Slack(FakeSlack::start()),
    file: "channels/sl.lua",
    token: ("SLACK_BOT_TOKEN", fake_slack::BOT_TOKEN),
};

/// An agent directory to be: the model's wire API, `agent.lua`'s options and one channel.
pub struct Scenario {
    api: Api,
    platform: fn() -> Platform,
    channel: Channel,
    file: String,
    options: String,
    agent: String,
    env: Vec<(String, String)>,
}

impl Scenario {
    /// A Telegram channel `tg` on a fresh fake Bot API; `options` go inside `channel { ... }`,
    /// on the file's second line.
    pub fn telegram(options: &str) -> Scenario {
        Scenario::on(&TELEGRAM, options)
    }

    /// A Telegram channel that answers direct messages from anyone.
    pub fn telegram_dm() -> Scenario {
        Scenario::telegram("dm = \"allow\"")
    }

    /// A Discord channel `dc` on a fresh fake; `options` go inside `channel { ... }`, on the
    /// file's second line.
    pub fn discord(options: &str) -> Scenario {
        Scenario::on(&DISCORD, options)
    }

    /// A Slack channel `sl` on a fresh fake Slack (its bot token in `SLACK_BOT_TOKEN`, its
    /// app-level token in `SLACK_APP_TOKEN`); `options` go inside `channel { ... }`, on the
    /// file's second line.
    pub fn slack(options: &str) -> Scenario {
        Scenario::on(&SLACK, options).env("SLACK_APP_TOKEN", fake_slack::APP_TOKEN)
    }

    /// A Telegram channel `tg` whose Bot API is at `url`, with no fake behind it.
    pub fn telegram_at(url: &str) -> Scenario {
        Scenario::channel_lua(
            "channels/tg.lua",
            &format!(
                "channel {{ kind = \"telegram\", token = env \"TELEGRAM_TOKEN\", api_url = {url:?} }}\n"
            ),
        )
        .env("TELEGRAM_TOKEN", fake_telegram::TOKEN)
    }

    /// A channel file written as given, on no fake; `env` gives what it reads.
    pub fn channel_lua(file: &str, lua: &str) -> Scenario {
        Scenario {
            api: Api::OpenAiCompletions,
            platform: || Platform::Elsewhere,
            channel: Channel::Lua(lua.to_owned()),
            file: file.to_owned(),
            options: String::new(),
            agent: String::new(),
            env: Vec::new(),
        }
    }

    fn on(fake: &Fake, options: &str) -> Scenario {
        Scenario {
            platform: fake.start,
            channel: Channel::Fake,
            options: options.to_owned(),
            ..Scenario::channel_lua(fake.file, "")
        }
        .env(fake.token.0, fake.token.1)
    }

    /// The model's wire API (OpenAI Chat Completions unless set).
    pub fn model(self, api: Api) -> Scenario {
        Scenario { api, ..self }
    }

    /// More of `agent { model = "fake/m1", ... }`.
    pub fn agent(self, options: &str) -> Scenario {
        Scenario {
            agent: format!(", {options}"),
            ..self
        }
    }

    /// The channel's file (and so its name), instead of `channels/tg.lua` or `channels/dc.lua`.
    pub fn channel_file(self, file: &str) -> Scenario {
        Scenario {
            file: file.to_owned(),
            ..self
        }
    }

    /// A variable in `perch run`'s environment.
    pub fn env(mut self, key: &str, value: &str) -> Scenario {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Starts the fakes and writes the agent directory.
    pub fn build(self) -> Agent {
        let model = FakeModel::start(self.api);
        let platform = (self.platform)();
        let dir = new_agent();
        write(dir.path(), "models.yml", &model.models_yml("fake", "m1"));
        write(
            dir.path(),
            "agent.lua",
            &format!("agent {{ model = \"fake/m1\"{} }}\n", self.agent),
        );
        let channel = match (&self.channel, &platform) {
            (Channel::Lua(lua), _) => lua.clone(),
            (Channel::Fake, Platform::Telegram(telegram)) => fake_channel(
                "telegram",
                "TELEGRAM_TOKEN",
                &telegram.api_url(),
                &self.options,
            ),
            (Channel::Fake, Platform::Discord(discord)) => {
                fake_channel("discord", "DISCORD_TOKEN", &discord.url(), &self.options)
            }
            (Channel::Fake, Platform::Slack(slack)) => format!(
                "channel {{ kind = \"slack\", app_token = env \"SLACK_APP_TOKEN\", \
                 bot_token = env \"SLACK_BOT_TOKEN\", api_url = {:?},\n  {} }}\n",
                slack.api_url(),
                self.options
            ),
            (Channel::Fake, Platform::Elsewhere) => unreachable!("a fake channel has its fake"),
        };
        write(dir.path(), &self.file, &channel);
        Agent {
            model,
            platform,
            dir,
            env: self.env,
        }
    }
}

fn fake_channel(kind: &str, token: &str, url: &str, options: &str) -> String {
    format!(
        "channel {{ kind = \"{kind}\", token = env \"{token}\", api_url = {url:?},\n  {options} }}\n"
    )
}

/// The world of one scenario: the fakes, the agent directory, and what `perch run` is given.
/// `perch run` may be started on it any number of times, one at a time.
pub struct Agent {
    pub model: FakeModel,
    platform: Platform,
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Agent {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory as `perch` takes it on its command line.
    pub fn arg(&self) -> &str {
        self.path().to_str().unwrap()
    }

    /// The fake Bot API of a Telegram scenario.
    pub fn telegram(&self) -> &FakeTelegram {
        match &self.platform {
            Platform::Telegram(telegram) => telegram,
            _ => panic!("not a Telegram scenario"),
        }
    }

    /// The fake Discord of a Discord scenario.
    pub fn discord(&self) -> &FakeDiscord {
        match &self.platform {
            Platform::Discord(discord) => discord,
            _ => panic!("not a Discord scenario"),
        }
    }

    /// The fake Slack of a Slack scenario.
    pub fn slack(&self) -> &FakeSlack {
        match &self.platform {
            Platform::Slack(slack) => slack,
            _ => panic!("not a Slack scenario"),
        }
    }

    /// Writes `file` in the agent directory.
    pub fn write(&self, file: &str, text: &str) {
        write(self.path(), file, text);
    }

    /// `perch run DIR` with the scenario's environment, not started.
    pub fn command(&self) -> Command {
        let mut command = run_command(self.path());
        command.envs(self.env.iter().map(|(key, value)| (key, value)));
        command
    }

    /// Starts `perch run`.
    pub fn start(&self) -> Perch {
        Perch::spawn(self.command())
    }

    /// Starts `perch run` with the failpoint `point` armed.
    pub fn start_at(&self, point: &str) -> Perch {
        let mut command = self.command();
        command.env("PERCH_FAILPOINT", point);
        Perch::spawn(command)
    }

    /// Runs `perch run` with the failpoint `point` armed until it fires.
    pub fn crash_at(&self, point: &str) -> Output {
        self.start_at(point).crashed(point)
    }

    /// `perch ARGS DIR`, with nothing of the environment but PATH.
    pub fn perch(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.push(self.arg());
        perch(&all, &[])
    }

    /// `perch ARGS DIR` in `perch run`'s environment, for a command that does the work itself
    /// when no service runs.
    pub fn perch_alone(&self, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
        on_the_double(command.args(args).arg(self.arg()))
            .envs(self.env.iter().map(|(key, value)| (key, value)));
        command.output().unwrap()
    }

    /// `perch ARGS`, run from `cwd`, in `perch run`'s environment plus `env`: the test names
    /// the agent directory (as `-C DIR`, say) or runs from it.
    pub fn perch_from(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command_from(cwd, args, env).output().unwrap()
    }

    /// [`Agent::perch_from`], not started; standard input closed.
    pub fn command_from(&self, cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
        on_the_double(command.args(args).current_dir(cwd))
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        command
    }

    /// [`Agent::perch_alone`] with `input` on its stdin.
    pub fn perch_alone_with_input(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write as _;
        let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
        on_the_double(command.args(args).arg(self.arg()))
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// `perch status DIR --json`.
    pub fn status(&self) -> StatusReport {
        status::status(self.path())
    }

    /// `perch status DIR`.
    pub fn status_text(&self) -> String {
        status::status_text(self.path())
    }

    /// Sends `text` to the bot in `from`'s private Telegram chat.
    pub fn send(&self, from: &User, text: &str) -> Pushed {
        self.telegram()
            .push_message(&Chat::private(from), from, text)
    }

    /// How many messages the bot has sent on its platform.
    pub fn replies(&self) -> usize {
        match &self.platform {
            Platform::Telegram(telegram) => telegram.sent_count(),
            Platform::Discord(discord) => discord.posted().len(),
            Platform::Slack(slack) => slack.posted().len(),
            Platform::Elsewhere => panic!("replies are counted on a fake"),
        }
    }

    /// Waits until the bot has sent exactly `count` messages.
    pub fn wait_for_replies(&self, count: usize) {
        wait_until(&format!("{count} replies"), || self.replies() == count);
    }

    /// Waits until the bot has sent at least one message.
    pub fn wait_for_a_reply(&self) {
        wait_until("the reply", || self.replies() > 0);
    }

    /// Waits until the fake Discord has a live gateway session.
    pub fn wait_for_gateway(&self) {
        wait_until("the gateway session", || self.discord().live_sessions() > 0);
    }

    /// Waits until the running service answers `perch status`.
    pub fn wait_for_service(&self) {
        wait_until("the service to answer", || self.status().running);
    }
}

/// An agent whose `perch run` died at `failpoint` while handling one Telegram message `text`
/// from Alice (42), answered with `reply` if given; the fakes stay up for the restart.
pub fn crash_on_one_message(reply: Option<&str>, text: &str, failpoint: &str) -> Agent {
    let agent = Scenario::telegram_dm().build();
    if let Some(reply) = reply {
        agent.model.push(Script::text(reply));
    }
    agent.send(&alice(), text);
    agent.crash_at(failpoint);
    agent
}

/// Alice, Telegram user 42, whose private chat is perch's lane `tg-42-a69b25403314d72a`.
pub fn alice() -> User {
    User::human(42, "Alice")
}

/// `command` with nothing of the test's environment but PATH, on the namespace double and
/// perch's image cache.
pub fn on_the_double(command: &mut Command) -> &mut Command {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PERCH_SANDBOX", "namespace-double")
        .env("PERCH_CACHE", Places::from_environment().cache)
}

/// `perch run DIR` on the namespace double; stdin and stdout closed, stderr piped.
pub fn run_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    on_the_double(command.args(["run", dir.to_str().unwrap()]))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// A running `perch run`. Dropped while it runs (a test that failed before it stopped it), it is
/// killed, so a failing test leaves no process behind.
pub struct Perch {
    /// `None` once a method that waits for it has taken it.
    child: Option<Child>,
}

impl Drop for Perch {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Perch {
    pub fn spawn(mut command: Command) -> Perch {
        Perch {
            child: Some(command.spawn().unwrap()),
        }
    }

    fn running(&self) -> &Child {
        self.child
            .as_ref()
            .expect("perch run is held until a method waits for it")
    }

    fn into_child(mut self) -> Child {
        self.child
            .take()
            .expect("perch run is held until a method waits for it")
    }

    pub fn id(&self) -> u32 {
        self.running().id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        signal(self.id(), nix::sys::signal::Signal::SIGTERM);
    }

    /// SIGTERM, then its clean exit; returns its stderr.
    pub fn stop(self) -> String {
        self.terminate();
        self.finish()
    }

    /// SIGTERM, then at most `limit` for a clean exit; returns its stderr.
    pub fn stop_within(self, limit: Duration) -> String {
        self.terminate();
        let output = exits_within(self.into_child(), limit, "perch run after SIGTERM");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "perch run did not stop cleanly ({}): {stderr}",
            output.status
        );
        stderr
    }

    /// Waits for it to exit, asserts that it exited 0, and returns its stderr.
    pub fn finish(self) -> String {
        let output = self.wait();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "perch run did not stop cleanly: {stderr}"
        );
        stderr
    }

    /// SIGKILL; it must not have exited cleanly.
    pub fn kill(self) {
        signal(self.id(), nix::sys::signal::Signal::SIGKILL);
        let output = self.wait();
        assert!(!output.status.success());
    }

    /// Waits for it to exit by itself, which the failpoint `point` makes a failure.
    pub fn crashed(self, point: &str) -> Output {
        let output = self.wait();
        assert!(!output.status.success(), "the failpoint {point} fired");
        output
    }

    /// Waits for it to exit by itself.
    pub fn wait(self) -> Output {
        self.into_child().wait_with_output().unwrap()
    }

    /// Waits at most `limit` for it to exit by itself; fails the test naming `what` if it
    /// does not.
    pub fn wait_within(self, limit: Duration, what: &str) -> Output {
        exits_within(self.into_child(), limit, what)
    }

    /// Its exit status, if it exited within `limit`; killed otherwise.
    pub fn exit_within(self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.into_child();
        let mut exited = None;
        if !Poll::within(limit).holds(|| {
            exited = child.try_wait().unwrap();
            exited.is_some()
        }) {
            child.kill().unwrap();
        }
        let _ = child.wait_with_output();
        exited
    }
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        signal,
    )
    .unwrap();
}

/// Waits at most `limit` for `child` to exit; kills it and fails the test if it does not.
pub fn exits_within(mut child: Child, limit: Duration, what: &str) -> Output {
    if !Poll::within(limit).holds(|| child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not finish within {limit:?}");
    }
    child.wait_with_output().unwrap()
}

/// A `perch run` whose stderr is read line by line while it runs.
pub struct Watched {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Watched {
    pub fn spawn(mut command: Command) -> Watched {
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let reader = {
            let lines = std::sync::Arc::clone(&lines);
            std::thread::spawn(move || {
                use std::io::BufRead as _;
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            })
        };
        Watched {
            child,
            lines,
            reader,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Stops it with SIGTERM, asserts that it exited 0, and returns every line it wrote.
    pub fn stop(self) -> Vec<String> {
        let Watched {
            mut child,
            lines,
            reader,
        } = self;
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        let status = child.wait().unwrap();
        reader.join().unwrap();
        let lines = lines.lock().unwrap().clone();
        assert!(
            status.success(),
            "perch run did not stop cleanly: {lines:#?}"
        );
        lines
    }
}

/// Copies an example agent from `agents/` into a fresh directory, its `models.yml` pointed at
/// `model` (keeping its providers and models).
pub fn example_on(name: &str, model: &FakeModel) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("agents")
            .join(name),
        dir.path(),
    );
    let path = dir.path().join("models.yml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("https://api.openai.com/v1", &model.base_url())
        .replace("https://api.anthropic.com/v1", &model.base_url());
    std::fs::write(path, text).unwrap();
    dir
}

/// Rewrites `file` with each `(from, to)` replaced.
pub fn edit(file: &Path, replacements: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(file).unwrap();
    for (from, to) in replacements {
        text = text.replace(from, to);
    }
    std::fs::write(file, text).unwrap();
}
