//! Skills: reusable procedures the agent keeps in `workspace/skills/**/SKILL.md`. Each file
//! starts with YAML frontmatter naming the skill and saying when to use it; the system prompt
//! lists every skill that checks out, and the agent reads a skill's file when it needs it.

use crate::problem::{Pos, Problem};
use crate::tree::{Checker, Path, Value};
use crate::yaml;

/// The longest skill name, in characters.
pub const SKILL_NAME_MAX: usize = 64;
/// The longest skill description, in characters.
pub const SKILL_DESCRIPTION_MAX: usize = 1024;
/// The most bytes of frontmatter a `SKILL.md` may have, between its two `---` lines.
pub const SKILL_FRONTMATTER_MAX: usize = 16 * 1024;
/// The rule a skill name follows, for problems and documentation.
pub const SKILL_NAME_RULE: &str =
    "1 to 64 lowercase letters, digits and single hyphens, not starting or ending with a hyphen";

const EXAMPLE: &str =
    "---\nname: release-notes\ndescription: How to write the weekly release notes\n---";

/// One skill that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    /// When to use the skill, for the model.
    pub description: String,
    /// Where the model reads the skill with `read`: a guest path under `/workspace/skills/`.
    pub path: String,
}

/// A `SKILL.md` found in the workspace, before it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// The file as problems name it, relative to the agent directory.
    pub file: String,
    /// The file as the guest sees it.
    pub guest_path: String,
    pub text: String,
}

/// Checks every skill file, in the order given. A file that does not check out, or that
/// repeats an earlier skill's name, is reported and left out; the others make the catalog.
pub fn check_skills(files: &[SkillFile]) -> (Vec<Skill>, Vec<Problem>) {
    let mut skills: Vec<(Skill, &str)> = Vec::new();
    let mut problems = Vec::new();
    for found in files {
        match parse_skill(&found.file, &found.text) {
            Ok((name, description, pos)) => {
                if let Some((_, first)) = skills.iter().find(|(skill, _)| skill.name == name) {
                    problems.push(
                        Problem::new(
                            &found.file,
                            pos,
                            format!("the skill {name} is already defined by {first}"),
                        )
                        .with_path("name")
                        .with_fix("give one of the two skills another name"),
                    );
                    continue;
                }
                skills.push((
                    Skill {
                        name,
                        description,
                        path: found.guest_path.clone(),
                    },
                    &found.file,
                ));
            }
            Err(found) => problems.extend(found),
        }
    }
    (
        skills.into_iter().map(|(skill, _)| skill).collect(),
        problems,
    )
}

/// The name and description in one `SKILL.md`'s frontmatter, and the position of the name.
fn parse_skill(file: &str, text: &str) -> Result<(String, String, Pos), Vec<Problem>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(vec![
            Problem::new(file, Pos::line(1), "does not start with YAML frontmatter").with_fix(
                format!("begin the file with its name and description:\n{EXAMPLE}"),
            ),
        ]);
    }
    let mut frontmatter = String::new();
    let mut closed = false;
    for line in lines {
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        if frontmatter.len() + line.len() > SKILL_FRONTMATTER_MAX {
            return Err(vec![
                Problem::new(
                    file,
                    Pos::line(1),
                    format!(
                        "the frontmatter is longer than {} KiB",
                        SKILL_FRONTMATTER_MAX / 1024
                    ),
                )
                .with_fix("keep only the name and description there; move the rest into the body"),
            ]);
        }
        frontmatter.push_str(line);
    }
    if !closed {
        return Err(vec![
            Problem::new(file, Pos::line(1), "the frontmatter is never closed")
                .with_fix("end it with a line of three dashes: ---"),
        ]);
    }
    let tree = yaml::parse_from_line(file, &frontmatter, 1)?;
    let mut checker = Checker::new(file);
    let root = Path::root();
    let Some(mut fields) = (match &tree.value {
        Value::Nil => {
            checker.push(
                Problem::new(file, Pos::line(1), "the frontmatter is empty").with_fix(format!(
                    "give the skill a name and a description:\n{EXAMPLE}"
                )),
            );
            None
        }
        _ => checker.fields(&tree, &root),
    }) else {
        return Err(checker.into_problems());
    };
    let name = fields
        .required(&mut checker, "name", "name: release-notes")
        .and_then(|node| {
            let text = checker.non_empty_str(node, &root.key("name"))?;
            if is_skill_name(text) {
                Some((text.to_owned(), node.pos))
            } else {
                checker.report_fix(
                    node.pos,
                    &root.key("name"),
                    format!("{text:?} is not a skill name"),
                    format!("use {SKILL_NAME_RULE}, such as release-notes"),
                );
                None
            }
        });
    let description = fields
        .required(
            &mut checker,
            "description",
            "description: say what the skill does and when to use it",
        )
        .and_then(|node| {
            let text = checker.non_empty_str(node, &root.key("description"))?;
            let length = text.chars().count();
            if length > SKILL_DESCRIPTION_MAX {
                checker.report_fix(
                    node.pos,
                    &root.key("description"),
                    format!("is {length} characters long, more than {SKILL_DESCRIPTION_MAX}"),
                    "shorten it and move the details into the skill's body",
                );
                return None;
            }
            Some(text.trim().to_owned())
        });
    match (name, description) {
        (Some((name, pos)), Some(description)) if !checker.has_problems() => {
            Ok((name, description, pos))
        }
        _ => Err(checker.into_problems()),
    }
}

