//! `perch status`: its text and JSON from fixtures, and channel health while `perch run` runs.

use super::support::fake_model::Script;
use super::support::fake_telegram::Failure;
use super::support::scenario::{Scenario, alice, crash_on_one_message};
use super::support::status::{Report, status};
use super::support::wait::wait_until;
use super::support::{new_agent, perch, stderr, stdout, write};
use perch_core::config::Api;
use perch_core::control::SpendStatus;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const LAST_START: &str = r#"{
  "channels_paused": null,
  "inbox": {
    "already_answered": 1,
    "decided_again": 0,
    "noted_as_interrupted": 0,
    "queued_again": 2,
    "rejected_as_interrupted": 0,
    "replied_after_restart": 1,
    "resumed": 1
  },
  "lanes_recovered": {
    "tg-42": {
      "operations_closed": 1,
      "tools_interrupted": 0,
      "tools_rerun": 1
    }
  },
  "outbox": {
    "expired": 0,
    "resent": 1,
    "unknown": 1
  },
  "started": "2026-12-02T06:00:00.123456789+00:00"
}"#;

const INBOX: &str = concat!(
    r#"{"kind":"header","version":1,"segment":1,"created":"2026-12-02T05:59:00Z"}"#,
    "\n",
    r#"{"kind":"item","seq":1,"at":"2026-12-02T06:10:00Z","body":{"type":"event","channel":"tg","event":{"platform_id":"42:17","cursor":"1001","room":"42","thread":null,"sender":{"id":"42","name":"Ada","is_bot":false},"direct":true,"addressed":true,"text":"hello","sent_at":"2026-12-02T06:09:59Z"}}}"#,
    "\n",
    r#"{"kind":"item","seq":2,"at":"2026-12-02T06:10:01Z","body":{"type":"verdict","event":1,"verdict":{"verdict":"item","lane":"tg-42","text":"hello"}}}"#,
    "\n",
);

const OUTBOX: &str = concat!(
    r#"{"kind":"header","version":1,"segment":1,"created":"2026-12-02T05:59:00Z"}"#,
    "\n",
    r#"{"kind":"item","seq":1,"at":"2026-12-02T06:00:00Z","body":{"type":"intent","channel":"tg","delivery":{"id":"d0123456789abcdef01234567","room":"42","thread":null,"reply_to":"42:16","text":"hi"}}}"#,
    "\n",
    r#"{"kind":"item","seq":2,"at":"2026-12-02T06:00:01Z","body":{"type":"unknown","intent":1,"reason":"perch stopped between recording this delivery and its receipt"}}"#,
    "\n",
    r#"{"kind":"consumed","seqs":[1,2],"at":"2026-12-02T06:00:01Z"}"#,
    "\n",
);

/// The spend journal with two replies and the owner told of the cap, all at `now`.
fn spend(now: &str) -> String {
    [
        format!(r#"{{"kind":"header","version":1,"segment":1,"created":"{now}"}}"#),
        format!(
            r#"{{"kind":"item","seq":1,"at":"{now}","body":{{"type":"usage","at":"{now}","lane":"tg-42","model":"fake/m1","input":100,"output":20,"cached":0,"cost":1250000}}}}"#
        ),
        format!(
            r#"{{"kind":"item","seq":2,"at":"{now}","body":{{"type":"usage","at":"{now}","lane":"heartbeat-digest","model":"fake/m1","input":25,"output":5,"cached":0,"cost":125}}}}"#
        ),
        format!(
            r#"{{"kind":"item","seq":3,"at":"{now}","body":{{"type":"told","at":"{now}","level":"all"}}}}"#
        ),
        String::new(),
    ]
    .join("\n")
}

/// `perch status --json` of the fixture; `{last_start}` stands for [`LAST_START`], `{day}` for the
/// UTC day.
const GOLDEN_JSON: &str = r#"{
  "approved_senders": 0,
  "channel_health": null,
  "channels": [
    "tg (telegram)"
  ],
  "channels_paused": null,
  "deliveries_unknown": [
    {
      "intent": 1,
      "reason": "perch stopped between recording this delivery and its receipt",
      "type": "unknown"
    }
  ],
  "heartbeats": {
    "reload_error": null,
    "tasks": []
  },
  "inbox_oldest_waiting": "2026-12-02T06:10:00+00:00",
  "inbox_pending": 2,
  "inbox_unreadable": [],
  "lanes_with_open_operations": {},
  "last_events": {
    "tg": {
      "at": "2026-12-02T06:10:00+00:00",
      "platform_id": "42:17"
    }
  },
  "last_start": {last_start},
  "live_error": null,
  "outbox_pending": 0,
  "outbox_unreadable": [],
  "pairing_unreadable": null,
  "pairings_pending": [],
  "pid": null,
  "refusals": [],
  "restart_needed": [],
  "running": false,
  "spend_today": {
    "cost": "1.250125",
    "day": "{day}",
    "tokens": 150,
    "told": "all"
  },
  "started": null,
  "state": "stopped",
  "undecryptable": {},
  "uptime_seconds": null,
  "vm": "stopped (no perch run holds it)"
}
"#;

