//! `kern check model.json`: is this model description complete and consistent with its
//! kernels? Prints every problem with its JSON path, or a summary.

use anyhow::Result;
use kern_binary::Arch;
use kern_manifest::{CheckOptions, Manifest};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Check a manifest: references, module hashes, kernel signatures and layouts, expressions.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  kern check examples/vecadd/model.json")]
pub struct Args {
    /// The manifest.
    manifest: PathBuf,
    /// Architecture whose images are selected and checked.
    #[arg(long, default_value = "sm_90", value_parser = crate::inspect::parse_arch)]
    arch: Arch,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match kern_manifest::load(&args.manifest, &CheckOptions { arch: args.arch, ..Default::default() }) {
        Ok(m) => {
            print!("{}", m.report());
            Ok(ExitCode::SUCCESS)
        }
        Err(d) => {
            eprint!("{d}");
            eprintln!("{} error(s)", d.error_count());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Loads and checks a manifest for the other subcommands: diagnostics become one error.
pub fn load(path: &Path, arch: Arch) -> Result<Manifest> {
    kern_manifest::load(path, &CheckOptions { arch, ..Default::default() }).map_err(|d| anyhow::anyhow!("{d}{} error(s); `kern check {}` lists them", d.error_count(), path.display()))
}
