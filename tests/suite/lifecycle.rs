//! `perch run` as a service manager sees it: readiness, watchdog, SIGTERM, metrics, JSON logs.

use super::support::fake_discord::{Author, BOT_ID};
use super::support::fake_model::{Gate, Script};
use super::support::fake_telegram::{TOKEN, User};
use super::support::scenario::{Perch, Scenario, Watched, alice, edit, example_on, run_command};
use super::support::wait::{WAIT, wait_until};
use super::support::{fake_discord, journal_lines};
use perch_core::config::Api;
use std::path::Path;
use std::time::{Duration, Instant};

/// The service manager's end of `NOTIFY_SOCKET`: a datagram socket in a temporary directory
/// that keeps every line `perch run` sends.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: String,
    socket: std::os::unix::net::UnixDatagram,
    lines: Vec<String>,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket {
            path: path.to_str().unwrap().to_owned(),
            _dir: dir,
            socket,
            lines: Vec::new(),
        }
    }

    /// Receives datagrams until one holds `line`; returns that line's index in [`Self::lines`].
    fn wait_for(&mut self, line: &str) -> usize {
        let deadline = Instant::now() + WAIT;
        let mut buffer = [0; 4096];
        loop {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {line}; received {:?}",
                self.lines
            );
            match self.socket.recv(&mut buffer) {
                Ok(length) => {
                    let first = self.lines.len();
                    let datagram = String::from_utf8_lossy(&buffer[..length]).into_owned();
                    self.lines.extend(datagram.lines().map(str::to_owned));
                    if let Some(found) = self.lines[first..].iter().position(|sent| sent == line) {
                        return first + found;
                    }
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => panic!("the notify socket failed: {error}"),
            }
        }
    }

    /// `perch run` of `agent`, telling this socket what systemd would hear, with `env` added.
    fn start(&self, agent: &super::support::scenario::Agent, env: &[(&str, &str)]) -> Perch {
        let mut command = agent.command();
        command
            .env("NOTIFY_SOCKET", &self.path)
            .envs(env.iter().copied());
        Perch::spawn(command)
    }
}

/// A watchdog interval of 400 ms (pings every 200 ms).
const WATCHDOG: (&str, &str) = ("WATCHDOG_USEC", "400000");

#[test]
fn systemd_is_told_ready_then_pinged_then_stopping() {
    let agent = Scenario::telegram_dm().build();
    let mut notify = NotifySocket::bind();
    let service = notify.start(&agent, &[WATCHDOG]);
    let ready = notify.wait_for("READY=1");
    assert_eq!(ready, 0, "READY=1 comes first: {:?}", notify.lines);
    assert!(
        agent.telegram().was_called("getMe"),
        "ready only once the channel's first connection is up"
    );
    assert_eq!(
        notify.lines.get(ready + 1).map(String::as_str),
        Some("STATUS=1 channel(s), inbox 0 waiting"),
        "READY=1 carries the status"
    );
    let first = notify.wait_for("WATCHDOG=1");
    let second = notify.wait_for("WATCHDOG=1");
    assert!(ready < first && first < second);
    assert!(
        notify.lines[first..]
            .iter()
            .any(|line| line.starts_with("STATUS=")),
        "a ping refreshes the status: {:?}",
        notify.lines
    );
    service.terminate();
    notify.wait_for("STOPPING=1");
    service.finish();
}

#[test]
fn a_command_reply_held_by_a_rate_limit_holds_up_neither_the_watchdog_nor_other_chats() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    telegram.rate_limit("sendMessage", None, 120);
    let mut notify = NotifySocket::bind();
    let service = notify.start(&agent, &[WATCHDOG]);
    notify.wait_for("READY=1");
    agent.send(&alice(), "/status");
    wait_until("the reply to be rate-limited", || {
        telegram.calls_to("sendMessage").contains(&42)
    });
    let held = Instant::now();

    // The reply waits out its 120 s; the loop that pings the watchdog goes on.
    notify.wait_for("WATCHDOG=1");
    notify.wait_for("WATCHDOG=1");
    wait_until("the command's event to be consumed", || {
        let status = agent.status();
        status.inbox_pending == 0 && status.outbox_pending == 1
    });
    model.push(Script::text("hello Bob"));
    agent.send(&User::human(43, "Bob"), "is anyone there?");
    wait_until("Bob's message to reach the model", || {
        model
            .requests()
            .iter()
            .any(|request| request.body.to_string().contains("is anyone there?"))
    });
    notify.wait_for("WATCHDOG=1");
    assert!(
        held.elapsed() < Duration::from_secs(60),
        "all of it well within the rate limit's 120 s"
    );
    assert!(
        telegram.sent().is_empty(),
        "nothing got past the rate limit"
    );
    let stopping = Instant::now();
    service.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(30),
        "a delivery waiting out a rate limit does not hold up the stop"
    );
}

