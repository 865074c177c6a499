//! The wire formats of `.perch/control.sock` and of `perch status --json`: one type for each
//! request, reply and report, and one reader for each. The golden tests below pin the JSON, so
//! a change to either is deliberate.
//!
//! A connection carries one request line and one reply line. A reply is `{"ok": true, ...}` with
//! the fields of its body, or `{"ok": false, "error": "..."}`.

use crate::Timestamp;
use crate::heartbeat::SlotOutcome;
use crate::spend::SpendToday;
use crate::starts::LastStart;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A request to the running service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum ControlRequest {
    /// `perch pair approve CODE` or `CHANNEL:USER_ID`.
    PairApprove {
        #[serde(flatten)]
        who: Who,
    },
    /// `perch pair deny CODE` or `CHANNEL:USER_ID`.
    PairDeny {
        #[serde(flatten)]
        who: Who,
    },
    /// `perch pair revoke CHANNEL:USER_ID`.
    PairRevoke {
        channel: String,
        sender: String,
    },
    /// `perch pair list`.
    PairList,
    Status,
    HeartbeatRun {
        task: String,
        dry_run: bool,
    },
    HeartbeatResume {
        task: String,
    },
    HeartbeatList,
}

impl ControlRequest {
    /// Reads one request line.
    pub fn read(line: &str) -> Result<ControlRequest, String> {
        serde_json::from_str(line).map_err(|error| format!("a bad request: {error}"))
    }
}

/// Who is on the other end of a control connection, as the kernel says (`SO_PEERCRED` and
/// `SO_PEERGROUPS`): nothing the client writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// Who the control socket answers: root, the agent's own user, and, when the agent directory
/// names one, the members of its operators' group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlAccess {
    /// The uid perch runs as.
    pub own_uid: u32,
    /// The operators' group (the agent directory's group when the directory is set-group-id).
    pub operators: Option<u32>,
}

impl ControlAccess {
    /// `Ok` when `peer` may use the socket; otherwise why not, for the refusal and the log.
    pub fn admits(&self, peer: &Peer) -> Result<(), String> {
        let in_operators = self
            .operators
            .is_some_and(|gid| peer.gid == gid || peer.groups.contains(&gid));
        if peer.uid == 0 || peer.uid == self.own_uid || in_operators {
            return Ok(());
        }
        Err(match self.operators {
            Some(gid) => format!(
                "uid {} is not root, the agent's user (uid {}) or in its operators' group (gid {gid})",
                peer.uid, self.own_uid
            ),
            None => format!(
                "uid {} is not root or the agent's user (uid {})",
                peer.uid, self.own_uid
            ),
        })
    }
}

/// The reply to a request: its body, or why it was refused.
pub type Reply<T> = Result<T, String>;

/// A reply as its line's JSON: the body's fields beside `"ok": true`, or `"ok": false` and the
/// error. A body that is not a JSON object cannot be encoded; that is a refusal too.
pub fn encode_reply<T: Serialize>(reply: &Reply<T>) -> serde_json::Value {
    let refused = |error: &str| serde_json::json!({ "ok": false, "error": error });
    match reply {
        Err(error) => refused(error),
        Ok(body) => match serde_json::to_value(body) {
            Ok(serde_json::Value::Object(mut fields)) => {
                fields.insert("ok".into(), serde_json::Value::Bool(true));
                serde_json::Value::Object(fields)
            }
            Ok(_) => refused("the reply is not a JSON object"),
            Err(error) => refused(&format!("the reply did not encode: {error}")),
        },
    }
}

/// Reads a reply line. The outer error says the line is not a reply of this kind; the inner one
/// is the service's refusal.
pub fn read_reply<T: DeserializeOwned>(line: &str) -> Result<Reply<T>, String> {
    let nonsense = |error: String| format!("the service answered nonsense: {error}");
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| nonsense(error.to_string()))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err(nonsense("not a JSON object".into()));
    };
    match fields.remove("ok") {
        Some(serde_json::Value::Bool(true)) => T::deserialize(serde_json::Value::Object(fields))
            .map(Ok)
            .map_err(|error| nonsense(error.to_string())),
        Some(serde_json::Value::Bool(false)) => Ok(Err(fields
            .get("error")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("the service refused the request without saying why")
            .to_owned())),
        _ => Err(nonsense("no \"ok\" field".into())),
    }
}

