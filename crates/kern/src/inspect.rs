//! `kern inspect FILE`: the kernels of any GPU binary, their demangled signatures and parameter
//! layouts — or the metadata and tensors of a checkpoint (GGUF, safetensors) — as a readable
//! listing or as JSON.

use anyhow::Result;
use kern_binary::{Arch, Binary, Image, ImageKind, Kernel};
use kern_weights::gguf::{Array, Value};
use kern_weights::Checkpoint;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// List the kernels of a GPU binary (cubin, PTX, fatbin, .so), or the metadata and tensors of a
/// checkpoint (.gguf, .safetensors, a sharded index or a model directory).
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern inspect vecadd.cubin\n  kern inspect libops.so --arch sm_90 --json\n  kern inspect model.gguf\n  kern inspect ~/models/Qwen3-4B --json\n  kern inspect model.gguf --timing")]
pub struct Args {
    /// A GPU binary (.cubin, .ptx, .fatbin, or a host ELF with embedded device code) or a
    /// checkpoint (.gguf, .safetensors, model.safetensors.index.json, or a directory of one).
    file: PathBuf,
    /// Print one JSON object instead of a listing.
    #[arg(long)]
    json: bool,
    /// Mark the image kern would load on this architecture (exact SASS, else newest PTX).
    #[arg(long, default_value = "sm_90", value_parser = parse_arch)]
    arch: Arch,
    /// Checkpoints: also convert every tensor to bf16 as loading does (GGUF blocks are
    /// dequantized on all cores) and print the throughput.
    #[arg(long)]
    timing: bool,
}

/// Whether `path` is a checkpoint rather than a GPU binary: a directory, a `.gguf`,
/// `.safetensors` or `.index.json` file, or a file starting with the GGUF magic.
pub fn is_checkpoint(path: &Path) -> bool {
    if path.is_dir() {
        return true;
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".gguf") || name.ends_with(".safetensors") || name.ends_with(".index.json") {
        return true;
    }
    use std::io::Read;
    let mut head = [0u8; 9];
    let ok = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok();
    // GGUF magic, or a safetensors header: a little-endian length then `{`.
    ok && (kern_weights::gguf::is_gguf(&head) || (head[8] == b'{' && u64::from_le_bytes(head[..8].try_into().expect("8")) < 100 << 20))
}

pub fn parse_arch(s: &str) -> std::result::Result<Arch, String> {
    s.parse()
}

pub fn run(args: Args) -> Result<ExitCode> {
    if is_checkpoint(&args.file) {
        return checkpoint(&args);
    }
    let bin = kern_binary::read_file(&args.file)?;
    let selected = bin.selected(args.arch);
    if args.json {
        let mut v = serde_json::to_value(&bin)?;
        v["arch"] = serde_json::Value::String(args.arch.to_string());
        v["selected"] = selected.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", listing(&bin, args.arch, selected));
    }
    Ok(ExitCode::SUCCESS)
}

fn listing(bin: &Binary, arch: Arch, selected: Vec<usize>) -> String {
    let mut s = String::new();
    let kind = match bin.kind {
        kern_binary::FileKind::Cubin => "cubin",
        kern_binary::FileKind::Ptx => "PTX",
        kern_binary::FileKind::Fatbin => "fatbin",
        kern_binary::FileKind::HostElf => "host ELF",
    };
    let containers = bin.images.iter().map(|im| im.container + 1).max().unwrap_or(0);
    let _ = writeln!(s, "{}: {kind}, {} image(s) in {containers} module(s)", bin.file, bin.images.len());
    if bin.images.len() > 1 || bin.kind != kern_binary::FileKind::Cubin {
        let _ = writeln!(s, "\n  #   module  kind   arch      stored        bytes  kernels");
        for (i, im) in bin.images.iter().enumerate() {
            let mark = if selected.contains(&i) { format!("  <- loaded on {arch}") } else { String::new() };
            let _ = writeln!(
                s,
                "  {i:<3} {:<7} {:<6} {:<9} {:<9} {:>9}  {:>7}{mark}",
                im.container,
                kind_name(im.kind),
                im.arch.map_or("?".into(), |a| a.to_string()),
                format!("{:?}", im.compression).to_lowercase(),
                im.size,
                im.kernels.len()
            );
        }
        if selected.is_empty() {
            let _ = writeln!(s, "  no image can be loaded on {arch}: no {arch} cubin and no PTX for an older or equal target");
        }
    }
    for (i, im) in bin.images.iter().enumerate() {
        let _ = writeln!(s, "\nimage {i}: {} {}{}", kind_name(im.kind), im.arch.map_or("?".into(), |a| a.to_string()), image_extra(im));
        for k in &im.kernels {
            kernel_block(&mut s, k);
        }
    }
    s
}

