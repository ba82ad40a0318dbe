//! The real model: a packed model directory (model.json + kernels + weights) loaded onto a GPU
//! through `kern-runtime`, run step by step through the manifest's step ABI
//! (`docs/step-abi.md`): the step arrays are copied into the buffers the `step` section names,
//! decode steps replay a CUDA graph per bucket (prefill runs eagerly), and `sampled` (plus
//! `logits` when asked) come back.

use crate::constraint::TokenMask;
use crate::model::{Model, ModelError, ModelInfo, StepOutput};
use kern_manifest::manifest::{BufferId, Step as StepAbi};
use kern_runtime::plan::{self, human, StatePool};
use kern_runtime::{Mode, Runtime};
use kern_sched::Step;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub device: usize,
    /// Device memory kern may use in all (None: what is free now).
    pub gpu_mem: Option<GpuMem>,
    /// Replay decode steps from CUDA graphs.
    pub graphs: bool,
    /// Capture every decode bucket's graph before the first request.
    pub capture_at_start: bool,
    /// GPUs of a tensor-parallel manifest, one per rank (empty: `device`, `device + 1`, …).
    pub devices: Vec<usize>,
    /// Steps the old way — a blocking copy per step input and a waited run — instead of one
    /// pinned upload and a queued run: to measure what the host path costs
    /// (`kern bench --blocking-steps`), or to rule it out.
    pub blocking_steps: bool,
    /// Snapshot slots of the per-sequence states (a manifest whose per-sequence states all
    /// declare `snapshot`; ignored otherwise): [`plan::Snapshots::Auto`] by default.
    pub snapshots: plan::Snapshots,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { device: 0, gpu_mem: None, graphs: true, capture_at_start: false, devices: Vec::new(), blocking_steps: false, snapshots: plan::Snapshots::Auto }
    }
}

/// How much device memory kern may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GpuMem {
    Bytes(u64),
    /// A fraction of the device's total memory (vLLM's `--gpu-memory-utilization`).
    Fraction(f64),
}

impl std::str::FromStr for GpuMem {
    type Err = String;
    /// `0.9` (a fraction of the device's memory) or a size: `60GiB`, `8000MB`, `1073741824`.
    fn from_str(s: &str) -> Result<GpuMem, String> {
        if let Ok(f) = s.parse::<f64>() {
            if f > 0.0 && f <= 1.0 {
                return Ok(GpuMem::Fraction(f));
            }
        }
        kern_runtime::plan::parse_bytes(s).map(GpuMem::Bytes).map_err(|e| format!("`{s}`: give a fraction in (0, 1] of the GPU's memory or a size like 60GiB ({e})"))
    }
}

/// What loading took, for the startup log.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub device_name: String,
    pub weight_bytes: u64,
    pub load_secs: f64,
    pub pages: usize,
    pub page_tokens: usize,
}

/// One per-token state pool as the host tier copies it.
struct PagedPool {
    base: u64,
    page_bytes: usize,
    host: Option<kern_cuda::PinnedBuffer>,
}

/// The host tier's copy machinery: a copy stream and what is still in flight.
struct Offload {
    copy: kern_cuda::Stream,
    /// Recorded on the copy stream after the last batch of stores.
    last_store: Option<kern_cuda::Event>,
    /// GPU pages whose store may still be in flight.
    pending: std::collections::HashSet<u32>,
    /// Restores whose timing events have not been read yet: (start, end, bytes).
    timing: Vec<(kern_cuda::Event, kern_cuda::Event, u64)>,
    restored_bytes: u64,
    restore_secs: f64,
}

/// The program's runtime: one GPU, or every rank of a tensor-parallel manifest (one process
/// driving all local GPUs; step inputs go to every rank, outputs — replicated — come from
/// rank 0; `kern_runtime::parallel`).
// One per process: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Exec {
    One(Runtime),
    Tp(kern_runtime::ParallelRuntime),
}

impl Exec {
    /// The single runtime, or rank 0's.
    fn first(&self) -> &Runtime {
        match self {
            Exec::One(r) => r,
            Exec::Tp(p) => &p.ranks()[0],
        }
    }

    /// A blocking copy into `b` (every rank's), after all work queued in the context.
    fn write_buffer(&self, b: BufferId, bytes: &[u8]) -> kern_runtime::Result<()> {
        match self {
            Exec::One(r) => r.write_buffer(b, bytes),
            Exec::Tp(p) => p.write_buffer(b, bytes),
        }
    }