/// `perch status` of the fixture in UTC, how long ago each time was left out (`(AGO)`).
const GOLDEN_TEXT: &str = "state              stopped (no perch run answers on .perch/control.sock)
channels           tg (telegram)
  tg               stopped; last event 2026-12-02 06:10:00 (AGO)
inbox pending      2, the oldest since 2026-12-02 06:10:00 (AGO)
vm                 stopped (no perch run holds it)
last start         2026-12-02 06:00:00 (AGO): 1 lane recovered; outbox: 1 resent, 1 unknown; inbox: 1 already answered, 1 replied after the restart, 1 resumed, 2 queued again
spend today        150 tokens, cost 1.250125 (UTC day {day}); a cap was reached today
outbox pending     0
unknown deliveries 1
  perch stopped between recording this delivery and its receipt
pairings pending   0
";

fn fixture() -> tempfile::TempDir {
    let dir = new_agent();
    write(
        dir.path(),
        "channels/tg.lua",
        "channel {\n  kind = \"telegram\",\n  token = env \"TELEGRAM_TOKEN\",\n  dm = \"allow\",\n}\n",
    );
    write(dir.path(), ".perch/last-start.json", LAST_START);
    write(dir.path(), ".perch/inbox/000001.jsonl", INBOX);
    write(dir.path(), ".perch/outbox/000001.jsonl", OUTBOX);
    dir
}

/// `perch status` (with `args`) of `dir` with the spend journal written now, and the UTC day it
/// was written on; again if a day ended in between.
fn status_today(dir: &Path, args: &[&str]) -> (String, String) {
    loop {
        let now = chrono::Utc::now();
        write(
            dir,
            ".perch/spend/000001.jsonl",
            &spend(&now.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()),
        );
        let mut all = vec!["status", dir.to_str().unwrap()];
        all.extend(args);
        let output = perch(&all, &[("TZ", "UTC")]);
        assert_eq!(
            output.status.code(),
            Some(3),
            "not running: {}",
            stderr(&output)
        );
        if chrono::Utc::now().date_naive() == now.date_naive() {
            return (stdout(&output), now.date_naive().to_string());
        }
    }
}

#[test]
fn status_json_of_what_perch_wrote_is_golden() {
    let dir = fixture();
    let (json, day) = status_today(dir.path(), &["--json"]);
    let last_start = LAST_START.replace('\n', "\n  ");
    assert_eq!(
        json,
        GOLDEN_JSON
            .replace("{last_start}", &last_start)
            .replace("{day}", &day)
    );
}

#[test]
fn status_text_of_what_perch_wrote_is_golden() {
    let dir = fixture();
    let (text, day) = status_today(dir.path(), &[]);
    assert_eq!(
        super::support::status::without_ages(&text),
        GOLDEN_TEXT.replace("{day}", &day)
    );
}

#[test]
fn a_spend_journal_that_cannot_be_read_is_an_error_in_status_json_and_no_line_in_the_text() {
    let dir = new_agent();
    write(dir.path(), ".perch/spend", "not a directory");
    let path = dir.path().to_str().unwrap();
    let report = status(dir.path());
    assert_eq!(
        report.spend_today,
        SpendStatus::Unknown {
            error: format!("could not list {path}/.perch/spend: Not a directory (os error 20)")
        }
    );
    assert_eq!(report.last_start, None);
    let text = stdout(&perch(&["status", path], &[]));
    assert!(!text.contains("spend today"), "{text}");
    assert!(!text.contains("last start"), "{text}");
}