fn kind_name(k: ImageKind) -> &'static str {
    match k {
        ImageKind::Cubin => "cubin",
        ImageKind::Ptx => "ptx",
    }
}

fn image_extra(im: &Image) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &im.toolkit {
        parts.push(format!("toolkit {t}"));
    }
    if let Some(v) = &im.ptx_version {
        parts.push(format!("PTX ISA {v}"));
    }
    if let Some(n) = &im.name {
        parts.push(format!("object {n}"));
    }
    parts.push(format!("{} kernel(s)", im.kernels.len()));
    format!(" ({})", parts.join(", "))
}

fn kernel_block(s: &mut String, k: &Kernel) {
    let _ = writeln!(s, "  {}", k.name);
    if let Some(d) = &k.demangled {
        let _ = writeln!(s, "    signature   {d}");
    } else if let Some(c) = &k.cute {
        let _ = writeln!(s, "    CuTe DSL    {c}");
        for n in &c.notes {
            let _ = writeln!(s, "                note: {n}");
        }
    }
    let mut facts = Vec::new();
    if let Some(r) = k.registers {
        facts.push(format!("registers {r}"));
    }
    if let Some(sh) = k.shared_bytes {
        facts.push(format!("static shared {sh} B"));
    }
    if let Some(f) = k.frame_bytes.filter(|&f| f > 0) {
        facts.push(format!("stack {f} B"));
    }
    if let Some([x, y, z]) = k.max_threads {
        facts.push(format!("max threads {x}x{y}x{z}"));
    }
    if let Some([x, y, z]) = k.required_block {
        facts.push(format!("required block {x}x{y}x{z}"));
    }
    if let Some(m) = k.max_registers {
        facts.push(format!("max registers {m}"));
    }
    if !facts.is_empty() {
        let _ = writeln!(s, "    {}", facts.join(", "));
    }
    let _ = writeln!(s, "    params      {} in {} bytes", k.params.len(), k.param_bytes);
    for p in &k.params {
        let cpp = k.cpp_params.as_ref().and_then(|c| c.get(p.ordinal as usize));
        let ty = cpp.cloned().or_else(|| p.ptx_type.as_ref().map(|t| format!(".{t}{}", if p.pointer { " .ptr" } else { "" })));
        let _ = writeln!(
            s,
            "      #{:<3} offset {:>5}  size {:>5}{}{}",
            p.ordinal,
            p.offset,
            p.size,
            p.align.map_or(String::new(), |a| format!("  align {a:>3}")),
            ty.map_or(String::new(), |t| format!("  {t}"))
        );
    }
}

/// How many elements of a metadata array a listing shows.
const HEAD: usize = 6;
/// Longest string value a listing shows whole.
const LONG: usize = 72;

