//! `perch init`: an agent directory made, or completed.

use super::{dir_or_current, emit};
use crate::agent::{self, InitStatus};
use std::path::PathBuf;
use std::process::ExitCode;

/// Create an agent directory, or fill in what it lacks
///
/// Idempotent: files you edited are kept, and nothing outside DIR is written.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The agent directory [default: the current directory]
    pub dir: Option<PathBuf>,
}

/// The variable the agent's model's key is read from, when its files check and it has one.
fn model_key(root: &std::path::Path) -> Option<String> {
    let dir = agent::AgentDir::open(root).ok()?;
    let loaded = agent::load(&dir).ok()?;
    let (provider, _) = loaded.definition.model();
    provider
        .api_key
        .as_ref()
        .map(|key| key.name().as_str().to_owned())
}

pub fn run(args: InitArgs) -> Result<ExitCode, String> {
    let dir = dir_or_current(args.dir);
    let (root, items) =
        agent::init(&dir).map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    let mut out = format!("initialised {}\n", root.display());
    let mut refused = false;
    for item in &items {
        let (word, note) = match &item.status {
            InitStatus::Created => ("created", String::new()),
            InitStatus::Unchanged => ("unchanged", String::new()),
            InitStatus::Changed => ("changed", "  (yours, kept as it is)".to_owned()),
            InitStatus::Refused { reason } => {
                refused = true;
                ("refused", format!("  ({reason})"))
            }
        };
        out.push_str(&format!("  {word:<10} {}{note}\n", item.path));
    }
    out.push_str(
        "\nedit instructions.md (who the agent is) and models.yml (its model); to reach it from a chat:\n",
    );
    out.push_str(&super::next_line(
        &dir,
        &model_key(&root).into_iter().collect::<Vec<_>>(),
        &["perch channel add telegram", "perch doctor", "perch run"],
    ));
    emit(&out)?;
    Ok(if refused {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
