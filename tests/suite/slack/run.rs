//! Slack through `perch run`, end to end against the fake: direct messages, mentions that
//! arrive twice, threads, edits, refusals, rate limits, Slack's reconnects and refusals, and
//! the tokens kept out of everything perch writes.

use super::*;
use crate::suite::support::fake_model::Script;
use crate::suite::support::scenario::{Agent, Scenario};
use crate::suite::support::status::Report;
use crate::suite::support::stdout;
use crate::suite::support::wait::wait_until;

const DM: &str = "D0ADA";
const TEAM_ROOM: &str = "C0TEAM";

/// Ada may talk to the agent; `#team` is where it answers mentions.
const CHANNEL: &str = "rooms = { team = \"C0TEAM\" }, allow = { users = { \"U061F7AUR\" }, rooms = { \"team\" } }, dm = \"allow\"";

fn agent() -> Agent {
    let agent = Scenario::slack(CHANNEL).build();
    let slack = agent.slack();
    slack.user(&ada());
    slack.channel(DM, Kind::Im);
    slack.channel(TEAM_ROOM, Kind::Channel);
    agent
}

pub(super) fn wait_for_hello(agent: &Agent) {
    wait_until("a live Socket Mode connection", || {
        agent.slack().live_connections() > 0
    });
}

/// Waits until every envelope sent so far is acknowledged.
fn wait_for_acks(agent: &Agent) {
    wait_until("every envelope acknowledged", || {
        agent.slack().unacked() == 0
    });
}

#[test]
fn a_direct_message_is_answered_in_mrkdwn_with_its_sender_named() {
    let agent = agent();
    agent.model.push(Script::text("**hello** Ada <!channel>"));
    let service = agent.start();
    wait_for_hello(&agent);
    agent.slack().push_message(DM, &ada(), "hi there");
    agent.wait_for_replies(1);
    let posted = &agent.slack().posted()[0];
    assert_eq!(posted.channel, DM);
    assert_eq!(posted.thread_ts, None);
    assert_eq!(posted.text, "*hello* Ada &lt;!channel&gt;");
    let request = agent.model.last_request().body.to_string();
    assert!(request.contains("hi there"), "{request}");
    assert!(
        request.contains("Ada"),
        "the origin header names Ada: {request}"
    );
    wait_for_acks(&agent);
    assert_eq!(agent.status().connection(), "receiving");
    service.stop();
}

