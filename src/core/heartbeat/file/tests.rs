use super::*;
use std::time::Duration;

fn env() -> HeartbeatEnv {
    HeartbeatEnv {
        host_tz: chrono_tz::Europe::Berlin,
        targets: vec![
            TargetSpec {
                channel: ChannelName::try_from("ops").unwrap(),
                room: RoomAlias::try_from("standup").unwrap(),
            },
            TargetSpec {
                channel: ChannelName::try_from("ops").unwrap(),
                room: RoomAlias::try_from("alerts").unwrap(),
            },
        ],
        models: vec![ModelRef::parse("openai/gpt-mini").unwrap()],
        channels_on_disk: None,
    }
}

fn problems(text: &str) -> Vec<String> {
    parse_heartbeat_file(text, &env())
        .unwrap_err()
        .iter()
        .map(|problem| format!("{}|{}|{}", problem.pos.line, problem.path, problem.message))
        .collect()
}

const FULL: &str = r#"tasks:
  - name: standup
    prompt: "Summarise yesterday's merged pull requests."
    cron: "0 9 * * Mon-Fri"
    tz: America/New_York
    active_hours: "08:00-18:00"
    delivery: ops:standup/daily
    lane: ops-standup
    model: openai/gpt-mini
    check: "test -n \"$(ls /workspace/inbox)\""
    continue: true
    missed: skip
    enabled: false
  - name: inbox
    prompt: Look at the inbox.
    every: 30m
"#;

#[test]
fn a_full_file_reads_back() {
    let file = parse_heartbeat_file(FULL, &env()).unwrap();
    let new_york = chrono_tz::America::New_York;
    assert_eq!(
        file.tasks,
        vec![
            HeartbeatTask {
                name: TaskName::try_from("standup").unwrap(),
                pos: Pos::line(2),
                prompt: "Summarise yesterday's merged pull requests.".into(),
                schedule: Schedule::cron("0 9 * * Mon-Fri", new_york, false).unwrap(),
                tz: new_york,
                active_hours: Some(ActiveHours {
                    start: 480,
                    end: 1080
                }),
                delivery: Some(Target::parse("ops:standup/daily").unwrap()),
                lane: Some(LaneName::try_from("ops-standup").unwrap()),
                model: Some(ModelRef::parse("openai/gpt-mini").unwrap()),
                check: Some("test -n \"$(ls /workspace/inbox)\"".into()),
                continue_history: true,
                missed: Missed::Skip,
                enabled: false,
            },
            HeartbeatTask {
                name: TaskName::try_from("inbox").unwrap(),
                pos: Pos::line(14),
                prompt: "Look at the inbox.".into(),
                schedule: Schedule::Every(Duration::from_secs(1800)),
                tz: chrono_tz::Europe::Berlin,
                active_hours: None,
                delivery: None,
                lane: None,
                model: None,
                check: None,
                continue_history: false,
                missed: Missed::RunOnce,
                enabled: true,
            },
        ]
    );
    let inbox = &file.tasks[1];
    assert_eq!(inbox.steer_lane().as_str(), "heartbeat-inbox");
    assert_eq!(file.tasks[0].steer_lane().as_str(), "ops-standup");
}

#[test]
fn an_empty_file_has_no_tasks() {
    for text in ["", "\n# nothing yet\n", "tasks: []\n", "tasks:\n", "{}\n"] {
        assert_eq!(
            parse_heartbeat_file(text, &env()),
            Ok(HeartbeatFile::default()),
            "{text:?}"
        );
    }
}

