//! The real `perch` binary, and the agent directories it works on.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the real `perch` binary with a clean environment plus `env`.
pub fn perch(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_perch"));
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("perch runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh agent directory made by `perch init`.
pub fn new_agent() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let output = perch(&["init", dir.path().to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    dir
}

pub fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Every file under `dir`, relative, sorted; directories end in `/`.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for item in std::fs::read_dir(dir).unwrap() {
            let path = item.unwrap().path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                out.push(format!("{relative}/"));
                walk(root, &path, out);
            } else {
                out.push(relative);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
