//! `perch image build`: perch's own image, `perch:default`, built offline from the host's Debian
//! mirror. debootstrap makes the root filesystem, the system `tar` packs it as the one layer of
//! an OCI image-layout archive, and microsandbox loads that archive under `perch:default`.
//!
//! Everything lives under `$PERCH_CACHE/images/`:
//!
//! ```text
//! images/default.json       which build perch:default refers to (written atomically)
//! images/<key>/rootfs/      the debootstrap tree, renamed into place only when complete
//! images/<key>/image.tar    the OCI image-layout archive, likewise
//! images/<key>/recipe.json  what was built, from which mirror, with which digests
//! ```
//!
//! `<key>` is the recipe's fingerprint ([`Recipe::key`]), so a build for the same recipe reuses
//! what is there, and a different suite, architecture or package set gets its own directory.
//!
//! Here: the build's steps and records; `debootstrap` makes the root filesystem, `oci` packs the
//! archive, `layout` says where a build lives and writes its files.

mod debootstrap;
mod layout;
mod oci;

pub use layout::{ImageDir, ImageError, default_record, images_dir};
pub use oci::{Packed, pack};

use crate::host::Places;
use crate::sandbox::{ImageRef, SandboxError};
use debootstrap::{debootstrap, install_rootfs, unmount_under};
use layout::{read_json, remove_file_if_present, sibling, write_json_atomic};
use perch_core::image::{
    BuildRecord, DEFAULT_REFERENCE, DefaultImage, Flavour, PackedArchive, Recipe, SourcesFormat,
    debian_mirror, is_key, os_release_codename, parse_sources,
};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `perch image build` was asked for.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub flavour: Flavour,
    /// Overrides the mirror found in apt's sources.
    pub mirror: Option<String>,
    /// Overrides the host's release codename.
    pub suite: Option<String>,
    /// Build the root filesystem and the archive again even if they exist.
    pub rebuild: bool,
}

/// Where the host describes itself; [`Host::system`] in production, fake files in tests.
#[derive(Debug, Clone)]
pub struct Host {
    /// `/etc/os-release`.
    pub os_release: PathBuf,
    /// `/etc/apt`: `sources.list` and `sources.list.d/` are read from it.
    pub apt: PathBuf,
    /// Rust's name for the CPU (`std::env::consts::ARCH`).
    pub arch: String,
}

impl Host {
    /// This machine: `/etc/os-release`, `/etc/apt` and the CPU perch was built for.
    pub fn system() -> Host {
        Host {
            os_release: PathBuf::from("/etc/os-release"),
            apt: PathBuf::from("/etc/apt"),
            arch: std::env::consts::ARCH.to_owned(),
        }
    }

    /// The release codename in os-release, if it names one.
    pub fn suite(&self) -> Option<String> {
        fs::read_to_string(&self.os_release)
            .ok()
            .and_then(|text| os_release_codename(&text))
    }

    /// The first Debian mirror for `suite` in apt's sources, read in apt's order:
    /// `sources.list`, then `sources.list.d/` by file name.
    pub fn mirror(&self, suite: &str) -> Option<String> {
        let mut files = vec![(self.apt.join("sources.list"), SourcesFormat::OneLine)];
        if let Ok(entries) = fs::read_dir(self.apt.join("sources.list.d")) {
            let mut listed: Vec<(PathBuf, SourcesFormat)> = entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    SourcesFormat::of(&name).map(|format| (entry.path(), format))
                })
                .collect();
            listed.sort_by(|a, b| a.0.cmp(&b.0));
            files.extend(listed);
        }
        let sources: Vec<_> = files
            .iter()
            .filter_map(|(path, format)| {
                fs::read_to_string(path)
                    .ok()
                    .map(|text| parse_sources(&text, *format))
            })
            .flatten()
            .collect();
        debian_mirror(&sources, suite)
    }
}

