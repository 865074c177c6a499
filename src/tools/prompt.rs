//! Assembling an agent's system prompt: `instructions.md` as loaded, the workspace's
//! `AGENTS.md`, `SOUL.md` and `KNOWLEDGE.md` read on the host without following symlinks, and
//! the skills catalog; a conversation on one of the agent's chat channels is told how files
//! travel. The text itself is made by the core's
//! [`system_prompt`](perch_core::prompt::system_prompt).

use crate::agent::LoadedAgent;
use crate::host::workspace::{WORKSPACE_FILE_LIMIT, read_workspace_file};
use crate::sandbox::GUEST_WORKSPACE;
use crate::tools::skills::skills_catalog;
use perch_core::Problem;
pub use perch_core::prompt::Origin;
use perch_core::prompt::{PromptFile, PromptParts};
use std::path::Path;

/// The workspace files the system prompt holds, in order.
const PROMPT_FILES: [&str; 3] = ["AGENTS.md", "SOUL.md", "KNOWLEDGE.md"];

/// The system prompt for a conversation from `origin`, and the problems met on the way: a
/// refused or cut file, a broken skill. None of them stops the prompt; what could not be read
/// is left out.
pub fn system_prompt(agent: &LoadedAgent, origin: Option<Origin>) -> (String, Vec<Problem>) {
    let workspace = agent.dir.workspace();
    let mut problems = Vec::new();
    let [agents, soul, knowledge] =
        PROMPT_FILES.map(|name| workspace_file(&workspace, name, &mut problems));
    let (skills, skill_problems) = skills_catalog(&workspace);
    problems.extend(skill_problems);
    let files = origin.as_ref().is_some_and(|origin| {
        agent
            .channels
            .iter()
            .any(|channel| channel.config.name.as_str() == origin.channel)
    });
    let parts = PromptParts {
        instructions: agent.instructions.as_ref().map(|text| PromptFile {
            name: "instructions.md".to_owned(),
            text: text.clone(),
            cut_from: None,
        }),
        agents,
        soul,
        knowledge,
        skills,
        origin,
        files,
    };
    (perch_core::prompt::system_prompt(&parts), problems)
}

fn workspace_file(workspace: &Path, name: &str, problems: &mut Vec<Problem>) -> Option<PromptFile> {
    match read_workspace_file(workspace, Path::new(name)) {
        Ok(Some(read)) => {
            if read.cut_from.is_some() {
                problems.push(
                    Problem::new(
                        format!("workspace/{name}"),
                        perch_core::problem::Pos::default(),
                        format!(
                            "is longer than {} KiB; the system prompt holds only its beginning",
                            WORKSPACE_FILE_LIMIT / 1024
                        ),
                    )
                    .with_fix("keep it short and move details into knowledge/"),
                );
            }
            Some(PromptFile {
                name: format!("{GUEST_WORKSPACE}/{name}"),
                text: read.text,
                cut_from: read.cut_from,
            })
        }
        Ok(None) => None,
        Err(problem) => {
            problems.push(problem);
            None
        }
    }
}