/// Whether `name` follows [`SKILL_NAME_RULE`].
fn is_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= SKILL_NAME_MAX
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> SkillFile {
        SkillFile {
            file: format!("workspace/skills/{name}/SKILL.md"),
            guest_path: format!("/workspace/skills/{name}/SKILL.md"),
            text: text.to_owned(),
        }
    }

    fn rendered(problems: &[Problem]) -> Vec<String> {
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_skill_with_a_name_and_description_is_listed() {
        let (skills, problems) = check_skills(&[file(
            "notes",
            "---\nname: release-notes\ndescription: >\n  How to write\n  the notes\nlicense: MIT\n---\n# Body\n",
        )]);
        assert_eq!(problems, vec![]);
        assert_eq!(
            skills,
            vec![Skill {
                name: "release-notes".into(),
                description: "How to write the notes".into(),
                path: "/workspace/skills/notes/SKILL.md".into(),
            }]
        );
    }

    #[test]
    fn broken_skills_are_reported_with_their_line_and_left_out() {
        let (skills, problems) = check_skills(&[
            file("a", "---\nname: Bad Name\n---\n"),
            file("b", "no frontmatter\n"),
            file("c", "---\nname: c\ndescription: never closed\n"),
            file("d", "---\nname: [x\n---\n"),
            file("e", "---\nname: e\ndescription: ok\n---\n"),
            file("f", "---\n\ndescription: a second e\nname: e\n---\n"),
        ]);
        assert_eq!(skills.len(), 1);
        assert_eq!(skills[0].name, "e");
        let text = rendered(&problems);
        assert!(
            text[0].starts_with(
                "workspace/skills/a/SKILL.md:2:7: name: \"Bad Name\" is not a skill name"
            ),
            "{text:#?}"
        );
        assert!(
            text[1].starts_with("workspace/skills/a/SKILL.md:2:")
                && text[1].contains("missing description"),
            "{text:#?}"
        );
        assert!(
            text[2]
                .starts_with("workspace/skills/b/SKILL.md:1: does not start with YAML frontmatter"),
            "{text:#?}"
        );
        assert!(text[3].contains("never closed"), "{text:#?}");
        assert!(
            text[4].starts_with("workspace/skills/d/SKILL.md:") && text[4].contains("invalid YAML"),
            "{text:#?}"
        );
        assert_eq!(
            text[5],
            "workspace/skills/f/SKILL.md:4:7: name: the skill e is already defined by workspace/skills/e/SKILL.md\n  fix: give one of the two skills another name"
        );
        assert_eq!(text.len(), 6, "{text:#?}");
    }

    #[test]
    fn empty_values_and_long_descriptions_are_refused() {
        let long = "x".repeat(SKILL_DESCRIPTION_MAX + 1);
        let (skills, problems) = check_skills(&[
            file("a", "---\n---\n"),
            file("b", "---\nname: ''\ndescription: ' '\n---\n"),
            file("c", &format!("---\nname: c\ndescription: {long}\n---\n")),
        ]);
        assert!(skills.is_empty());
        let text = rendered(&problems);
        assert!(text[0].contains("the frontmatter is empty"), "{text:#?}");
        assert!(text[1].contains("name: must not be empty"), "{text:#?}");
        assert!(
            text[2].contains("description: must not be empty"),
            "{text:#?}"
        );
        assert!(text[3].contains("1025 characters long"), "{text:#?}");
    }

    #[test]
    fn skill_names_are_lowercase_words_joined_by_single_hyphens() {
        for good in ["a", "release-notes", "v2", "x-1-y"] {
            assert!(is_skill_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a--b", "A", "a_b", "a b", &"a".repeat(65)] {
            assert!(!is_skill_name(bad), "{bad}");
        }
    }

    #[test]
    fn long_or_deep_frontmatter_is_refused_naming_the_file() {
        let long = format!(
            "---\nname: a\ndescription: ok\nnotes: {}\n---\n",
            "x".repeat(SKILL_FRONTMATTER_MAX)
        );
        let deep = format!(
            "---\nname: b\ndescription: ok\nx:\n  {}y\n---\n",
            "- ".repeat(8_000)
        );
        let (skills, problems) = check_skills(&[file("a", &long), file("b", &deep)]);
        assert!(skills.is_empty());
        let text = rendered(&problems);
        assert_eq!(text.len(), 2, "{text:#?}");
        assert!(
            text[0].starts_with(
                "workspace/skills/a/SKILL.md:1: the frontmatter is longer than 16 KiB"
            ),
            "{text:#?}"
        );
        assert!(
            text[1].starts_with("workspace/skills/b/SKILL.md:5:")
                && text[1].contains("nest more than 32 levels deep"),
            "{text:#?}"
        );
    }
}
