use super::*;
use crate::heartbeat::file::{HeartbeatEnv, parse_heartbeat_file};
use chrono::{DateTime, Utc};

fn at(text: &str) -> Timestamp {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn show(time: Timestamp) -> String {
    time.format("%m-%dT%H:%M").to_string()
}

fn task(lines: &str) -> HeartbeatTask {
    let env = HeartbeatEnv {
        host_tz: chrono_tz::UTC,
        targets: Vec::new(),
        models: Vec::new(),
        channels_on_disk: None,
    };
    let mut text = String::from("tasks:\n  - name: t\n    prompt: look\n");
    for line in lines.lines() {
        text.push_str(&format!("    {line}\n"));
    }
    parse_heartbeat_file(&text, &env).unwrap().tasks.remove(0)
}

#[derive(Debug, PartialEq, Eq)]
enum Event {
    Ran {
        slot: String,
        at: String,
        coalesced: u32,
    },
    Skipped {
        from: String,
        to: String,
        count: u32,
        reason: String,
    },
}

fn ran(slot: &str, at: &str, coalesced: u32) -> Event {
    Event::Ran {
        slot: slot.into(),
        at: at.into(),
        coalesced,
    }
}

fn skipped(from: &str, to: &str, count: u32, reason: &str) -> Event {
    Event::Skipped {
        from: from.into(),
        to: to.into(),
        count,
        reason: reason.into(),
    }
}

/// Drives `plan` the way the shell does, from `first_seen` to `until`, with perch down
/// during each `(from, to)` window; every run ends at once with `outcome(slot)`.
fn simulate(
    task: &HeartbeatTask,
    first_seen: &str,
    until: &str,
    down: &[(&str, &str)],
    mut outcome: impl FnMut(Timestamp) -> SlotOutcome,
) -> (Vec<Event>, LedgerState) {
    let first_seen = at(first_seen);
    let until = at(until);
    let down: Vec<(Timestamp, Timestamp)> =
        down.iter().map(|(from, to)| (at(from), at(to))).collect();
    let mut state = LedgerState::default();
    let mut events = Vec::new();
    let mut now = first_seen;
    let mut runs = 0;
    while now <= until {
        if let Some((_, up)) = down.iter().find(|(from, to)| *from <= now && now < *to) {
            now = *up;
            continue;
        }
        match plan(task, state.task(&task.name), first_seen, now) {
            Plan::Run { slot, coalesced } => {
                runs += 1;
                let run = format!("run-{runs}");
                state.apply(LedgerRecord::SlotStarted {
                    task: task.name.clone(),
                    slot,
                    run: run.clone(),
                    manual: false,
                    coalesced,
                    at: now,
                });
                state.apply(LedgerRecord::SlotFinished {
                    task: task.name.clone(),
                    slot,
                    run,
                    outcome: outcome(slot),
                    at: now,
                });
                events.push(ran(&show(slot), &show(now), coalesced));
            }
            Plan::Skip {
                from,
                to,
                count,
                reason,
            } => {
                state.apply(LedgerRecord::SlotsSkipped {
                    task: task.name.clone(),
                    from,
                    to,
                    count,
                    reason: reason.clone(),
                    at: now,
                });
                events.push(skipped(&show(from), &show(to), count, &reason));
            }
            Plan::Wait { until } => {
                assert!(until > now, "waits for {until} at {now}");
                now = until;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    (events, state)
}

fn silent(_: Timestamp) -> SlotOutcome {
    SlotOutcome::Silent
}

fn run_instants(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            Event::Ran { slot, at, .. } => {
                assert_eq!(slot, at);
                at.clone()
            }
            Event::Skipped { .. } => panic!("unexpected skip {event:?}"),
        })
        .collect()
}

#[test]
fn a_simulated_week_fires_every_schedule_at_its_exact_instants() {
    let half_hourly = task("every: 30m");
    let (events, _) = simulate(
        &half_hourly,
        "2026-10-19T00:00:00Z",
        "2026-10-26T00:00:00Z",
        &[],
        silent,
    );
    let instants = run_instants(&events);
    assert_eq!(instants.len(), 7 * 48);
    assert_eq!(instants[0], "10-19T00:30");
    assert_eq!(instants[instants.len() - 1], "10-26T00:00");
    assert!(instants.contains(&"10-25T01:00".to_owned()));

    let standup = task("cron: \"0 9 * * Mon-Fri\"\ntz: Europe/Berlin");
    let (events, _) = simulate(
        &standup,
        "2026-10-19T00:00:00Z",
        "2026-10-31T00:00:00Z",
        &[],
        silent,
    );
    assert_eq!(
        run_instants(&events),
        vec![
            "10-19T07:00",
            "10-20T07:00",
            "10-21T07:00",
            "10-22T07:00",
            "10-23T07:00",
            "10-26T08:00",
            "10-27T08:00",
            "10-28T08:00",
            "10-29T08:00",
            "10-30T08:00",
        ]
    );

    let nightly = task("cron: \"30 2 * * *\"\ntz: America/New_York");
    let (events, _) = simulate(
        &nightly,
        "2026-03-05T00:00:00Z",
        "2026-03-11T00:00:00Z",
        &[],
        silent,
    );
    assert_eq!(
        run_instants(&events),
        vec![
            "03-05T07:30",
            "03-06T07:30",
            "03-07T07:30",
            "03-08T07:00",
            "03-09T06:30",
            "03-10T06:30",
        ]
    );
}

#[test]
fn a_new_task_never_fires_for_the_past() {
    let daily = task("cron: \"0 9 * * *\"");
    assert_eq!(
        plan(
            &daily,
            None,
            at("2026-05-04T09:10:00Z"),
            at("2026-05-04T09:10:00Z")
        ),
        Plan::Wait {
            until: at("2026-05-05T09:00:00Z")
        }
    );
    let manual_only = reduce([
        LedgerRecord::SlotStarted {
            task: daily.name.clone(),
            slot: at("2026-05-04T09:20:00Z"),
            run: "m".into(),
            manual: true,
            coalesced: 0,
            at: at("2026-05-04T09:20:00Z"),
        },
        LedgerRecord::SlotFinished {
            task: daily.name.clone(),
            slot: at("2026-05-04T09:20:00Z"),
            run: "m".into(),
            outcome: SlotOutcome::Silent,
            at: at("2026-05-04T09:21:00Z"),
        },
    ]);
    assert_eq!(
        plan(
            &daily,
            manual_only.task(&daily.name),
            at("2026-05-04T09:10:00Z"),
            at("2026-05-05T09:00:30Z")
        ),
        Plan::Run {
            slot: at("2026-05-05T09:00:00Z"),
            coalesced: 0
        }
    );
}

#[test]
fn slots_missed_while_down_coalesce_into_one_run() {
    let half_hourly = task("every: 30m");
    let (events, _) = simulate(
        &half_hourly,
        "2026-05-04T10:00:00Z",
        "2026-05-04T14:00:00Z",
        &[("2026-05-04T10:10:00Z", "2026-05-04T13:05:00Z")],
        silent,
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T13:00", "05-04T13:05", 5),
            ran("05-04T13:30", "05-04T13:30", 0),
            ran("05-04T14:00", "05-04T14:00", 0),
        ]
    );
}

#[test]
fn missed_skip_skips_what_cannot_run_on_time() {
    let half_hourly = task("every: 30m\nmissed: skip");
    let (events, _) = simulate(
        &half_hourly,
        "2026-05-04T10:00:00Z",
        "2026-05-04T14:00:00Z",
        &[("2026-05-04T10:10:00Z", "2026-05-04T13:05:00Z")],
        silent,
    );
    assert_eq!(
        events,
        vec![
            skipped(
                "05-04T10:30",
                "05-04T12:30",
                5,
                "missed: 5 slots came due while the task could not run"
            ),
            ran("05-04T13:00", "05-04T13:05", 0),
            ran("05-04T13:30", "05-04T13:30", 0),
            ran("05-04T14:00", "05-04T14:00", 0),
        ]
    );
    let (events, _) = simulate(
        &half_hourly,
        "2026-05-04T10:00:00Z",
        "2026-05-04T13:30:00Z",
        &[("2026-05-04T12:40:00Z", "2026-05-04T13:06:00Z")],
        silent,
    );
    assert_eq!(
        events[events.len() - 3..],
        [
            ran("05-04T12:30", "05-04T12:30", 0),
            skipped("05-04T13:00", "05-04T13:00", 1, "missed: 6m late"),
            ran("05-04T13:30", "05-04T13:30", 0),
        ]
    );
}

#[test]
fn slots_outside_active_hours_are_skipped_not_deferred() {
    let hourly = task("every: 1h\ntz: Europe/Berlin\nactive_hours: \"08:00-18:00\"");
    let (events, _) = simulate(
        &hourly,
        "2026-05-04T00:00:00Z",
        "2026-05-05T23:59:00Z",
        &[],
        silent,
    );
    let expected: Vec<Event> = ["05-04", "05-05"]
        .iter()
        .flat_map(|day| {
            (6..16).map(move |hour| {
                let instant = format!("{day}T{hour:02}:00");
                ran(&instant, &instant, 0)
            })
        })
        .collect();
    assert_eq!(events, expected);

    let skipping =
        task("every: 1h\ntz: Europe/Berlin\nactive_hours: \"08:00-18:00\"\nmissed: skip");
    let (events, _) = simulate(
        &skipping,
        "2026-05-04T12:30:00Z",
        "2026-05-05T06:30:00Z",
        &[],
        silent,
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T13:00", "05-04T13:00", 0),
            ran("05-04T14:00", "05-04T14:00", 0),
            ran("05-04T15:00", "05-04T15:00", 0),
            skipped(
                "05-04T16:00",
                "05-05T05:00",
                14,
                "outside active hours 08:00-18:00 (Europe/Berlin)"
            ),
            ran("05-05T06:00", "05-05T06:00", 0),
        ]
    );

    let (events, _) = simulate(
        &hourly,
        "2026-05-04T13:30:00Z",
        "2026-05-05T06:30:00Z",
        &[("2026-05-04T14:30:00Z", "2026-05-04T16:30:00Z")],
        silent,
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T14:00", "05-04T14:00", 0),
            skipped(
                "05-04T15:00",
                "05-04T16:00",
                2,
                "outside active hours 08:00-18:00 (Europe/Berlin)"
            ),
            ran("05-05T06:00", "05-05T06:00", 0),
        ]
    );
}

