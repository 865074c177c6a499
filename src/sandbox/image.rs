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

use crate::host::Places;
use crate::sandbox::{ImageRef, SandboxError};
use perch_core::image::{
    Blob, BuildRecord, DEFAULT_REFERENCE, DefaultImage, Flavour, OCI_LAYOUT, OciImage,
    PackedArchive, Recipe, SourcesFormat, debian_mirror, is_key, os_release_codename,
    parse_sources,
};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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

/// Why an image could not be built or found: what happened, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    pub what: String,
    pub fix: Option<String>,
}

impl ImageError {
    fn new(what: impl Into<String>, fix: impl Into<String>) -> ImageError {
        ImageError {
            what: what.into(),
            fix: Some(fix.into()),
        }
    }

    fn io(action: &str, path: &Path, error: &io::Error) -> ImageError {
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
    fn entries(&self) -> Vec<PathBuf> {
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

    fn partial_rootfs(&self) -> PathBuf {
        self.root.join("rootfs.partial")
    }

    fn retired_rootfs(&self) -> PathBuf {
        self.root.join("rootfs.old")
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
pub async fn load_recorded(places: &Places) -> Result<ImageRef, ImageError> {
    let image = resolve_default_image(&places.cache)?;
    if let ImageRef::Local {
        reference, rootfs, ..
    } = &image
    {
        crate::sandbox::microvm::load_image(
            &places.msb_home,
            &rootfs.with_file_name("image.tar"),
            reference,
        )
        .await?;
    }
    Ok(image)
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

/// The digests of a packed archive's blobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    pub config: Blob,
    pub manifest: Blob,
    pub layer: Blob,
}

/// Packs `rootfs` into `archive`, an OCI image layout (`oci-layout`, `index.json`,
/// `blobs/sha256/{config, manifest, layer}`) whose index names the image `reference`. The
/// layer is the system `tar --numeric-owner --xattrs` of the tree, uncompressed, so hard
/// links, device nodes and ownership survive, and the same tree packs to the same digests.
/// The archive appears only when complete.
pub fn pack(
    rootfs: &Path,
    archive: &Path,
    recipe: &Recipe,
    reference: &str,
) -> Result<Packed, ImageError> {
    let layer_path = sibling(archive, ".layer.partial");
    let partial = sibling(archive, ".partial");
    let result = (|| {
        let layer = pack_layer(rootfs, &layer_path)?;
        let image = OciImage::new(recipe, &layer, reference);
        let packed = Packed {
            config: image.config_blob(),
            manifest: image.manifest_blob(),
            layer,
        };
        write_layout(&partial, &image, &packed, &layer_path)
            .map_err(|error| ImageError::io("write", &partial, &error))?;
        fs::rename(&partial, archive)
            .map_err(|error| ImageError::io("rename", &partial, &error))?;
        Ok(packed)
    })();
    let _ = fs::remove_file(&layer_path);
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result
}

fn pack_layer(rootfs: &Path, layer_path: &Path) -> Result<Blob, ImageError> {
    let tar_failed = |detail: String| {
        ImageError::new(
            format!("tar could not pack {}: {detail}", rootfs.display()),
            "perch packs the image with GNU tar (--sort=name --xattrs); install it (apt-get install tar)",
        )
    };
    let mut child = Command::new("tar")
        .args([
            "--numeric-owner",
            "--xattrs",
            "--one-file-system",
            "--sort=name",
            "--format=posix",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            "-C",
        ])
        .arg(rootfs)
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| tar_failed(error.to_string()))?;
    let mut stderr_text = String::new();
    let copied = (|| -> io::Result<Blob> {
        let mut out = create_new(layer_path)?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let read = stdout.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
            out.write_all(&buffer[..read])?;
            size += read as u64;
        }
        out.sync_all()?;
        Ok(Blob::from_sha256(&hasher.finalize(), size))
    })();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut stderr_text);
    }
    let status = child
        .wait()
        .map_err(|error| tar_failed(error.to_string()))?;
    if !status.success() {
        return Err(tar_failed(format!("{status}: {}", stderr_text.trim())));
    }
    copied.map_err(|error| ImageError::io("write", layer_path, &error))
}

fn write_layout(path: &Path, image: &OciImage, packed: &Packed, layer: &Path) -> io::Result<()> {
    let file = create_new(path)?;
    let mut builder = tar::Builder::new(io::BufWriter::new(file));
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut header = entry_header(tar::EntryType::Directory, 0o755, 0);
        builder.append_data(&mut header, dir, io::empty())?;
    }
    let mut append = |name: &str, size: u64, data: &mut dyn Read| {
        let mut header = entry_header(tar::EntryType::Regular, 0o644, size);
        builder.append_data(&mut header, name, data)
    };
    append("oci-layout", OCI_LAYOUT.len() as u64, &mut &OCI_LAYOUT[..])?;
    append(
        "index.json",
        image.index.len() as u64,
        &mut &image.index[..],
    )?;
    append(
        &packed.config.path(),
        packed.config.size,
        &mut &image.config[..],
    )?;
    append(
        &packed.manifest.path(),
        packed.manifest.size,
        &mut &image.manifest[..],
    )?;
    append(
        &packed.layer.path(),
        packed.layer.size,
        &mut File::open(layer)?,
    )?;
    let file = builder
        .into_inner()?
        .into_inner()
        .map_err(|error| error.into_error())?;
    file.sync_all()
}

fn entry_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header
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

/// A debootstrap killed mid-run can leave /proc or /sys mounted inside its target; deleting
/// the tree would then walk into the host's. Unmounts them, deepest first, or refuses.
fn unmount_under(tree: &Path) -> Result<(), ImageError> {
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

fn debootstrap(
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
fn install_rootfs(dir: &ImageDir) -> Result<(), ImageError> {
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

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

fn remove_file_if_present(path: &Path) -> Result<(), ImageError> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(ImageError::io("remove", path, &error))
        }
        _ => Ok(()),
    }
}

/// Creates `path`, which must not exist yet: never through a symbolic link, never over a file.
fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

/// One of the cache's records, when `path` holds one.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_str(&fs::read_to_string(path).ok()?).ok()
}

/// Writes `value` as pretty JSON over `path` durably; other builds may write it at the same time
/// (see [`atomic_file::replace_shared`](crate::store::atomic_file::replace_shared)).
fn write_json_atomic(path: &Path, value: &impl serde::Serialize) -> Result<(), ImageError> {
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
