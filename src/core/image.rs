//! perch's own images, as pure data: the recipes `perch image build` follows, the key that names
//! a build, the OCI metadata an image archive carries, and finding the host's Debian mirror in
//! apt's sources. The shell reads the files, runs debootstrap and writes the archive.

use crate::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::fmt;

/// The reference perch's own image is loaded under.
pub const DEFAULT_REFERENCE: &str = crate::config::DEFAULT_IMAGE;

/// The debootstrap variant every recipe starts from.
pub const VARIANT: &str = "minbase";

/// What the `default` recipe adds to minbase.
pub const DEFAULT_PACKAGES: &[&str] = &[
    "build-essential",
    "ca-certificates",
    "curl",
    "fd-find",
    "git",
    "jq",
    "python3",
    "ripgrep",
];

/// The `oci-layout` file of an OCI image layout.
pub const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// The annotation on an index entry that names the image.
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// The label on an image config carrying the recipe key it was built from.
pub const KEY_LABEL: &str = "dev.perch.image.key";

const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const GUEST_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Bumped when the meaning of a recipe changes without its fields changing.
const RECIPE_FORMAT: u32 = 1;

/// Which package set a recipe installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    /// minbase plus the tools an agent reaches for ([`DEFAULT_PACKAGES`]).
    Default,
    /// minbase alone: for tests and small machines.
    Minimal,
}

impl Flavour {
    /// `default` or `minimal`, as `recipe.json` and the image's labels name it.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Default => "default",
            Flavour::Minimal => "minimal",
        }
    }

    /// The packages added to minbase.
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            Flavour::Default => DEFAULT_PACKAGES,
            Flavour::Minimal => &[],
        }
    }
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that decides what a built image contains. The mirror is where the packages come
/// from, not what they are, so it is not part of the recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub flavour: Flavour,
    /// The Debian (or Ubuntu) release codename, such as `bookworm`.
    pub suite: String,
    /// The Debian architecture name, such as `amd64`.
    pub arch: String,
    pub variant: String,
    /// Sorted.
    pub packages: Vec<String>,
}

/// A recipe that cannot be built as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecipeError {
    /// Not a release codename debootstrap could know.
    BadSuite(String),
    /// No Debian architecture for this CPU (perch's microVMs run on x86_64 and aarch64).
    UnsupportedArch(String),
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecipeError::BadSuite(suite) => write!(
                f,
                "{suite:?} is not a release codename (lowercase letters, digits, '.', '-', such as bookworm)"
            ),
            RecipeError::UnsupportedArch(arch) => write!(
                f,
                "perch images are built for x86_64 and aarch64, not {arch}"
            ),
        }
    }
}

impl std::error::Error for RecipeError {}

impl Recipe {
    /// The recipe for `flavour` on release `suite`, for the CPU named by Rust's `arch`
    /// (`std::env::consts::ARCH`).
    pub fn new(flavour: Flavour, suite: &str, arch: &str) -> Result<Recipe, RecipeError> {
        let valid = !suite.is_empty()
            && suite.starts_with(|c: char| c.is_ascii_lowercase())
            && suite
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
        if !valid {
            return Err(RecipeError::BadSuite(suite.to_owned()));
        }
        let arch =
            debian_arch(arch).ok_or_else(|| RecipeError::UnsupportedArch(arch.to_owned()))?;
        let mut packages: Vec<String> =
            flavour.packages().iter().map(|p| (*p).to_owned()).collect();
        packages.sort();
        Ok(Recipe {
            flavour,
            suite: suite.to_owned(),
            arch: arch.to_owned(),
            variant: VARIANT.to_owned(),
            packages,
        })
    }

    /// The canonical description the key is the hash of: one field per line, packages sorted.
    pub fn canonical(&self) -> String {
        format!(
            "perch image recipe {RECIPE_FORMAT}\nvariant {}\nsuite {}\narch {}\npackages {}\n",
            self.variant,
            self.suite,
            self.arch,
            self.packages.join(" ")
        )
    }