    /// Step inputs: one pinned staging upload, asynchronous on the stream (every rank's).
    fn upload(&mut self, writes: &[(BufferId, &[u8])]) -> kern_runtime::Result<()> {
        match self {
            Exec::One(r) => r.upload(writes),
            Exec::Tp(p) => p.upload(writes),
        }
    }

    /// Waits for the stream (rank 0's) and reads the first `dst.len()` bytes of `b`.
    fn read_into(&self, b: BufferId, dst: &mut [u8]) -> kern_runtime::Result<()> {
        match self {
            Exec::One(r) => r.read_into(b, dst),
            Exec::Tp(p) => p.read_into(b, dst),
        }
    }

    fn run(&mut self, prog: usize, vars: &[i64], mode: Mode) -> kern_runtime::Result<kern_runtime::RunStats> {
        match self {
            Exec::One(r) => r.run(prog, vars, mode),
            Exec::Tp(p) => Ok(p.run(prog, vars, mode)?.swap_remove(0)),
        }
    }

    /// Queues a run without waiting for it (the readback that follows waits once).
    fn enqueue_run(&mut self, prog: usize, vars: &[i64], mode: Mode) -> kern_runtime::Result<()> {
        match self {
            Exec::One(r) => r.enqueue_run(prog, vars, mode).map(|_| ()),
            Exec::Tp(p) => p.enqueue_run(prog, vars, mode).map(|_| ()),
        }
    }

    fn last_gpu_ms(&self) -> kern_runtime::Result<Option<f32>> {
        match self {
            Exec::One(r) => r.last_gpu_ms(),
            Exec::Tp(p) => p.last_gpu_ms(),
        }
    }

    fn is_parallel(&self) -> bool {
        matches!(self, Exec::Tp(_))
    }

    /// Queues snapshot copies on the stream (every rank's: each has its own state pools):
    /// `save` copies `(sequence slot, snapshot slot)`, else `(snapshot slot, sequence slot)`.
    fn copy_snapshots(&self, pairs: &[(u32, u32)], save: bool) -> kern_runtime::Result<()> {
        let ranks: &[Runtime] = match self {
            Exec::One(r) => std::slice::from_ref(r),
            Exec::Tp(p) => p.ranks(),
        };
        for r in ranks {
            if save {
                r.save_snapshots(pairs)?;
            } else {
                r.restore_snapshots(pairs)?;
            }
        }
        Ok(())
    }
}

pub struct GpuModel {
    rt: Exec,
    pools: Vec<PagedPool>,
    offload: Option<Offload>,
    step: StepAbi,
    /// The draft program (`speculative`): its index and its step bindings.
    draft: Option<(usize, StepAbi)>,
    info: ModelInfo,
    graphs: bool,
    capture_at_start: bool,
    blocking_steps: bool,
    last_gpu_ms: Option<f32>,
    nvars: usize,
    /// The step ABI's token mask inputs (`token_mask`, `mask_rows`) and the mask's words per
    /// row, when the manifest binds them. The checked manifest has no such roles yet (kern-manifest
    /// must learn them: docs/step-abi.md, "Token mask"), so this stays None and constrained rows
    /// are masked on the host; with the roles checked, `load` sets it and the sampler masks.
    mask_inputs: Option<(BufferId, BufferId, usize)>,
    pub report: LoadReport,
    // Declared last: dropped after the runtime that uses it.
    _ctx: kern_cuda::Context,
}

fn err(what: impl std::fmt::Display) -> ModelError {
    ModelError(what.to_string())
}

impl GpuModel {
    /// Loads `dir` (model.json, kernels, weights). `progress(done, total)` in weight bytes.
    /// Snapshot slots of per-sequence states (a manifest declaring `snapshot`) as
    /// `opts.snapshots` says.
    pub fn load(dir: &Path, opts: &LoadOptions, progress: impl FnMut(u64, u64)) -> Result<GpuModel, ModelError> {
        Self::load_with(dir, opts, opts.snapshots, progress)
    }

