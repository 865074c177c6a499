//! perch's own image without debootstrap: the archive, reuse, errors with their fix, the record.

use perch::sandbox::image::{self, BuildOptions, Host, ImageDir};
use perch::sandbox::{ImageRef, SandboxError};
use perch_core::image::{Flavour, REF_NAME_ANNOTATION, Recipe};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn blob_path(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap())
}

/// Every regular file in a tar, by its path without a leading `./`.
fn entries(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut archive = tar::Archive::new(bytes);
    let mut out = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let path = path.strip_prefix("./").unwrap_or(&path).to_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        if entry.header().entry_type().is_file() {
            out.insert(path, data);
        } else {
            out.insert(format!("{path}/"), Vec::new());
        }
    }
    out
}

fn fake_rootfs(root: &Path) {
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(root.join("etc/hostname"), "perch\n").unwrap();
    std::fs::write(root.join("usr/bin/tool"), "#!/bin/sh\necho hi\n").unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool2")).unwrap();
}

fn minimal() -> Recipe {
    Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap()
}

#[test]
fn the_archive_is_an_oci_layout_whose_digests_match_its_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    fake_rootfs(&rootfs);
    let archive = dir.path().join("image.tar");
    let recipe = minimal();
    let packed = image::pack(&rootfs, &archive, &recipe, "perch:default").unwrap();

    let files = entries(&std::fs::read(&archive).unwrap());
    assert_eq!(
        serde_json::from_slice::<Value>(&files["oci-layout"]).unwrap()["imageLayoutVersion"],
        "1.0.0"
    );
    let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(entry["annotations"][REF_NAME_ANNOTATION], "perch:default");
    assert_eq!(entry["platform"]["os"], "linux");
    assert_eq!(entry["platform"]["architecture"], "amd64");

    let manifest_digest = entry["digest"].as_str().unwrap();
    assert_eq!(manifest_digest, packed.manifest.digest);
    let manifest_bytes = &files[&blob_path(manifest_digest)];
    assert_eq!(sha256(manifest_bytes), manifest_digest);
    assert_eq!(entry["size"], manifest_bytes.len());
    let manifest: Value = serde_json::from_slice(manifest_bytes).unwrap();
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );

    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let config_bytes = &files[&blob_path(config_digest)];
    assert_eq!(sha256(config_bytes), config_digest);
    assert_eq!(manifest["config"]["size"], config_bytes.len());

    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let layer_digest = layers[0]["digest"].as_str().unwrap();
    let layer_bytes = &files[&blob_path(layer_digest)];
    assert_eq!(sha256(layer_bytes), layer_digest);
    assert_eq!(layers[0]["size"], layer_bytes.len());
    assert_eq!(layer_digest, packed.layer.digest);

    let config: Value = serde_json::from_slice(config_bytes).unwrap();
    assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["config"]["Labels"]["dev.perch.image.key"],
        recipe.key()
    );

    let layer = entries(layer_bytes);
    assert_eq!(layer["etc/hostname"], b"perch\n");
    assert!(layer.contains_key("usr/bin/tool"));
    assert!(layer.contains_key("bin/"), "the symlink is kept: {layer:?}");
    let blobs = files
        .keys()
        .filter(|path| path.starts_with("blobs/sha256/") && !path.ends_with('/'));
    assert_eq!(blobs.count(), 3);
    assert!(!dir.path().join("image.tar.partial").exists());
    assert!(!dir.path().join("image.tar.layer.partial").exists());
}

#[test]
fn packing_the_same_tree_twice_gives_the_same_digests() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    fake_rootfs(&rootfs);
    let first = image::pack(
        &rootfs,
        &dir.path().join("a.tar"),
        &minimal(),
        "perch:default",
    )
    .unwrap();
    let second = image::pack(
        &rootfs,
        &dir.path().join("b.tar"),
        &minimal(),
        "perch:default",
    )
    .unwrap();
    assert_eq!(first, second);
}