#[test]
fn every_problem_is_reported_with_its_line() {
    let text = r#"tasks:
  - name: standup
    prompt: hi
    cron: "0 9 * * Mon-Fri"
    shedule: daily
  - name: standup
    prompt: again
    every: 1h
  - name: Bad Name
    prompt: ""
    cron: "0 25 * * *"
  - name: both
    prompt: x
    cron: "*/5 * * * *"
    every: 5m
  - name: neither
    prompt: x
  - name: fast
    prompt: x
    every: 4m
  - name: zone
    prompt: x
    cron: "0 9 * * *"
    tz: Mars/Olympus
  - name: places
    prompt: x
    every: 1h
    delivery: ops:random
    model: openai/gpt-huge
    missed: later
    lane: "../etc"
    continue: "yes"
    active_hours: "9-17"
"#;
    assert_eq!(
        problems(text),
        vec![
            "5|tasks[1].shedule|unknown key",
            "6|tasks[2].name|task standup is listed twice (first at line 2)",
            "9|tasks[3].name|\"Bad Name\" is not a task name",
            "10|tasks[3].prompt|must not be empty",
            "11|tasks[3].cron|the hour field \"25\" is out of range 0-23",
            "12|tasks[4]|a task has both cron and every",
            "16|tasks[5]|missing cron or every",
            "20|tasks[6].every|every 4m is more often than the floor of one run per 5m",
            "24|tasks[7].tz|unknown time zone \"Mars/Olympus\"",
            "33|tasks[8].active_hours|\"9-17\" is not a range of hours; write it as 08:00-18:00",
            "28|tasks[8].delivery|ops:random is not a room the agent's channels declare",
            "31|tasks[8].lane|\"../etc\" is not a lane name",
            "29|tasks[8].model|model openai/gpt-huge is not declared in models.yml",
            "32|tasks[8].continue|expected true or false, found a string",
            "30|tasks[8].missed|unknown missed policy \"later\"",
        ]
    );
}

#[test]
fn a_task_name_that_ends_in_dry_run_is_refused() {
    let text = "tasks:\n  - name: digest-dry-run\n    prompt: x\n    every: 1h\n";
    assert_eq!(
        problems(text),
        vec![
            "2|tasks[1].name|\"digest-dry-run\" ends in -dry-run, so its lane would be the \
             dry-run lane of the task \"digest\""
        ]
    );
    let text = "tasks:\n  - name: dry-run\n    prompt: x\n    every: 1h\n";
    assert!(parse_heartbeat_file(text, &env()).is_ok());
}

#[test]
fn fixes_name_what_is_declared() {
    let text = "tasks:\n  - name: a\n    prompt: x\n    every: 1h\n    delivery: ops:random\n    model: openai/gpt-huge\n    tz: europe/berlin\n";
    let problems = parse_heartbeat_file(text, &env()).unwrap_err();
    let rendered: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        vec![
            "workspace/HEARTBEAT.yml:7:9: tasks[1].tz: unknown time zone \"europe/berlin\"\n  \
             fix: did you mean Europe/Berlin?",
            "workspace/HEARTBEAT.yml:5:15: tasks[1].delivery: ops:random is not a room the \
             agent's channels declare\n  fix: use a declared room: ops:standup, ops:alerts",
            "workspace/HEARTBEAT.yml:6:12: tasks[1].model: model openai/gpt-huge is not \
             declared in models.yml\n  fix: use a model models.yml declares: openai/gpt-mini",
        ]
    );
    let bare = HeartbeatEnv {
        targets: Vec::new(),
        models: Vec::new(),
        ..env()
    };
    let problems = parse_heartbeat_file(text, &bare).unwrap_err();
    assert!(
        problems[1]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("no channel declares a room")
    );
    assert!(
        problems[2]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("models.yml declares no models")
    );

    let ops = |room: &str| TargetSpec {
        channel: ChannelName::try_from("ops").unwrap(),
        room: RoomAlias::try_from(room).unwrap(),
    };
    let running = |on_disk: Vec<TargetSpec>| HeartbeatEnv {
        targets: Vec::new(),
        channels_on_disk: Some(on_disk),
        ..env()
    };
    let problems = parse_heartbeat_file(text, &running(vec![ops("random")])).unwrap_err();
    assert_eq!(
        problems[1].to_string(),
        "workspace/HEARTBEAT.yml:5:15: tasks[1].delivery: ops:random is not a room the agent's \
         channels declare\n  fix: channels/ops.lua declares it now, but perch loaded that file \
         before; restart perch to load it"
    );
    let problems = parse_heartbeat_file(text, &running(vec![ops("standup")])).unwrap_err();
    assert_eq!(
        problems[1].fix.as_deref(),
        Some(
            "no channel declares a room; give a channel file rooms = { alias = \"...\" } first \
             (channel files are read at start: restart perch after editing channels/*.lua)"
        )
    );
}

