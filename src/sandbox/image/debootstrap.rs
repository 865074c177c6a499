//! The root filesystem: debootstrap run on the host's mirror, its progress reported by phase,
//! mounts it left behind undone, and the tree renamed into place only when complete.

use super::layout::{ImageDir, ImageError, create_new, remove_file_if_present};
use perch_core::image::Recipe;
use std::collections::VecDeque;
use std::fs::{self};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// A debootstrap killed mid-run can leave /proc or /sys mounted inside its target; deleting
/// the tree would then walk into the host's. Unmounts them, deepest first, or refuses.
pub(super) fn unmount_under(tree: &Path) -> Result<(), ImageError> {
    let mounted = mounts_under(tree);
    for point in &mounted {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(point)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if let Some(point) = mounts_under(tree).first() {
        return Err(ImageError::new(
            format!(
                "{} is still mounted inside the unfinished build {}",
                point.display(),
                tree.display()
            ),
            format!(
                "unmount it (umount -l {}) and run this again",
                point.display()
            ),
        ));
    }
    Ok(())
}

fn mounts_under(tree: &Path) -> Vec<PathBuf> {
    let Ok(tree) = tree.canonicalize() else {
        return Vec::new();
    };
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_point(field)))
        .filter(|point| point.starts_with(&tree))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    points
}

fn unescape_mount_point(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn debootstrap(
    recipe: &Recipe,
    mirror: &str,
    dir: &ImageDir,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ImageError> {
    let program = find_program("debootstrap").ok_or_else(|| {
        ImageError::new(
            "debootstrap is not installed; perch builds its image with it",
            "install it as root: apt-get install -y debootstrap",
        )
    })?;
    if effective_uid() != Some(0) {
        return Err(ImageError::new(
            "building the image's root filesystem needs root: debootstrap creates device nodes, sets file owners and chroots into the tree",
            "run it as root, keeping this user's cache and runtime: sudo -E perch image build (PERCH_CACHE and MSB_HOME must point where perch will look)",
        ));
    }
    let target = dir.partial_rootfs();
    let log_path = dir.log();
    remove_file_if_present(&log_path)?;
    let mut log =
        create_new(&log_path).map_err(|error| ImageError::io("create", &log_path, &error))?;
    let mut args = recipe.debootstrap_options();
    args.push(recipe.suite.clone());
    progress(&format!(
        "rootfs: debootstrap {} {} {mirror} (log: {})",
        args.join(" "),
        target.display(),
        log_path.display()
    ));
    let started = Instant::now();
    let (reader, writer) = io::pipe().map_err(|error| ImageError::io("run", &program, &error))?;
    let spawned = {
        let mut command = Command::new(&program);
        command
            .args(&args)
            .arg(&target)
            .arg(mirror)
            .stdin(Stdio::null());
        match writer.try_clone() {
            Ok(copy) => command.stdout(copy).stderr(writer).spawn(),
            Err(error) => Err(error),
        }
    };
    let mut child = spawned.map_err(|error| ImageError::io("run", &program, &error))?;
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut phase = String::new();
    for line in BufReader::new(reader).split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line).into_owned();
        let _ = writeln!(log, "{line}");
        if let Some(word) = phase_of(&line)
            && word != phase
        {
            progress(&format!("  {line}"));
            phase = word;
        }
        if tail.len() == 12 {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let status = child
        .wait()
        .map_err(|error| ImageError::io("run", &program, &error))?;
    if !status.success() {
        let inner_log = target.join("debootstrap/debootstrap.log");
        return Err(ImageError::new(
            format!(
                "debootstrap failed ({status}); its last lines:\n    {}",
                Vec::from(tail).join("\n    ")
            ),
            format!(
                "read {} (and {} if it exists); check that {mirror} is reachable and serves {}, or pass --mirror URL / --suite NAME",
                log_path.display(),
                inner_log.display(),
                recipe.suite
            ),
        ));
    }
    progress(&format!(
        "rootfs: debootstrap finished in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The phase a debootstrap line belongs to, for printing one line per phase: the first word of
/// an `I:` line (retrieving and validating alternate per package, so they count as one), or
/// the whole line for warnings and errors.
fn phase_of(line: &str) -> Option<String> {
    if let Some(info) = line.strip_prefix("I: ") {
        let word = info.split_whitespace().next().unwrap_or_default();
        Some(
            if word == "Validating" {
                "Retrieving"
            } else {
                word
            }
            .to_owned(),
        )
    } else if line.starts_with("W: ") || line.starts_with("E: ") {
        Some(line.to_owned())
    } else {
        None
    }
}

/// Moves the finished tree into place; a tree from an earlier build is moved aside first and
/// deleted after.
pub(super) fn install_rootfs(dir: &ImageDir) -> Result<(), ImageError> {
    let rootfs = dir.rootfs();
    let retired = dir.retired_rootfs();
    if rootfs.exists() {
        fs::rename(&rootfs, &retired)
            .map_err(|error| ImageError::io("move aside", &rootfs, &error))?;
    }
    let partial = dir.partial_rootfs();
    fs::rename(&partial, &rootfs).map_err(|error| ImageError::io("rename", &partial, &error))?;
    if retired.exists() {
        unmount_under(&retired)?;
        fs::remove_dir_all(&retired).map_err(|error| ImageError::io("remove", &retired, &error))?;
    }
    Ok(())
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