pub use crate::pairing::{Approved, PendingPair, Who};

/// The reply to `pair-approve`: the sender now approved, and whether a notice telling them so
/// was recorded in the outbox (it is not when no direct message from them is known).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairApproved {
    pub channel: String,
    pub sender: String,
    pub name: String,
    pub told: bool,
}

/// The reply to `pair-deny` and `pair-revoke`: whose request was dropped, or who is no longer
/// approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairSender {
    pub channel: String,
    pub sender: String,
    pub name: String,
}

/// The reply to `pair-list`, and what `perch pair list --json` prints: the pending requests
/// (oldest first) and the approved senders.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairListed {
    pub pending: Vec<PendingPair>,
    pub approved: Vec<Approved>,
}

/// The reply to `heartbeat-run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRan {
    pub end: RunEnd,
}

/// How a heartbeat run ended, as `perch heartbeat run` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// The outcome in one line.
    pub outcome: String,
    /// Whether the reply was a valid verdict.
    pub valid: bool,
    pub detail: SlotOutcome,
    /// The model's last reply, as judged.
    pub reply: String,
    /// Why the task stopped until it is resumed, when this run stopped it.
    pub stopped: Option<String>,
}

/// The reply to `heartbeat-resume`: nothing beside `"ok": true`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {}

/// The reply to `heartbeat-list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatListed {
    pub list: HeartbeatList,
}

/// The heartbeat tasks and their state, as `perch heartbeat list --json` prints them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatList {
    pub tasks: Vec<TaskRow>,
    /// Why the last edit of HEARTBEAT.yml does not check, while the last good one runs.
    pub reload_error: Option<String>,
}

/// One heartbeat task in a listing. Instants are RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    pub name: String,
    /// `every <n> s` or `cron <expr> (<zone>)`.
    pub schedule: String,
    /// `scheduled`, `due`, `running`, `stopped: <why>`, `disabled` or `never fires again`.
    pub status: String,
    pub next: Option<String>,
    pub last: Option<LastRun>,
    pub delivery: Option<String>,
}

/// A task's last finished run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    pub slot: String,
    pub at: String,
    pub manual: bool,
    /// The outcome in one line.
    pub outcome: String,
}

/// The reply to `status`: what only the running service knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveStatus {
    pub running: bool,
    /// The service's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// When the service started.
    #[serde(default)]
    pub started: Option<Timestamp>,
    pub channels: Vec<ChannelHealth>,
    pub inbox_pending: usize,
    pub outbox_pending: usize,
    pub pairings_pending: usize,
    /// The machine's state in one line.
    pub vm: String,
    /// Why every channel is paused (the crash-loop breaker), when it is.
    pub channels_paused: Option<String>,
    /// Files loaded at start that changed since.
    pub restart_needed: Vec<String>,
}

/// One channel's connection and hook health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelHealth {
    pub name: String,
    pub kind: String,
    /// The channel's [`Connection`](crate::connection::Connection) as one line: `connecting`
    /// until the platform first answered in the current receive attempt (Telegram's `getMe` or
    /// first `getUpdates`, Discord's gateway READY, Matrix's first sync), then `receiving`;
    /// `reconnecting: <why>` during the backoff after a drop, `stopped: <why>` after the
    /// credentials were refused, `paused until <when>` while the crash-loop breaker holds.
    pub connection: String,
    /// The channel is `receiving` and its hooks work.
    pub healthy: bool,
    pub hook_calls_running: usize,
    pub hook_failures_in_a_row: u32,
    pub last_hook_error: Option<String>,
}