fn checkpoint(args: &Args) -> Result<ExitCode> {
    let ckpt = Checkpoint::open(&args.file)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checkpoint_json(&ckpt))?);
    } else {
        print!("{}", checkpoint_listing(&ckpt));
    }
    if args.timing {
        timing(&ckpt)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Tensor names in file order for GGUF, sorted for safetensors.
fn tensor_names(ckpt: &Checkpoint) -> Vec<&str> {
    match ckpt.gguf() {
        Some(g) => g.tensors.iter().map(|t| t.name.as_str()).collect(),
        None => ckpt.names(),
    }
}

fn dims(d: &[usize]) -> String {
    format!("[{}]", d.iter().map(usize::to_string).collect::<Vec<_>>().join(", "))
}

pub(crate) fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < U.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[u])
    }
}

fn short_str(s: &str) -> String {
    let n = s.chars().count();
    if n <= LONG {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(LONG).collect();
        format!("{head:?}… ({n} chars)")
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => short_str(s),
        Value::Array(a) => array_text(a),
        Value::F32(x) => format!("{x:e}"),
        Value::F64(x) => format!("{x:e}"),
        other => other.to_json().to_string(),
    }
}

fn array_text(a: &Array) -> String {
    let head: Vec<String> = match a {
        Array::String(v) => v.iter().take(HEAD).map(|s| short_str(s)).collect(),
        Array::Array(v) => v.iter().take(HEAD).map(array_text).collect(),
        other => other.to_json(HEAD).as_array().map(|v| v.iter().map(|x| x.to_string()).collect()).unwrap_or_default(),
    };
    let more = if a.len() > HEAD { ", …" } else { "" };
    format!("[{} × {}] [{}{more}]", a.elem_type().name(), a.len(), head.join(", "))
}

fn checkpoint_listing(ckpt: &Checkpoint) -> String {
    let mut s = String::new();
    let names = tensor_names(ckpt);
    let total: u64 = names.iter().filter_map(|n| ckpt.tensor(n).ok()).map(|t| t.data.len() as u64).sum();
    match ckpt.gguf() {
        Some(g) => {
            let _ = writeln!(
                s,
                "{}: GGUF v{}, {} tensor(s), {} of tensor data, {} metadata key(s), data from byte {} (alignment {})",
                ckpt.path().display(),
                g.version,
                g.tensors.len(),
                human(total),
                g.metadata.len(),
                g.data_start,
                g.alignment
            );
            let _ = writeln!(s, "\nmetadata");
            let w = g.metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
            for (k, v) in &g.metadata {
                let _ = writeln!(s, "  {k:<w$}  {}", value_text(v));
            }
        }
        None => {
            let files: Vec<&Path> = ckpt.files().collect();
            let _ = writeln!(s, "{}: safetensors, {} tensor(s), {} in {} file(s)", ckpt.path().display(), names.len(), human(total), files.len());
            if !ckpt.metadata().is_empty() {
                let _ = writeln!(s, "\nmetadata");
                let w = ckpt.metadata().keys().map(String::len).max().unwrap_or(0);
                for (k, v) in ckpt.metadata() {
                    let _ = writeln!(s, "  {k:<w$}  {}", short_str(v));
                }
            }
        }
    }
    let w = names.iter().map(|n| n.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(s, "\n  {:<w$}  {:<6}  {:<20}  {:>12}", "tensor", "type", "shape", "bytes");
    let mut by_type: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for n in &names {
        let Ok(t) = ckpt.tensor(n) else { continue };
        let _ = writeln!(s, "  {n:<w$}  {:<6}  {:<20}  {:>12}", t.file_dtype, dims(t.shape), t.data.len());
        let e = by_type.entry(t.file_dtype).or_default();
        e.0 += 1;
        e.1 += t.data.len() as u64;
    }
    let parts: Vec<String> = by_type.iter().map(|(t, (n, b))| format!("{t} ×{n} ({})", human(*b))).collect();
    let _ = writeln!(s, "\n  by type: {}", parts.join(", "));
    s
}

fn metadata_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Array(a) if a.len() > 16 => serde_json::json!({
            "array": a.elem_type().name(),
            "len": a.len(),
            "head": a.to_json(16),
        }),
        other => other.to_json(),
    }
}

