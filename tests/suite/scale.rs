//! The service at scale: many conversations through a small lane pool, all answered, none left.
//!
//! The pool's limits are lowered so a few hundred conversations go through many times its
//! capacity: never more lanes open than the cap. Also the attacker's view: a flood of distinct
//! rooms, and a lane that cannot be opened for a while.

use super::support::in_process::InProcess;
use super::support::wait::Poll;
use perch::agent::AgentDir;
use perch::service::LaneLimits;
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(60);

fn small_pool() -> LaneLimits {
    LaneLimits {
        open_max: 4,
        lane_idle: Duration::from_millis(200),
        conversation_idle: Duration::from_millis(50),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_distinct_rooms_is_answered_through_a_few_lanes_and_leaves_nothing_open() {
    let mut service = InProcess::start(small_pool(), |_| {});
    let rooms: u64 = 300;
    for user in 1..=rooms {
        service.send(user, &format!("hello from {user}"));
    }
    service
        .until("every room answered", WITHIN, |seen| {
            seen.posted.len() >= usize::try_from(rooms).unwrap()
        })
        .await;
    let mut answered: Vec<String> = service.seen(|seen| {
        seen.posted
            .iter()
            .map(|(room, text)| {
                assert!(
                    text.starts_with("ok: ") && text.ends_with(&format!("hello from {room}")),
                    "room {room} got {text:?}"
                );
                room.clone()
            })
            .collect()
    });
    answered.sort();
    answered.dedup();
    assert_eq!(answered.len(), 300, "each room answered once");
    let peak = service.metric("perch_lanes_open_peak").unwrap();
    assert!(
        (1.0..=4.0).contains(&peak),
        "at most the cap of 4 lanes open at once, not {peak}"
    );
    service
        .until_metric("perch_conversations_active", 0.0, WITHIN)
        .await;
    service.until_metric("perch_lanes_open", 0.0, WITHIN).await;
    let dir = service.stop().await;
    let sessions = AgentDir::open(dir.path()).unwrap().sessions_dir();
    assert_eq!(
        std::fs::read_dir(sessions).unwrap().count(),
        300,
        "every conversation kept its lane on disk"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lane_closed_as_idle_reopens_with_its_history() {
    let mut service = InProcess::start(small_pool(), |_| {});
    service.send(7, "first");
    service
        .until("the first answered", WITHIN, |seen| seen.posted.len() == 1)
        .await;
    service.until_metric("perch_lanes_open", 0.0, WITHIN).await;
    service
        .until_metric("perch_conversations_active", 0.0, WITHIN)
        .await;
    service.send(7, "second");
    service
        .until("the second answered", WITHIN, |seen| seen.posted.len() == 2)
        .await;
    let (last, history) = service.seen(|seen| {
        let (text, users, _) = seen.requests.last().unwrap().clone();
        (text, users)
    });
    assert!(last.contains("second"), "{last}");
    assert_eq!(
        history, 2,
        "the reopened lane gave the model the first exchange too"
    );
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_item_whose_lane_cannot_open_waits_and_is_answered_once_it_can() {
    let mut blocked = None;
    let mut service = InProcess::start(small_pool(), |dir| {
        let sessions = AgentDir::open(dir).unwrap().sessions_dir();
        std::fs::create_dir_all(&sessions).unwrap();
        let path = sessions.join("tg-13-bfe80dcee2c179a2");
        std::fs::write(&path, "not a lane directory").unwrap();
        blocked = Some(path);
    });
    service.send(13, "are you there");
    service.send(14, "me too");
    service
        .until("the other room answered", WITHIN, |seen| {
            seen.posted.iter().any(|(room, _)| room == "14")
        })
        .await;
    Poll::within(WITHIN)
        .every(Duration::from_millis(5))
        .until_async("a retried open", || {
            let failures = service.metric("perch_lane_open_failures_total");
            std::future::ready(failures.is_some_and(|failures| failures >= 2.0))
        })
        .await;
    assert!(
        service.seen(|seen| seen.posted.iter().all(|(room, _)| room != "13")),
        "nothing answered while the lane could not open"
    );
    std::fs::remove_file(blocked.unwrap()).unwrap();
    service
        .until("the waiting item answered", WITHIN, |seen| {
            seen.posted.iter().any(|(room, _)| room == "13")
        })
        .await;
    let answers: Vec<String> = service.seen(|seen| {
        seen.posted
            .iter()
            .filter(|(room, _)| room == "13")
            .map(|(_, text)| text.clone())
            .collect()
    });
    assert_eq!(answers.len(), 1, "answered once: {answers:?}");
    assert!(answers[0].ends_with("are you there"), "{answers:?}");
    service
        .until_metric("perch_conversations_active", 0.0, WITHIN)
        .await;
    service.stop().await;
}
