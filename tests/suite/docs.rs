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
