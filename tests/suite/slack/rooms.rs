//! Slack's rooms and strangers through `perch run`, end to end against the fake: a group DM,
//! another bot that will not stop answering, a stranger paired from a direct message, and a
//! person of another organisation over Slack Connect.

use super::*;
use crate::suite::support::fake_model::Script;
use crate::suite::support::pairing_code;
use crate::suite::support::scenario::{Agent, Scenario, edit};
use crate::suite::support::stdout;
use crate::suite::support::wait::wait_until;

const TEAM_ROOM: &str = "C0TEAM";
const GROUP_DM: &str = "G0ADAGRACE";
const BOB_DM: &str = "D0BOB";

fn grace() -> SlackUser {
    SlackUser::person("U0GRACE42", "Grace")
}

fn mention(text: &str) -> String {
    format!("<@{BOT_USER}> {text}")
}

fn wait_for_hello(agent: &Agent) {
    wait_until("a live Socket Mode connection", || {
        agent.slack().live_connections() > 0
    });
}

/// `perch log --refused`.
fn refused(agent: &Agent) -> String {
    stdout(&agent.perch(&["log", "--refused"]))
}

/// Waits until `perch log --refused` says `reason`; what it shows then.
fn wait_for_refusal(agent: &Agent, reason: &str) -> String {
    wait_until(&format!("a refusal for {reason:?}"), || {
        refused(agent).contains(reason)
    });
    refused(agent)
}

#[test]
fn a_group_dm_is_a_group_chat_answered_when_addressed_and_only_to_allowed_people() {
    let agent = Scenario::slack("allow = { users = { \"U061F7AUR\" } }, dm = \"pair\"").build();
    let slack = agent.slack();
    slack.user(&ada());
    slack.user(&grace());
    slack.channel(GROUP_DM, Kind::Mpim);
    agent.model.push(Script::text("answered in the group DM"));
    let service = agent.start();
    wait_for_hello(&agent);
    slack.push_message(GROUP_DM, &ada(), "just chatting between us");
    slack.push_message(GROUP_DM, &grace(), &mention("let me in"));
    slack.push_message(GROUP_DM, &ada(), &mention("what do you think?"));
    agent.wait_for_replies(1);
    let log = wait_for_refusal(
        &agent,
        "the room is not in allow.rooms and the sender not in allow.users",
    );
    assert!(log.contains("from Grace (U0GRACE42)"), "{log}");

    let posted = slack.posted();
    assert_eq!(
        posted.len(),
        1,
        "neither Grace nor pairing is answered: {posted:#?}"
    );
    assert_eq!(posted[0].channel, GROUP_DM);
    assert_eq!(posted[0].thread_ts, None);
    assert_eq!(posted[0].text, "answered in the group DM");
    let requests = agent.model.requests();
    assert_eq!(requests.len(), 1);
    let asked = requests[0].body.to_string();
    assert!(asked.contains("what do you think?"), "{asked}");
    assert!(
        asked.contains("just chatting between us"),
        "the unaddressed message is the group's context: {asked}"
    );
    assert!(!asked.contains("let me in"), "{asked}");
    let pairing = stdout(&agent.perch(&["pair", "list", "--json"]));
    assert!(
        !pairing.contains("U0GRACE42"),
        "a group DM offers no pairing: {pairing}"
    );
    wait_for_acks(&agent);
    service.stop();
}

/// Waits until every envelope sent so far is acknowledged.
fn wait_for_acks(agent: &Agent) {
    wait_until("every envelope acknowledged", || {
        agent.slack().unacked() == 0
    });
}

#[test]
fn another_bot_is_answered_bot_turns_times_in_a_row_until_a_person_speaks_and_an_unlisted_bot_never()
 {
    let agent = Scenario::slack(
        "rooms = { team = \"C0TEAM\" }, allow = { users = { \"U061F7AUR\" }, rooms = { \"team\" } },\n  \
         allow_bots = { \"U0BOTFRIEND\" }, bot_turns = 2",
    )
    .build();
    let slack = agent.slack();
    let friend = SlackUser::bot("U0BOTFRIEND", "B0FRIEND", "Friendbot");
    let stranger = SlackUser::bot("U0BOTSTRANGE", "B0STRANGE", "Strangebot");
    slack.user(&ada());
    slack.user(&friend);
    slack.user(&stranger);
    slack.channel(TEAM_ROOM, Kind::Channel);
    for turn in 0..5 {
        agent.model.push(Script::text(&format!("answer {turn}")));
    }
    let service = agent.start();
    wait_for_hello(&agent);

    // Ada starts it; the friend answers each of the agent's posts, as two bots would.
    slack.push_message(TEAM_ROOM, &ada(), &mention("ask Friendbot"));
    for turn in 1..=3 {
        agent.wait_for_replies(turn);
        slack.push_message(TEAM_ROOM, &friend, &mention(&format!("bot turn {turn}")));
    }
    let log = wait_for_refusal(&agent, "the loop guard");
    assert!(log.contains("from Friendbot (U0BOTFRIEND)"), "{log}");
    assert_eq!(
        slack.posted().len(),
        3,
        "Ada's question and two bot turns are answered; the third bot turn is not"
    );

    slack.push_message(TEAM_ROOM, &stranger, &mention("me too"));
    let log = wait_for_refusal(&agent, "a bot not in allow_bots");
    assert!(log.contains("from Strangebot (U0BOTSTRANGE)"), "{log}");

    slack.push_message(TEAM_ROOM, &ada(), &mention("carry on"));
    agent.wait_for_replies(4);
    slack.push_message(TEAM_ROOM, &friend, &mention("bot turn 4"));
    agent.wait_for_replies(5);
    wait_for_acks(&agent);
    service.stop();

    let posted = slack.posted();
    assert_eq!(posted.len(), 5, "{posted:#?}");
    assert!(posted.iter().all(|post| post.channel == TEAM_ROOM));
    let asked: Vec<String> = agent
        .model
        .requests()
        .iter()
        .map(|request| request.body.to_string())
        .collect();
    assert_eq!(asked.len(), 5);
    for (request, says) in asked.iter().zip([
        "ask Friendbot",
        "bot turn 1",
        "bot turn 2",
        "carry on",
        "bot turn 4",
    ]) {
        assert!(request.contains(says), "{says}: {request}");
    }
    assert!(
        asked
            .iter()
            .all(|request| !request.contains("bot turn 3") && !request.contains("me too")),
        "{asked:#?}"
    );
}