#[test]
fn a_mention_delivered_as_message_and_app_mention_is_answered_once() {
    let agent = agent();
    agent.model.push(Script::text("once"));
    agent.model.push(Script::text("twice?"));
    let service = agent.start();
    wait_for_hello(&agent);
    let ts = agent
        .slack()
        .push_message(TEAM_ROOM, &ada(), &format!("<@{BOT_USER}> what is up"));
    agent.wait_for_replies(1);
    wait_for_acks(&agent);
    let events: Vec<String> = agent
        .slack()
        .delivered()
        .iter()
        .map(|envelope| {
            envelope["payload"]["event"]["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        events.contains(&"message".to_owned()) && events.contains(&"app_mention".to_owned()),
        "{events:?}"
    );
    // A later message is answered next: had the mention been taken twice, "twice?" would go
    // to it first.
    agent.model.push(Script::text("the next one"));
    agent.slack().push_message(DM, &ada(), "and now");
    agent.wait_for_replies(2);
    let posted = agent.slack().posted();
    assert_eq!(posted[0].text, "once");
    assert_eq!(posted[0].channel, TEAM_ROOM);
    assert_eq!(posted[1].text, "twice?", "{posted:#?}");
    assert_eq!(posted[1].channel, DM);
    let inbox = stdout(&agent.perch(&["log", "--refused"]));
    assert!(!inbox.contains(&ts), "{inbox}");
    service.stop();
}

#[test]
fn a_thread_reply_is_answered_in_its_thread() {
    let agent = agent();
    agent.model.push(Script::text("in the thread"));
    let service = agent.start();
    wait_for_hello(&agent);
    let parent = agent
        .slack()
        .push_message(TEAM_ROOM, &ada(), "a thread starts");
    agent.slack().push_in_thread(
        TEAM_ROOM,
        &ada(),
        &format!("<@{BOT_USER}> in here please"),
        &parent,
    );
    agent.wait_for_replies(1);
    let posted = &agent.slack().posted()[0];
    assert_eq!(posted.channel, TEAM_ROOM);
    assert_eq!(posted.thread_ts.as_deref(), Some(parent.as_str()));
    service.stop();
}

#[test]
fn threads_are_conversations_of_their_own_unless_the_channel_joins_them_to_their_room() {
    for (threads, joined) in [("own", false), ("room", true)] {
        let agent = Scenario::slack(&format!("{CHANNEL}, threads = \"{threads}\"")).build();
        agent.slack().user(&ada());
        agent.slack().channel(TEAM_ROOM, Kind::Channel);
        agent.model.push(Script::text("in the room"));
        agent.model.push(Script::text("in the thread"));
        let service = agent.start();
        wait_for_hello(&agent);
        let parent = agent.slack().push_message(
            TEAM_ROOM,
            &ada(),
            &format!("<@{BOT_USER}> first in the room"),
        );
        agent.wait_for_replies(1);
        agent.slack().push_in_thread(
            TEAM_ROOM,
            &ada(),
            &format!("<@{BOT_USER}> then in its thread"),
            &parent,
        );
        agent.wait_for_replies(2);
        let second = agent.model.last_request().body.to_string();
        assert!(second.contains("then in its thread"), "{second}");
        assert_eq!(
            second.contains("first in the room"),
            joined,
            "threads = {threads:?}: {second}"
        );
        let posted = agent.slack().posted();
        assert_eq!(posted[0].thread_ts, None, "{threads}");
        assert_eq!(
            posted[1].thread_ts.as_deref(),
            Some(parent.as_str()),
            "threads = {threads:?}: the reply goes into the thread either way"
        );
        service.stop();
    }
}

#[test]
fn an_edit_is_journaled_and_not_answered_and_an_unknown_subtype_is_refused_with_its_reason() {
    let agent = agent();
    agent.model.push(Script::text("first"));
    agent.model.push(Script::text("after"));
    let service = agent.start();
    wait_for_hello(&agent);
    let ts = agent.slack().push_message(DM, &ada(), "typo");
    agent.wait_for_replies(1);
    agent.slack().push_edit(DM, &ada(), &ts, "no typo");
    agent
        .slack()
        .push_subtype(DM, &ada(), "strange", "huddle_thread");
    wait_for_acks(&agent);
    agent.slack().push_message(DM, &ada(), "after");
    agent.wait_for_replies(2);
    assert_eq!(agent.slack().posted()[1].text, "after");
    let refused = stdout(&agent.perch(&["log", "--refused"]));
    assert!(
        refused.contains("a message of subtype `huddle_thread`, which perch does not take"),
        "{refused}"
    );
    assert!(!refused.contains("no typo"), "{refused}");
    service.stop();
}

#[test]
fn a_429_is_waited_out_and_the_reply_posted_once() {
    let agent = agent();
    agent.model.push(Script::text("patiently"));
    let service = agent.start();
    wait_for_hello(&agent);
    agent
        .slack()
        .fail_next("chat.postMessage", Failure::RateLimited { seconds: 2 });
    let asked = std::time::Instant::now();
    agent.slack().push_message(DM, &ada(), "hello");
    agent.wait_for_replies(1);
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(agent.slack().calls_of("chat.postMessage"), 2);
    assert_eq!(agent.slack().posted().len(), 1);
    service.stop();
}

/// A `429` holds `chat.postMessage` across the workspace: the reply it refused and a reply to
/// another channel waiting behind the hold are both recorded as not sent while they wait, so a
/// SIGKILL then leaves nothing unknown, and the next start posts each once.
#[test]
fn replies_held_by_a_rate_limit_when_perch_is_killed_are_posted_once_after_the_restart() {
    let agent = agent();
    agent.model.push(Script::text("first, after the limit"));
    agent.model.push(Script::text("second, behind the hold"));
    let service = agent.start();
    wait_for_hello(&agent);
    agent
        .slack()
        .fail_next("chat.postMessage", Failure::RateLimited { seconds: 120 });
    agent.slack().push_message(DM, &ada(), "hello");
    wait_until("the first reply to be rate-limited", || {
        agent.slack().calls_of("chat.postMessage") == 1
    });
    agent
        .slack()
        .push_message(TEAM_ROOM, &ada(), &format!("<@{BOT_USER}> and here"));
    let outbox = agent.path().join(".perch/outbox");
    wait_until("both replies recorded as not sent while they wait", || {
        crate::suite::support::journal_text(&outbox)
            .matches(r#""type":"unsent""#)
            .count()
            >= 2
    });
    service.kill();
    assert!(agent.slack().posted().is_empty());
    assert_eq!(
        agent.slack().calls_of("chat.postMessage"),
        1,
        "the second reply waited on perch's side of the hold"
    );

    let service = agent.start();
    agent.wait_for_replies(2);
    wait_until("the outbox to be empty", || {
        agent.status().outbox_pending == 0
    });
    let stderr = service.stop();
    let mut posted: Vec<(String, String)> = agent
        .slack()
        .posted()
        .into_iter()
        .map(|posted| (posted.channel, posted.text))
        .collect();
    posted.sort();
    assert_eq!(
        posted,
        [
            (TEAM_ROOM.to_owned(), "second, behind the hold".to_owned()),
            (DM.to_owned(), "first, after the limit".to_owned()),
        ]
    );
    assert!(
        !stderr.contains(": unknown") && !stderr.contains("unknown fate"),
        "{stderr}"
    );
    assert_eq!(agent.model.requests().len(), 2, "neither answered again");
}

#[test]
fn a_refresh_requested_disconnect_is_survived() {
    let agent = agent();
    agent.model.push(Script::text("still here"));
    agent.slack().set_refresh_grace(Duration::from_millis(200));
    let service = agent.start();
    wait_for_hello(&agent);
    agent.slack().request_refresh();
    wait_until("a second connection", || {
        agent.slack().connections_opened() >= 2 && agent.slack().live_connections() == 1
    });
    agent.slack().push_message(DM, &ada(), "are you there");
    agent.wait_for_replies(1);
    assert_eq!(agent.status().connection(), "receiving");
    service.stop();
}

#[test]
fn link_disabled_shows_as_refused_in_perch_status() {
    let agent = agent();
    let service = agent.start();
    wait_for_hello(&agent);
    agent.slack().disable_socket_mode();
    wait_until("the refusal to show", || {
        agent.status().connection().starts_with("stopped: ")
    });
    let connection = agent.status().connection();
    assert!(connection.contains("link_disabled"), "{connection}");
    assert!(!agent.status().channel(0).unwrap().healthy);
    service.stop();
}

#[test]
fn the_tokens_are_never_in_perch_dot_or_its_output() {
    let agent = agent();
    agent.model.push(Script::text("a secret-free answer"));
    agent
        .slack()
        .fail_next("chat.postMessage", Failure::Error("internal_error".into()));
    let service = agent.start();
    wait_for_hello(&agent);
    agent.slack().push_message(DM, &ada(), "hello");
    wait_until("the delivery to settle", || {
        agent.slack().calls_of("chat.postMessage") >= 1
    });
    agent.slack().refuse_connections(Some("invalid_auth"));
    agent.slack().drop_connections();
    wait_until("the refusal to show", || {
        agent.status().connection().starts_with("stopped: ")
    });
    let mut shown = String::new();
    for args in [
        &["status", "--json"][..],
        &["info", "--json"],
        &["log", "--json"],
        &["log", "--refused", "--json"],
    ] {
        shown.push_str(&String::from_utf8_lossy(&agent.perch(args).stdout));
    }
    shown.push_str(&service.stop());
    for entry in walk(&agent.path().join(".perch")) {
        shown.push_str(&String::from_utf8_lossy(&std::fs::read(entry).unwrap()));
    }
    for token in [
        BOT_TOKEN,
        APP_TOKEN,
        "perchFakeBotToken",
        "perchfakeapptoken",
    ] {
        assert!(!shown.contains(token), "{token} leaked");
    }
}

/// Every regular file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            files.extend(walk(&entry.path()));
        } else if kind.is_file() {
            files.push(entry.path());
        }
    }
    files
}