#[test]
fn a_coalesced_run_counts_only_missed_slots_inside_active_hours() {
    let hourly = task("every: 1h\nactive_hours: \"08:00-18:00\"");
    let (events, _) = simulate(
        &hourly,
        "2026-05-04T16:30:00Z",
        "2026-05-05T10:30:00Z",
        &[("2026-05-04T16:40:00Z", "2026-05-05T10:10:00Z")],
        silent,
    );
    assert_eq!(events, vec![ran("05-05T10:00", "05-05T10:10", 3)]);
}

#[test]
fn a_failed_slot_is_retried_with_backoff_then_given_up() {
    let failing_at_nine = |slot: Timestamp| {
        if slot == at("2026-05-04T09:00:00Z") {
            SlotOutcome::Failed {
                reason: "model returned 500".into(),
            }
        } else {
            SlotOutcome::Silent
        }
    };
    let half_hourly = task("every: 30m");
    let (events, state) = simulate(
        &half_hourly,
        "2026-05-04T08:45:00Z",
        "2026-05-04T09:30:00Z",
        &[],
        failing_at_nine,
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T09:00", "05-04T09:00", 0),
            ran("05-04T09:00", "05-04T09:01", 0),
            ran("05-04T09:00", "05-04T09:06", 0),
            ran("05-04T09:00", "05-04T09:21", 0),
            ran("05-04T09:30", "05-04T09:30", 0),
        ]
    );
    assert_eq!(
        state.task(&half_hourly.name).unwrap().retry,
        None,
        "the slot that succeeded on its retry is done"
    );

    let every_ten = task("every: 10m");
    let (events, state) = simulate(
        &every_ten,
        "2026-05-04T08:55:00Z",
        "2026-05-04T09:09:00Z",
        &[],
        failing_at_nine,
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T09:00", "05-04T09:00", 0),
            ran("05-04T09:00", "05-04T09:01", 0),
            ran("05-04T09:00", "05-04T09:06", 0),
        ]
    );
    let after_three = state.task(&every_ten.name).unwrap();
    assert_eq!(
        after_three.retry,
        Some(PendingRetry {
            slot: at("2026-05-04T09:00:00Z"),
            failures: 3,
            last_failed_at: at("2026-05-04T09:06:00Z"),
        })
    );
    assert_eq!(
        plan(
            &every_ten,
            Some(after_three),
            at("2026-05-04T08:55:00Z"),
            at("2026-05-04T09:07:00Z")
        ),
        Plan::Wait {
            until: at("2026-05-04T09:10:00Z")
        }
    );
    assert_eq!(
        plan(
            &every_ten,
            Some(after_three),
            at("2026-05-04T08:55:00Z"),
            at("2026-05-04T09:10:00Z")
        ),
        Plan::Run {
            slot: at("2026-05-04T09:10:00Z"),
            coalesced: 0
        }
    );
}

