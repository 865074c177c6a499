//! The operator's control of pairing through `perch run`: `perch pair list`, `approve` by code
//! or by `CHANNEL:USER_ID`, `deny`, `revoke`; the approved person is told; a flood of strangers
//! neither hides a named person nor stops them from being let in.

use super::support::fake_model::Script;
use super::support::fake_telegram::User;
use super::support::pairing_code;
use super::support::scenario::{Agent, Scenario};
use super::support::wait::wait_until;
use std::process::Output;

/// `perch ARGS DIR`, which must succeed; its stdout.
fn succeeds(agent: &Agent, args: &[&str]) -> String {
    let output = agent.perch(args);
    assert!(
        output.status.success(),
        "perch {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `perch ARGS DIR`, which must fail; its stderr.
fn fails(agent: &Agent, args: &[&str]) -> String {
    let output: Output = agent.perch(args);
    assert!(
        !output.status.success(),
        "perch {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `perch pair list --json`: the senders (`channel:id`) pending and approved.
fn listed(agent: &Agent) -> (Vec<String>, Vec<String>) {
    let listed: serde_json::Value =
        serde_json::from_str(&succeeds(agent, &["pair", "list", "--json"])).unwrap();
    let senders = |key: &str| -> Vec<String> {
        listed[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                format!(
                    "{}:{}",
                    row["channel"].as_str().unwrap(),
                    row["sender"].as_str().unwrap()
                )
            })
            .collect()
    };
    (senders("pending"), senders("approved"))
}

#[test]
fn the_operator_lists_approves_denies_and_revokes_through_perch_run() {
    let agent = Scenario::telegram("").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let (bob, carol, dave) = (
        User::human(7, "Bob"),
        User::human(8, "Carol\u{1b}[2J"),
        User::human(9, "Dave"),
    );
    agent.send(&bob, "hello?");
    agent.wait_for_replies(1);
    agent.send(&carol, "me too");
    agent.wait_for_replies(2);
    let sent = telegram.sent();
    let bob_code = pairing_code(&sent[0].text);
    assert!(sent[0].shown.contains("tg:7"), "{}", sent[0].shown);

    let list = succeeds(&agent, &["pair", "list"]);
    assert!(list.contains("pending requests: 2"), "{list}");
    let bob_line = list.lines().find(|line| line.contains("tg:7")).unwrap();
    assert!(
        bob_line.contains("Bob")
            && bob_line.contains(&format!("code {bob_code}"))
            && bob_line.contains("asked under a minute ago"),
        "{bob_line}"
    );
    assert!(
        list.contains("Carol\\u{1b}[2J") && !list.contains('\u{1b}'),
        "{list}"
    );
    assert_eq!(listed(&agent).0, ["tg:7", "tg:8"]);

    let denied = succeeds(&agent, &["pair", "deny", "tg:8"]);
    assert!(denied.contains("denied the request of"), "{denied}");
    assert!(fails(&agent, &["pair", "deny", "tg:8"]).contains("no pending pairing request"));
    assert_eq!(listed(&agent).0, ["tg:7"]);

    let approved = succeeds(&agent, &["pair", "approve", &bob_code]);
    assert!(
        approved.contains("approved Bob (7) on channel tg; they were told"),
        "{approved}"
    );
    wait_until("Bob is told", || telegram.sent_count() == 3);
    let notice = &telegram.sent()[2];
    assert_eq!(notice.chat_id, 7);
    assert!(notice.shown.starts_with("You are in"), "{}", notice.shown);

    let dave_in = succeeds(&agent, &["pair", "approve", "tg:9"]);
    assert!(
        dave_in.contains("approved 9 on channel tg; they were not told"),
        "{dave_in}"
    );
    assert!(fails(&agent, &["pair", "approve", "zz:9"]).contains("no channel zz is loaded"));
    model.push(Script::text("hello Dave"));
    agent.send(&dave, "did it work?");
    wait_until("Dave's answer", || telegram.has_shown("hello Dave"));
    assert_eq!(listed(&agent), (vec![], vec!["tg:7".into(), "tg:9".into()]));

    let revoked = succeeds(&agent, &["pair", "revoke", "tg:7"]);
    assert!(
        revoked.contains("revoked Bob (7) on channel tg"),
        "{revoked}"
    );
    assert!(fails(&agent, &["pair", "revoke", "tg:7"]).contains("not an approved sender"));
    assert!(fails(&agent, &["pair", "revoke", &bob_code]).contains("revoke takes CHANNEL:USER_ID"));
    agent.send(&bob, "still there?");
    wait_until("Bob's new code", || telegram.sent_count() == 5);
    let offer = &telegram.sent()[4];
    assert_eq!(offer.chat_id, 7);
    assert!(
        offer.shown.contains("perch pair approve"),
        "{}",
        offer.shown
    );
    service.stop();
    assert_eq!(model.requests().len(), 1, "only Dave reached the model");
}

#[test]
fn strangers_requesting_in_a_loop_neither_hide_a_named_person_nor_keep_them_out() {
    let agent = Scenario::telegram("").build();
    let (model, telegram) = (&agent.model, agent.telegram());
    let service = agent.start();
    let strangers: Vec<User> = (1000..1020)
        .map(|id| User::human(id, &format!("throwaway {id}")))
        .collect();
    let dora = User::human(500, "Dora");
    for (index, stranger) in strangers.iter().enumerate() {
        agent.send(stranger, "let me in");
        if index == 9 {
            agent.send(&dora, "hello, I am real");
        }
    }
    for stranger in &strangers {
        agent.send(stranger, "let me in!!");
    }
    let marker = User::human(2000, "Marker");
    agent.send(&marker, "last");
    wait_until("the marker's offer", || {
        telegram.sent().iter().any(|sent| sent.chat_id == 2000)
    });
    assert_eq!(
        telegram.sent_count(),
        22,
        "one answer per sender, none to a repeated request"
    );
    let (pending, _) = listed(&agent);
    assert!(pending.contains(&"tg:500".to_owned()), "{pending:?}");
    assert!(succeeds(&agent, &["pair", "list"]).contains("Dora"));

    let approved = succeeds(&agent, &["pair", "approve", "tg:500"]);
    assert!(approved.contains("approved Dora (500)"), "{approved}");
    for stranger in &strangers {
        agent.send(stranger, "and now?");
    }
    model.push(Script::text("welcome, Dora"));
    agent.send(&dora, "am I in?");
    wait_until("Dora's answer", || telegram.has_shown("welcome, Dora"));
    service.stop();
    assert_eq!(model.requests().len(), 1, "no stranger reached the model");
}

#[test]
fn without_perch_run_the_commands_edit_the_pairing_file_under_the_lock() {
    let agent = Scenario::telegram("").build();
    let approved = String::from_utf8_lossy(&agent.perch_alone(&["pair", "approve", "tg:9"]).stdout)
        .into_owned();
    assert!(
        approved.contains("approved 9 on channel tg; perch is not running: they were not told"),
        "{approved}"
    );
    assert!(
        !agent
            .perch_alone(&["pair", "approve", "zz:9"])
            .status
            .success(),
        "a channel the agent does not declare"
    );
    assert_eq!(listed(&agent), (vec![], vec!["tg:9".into()]));
    assert!(succeeds(&agent, &["pair", "revoke", "tg:9"]).contains("revoked 9 on channel tg"));
    assert!(fails(&agent, &["pair", "deny", "ABC234"]).contains("no pending pairing request"));
    assert_eq!(listed(&agent), (vec![], vec![]));
}

#[test]
fn a_person_approved_while_perch_is_stopped_is_told_at_the_next_start_once() {
    let agent = Scenario::telegram("").build();
    let telegram = agent.telegram();
    let eve = User::human(88, "Eve");
    let service = agent.start();
    agent.send(&eve, "let me in");
    agent.wait_for_replies(1);
    let code = pairing_code(&telegram.sent()[0].text);
    service.stop();

    let approved = String::from_utf8_lossy(&agent.perch_alone(&["pair", "approve", &code]).stdout)
        .into_owned();
    assert!(
        approved.contains(
            "perch is not running: they will be told in their direct messages when it starts"
        ),
        "{approved}"
    );
    assert_eq!(
        telegram.sent_count(),
        1,
        "nothing is posted while perch is stopped"
    );

    let service = agent.start();
    agent.wait_for_replies(2);
    assert!(
        telegram.sent()[1].shown.starts_with("You are in"),
        "{:?}",
        telegram.sent()[1]
    );
    assert_eq!(telegram.sent()[1].chat_id, 88);
    service.stop();
    let service = agent.start();
    agent.wait_for_service();
    service.stop();
    assert_eq!(telegram.sent_count(), 2, "told once, not at every start");
}
