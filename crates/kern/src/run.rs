//! `kern run model.json`: load a manifest onto the GPU, run a program once (or `--iters`
//! times), and write buffers as `.npy`.

use anyhow::{anyhow, bail, Context as _, Result};
use kern_manifest::manifest::BufferId;
use kern_manifest::Manifest;
use kern_runtime::data::{self, Generated, Values};
use kern_runtime::{npy, plan, Mode, Runtime};
use std::path::PathBuf;
use std::process::ExitCode;

/// Run a manifest's program on the GPU and write buffers as .npy files.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern run examples/vecadd/model.json --input A=range --input B=range --output C\n  kern run model.json --set tokens=4 --input x=x.npy --output y=y.npy --graph")]
pub struct Args {
    /// The manifest.
    manifest: PathBuf,
    /// A var's value for this run, VAR=N (default: the var's max). Repeatable.
    #[arg(long = "set", value_name = "VAR=N")]
    sets: Vec<String>,
    /// Fill a buffer before the run: BUF=file.npy, BUF=random[:SEED] or BUF=range. Repeatable.
    /// Buffers not given are zero.
    #[arg(long = "input", value_name = "BUF=SOURCE")]
    inputs: Vec<String>,
    /// Write a buffer after the run: BUF (to BUF.npy in --out-dir) or BUF=file.npy. Repeatable.
    /// Without any, every `output` buffer is written.
    #[arg(long = "output", value_name = "BUF[=FILE]")]
    outputs: Vec<String>,
    /// Directory for outputs named without a file.
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// Write bf16/f16/fp8 buffers as their raw bit patterns (uint16/uint8) instead of float32.
    #[arg(long)]
    raw: bool,
    /// Which program to run (default: `main`, the manifest's `program`).
    #[arg(long, default_value = "main")]
    program: String,
    /// Capture the program into a CUDA graph (one per var bucket) and replay it.
    #[arg(long, conflicts_with = "sync_each")]
    graph: bool,
    /// Synchronize after every launch, so a failing kernel is reported with its call label.
    #[arg(long)]
    sync_each: bool,
    /// Run the program this many times and report the median GPU time.
    #[arg(long, default_value_t = 1)]
    iters: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let ctx = kern_cuda::Context::new(args.device)?;
    let props = ctx.props();
    let arch = kern_binary::Arch::new(props.cc_major * 10 + props.cc_minor);
    let m = crate::check::load(&args.manifest, arch)?;
    let vars = parse_vars(&m, &args.sets)?;
    let program = m.programs.iter().position(|p| p.name == args.program).ok_or_else(|| {
        anyhow!("{}: no program `{}` (it has: {})", args.manifest.display(), args.program, m.programs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "))
    })?;
    let (free, _) = ctx.mem_info()?;
    let p = plan::plan(&m, &plan::PlanOptions { budget: Some(free as u64), reserve: plan::PlanOptions::default().reserve.min(free as u64 / 4) })?;
    let mut rt = Runtime::new(&ctx, m, p)?;
    for spec in &args.inputs {
        fill_input(&rt, spec, &vars)?;
    }
    let mode = if args.graph { Mode::Graph } else { Mode::Eager { sync_each: args.sync_each } };
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..args.iters.max(1) {
        let s = rt.run(program, &vars, mode)?;
        times.push(s.gpu_ms);
        last = Some(s);
    }
    let last = last.expect("at least one iteration");
    times.sort_by(f32::total_cmp);
    eprintln!(
        "ran `{}` on {} ({}): {} launches, {} mode{}, GPU time {:.3} ms{}",
        rt.manifest.programs[program].name,
        props.name,
        arch,
        last.launches,
        if args.graph { "graph" } else { "eager" },
        if args.graph { format!(" (bucket {:?})", last.vars_used) } else { String::new() },
        times[times.len() / 2],
        if times.len() > 1 { format!(" (median of {})", times.len()) } else { String::new() }
    );
    let outputs: Vec<String> = if args.outputs.is_empty() {
        rt.manifest.buffers.iter().filter(|b| b.role == kern_manifest::raw::Role::Output).map(|b| b.name.clone()).collect()
    } else {
        args.outputs.clone()
    };
    for spec in &outputs {
        write_output(&rt, spec, &vars, &args.out_dir, args.raw)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Var values from `--set VAR=N`, each var defaulting to its max.
pub fn parse_vars(m: &Manifest, sets: &[String]) -> Result<Vec<i64>> {
    let mut vars = m.vars_at_max();
    for s in sets {
        let (name, val) = s.split_once('=').ok_or_else(|| anyhow!("--set {s}: write it as VAR=N"))?;
        let id = m.var(name.trim()).ok_or_else(|| {
            anyhow!("--set {s}: the manifest has no var `{name}` (it has: {})", m.vars.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", "))
        })?;
        let v: i64 = val.trim().parse().map_err(|_| anyhow!("--set {s}: `{val}` is not an integer"))?;
        let max = m.vars[id.0].max;
        if v < 1 || v > max {
            bail!("--set {s}: var `{name}` must be in 1..={max} (its declared max)");
        }
        vars[id.0] = v;
    }
    Ok(vars)
}

fn buffer(rt: &Runtime, name: &str, flag: &str) -> Result<BufferId> {
    rt.manifest.buffer(name).ok_or_else(|| anyhow!("{flag} {name}: the manifest has no buffer `{name}`"))
}

fn elements(rt: &Runtime, b: BufferId, vars: &[i64]) -> Result<(Vec<u64>, usize)> {
    let shape = rt.manifest.shape(b, vars).map_err(|e| anyhow!("buffers.{}: {e}", rt.manifest.buffers[b.0].name))?;
    let shape: Vec<u64> = shape.iter().map(|&d| d.max(0) as u64).collect();
    let n = shape.iter().product::<u64>() as usize;
    Ok((shape, n))
}

fn fill_input(rt: &Runtime, spec: &str, vars: &[i64]) -> Result<()> {
    let (name, source) = spec.split_once('=').ok_or_else(|| anyhow!("--input {spec}: write it as BUF=file.npy, BUF=random[:SEED] or BUF=range"))?;
    let b = buffer(rt, name, "--input")?;
    let buf = &rt.manifest.buffers[b.0];
    let (shape, n) = elements(rt, b, vars)?;
    let values = if source == "range" {
        data::generate(Generated::Range, n, buf.dtype)
    } else if let Some(rest) = source.strip_prefix("random") {
        let seed = match rest.strip_prefix(':') {
            Some(s) => s.parse().map_err(|_| anyhow!("--input {spec}: the seed `{s}` is not an integer"))?,
            None if rest.is_empty() => 0,
            None => bail!("--input {spec}: write random or random:SEED"),
        };
        data::generate(Generated::Random { seed }, n, buf.dtype)
    } else {
        let a = npy::read(std::path::Path::new(source))?;
        if a.values.len() != n {
            bail!(
                "--input {spec}: buffer `{name}` has shape {shape:?} = {n} elements at these var values, but {source} holds {} elements (shape {:?})",
                a.values.len(),
                a.shape
            );
        }
        a.values
    };
    let bytes = data::encode(&values, buf.dtype).map_err(|e| anyhow!("--input {spec}: buffer `{name}` is {}: {e}", buf.dtype.name()))?;
    rt.write_buffer(b, &bytes)?;
    Ok(())
}

fn write_output(rt: &Runtime, spec: &str, vars: &[i64], dir: &std::path::Path, raw: bool) -> Result<()> {
    let (name, file) = match spec.split_once('=') {
        Some((n, f)) => (n, PathBuf::from(f)),
        None => (spec, dir.join(format!("{spec}.npy"))),
    };
    let b = buffer(rt, name, "--output")?;
    let buf = &rt.manifest.buffers[b.0];
    let (shape, n) = elements(rt, b, vars)?;
    let bytes = rt.read_buffer(b, n * buf.dtype.size() as usize)?;
    npy::write(&file, &bytes, buf.dtype, &shape, raw).with_context(|| format!("--output {spec}"))?;
    eprintln!("wrote {} ({} {:?}): {}", file.display(), buf.dtype.name(), shape, preview(&data::decode(&bytes, buf.dtype)));
    Ok(())
}

fn preview(v: &Values) -> String {
    const N: usize = 8;
    let items: Vec<String> = match v {
        Values::F64(x) => x.iter().take(N).map(|v| format!("{v}")).collect(),
        Values::I64(x) => x.iter().take(N).map(|v| v.to_string()).collect(),
        Values::U64(x) => x.iter().take(N).map(|v| v.to_string()).collect(),
        Values::Bool(x) => x.iter().take(N).map(|v| v.to_string()).collect(),
    };
    format!("[{}{}]", items.join(", "), if v.len() > N { ", …" } else { "" })
}