#[test]
fn a_retry_due_after_a_newer_slot_gives_way_to_it() {
    let half_hourly = task("every: 30m");
    let state = reduce([
        LedgerRecord::SlotStarted {
            task: half_hourly.name.clone(),
            slot: at("2026-05-04T09:00:00Z"),
            run: "a".into(),
            manual: false,
            coalesced: 0,
            at: at("2026-05-04T09:00:00Z"),
        },
        LedgerRecord::SlotFinished {
            task: half_hourly.name.clone(),
            slot: at("2026-05-04T09:00:00Z"),
            run: "a".into(),
            outcome: SlotOutcome::Failed {
                reason: "sandbox did not boot".into(),
            },
            at: at("2026-05-04T09:10:00Z"),
        },
    ]);
    let state = state.task(&half_hourly.name);
    let first_seen = at("2026-05-04T08:00:00Z");
    assert_eq!(
        plan(&half_hourly, state, first_seen, at("2026-05-04T09:10:30Z")),
        Plan::Wait {
            until: at("2026-05-04T09:11:00Z")
        }
    );
    assert_eq!(
        plan(&half_hourly, state, first_seen, at("2026-05-04T09:11:00Z")),
        Plan::Run {
            slot: at("2026-05-04T09:00:00Z"),
            coalesced: 0
        }
    );
    assert_eq!(
        plan(&half_hourly, state, first_seen, at("2026-05-04T09:45:00Z")),
        Plan::Run {
            slot: at("2026-05-04T09:30:00Z"),
            coalesced: 0
        }
    );
}