#[test]
fn six_cron_fields_need_seconds_true() {
    let task = |extra: &str| {
        format!("tasks:\n  - name: a\n    prompt: x\n    cron: \"0 9 * * Mon-Fri *\"\n{extra}")
    };
    let problems = parse_heartbeat_file(&task(""), &env()).unwrap_err();
    assert_eq!(problems.len(), 1);
    let shown = problems[0].to_string();
    assert!(
        shown.starts_with(
            "workspace/HEARTBEAT.yml:4:11: tasks[1].cron: \"0 9 * * Mon-Fri *\" has six fields"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("the month field \"Mon-Fri\": \"Mon\" names a day of the week"),
        "{shown}"
    );
    assert!(
        shown.contains("fix: remove the extra field: \"0 9 * * Mon-Fri\""),
        "{shown}"
    );
    let with_seconds = parse_heartbeat_file(&task("    seconds: true\n"), &env()).unwrap_err();
    assert!(
        with_seconds[0]
            .to_string()
            .contains("tasks[1].cron: the month field \"Mon-Fri\""),
        "{}",
        with_seconds[0]
    );
    let six =
        "tasks:\n  - name: a\n    prompt: x\n    cron: \"30 0 9 * * Mon-Fri\"\n    seconds: true\n";
    let file = parse_heartbeat_file(six, &env()).unwrap();
    assert_eq!(
        file.tasks[0].schedule.to_string(),
        "cron \"30 0 9 * * Mon-Fri\" in Europe/Berlin"
    );
    let every = "tasks:\n  - name: a\n    prompt: x\n    every: 30m\n    seconds: true\n";
    assert_eq!(
        parse_heartbeat_file(every, &env()).unwrap_err()[0].message,
        "seconds: true goes with cron only"
    );
}

#[test]
fn bad_yaml_is_a_problem_with_its_line() {
    let problems = parse_heartbeat_file("tasks:\n  - name: a\n   prompt: [\n", &env()).unwrap_err();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].message.starts_with("invalid YAML"));
    assert!(problems[0].pos.line >= 2);
    let problems = parse_heartbeat_file("tasks: standup\n", &env()).unwrap_err();
    assert_eq!(
        problems[0].to_string(),
        "workspace/HEARTBEAT.yml:1:8: tasks: expected a list, found a string"
    );
    let problems = parse_heartbeat_file("task: []\n", &env()).unwrap_err();
    assert_eq!(
        problems[0].to_string(),
        "workspace/HEARTBEAT.yml:1:1: task: unknown key\n  fix: did you mean tasks? known \
         keys: tasks"
    );
}

#[test]
fn cron_patterns_below_the_floor_are_refused() {
    let task = |cron: &str| {
        let seconds = if cron.split_whitespace().count() == 6 {
            "    seconds: true\n"
        } else {
            ""
        };
        format!("tasks:\n  - name: a\n    prompt: x\n    cron: \"{cron}\"\n{seconds}")
    };
    assert!(parse_heartbeat_file(&task("*/5 * * * *"), &env()).is_ok());
    assert!(parse_heartbeat_file(&task("0 9 * * Mon-Fri"), &env()).is_ok());
    for refused in ["* * * * *", "0,1 9 * * *", "*/10 0 9 * * *"] {
        let problems = parse_heartbeat_file(&task(refused), &env()).unwrap_err();
        assert_eq!(problems.len(), 1, "{refused}");
        assert_eq!(problems[0].pos.line, 4);
        assert!(
            problems[0].message.contains("more often than the floor"),
            "{refused}: {}",
            problems[0].message
        );
        assert!(problems[0].fix.as_deref().unwrap().contains("every: 5m"));
    }
}