    /// [`GpuModel::load`] with `snapshots` snapshot slots of the per-sequence states (a
    /// manifest whose per-sequence states all declare `snapshot`; ignored otherwise).
    pub fn load_with(dir: &Path, opts: &LoadOptions, snapshots: plan::Snapshots, mut progress: impl FnMut(u64, u64)) -> Result<GpuModel, ModelError> {
        let t0 = Instant::now();
        let manifest_path: PathBuf = dir.join("model.json");
        if !manifest_path.exists() {
            return Err(err(format!("{}: no model.json: run `kern pack` for this model first", dir.display())));
        }
        let ctx = kern_cuda::Context::new(opts.device).map_err(err)?;
        let props = ctx.props().clone();
        let arch = kern_binary::Arch::new(props.cc_major * 10 + props.cc_minor);
        let m = kern_manifest::load(&manifest_path, &kern_manifest::CheckOptions { arch, ..Default::default() })
            .map_err(|d| err(format!("{d}{} error(s); `kern check {}` lists them", d.error_count(), manifest_path.display())))?;
        let step = m.step.clone().ok_or_else(|| err(format!("{}: the manifest has no `step` section: the engine drives a model through the step ABI (docs/step-abi.md)", manifest_path.display())))?;
        // The sampler's token-mask inputs (constrained decoding), when the manifest binds them:
        // one bit per token of the vocabulary in each mask row.
        let mask_inputs = match (step.token_mask, step.vocab) {
            (Some(t), Some(v)) if t.words != (v + 31) / 32 => {
                return Err(err(format!("{}: step.token_mask has {} words per row, but a vocabulary of {v} needs {}", manifest_path.display(), t.words, (v + 31) / 32)))
            }
            (Some(t), _) => Some((t.mask, t.rows, t.words as usize)),
            (None, _) => None,
        };
        // A model without weights (a toy, a test) needs no checkpoint.
        let has_weights = m.buffers.iter().any(|b| b.role == kern_manifest::raw::Role::Weight);
        let ckpt = if has_weights {
            let ckpt = kern_weights::Checkpoint::open(dir).map_err(|e| err(format!("{}: the model's weights: {e}", dir.display())))?;
            let problems = kern_weights::check(&ckpt, &m.buffers);
            if !problems.is_empty() {
                let lines: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
                return Err(err(format!("the checkpoint does not match the manifest:\n  {}", lines.join("\n  "))));
            }
            Some(ckpt)
        } else {
            None
        };
        let (free, total) = ctx.mem_info().map_err(err)?;
        let budget = match opts.gpu_mem {
            None => free as u64,
            Some(GpuMem::Bytes(b)) => b.min(free as u64),
            Some(GpuMem::Fraction(f)) => ((total as f64 * f) as u64).min(free as u64),
        };
        // More pages than every sequence could ever hold, several times over, would only cost
        // host bookkeeping and GPU memory (a tiny per-token state would get billions of pages).
        let seqs_max = m.step.as_ref().map_or(1, |s| m.vars[s.seqs.0].max as u64);
        let pages_max = m.step.as_ref().map_or(1, |s| m.vars[s.pages.0].max as u64);
        let popts = plan::PlanOptions { budget: Some(budget), reserve: (1u64 << 30).min(budget / 8), max_pages: Some((seqs_max * pages_max * 4).max(1 << 16)) };
        let p = plan::plan_with(&m, &popts, snapshots).map_err(|e| err(format!("{e} ({} has {} free of {})", props.name, human(free as u64), human(total as u64))))?;
        let (pages, page_tokens) = p
            .states
            .iter()
            .find_map(|pool| match pool {
                StatePool::PerToken { pages, page_tokens, .. } => Some((*pages as usize, *page_tokens as usize)),
                _ => None,
            })
            .ok_or_else(|| err("the manifest has no per-token (KV) state to page"))?;
        let var_max = |v: kern_manifest::manifest::VarId| m.vars[v.0].max as usize;
        let info = ModelInfo {
            max_step_tokens: var_max(step.tokens),
            max_step_seqs: var_max(step.seqs),
            pages_per_seq: var_max(step.pages),
            page_tokens,
            total_pages: pages,
            vocab: step.vocab.unwrap_or(0) as usize,
            logits: step.logits.is_some(),
            gpu_sampling: step.sampling.is_some(),
            per_seq_state: m.states.iter().any(|s| matches!(s.size, kern_manifest::manifest::StateSize::PerSeq { .. })),
            draft_k: m.speculative.as_ref().map(|s| s.k as usize),
        };
        let nvars = m.vars.len();
        let draft = m.speculative.as_ref().map(|s| (s.draft, s.step.clone()));
        let tp = m.tp();
        let rt = if tp > 1 {
            // Every rank gets the same plan (the same budget), so page ids mean the same KV
            // slots on every GPU.
            let devices: Vec<usize> = if opts.devices.is_empty() { (opts.device..opts.device + tp as usize).collect() } else { opts.devices.clone() };
            if devices.len() != tp as usize {
                return Err(err(format!("the manifest is one rank of tp = {tp}: give {tp} GPUs (--devices), not {}", devices.len())));
            }
            let mut setups = vec![kern_runtime::RankSetup { ctx: ctx.clone(), manifest: m, plan: p }];
            for &d in &devices[1..] {
                let c = kern_cuda::Context::new(d).map_err(err)?;
                let mr = kern_manifest::load(&manifest_path, &kern_manifest::CheckOptions { arch, ..Default::default() })
                    .map_err(|d| err(format!("{d}{} error(s)", d.error_count())))?;
                let pr = plan::plan_with(&mr, &popts, snapshots).map_err(|e| err(format!("GPU {d}: {e}")))?;
                setups.push(kern_runtime::RankSetup { ctx: c, manifest: mr, plan: pr });
            }
            let id = kern_cuda::nccl::UniqueId::new().map_err(err)?;
            Exec::Tp(kern_runtime::ParallelRuntime::new(setups, 0, &id).map_err(err)?)
        } else {
            Exec::One(Runtime::new(&ctx, m, p).map_err(err)?)
        };
        let pools: Vec<PagedPool> = rt
            .first()
            .pools()
            .enumerate()
            .filter_map(|(i, (_, pool, _))| match pool {
                StatePool::PerToken { bytes_per_token, page_tokens, .. } => Some(PagedPool {
                    base: rt.first().state_ptr(kern_manifest::manifest::StateId(i)),
                    page_bytes: (*bytes_per_token * u64::from(*page_tokens)) as usize,
                    host: None,
                }),
                _ => None,
            })
            .collect();
        let weight_bytes = match (&ckpt, &rt) {
            (Some(c), Exec::One(r)) => r.load_weights(c, &mut progress).map_err(err)?,
            (Some(c), Exec::Tp(pr)) => {
                let mut done = vec![0u64; pr.ranks().len()];
                let mut totals = vec![0u64; pr.ranks().len()];
                pr.load_weights(c, |rank, d, t| {
                    done[rank as usize] = d;
                    totals[rank as usize] = t;
                    progress(done.iter().sum(), totals.iter().sum());
                })
                .map_err(err)?
            }
            (None, _) => 0,
        };
        let report = LoadReport { device_name: props.name.clone(), weight_bytes, load_secs: t0.elapsed().as_secs_f64(), pages, page_tokens };
        Ok(GpuModel { rt, pools, offload: None, step, draft, info, graphs: opts.graphs, capture_at_start: opts.capture_at_start, blocking_steps: opts.blocking_steps, last_gpu_ms: None, nvars, mask_inputs, report, _ctx: ctx })
    }