#[test]
fn invalid_verdicts_count_as_failures_but_are_not_retried() {
    let half_hourly = task("every: 30m");
    let (events, state) = simulate(
        &half_hourly,
        "2026-05-04T08:45:00Z",
        "2026-05-04T10:00:00Z",
        &[],
        |_| SlotOutcome::Invalid {
            reason: "the reply is empty".into(),
        },
    );
    assert_eq!(
        events,
        vec![
            ran("05-04T09:00", "05-04T09:00", 0),
            ran("05-04T09:30", "05-04T09:30", 0),
            ran("05-04T10:00", "05-04T10:00", 0),
        ]
    );
    let state = state.task(&half_hourly.name).unwrap();
    assert_eq!(state.retry, None);
}

fn started(task: &TaskName, slot: &str, run: &str, manual: bool) -> LedgerRecord {
    LedgerRecord::SlotStarted {
        task: task.clone(),
        slot: at(slot),
        run: run.into(),
        manual,
        coalesced: 0,
        at: at(slot),
    }
}

fn finished(task: &TaskName, slot: &str, run: &str, outcome: SlotOutcome) -> LedgerRecord {
    LedgerRecord::SlotFinished {
        task: task.clone(),
        slot: at(slot),
        run: run.into(),
        outcome,
        at: at(slot),
    }
}

