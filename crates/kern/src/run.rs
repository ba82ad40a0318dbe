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
    /// Directory for outputs named without a file (created if it does not exist).
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
    /// Load the weights from this checkpoint (a directory or file) before running; each
    /// tensor-parallel rank loads its own slices.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Tensor parallelism: this node's GPUs, one rank each (default: 0..tp/nnodes).
    #[arg(long, value_delimiter = ',')]
    devices: Vec<usize>,
    /// Tensor parallelism over several nodes: how many (one kern process per node).
    #[arg(long, default_value_t = 1)]
    nnodes: u32,
    /// This node's index, 0..nnodes (node 0 makes the NCCL id and writes the outputs).
    #[arg(long, default_value_t = 0)]
    node_rank: u32,
    /// Node 0's address, HOST[:PORT] (default port 29500), reachable from every node.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // A tensor-parallel manifest (issue 17) runs on every local GPU; read `parallel` without
    // a GPU first.
    let text = std::fs::read(&args.manifest).with_context(|| format!("cannot read {}", args.manifest.display()))?;
    if let Ok(raw) = kern_manifest::parse_raw(&text, &args.manifest.display().to_string()) {
        let collectives = raw.ops.values().any(|o| o.implementation.collective.is_some());
        if raw.parallel.is_some() || collectives {
            return run_parallel(args, &text);
        }
    }
    if !args.devices.is_empty() || args.nnodes != 1 {
        bail!("--devices and --nnodes are for tensor-parallel manifests (with a `parallel` section); {} has none", args.manifest.display());
    }
    let ctx = kern_cuda::Context::new(args.device)?;
    let props = ctx.props();
    let arch = kern_binary::Arch::new(props.cc_major * 10 + props.cc_minor);
    let m = crate::check::load(&args.manifest, arch)?;
    let vars = parse_vars(&m, &args.sets)?;
    let program = m.programs.iter().position(|p| p.name == args.program).ok_or_else(|| {
        anyhow!("{}: no program `{}` (it has: {})", args.manifest.display(), args.program, m.programs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "))
    })?;
    let (free, _) = ctx.mem_info()?;
    let p = plan::plan(&m, &plan::PlanOptions { budget: Some(free as u64), reserve: plan::PlanOptions::default().reserve.min(free as u64 / 4), max_pages: None })?;
    let mut rt = Runtime::new(&ctx, m, p)?;
    if let Some(w) = &args.weights {
        let ckpt = kern_weights::Checkpoint::open(w)?;
        let bytes = rt.load_weights(&ckpt, |_, _| {})?;
        eprintln!("loaded {} of weights from {}", human(bytes), w.display());
    }
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

fn human(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / f64::from(1u32 << 30))
}