#[test]
fn status_with_an_unreadable_pairing_file_names_it_and_the_fix_and_shows_the_rest() {
    let agent = Scenario::telegram_dm().build();
    let pairing = agent.path().join(".perch/pairing.json");
    std::fs::create_dir_all(agent.path().join(".perch")).unwrap();

    for unreadable in ["garbage", "directory"] {
        if unreadable == "garbage" {
            std::fs::write(&pairing, "{\"pending\": [oops").unwrap();
        } else {
            std::fs::remove_file(&pairing).unwrap();
            std::fs::create_dir(&pairing).unwrap();
        }
        let report = agent.status();
        let problem = report.pairing_unreadable.unwrap();
        assert!(
            problem.contains(&pairing.display().to_string()) && problem.contains("move it aside"),
            "{unreadable}: {problem}"
        );
        assert!(report.pairings_pending.is_empty(), "{unreadable}");
        assert_eq!(report.channels, ["tg (telegram)"]);
        assert_eq!(report.inbox_pending, 0);

        let output = agent.perch(&["status"]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(3),
            "{unreadable}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|line| line.starts_with("pairings pending"))
            .unwrap_or_else(|| panic!("{unreadable}: no pairing line in:\n{text}"));
        assert!(
            lines[at].contains("unknown: cannot read") && lines[at].contains(".perch/pairing.json"),
            "{unreadable}: {text}"
        );
        assert!(
            lines[at + 1].starts_with("  fix: ")
                && lines[at + 1].contains("move it aside")
                && lines[at + 1].ends_with("`perch run` does not start until then"),
            "{unreadable}: {text}"
        );
        for rest in [
            "state              stopped",
            "channels           tg (telegram)",
            "inbox pending",
            "vm ",
            "outbox pending",
        ] {
            assert!(text.contains(rest), "{unreadable}: no {rest:?} in:\n{text}");
        }
    }

    std::fs::remove_dir(&pairing).unwrap();
    assert_eq!(agent.status().pairing_unreadable, None);
}

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the failpoints feature")]
fn status_shows_what_a_crash_left_and_what_the_next_start_recovered() {
    let agent = crash_on_one_message(Some("never sent"), "hello", "after:operation_started");
    let lane = "tg-42-a69b25403314d72a";

    let status = agent.status();
    assert!(!status.running);
    assert_eq!(
        status.inbox_pending, 2,
        "the event and its verdict wait: {status:?}"
    );
    assert!(status.inbox_oldest_waiting.is_some());
    assert_eq!(
        status.lanes_with_open_operations,
        BTreeMap::from([(lane.to_owned(), 1)])
    );
    assert!(status.last_events.contains_key("tg"));
    assert_eq!(status.vm, "stopped (no perch run holds it)");

    let service = agent.start();
    wait_until("the service to answer and the resumed run to end", || {
        let status = agent.status();
        status.running && status.inbox_pending == 0
    });
    let status = agent.status();
    let start = status.last_start.clone().unwrap();
    assert_eq!(
        start.lanes_recovered[lane].operations_closed, 1,
        "{status:?}"
    );
    assert_eq!(start.inbox.resumed, 1, "{status:?}");
    assert_eq!(status.lanes_with_open_operations, BTreeMap::new());
    assert_eq!(status.restart_needed, Vec::<String>::new());
    service.stop();
}

#[test]
fn an_edit_to_a_file_loaded_at_start_is_reported_as_needing_a_restart() {
    let agent = Scenario::telegram_dm().build();
    let service = agent.start();
    agent.wait_for_service();
    let agent_lua = std::fs::read_to_string(agent.path().join("agent.lua")).unwrap();
    agent.write("agent.lua", &format!("{agent_lua}-- tuned\n"));
    agent.write("workspace/notes/today.md", "live, no restart\n");
    wait_until("the change to be noticed", || {
        agent.status().restart_needed == ["agent.lua"]
    });
    let stderr = service.stop();
    let noticed = "agent.lua changed since perch run started";
    assert!(stderr.contains(noticed), "{stderr}");
}

#[test]
fn a_refused_token_shows_as_stopped_and_unhealthy_and_is_told_once() {
    let agent = Scenario::telegram_dm().build();
    let mut command = agent.command();
    command.env("TELEGRAM_TOKEN", "1:not-the-token");
    let service = super::support::scenario::Perch::spawn(command);
    wait_until("the refusal to show", || {
        agent.status().connection().starts_with("stopped: ")
    });
    let report = agent.status();
    assert!(!report.channel(0).unwrap().healthy, "{report:?}");
    let line = format!(
        "  tg               {}; UNHEALTHY: not receiving\n",
        agent.status().connection()
    );
    let text = agent.status_text();
    assert!(text.contains(&line), "{line:?} in:\n{text}");
    let stderr = service.stop();
    assert_eq!(
        stderr
            .matches("alert (channel): channel tg is stopped: ")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-token"), "{stderr}");
    let refused = stderr
        .lines()
        .find(|line| line.contains("channel tg: Telegram refused the bot token"))
        .unwrap_or_else(|| panic!("no refusal line in {stderr}"));
    assert!(
        refused.contains("check TELEGRAM_TOKEN, which channels/tg.lua names"),
        "the line names the variable: {refused}"
    );
}

#[test]
fn a_channel_whose_endpoint_cannot_be_reached_says_which_url() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let agent = Scenario::telegram_at(&url).build();
    let service = super::support::scenario::Watched::spawn(agent.command());
    let mut reconnecting = None;
    wait_until("the channel to say it reconnects", || {
        reconnecting = service
            .lines()
            .into_iter()
            .find(|line| line.contains("channel tg: ") && line.contains("reconnecting"));
        reconnecting.is_some()
    });
    let line = reconnecting.unwrap_or_default();
    assert!(line.contains(&url), "the line names {url}: {line}");
    assert!(
        !line.contains(super::support::fake_telegram::TOKEN),
        "never the token: {line}"
    );
    service.stop();
}

/// Once the service answers status, its first channel shows `connecting` and unhealthy at every
/// look for `watched`.
fn stays_connecting(dir: &Path, watched: Duration) {
    wait_until("the service to answer status", || status(dir).running);
    let watched_until = Instant::now() + watched;
    while Instant::now() < watched_until {
        let status = status(dir);
        let channel = status.channel(0).unwrap();
        assert_eq!(channel.connection, "connecting", "{status:?}");
        assert!(!channel.healthy, "{status:?}");
    }
}

/// A channel whose server takes connections and never answers: the listener, and the URL.
fn silent_server() -> (std::net::TcpListener, String) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    (silent, url)
}