#[test]
fn a_shared_file_is_downloaded_with_the_bot_token_into_the_inbox() {
    let agent = agent();
    agent.model.push(Script::text("got it"));
    let service = agent.start();
    wait_for_hello(&agent);
    agent.slack().push_file(
        DM,
        &ada(),
        "see this",
        "notes.txt",
        "text/plain",
        b"the file's words",
    );
    agent.wait_for_replies(1);
    let downloads = agent.slack().downloads();
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert!(
        downloads[0].1,
        "downloaded without the bot token: {downloads:?}"
    );
    let request = agent.model.last_request().body.to_string();
    assert!(request.contains("notes.txt"), "{request}");
    let saved: Vec<_> = walk(&agent.path().join("workspace/inbox"))
        .into_iter()
        .filter(|path| std::fs::read(path).unwrap() == b"the file's words")
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    service.stop();
}

#[test]
fn a_reply_attaches_a_workspace_file_uploaded_into_its_thread() {
    let agent = agent();
    agent.write("workspace/out/answer.md", "# Answer\n");
    agent
        .model
        .push(Script::text("Done.\nattach: out/answer.md"));
    let service = agent.start();
    wait_for_hello(&agent);
    let parent = agent.slack().push_message(TEAM_ROOM, &ada(), "a thread");
    agent.slack().push_in_thread(
        TEAM_ROOM,
        &ada(),
        &format!("<@{BOT_USER}> the answer, as a file"),
        &parent,
    );
    agent.wait_for_replies(2);
    let posted = agent.slack().posted();
    assert_eq!(posted[0].method, "chat.postMessage");
    assert_eq!(posted[0].text, "Done.");
    assert_eq!(posted[1].method, "files.completeUploadExternal");
    assert_eq!(posted[1].thread_ts.as_deref(), Some(parent.as_str()));
    assert_eq!(
        posted[1].files,
        [("answer.md".to_owned(), b"# Answer\n".to_vec())]
    );
    service.stop();
}

