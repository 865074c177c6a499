//! The skills catalog and the system prompt, read from a real agent directory on the host.

use super::support::{new_agent, write};
use perch::agent::{self, AgentDir, LoadedAgent};
use perch::tools::prompt::{Origin, system_prompt};
use perch::tools::skills::{Skill, skills_catalog};
use std::os::unix::fs::symlink;
use std::path::Path;

const GOOD: &str = "---\nname: release-notes\ndescription: How to write the weekly release notes\n---\n\n1. Read the log.\n";

fn load(dir: &Path) -> LoadedAgent {
    agent::load(&AgentDir::open(dir).unwrap()).unwrap_or_else(|problems| panic!("{problems}"))
}

fn rendered(problems: &[perch_core::Problem]) -> Vec<String> {
    problems.iter().map(ToString::to_string).collect()
}

#[test]
fn skills_are_listed_and_a_broken_one_is_reported_and_skipped() {
    let dir = new_agent();
    let root = dir.path();
    write(root, "workspace/skills/release-notes/SKILL.md", GOOD);
    write(
        root,
        "workspace/skills/broken/SKILL.md",
        "---\nname: Broken Skill\ndescription: x\n---\n",
    );
    write(
        root,
        "workspace/skills/nested/deeper/triage/SKILL.md",
        "---\nname: triage\ndescription: >-\n  Sort incoming issues\n---\n",
    );
    write(
        root,
        "workspace/skills/release-notes/template.md",
        "not a skill",
    );
    write(root, "workspace/skills/.hidden/SKILL.md", "not searched");
    let (skills, problems) = skills_catalog(&root.join("workspace"));
    assert_eq!(
        skills,
        vec![
            Skill {
                name: "triage".into(),
                description: "Sort incoming issues".into(),
                path: "/workspace/skills/nested/deeper/triage/SKILL.md".into(),
            },
            Skill {
                name: "release-notes".into(),
                description: "How to write the weekly release notes".into(),
                path: "/workspace/skills/release-notes/SKILL.md".into(),
            },
        ]
    );
    assert_eq!(
        rendered(&problems),
        vec![
            "workspace/skills/broken/SKILL.md:2:7: name: \"Broken Skill\" is not a skill name\n  fix: use 1 to 64 lowercase letters, digits and single hyphens, not starting or ending with a hyphen, such as release-notes"
        ]
    );
}

#[test]
fn symlinked_skills_are_refused_and_never_read() {
    let dir = new_agent();
    let root = dir.path();
    let host = tempfile::tempdir().unwrap();
    write(
        host.path(),
        "stolen/SKILL.md",
        "---\nname: stolen\ndescription: host-only-7d1e\n---\n",
    );
    std::fs::create_dir_all(root.join("workspace/skills/mine")).unwrap();
    symlink(
        host.path().join("stolen"),
        root.join("workspace/skills/linked-dir"),
    )
    .unwrap();
    symlink(
        host.path().join("stolen/SKILL.md"),
        root.join("workspace/skills/mine/SKILL.md"),
    )
    .unwrap();
    let (skills, problems) = skills_catalog(&root.join("workspace"));
    assert_eq!(skills, vec![]);
    let text = rendered(&problems);
    assert_eq!(text.len(), 2, "{text:#?}");
    assert!(
        text[0].starts_with("workspace/skills/linked-dir: is a symlink"),
        "{text:#?}"
    );
    assert!(
        text[1].starts_with("workspace/skills/mine/SKILL.md: is a symlink"),
        "{text:#?}"
    );
    assert!(!text.concat().contains("host-only"));
}

#[test]
fn a_skills_directory_replaced_by_a_symlink_is_not_listed() {
    let dir = new_agent();
    let root = dir.path();
    let host = tempfile::tempdir().unwrap();
    write(
        host.path(),
        "host-only-3b8f/SKILL.md",
        "---\nname: stolen\ndescription: x\n---\n",
    );
    std::fs::remove_dir_all(root.join("workspace/skills")).unwrap();
    symlink(host.path(), root.join("workspace/skills")).unwrap();
    let (skills, problems) = skills_catalog(&root.join("workspace"));
    assert_eq!(skills, vec![]);
    assert_eq!(
        rendered(&problems),
        vec![
            "workspace/skills: is a symlink; perch reads workspace files on the host and never follows a symlink there\n  fix: replace the symlink with the file or directory itself"
        ]
    );
}

#[test]
fn the_system_prompt_holds_instructions_workspace_files_skills_and_origin() {
    let dir = new_agent();
    let root = dir.path();
    write(
        root,
        "instructions.md",
        "You are Wren, the team's release helper.\n",
    );
    write(root, "workspace/SOUL.md", "Be brief.\n");
    write(root, "workspace/skills/release-notes/SKILL.md", GOOD);
    let agent = load(root);
    let (prompt, problems) = system_prompt(
        &agent,
        Some(Origin {
            channel: "discord".into(),
            room: Some("#releases".into()),
        }),
    );
    assert_eq!(problems, vec![]);
    assert!(
        prompt.starts_with("You are Wren, the team's release helper.\n\n# Your sandbox\n"),
        "{prompt}"
    );
    let agents = prompt
        .find("# /workspace/AGENTS.md\n\n# How you keep yourself")
        .unwrap();
    let soul = prompt.find("# /workspace/SOUL.md\n\nBe brief.").unwrap();
    let knowledge = prompt.find("# /workspace/KNOWLEDGE.md").unwrap();
    let skills = prompt
        .find("- release-notes: How to write the weekly release notes (read /workspace/skills/release-notes/SKILL.md)")
        .unwrap();
    assert!(agents < soul && soul < knowledge && knowledge < skills);
    assert!(
        prompt.ends_with("# This conversation\n\nChannel: discord\nRoom: #releases"),
        "{prompt}"
    );
    let (terminal, _) = system_prompt(&agent, Some(Origin::terminal()));
    assert!(terminal.ends_with("Channel: terminal"), "{terminal}");
}

#[test]
fn a_symlinked_agents_md_is_refused_and_a_long_file_is_cut() {
    let dir = new_agent();
    let root = dir.path();
    let host = tempfile::tempdir().unwrap();
    write(host.path(), "secret.md", "host-only-91ab\n");
    std::fs::remove_file(root.join("workspace/AGENTS.md")).unwrap();
    symlink(
        host.path().join("secret.md"),
        root.join("workspace/AGENTS.md"),
    )
    .unwrap();
    write(root, "workspace/KNOWLEDGE.md", &"k".repeat(70_000));
    let agent = load(root);
    let (prompt, problems) = system_prompt(&agent, None);
    assert!(!prompt.contains("host-only"), "{prompt}");
    assert!(!prompt.contains("# /workspace/AGENTS.md"), "{prompt}");
    assert!(
        prompt.ends_with("[/workspace/KNOWLEDGE.md is 70000 bytes; only its beginning is shown here. Read the rest with read.]"),
        "{}",
        &prompt[prompt.len() - 200..]
    );
    assert_eq!(
        rendered(&problems),
        vec![
            "workspace/AGENTS.md: is a symlink; perch reads workspace files on the host and never follows a symlink there\n  fix: replace the symlink with the file or directory itself".to_owned(),
            "workspace/KNOWLEDGE.md: is longer than 64 KiB; the system prompt holds only its beginning\n  fix: keep it short and move details into knowledge/".to_owned(),
        ]
    );
}