    /// Copies the step's arrays into the buffers `abi` binds: one asynchronous upload from
    /// pinned staging (no host wait; the run queued next on the same stream reads them).
    fn upload_with(&mut self, st: &Step, abi: &StepAbi, mask: Option<&TokenMask>) -> Result<(), ModelError> {
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut writes: Vec<(BufferId, Vec<u8>)> = vec![
            (abi.token_ids, i32s(&st.token_ids)),
            (abi.positions, i32s(&st.positions)),
            (abi.seq_lens, i32s(&st.seq_lens)),
            (abi.query_start, i32s(&st.query_start)),
            (abi.slot_mapping, i32s(&st.slot_mapping)),
            (abi.block_tables, i32s(&st.block_tables)),
            (abi.last_token, i32s(&st.last_token)),
        ];
        if let Some(b) = abi.seq_slots {
            writes.push((b, i32s(&st.seq_slots)));
        }
        if let Some((bits, rows, words)) = self.mask_inputs {
            // Every step writes `mask_rows` (all -1 without constraints), so no row of an
            // earlier step leaks into this one; only the constrained rows' bitmasks are copied.
            let free = TokenMask::free(st.num_seqs, words * 32);
            let m = mask.filter(|m| m.words == words && m.rows.len() == st.num_seqs).unwrap_or(&free);
            writes.push((rows, i32s(&m.rows)));
            if m.any() {
                writes.push((bits, m.bits.iter().flat_map(|x| x.to_le_bytes()).collect()));
            }
        }
        if let Some(sm) = &abi.sampling {
            writes.push((sm.temperature, f32s(&st.temperature)));
            writes.push((sm.top_k, i32s(&st.top_k)));
            writes.push((sm.top_p, f32s(&st.top_p)));
            writes.push((sm.seeds, st.seeds.iter().flat_map(|x| x.to_le_bytes()).collect()));
        }
        if self.blocking_steps {
            for (b, v) in &writes {
                self.rt.write_buffer(*b, v).map_err(err)?;
            }
            return Ok(());
        }
        let refs: Vec<(BufferId, &[u8])> = writes.iter().map(|(b, v)| (*b, v.as_slice())).collect();
        self.rt.upload(&refs).map_err(err)
    }