#[test]
fn a_stranger_gets_a_code_in_their_direct_messages_and_is_answered_once_approved() {
    let agent = Scenario::slack("dm = \"pair\"").build();
    let slack = agent.slack();
    let bob = SlackUser::person("U0BOB", "Bob");
    slack.user(&bob);
    slack.channel(BOB_DM, Kind::Im);
    let service = agent.start();
    wait_for_hello(&agent);
    slack.push_message(BOB_DM, &bob, "hello?");
    agent.wait_for_replies(1);
    let offer = slack.posted()[0].clone();
    assert_eq!(offer.channel, BOB_DM);
    assert!(offer.text.contains("perch pair approve"), "{}", offer.text);
    let code = pairing_code(&offer.text);

    let approved = agent.perch(&["pair", "approve", &code]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    assert!(
        stdout(&approved).contains("approved Bob (U0BOB) on channel sl; they were told"),
        "{}",
        stdout(&approved)
    );
    agent.wait_for_replies(2);
    let told = &slack.posted()[1];
    assert_eq!(told.channel, BOB_DM);
    assert!(told.text.starts_with("You are in"), "{}", told.text);

    agent.model.push(Script::text("nice to meet you, Bob"));
    slack.push_message(BOB_DM, &bob, "now?");
    agent.wait_for_replies(3);
    let answer = &slack.posted()[2];
    assert_eq!(answer.channel, BOB_DM);
    assert_eq!(answer.text, "nice to meet you, Bob");
    let requests = agent.model.requests();
    assert_eq!(
        requests.len(),
        1,
        "only the approved message reached the model"
    );
    let asked = requests[0].body.to_string();
    assert!(
        asked.contains("now?") && !asked.contains("hello?"),
        "{asked}"
    );
    wait_for_acks(&agent);
    service.stop();
}

#[test]
fn a_slack_connect_guest_is_refused_with_why_until_allow_users_lists_them() {
    let agent = Scenario::slack(
        "rooms = { team = \"C0TEAM\" }, allow = { users = { \"U061F7AUR\" }, rooms = { \"team\" } }",
    )
    .build();
    let slack = agent.slack();
    let guest = SlackUser::connect_guest("U0GUEST", "Grace", "T0THEIRS");
    slack.user(&guest);
    slack.channel(TEAM_ROOM, Kind::Channel);
    let service = agent.start();
    wait_for_hello(&agent);
    slack.push_message(TEAM_ROOM, &guest, &mention("hello from another company"));
    let log = wait_for_refusal(
        &agent,
        "a person of another organisation (Slack Connect, workspace T0THEIRS) not in allow.users",
    );
    assert!(log.contains("U0GUEST"), "{log}");
    assert!(
        log.contains("allow.users (add \"U0GUEST\")"),
        "the fix names the key and the id: {log}"
    );
    wait_for_acks(&agent);
    service.stop();
    assert!(slack.posted().is_empty(), "{:#?}", slack.posted());
    assert!(agent.model.requests().is_empty());

    edit(
        &agent.path().join("channels/sl.lua"),
        &[(
            "users = { \"U061F7AUR\" }",
            "users = { \"U061F7AUR\", \"U0GUEST\" }",
        )],
    );
    agent.model.push(Script::text("welcome, Grace"));
    let service = agent.start();
    wait_until("a new live connection", || {
        slack.connections_opened() >= 2 && slack.live_connections() == 1
    });
    slack.push_message(TEAM_ROOM, &guest, &mention("and now?"));
    agent.wait_for_replies(1);
    let posted = slack.posted();
    assert_eq!(posted.len(), 1, "{posted:#?}");
    assert_eq!(posted[0].channel, TEAM_ROOM);
    assert_eq!(posted[0].text, "welcome, Grace");
    let asked = agent.model.last_request().body.to_string();
    assert!(
        asked.contains("and now?") && !asked.contains("hello from another company"),
        "{asked}"
    );
    wait_for_acks(&agent);
    service.stop();
}