#[test]
fn two_people_in_one_channel_are_each_named_in_what_the_model_reads() {
    let grace = SlackUser::person("U0GRACE42", "Grace");
    let agent = Scenario::slack(
        "rooms = { team = \"C0TEAM\" }, allow = { users = { \"U061F7AUR\", \"U0GRACE42\" }, rooms = { \"team\" } }",
    )
    .build();
    let slack = agent.slack();
    slack.user(&ada());
    slack.user(&grace);
    slack.channel(TEAM_ROOM, Kind::Channel);
    agent.model.push(Script::text("for Ada"));
    agent.model.push(Script::text("for Grace"));
    let service = agent.start();
    wait_for_hello(&agent);
    slack.push_message(TEAM_ROOM, &ada(), &format!("<@{BOT_USER}> first question"));
    agent.wait_for_replies(1);
    slack.push_message(TEAM_ROOM, &grace, &format!("<@{BOT_USER}> second question"));
    agent.wait_for_replies(2);
    let requests = agent.model.requests();
    let asked_by = |question: &str| {
        requests
            .iter()
            .map(|request| request.body.to_string())
            .find(|body| body.contains(question))
            .unwrap_or_else(|| panic!("no model request with {question:?}"))
    };
    // Grace's id is U0GRACE42: "Grace" in the request can only be her name from users.info.
    assert!(asked_by("first question").contains("Ada"));
    let second = asked_by("second question");
    assert!(
        second.contains("Grace"),
        "the origin header names Grace: {second}"
    );
    let posted = slack.posted();
    assert_eq!(posted.len(), 2, "{posted:#?}");
    assert!(posted.iter().all(|post| post.channel == TEAM_ROOM));
    wait_for_acks(&agent);
    service.stop();
}

#[test]
fn a_heartbeat_message_is_posted_into_a_slack_room_once() {
    let agent = Scenario::slack("rooms = { team = \"C0TEAM\" }").build();
    let slack = agent.slack();
    slack.channel(TEAM_ROOM, Kind::Channel);
    agent.write(
        "workspace/HEARTBEAT.yml",
        "tasks:\n  - name: digest\n    prompt: Post the digest.\n    cron: \"0 9 * * Mon-Fri\"\n    delivery: sl:team\n",
    );
    let service = agent.start();
    wait_for_hello(&agent);
    agent
        .model
        .push(Script::text("Message: **All green** today, <!here>."));
    let ran = agent.perch(&["heartbeat", "run", "digest"]);
    assert!(ran.status.success(), "{}", stdout(&ran));
    assert!(
        stdout(&ran).contains("digest: message to sl:team"),
        "{}",
        stdout(&ran)
    );
    wait_until("the digest posted", || !slack.posted().is_empty());
    let posted = slack.posted();
    assert_eq!(posted.len(), 1, "{posted:#?}");
    assert_eq!(posted[0].channel, TEAM_ROOM);
    assert_eq!(posted[0].text, "*All green* today, &lt;!here&gt;.");
    assert_eq!(posted[0].thread_ts, None);
    service.stop();
}