/// `perch status --json`: what `.perch/` holds, and what the running service says when one
/// answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub running: bool,
    /// `running`, `stopped` (nothing answers on the control socket) or `unknown` (the socket
    /// took the request and gave no answer: see `live_error`).
    #[serde(default)]
    pub state: String,
    /// The running service's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// When the running service started.
    #[serde(default)]
    pub started: Option<Timestamp>,
    /// How long the running service has been up, in whole seconds.
    #[serde(default)]
    pub uptime_seconds: Option<u64>,
    /// Why the running service's answer could not be had, when the socket took the request.
    pub live_error: Option<String>,
    /// `<name> (<kind>)` for each channel, or the one line saying the files do not check.
    pub channels: Vec<String>,
    /// The running service's view of each channel; `null` when none answered.
    pub channel_health: Option<Vec<ChannelHealth>>,
    /// Undecryptable events per Matrix channel.
    pub undecryptable: BTreeMap<String, usize>,
    pub inbox_pending: usize,
    pub inbox_unreadable: Vec<String>,
    pub outbox_unreadable: Vec<String>,
    pub outbox_pending: usize,
    pub deliveries_unknown: Vec<UnknownDelivery>,
    pub pairings_pending: Vec<PendingPairing>,
    pub approved_senders: usize,
    /// Why `.perch/pairing.json` could not be read, and the fix; the two fields above are
    /// then empty, not known to be.
    #[serde(default)]
    pub pairing_unreadable: Option<String>,
    pub heartbeats: Heartbeats,
    pub inbox_oldest_waiting: Option<String>,
    /// The newest event per channel.
    pub last_events: BTreeMap<String, LastEvent>,
    /// Open operations per lane (what a restart recovers).
    pub lanes_with_open_operations: BTreeMap<String, usize>,
    pub vm: String,
    pub channels_paused: Option<String>,
    pub restart_needed: Vec<String>,
    /// `.perch/last-start.json`, when it is there and reads.
    pub last_start: Option<LastStart>,
    /// The UTC day's spend (`day`, `tokens`, `cost`, `told`), or `{"error": ...}`.
    pub spend_today: SpendStatus,
    /// The newest refusals the inbox keeps, one per (channel, room, reason), newest first.
    #[serde(default)]
    pub refusals: Vec<crate::refusals::RecentRefusal>,
}

impl StatusReport {
    /// Reads `perch status --json`.
    pub fn read(text: &str) -> Result<StatusReport, String> {
        serde_json::from_str(text).map_err(|error| format!("not a status report: {error}"))
    }
}

/// A delivery whose fate is unknown: its outbox record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UnknownDelivery {
    Unknown { intent: u64, reason: String },
}

impl UnknownDelivery {
    /// Why its fate is unknown.
    pub fn reason(&self) -> &str {
        match self {
            UnknownDelivery::Unknown { reason, .. } => reason,
        }
    }
}

/// A pairing offered and not yet approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPairing {
    pub channel: String,
    pub sender: String,
    pub name: String,
    pub expires: Timestamp,
}

/// The heartbeat tasks, or why they could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Heartbeats {
    Listed(HeartbeatList),
    Unlisted { error: String },
}

/// The UTC day's spend, or why the usage journal could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpendStatus {
    Known(SpendToday),
    Unknown { error: String },
}

/// A channel's newest event in the inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastEvent {
    /// RFC 3339.
    pub at: String,
    pub platform_id: Option<String>,
}

#[cfg(test)]
mod tests {

    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_control_socket_admits_root_its_user_and_its_operators() {
        let peer = |uid: u32, gid: u32, groups: &[u32]| Peer {
            uid,
            gid,
            groups: groups.to_vec(),
        };
        let with_operators = ControlAccess {
            own_uid: 990,
            operators: Some(991),
        };
        let alone = ControlAccess {
            own_uid: 990,
            operators: None,
        };
        let cases = [
            (alone, peer(0, 0, &[]), true),
            (alone, peer(990, 990, &[]), true),
            (alone, peer(1000, 991, &[991]), false),
            (with_operators, peer(1000, 1000, &[27, 991]), true),
            (with_operators, peer(1000, 991, &[]), true),
            (with_operators, peer(1000, 1000, &[27]), false),
            (with_operators, peer(992, 992, &[990, 106]), false),
            (with_operators, peer(0, 0, &[]), true),
        ];
        for (access, peer, admitted) in cases {
            assert_eq!(
                access.admits(&peer).is_ok(),
                admitted,
                "{access:?} {peer:?}"
            );
        }
        assert_eq!(
            with_operators.admits(&peer(1000, 1000, &[])),
            Err("uid 1000 is not root, the agent's user (uid 990) or in its operators' group (gid 991)".to_owned())
        );
    }
    /// The JSON of `value` as perch prints it: keys sorted, pretty.
    fn printed<T: Serialize>(value: &T) -> String {
        let tree = serde_json::to_value(value).unwrap();
        serde_json::to_string_pretty(&tree).unwrap()
    }