    /// The recipe's fingerprint: the SHA-256 of [`Recipe::canonical`], in lowercase hex. It
    /// names the build's cache directory.
    pub fn key(&self) -> String {
        hex(&Sha256::digest(self.canonical().as_bytes()))
    }

    /// debootstrap's options, before the suite, target and mirror arguments.
    pub fn debootstrap_options(&self) -> Vec<String> {
        let mut options = vec![
            format!("--variant={}", self.variant),
            format!("--arch={}", self.arch),
        ];
        if !self.packages.is_empty() {
            options.push(format!("--include={}", self.packages.join(",")));
        }
        options
    }
}

/// Whether `text` could be a recipe key: 64 lowercase hex digits.
pub fn is_key(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The Debian (and OCI) architecture name for Rust's `std::env::consts::ARCH`.
pub fn debian_arch(rust_arch: &str) -> Option<&'static str> {
    match rust_arch {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `images/<key>/recipe.json`: one build in the image cache, what it is made of and, once it is
/// packed, its OCI archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildRecord {
    /// The recipe's [`Recipe::key`], which names the build's directory.
    pub key: String,
    pub recipe: Recipe,
    /// The recipe's [`Recipe::canonical`] text, which `key` hashes.
    pub canonical: String,
    /// The Debian archive the root filesystem came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_built: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<PackedArchive>,
}

/// The OCI archive a build was packed into (`image.tar`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedArchive {
    /// The image name its index carries, `perch:default`.
    pub reference: String,
    pub manifest: Blob,
    pub config: Blob,
    pub layer: Blob,
    pub packed: Timestamp,
}

/// `images/default.json`: the build `perch:default` refers to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultImage {
    pub reference: String,
    /// The build's key: its directory under `images/`.
    pub key: String,
    pub recipe: Flavour,
    pub suite: String,
    pub arch: String,
    pub recorded: Timestamp,
}

/// A content-addressed blob of an OCI image layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
}

impl Blob {
    /// The descriptor of `bytes`.
    pub fn of(bytes: &[u8]) -> Blob {
        Blob::from_sha256(&Sha256::digest(bytes), bytes.len() as u64)
    }

    /// The descriptor of a blob hashed elsewhere (a layer streamed to disk).
    pub fn from_sha256(hash: &[u8], size: u64) -> Blob {
        Blob {
            digest: format!("sha256:{}", hex(hash)),
            size,
        }
    }

    /// The blob's path inside the layout: `blobs/sha256/<hex>`.
    pub fn path(&self) -> String {
        format!("blobs/{}", self.digest.replacen(':', "/", 1))
    }
}

/// The small JSON documents of a single-layer OCI image layout. The layer is stored
/// uncompressed, so its digest is also its diff id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciImage {
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub index: Vec<u8>,
}

impl OciImage {
    /// The documents for `recipe`'s rootfs packed as `layer`, named `reference` in the index.
    pub fn new(recipe: &Recipe, layer: &Blob, reference: &str) -> OciImage {
        let config = to_bytes(&json!({
            "architecture": recipe.arch,
            "os": "linux",
            "config": {
                "Env": [GUEST_PATH],
                "Cmd": ["/bin/sh"],
                "Labels": {
                    KEY_LABEL: recipe.key(),
                    "dev.perch.image.recipe": recipe.flavour.name(),
                    "dev.perch.image.suite": recipe.suite,
                },
            },
            "rootfs": { "type": "layers", "diff_ids": [layer.digest] },
        }));
        let config_blob = Blob::of(&config);
        let manifest = to_bytes(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": descriptor(MEDIA_CONFIG, &config_blob),
            "layers": [descriptor(MEDIA_LAYER, layer)],
        }));
        let manifest_blob = Blob::of(&manifest);
        let mut entry = descriptor(MEDIA_MANIFEST, &manifest_blob);
        entry["platform"] = json!({ "architecture": recipe.arch, "os": "linux" });
        entry["annotations"] = json!({ REF_NAME_ANNOTATION: reference });
        let index = to_bytes(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [entry],
        }));
        OciImage {
            config,
            manifest,
            index,
        }
    }

    /// The config's descriptor.
    pub fn config_blob(&self) -> Blob {
        Blob::of(&self.config)
    }

    /// The manifest's descriptor, as the index names it.
    pub fn manifest_blob(&self) -> Blob {
        Blob::of(&self.manifest)
    }
}