#[test]
fn a_telegram_channel_whose_server_never_answers_stays_connecting_and_unhealthy() {
    let (silent, url) = silent_server();
    let agent = Scenario::telegram_at(&url).build();
    let service = agent.start();
    stays_connecting(agent.path(), Duration::from_secs(3));
    let text = String::from_utf8_lossy(&agent.perch(&["status"]).stdout).into_owned();
    assert!(
        text.contains("tg               connecting; UNHEALTHY: not receiving"),
        "{text}"
    );
    service.stop();
    drop(silent);
}

#[test]
fn a_matrix_channel_whose_homeserver_never_answers_stays_connecting_through_login() {
    let (silent, url) = silent_server();
    let agent = Scenario::channel_lua(
        "channels/tg.lua",
        &format!(
            "channel {{ kind = \"matrix\", homeserver = {url:?}, user = \"@bot:localhost\",\n  \
             password = env \"MATRIX_PASSWORD\", store_passphrase = env \"MATRIX_STORE_PASSPHRASE\" }}\n"
        ),
    )
    .env("MATRIX_PASSWORD", "unused-password")
    .env("MATRIX_STORE_PASSPHRASE", "unused-passphrase")
    .build();
    let service = agent.start();
    stays_connecting(agent.path(), Duration::from_secs(3));
    service.stop();
    drop(silent);
}

#[test]
fn a_telegram_channel_is_receiving_and_healthy_once_its_first_poll_is_answered() {
    let agent = Scenario::telegram_dm().build();
    let service = agent.start();
    wait_until("the channel to be receiving", || agent.status().receiving());
    assert!(
        agent.telegram().was_called("getMe"),
        "the Bot API was asked before the channel counted as receiving"
    );
    service.stop();
}

#[test]
fn a_telegram_poll_that_fails_shows_reconnecting_with_its_reason_then_receiving_again() {
    let agent = Scenario::telegram_dm().build();
    let service = agent.start();
    let connection = || agent.status().connection();
    wait_until("the channel to be receiving", || {
        connection() == "receiving"
    });
    agent.telegram().fail_next(
        "getUpdates",
        Failure::Api {
            code: 400,
            description: "Bad Request: the fake refuses one poll".to_owned(),
        },
    );
    agent.model.push(Script::text("back"));
    // The message ends the poll in progress, so the failing one comes next.
    agent.send(&alice(), "still there?");
    wait_until("the failure to show", || {
        let shown = connection();
        shown.starts_with("reconnecting: ") && shown.contains("the fake refuses one poll")
    });
    wait_until("the channel to be receiving again", || {
        connection() == "receiving"
    });
    agent.wait_for_replies(1);
    service.stop();
}

#[test]
fn a_lone_status_command_does_not_count_itself_as_waiting() {
    let agent = Scenario::telegram_dm().build();
    let service = agent.start();
    agent.send(&alice(), "/status");
    agent.wait_for_a_reply();
    let reply = agent.telegram().sent()[0].shown.clone();
    assert!(reply.contains(", 0 inbox item(s) waiting,"), "{reply}");
    service.stop();
}

/// A Discord agent answering direct messages, on the Anthropic Messages API.
fn discord_on_anthropic() -> super::support::scenario::Agent {
    Scenario::discord("dm = \"allow\"")
        .model(Api::AnthropicMessages)
        .build()
}

#[test]
fn a_discord_channel_is_connecting_until_the_gateway_is_ready() {
    let agent = discord_on_anthropic();
    agent.discord().freeze_gateway();
    let service = agent.start();
    stays_connecting(agent.path(), Duration::from_secs(2));
    service.stop();
}

#[test]
fn a_discord_channel_is_receiving_once_the_gateway_is_ready() {
    let agent = discord_on_anthropic();
    let service = agent.start();
    wait_until("the channel to be receiving", || agent.status().receiving());
    assert!(agent.discord().live_sessions() > 0);
    service.stop();
}
