//! `kern extract FILE --arch sm_90`: write the image kern would load as a standalone cubin or
//! PTX file — how kernels are taken out of a PyTorch extension or a kernels-hub `.so`.
//! `kern extract CHECKPOINT --tensor NAME -o x.npy`: one tensor of a GGUF or safetensors
//! checkpoint as `.npy`, dequantized to float32 (or its bf16 bit patterns with `--raw`).

use anyhow::{bail, Context, Result};
use kern_binary::{Arch, ImageKind};
use std::path::PathBuf;
use std::process::ExitCode;

/// Write the image kern would load for an architecture as a standalone .cubin or .ptx, or one
/// tensor of a checkpoint as .npy.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern extract _activation.abi3.so --arch sm_90 -o activation.cubin\n  kern extract model.gguf --tensor blk.0.attn_q.weight -o q.npy\n  kern extract model.gguf --tensor token_embd.weight --raw -o embd_bf16.npy")]
pub struct Args {
    /// A fatbin or host binary (.so / executable) with embedded device code (a cubin or PTX
    /// file is accepted too and copied); or a checkpoint (.gguf, .safetensors, an index or a
    /// model directory) with --tensor.
    file: PathBuf,
    /// GPU binaries: the architecture to choose for: its exact SASS, else the newest
    /// compatible PTX.
    #[arg(long, value_parser = crate::inspect::parse_arch)]
    arch: Option<Arch>,
    /// Checkpoints: the tensor to write (see `kern inspect FILE` for the names).
    #[arg(long)]
    tensor: Option<String>,
    /// Checkpoints: write bf16 bit patterns (uint16, what kern loads) instead of float32.
    #[arg(long)]
    raw: bool,
    /// Output path (default: <file stem>.<arch>.cubin or .ptx in the current directory).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Take the module that defines this kernel (mangled name), when the file holds several
    /// modules (one per .cu file it was built from).
    #[arg(long)]
    kernel: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.tensor.is_some() || crate::inspect::is_checkpoint(&args.file) {
        return tensor(&args);
    }
    let Some(arch) = args.arch else {
        bail!("{}: give --arch sm_XX: the architecture whose image to extract", args.file.display());
    };
    let args = Resolved { file: args.file, arch, output: args.output, kernel: args.kernel };
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

/// The GPU-binary form of the arguments, with the architecture given.
struct Resolved {
    file: PathBuf,
    arch: Arch,
    output: Option<PathBuf>,
    kernel: Option<String>,
}

fn tensor(args: &Args) -> Result<ExitCode> {
    use kern_manifest::DType;
    let Some(name) = &args.tensor else {
        bail!("{} is a checkpoint: give --tensor NAME (`kern inspect {}` lists them)", args.file.display(), args.file.display());
    };
    let ckpt = kern_weights::Checkpoint::open(&args.file)?;
    let view = ckpt.tensor(name)?;
    let float = view.ggml.is_some_and(|g| g.dequantizable()) || matches!(view.dtype, Some(DType::Bf16 | DType::F16 | DType::F32 | DType::F64));
    let (dtype, raw) = match (float, args.raw) {
        (true, false) => (DType::F32, false),
        (true, true) => (DType::Bf16, true),
        (false, _) => match view.dtype {
            Some(d) => (d, args.raw),
            None => bail!("tensor `{name}` is {}: {}", view.file_dtype, kern_weights::dequant::unsupported(view.ggml.expect("GGUF types have a dtype or a ggml type"))),
        },
    };
    let shape = view.dims();
    let file_dtype = view.file_dtype;
    let bytes = ckpt.read_as(name, dtype)?;
    let out = args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{}.npy", name.replace('/', "_"))));
    kern_runtime::npy::write(&out, &bytes, dtype, &shape, raw).with_context(|| format!("cannot write {}", out.display()))?;
    let what = match (float, raw) {
        (true, false) => "float32".to_string(),
        (true, true) => "bf16 bits (uint16)".to_string(),
        _ => dtype.name().to_string(),
    };
    eprintln!(
        "wrote {} ({what}, shape {shape:?}) from tensor `{name}` ({file_dtype}) of {}",
        out.display(),
        args.file.display()
    );
    Ok(ExitCode::SUCCESS)
}
