use perch::agent::{self, AgentDir};

/// Every example agent in `agents/` loads cleanly.
#[test]
fn every_example_agent_loads() {
    let agents = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
    let mut loaded = 0;
    for item in std::fs::read_dir(&agents).unwrap() {
        let path = item.unwrap().path();
        let dir =
            AgentDir::open(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        if let Err(problems) = agent::load(&dir) {
            panic!("{} does not load:\n{problems}", path.display());
        }
        loaded += 1;
    }
    assert!(loaded >= 1);
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
    assert_eq!(files, vec!["discord.lua", "matrix.lua", "telegram.lua"]);
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