/// A build whose root filesystem and archive are complete on disk, not yet loaded. Holds the
/// build's lock until it is dropped.
#[derive(Debug)]
pub struct Prepared {
    pub recipe: Recipe,
    pub key: String,
    pub dir: ImageDir,
    _lock: File,
}

/// Makes sure the build for `options` has a complete root filesystem and archive, reusing what
/// an earlier build left unless `options.rebuild`. Reports each step through `progress`.
pub fn prepare(
    cache: &Path,
    host: &Host,
    options: &BuildOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Prepared, ImageError> {
    let suite = match &options.suite {
        Some(suite) => suite.clone(),
        None => host.suite().ok_or_else(|| {
            ImageError::new(
                format!(
                    "cannot tell which Debian release to build: {} names no VERSION_CODENAME",
                    host.os_release.display()
                ),
                "pass the release with --suite NAME, for example --suite bookworm",
            )
        })?,
    };
    let recipe = Recipe::new(options.flavour, &suite, &host.arch).map_err(|error| {
        ImageError::new(
            error.to_string(),
            "pass a release codename with --suite NAME",
        )
    })?;
    let key = recipe.key();
    let dir = ImageDir::new(cache, &key);
    refuse_as_root(&dir.root)?;
    fs::create_dir_all(&dir.root).map_err(|error| ImageError::io("create", &dir.root, &error))?;
    for entry in dir.entries().iter().chain([&default_record(cache)]) {
        refuse_as_root(entry)?;
    }
    let lock = lock(&dir)?;
    progress(&format!(
        "recipe {} ({} {}, {}{}), key {}",
        recipe.flavour,
        recipe.suite,
        recipe.arch,
        recipe.variant,
        if recipe.packages.is_empty() {
            String::new()
        } else {
            format!(" + {}", recipe.packages.join(" "))
        },
        &key[..12]
    ));
    clear_partials(&dir)?;

    let rootfs = dir.rootfs();
    let rebuild_rootfs = options.rebuild || !rootfs.is_dir();
    if rebuild_rootfs {
        let mirror = match &options.mirror {
            Some(mirror) => checked_mirror(mirror)?,
            None => host.mirror(&recipe.suite).ok_or_else(|| {
                ImageError::new(
                    format!(
                        "no Debian mirror for {} in {}/sources.list or {}/sources.list.d/ (perch looks for a `deb` entry with the main component that is not a security mirror)",
                        recipe.suite,
                        host.apt.display(),
                        host.apt.display()
                    ),
                    "pass the Debian archive this machine can reach with --mirror URL",
                )
            })?,
        };
        debootstrap(&recipe, &mirror, &dir, progress)?;
        remove_file_if_present(&dir.archive())?;
        install_rootfs(&dir)?;
        write_json_atomic(
            &dir.recipe(),
            &BuildRecord {
                key: key.clone(),
                recipe: recipe.clone(),
                canonical: recipe.canonical(),
                mirror: Some(mirror),
                rootfs_built: Some(chrono::Utc::now()),
                archive: None,
            },
        )?;
    } else {
        progress(&format!(
            "rootfs: reusing {} (already built for this recipe; --rebuild builds it again)",
            rootfs.display()
        ));
    }

    let archive = dir.archive();
    if options.rebuild || rebuild_rootfs || !archive.is_file() {
        progress(&format!("archive: packing {} ...", archive.display()));
        let started = Instant::now();
        let packed = pack(&rootfs, &archive, &recipe, DEFAULT_REFERENCE)?;
        progress(&format!(
            "archive: {} MB, layer {}, in {:.1} s",
            fs::metadata(&archive)
                .map(|m| m.len() / 1_000_000)
                .unwrap_or(0),
            short(&packed.layer.digest),
            started.elapsed().as_secs_f64()
        ));
        let mut record = read_json::<BuildRecord>(&dir.recipe()).unwrap_or_else(|| BuildRecord {
            key: key.clone(),
            recipe: recipe.clone(),
            canonical: recipe.canonical(),
            mirror: None,
            rootfs_built: None,
            archive: None,
        });
        record.archive = Some(PackedArchive {
            reference: DEFAULT_REFERENCE.to_owned(),
            manifest: packed.manifest,
            config: packed.config,
            layer: packed.layer,
            packed: chrono::Utc::now(),
        });
        write_json_atomic(&dir.recipe(), &record)?;
    } else {
        progress(&format!(
            "archive: reusing {} (already packed from this rootfs)",
            archive.display()
        ));
    }

    Ok(Prepared {
        recipe,
        key,
        dir,
        _lock: lock,
    })
}

/// Root builds only in a cache that no other user can change: in one the service user owns, it
/// could swap `rootfs` for a link to `/etc` (packing `/etc/shadow` into the image), point
/// `debootstrap.log` at a file of root's, or replace the tree debootstrap chroots into. Refused
/// before any work, naming the path; for anyone but root, `None`.
fn refuse_as_root(path: &Path) -> Result<(), ImageError> {
    match crate::host::trust::refusal_as_root(path) {
        None => Ok(()),
        Some(reason) => Err(ImageError::new(
            format!(
                "refusing to build the image as root in {}: {reason}",
                path.display()
            ),
            "build as root in a cache only root can change (deploy/install.sh uses /var/lib/perch/cache, root:perch 0750): sudo PERCH_CACHE=DIR perch image build; then load it as the user that runs perch: perch image load",
        )),
    }
}

/// Loads a prepared build into the microsandbox home `places.msb_home` as `perch:default` and
/// records it in `images/default.json` under `places.cache`, so [`resolve_default_image`]
/// finds it.
pub async fn install(places: &Places, prepared: &Prepared) -> Result<ImageRef, ImageError> {
    crate::sandbox::microvm::load_image(
        &places.msb_home,
        &prepared.dir.archive(),
        DEFAULT_REFERENCE,
    )
    .await?;
    record(&places.cache, prepared)
}

/// Records a prepared build in `images/default.json` without loading it (root does not write
/// into a microsandbox home another user owns; that user runs `perch image load`).
pub fn record(cache: &Path, prepared: &Prepared) -> Result<ImageRef, ImageError> {
    write_json_atomic(
        &default_record(cache),
        &DefaultImage {
            reference: DEFAULT_REFERENCE.to_owned(),
            key: prepared.key.clone(),
            recipe: prepared.recipe.flavour,
            suite: prepared.recipe.suite.clone(),
            arch: prepared.recipe.arch.clone(),
            recorded: chrono::Utc::now(),
        },
    )?;
    Ok(ImageRef::Local {
        reference: DEFAULT_REFERENCE.to_owned(),
        rootfs: prepared.dir.rootfs(),
        layer: built_layer(&prepared.dir).unwrap_or_default(),
    })
}

/// The digest of the layer the build in `dir` packed, from its `recipe.json`.
fn built_layer(dir: &ImageDir) -> Option<String> {
    read_json::<BuildRecord>(&dir.recipe())?
        .archive
        .map(|archive| archive.layer.digest)
        .filter(|digest| digest.starts_with("sha256:"))
}

/// `perch image load`: loads the build `images/default.json` (under `places.cache`) records
/// into the microsandbox home `places.msb_home`. Writes nothing into the cache, which may be
/// root's.
pub async fn load_recorded(places: &Places) -> Result<(ImageRef, Loaded), ImageError> {
    let image = resolve_default_image(&places.cache)?;
    let ImageRef::Local {
        reference,
        rootfs,
        layer,
    } = &image
    else {
        return Ok((image, Loaded::Already));
    };
    let marker = places.msb_home.join(LOADED_LAYER);
    let recorded = fs::read_to_string(&marker).is_ok_and(|text| text.trim() == layer);
    if recorded && crate::sandbox::microvm::image_loaded(&places.msb_home, reference).await? {
        return Ok((image, Loaded::Already));
    }
    crate::sandbox::microvm::load_image(
        &places.msb_home,
        &rootfs.with_file_name("image.tar"),
        reference,
    )
    .await?;
    fs::write(&marker, layer).map_err(|error| ImageError::io("write", &marker, &error))?;
    Ok((image, Loaded::Now))
}

/// The file in a microsandbox home naming the layer of `perch:default` perch loaded into it, so
/// loading the same build again is skipped.
pub const LOADED_LAYER: &str = "perch-loaded-layer";

/// Whether [`load_recorded`] loaded the image or found that build loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    Now,
    Already,
}

