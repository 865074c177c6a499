//! `perch status` of a directory no `perch run` holds, from fixture files in the formats perch
//! writes (`.perch/last-start.json`, the spend, inbox and outbox journals): the text and the JSON,
//! byte for byte.

use super::support::{new_agent, perch, stderr, stdout, write};
use std::path::Path;

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
  "last_start": {
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
  },
  "live_error": null,
  "outbox_pending": 0,
  "outbox_unreadable": [],
  "pairing_unreadable": null,
  "pairings_pending": [],
  "restart_needed": [],
  "running": false,
  "spend_today": {
    "cost": "1.250125",
    "day": "{day}",
    "tokens": 150,
    "told": "all"
  },
  "undecryptable": {},
  "vm": "stopped (no perch run holds it)"
}
"#;

const GOLDEN_TEXT: &str = "running            no
channels           tg (telegram)
inbox pending      2 (oldest since 2026-12-02T06:10:00+00:00)
last event         tg: 2026-12-02T06:10:00+00:00
vm                 stopped (no perch run holds it)
last start         2026-12-02T06:00:00.123456789+00:00: 1 lane(s) recovered, outbox {\"expired\":0,\"resent\":1,\"unknown\":1}, inbox {\"already_answered\":1,\"decided_again\":0,\"noted_as_interrupted\":0,\"queued_again\":2,\"rejected_as_interrupted\":0,\"replied_after_restart\":1,\"resumed\":1}
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
        let output = perch(&all, &[]);
        assert!(output.status.success(), "{}", stderr(&output));
        if chrono::Utc::now().date_naive() == now.date_naive() {
            return (stdout(&output), now.date_naive().to_string());
        }
    }
}

#[test]
fn status_json_of_what_perch_wrote_is_golden() {
    let dir = fixture();
    let (json, day) = status_today(dir.path(), &["--json"]);
    assert_eq!(json, GOLDEN_JSON.replace("{day}", &day));
}

#[test]
fn status_text_of_what_perch_wrote_is_golden() {
    let dir = fixture();
    let (text, day) = status_today(dir.path(), &[]);
    assert_eq!(text, GOLDEN_TEXT.replace("{day}", &day));
}

#[test]
fn a_spend_journal_that_cannot_be_read_is_an_error_in_status_json_and_no_line_in_the_text() {
    let dir = new_agent();
    write(dir.path(), ".perch/spend", "not a directory");
    let path = dir.path().to_str().unwrap();
    let output = perch(&["status", path, "--json"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["spend_today"],
        serde_json::json!({
            "error": format!("could not list {path}/.perch/spend: Not a directory (os error 20)")
        })
    );
    assert_eq!(report["last_start"], serde_json::Value::Null);
    let text = stdout(&perch(&["status", path], &[]));
    assert!(!text.contains("spend today"), "{text}");
    assert!(!text.contains("last start"), "{text}");
}

#[test]
fn a_refused_token_shows_as_stopped_and_unhealthy_and_is_told_once() {
    use super::fake_model::FakeModel;
    use super::fake_telegram::FakeTelegram;
    use super::service::{launch, status_json, stop, telegram_agent, wait_until};
    let model = FakeModel::start(perch_core::config::Api::OpenAiCompletions);
    let telegram = FakeTelegram::start();
    let dir = telegram_agent(&model, &telegram);
    let child = launch(dir.path(), ("TELEGRAM_TOKEN", "1:not-the-token"), None);
    let connection = || {
        status_json(dir.path())["channel_health"][0]["connection"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    wait_until("the refusal to show", || {
        connection().starts_with("stopped: ")
    });
    let report = status_json(dir.path());
    assert_eq!(report["channel_health"][0]["healthy"], false, "{report}");
    let text = stdout(&perch(&["status", dir.path().to_str().unwrap()], &[]));
    let line = format!(
        "  tg               {}; UNHEALTHY: not receiving\n",
        connection()
    );
    assert!(text.contains(&line), "{line:?} in:\n{text}");
    let stderr = stop(child);
    assert_eq!(
        stderr
            .matches("alert (channel): channel tg is stopped: ")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-token"), "{stderr}");
}