#[test]
fn a_missing_tree_is_an_error_and_leaves_no_archive() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    let error = image::pack(
        &dir.path().join("nothing"),
        &archive,
        &minimal(),
        "perch:default",
    )
    .unwrap_err();
    assert!(error.what.contains("tar could not pack"), "{error}");
    assert!(!archive.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn fake_host(dir: &Path, os_release: &str) -> Host {
    std::fs::write(dir.join("os-release"), os_release).unwrap();
    std::fs::create_dir_all(dir.join("apt/sources.list.d")).unwrap();
    Host {
        os_release: dir.join("os-release"),
        apt: dir.join("apt"),
        arch: "x86_64".into(),
    }
}

fn options(flavour: Flavour) -> BuildOptions {
    BuildOptions {
        flavour,
        mirror: None,
        suite: None,
        rebuild: false,
    }
}

#[test]
fn the_host_mirror_comes_from_apt_sources_in_apts_order() {
    let dir = tempfile::tempdir().unwrap();
    let host = fake_host(dir.path(), "ID=debian\nVERSION_CODENAME=bookworm\n");
    assert_eq!(host.suite().as_deref(), Some("bookworm"));
    assert_eq!(host.mirror("bookworm"), None);
    let list_d = dir.path().join("apt/sources.list.d");
    std::fs::write(
        list_d.join("a-disabled.list.disabled-by-farm"),
        "deb http://ignored.example/debian bookworm main\n",
    )
    .unwrap();
    std::fs::write(
        list_d.join("debian.sources"),
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
         Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n",
    )
    .unwrap();
    assert_eq!(
        host.mirror("bookworm").as_deref(),
        Some("http://deb.debian.org/debian")
    );
    std::fs::write(
        dir.path().join("apt/sources.list"),
        "deb http://local.mirror/debian/ bookworm main\n",
    )
    .unwrap();
    assert_eq!(
        host.mirror("bookworm").as_deref(),
        Some("http://local.mirror/debian")
    );
}

#[test]
fn without_a_suite_or_mirror_the_error_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let host = fake_host(dir.path(), "ID=debian\n");
    let error = image::prepare(&cache, &host, &options(Flavour::Minimal), &mut |_| {}).unwrap_err();
    assert!(error.what.contains("VERSION_CODENAME"), "{error}");
    assert!(error.fix.as_deref().unwrap().contains("--suite"), "{error}");

    let host = fake_host(dir.path(), "VERSION_CODENAME=bookworm\n");
    let error = image::prepare(&cache, &host, &options(Flavour::Minimal), &mut |_| {}).unwrap_err();
    assert!(
        error.what.contains("no Debian mirror for bookworm"),
        "{error}"
    );
    assert!(
        error.fix.as_deref().unwrap().contains("--mirror URL"),
        "{error}"
    );

    let mut bad = options(Flavour::Minimal);
    bad.mirror = Some("deb.debian.org/debian".into());
    let error = image::prepare(&cache, &host, &bad, &mut |_| {}).unwrap_err();
    assert!(error.what.contains("is not a URL"), "{error}");
}

