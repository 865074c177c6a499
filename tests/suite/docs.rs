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