fn checkpoint_json(ckpt: &Checkpoint) -> serde_json::Value {
    let tensors: Vec<serde_json::Value> = tensor_names(ckpt)
        .iter()
        .filter_map(|n| ckpt.tensor(n).ok())
        .map(|t| {
            let mut o = serde_json::json!({"name": t.name, "type": t.file_dtype, "shape": t.shape, "bytes": t.data.len()});
            if let Some(info) = ckpt.gguf().and_then(|g| g.tensor(t.name)) {
                o["dims"] = serde_json::json!(info.dims);
                o["offset"] = serde_json::json!(info.offset);
            } else {
                o["file"] = serde_json::json!(t.file.display().to_string());
            }
            o
        })
        .collect();
    let mut v = serde_json::json!({"file": ckpt.path().display().to_string(), "format": ckpt.format(), "tensors": tensors});
    match ckpt.gguf() {
        Some(g) => {
            v["version"] = g.version.into();
            v["alignment"] = g.alignment.into();
            v["data_start"] = g.data_start.into();
            let mut m = serde_json::Map::new();
            for (k, val) in &g.metadata {
                m.insert(k.clone(), metadata_json(val));
            }
            v["metadata"] = serde_json::Value::Object(m);
        }
        None => {
            v["metadata"] = serde_json::json!(ckpt.metadata());
            v["files"] = ckpt.files().map(|f| f.display().to_string()).collect();
        }
    }
    v
}

/// Streams every float tensor into bf16 through the loader (`LoadPlan::stream`, as `kern
/// generate` loads weights, GGUF blocks dequantized on all cores) into a sink that keeps
/// nothing, and reports the throughput.
fn timing(ckpt: &Checkpoint) -> Result<()> {
    use kern_manifest::{Buffer, DType, Expr, Role, WeightSource};
    let names = tensor_names(ckpt);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Page the file in first, so that the number measures conversion, not the disk.
    let t0 = Instant::now();
    let mut sum = 0u64;
    let mut file_bytes = 0u64;
    let mut buffers = vec![];
    for n in &names {
        let t = ckpt.tensor(n)?;
        sum = t.data.iter().step_by(4096).fold(sum, |a, &b| a.wrapping_add(u64::from(b)));
        let float = t.ggml.is_some_and(|g| g.dequantizable()) || t.dtype.is_some_and(|d| kern_weights::convert::convertible(d, DType::Bf16));
        if !float {
            continue;
        }
        file_bytes += t.data.len() as u64;
        let elems: u64 = t.shape.iter().map(|&d| d as u64).product();
        buffers.push(Buffer {
            name: n.to_string(),
            dtype: DType::Bf16,
            shape: t.shape.iter().map(|&d| Expr::constant(d as i64)).collect(),
            role: Role::Weight,
            source: Some(WeightSource::Tensor(n.to_string())),
            bytes_at_max: elems * 2,
        });
    }
    let page_in = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let plan = kern_weights::LoadPlan::new(ckpt, &buffers)?;
    let mut out_bytes = 0u64;
    plan.stream(
        |c| -> Result<(), kern_weights::WeightsError> {
            out_bytes += c.bytes.len() as u64;
            sum = sum.wrapping_add(u64::from(c.bytes.last().copied().unwrap_or(0)));
            Ok(())
        },
        |_| {},
    )?;
    let secs = t1.elapsed().as_secs_f64();
    eprintln!(
        "timing: paged in {} in {page_in:.2} s (checksum {sum:x}); loaded {} tensor(s) as bf16 on {threads} thread(s): {} of file data → {} in {secs:.3} s = {:.0} MB/s read, {:.0} MB/s written",
        human(file_bytes),
        buffers.len(),
        human(file_bytes),
        human(out_bytes),
        file_bytes as f64 / secs / 1e6,
        out_bytes as f64 / secs / 1e6
    );
    Ok(())
}