/// The build `perch:default` refers to, as the sandbox boots it; `Unavailable` if
/// `perch image build` has not completed on this machine.
pub fn resolve_default_image(cache: &Path) -> Result<ImageRef, SandboxError> {
    let not_built = |what: String| SandboxError::Unavailable {
        what,
        fix: "run `perch image build` (or `perch image build --minimal` on a small machine)".into(),
    };
    let path = default_record(cache);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(not_built(format!(
                "the image {DEFAULT_REFERENCE} is not built ({} does not exist)",
                path.display()
            )));
        }
        Err(error) => {
            return Err(not_built(format!(
                "the image {DEFAULT_REFERENCE} cannot be found: {} cannot be read: {error}",
                path.display()
            )));
        }
    };
    let record = serde_json::from_str::<DefaultImage>(&text).ok();
    let Some(record) = record.filter(|record| is_key(&record.key)) else {
        return Err(not_built(format!(
            "the image {DEFAULT_REFERENCE} cannot be found: {} names no build",
            path.display()
        )));
    };
    let dir = ImageDir::new(cache, &record.key);
    let rootfs = dir.rootfs();
    if !rootfs.is_dir() {
        return Err(not_built(format!(
            "the image {DEFAULT_REFERENCE} is not built: {} is missing",
            rootfs.display()
        )));
    }
    let Some(layer) = built_layer(&dir) else {
        return Err(not_built(format!(
            "the image {DEFAULT_REFERENCE} is not built: {} names no packed layer",
            dir.recipe().display()
        )));
    };
    Ok(ImageRef::Local {
        reference: record.reference,
        rootfs,
        layer,
    })
}