/// The ids of operations started in any lane of `dir` and never finished.
fn open_operations(dir: &Path) -> Vec<String> {
    let mut started = Vec::new();
    let mut finished = Vec::new();
    for value in journal_lines(&dir.join(".perch/sessions")) {
        let op = value["op"].as_str().unwrap_or_default().to_owned();
        match value["type"].as_str() {
            Some("operation_started") => started.push(op),
            Some("operation_finished") => finished.push(op),
            _ => {}
        }
    }
    assert!(!started.is_empty(), "a run was recorded");
    started.retain(|op| !finished.contains(op));
    started
}

#[test]
fn sigterm_lets_a_run_in_progress_finish_and_post_its_reply() {
    let agent = Scenario::telegram_dm().build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let gate = Gate::new();
    model.push(Script::held(Script::text("finished while draining"), &gate));
    let mut notify = NotifySocket::bind();
    let service = notify.start(&agent, &[]);
    notify.wait_for("READY=1");
    let pushed = agent.send(&alice(), "take your time");
    wait_until("the model to be asked", || model.requests().len() == 1);
    service.terminate();
    notify.wait_for("STOPPING=1");
    assert!(telegram.sent().is_empty(), "the reply is still held");
    gate.open();
    let stderr = service.finish();
    let sent = telegram.sent();
    assert_eq!(sent.len(), 1, "{stderr}");
    assert_eq!(sent[0].shown, "finished while draining");
    assert_eq!(sent[0].reply_to, Some(pushed.message_id));
    assert_eq!(
        open_operations(agent.path()),
        Vec::<String>::new(),
        "the run was recorded as finished"
    );

    let service = notify.start(&agent, &[]);
    let ready = notify.wait_for("READY=1");
    assert_eq!(
        notify.lines.get(ready + 1).map(String::as_str),
        Some("STATUS=1 channel(s), inbox 0 waiting"),
        "the answered message was consumed"
    );
    service.stop();
    assert_eq!(model.requests().len(), 1, "nothing was answered twice");
    assert_eq!(telegram.sent().len(), 1);
}

#[test]
fn a_channel_that_cannot_connect_does_not_hold_readiness_back() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let agent = Scenario::telegram_at(&url).build();
    let mut notify = NotifySocket::bind();
    let service = notify.start(&agent, &[]);
    notify.wait_for("READY=1");
    service.terminate();
    notify.wait_for("STOPPING=1");
    service.finish();
}

/// One HTTP/1.1 request to `address`; the status line and the body.
fn http_get(address: &str, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample `series` (name and labels, exactly) in a scrape.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().unwrap())
    })
}