fn descriptor(media_type: &str, blob: &Blob) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": blob.digest, "size": blob.size })
}

fn to_bytes(value: &serde_json::Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// The release codename in `/etc/os-release` (`VERSION_CODENAME`), if it names one.
pub fn os_release_codename(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("VERSION_CODENAME="))
        .map(|value| {
            value
                .trim()
                .trim_matches(|c| c == '"' || c == '\'')
                .to_owned()
        })
        .find(|value| !value.is_empty())
}

/// How an apt sources file is written, told by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcesFormat {
    /// `sources.list` and `*.list`: `deb [options] URI suite component...`.
    OneLine,
    /// `*.sources`: deb822 stanzas with `Types`, `URIs`, `Suites`, `Components`.
    Deb822,
}

impl SourcesFormat {
    /// The format apt reads a file named `file_name` in, or `None` if apt ignores it.
    pub fn of(file_name: &str) -> Option<SourcesFormat> {
        if file_name.ends_with(".list") {
            Some(SourcesFormat::OneLine)
        } else if file_name.ends_with(".sources") {
            Some(SourcesFormat::Deb822)
        } else {
            None
        }
    }
}

/// One repository apt knows: one type at one URI, with its suites and components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    /// `deb` or `deb-src`.
    pub kind: String,
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
}

/// Reads a sources file in `format`; malformed and disabled entries are skipped.
pub fn parse_sources(text: &str, format: SourcesFormat) -> Vec<AptSource> {
    match format {
        SourcesFormat::OneLine => parse_one_line(text),
        SourcesFormat::Deb822 => parse_deb822(text),
    }
}

fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some((kind, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        if kind != "deb" && kind != "deb-src" {
            continue;
        }
        let mut rest = rest.trim_start();
        if let Some(options) = rest.strip_prefix('[') {
            let Some((_, after)) = options.split_once(']') else {
                continue;
            };
            rest = after;
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        sources.push(AptSource {
            kind: kind.to_owned(),
            uri: uri.to_owned(),
            suites: vec![suite.to_owned()],
            components: words.map(str::to_owned).collect(),
        });
    }
    sources
}

fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    let mut stanza: Vec<(String, String)> = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if !stanza.is_empty() {
                sources.extend(stanza_sources(&stanza));
                stanza.clear();
            }
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = stanza.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((field, value)) = line.split_once(':') {
            stanza.push((field.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    sources
}

fn stanza_sources(stanza: &[(String, String)]) -> Vec<AptSource> {
    let field = |name: &str| -> Vec<String> {
        stanza
            .iter()
            .filter(|(field, _)| field == name)
            .flat_map(|(_, value)| value.split_whitespace().map(str::to_owned))
            .collect()
    };
    let enabled = field("enabled");
    if enabled
        .first()
        .is_some_and(|value| value.eq_ignore_ascii_case("no"))
    {
        return Vec::new();
    }
    let suites = field("suites");
    let components = field("components");
    let mut sources = Vec::new();
    for kind in field("types") {
        for uri in field("uris") {
            sources.push(AptSource {
                kind: kind.clone(),
                uri,
                suites: suites.clone(),
                components: components.clone(),
            });
        }
    }
    sources
}

/// The first Debian mirror in `sources` that debootstrap can build `suite` from: a `deb`
/// entry with the `main` component at an http(s), ftp or file URI, never a security mirror.
/// An entry for `suite` itself wins; failing that, the first archive whose path ends in
/// `/debian`. The URI is returned without a trailing slash.
pub fn debian_mirror(sources: &[AptSource], suite: &str) -> Option<String> {
    let usable: Vec<&AptSource> = sources
        .iter()
        .filter(|source| {
            source.kind == "deb"
                && source.components.iter().any(|c| c == "main")
                && !is_security(source)
                && ["http://", "https://", "ftp://", "file:/"]
                    .iter()
                    .any(|scheme| source.uri.starts_with(scheme))
        })
        .collect();
    let chosen = usable
        .iter()
        .find(|source| source.suites.iter().any(|s| s == suite))
        .or_else(|| {
            usable
                .iter()
                .find(|source| source.uri.trim_end_matches('/').ends_with("/debian"))
        })?;
    Some(chosen.uri.trim_end_matches('/').to_owned())
}

fn is_security(source: &AptSource) -> bool {
    source.uri.contains("security")
        || source
            .suites
            .iter()
            .all(|suite| suite.ends_with("-security") || suite.ends_with("/updates"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOKWORM_SOURCES: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    #[test]
    fn deb822_stanzas_become_one_source_per_type_and_uri() {
        let sources = parse_sources(BOOKWORM_SOURCES, SourcesFormat::Deb822);
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].uri, "http://deb.debian.org/debian");
        assert_eq!(sources[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(sources[0].components, ["main"]);
        let two = "Types: deb deb-src\nURIs: http://a/debian http://b/debian\nSuites: trixie\nComponents: main contrib\n";
        assert_eq!(parse_sources(two, SourcesFormat::Deb822).len(), 4);
    }

    #[test]
    fn deb822_skips_disabled_stanzas_and_folds_continuation_lines() {
        let text = "Types: deb\nURIs: http://off/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n\
                    Types: deb\nURIs: http://on/debian\nSuites: bookworm\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n -----END PGP PUBLIC KEY BLOCK-----\n";
        let sources = parse_sources(text, SourcesFormat::Deb822);
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].uri, "http://on/debian");
        assert_eq!(
            debian_mirror(&sources, "bookworm").as_deref(),
            Some("http://on/debian")
        );
    }

    #[test]
    fn one_line_format_with_options_and_comments() {
        let text = "# a comment\n\
                    deb-src http://deb.debian.org/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian/ bookworm main contrib # note\n\
                    deb http://security.debian.org/debian-security bookworm-security main\n\
                    not a source line\n";
        let sources = parse_sources(text, SourcesFormat::OneLine);
        assert_eq!(sources.len(), 3);
        assert_eq!(sources[1].uri, "http://ftp.de.debian.org/debian/");
        assert_eq!(sources[1].components, ["main", "contrib"]);
        assert_eq!(
            debian_mirror(&sources, "bookworm").as_deref(),
            Some("http://ftp.de.debian.org/debian")
        );
    }

    #[test]
    fn the_security_mirror_is_never_chosen() {
        let sources = parse_sources(
            "deb http://deb.debian.org/debian-security bookworm-security main\n\
             deb http://security.debian.org bookworm main\n",
            SourcesFormat::OneLine,
        );
        assert_eq!(debian_mirror(&sources, "bookworm"), None);
        let mut all = sources;
        all.extend(parse_sources(BOOKWORM_SOURCES, SourcesFormat::Deb822));
        assert_eq!(
            debian_mirror(&all, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
    }

    #[test]
    fn the_suites_own_entry_wins_over_third_party_repositories() {
        let sources = parse_sources(
            "deb https://deb.nodesource.com/node_20.x nodistro main\n\
             deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n\
             deb http://mirror.example.org/debian bookworm main\n",
            SourcesFormat::OneLine,
        );
        assert_eq!(
            debian_mirror(&sources, "bookworm").as_deref(),
            Some("http://mirror.example.org/debian")
        );
        let stable = parse_sources(
            "deb http://deb.debian.org/debian stable main\n",
            SourcesFormat::OneLine,
        );
        assert_eq!(
            debian_mirror(&stable, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
    }

    #[test]
    fn no_mirror_when_nothing_qualifies() {
        assert_eq!(debian_mirror(&[], "bookworm"), None);
        let sources = parse_sources(
            "deb https://deb.nodesource.com/node_20.x nodistro main\n\
             deb http://deb.debian.org/debian bookworm contrib\n\
             deb mirror+file:/etc/apt/mirrors/debian.list bookworm main\n",
            SourcesFormat::OneLine,
        );
        assert_eq!(debian_mirror(&sources, "bookworm"), None);
    }

    #[test]
    fn sources_format_by_file_name() {
        assert_eq!(
            SourcesFormat::of("sources.list"),
            Some(SourcesFormat::OneLine)
        );
        assert_eq!(
            SourcesFormat::of("debian.sources"),
            Some(SourcesFormat::Deb822)
        );
        assert_eq!(SourcesFormat::of("google.list.disabled-by-farm"), None);
    }

    #[test]
    fn codename_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n";
        assert_eq!(os_release_codename(text).as_deref(), Some("bookworm"));
        assert_eq!(
            os_release_codename("VERSION_CODENAME=\"noble\"\n").as_deref(),
            Some("noble")
        );
        assert_eq!(os_release_codename("ID=debian\nVERSION_CODENAME=\n"), None);
    }

    #[test]
    fn the_cache_records_written_before_they_were_typed_still_read() {
        let build = r#"{
  "archive": {
    "config": {"digest": "sha256:76ba", "size": 426},
    "layer": {"digest": "sha256:9361", "size": 204769280},
    "manifest": {"digest": "sha256:1808", "size": 402},
    "packed": "2026-12-03T16:09:49.296560788+00:00",
    "reference": "perch:default"
  },
  "canonical": "perch image recipe 1\nvariant minbase\nsuite bookworm\narch amd64\npackages \n",
  "key": "a7fc",
  "mirror": "http://deb.debian.org/debian",
  "recipe": {"arch": "amd64", "flavour": "minimal", "packages": [], "suite": "bookworm", "variant": "minbase"},
  "rootfs_built": "2026-12-03T16:09:48.482432773+00:00"
}"#;
        let record: BuildRecord = serde_json::from_str(build).unwrap();
        let recipe = Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap();
        assert_eq!(record.recipe, recipe);
        assert_eq!(record.canonical, recipe.canonical());
        assert_eq!(record.archive.as_ref().unwrap().layer.digest, "sha256:9361");
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            concat!(
                r#"{"key":"a7fc","recipe":{"flavour":"minimal","suite":"bookworm","arch":"amd64","#,
                r#""variant":"minbase","packages":[]},"canonical":"perch image recipe 1\nvariant "#,
                r#"minbase\nsuite bookworm\narch amd64\npackages \n","mirror":"#,
                r#""http://deb.debian.org/debian","rootfs_built":"2026-12-03T16:09:48.482432773Z","#,
                r#""archive":{"reference":"perch:default","manifest":{"digest":"sha256:1808","size":402},"#,
                r#""config":{"digest":"sha256:76ba","size":426},"layer":{"digest":"sha256:9361","#,
                r#""size":204769280},"packed":"2026-12-03T16:09:49.296560788Z"}}"#
            )
        );
        let unpacked = r#"{"key":"k","recipe":{"flavour":"default","suite":"trixie","arch":"arm64","variant":"minbase","packages":["git"]},"canonical":"c"}"#;
        let record: BuildRecord = serde_json::from_str(unpacked).unwrap();
        assert_eq!((record.mirror, record.archive), (None, None));

        let default = r#"{
  "arch": "amd64",
  "key": "a7fc",
  "recipe": "minimal",
  "recorded": "2026-12-03T16:18:18.906488587+00:00",
  "reference": "perch:default",
  "suite": "bookworm"
}"#;
        let record: DefaultImage = serde_json::from_str(default).unwrap();
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"reference":"perch:default","key":"a7fc","recipe":"minimal","suite":"bookworm","arch":"amd64","recorded":"2026-12-03T16:18:18.906488587Z"}"#
        );
        assert!(serde_json::from_str::<DefaultImage>(r#"{"key":"a7fc"}"#).is_err());
    }

    #[test]
    fn keys_are_stable_and_differ_by_recipe() {
        let default = Recipe::new(Flavour::Default, "bookworm", "x86_64").unwrap();
        let minimal = Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap();
        let trixie = Recipe::new(Flavour::Minimal, "trixie", "x86_64").unwrap();
        let arm = Recipe::new(Flavour::Minimal, "bookworm", "aarch64").unwrap();
        assert_eq!(
            default.key(),
            Recipe::new(Flavour::Default, "bookworm", "x86_64")
                .unwrap()
                .key()
        );
        let keys = [default.key(), minimal.key(), trixie.key(), arm.key()];
        for (i, a) in keys.iter().enumerate() {
            assert!(is_key(a));
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            minimal.canonical(),
            "perch image recipe 1\nvariant minbase\nsuite bookworm\narch amd64\npackages \n"
        );
        assert_eq!(
            minimal.key(),
            hex(&Sha256::digest(minimal.canonical().as_bytes()))
        );
    }

    #[test]
    fn recipes_refuse_odd_suites_and_arches() {
        assert!(matches!(
            Recipe::new(Flavour::Minimal, "--foreign", "x86_64"),
            Err(RecipeError::BadSuite(_))
        ));
        assert!(matches!(
            Recipe::new(Flavour::Minimal, "Bookworm", "x86_64"),
            Err(RecipeError::BadSuite(_))
        ));
        assert!(matches!(
            Recipe::new(Flavour::Minimal, "bookworm", "riscv64"),
            Err(RecipeError::UnsupportedArch(_))
        ));
    }

    #[test]
    fn debootstrap_options_name_the_variant_and_packages() {
        let default = Recipe::new(Flavour::Default, "bookworm", "aarch64").unwrap();
        assert_eq!(
            default.debootstrap_options(),
            [
                "--variant=minbase",
                "--arch=arm64",
                "--include=build-essential,ca-certificates,curl,fd-find,git,jq,python3,ripgrep"
            ]
        );
        let minimal = Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap();
        assert_eq!(
            minimal.debootstrap_options(),
            ["--variant=minbase", "--arch=amd64"]
        );
    }

    #[test]
    fn oci_documents_chain_by_digest() {
        let recipe = Recipe::new(Flavour::Minimal, "bookworm", "x86_64").unwrap();
        let layer = Blob::of(b"layer bytes");
        let image = OciImage::new(&recipe, &layer, DEFAULT_REFERENCE);
        let index: serde_json::Value = serde_json::from_slice(&image.index).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(entry["digest"], image.manifest_blob().digest);
        assert_eq!(entry["annotations"][REF_NAME_ANNOTATION], "perch:default");
        assert_eq!(entry["platform"]["architecture"], "amd64");
        let manifest: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
        assert_eq!(manifest["config"]["digest"], image.config_blob().digest);
        assert_eq!(manifest["layers"][0]["digest"], layer.digest);
        let config: serde_json::Value = serde_json::from_slice(&image.config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer.digest);
        assert_eq!(config["config"]["Labels"][KEY_LABEL], recipe.key());
        assert_eq!(
            layer.path(),
            format!(
                "blobs/sha256/{}",
                layer.digest.trim_start_matches("sha256:")
            )
        );
    }
}
