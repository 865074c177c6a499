//! The example agents in `agents/` and the stock channels: each loads and behaves as shown.

use perch::agent::{self, AgentDir};
use perch::heartbeat;
use perch_core::config::{DmPolicy, GroupPolicy};

fn example_agent(name: &str) -> agent::LoadedAgent {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("agents")
        .join(name);
    let dir = AgentDir::open(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    agent::load(&dir).unwrap_or_else(|problems| panic!("{name} does not load:\n{problems}"))
}

/// Every example agent in `agents/` loads cleanly, its workspace/HEARTBEAT.yml checks against
/// it (the room aliases its channels declare, the models it declares), and its skills check.
#[test]
fn every_example_agent_loads() {
    let agents = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
    let mut names = Vec::new();
    for item in std::fs::read_dir(&agents).unwrap() {
        let path = item.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let loaded = example_agent(&name);
        let file = heartbeat::file_path(&loaded.dir);
        assert!(file.is_file(), "{name} has no workspace/HEARTBEAT.yml");
        let env = heartbeat::heartbeat_env(&loaded, chrono_tz::Tz::UTC);
        if let Err(problems) = heartbeat::read_file(&loaded.dir, &env) {
            panic!("{name}/workspace/HEARTBEAT.yml does not check:\n{problems}");
        }
        let (_, problems) = perch::tools::skills::skills_catalog(&loaded.dir.workspace());
        assert!(problems.is_empty(), "{name}'s skills: {problems:?}");
        names.push(name);
    }
    for expected in ["starter", "helpdesk", "standup"] {
        assert!(
            names.iter().any(|name| name == expected),
            "agents/{expected} is missing"
        );
    }
}

/// The helpdesk example answers in a Discord channel and a Matrix room, only when addressed,
/// pairs unknown direct messages, and has no schedule.
#[test]
fn the_helpdesk_example_pairs_and_answers_when_addressed() {
    let loaded = example_agent("helpdesk");
    let channels: Vec<&str> = loaded
        .channels
        .iter()
        .map(|channel| channel.config.name.as_str())
        .collect();
    assert_eq!(channels, ["discord", "matrix"]);
    for channel in &loaded.channels {
        let config = &channel.config;
        assert_eq!(config.dm, DmPolicy::Pair, "{}", config.name);
        assert_eq!(config.groups, GroupPolicy::Mention, "{}", config.name);
        assert!(
            config
                .rooms
                .keys()
                .any(|alias| alias.as_str() == "helpdesk"),
            "{} declares no helpdesk room",
            config.name
        );
    }
    assert!(
        loaded.definition.sandbox.allow.is_empty(),
        "the helpdesk has egress"
    );
    let env = heartbeat::heartbeat_env(&loaded, chrono_tz::Tz::UTC);
    let file = heartbeat::read_file(&loaded.dir, &env).unwrap();
    assert!(file.tasks.is_empty());
}

/// The stand-up example posts its weekday digest to the room its Matrix channel declares, and
/// its hourly task has a check, so an idle hour costs no tokens.
#[test]
fn the_standup_example_delivers_a_digest_and_checks_hourly() {
    let loaded = example_agent("standup");
    let env = heartbeat::heartbeat_env(&loaded, chrono_tz::Tz::UTC);
    let file =
        heartbeat::read_file(&loaded.dir, &env).unwrap_or_else(|problems| panic!("{problems}"));
    let delivered: Vec<String> = file
        .tasks
        .iter()
        .filter_map(|task| task.delivery.as_ref().map(ToString::to_string))
        .collect();
    assert!(
        !delivered.is_empty(),
        "no task of the stand-up agent delivers"
    );
    assert!(delivered.iter().all(|target| target == "matrix:standup"));
    let digest = file
        .tasks
        .iter()
        .find(|task| task.name.as_str() == "standup")
        .expect("a task named standup");
    assert!(digest.delivery.is_some() && digest.check.is_none());
    assert_eq!(digest.tz, chrono_tz::Europe::Berlin);
    let blockers = file
        .tasks
        .iter()
        .find(|task| task.name.as_str() == "blockers")
        .expect("a task named blockers");
    assert!(blockers.delivery.is_some() && blockers.check.is_some());
    assert_eq!(loaded.channels.len(), 1);
    assert_eq!(loaded.channels[0].config.kind().as_str(), "matrix");
}

/// Every stock adapter in `channels/` is the one compiled in, and loads with no problems when
/// copied into a fresh agent.
#[test]
fn every_stock_channel_loads() {
    use perch_core::config::ChannelKind;
    let stock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("channels");
    let mut files: Vec<String> = std::fs::read_dir(&stock)
        .unwrap()
        .map(|item| item.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        vec!["discord.lua", "matrix.lua", "slack.lua", "telegram.lua"]
    );
    for kind in ChannelKind::ALL {
        let file = format!("{kind}.lua");
        let text = std::fs::read_to_string(stock.join(&file)).unwrap();
        assert_eq!(
            text,
            agent::stock_channel(kind),
            "{file} is not the one compiled in"
        );

        let dir = super::support::new_agent();
        super::support::write(dir.path(), &format!("channels/{file}"), &text);
        let loaded = agent::load(&AgentDir::open(dir.path()).unwrap())
            .unwrap_or_else(|problems| panic!("channels/{file} does not load:\n{problems}"));
        assert_eq!(loaded.channels.len(), 1);
        let config = &loaded.channels[0].config;
        assert_eq!(config.kind(), kind);
        assert_eq!(config.name.as_str(), kind.as_str());
        assert!(config.on_message.is_none() && config.format.is_none());
    }
}