#[test]
fn active_hours_the_schedule_never_meets_are_refused() {
    let text = "tasks:\n  - name: a\n    prompt: x\n    cron: \"0 20 * * *\"\n    active_hours: \"08:00-18:00\"\n";
    assert_eq!(
        problems(text),
        vec![
            "2|tasks[1].active_hours|the schedule never fires inside the active hours \
             08:00-18:00 (Europe/Berlin)"
        ]
    );
}

#[test]
fn the_fingerprint_follows_the_content_not_the_position() {
    let file = parse_heartbeat_file(FULL, &env()).unwrap();
    let moved = parse_heartbeat_file(&FULL.replace("tasks:\n", "tasks:\n\n\n"), &env()).unwrap();
    assert_ne!(file.tasks[0].pos, moved.tasks[0].pos);
    assert_eq!(file.tasks[0].fingerprint(), moved.tasks[0].fingerprint());
    assert_eq!(file.tasks[0].fingerprint().len(), 32);
    assert_ne!(file.tasks[0].fingerprint(), file.tasks[1].fingerprint());
    let edited =
        parse_heartbeat_file(&FULL.replace("Look at the inbox.", "Look again."), &env()).unwrap();
    assert_eq!(file.tasks[0].fingerprint(), edited.tasks[0].fingerprint());
    assert_ne!(file.tasks[1].fingerprint(), edited.tasks[1].fingerprint());
    let mut enabled = file.tasks[0].clone();
    enabled.enabled = true;
    assert_ne!(file.tasks[0].fingerprint(), enabled.fingerprint());
}

#[test]
fn targets_read_channel_room_and_thread() {
    let target = Target::parse("ops:standup/42").unwrap();
    assert_eq!(target.channel.as_str(), "ops");
    assert_eq!(target.room.as_str(), "standup");
    assert_eq!(target.thread.as_deref(), Some("42"));
    assert_eq!(target.to_string(), "ops:standup/42");
    assert_eq!(
        Target::parse("ops:standup").unwrap().to_string(),
        "ops:standup"
    );
    for bad in [
        "ops",
        "ops:",
        ":standup",
        "ops:stand up",
        "ops:standup/",
        "o/p:s",
    ] {
        assert!(Target::parse(bad).is_err(), "{bad}");
    }
}

fn many_tasks(count: usize) -> String {
    let mut text = String::from("tasks:\n");
    for index in 0..count {
        text.push_str(&format!(
            "  - name: task-{index}\n    prompt: p\n    cron: \"{} {} * * Mon-Fri\"\n    \
             tz: {}\n    active_hours: \"10:00-11:00\"\n",
            index % 60,
            8 + index / 60,
            ["Pacific/Chatham", "Asia/Kathmandu"][index % 2],
        ));
    }
    text
}

/// Every task a different pattern that never meets its active hours: the most work a file
/// can ask of the check.
#[test]
fn at_most_the_task_limit_is_checked() {
    let problems = problems(&many_tasks(MAX_TASKS));
    assert_eq!(
        problems.len(),
        MAX_TASKS,
        "every task is checked: {problems:?}"
    );
    assert!(
        problems[0].contains("never fires inside the active hours"),
        "{problems:?}"
    );
    let problems = self::problems(&many_tasks(MAX_TASKS + 1));
    assert_eq!(
        problems,
        vec![format!(
            "2|tasks|holds 101 tasks, more than the 100 a heartbeat file may hold; none of them is checked"
        )]
    );
}