#[test]
fn metrics_count_a_telegram_exchange_and_json_logs_are_one_object_per_line() {
    let agent = Scenario::telegram_dm().build();
    agent.model.push(Script::text("Hello Alice!"));
    let mut command = agent.command();
    command.args(["--metrics=127.0.0.1:0", "--log-format", "json"]);
    let perch = Watched::spawn(command);
    let mut address = None;
    wait_until("the metrics address", || {
        address = perch.lines().iter().find_map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).ok()?;
            line["message"]
                .as_str()?
                .starts_with("metrics on http://")
                .then(|| line["fields"]["address"].as_str().unwrap().to_owned())
        });
        address.is_some()
    });
    let address = address.unwrap();

    agent.send(&alice(), "hi there");
    agent.wait_for_a_reply();
    let mut scrape = String::new();
    wait_until("the delivery to be counted", || {
        let (status, body) = http_get(&address, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        scrape = body;
        sample(&scrape, "perch_events_out_total{channel=\"tg\"}") == Some(1.0)
    });
    for (series, value) in [
        ("perch_events_in_total{channel=\"tg\"}", 1.0),
        (
            "perch_deliveries_total{channel=\"tg\",outcome=\"receipt\"}",
            1.0,
        ),
        ("perch_model_tokens_total{direction=\"input\"}", 20.0),
        ("perch_model_tokens_total{direction=\"output\"}", 10.0),
        ("perch_run_duration_seconds_count", 1.0),
        ("perch_run_duration_seconds_bucket{le=\"+Inf\"}", 1.0),
        ("perch_vm_boots_total", 0.0),
    ] {
        assert_eq!(sample(&scrape, series), Some(value), "{series}:\n{scrape}");
    }
    for name in [
        "perch_tool_calls_total",
        "perch_heartbeat_outcomes_total",
        "perch_inbox_depth",
    ] {
        assert!(
            scrape.contains(&format!("# TYPE {name} ")),
            "{name}:\n{scrape}"
        );
    }
    assert_eq!(http_get(&address, "/").0, "HTTP/1.1 404 Not Found");

    let lines = perch.stop();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(!line.contains(TOKEN), "the token leaked: {line}");
        let parsed: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(parsed[key].is_string(), "{key} in {line}");
        }
        assert!(parsed["fields"].is_object(), "{line}");
    }
    let messages: Vec<String> = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line["message"].as_str().map(str::to_owned))
        .collect();
    assert!(
        messages
            .iter()
            .any(|message| message.starts_with("running ")),
        "{lines:#?}"
    );
    assert!(
        messages.iter().any(|message| message == "stopped"),
        "{lines:#?}"
    );
    let listening: serde_json::Value = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["fields"]["address"] == address.as_str())
        .unwrap();
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["target"], "perch");
}

#[test]
fn metrics_on_an_address_other_than_loopback_are_warned_about() {
    let agent = Scenario::telegram_dm().build();
    let mut command = agent.command();
    command.arg("--metrics=0.0.0.0:0");
    let perch = Watched::spawn(command);
    wait_until("the warning", || {
        perch
            .lines()
            .iter()
            .any(|line| line.starts_with("perch: warning: ") && line.contains("not a loopback"))
    });
    let lines = perch.stop();
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("perch: metrics on http://0.0.0.0:")),
        "{lines:#?}"
    );
}

#[test]
fn the_helpdesk_example_answers_on_discord_while_its_matrix_channel_cannot_connect() {
    let model = super::support::fake_model::FakeModel::start(Api::OpenAiResponses);
    let discord = fake_discord::FakeDiscord::start();
    discord.guild_channel(555);
    let dir = example_on("helpdesk", &model);
    edit(
        &dir.path().join("channels/discord.lua"),
        &[
            ("REPLACE-with-the-helpdesk-channel-id", "555"),
            (
                "kind = \"discord\",",
                &format!("kind = \"discord\", api_url = {:?},", discord.url()),
            ),
        ],
    );
    model.push(Script::text(
        "See knowledge/vpn.md: reconnect with the new profile.",
    ));
    let mut command = run_command(dir.path());
    command.envs([
        ("DISCORD_TOKEN", fake_discord::TOKEN),
        ("OPENAI_API_KEY", "sk-test-helpdesk"),
        ("MATRIX_PASSWORD", "unused"),
        ("MATRIX_STORE_PASSPHRASE", "unused-passphrase"),
    ]);
    let service = Perch::spawn(command);
    wait_until("the gateway session", || discord.live_sessions() > 0);
    discord.push_message(
        555,
        &Author::user(77, "Dana"),
        &format!("<@{BOT_ID}> the VPN drops every hour"),
    );
    wait_until("the answer", || !discord.posted().is_empty());
    let connection = |kind: &str| {
        super::support::status::status(dir.path())
            .channel_health
            .unwrap()
            .into_iter()
            .find(|channel| channel.kind == kind)
            .unwrap()
            .connection
    };
    wait_until("the Matrix channel to report its failure", || {
        connection("matrix").starts_with("reconnecting")
    });
    assert_eq!(connection("discord"), "receiving");
    service.stop();
    assert_eq!(discord.posted().len(), 1);
    assert_eq!(
        discord.posted()[0].body["content"],
        "See knowledge/vpn.md: reconnect with the new profile."
    );
    let asked = model.requests()[0].body.to_string();
    assert!(asked.contains("the VPN drops every hour"), "{asked}");
}