    fn upload(&mut self, st: &Step) -> Result<(), ModelError> {
        let abi = self.step.clone();
        self.upload_with(st, &abi, None)
    }

    /// One step of program `prog` (bound by `abi`): upload, queue the run (a replayed graph for
    /// decode-shaped steps), then one wait — the readback of `sampled` (and `logits` when asked
    /// for). A step without real rows (graph capture at start) waits for the run itself.
    /// `while_running` is called between the queued run and the wait: host work there overlaps
    /// the GPU (the engine computes constrained rows' masks there when it masks on the host).
    fn run_step(&mut self, prog: usize, abi: &StepAbi, st: &Step, want_logits: bool, mask: Option<&TokenMask>, while_running: &mut dyn FnMut()) -> Result<StepOutput, ModelError> {
        self.guard_pending_stores(st)?;
        // Snapshots of per-sequence states: restored into their sequences' slots before the
        // program, on its stream (so after every earlier step's saves).
        self.rt.copy_snapshots(&st.snapshot_restores, false).map_err(err)?;
        self.upload_with(st, abi, mask)?;
        let mut vars = vec![1i64; self.nvars];
        vars[abi.tokens.0] = st.tokens as i64;
        vars[abi.seqs.0] = st.num_seqs as i64;
        vars[abi.pages.0] = self.info.pages_per_seq as i64;
        let mode = if st.is_decode() && self.graphs { Mode::Graph } else { Mode::Eager { sync_each: false } };
        if st.real_seqs == 0 || self.blocking_steps {
            let stats = self.rt.run(prog, &vars, mode).map_err(err)?;
            self.last_gpu_ms = Some(stats.gpu_ms);
        } else {
            self.rt.enqueue_run(prog, &vars, mode).map_err(err)?;
        }
        // ... and saved after it, before the next step's program can change the slots.
        self.rt.copy_snapshots(&st.snapshot_saves, true).map_err(err)?;
        while_running();
        if st.real_seqs == 0 {
            return Ok(StepOutput::default());
        }
        let mut bytes = vec![0u8; st.real_seqs * 4];
        self.rt.read_into(abi.sampled, &mut bytes).map_err(err)?;
        if !self.blocking_steps {
            // Free now: the readback has waited for the run.
            self.last_gpu_ms = self.rt.last_gpu_ms().map_err(err)?;
        }
        let sampled = bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let logits = match (want_logits, abi.logits) {
            (true, Some(b)) => {
                let mut bytes = vec![0u8; st.real_seqs * self.info.vocab * 4];
                self.rt.read_into(b, &mut bytes).map_err(err)?;
                Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            _ => None,
        };
        Ok(StepOutput { sampled, logits })
    }

    /// Makes the compute stream wait for stores still in flight when this step writes one of
    /// their pages (a GPU-side wait: the host does not block).
    fn guard_pending_stores(&mut self, st: &Step) -> Result<(), ModelError> {
        let Some(o) = self.offload.as_mut() else { return Ok(()) };
        if o.pending.is_empty() {
            return Ok(());
        }
        if o.last_store.as_ref().is_none_or(|e| e.is_complete().unwrap_or(false)) {
            o.pending.clear();
            return Ok(());
        }
        let pt = self.info.page_tokens as i32;
        let hit = st.slot_mapping.iter().any(|&s| s >= 0 && o.pending.contains(&((s / pt) as u32)));
        if hit {
            if let Some(e) = &o.last_store {
                self.rt.first().stream().wait_event(e).map_err(err)?;
            }
            o.pending.clear();
        }
        Ok(())
    }

    /// Profiles one step of `batch` sequences with `context`-token prompts: the prefill step that
    /// starts them (`prefill`), or a decode step after their prompts were computed. Returns a
    /// description of the step and every call's timing.
    pub fn profile(&mut self, batch: usize, context: usize, prefill: bool) -> Result<(String, Vec<crate::profile::CallTiming>), ModelError> {
        use kern_sched::{BlockManager, SamplingParams, Scheduler, SchedulerConfig};
        let mi = self.info.clone();
        if batch == 0 || batch > mi.max_step_seqs || context == 0 || context + 2 > mi.max_context() {
            return Err(err(format!("batch {batch} × context {context} does not fit this model ({} sequences, {} tokens of context)", mi.max_step_seqs, mi.max_context())));
        }
        let cfg = SchedulerConfig { chunk: mi.max_step_tokens, max_seqs: mi.max_step_seqs, max_context: mi.max_context(), pages_per_seq: mi.pages_per_seq, spec: None };
        let mut sched = Scheduler::new(cfg, BlockManager::new(mi.total_pages, mi.page_tokens).with_prefix_cache(false));
        let vocab = if mi.vocab > 0 { mi.vocab as u64 } else { 1000 };
        for i in 0..batch as u64 {
            let prompt: Vec<u32> = (0..context as u64).map(|t| ((t * 7919 + i * 104_729 + 13) % vocab) as u32).collect();
            // Enough tokens that no sequence finishes before the last prompt is prefilled: the
            // profiled decode step has all `batch` rows.
            let max_tokens = mi.max_context() - context;
            sched.add(prompt, SamplingParams { max_tokens, ignore_eos: true, ..Default::default() }).map_err(|e| err(e.to_string()))?;
        }
        loop {
            let st = sched.schedule(|t, s, _| (t, s)).ok_or_else(|| err("the scheduler produced no step"))?;
            if prefill || (st.is_decode() && st.real_seqs == batch) {
                let what = format!("{} step: {} sequences, {} tokens", if st.is_decode() { "decode" } else { "prefill" }, st.real_seqs, st.real_tokens);
                let calls = self.profile_step(&st)?;
                return Ok((what, calls));
            }
            let out = self.step(&st, false)?;
            sched.commit(&st, &out.sampled);
        }
    }

    /// Uploads `st` and times every call of the program on it, one by one (eager, CUDA events
    /// around each call), with the bytes of the buffers each call binds at the step's vars.
    /// The step's KV writes happen as in a real step.
    pub fn profile_step(&mut self, st: &Step) -> Result<Vec<crate::profile::CallTiming>, ModelError> {
        self.upload(st)?;
        let mut vars = vec![1i64; self.nvars];
        vars[self.step.tokens.0] = st.tokens as i64;
        vars[self.step.seqs.0] = st.num_seqs as i64;
        vars[self.step.pages.0] = self.info.pages_per_seq as i64;
        if self.rt.is_parallel() {
            return Err(err("kern profile times one call at a time, which a tensor-parallel program's collectives cannot do (every rank must take part): profile the TP=1 manifest"));
        }
        let m = &self.rt.first().manifest;
        let calls = &m.programs[0].calls;
        let mut out = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let ms = self.rt.first().time_calls(0, &vars, i..i + 1, None).map_err(err)? as f64;
            let bytes: u64 = call
                .args
                .iter()
                .filter_map(|b| match b {
                    kern_manifest::manifest::Binding::Buf(id) => {
                        let buf = &m.buffers[id.0];
                        let elems = buf.shape.iter().try_fold(1u64, |acc, e| e.eval(&vars).ok().map(|d| acc * d.max(0) as u64));
                        elems.map(|n| n * buf.dtype.size())
                    }
                    _ => None,
                })
                .sum();
            out.push(crate::profile::CallTiming { label: call.label.clone(), op: m.ops[call.op.0].name.clone(), ms, bytes });
        }
        Ok(out)
    }

