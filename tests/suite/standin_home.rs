//! The microsandbox home of the stand-in runtime, shared by the suite and the benchmarks.
//!
//! The benchmarks (`tests/bench/sandbox.rs`) include this file.
//!
//! One home per run, `$PERCH_CACHE/standin-home`: root-owned like the cache, so perch's
//! root-trust check accepts the runtime in it. It holds a fresh copy of the stand-in as
//! `bin/msb`, with `bin/msb.pose-as-real` beside it so that it answers `--version` like the real
//! runtime (perch checks that answer before every boot, and refuses the stand-in's own), an empty
//! `lib/libkrunfw.so.5.6.1` (the crate only checks that it exists), and `perch:default` loaded by
//! the real crate (reloaded only when the built layer changed).

use perch::host::Places;
use perch::sandbox::{ImageRef, microvm};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Which layer of `perch:default` the home holds, so a rerun skips the slow load.
const LOADED_LAYER: &str = "loaded-layer";

/// What a process sets up in the home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preparation {
    /// The first user in a run: a fresh runtime, stale sandboxes removed, the image loaded.
    Fresh,
    /// A child process of a test: the home as its parent prepared it, untouched.
    Attach,
}

/// The places for a machine on the stand-in: its home, no `MSB_PATH`, and no KVM check
/// (`/dev/null` opens for reading and writing; the stand-in needs no KVM). `Err` names the
/// missing prerequisite; a prerequisite that is there but fails to set up panics.
pub async fn prepare(preparation: Preparation) -> Result<Places, String> {
    let environment = Places::from_environment();
    let standin = missing_prerequisite()?;
    if std::env::var_os("MSB_PATH").is_some() {
        return Err("MSB_PATH is set, and microsandbox would run that runtime instead".into());
    }
    let ImageRef::Local {
        reference,
        rootfs,
        layer,
    } = perch::sandbox::image::resolve_default_image(&environment.cache)
        .map_err(|error| format!("perch:default is not built (.ci/setup builds it): {error}"))?
    else {
        return Err("perch:default is not a local build".into());
    };
    let archive = rootfs.with_file_name("image.tar");
    if !archive.is_file() {
        return Err(format!("{} is missing", archive.display()));
    }
    let home = environment.cache.join("standin-home");
    if let Some(reason) = perch::host::trust::refusal_as_root(&home.join("bin/msb")) {
        return Err(format!(
            "perch would not run a runtime in {}: {reason}",
            home.display()
        ));
    }
    let places = Places {
        kvm: PathBuf::from("/dev/null"),
        assume_kvm: true,
        msb_path: None,
        msb_home: home.clone(),
        ..environment
    };
    if preparation == Preparation::Attach {
        return Ok(places);
    }
    fs::create_dir_all(home.join("bin")).unwrap_or_else(|error| failed(&home, &error));
    fs::create_dir_all(home.join("lib")).unwrap_or_else(|error| failed(&home, &error));
    install_runtime(&standin, &home.join("bin/msb"));
    let pose = home.join("bin/msb.pose-as-real");
    fs::write(&pose, "").unwrap_or_else(|error| failed(&pose, &error));
    let firmware = home.join("lib/libkrunfw.so.5.6.1");
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&firmware)
        .unwrap_or_else(|error| failed(&firmware, &error));
    for stale in [home.join("sandboxes"), home.join("standin")] {
        match fs::remove_dir_all(&stale) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => failed(&stale, &error),
            _ => {}
        }
    }
    let marker = home.join(LOADED_LAYER);
    let loaded = fs::read_to_string(&marker).is_ok_and(|text| text.trim() == layer)
        && microvm::image_loaded(&home, &reference)
            .await
            .unwrap_or_else(|error| panic!("reading the stand-in catalog: {error}"));
    if !loaded {
        microvm::load_image(&home, &archive, &reference)
            .await
            .unwrap_or_else(|error| panic!("loading {reference} into {}: {error}", home.display()));
        fs::write(&marker, &layer).unwrap_or_else(|error| failed(&marker, &error));
    }
    Ok(places)
}

/// The stand-in binary, once everything it needs from this host is there.
fn missing_prerequisite() -> Result<PathBuf, String> {
    let euid = fs::metadata("/proc/self").map_or(u32::MAX, |meta| meta.uid());
    if euid != 0 {
        return Err(format!(
            "the stand-in assembles its guest with loop mounts and namespaces, which need root (euid {euid})"
        ));
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("/dev/loop-control is missing: no loop devices for the image's layers".into());
    }
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    for wanted in ["erofs", "overlay"] {
        if !filesystems
            .lines()
            .any(|line| line.split_whitespace().last() == Some(wanted))
        {
            return Err(format!(
                "the kernel has no {wanted} filesystem (/proc/filesystems)"
            ));
        }
    }
    built_standin()
}

/// The stand-in binary as cargo built it, `Err` saying how to build it when it is not there.
pub fn built_standin() -> Result<PathBuf, String> {
    // The test binary is <target>/debug/deps/<name>-<hash>; `cargo build -p
    // perch-msb-standin` puts the stand-in at <target>/debug/msb.
    let exe = std::env::current_exe().map_err(|error| format!("no current exe: {error}"))?;
    let standin = exe
        .parent()
        .and_then(Path::parent)
        .map(|debug| debug.join("msb"))
        .ok_or_else(|| format!("{} has no target directory", exe.display()))?;
    if !standin.is_file() {
        return Err(format!(
            "the stand-in runtime {} is not built: cargo test --workspace builds it (or cargo build -p perch-msb-standin)",
            standin.display()
        ));
    }
    Ok(standin)
}

/// Copies `standin` to `target` through a temporary name, so a runtime still running from an
/// earlier copy keeps its file and no launch ever sees half a binary.
fn install_runtime(standin: &Path, target: &Path) {
    let partial = target.with_file_name(format!(".msb.{}", std::process::id()));
    let copy = || -> std::io::Result<()> {
        let mut file = fs::File::create(&partial)?;
        file.write_all(&fs::read(standin)?)?;
        file.sync_all()?;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))?;
        fs::rename(&partial, target)
    };
    copy().unwrap_or_else(|error| failed(target, &error));
}

fn failed(path: &Path, error: &std::io::Error) -> ! {
    panic!("preparing the stand-in home: {}: {error}", path.display())
}
