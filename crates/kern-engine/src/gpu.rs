//! The real model: a packed model directory (model.json + kernels + weights) loaded onto a GPU
//! through `kern-runtime`, run step by step through the manifest's step ABI
//! (`docs/step-abi.md`): the step arrays are copied into the buffers the `step` section names,
//! decode steps replay a CUDA graph per bucket (prefill runs eagerly), and `sampled` (plus
//! `logits` when asked) come back.

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
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { device: 0, gpu_mem: None, graphs: true, capture_at_start: false }
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

pub struct GpuModel {
    rt: Runtime,
    step: StepAbi,
    info: ModelInfo,
    graphs: bool,
    capture_at_start: bool,
    nvars: usize,
    pub report: LoadReport,
    // Declared last: dropped after the runtime that uses it.
    _ctx: kern_cuda::Context,
}

fn err(what: impl std::fmt::Display) -> ModelError {
    ModelError(what.to_string())
}

impl GpuModel {
    /// Loads `dir` (model.json, kernels, weights). `progress(done, total)` in weight bytes.
    pub fn load(dir: &Path, opts: &LoadOptions, mut progress: impl FnMut(u64, u64)) -> Result<GpuModel, ModelError> {
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
        let ckpt = kern_weights::Checkpoint::open(dir).map_err(|e| err(format!("{}: the model's weights: {e}", dir.display())))?;
        let problems = kern_weights::check(&ckpt, &m.buffers);
        if !problems.is_empty() {
            let lines: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
            return Err(err(format!("the checkpoint does not match the manifest:\n  {}", lines.join("\n  "))));
        }
        let (free, total) = ctx.mem_info().map_err(err)?;
        let budget = match opts.gpu_mem {
            None => free as u64,
            Some(GpuMem::Bytes(b)) => b.min(free as u64),
            Some(GpuMem::Fraction(f)) => ((total as f64 * f) as u64).min(free as u64),
        };
        let p = plan::plan(&m, &plan::PlanOptions { budget: Some(budget), reserve: (1u64 << 30).min(budget / 8) })
            .map_err(|e| err(format!("{e} ({} has {} free of {})", props.name, human(free as u64), human(total as u64))))?;
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
        };
        let nvars = m.vars.len();
        let rt = Runtime::new(&ctx, m, p).map_err(err)?;
        let weight_bytes = rt.load_weights(&ckpt, &mut progress).map_err(err)?;
        let report = LoadReport { device_name: props.name.clone(), weight_bytes, load_secs: t0.elapsed().as_secs_f64(), pages, page_tokens };
        Ok(GpuModel { rt, step, info, graphs: opts.graphs, capture_at_start: opts.capture_at_start, nvars, report, _ctx: ctx })
    }

    fn write(&self, b: BufferId, bytes: Vec<u8>) -> Result<(), ModelError> {
        self.rt.write_buffer(b, &bytes).map_err(err)
    }

    fn upload(&self, st: &Step) -> Result<(), ModelError> {
        let s = &self.step;
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        self.write(s.token_ids, i32s(&st.token_ids))?;
        self.write(s.positions, i32s(&st.positions))?;
        self.write(s.seq_lens, i32s(&st.seq_lens))?;
        self.write(s.query_start, i32s(&st.query_start))?;
        self.write(s.slot_mapping, i32s(&st.slot_mapping))?;
        self.write(s.block_tables, i32s(&st.block_tables))?;
        self.write(s.last_token, i32s(&st.last_token))?;
        if let Some(sm) = &s.sampling {
            self.write(sm.temperature, f32s(&st.temperature))?;
            self.write(sm.top_k, i32s(&st.top_k))?;
            self.write(sm.top_p, f32s(&st.top_p))?;
            self.write(sm.seeds, st.seeds.iter().flat_map(|x| x.to_le_bytes()).collect())?;
        }
        Ok(())
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

    fn step(&mut self, st: &Step, want_logits: bool) -> Result<StepOutput, ModelError> {
        self.upload(st)?;
        let mut vars = vec![1i64; self.nvars];
        vars[self.step.tokens.0] = st.tokens as i64;
        vars[self.step.seqs.0] = st.num_seqs as i64;
        vars[self.step.pages.0] = self.info.pages_per_seq as i64;
        let graph = st.is_decode() && self.graphs;
        self.rt.run(0, &vars, if graph { Mode::Graph } else { Mode::Eager { sync_each: false } }).map_err(err)?;
        let bytes = self.rt.read_buffer(self.step.sampled, st.real_seqs * 4).map_err(err)?;
        let sampled = bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let logits = match (want_logits, self.step.logits) {
            (true, Some(b)) => {
                let bytes = self.rt.read_buffer(b, st.real_seqs * self.info.vocab * 4).map_err(err)?;
                Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            _ => None,
        };
        Ok(StepOutput { sampled, logits })
    }

    /// Captures the graph of every decode bucket with an all-padding step (no KV is written).
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
            progress(i + 1, buckets.len());
        }
        Ok(())
    }
}