#[test]
fn the_fold_keeps_scheduled_and_manual_runs_apart() {
    let name = TaskName::try_from("t").unwrap();
    let failed = || SlotOutcome::Failed { reason: "x".into() };
    let state = reduce([
        started(&name, "2026-05-04T09:00:00Z", "a", false),
        finished(&name, "2026-05-04T09:00:00Z", "a", SlotOutcome::Silent),
        started(&name, "2026-05-04T09:10:00Z", "m", true),
        finished(&name, "2026-05-04T09:10:00Z", "m", failed()),
        started(&name, "2026-05-04T09:30:00Z", "b", false),
        finished(&name, "2026-05-04T09:30:00Z", "b", failed()),
        started(&name, "2026-05-04T10:00:00Z", "c", false),
    ]);
    let task = state.task(&name).unwrap();
    assert_eq!(task.done_through, Some(at("2026-05-04T09:00:00Z")));
    let last = task.last_outcome.as_ref().unwrap();
    assert_eq!((last.run.as_str(), last.manual), ("b", false));
    assert_eq!(task.open.len(), 1);
    assert_eq!(task.open[0].run, "c");
    assert_eq!(
        task.retry.as_ref().unwrap().slot,
        at("2026-05-04T09:30:00Z")
    );

    let state = reduce([
        started(&name, "2026-05-04T09:00:00Z", "a", false),
        finished(&name, "2026-05-04T09:00:00Z", "a", SlotOutcome::Silent),
        started(&name, "2026-05-04T09:10:00Z", "m", true),
        finished(&name, "2026-05-04T09:10:00Z", "m", SlotOutcome::Silent),
        finished(
            &name,
            "2026-05-04T09:20:00Z",
            "unknown",
            SlotOutcome::Skipped {
                reason: "check exited 1".into(),
            },
        ),
    ]);
    let task = state.task(&name).unwrap();
    assert_eq!(task.done_through, Some(at("2026-05-04T09:20:00Z")));
    assert!(
        task.last_outcome.as_ref().unwrap().outcome
            == SlotOutcome::Skipped {
                reason: "check exited 1".into()
            }
    );
    assert!(task.open.is_empty());
}

#[test]
fn disabled_stopped_and_running_tasks_do_not_run() {
    let half_hourly = task("every: 30m");
    let first_seen = at("2026-05-04T08:00:00Z");
    let now = at("2026-05-04T12:00:00Z");
    let mut disabled = half_hourly.clone();
    disabled.enabled = false;
    assert_eq!(plan(&disabled, None, first_seen, now), Plan::Disabled);

    let stop = |fingerprint: String| {
        reduce([LedgerRecord::TaskStopped {
            task: half_hourly.name.clone(),
            reason: "401 from the provider".into(),
            fingerprint,
            at: first_seen,
        }])
    };
    let same = stop(half_hourly.fingerprint());
    assert_eq!(
        plan(&half_hourly, same.task(&half_hourly.name), first_seen, now),
        Plan::Stopped {
            reason: "401 from the provider".into(),
            entry_changed: false
        }
    );
    let other = stop("0123".into());
    assert_eq!(
        plan(&half_hourly, other.task(&half_hourly.name), first_seen, now),
        Plan::Stopped {
            reason: "401 from the provider".into(),
            entry_changed: true
        }
    );
    let mut resumed = same;
    resumed.apply(LedgerRecord::TaskResumed {
        task: half_hourly.name.clone(),
        at: now,
    });
    assert_eq!(
        plan(
            &half_hourly,
            resumed.task(&half_hourly.name),
            first_seen,
            now
        ),
        Plan::Run {
            slot: now,
            coalesced: 7
        }
    );

    let open = reduce([started(
        &half_hourly.name,
        "2026-05-04T11:30:00Z",
        "r",
        false,
    )]);
    assert_eq!(
        plan(&half_hourly, open.task(&half_hourly.name), first_seen, now),
        Plan::Running {
            run: "r".into(),
            slot: at("2026-05-04T11:30:00Z")
        }
    );
}

