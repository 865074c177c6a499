//! Where a build lives under `$PERCH_CACHE/images/` and how its files are written, and the
//! error every step of a build reports.

use crate::sandbox::SandboxError;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Why an image could not be built or found: what happened, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    pub what: String,
    pub fix: Option<String>,
}

impl ImageError {
    pub(super) fn new(what: impl Into<String>, fix: impl Into<String>) -> ImageError {
        ImageError {
            what: what.into(),
            fix: Some(fix.into()),
        }
    }

    pub(super) fn io(action: &str, path: &Path, error: &io::Error) -> ImageError {
        ImageError {
            what: format!("cannot {action} {}: {error}", path.display()),
            fix: None,
        }
    }
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ImageError {}

impl From<SandboxError> for ImageError {
    fn from(error: SandboxError) -> ImageError {
        match error {
            SandboxError::Unavailable { what, fix } => ImageError {
                what,
                fix: Some(fix),
            },
            other => ImageError {
                what: other.to_string(),
                fix: None,
            },
        }
    }
}

/// `$PERCH_CACHE/images`.
pub fn images_dir(cache: &Path) -> PathBuf {
    cache.join("images")
}

/// The record of which build `perch:default` refers to.
pub fn default_record(cache: &Path) -> PathBuf {
    images_dir(cache).join("default.json")
}

/// A build's directory and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDir {
    pub root: PathBuf,
}

impl ImageDir {
    /// The directory of the build with `key` in `cache`.
    pub fn new(cache: &Path, key: &str) -> ImageDir {
        ImageDir {
            root: images_dir(cache).join(key),
        }
    }

    /// `rootfs/`: the finished debootstrap tree.
    pub fn rootfs(&self) -> PathBuf {
        self.root.join("rootfs")
    }

    /// `image.tar`: the finished OCI archive.
    pub fn archive(&self) -> PathBuf {
        self.root.join("image.tar")
    }

    /// `recipe.json`: what was built, from where, with which digests.
    pub fn recipe(&self) -> PathBuf {
        self.root.join("recipe.json")
    }

    /// `debootstrap.log`: the last debootstrap run's output.
    pub fn log(&self) -> PathBuf {
        self.root.join("debootstrap.log")
    }

    /// Every file and directory a build reads, writes or replaces in its directory.
    pub(super) fn entries(&self) -> Vec<PathBuf> {
        let archive = self.archive();
        vec![
            self.root.join("lock"),
            self.rootfs(),
            self.partial_rootfs(),
            self.retired_rootfs(),
            self.log(),
            self.recipe(),
            sibling(&archive, ".partial"),
            sibling(&archive, ".layer.partial"),
            archive,
        ]
    }

    pub(super) fn partial_rootfs(&self) -> PathBuf {
        self.root.join("rootfs.partial")
    }

    pub(super) fn retired_rootfs(&self) -> PathBuf {
        self.root.join("rootfs.old")
    }
}

pub(super) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Creates `path`, which must not exist yet: never through a symbolic link, never over a file.
pub(super) fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

pub(super) fn remove_file_if_present(path: &Path) -> Result<(), ImageError> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(ImageError::io("remove", path, &error))
        }
        _ => Ok(()),
    }
}

/// One of the cache's records, when `path` holds one.
pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_str(&fs::read_to_string(path).ok()?).ok()
}

/// Writes `value` as pretty JSON over `path` durably; other builds may write it at the same time
/// (see [`atomic_file::replace_shared`](crate::store::atomic_file::replace_shared)).
pub(super) fn write_json_atomic(
    path: &Path,
    value: &impl serde::Serialize,
) -> Result<(), ImageError> {
    let written = (|| -> io::Result<()> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut text = serde_json::to_vec_pretty(value)?;
        text.push(b'\n');
        crate::store::atomic_file::replace_shared(path, &text)
    })();
    written.map_err(|error| ImageError::io("write", path, &error))
}
