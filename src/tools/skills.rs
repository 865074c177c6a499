//! The skills catalog: every `workspace/skills/**/SKILL.md`, read on the host without following
//! symlinks, checked by the core. A broken skill is reported and left out; it never stops the
//! agent.

use crate::host::workspace::{EntryKind, WorkspaceDir};
use crate::sandbox::GUEST_WORKSPACE;
use perch_core::Problem;
use perch_core::problem::Pos;
pub use perch_core::skill::Skill;
use perch_core::skill::{SkillFile, check_skills};
use std::ffi::OsStr;
use std::path::Path;

/// The skills directory, relative to the workspace.
const SKILLS_DIR: &str = "skills";
/// The file that makes a directory a skill.
const SKILL_FILE: &str = "SKILL.md";
/// The most directories between `skills/` and a `SKILL.md`.
const SKILLS_MAX_DEPTH: usize = 5;
/// The most skills in the catalog.
const SKILLS_MAX: usize = 100;
/// The most directory entries the search looks at, so that a huge tree costs little.
const ENTRIES_MAX: usize = 10_000;

/// The skills in `workspace` (the agent's `workspace/` on the host), in path order, and the
/// problems of the ones left out. Hidden directories are not searched; a symlink is never
/// followed, and each one is reported.
pub fn skills_catalog(workspace: &Path) -> (Vec<Skill>, Vec<Problem>) {
    let mut search = Search {
        files: Vec::new(),
        problems: Vec::new(),
        entries_left: ENTRIES_MAX,
    };
    match WorkspaceDir::open(workspace, Path::new(SKILLS_DIR)) {
        Ok(Some(skills)) => search.walk(&skills, 0),
        Ok(None) => {}
        Err(problem) => search.problems.push(problem),
    }
    let (skills, checked) = check_skills(&search.files);
    let mut problems = search.problems;
    problems.extend(checked);
    (skills, problems)
}

struct Search {
    files: Vec<SkillFile>,
    problems: Vec<Problem>,
    entries_left: usize,
}

impl Search {
    fn walk(&mut self, dir: &WorkspaceDir, depth: usize) {
        let (entries, complete) = match dir.entries(self.entries_left) {
            Ok(listing) => listing,
            Err(problem) => {
                self.problems.push(problem);
                return;
            }
        };
        self.entries_left -= entries.len();
        if !complete {
            self.problem(
                Path::new(SKILLS_DIR),
                format!(
                    "holds more than {ENTRIES_MAX} entries; the rest were not searched for skills"
                ),
                "keep only skills under skills/",
            );
        }
        for (name, kind) in entries {
            let relative = dir.relative().join(&name);
            let Some(name) = name.to_str() else {
                self.problem(
                    &relative,
                    "has a name that is not UTF-8, so it is not searched for skills".to_owned(),
                    "rename it",
                );
                continue;
            };
            match kind {
                EntryKind::Symlink => self.problem(
                    &relative,
                    "is a symlink; perch does not follow symlinks under workspace/skills/, so no skill is read through it".to_owned(),
                    "replace the symlink with the directory or file itself",
                ),
                EntryKind::Directory if !name.starts_with('.') && depth < SKILLS_MAX_DEPTH => {
                    match dir.subdir(OsStr::new(name)) {
                        Ok(Some(subdir)) => self.walk(&subdir, depth + 1),
                        Ok(None) => {}
                        Err(problem) => self.problems.push(problem),
                    }
                }
                EntryKind::File if name == SKILL_FILE => self.read(dir, &relative),
                _ => {}
            }
        }
    }

    fn read(&mut self, dir: &WorkspaceDir, relative: &Path) {
        if self.files.len() == SKILLS_MAX {
            self.problem(
                relative,
                format!("is left out: the catalog holds at most {SKILLS_MAX} skills"),
                "merge or remove skills",
            );
            return;
        }
        let shown = relative.display();
        match dir.read_file(OsStr::new(SKILL_FILE)) {
            Ok(Some(read)) => self.files.push(SkillFile {
                file: format!("workspace/{shown}"),
                guest_path: format!("{GUEST_WORKSPACE}/{shown}"),
                text: read.text,
            }),
            Ok(None) => {}
            Err(problem) => self.problems.push(problem),
        }
    }

    fn problem(&mut self, relative: &Path, message: String, fix: &str) {
        self.problems.push(
            Problem::new(
                format!("workspace/{}", relative.display()),
                Pos::default(),
                message,
            )
            .with_fix(fix),
        );
    }
}
