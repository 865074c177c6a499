//! The OCI image-layout archive: the root filesystem packed by the system `tar` as one layer,
//! with its config and manifest.

use super::layout::{ImageError, create_new, sibling};
use perch_core::image::{Blob, OCI_LAYOUT, OciImage, Recipe};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

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