#[test]
fn a_complete_rootfs_is_reused_and_only_the_archive_is_packed() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let host = fake_host(dir.path(), "VERSION_CODENAME=bookworm\n");
    let recipe = minimal();
    let build = ImageDir::new(&cache, &recipe.key());
    fake_rootfs(&build.rootfs());
    std::fs::create_dir_all(build.root.join("rootfs.partial/proc")).unwrap();

    let mut lines = Vec::new();
    let prepared = image::prepare(&cache, &host, &options(Flavour::Minimal), &mut |line| {
        lines.push(line.to_owned())
    })
    .unwrap();
    assert_eq!(prepared.key, recipe.key());
    assert!(
        lines.iter().any(|line| line.starts_with("rootfs: reusing")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("archive: packing")),
        "{lines:?}"
    );
    assert!(build.archive().is_file());
    assert!(
        !build.root.join("rootfs.partial").exists(),
        "a dead build's leftovers are removed"
    );
    let record: Value = serde_json::from_slice(&std::fs::read(build.recipe()).unwrap()).unwrap();
    assert_eq!(record["key"], recipe.key());
    assert_eq!(record["archive"]["reference"], "perch:default");

    let error = image::prepare(&cache, &host, &options(Flavour::Minimal), &mut |_| {}).unwrap_err();
    assert!(
        error.what.contains("another `perch image build`"),
        "{error}"
    );
    drop(prepared);

    let mut again = Vec::new();
    image::prepare(&cache, &host, &options(Flavour::Minimal), &mut |line| {
        again.push(line.to_owned())
    })
    .unwrap();
    assert!(
        again.iter().any(|line| line.starts_with("rootfs: reusing")),
        "{again:?}"
    );
    assert!(
        again
            .iter()
            .any(|line| line.starts_with("archive: reusing")),
        "{again:?}"
    );

    let other = Recipe::new(Flavour::Default, "bookworm", "x86_64").unwrap();
    assert_ne!(ImageDir::new(&cache, &other.key()), build);
}

#[test]
fn the_default_image_resolves_only_when_built() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path();
    let error = image::resolve_default_image(cache).unwrap_err();
    let SandboxError::Unavailable { what, fix } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(
        what,
        &format!(
            "the image perch:default is not built ({} does not exist)",
            image::default_record(cache).display()
        )
    );
    assert!(fix.contains("perch image build"), "{fix}");

    let key = minimal().key();
    std::fs::create_dir_all(image::images_dir(cache)).unwrap();
    std::fs::write(
        image::default_record(cache),
        serde_json::to_string(&perch_core::image::DefaultImage {
            reference: "perch:default".into(),
            key: key.clone(),
            recipe: perch_core::image::Flavour::Minimal,
            suite: "bookworm".into(),
            arch: "amd64".into(),
            recorded: chrono::Utc::now(),
        })
        .unwrap(),
    )
    .unwrap();
    let error = image::resolve_default_image(cache).unwrap_err();
    assert!(error.to_string().contains("is missing"), "{error}");

    let built = ImageDir::new(cache, &key);
    let rootfs = built.rootfs();
    std::fs::create_dir_all(&rootfs).unwrap();
    let error = image::resolve_default_image(cache).unwrap_err();
    assert!(
        error.to_string().contains("names no packed layer"),
        "{error}"
    );

    let layer = |digest: &str| {
        let blob = perch_core::image::Blob {
            digest: digest.into(),
            size: 1,
        };
        let record = perch_core::image::BuildRecord {
            key: key.clone(),
            recipe: minimal(),
            canonical: minimal().canonical(),
            mirror: None,
            rootfs_built: None,
            archive: Some(perch_core::image::PackedArchive {
                reference: "perch:default".into(),
                manifest: blob.clone(),
                config: blob.clone(),
                layer: blob,
                packed: chrono::Utc::now(),
            }),
        };
        std::fs::write(built.recipe(), serde_json::to_string(&record).unwrap()).unwrap();
    };
    layer("sha256:1111");
    assert_eq!(
        image::resolve_default_image(cache).unwrap(),
        ImageRef::Local {
            reference: "perch:default".into(),
            rootfs,
            layer: "sha256:1111".into(),
        }
    );
    // A rebuild packs another layer under the same recipe key and rootfs path: the image's
    // identity, and so the machine's fingerprint, changes with it.
    layer("sha256:2222");
    let ImageRef::Local { layer: rebuilt, .. } = image::resolve_default_image(cache).unwrap()
    else {
        panic!("a local image");
    };
    assert_eq!(rebuilt, "sha256:2222");

    std::fs::write(image::default_record(cache), r#"{"key":"../../etc"}"#).unwrap();
    assert!(image::resolve_default_image(cache).is_err());
}