    fn bucket(&self, n: usize, max: usize) -> usize {
        kern_runtime::exec::bucket(n as i64, max as i64) as usize
    }
}

impl Model for GpuModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn pad(&self, tokens: usize, seqs: usize, decode: bool) -> (usize, usize) {
        if decode && self.graphs {
            (self.bucket(tokens, self.info.max_step_tokens), self.bucket(seqs, self.info.max_step_seqs))
        } else {
            (tokens, seqs)
        }
    }

    fn page_bytes(&self) -> usize {
        self.pools.iter().map(|p| p.page_bytes).sum()
    }

    fn snapshot_slots(&self) -> usize {
        self.rt.first().snapshot_slots() as usize
    }

    fn last_gpu_ms(&self) -> Option<f32> {
        self.last_gpu_ms
    }

    fn weight_bytes(&self) -> u64 {
        self.report.weight_bytes
    }

    /// Copies 1 GiB device to device 10 times (after 3 warm-ups) and times them with events:
    /// read + write bytes over time, the bandwidth a memory-bound step can reach.
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        let rt = self.rt.first();
        let ctx = rt.context().clone();
        // Two 1 GiB buffers, or smaller ones when the KV pool left less free (it plans to leave
        // 1 GiB): 128 MiB each is still far past the L2, so the copy reads and writes HBM.
        let (len, a, b) = [1usize << 30, 1 << 28, 1 << 27].into_iter().find_map(|len| {
            let a = ctx.alloc(len).ok()?;
            let b = ctx.alloc(len).ok()?;
            Some((len, a, b))
        })?;
        let s = rt.stream();
        for _ in 0..3 {
            b.copy_from_device_async(0, &a, 0, len, s).ok()?;
        }
        let (start, end) = (kern_cuda::Event::new(&ctx, true).ok()?, kern_cuda::Event::new(&ctx, true).ok()?);
        start.record(s).ok()?;
        for _ in 0..10 {
            b.copy_from_device_async(0, &a, 0, len, s).ok()?;
        }
        end.record(s).ok()?;
        s.synchronize().ok()?;
        let ms = kern_cuda::Event::elapsed_ms(&start, &end).ok()? as f64;
        Some(10.0 * 2.0 * len as f64 / (ms / 1e3) / 1e9)
    }

    fn init_host_tier(&mut self, slots: usize) -> Result<(), ModelError> {
        if self.rt.is_parallel() {
            return Err(err("KV offload is not supported for tensor-parallel models yet (each rank has its own KV pool)"));
        }
        let ctx = self.rt.first().context().clone();
        for p in &mut self.pools {
            let bytes = slots.checked_mul(p.page_bytes).ok_or_else(|| err("host tier size overflows"))?;
            p.host = Some(ctx.alloc_pinned(bytes).map_err(|e| err(format!("pinning {} of host memory: {e}", human(bytes as u64))))?);
        }
        self.offload = Some(Offload { copy: ctx.stream().map_err(err)?, last_store: None, pending: Default::default(), timing: Vec::new(), restored_bytes: 0, restore_secs: 0.0 });
        Ok(())
    }

    fn store_pages(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        let Some(o) = self.offload.as_mut() else { return Ok(()) };
        // The copies start once the step that computed the pages is done.
        let rt = self.rt.first();
        let computed = rt.context().event().map_err(err)?;
        computed.record(rt.stream()).map_err(err)?;
        o.copy.wait_event(&computed).map_err(err)?;
        for (gpu, host, n) in runs(pairs) {
            for p in &mut self.pools {
                let len = n * p.page_bytes;
                let buf = p.host.as_mut().expect("host tier initialized");
                // SAFETY: the GPU range lies in the state pool (page < total pages); the pinned
                // buffer is owned by this model and outlives the copy (Drop synchronizes).
                unsafe { buf.copy_from_device_async(host as usize * p.page_bytes, p.base + gpu as u64 * p.page_bytes as u64, len, &o.copy) }.map_err(err)?;
            }
        }
        let done = rt.context().event().map_err(err)?;
        done.record(&o.copy).map_err(err)?;
        o.last_store = Some(done);
        o.pending.extend(pairs.iter().map(|p| p.0));
        Ok(())
    }

    fn restore_pages(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        let Some(o) = self.offload.as_mut() else { return Ok(()) };
        // A restored page may have been evicted with its store still in flight, and a host
        // slot may be the target of one: wait for the stores first (on the GPU).
        let rt = self.rt.first();
        if let Some(e) = &o.last_store {
            rt.stream().wait_event(e).map_err(err)?;
        }
        o.pending.clear();
        let ctx = rt.context().clone();
        let (start, end) = (kern_cuda::Event::new(&ctx, true).map_err(err)?, kern_cuda::Event::new(&ctx, true).map_err(err)?);
        start.record(rt.stream()).map_err(err)?;
        let bytes = pairs.len() as u64 * self.pools.iter().map(|p| p.page_bytes as u64).sum::<u64>();
        for (host, gpu, n) in runs(pairs) {
            for p in &self.pools {
                let buf = p.host.as_ref().expect("host tier initialized");
                // SAFETY: as in store_pages; queued on the compute stream, so it lands before
                // the step that reads the page.
                unsafe { buf.copy_to_device_async(host as usize * p.page_bytes, p.base + gpu as u64 * p.page_bytes as u64, n * p.page_bytes, rt.stream()) }.map_err(err)?;
            }
        }
        end.record(rt.stream()).map_err(err)?;
        o.timing.push((start, end, bytes));
        Ok(())
    }

    fn restore_timing(&mut self) -> (u64, f64) {
        let Some(o) = self.offload.as_mut() else { return (0, 0.0) };
        let mut keep = Vec::new();
        for (s, e, b) in o.timing.drain(..) {
            match e.is_complete() {
                Ok(true) => {
                    o.restored_bytes += b;
                    o.restore_secs += kern_cuda::Event::elapsed_ms(&s, &e).unwrap_or(0.0) as f64 / 1e3;
                }
                _ => keep.push((s, e, b)),
            }
        }
        o.timing = keep;
        (o.restored_bytes, o.restore_secs)
    }

    fn step(&mut self, st: &Step, want_logits: bool) -> Result<StepOutput, ModelError> {
        let abi = self.step.clone();
        self.run_step(0, &abi, st, want_logits, None, &mut || {})
    }

    fn token_mask(&self) -> bool {
        self.mask_inputs.is_some()
    }

    fn step_with(&mut self, st: &Step, want_logits: bool, mask: Option<&TokenMask>, while_running: &mut dyn FnMut()) -> Result<StepOutput, ModelError> {
        if mask.is_some_and(TokenMask::any) && self.mask_inputs.is_none() {
            return Err(err("this model's manifest binds no `token_mask` step input"));
        }
        let abi = self.step.clone();
        self.run_step(0, &abi, st, want_logits, mask, while_running)
    }

    fn draft_step(&mut self, st: &Step) -> Result<Vec<i32>, ModelError> {
        let (prog, abi) = self.draft.clone().ok_or_else(|| err("this model declares no draft program (the manifest's `speculative` section)"))?;
        Ok(self.run_step(prog, &abi, st, false, None, &mut || {})?.sampled)
    }

    /// Captures the graph of every decode bucket (the draft program's too) with an all-padding
    /// step (no KV is written).
    fn warm_up(&mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<(), ModelError> {
        if !(self.graphs && self.capture_at_start) {
            return Ok(());
        }
        let max = self.info.max_step_seqs.min(self.info.max_step_tokens);
        let mut buckets = Vec::new();
        let mut b = 1;
        while b < max {
            buckets.push(b);
            b *= 2;
        }
        buckets.push(max);
        for (i, &b) in buckets.iter().enumerate() {
            let st = Step::padding(b, b, self.info.pages_per_seq, self.info.page_tokens);
            self.step(&st, false)?;
            if self.draft.is_some() {
                self.draft_step(&st)?;
            }
            progress(i + 1, buckets.len());
        }
        Ok(())
    }
}

/// Consecutive pairs `(a, b), (a + 1, b + 1), …` merged into `(a, b, count)`: one copy per run
/// of pages contiguous on both sides.
fn runs(pairs: &[(u32, u32)]) -> Vec<(u32, u32, usize)> {
    let mut out: Vec<(u32, u32, usize)> = Vec::new();
    for &(a, b) in pairs {
        match out.last_mut() {
            Some((x, y, n)) if *x as usize + *n == a as usize && *y as usize + *n == b as usize => *n += 1,
            _ => out.push((a, b, 1)),
        }
    }
    out
}

impl Drop for GpuModel {
    fn drop(&mut self) {
        // Pinned buffers must outlive the copies that use them.
        if let Some(o) = &self.offload {
            let _ = o.copy.synchronize();
        }
        let _ = self.rt.first().stream().synchronize();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn contiguous_pages_move_in_one_copy() {
        assert_eq!(super::runs(&[(4, 10), (5, 11), (6, 12), (9, 13), (10, 14), (2, 0)]), vec![(4, 10, 3), (9, 13, 2), (2, 0, 1)]);
        assert!(super::runs(&[]).is_empty());
    }
}
