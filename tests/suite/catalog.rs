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