    #[test]
    fn requests_golden() {
        let table = [
            (
                ControlRequest::PairApprove {
                    who: Who::Code {
                        code: "K7Q2".into(),
                    },
                },
                r#"{"command":"pair-approve","code":"K7Q2"}"#,
            ),
            (
                ControlRequest::PairApprove {
                    who: Who::Sender {
                        channel: "tg".into(),
                        sender: "42".into(),
                    },
                },
                r#"{"command":"pair-approve","channel":"tg","sender":"42"}"#,
            ),
            (
                ControlRequest::PairDeny {
                    who: Who::Code {
                        code: "K7Q2".into(),
                    },
                },
                r#"{"command":"pair-deny","code":"K7Q2"}"#,
            ),
            (
                ControlRequest::PairRevoke {
                    channel: "mx".into(),
                    sender: "@ada:example.org".into(),
                },
                r#"{"command":"pair-revoke","channel":"mx","sender":"@ada:example.org"}"#,
            ),
            (ControlRequest::PairList, r#"{"command":"pair-list"}"#),
            (ControlRequest::Status, r#"{"command":"status"}"#),
            (
                ControlRequest::HeartbeatRun {
                    task: "digest".into(),
                    dry_run: true,
                },
                r#"{"command":"heartbeat-run","task":"digest","dry_run":true}"#,
            ),
            (
                ControlRequest::HeartbeatResume {
                    task: "digest".into(),
                },
                r#"{"command":"heartbeat-resume","task":"digest"}"#,
            ),
            (
                ControlRequest::HeartbeatList,
                r#"{"command":"heartbeat-list"}"#,
            ),
        ];
        for (request, line) in table {
            assert_eq!(serde_json::to_string(&request).unwrap(), line);
            assert_eq!(ControlRequest::read(line).unwrap(), request);
        }
        assert!(
            ControlRequest::read(r#"{"command":"reboot"}"#)
                .unwrap_err()
                .starts_with("a bad request: ")
        );
    }

    #[test]
    fn replies_golden() {
        let approved: Reply<PairApproved> = Ok(PairApproved {
            channel: "tg".into(),
            sender: "42".into(),
            name: "Ada".into(),
            told: true,
        });
        let line = encode_reply(&approved).to_string();
        assert_eq!(
            line,
            r#"{"channel":"tg","name":"Ada","ok":true,"sender":"42","told":true}"#
        );
        assert_eq!(read_reply::<PairApproved>(&line).unwrap(), approved);

        let listed: Reply<PairListed> = Ok(PairListed {
            pending: vec![PendingPair {
                code: "K7Q2XM".into(),
                channel: "tg".into(),
                sender: "7".into(),
                name: "Bob".into(),
                expires: chrono::Utc.with_ymd_and_hms(2026, 11, 30, 7, 0, 0).unwrap(),
                room: Some("7".into()),
            }],
            approved: vec![Approved {
                channel: "tg".into(),
                sender: "42".into(),
                name: "Ada".into(),
                room: None,
                notice_due: false,
            }],
        });
        let line = encode_reply(&listed).to_string();
        assert_eq!(
            line,
            r#"{"approved":[{"channel":"tg","name":"Ada","sender":"42"}],"ok":true,"pending":[{"channel":"tg","code":"K7Q2XM","expires":"2026-11-30T07:00:00Z","name":"Bob","room":"7","sender":"7"}]}"#
        );
        assert_eq!(read_reply::<PairListed>(&line).unwrap(), listed);

        let resumed: Reply<Resumed> = Ok(Resumed {});
        let line = encode_reply(&resumed).to_string();
        assert_eq!(line, r#"{"ok":true}"#);
        assert_eq!(read_reply::<Resumed>(&line).unwrap(), resumed);

        let refused: Reply<Resumed> = Err("heartbeats are not running yet".into());
        let line = encode_reply(&refused).to_string();
        assert_eq!(
            line,
            r#"{"error":"heartbeats are not running yet","ok":false}"#
        );
        assert_eq!(read_reply::<Resumed>(&line).unwrap(), refused);

        let ran: Reply<HeartbeatRan> = Ok(HeartbeatRan {
            end: RunEnd {
                outcome: "failed: no model".into(),
                valid: true,
                detail: SlotOutcome::Failed {
                    reason: "no model".into(),
                },
                reply: String::new(),
                stopped: None,
            },
        });
        let line = encode_reply(&ran).to_string();
        assert_eq!(
            line,
            r#"{"end":{"detail":{"outcome":"failed","reason":"no model"},"outcome":"failed: no model","reply":"","stopped":null,"valid":true},"ok":true}"#
        );
        assert_eq!(read_reply::<HeartbeatRan>(&line).unwrap(), ran);
    }

    #[test]
    fn a_reply_that_is_not_one_is_nonsense() {
        for line in ["", "[]", r#"{"running":true}"#, r#"{"ok":true}"#] {
            let read = read_reply::<PairApproved>(line);
            assert!(
                read.as_ref()
                    .is_err_and(|error| error.starts_with("the service answered nonsense: ")),
                "{line:?}: {read:?}"
            );
        }
    }

    fn live() -> LiveStatus {
        LiveStatus {
            running: true,
            pid: Some(4242),
            started: Some(chrono::Utc.with_ymd_and_hms(2026, 12, 2, 6, 0, 0).unwrap()),
            channels: vec![ChannelHealth {
                name: "tg".into(),
                kind: "telegram".into(),
                connection: "receiving".into(),
                healthy: true,
                hook_calls_running: 0,
                hook_failures_in_a_row: 0,
                last_hook_error: None,
            }],
            inbox_pending: 1,
            outbox_pending: 2,
            pairings_pending: 0,
            vm: "stopped (boots on the next command; last boot: None)".into(),
            channels_paused: None,
            restart_needed: vec!["agent.lua".into()],
        }
    }

    #[test]
    fn live_status_golden() {
        let reply: Reply<LiveStatus> = Ok(live());
        let line = encode_reply(&reply).to_string();
        assert_eq!(
            line,
            concat!(
                r#"{"channels":[{"connection":"receiving","healthy":true,"hook_calls_running":0,"#,
                r#""hook_failures_in_a_row":0,"kind":"telegram","last_hook_error":null,"name":"tg"}],"#,
                r#""channels_paused":null,"inbox_pending":1,"ok":true,"outbox_pending":2,"#,
                r#""pairings_pending":0,"pid":4242,"restart_needed":["agent.lua"],"running":true,"#,
                r#""started":"2026-12-02T06:00:00Z","#,
                r#""vm":"stopped (boots on the next command; last boot: None)"}"#
            )
        );
        assert_eq!(read_reply::<LiveStatus>(&line).unwrap(), reply);
    }

    #[test]
    fn status_report_golden() {
        let expires = chrono::Utc.with_ymd_and_hms(2026, 12, 2, 7, 0, 0).unwrap();
        let report = StatusReport {
            running: true,
            state: "running".into(),
            pid: Some(4242),
            started: live().started,
            uptime_seconds: Some(600),
            live_error: None,
            channels: vec!["tg (telegram)".into()],
            channel_health: Some(live().channels),
            undecryptable: BTreeMap::new(),
            inbox_pending: 0,
            inbox_unreadable: Vec::new(),
            outbox_unreadable: Vec::new(),
            outbox_pending: 0,
            deliveries_unknown: vec![UnknownDelivery::Unknown {
                intent: 7,
                reason: "failed: timeout".into(),
            }],
            pairings_pending: vec![PendingPairing {
                channel: "tg".into(),
                sender: "42".into(),
                name: "Ada".into(),
                expires,
            }],
            approved_senders: 1,
            pairing_unreadable: None,
            heartbeats: Heartbeats::Listed(HeartbeatList {
                tasks: vec![TaskRow {
                    name: "digest".into(),
                    schedule: "every 3600 s".into(),
                    status: "scheduled".into(),
                    next: Some("2026-12-02T07:00:00+00:00".into()),
                    last: Some(LastRun {
                        slot: "2026-12-02T06:00:00+00:00".into(),
                        at: "2026-12-02T06:00:05+00:00".into(),
                        manual: false,
                        outcome: "silent".into(),
                    }),
                    delivery: None,
                }],
                reload_error: None,
            }),
            inbox_oldest_waiting: None,
            last_events: BTreeMap::from([(
                "tg".into(),
                LastEvent {
                    at: "2026-12-02T06:10:00+00:00".into(),
                    platform_id: Some("42:17".into()),
                },
            )]),
            lanes_with_open_operations: BTreeMap::new(),
            vm: "stopped (no perch run holds it)".into(),
            channels_paused: None,
            restart_needed: Vec::new(),
            last_start: None,
            spend_today: SpendStatus::Unknown {
                error: "no spend journal".into(),
            },
            refusals: vec![crate::refusals::RecentRefusal {
                channel: "tg".into(),
                room: "-200".into(),
                sender: "77".into(),
                name: "Eve".into(),
                kind: "room_not_allowed".into(),
                reason: "the room is not in allow.rooms and the sender not in allow.users".into(),
                fix: "channels/tg.lua: allow.users (add \"77\")".into(),
                count: 3,
                last: expires,
            }],
        };
        let golden = r#"{
  "approved_senders": 1,
  "channel_health": [
    {
      "connection": "receiving",
      "healthy": true,
      "hook_calls_running": 0,
      "hook_failures_in_a_row": 0,
      "kind": "telegram",
      "last_hook_error": null,
      "name": "tg"
    }
  ],
  "channels": [
    "tg (telegram)"
  ],
  "channels_paused": null,
  "deliveries_unknown": [
    {
      "intent": 7,
      "reason": "failed: timeout",
      "type": "unknown"
    }
  ],
  "heartbeats": {
    "reload_error": null,
    "tasks": [
      {
        "delivery": null,
        "last": {
          "at": "2026-12-02T06:00:05+00:00",
          "manual": false,
          "outcome": "silent",
          "slot": "2026-12-02T06:00:00+00:00"
        },
        "name": "digest",
        "next": "2026-12-02T07:00:00+00:00",
        "schedule": "every 3600 s",
        "status": "scheduled"
      }
    ]
  },
  "inbox_oldest_waiting": null,
  "inbox_pending": 0,
  "inbox_unreadable": [],
  "lanes_with_open_operations": {},
  "last_events": {
    "tg": {
      "at": "2026-12-02T06:10:00+00:00",
      "platform_id": "42:17"
    }
  },
  "last_start": null,
  "live_error": null,
  "outbox_pending": 0,
  "outbox_unreadable": [],
  "pairing_unreadable": null,
  "pairings_pending": [
    {
      "channel": "tg",
      "expires": "2026-12-02T07:00:00Z",
      "name": "Ada",
      "sender": "42"
    }
  ],
  "pid": 4242,
  "refusals": [
    {
      "channel": "tg",
      "count": 3,
      "fix": "channels/tg.lua: allow.users (add \"77\")",
      "kind": "room_not_allowed",
      "last": "2026-12-02T07:00:00Z",
      "name": "Eve",
      "reason": "the room is not in allow.rooms and the sender not in allow.users",
      "room": "-200",
      "sender": "77"
    }
  ],
  "restart_needed": [],
  "running": true,
  "spend_today": {
    "error": "no spend journal"
  },
  "started": "2026-12-02T06:00:00Z",
  "state": "running",
  "undecryptable": {},
  "uptime_seconds": 600,
  "vm": "stopped (no perch run holds it)"
}"#;
        assert_eq!(printed(&report), golden);
        assert_eq!(StatusReport::read(golden).unwrap(), report);
    }

    #[test]
    fn the_spend_is_the_day_s_or_why_it_is_not_known() {
        let known = SpendStatus::Known(SpendToday {
            day: chrono::NaiveDate::from_ymd_opt(2026, 12, 2).unwrap(),
            tokens: 150,
            cost: crate::spend::Money::from_micros(1_250_000),
            told: None,
        });
        let text = serde_json::to_string(&known).unwrap();
        assert_eq!(
            text,
            r#"{"day":"2026-12-02","tokens":150,"cost":"1.25","told":null}"#
        );
        assert_eq!(serde_json::from_str::<SpendStatus>(&text).unwrap(), known);
        let unknown = SpendStatus::Unknown {
            error: "could not list .perch/spend".into(),
        };
        let text = serde_json::to_string(&unknown).unwrap();
        assert_eq!(text, r#"{"error":"could not list .perch/spend"}"#);
        assert_eq!(serde_json::from_str::<SpendStatus>(&text).unwrap(), unknown);
    }

    #[test]
    fn heartbeats_that_could_not_be_listed_say_why() {
        let unlisted = Heartbeats::Unlisted {
            error: "no ledger".into(),
        };
        let text = serde_json::to_string(&unlisted).unwrap();
        assert_eq!(text, r#"{"error":"no ledger"}"#);
        assert_eq!(serde_json::from_str::<Heartbeats>(&text).unwrap(), unlisted);
    }
}
