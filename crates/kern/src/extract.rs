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
    /// Take the module that defines this kernel (mangled name), when the file holds several
    /// modules (one per .cu file it was built from).
    #[arg(long)]
    kernel: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let bin = kern_binary::read_file(&args.file)?;
    let with_kernels: Vec<usize> = bin.selected(args.arch).into_iter().filter(|&i| !bin.images[i].kernels.is_empty()).collect();
    let choice = match &args.kernel {
        Some(name) => match bin.find_kernel(args.arch, name) {
            Some((i, im, _)) => Some((i, im)),
            None => bail!("{}: no image loadable on {} defines kernel `{name}` (see `kern inspect {}`)", bin.file, args.arch, args.file.display()),
        },
        None if with_kernels.len() > 1 => {
            let list: Vec<String> = with_kernels
                .iter()
                .map(|&i| format!("module {}: {}", bin.images[i].container, bin.images[i].kernels.iter().map(|k| k.name.as_str()).take(3).collect::<Vec<_>>().join(", ")))
                .collect();
            bail!(
                "{}: {} modules have kernels for {}; choose one with --kernel NAME:\n  {}",
                bin.file,
                with_kernels.len(),
                args.arch,
                list.join("\n  ")
            );
        }
        None => bin.select(args.arch),
    };
    let Some((i, im)) = choice else {
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
