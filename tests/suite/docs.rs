//! ARCHITECTURE.md and README's layout stay true: every path they name exists, and every folder
//! under `src/` is named in ARCHITECTURE.md's layout.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap()
}

/// The first word of each line of the `text` code block under `heading`.
fn layout(markdown: &str, heading: &str) -> Vec<String> {
    let section = &markdown[markdown
        .find(heading)
        .unwrap_or_else(|| panic!("{heading}"))..];
    let block = &section[section.find("```text\n").expect("a layout block") + 8..];
    let block = &block[..block.find("\n```").expect("the block's end")];
    block
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every `code span` in `markdown` that looks like a path of this repository.
fn named_paths(markdown: &str) -> Vec<String> {
    let roots = ["src/", "tests/", "deploy/", "channels/", "agents/", ".ci/"];
    markdown
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| !span.contains(char::is_whitespace))
        .filter(|span| roots.iter().any(|root| span.starts_with(root)))
        .map(str::to_owned)
        .collect()
}

fn missing(paths: impl IntoIterator<Item = String>) -> Vec<String> {
    paths
        .into_iter()
        .filter(|path| !root().join(path).exists())
        .collect()
}

fn folders(under: &Path, into: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(under).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let relative = path.strip_prefix(root()).unwrap();
            into.insert(format!("{}/", relative.display()));
            folders(&path, into);
        }
    }
}

#[test]
fn every_path_architecture_md_names_exists_and_every_src_folder_is_in_its_layout() {
    let architecture = read("ARCHITECTURE.md");
    let listed = layout(&architecture, "## Layout");
    assert!(
        listed.len() > 30,
        "the layout lists every folder: {listed:?}"
    );
    assert_eq!(
        missing(listed.clone()),
        Vec::<String>::new(),
        "in the layout"
    );
    let named = named_paths(&architecture);
    assert!(named.len() > 40, "the walks name their files: {named:?}");
    assert_eq!(missing(named), Vec::<String>::new(), "named in the text");
    let mut on_disk = BTreeSet::new();
    folders(&root().join("src"), &mut on_disk);
    let unnamed: Vec<&String> = on_disk
        .iter()
        .filter(|folder| !listed.contains(folder))
        .collect();
    assert!(
        unnamed.is_empty(),
        "folders missing from the layout: {unnamed:?}"
    );
}

#[test]
fn every_path_readme_s_layout_names_exists_and_readme_no_longer_holds_the_architecture() {
    let readme = read("README.md");
    let listed = layout(&readme, "## Architecture");
    assert!(listed.len() >= 6, "{listed:?}");
    assert_eq!(missing(listed), Vec::<String>::new(), "in README's layout");
    assert!(
        readme.contains("](ARCHITECTURE.md)"),
        "README links to ARCHITECTURE.md"
    );
    for moved in ["### The session log", "### The agent loop", "### Journals"] {
        assert!(!readme.contains(moved), "README still holds {moved}");
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// Each `` `perch …` `` span in `text`: the command (the subcommand, and a group's subcommand)
/// and the `--flags` it names; a placeholder such as `CODE`, `DIR` or `{}` is left out.
fn perch_commands(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    for (start, _) in text.match_indices("`perch ") {
        let span = &text[start + 1..];
        let Some(end) = span.find('`') else { continue };
        let words: Vec<&str> = span[..end]
            .split_whitespace()
            .skip(1)
            .filter(|word| *word != "\\")
            .collect();
        let command: Vec<String> = words
            .iter()
            .take(2)
            .take_while(|word| word.chars().all(|ch| ch.is_ascii_lowercase()))
            .map(|word| (*word).to_owned())
            .collect();
        let flags = words
            .iter()
            .filter(|word| word.starts_with("--"))
            .filter_map(|word| word.split(['=', '[', ')', ',']).next())
            .map(str::to_owned)
            .collect();
        if !command.is_empty() {
            found.push((command, flags));
        }
    }
    found
}

/// No message perch writes names a command that does not exist: each `` `perch …` `` in the
/// code under `src/` (comments aside) is a command whose `--help` answers and lists each flag named, and each script named under
/// `deploy/` or `.ci/` is in the repository.
#[test]
fn every_command_and_script_a_message_names_exists() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut commands: std::collections::BTreeMap<Vec<String>, BTreeSet<String>> =
        std::collections::BTreeMap::new();
    let mut scripts = BTreeSet::new();
    for file in &files {
        let text: String = std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .flat_map(|line| [line, "\n"])
            .collect();
        for (command, flags) in perch_commands(&text) {
            commands.entry(command).or_default().extend(flags);
        }
        for root_dir in ["deploy/", ".ci/"] {
            for (start, _) in text.match_indices(root_dir) {
                let name: String = text[start..]
                    .chars()
                    .take_while(|ch| ch.is_ascii_alphanumeric() || "/._-".contains(*ch))
                    .collect();
                let name = name.trim_end_matches('.');
                if name.len() > root_dir.len() {
                    scripts.insert(name.to_owned());
                }
            }
        }
    }
    assert!(commands.len() > 10, "{commands:?}");
    let mut unknown = Vec::new();
    for (command, flags) in &commands {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_perch"))
            .args(command)
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        let named = format!("perch {}", command.join(" "));
        if !output.status.success() {
            unknown.push(named);
            continue;
        }
        for flag in flags {
            if !help.contains(flag.as_str()) {
                unknown.push(format!("{named} {flag}"));
            }
        }
    }
    let missing_scripts = missing(scripts);
    assert!(
        unknown.is_empty() && missing_scripts.is_empty(),
        "named but not there: {unknown:?} {missing_scripts:?}"
    );
}

/// The headings of `markdown` (any level), outside code blocks, as written.
fn headings(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let text = line.trim_start_matches('#');
            if text.starts_with(' ') {
                found.push(text.trim().to_owned());
            }
        }
    }
    found
}