#[test]
fn records_are_one_json_object_per_line() {
    let name = TaskName::try_from("standup").unwrap();
    let records = vec![
        LedgerRecord::SlotStarted {
            task: name.clone(),
            slot: at("2026-05-04T09:00:00Z"),
            run: "r1".into(),
            manual: false,
            coalesced: 2,
            at: at("2026-05-04T09:00:01Z"),
        },
        LedgerRecord::SlotFinished {
            task: name.clone(),
            slot: at("2026-05-04T09:00:00Z"),
            run: "r1".into(),
            outcome: SlotOutcome::Message {
                text: "two PRs merged".into(),
                target: "ops:standup".into(),
                delivery: "d1".into(),
            },
            at: at("2026-05-04T09:00:30Z"),
        },
        LedgerRecord::SlotFinished {
            task: name.clone(),
            slot: at("2026-05-04T09:30:00Z"),
            run: "r2".into(),
            outcome: SlotOutcome::Steer {
                text: "look at CI".into(),
                lane: LaneName::try_from("main").unwrap(),
            },
            at: at("2026-05-04T09:30:30Z"),
        },
        LedgerRecord::SlotsSkipped {
            task: name.clone(),
            from: at("2026-05-04T10:00:00Z"),
            to: at("2026-05-04T11:00:00Z"),
            count: 3,
            reason: "missed".into(),
            at: at("2026-05-04T11:05:00Z"),
        },
        LedgerRecord::TaskStopped {
            task: name.clone(),
            reason: "quota".into(),
            fingerprint: "ab".into(),
            at: at("2026-05-04T11:05:00Z"),
        },
        LedgerRecord::TaskResumed {
            task: name,
            at: at("2026-05-04T12:00:00Z"),
        },
    ];
    let lines: Vec<String> = records
        .iter()
        .map(|record| serde_json::to_string(record).unwrap())
        .collect();
    assert_eq!(
        lines[1],
        r#"{"type":"slot_finished","task":"standup","slot":"2026-05-04T09:00:00Z","run":"r1","outcome":{"outcome":"message","text":"two PRs merged","target":"ops:standup","delivery":"d1"},"at":"2026-05-04T09:00:30Z"}"#
    );
    assert!(lines[0].starts_with(r#"{"type":"slot_started","task":"standup","#));
    assert!(lines[4].starts_with(r#"{"type":"task_stopped","#));
    for (line, record) in lines.iter().zip(&records) {
        assert_eq!(&serde_json::from_str::<LedgerRecord>(line).unwrap(), record);
    }
    assert!(
        serde_json::from_str::<LedgerRecord>(
            r#"{"type":"task_resumed","task":"Bad Name","at":"2026-05-04T12:00:00Z"}"#
        )
        .is_err()
    );
}

#[test]
fn a_run_went_wrong_when_its_reply_was_no_verdict_or_it_failed_or_was_interrupted() {
    let reason = || "why".to_owned();
    let rows = [
        (SlotOutcome::Silent, false),
        (
            SlotOutcome::Message {
                text: "hi".into(),
                target: "tg:team".into(),
                delivery: "d1".into(),
            },
            false,
        ),
        (
            SlotOutcome::Steer {
                text: "look".into(),
                lane: crate::name::LaneName::try_from("main").unwrap(),
            },
            false,
        ),
        (SlotOutcome::Skipped { reason: reason() }, false),
        (SlotOutcome::Invalid { reason: reason() }, true),
        (SlotOutcome::Failed { reason: reason() }, true),
        (SlotOutcome::Interrupted { reason: reason() }, true),
    ];
    for (outcome, wrong) in rows {
        assert_eq!(outcome.went_wrong(), wrong, "{outcome:?}");
    }
}