/// A fingerprint every node of one job shares: the manifest's bytes and the job's shape.
fn job_key(manifest: &[u8], nnodes: u32, local: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in manifest.iter().chain(&nnodes.to_le_bytes()).chain(&(local as u64).to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `kern run` for a tensor-parallel manifest: every local GPU runs one rank (one process per
/// node; node 0 makes the NCCL id and hands it to the others over TCP), the inputs go to every
/// rank, and node 0 writes rank 0's outputs (saying whether its local ranks agree).
fn run_parallel(args: Args, text: &[u8]) -> Result<ExitCode> {
    use kern_runtime::{ParallelRuntime, RankSetup};
    if args.nnodes == 0 || args.node_rank >= args.nnodes {
        bail!("--node-rank {} of --nnodes {}: nodes are 0 to nnodes-1", args.node_rank, args.nnodes);
    }
    let probe = kern_cuda::Context::new(args.devices.first().copied().unwrap_or(0))?;
    let props = probe.props();
    let arch = kern_binary::Arch::new(props.cc_major * 10 + props.cc_minor);
    let first = crate::check::load(&args.manifest, arch)?;
    let tp = first.tp();
    if tp % args.nnodes != 0 {
        bail!("the manifest's tp = {tp} does not divide into --nnodes {}: every node runs tp / nnodes ranks", args.nnodes);
    }
    let local = (tp / args.nnodes) as usize;
    let devices: Vec<usize> = if args.devices.is_empty() { (0..local).collect() } else { args.devices.clone() };
    if devices.len() != local {
        bail!("--devices gives {} GPU(s), and tp = {tp} over {} node(s) needs {local} per node", devices.len(), args.nnodes);
    }
    let vars = parse_vars(&first, &args.sets)?;
    let program = first.programs.iter().position(|p| p.name == args.program).ok_or_else(|| anyhow!("{}: no program `{}`", args.manifest.display(), args.program))?;
    let mut setups = Vec::with_capacity(local);
    let mut manifest = Some(first);
    for &d in &devices {
        let ctx = kern_cuda::Context::new(d)?;
        let m = match manifest.take() {
            Some(m) => m,
            None => crate::check::load(&args.manifest, arch)?,
        };
        let (free, _) = ctx.mem_info()?;
        let plan = plan::plan(&m, &plan::PlanOptions { budget: Some(free as u64), reserve: plan::PlanOptions::default().reserve.min(free as u64 / 4), max_pages: None })?;
        setups.push(RankSetup { ctx, manifest: m, plan });
    }
    let master = kern_cuda::bootstrap::master_addr(&args.master_addr)?;
    let job = kern_cuda::bootstrap::Job { nnodes: args.nnodes, key: job_key(text, args.nnodes, local) };
    let id = kern_cuda::bootstrap::exchange::<anyhow::Error>(master, args.node_rank, &job, std::time::Duration::from_secs(300), || {
        Ok(kern_cuda::nccl::UniqueId::new()?.0)
    })?;
    let info = kern_cuda::nccl::nccl()?;
    let first_rank = args.node_rank * local as u32;
    let mut pr = ParallelRuntime::new(setups, first_rank, &kern_cuda::nccl::UniqueId(id))?;
    if let Some(w) = &args.weights {
        let ckpt = kern_weights::Checkpoint::open(w)?;
        let bytes = pr.load_weights(&ckpt, |_, _, _| {})?;
        eprintln!("loaded {} of weights on {local} GPU(s) from {}", human(bytes), w.display());
    }
    for rt in pr.ranks() {
        for spec in &args.inputs {
            fill_input(rt, spec, &vars)?;
        }
    }
    let mode = if args.graph { Mode::Graph } else { Mode::Eager { sync_each: args.sync_each } };
    let mut times = Vec::new();
    for _ in 0..args.iters.max(1) {
        let stats = pr.run(program, &vars, mode)?;
        // The step's time is the slowest rank's.
        times.push(stats.iter().map(|s| s.gpu_ms).fold(0f32, f32::max));
    }
    times.sort_by(f32::total_cmp);
    eprintln!(
        "ran `{}` on ranks {first_rank}..{} of tp = {tp} (GPUs {devices:?}, {}, NCCL {}), {} mode, GPU time {:.3} ms (slowest rank{})",
        args.program,
        first_rank as usize + local,
        props.name,
        info.version_string(),
        if args.graph { "graph" } else { "eager" },
        times[times.len() / 2],
        if times.len() > 1 { format!(", median of {}", times.len()) } else { String::new() }
    );
    if args.node_rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    let rt0 = &pr.ranks()[0];
    let outputs: Vec<String> = if args.outputs.is_empty() {
        rt0.manifest.buffers.iter().filter(|b| b.role == kern_manifest::raw::Role::Output).map(|b| b.name.clone()).collect()
    } else {
        args.outputs.clone()
    };
    for spec in &outputs {
        write_output(rt0, spec, &vars, &args.out_dir, args.raw)?;
        let name = spec.split_once('=').map_or(spec.as_str(), |(n, _)| n);
        let b = buffer(rt0, name, "--output")?;
        let (_, n) = elements(rt0, b, &vars)?;
        let all = pr.read_buffer_all(b, n * rt0.manifest.buffers[b.0].dtype.size() as usize)?;
        let same = all.iter().all(|x| *x == all[0]);
        eprintln!("  `{name}` on the {local} local rank(s): {}", if same { "bit-identical" } else { "DIFFERENT (replicated outputs should agree)" });
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