/// A heading's anchor as GitHub makes it: lower case, spaces as `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|ch| match ch {
            ' ' => Some('-'),
            ch if ch.is_alphanumeric() || ch == '-' || ch == '_' => Some(ch),
            _ => None,
        })
        .collect()
}

/// Every anchor of `markdown`, the repeated ones numbered as GitHub numbers them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for heading in headings(markdown) {
        let base = anchor(&heading);
        let mut candidate = base.clone();
        let mut n = 0;
        while !seen.insert(candidate.clone()) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
    }
    seen
}

/// The guides: README, ARCHITECTURE.md and every Markdown file under `docs/`, `deploy/`,
/// `agents/` and `channels/`, relative to the repository.
fn guides() -> Vec<PathBuf> {
    fn markdown_under(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                markdown_under(&path, into);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                into.push(path.strip_prefix(root()).unwrap().to_owned());
            }
        }
    }
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    for dir in ["docs", "deploy", "agents", "channels"] {
        markdown_under(&root().join(dir), &mut files);
    }
    files
}

/// Every `[label](target)` of `markdown` outside code blocks and code spans.
fn links(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_heading_readme_had_is_still_in_readme_docs_or_architecture_md() {
    let fixture = read("tests/fixtures/readme-headings.txt");
    let earlier: Vec<&str> = fixture.lines().filter(|line| !line.is_empty()).collect();
    assert!(earlier.len() > 30, "the fixture holds README's headings");
    let mut now = BTreeSet::new();
    for guide in guides() {
        now.extend(headings(&read(guide.to_str().unwrap())));
    }
    let lost: Vec<&&str> = earlier
        .iter()
        .filter(|heading| !now.contains(**heading))
        .collect();
    assert!(
        lost.is_empty(),
        "headings no guide holds any more: {lost:?}"
    );
}

#[test]
fn every_link_in_the_guides_resolves_to_a_file_and_its_anchor() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for guide in guides() {
        let text = read(guide.to_str().unwrap());
        let dir = guide.parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                guide.clone()
            } else {
                dir.join(file)
            };
            if !root().join(&path).exists() {
                broken.push(format!("{}: {target}: no such file", guide.display()));
                continue;
            }
            if fragment.is_empty() {
                continue;
            }
            let is_markdown = path.extension().is_some_and(|ext| ext == "md");
            if !is_markdown || !anchors(&read(path.to_str().unwrap())).contains(fragment) {
                broken.push(format!("{}: {target}: no such anchor", guide.display()));
            }
        }
    }
    assert!(checked > 60, "the guides link to each other: {checked}");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn readme_is_a_guide_of_about_40_kb_that_starts_with_its_contents_and_installing() {
    let readme = read("README.md");
    assert!(
        readme.len() <= 42 * 1024,
        "README is {} bytes; move reference text to docs/",
        readme.len()
    );
    let order: Vec<String> = headings(&readme)
        .into_iter()
        .filter(|heading| !heading.starts_with("perch"))
        .take(3)
        .collect();
    assert_eq!(order, ["Contents", "Install", "Quick start"], "{order:?}");
    let contents = &readme[readme.find("## Contents").unwrap()..];
    let contents = &contents[..contents[3..].find("\n## ").unwrap()];
    let listed: BTreeSet<String> = links(contents)
        .into_iter()
        .filter_map(|target| target.strip_prefix('#').map(str::to_owned))
        .collect();
    let sections: Vec<String> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("## "))
        .filter(|heading| *heading != "Contents")
        .map(anchor)
        .collect();
    let unlisted: Vec<&String> = sections
        .iter()
        .filter(|section| !listed.contains(*section))
        .collect();
    assert!(
        unlisted.is_empty(),
        "sections missing from Contents: {unlisted:?}"
    );
}

/// The bot scopes listed under `bot:` in docs/channels.md's Slack app manifest.
fn manifest_bot_scopes(channels_md: &str) -> Vec<String> {
    let manifest = &channels_md[channels_md.find("oauth_config:").expect("the manifest")..];
    let bot = &manifest[manifest.find("    bot:\n").expect("its bot scopes") + 9..];
    bot.lines()
        .map_while(|line| line.trim().strip_prefix("- "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_slack_manifest_s_bot_scopes_are_those_doctor_and_the_stock_adapter_name() {
    let documented = manifest_bot_scopes(&read("docs/channels.md"));
    let checked: Vec<String> = perch_core::slack::scopes::BOT_SCOPES
        .iter()
        .map(|(scope, _)| (*scope).to_owned())
        .collect();
    assert_eq!(documented, checked, "docs/channels.md and perch_core");
    let faked: Vec<String> = super::support::fake_slack::MANIFEST_SCOPES
        .iter()
        .map(|scope| (*scope).to_owned())
        .collect();
    assert_eq!(documented, faked, "docs/channels.md and the fake");
    let adapter: String = read("channels/slack.lua")
        .lines()
        .take_while(|line| line.starts_with("--"))
        .map(|line| line.trim_start_matches('-').trim())
        .collect::<Vec<_>>()
        .join(" ");
    for scope in &documented {
        assert!(
            adapter.contains(scope.as_str()),
            "channels/slack.lua's header does not name {scope}"
        );
    }
}
