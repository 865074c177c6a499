//! `perch image`: perch's own image, perch:default, built and loaded ([`crate::sandbox::image`]
//! does the work).

use super::{emit, runtime};
use crate::host::Places;
use crate::host::trust::refusal_as_root;
use crate::sandbox::image;
use clap::Subcommand;
use perch_core::image::Flavour;
use std::process::ExitCode;

/// Build and load perch's own image, perch:default
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build perch:default offline from this host's Debian mirror and load it
    ///
    /// Debootstrap (minbase) makes the root filesystem, which is packed as an OCI
    /// archive under $PERCH_CACHE/images/. A build for the same recipe is reused. Needs root
    /// and debootstrap.
    Build {
        /// Minbase alone, without git, ripgrep, fd-find, jq, curl, ca-certificates,
        /// build-essential and python3 (for tests and small machines)
        #[arg(long)]
        minimal: bool,
        /// The Debian archive to build from [default: the first Debian mirror in apt's sources
        /// that is not a security mirror]
        #[arg(long, value_name = "URL")]
        mirror: Option<String>,
        /// The release to build [default: VERSION_CODENAME in /etc/os-release]
        #[arg(long, value_name = "NAME")]
        suite: Option<String>,
        /// Build the root filesystem and the archive again even if they exist
        #[arg(long)]
        rebuild: bool,
        /// Build and record it, but load it into no microsandbox home (deploy/install.sh builds
        /// as root, then each agent's user loads it with `perch image load`)
        #[arg(long)]
        no_load: bool,
    },
    /// Load the built perch:default into this user's microsandbox home
    ///
    /// The home is $MSB_HOME. `perch image build` as root leaves this to the user that owns the home.
    Load,
}

pub fn run(args: ImageArgs) -> Result<ExitCode, String> {
    match args.command {
        ImageCommand::Build {
            minimal,
            mirror,
            suite,
            rebuild,
            no_load,
        } => build(
            no_load,
            image::BuildOptions {
                flavour: if minimal {
                    Flavour::Minimal
                } else {
                    Flavour::Default
                },
                mirror,
                suite,
                rebuild,
            },
        ),
        ImageCommand::Load => load(),
    }
}

fn build(no_load: bool, options: image::BuildOptions) -> Result<ExitCode, String> {
    let started = std::time::Instant::now();
    let places = Places::from_environment();
    let cache = places.cache.clone();
    let mut progress = |line: &str| {
        let _ = emit(&format!("image: {line}\n"));
    };
    let prepared = image::prepare(&cache, &image::Host::system(), &options, &mut progress)
        .map_err(|error| error.to_string())?;
    if no_load {
        image::record(&cache, &prepared).map_err(|error| error.to_string())?;
        progress("built, not loaded (--no-load): load it with perch image load");
        return Ok(ExitCode::SUCCESS);
    }
    progress(&format!(
        "loading {} into microsandbox as {} ...",
        prepared.dir.archive().display(),
        perch_core::image::DEFAULT_REFERENCE
    ));
    if let Some(reason) = refusal_as_root(&places.msb_home) {
        image::record(&cache, &prepared).map_err(|error| error.to_string())?;
        progress(&format!(
            "built, not loaded: this is root, and {reason}; load it as the user that owns {}: perch image load",
            places.msb_home.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let loading = std::time::Instant::now();
    let image = runtime()?
        .block_on(image::install(&places, &prepared))
        .map_err(|error| error.to_string())?;
    progress(&format!(
        "loaded in {:.1} s; {} is ready (recorded in {})",
        loading.elapsed().as_secs_f64(),
        image.reference(),
        image::default_record(&cache).display()
    ));
    progress(&format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(ExitCode::SUCCESS)
}

fn load() -> Result<ExitCode, String> {
    let places = Places::from_environment();
    if let Some(reason) = refusal_as_root(&places.msb_home) {
        return Err(format!(
            "not loading the image as root: {reason}\n  fix: run it as the user that owns {}",
            places.msb_home.display()
        ));
    }
    let (image, loaded) = runtime()?
        .block_on(image::load_recorded(&places))
        .map_err(|error| error.to_string())?;
    let already = match loaded {
        image::Loaded::Now => "",
        image::Loaded::Already => "already ",
    };
    emit(&format!(
        "image: {} is {already}loaded into {}\n",
        image.reference(),
        places.msb_home.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}
