//! `kern extract FILE --arch sm_90`: write the image kern would load as a standalone cubin or
//! PTX file — how kernels are taken out of a PyTorch extension or a kernels-hub `.so`.

use anyhow::{bail, Context, Result};
use kern_binary::{Arch, ImageKind};
use std::path::PathBuf;
use std::process::ExitCode;

/// Write the image kern would load for an architecture as a standalone .cubin or .ptx.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  kern extract _activation.abi3.so --arch sm_90 -o activation.cubin")]
pub struct Args {
    /// A fatbin or host binary (.so / executable) with embedded device code (a cubin or PTX
    /// file is accepted too and copied).
    file: PathBuf,
    /// The architecture to choose for: its exact SASS, else the newest compatible PTX.
    #[arg(long, value_parser = crate::inspect::parse_arch)]
    arch: Arch,
    /// Output path (default: <file stem>.<arch>.cubin or .ptx in the current directory).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let bin = kern_binary::read_file(&args.file)?;
    let Some((i, im)) = bin.select(args.arch) else {
        let have: Vec<String> = bin
            .images
            .iter()
            .map(|im| format!("{} {}", if im.kind == ImageKind::Cubin { "cubin" } else { "ptx" }, im.arch.map_or("?".into(), |a| a.to_string())))
            .collect();
        bail!("{}: no image loads on {}: it holds [{}]", bin.file, args.arch, have.join(", "));
    };
    let ext = if im.kind == ImageKind::Cubin { "cubin" } else { "ptx" };
    let out = args.output.unwrap_or_else(|| {
        let stem = args.file.file_stem().map_or("kernels".into(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("{stem}.{}.{ext}", im.arch.unwrap_or(args.arch)))
    });
    std::fs::write(&out, &im.data).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "wrote {} ({ext}, {}, {} bytes, {} kernel(s)) from image {i} of {}",
        out.display(),
        im.arch.map_or("?".into(), |a| a.to_string()),
        im.data.len(),
        im.kernels.len(),
        bin.file
    );
    Ok(ExitCode::SUCCESS)
}