fn checked_mirror(mirror: &str) -> Result<String, ImageError> {
    let schemes = ["http://", "https://", "ftp://", "file:/"];
    if schemes.iter().any(|scheme| mirror.starts_with(scheme)) {
        Ok(mirror.trim_end_matches('/').to_owned())
    } else {
        Err(ImageError::new(
            format!("--mirror {mirror:?} is not a URL debootstrap can fetch from"),
            "pass an http://, https://, ftp:// or file:/ URL, such as the `URIs:` of the Debian entry in /etc/apt/sources.list.d/",
        ))
    }
}

/// Takes the build's lock for as long as the returned file is open.
fn lock(dir: &ImageDir) -> Result<File, ImageError> {
    let path = dir.root.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|error| ImageError::io("open", &path, &error))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(ImageError::new(
            format!(
                "another `perch image build` is building this image (lock {})",
                path.display()
            ),
            "wait for it to finish, then run this again",
        )),
        Err(fs::TryLockError::Error(error)) => Err(ImageError::io("lock", &path, &error)),
    }
}

/// Removes what a build that died left behind. Called with the lock held, so nothing else is
/// writing them.
fn clear_partials(dir: &ImageDir) -> Result<(), ImageError> {
    for tree in [dir.partial_rootfs(), dir.retired_rootfs()] {
        if tree.exists() {
            unmount_under(&tree)?;
            fs::remove_dir_all(&tree).map_err(|error| ImageError::io("remove", &tree, &error))?;
        }
    }
    let archive = dir.archive();
    for file in [
        sibling(&archive, ".partial"),
        sibling(&archive, ".layer.partial"),
    ] {
        remove_file_if_present(&file)?;
    }
    Ok(())
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}
