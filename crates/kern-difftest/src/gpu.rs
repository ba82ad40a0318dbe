//! The GPU part of `kern test`: both manifests loaded onto one device (two runtimes in one
//! context), the kernel diff, the precision diff over a scheduled multi-sequence scenario, and
//! the performance diff. Everything it measures goes into the [`Report`]; the judging is done by
//! the pure modules ([`crate::numeric`], [`crate::report`]).

use crate::matching::labels;
use crate::numeric::{self, classify, compare, Dist, LogitStats, PerfClass, Timing, Tolerance};
use crate::pairing::{self, Analysis, Incomparable};
use crate::report::{Check, Divergence, IntervalPair, MatchSummary, OpDiff, Perf, PerfRow, Precision, Report, StepPerf, StepPrecision};
use kern_manifest::manifest::{Binding, BufferId, Manifest, StateId, Step as StepAbi};
use kern_manifest::{OpParam, Role, StateSize};
use kern_runtime::data::{encode, Values};
use kern_runtime::plan::{self, MemoryPlan, PlanOptions};
use kern_runtime::{Mode, Runtime, RuntimeError};
use kern_sched::{BlockManager, SamplingParams, Scheduler, SchedulerConfig, Step};
use std::collections::HashMap;
use std::path::PathBuf;

/// What `kern test` is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub a: PathBuf,
    pub b: PathBuf,
    /// The checkpoint both load their weights from (default: A's directory).
    pub weights: Option<PathBuf>,
    /// `VAR=N` values for manifests without a step ABI, and caps for those with one.
    pub sets: Vec<(String, i64)>,
    pub device: usize,
    pub seed: u64,
    /// Decode steps after the prefill.
    pub decode_steps: usize,
    pub kernel_diff: bool,
    pub perf: bool,
    pub perf_reps: usize,
    /// Relative threshold for performance regressions (0.05 = 5 %).
    pub perf_threshold: f64,
    /// Gate on the mean KL divergence of the logits.
    pub kl_mean_max: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            a: PathBuf::new(),
            b: PathBuf::new(),
            weights: None,
            sets: vec![],
            device: 0,
            seed: 0,
            decode_steps: 8,
            kernel_diff: true,
            perf: true,
            perf_reps: 20,
            perf_threshold: 0.05,
            kl_mean_max: 1e-2,
        }
    }
}

/// Prompt lengths of the precision scenario: several sequences, odd sizes, one of length 1.
pub const PROMPTS: [usize; 4] = [37, 5, 90, 1];

/// The text the scenario's prompts are cut from when the checkpoint has a tokenizer.
const TEXT: &str = "The history of numerical computing is a history of trade-offs between speed and accuracy. \
Early machines stored numbers in fixed point, and programmers scaled every quantity by hand so that \
nothing overflowed. Floating point arithmetic moved that burden into hardware: a number became a \
sign, an exponent and a fraction, and the machine kept track of the scale. Rounding became the new \
problem. Every operation rounds its exact result to the nearest representable value, and the errors \
of long computations accumulate in ways that depend on the order of the operations. Two programs that \
compute the same sum in different orders can disagree in the last digits, and both can be correct. \
Reduced precision formats such as bfloat16 keep the exponent range of single precision with fewer \
fraction bits, so neural networks can be evaluated faster while their activations stay in range.";

/// The matching part of the report (no GPU).
pub fn match_summary(an: &Analysis) -> MatchSummary {
    let m = &an.matching;
    MatchSummary {
        calls_a: an.calls_a.len(),
        calls_b: an.calls_b.len(),
        intervals: m.intervals.len(),
        one_to_one: m.intervals.iter().filter(|i| i.a.len() == 1 && i.b.len() == 1).count(),
        fused_or_split: m
            .intervals
            .iter()
            .enumerate()
            .filter(|(_, i)| !(i.a.len() == 1 && i.b.len() == 1))
            .map(|(k, i)| IntervalPair { index: k, kind: i.kind(), a_calls: labels(&an.calls_a, &i.a), b_calls: labels(&an.calls_b, &i.b) })
            .collect(),
        unpaired_buffers: m.unpaired.iter().map(|&c| an.commons[c].name.clone()).collect(),
        buffer_differs: an.buffer_differs.clone(),
        common_buffers: an.commons.len(),
    }
}

/// Fills the manifest-only parts of a report from an analysis.
pub fn describe(report: &mut Report, an: &Analysis) {
    report.matching = Some(match_summary(an));
    report.ops_only_a = an.only_a.clone();
    report.ops_only_b = an.only_b.clone();
    report.ops_signature_differs = an.signature_differs.clone();
}

fn load(path: &std::path::Path, arch: kern_manifest::Arch) -> Result<Manifest, Incomparable> {
    kern_manifest::load(path, &kern_manifest::CheckOptions { arch, ..Default::default() })
        .map_err(|d| Incomparable(format!("{}: the manifest does not check ({} error(s); `kern check {}` lists them):\n{d}", path.display(), d.error_count(), path.display())))
}

/// Runs `kern test` on the GPU. Never panics on bad input: everything becomes the report.
pub fn run(opts: &Options) -> Report {
    let (an_s, bn_s) = (opts.a.display().to_string(), opts.b.display().to_string());
    let ctx = match kern_cuda::Context::new(opts.device) {
        Ok(c) => c,
        Err(e) => {
            return Report::incomparable(
                &an_s,
                &bn_s,
                format!("no GPU to run on ({e}): kern test runs both programs on a CUDA device; `kern test --match-only` compares the manifests without one"),
            )
        }
    };
    let props = ctx.props().clone();
    let arch = kern_manifest::Arch::new(props.cc_major * 10 + props.cc_minor);
    let (ma, mb) = match (load(&opts.a, arch), load(&opts.b, arch)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Report::incomparable(&an_s, &bn_s, e.0),
    };
    let an = match pairing::analyze(&ma, &mb) {
        Ok(a) => a,
        Err(e) => return Report::incomparable(&an_s, &bn_s, e.0),
    };
    let mut report = Report::new(&an_s, &bn_s);
    report.device = Some(format!("{} ({})", props.name, props.sm_name()));
    report.seed = opts.seed;
    describe(&mut report, &an);
    let mut s = match Session::new(&ctx, ma, mb, an, opts) {
        Ok(s) => s,
        Err(e) => return Report { verdict: crate::report::Verdict::Incomparable, reason: Some(e.0), ..report },
    };
    report.notes.append(&mut s.notes);
    if let Err(e) = s.all(&mut report) {
        report.reason = Some(e);
    }
    report.notes.append(&mut s.notes);
    report.finish();
    report
}

/// A scheduled step with each side's var values.
#[derive(Clone)]
struct Shape {
    name: String,
    step: Option<Step>,
    va: Vec<i64>,
    vb: Vec<i64>,
}

struct Session<'o> {
    a: Runtime,
    b: Runtime,
    an: Analysis,
    opts: &'o Options,
    /// (A's state, B's state) pairs of the same name and size.
    states: Vec<(StateId, StateId)>,
    notes: Vec<String>,
    weights: Option<kern_weights::Checkpoint>,
    pages: usize,
    page_tokens: usize,
    pages_per_seq: usize,
    chunk: usize,
    max_seqs: usize,
    vocab: usize,
    /// Var values by name (defaults and `--set`).
    base: HashMap<String, i64>,
    /// Token ids of a real text, when the checkpoint directory has a tokenizer.
    text: Option<Vec<u32>>,
}

fn rt_err(side: &str, e: RuntimeError) -> String {
    format!("{side}: {e}")
}

impl<'o> Session<'o> {
    fn new(ctx: &kern_cuda::Context, ma: Manifest, mb: Manifest, an: Analysis, opts: &'o Options) -> Result<Session<'o>, Incomparable> {
        let mut notes = Vec::new();
        // Var values: the smaller max of the two, or --set.
        let mut base = HashMap::new();
        for v in &ma.vars {
            let other = mb.var(&v.name).map_or(v.max, |i| mb.vars[i.0].max);
            base.insert(v.name.clone(), v.max.min(other));
        }
        for (k, val) in &opts.sets {
            match base.get_mut(k) {
                Some(x) if *val >= 1 && *val <= *x => *x = *val,
                Some(x) => return Err(Incomparable(format!("--set {k}={val}: outside 1..={x} (the smaller max of the two manifests)"))),
                None => return Err(Incomparable(format!("--set {k}={val}: no var `{k}` (the manifests declare: {})", ma.vars.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", ")))),
            }
        }
        // States: same name and size are copied between the sides.
        let mut states = Vec::new();
        for (i, s) in ma.states.iter().enumerate() {
            match mb.state(&s.name) {
                Some(j) if mb.states[j.0].size == s.size => states.push((StateId(i), j)),
                _ => notes.push(format!("state `{}` is not declared alike on both sides: B keeps its own contents in the interval comparison", s.name)),
            }
        }
        // Weights.
        let has_weights = |m: &Manifest| m.buffers.iter().any(|b| b.role == Role::Weight);
        let weights = if has_weights(&ma) || has_weights(&mb) {
            let dir = opts.weights.clone().unwrap_or_else(|| ma.dir.clone());
            let ckpt = kern_weights::Checkpoint::open(&dir).map_err(|e| Incomparable(format!("{}: the weights (--weights): {e}", dir.display())))?;
            for (side, m) in [("A", &ma), ("B", &mb)] {
                let problems = kern_weights::check(&ckpt, &m.buffers);
                if !problems.is_empty() {
                    let lines: Vec<String> = problems.iter().take(8).map(|e| e.to_string()).collect();
                    return Err(Incomparable(format!("{side} ({}): the checkpoint {} does not match its weights:\n  {}", m.file.display(), dir.display(), lines.join("\n  "))));
                }
            }
            Some(ckpt)
        } else {
            None
        };
        // A real token sequence for the prompts, when there is a tokenizer next to the weights.
        let tok_dir = opts.weights.clone().unwrap_or_else(|| ma.dir.clone());
        let text = if tok_dir.join("tokenizer.json").exists() {
            match kern_tokenizer::Tokenizer::from_dir(&tok_dir).and_then(|t| t.encode(TEXT, false)) {
                Ok(ids) if !ids.is_empty() => {
                    notes.push(format!("prompts: a {}-token English text tokenized by {}", ids.len(), tok_dir.join("tokenizer.json").display()));
                    Some(ids)
                }
                Ok(_) => None,
                Err(e) => {
                    notes.push(format!("prompts: seeded random token ids ({}: {e})", tok_dir.join("tokenizer.json").display()));
                    None
                }
            }
        } else {
            notes.push(format!("prompts: seeded random token ids (no tokenizer.json in {})", tok_dir.display()));
            None
        };
        // The step scenario's sizes and the KV pool they need.
        let page_tokens = ma
            .states
            .iter()
            .find_map(|s| match s.size {
                StateSize::PerToken { page_tokens, .. } => Some(page_tokens as usize),
                _ => None,
            })
            .unwrap_or(16);
        let (mut chunk, mut max_seqs, mut pages_per_seq, mut vocab) = (1, 1, 1, 256);
        if let (Some(sa), Some(_)) = (&ma.step, &mb.step) {
            let name = |v: kern_manifest::manifest::VarId| ma.vars[v.0].name.clone();
            chunk = base[&name(sa.tokens)] as usize;
            max_seqs = base[&name(sa.seqs)] as usize;
            pages_per_seq = base[&name(sa.pages)] as usize;
            vocab = sa.vocab.unwrap_or(256) as usize;
        }
        let max_context = pages_per_seq * page_tokens;
        let mut pages: usize = PROMPTS.iter().map(|&l| (l.min(max_context.saturating_sub(opts.decode_steps + 2)).max(1) + opts.decode_steps + 2).div_ceil(page_tokens)).sum();
        pages = pages.max(chunk.min(max_context).div_ceil(page_tokens)) + 2;
        let plan_for = |m: &Manifest| -> Result<MemoryPlan, Incomparable> {
            let bare = plan::plan(m, &PlanOptions { budget: None, reserve: 0, max_pages: None }).map_err(|e| Incomparable(format!("{}: {e}", m.file.display())))?;
            let group: u64 = m
                .states
                .iter()
                .map(|s| match s.size {
                    StateSize::PerToken { bytes, page_tokens } => bytes * u64::from(page_tokens),
                    StateSize::PerSeq { .. } => 0,
                })
                .sum();
            let per_seq: u64 = bare.states.iter().map(|p| p.bytes()).sum();
            let budget = bare.arena_bytes + per_seq + group * pages as u64;
            plan::plan(m, &PlanOptions { budget: Some(budget), reserve: 0, max_pages: None }).map_err(|e| Incomparable(format!("{}: {e}", m.file.display())))
        };
        let (pa, pb) = (plan_for(&ma)?, plan_for(&mb)?);
        let (free, _) = ctx.mem_info().map_err(|e| Incomparable(e.to_string()))?;
        let need = pa.total_bytes() + pb.total_bytes() + (512 << 20);
        if need > free as u64 {
            return Err(Incomparable(format!("both models need {} on the device, {} is free", plan::human(need), plan::human(free as u64))));
        }
        let a = Runtime::new(ctx, ma, pa).map_err(|e| Incomparable(rt_err("A", e)))?;
        let b = Runtime::new(ctx, mb, pb).map_err(|e| Incomparable(rt_err("B", e)))?;
        Ok(Session { a, b, an, opts, states, notes, weights, pages, page_tokens, pages_per_seq, chunk, max_seqs, vocab, base, text })
    }

    fn vars(&self, m: &Manifest, over: &[(&str, i64)]) -> Vec<i64> {
        m.vars
            .iter()
            .map(|v| over.iter().find(|(n, _)| *n == v.name).map(|(_, x)| *x).unwrap_or_else(|| self.base.get(&v.name).copied().unwrap_or(v.max)))
            .collect()
    }

    fn step_shape(&self, name: String, st: Step) -> Shape {
        let over = |m: &Manifest| -> Vec<(String, i64)> {
            let s = m.step.as_ref().expect("step manifests only");
            vec![
                (m.vars[s.tokens.0].name.clone(), st.tokens as i64),
                (m.vars[s.seqs.0].name.clone(), st.num_seqs as i64),
                (m.vars[s.pages.0].name.clone(), self.pages_per_seq as i64),
            ]
        };
        let (oa, ob) = (over(&self.a.manifest), over(&self.b.manifest));
        let va = self.vars(&self.a.manifest, &oa.iter().map(|(n, v)| (n.as_str(), *v)).collect::<Vec<_>>());
        let vb = self.vars(&self.b.manifest, &ob.iter().map(|(n, v)| (n.as_str(), *v)).collect::<Vec<_>>());
        Shape { name, step: Some(st), va, vb }
    }

    /// A scheduler over the KV pool of both runtimes (prefix cache off: every step computes).
    fn scheduler(&self) -> Scheduler {
        let cfg = SchedulerConfig { chunk: self.chunk, max_seqs: self.max_seqs, max_context: self.pages_per_seq * self.page_tokens, pages_per_seq: self.pages_per_seq, spec: None };
        Scheduler::new(cfg, BlockManager::new(self.pages, self.page_tokens).with_prefix_cache(false))
    }

    /// Prompt `k` of `len` tokens: a window of the tokenized text (ids at or above the
    /// vocabulary replaced), else seeded random ids.
    fn prompt(&self, len: usize, k: usize) -> Vec<u32> {
        if let Some(t) = &self.text {
            let start = (k * 17) % t.len();
            return (0..len).map(|i| t[(start + i) % t.len()] % self.vocab.max(1) as u32).collect();
        }
        let mut rng = numeric::Rng(self.opts.seed ^ (0x1234_5678 + k as u64));
        (0..len).map(|_| (rng.next_u64() % self.vocab as u64) as u32).collect()
    }

    fn max_context(&self) -> usize {
        self.pages_per_seq * self.page_tokens
    }

    /// The shapes of the kernel diff: one token, the scenario's odd multi-sequence prefill,
    /// and the largest step.
    fn kernel_shapes(&self) -> Vec<Shape> {
        if self.a.manifest.step.is_none() {
            let ones: Vec<(&str, i64)> = self.a.manifest.vars.iter().map(|v| (v.name.as_str(), 1)).collect();
            let maxes: Vec<(String, i64)> = self.a.manifest.vars.iter().map(|v| (v.name.clone(), self.base[&v.name].max(1))).collect();
            let mk = |name: &str, over: &[(&str, i64)]| Shape { name: name.into(), step: None, va: self.vars(&self.a.manifest, over), vb: self.vars(&self.b.manifest, over) };
            let mut out = vec![mk("all vars 1", &ones)];
            out.push(mk("vars as set", &[]));
            let full = self.vars(&self.a.manifest, &maxes.iter().map(|(n, v)| (n.as_str(), *v)).collect::<Vec<_>>());
            if full != out[1].va {
                out.push(mk("vars at max", &maxes.iter().map(|(n, v)| (n.as_str(), *v)).collect::<Vec<_>>()));
            }
            return out;
        }
        let mut out = Vec::new();
        let one = |lens: &[usize]| -> Option<Step> {
            let mut s = self.scheduler();
            for (k, &l) in lens.iter().enumerate() {
                s.add(self.prompt(l, 100 + k), SamplingParams { max_tokens: 1, ignore_eos: true, ..Default::default() }).ok()?;
            }
            s.schedule(|t, q, _| (t, q))
        };
        let mc = self.max_context().saturating_sub(2).max(1);
        if let Some(st) = one(&[1]) {
            out.push(self.step_shape("1 token".into(), st));
        }
        let lens: Vec<usize> = PROMPTS.iter().map(|&l| l.min(mc)).take(self.max_seqs).collect();
        if let Some(st) = one(&lens) {
            out.push(self.step_shape(format!("{} seqs / {} tokens", st.real_seqs, st.real_tokens), st));
        }
        if let Some(st) = one(&[self.chunk.min(mc)]) {
            if st.real_tokens > 1 {
                out.push(self.step_shape(format!("1 seq / {} tokens (max)", st.real_tokens), st));
            }
        }
        out
    }

    /// Writes a step's inputs (or generated inputs for manifests without a step ABI).
    fn upload(&self, sh: &Shape) -> Result<(), String> {
        for (side, rt) in [("A", &self.a), ("B", &self.b)] {
            match (&sh.step, &rt.manifest.step) {
                (Some(st), Some(abi)) => upload_step(rt, abi, st).map_err(|e| rt_err(side, e))?,
                _ => {
                    // Inputs by name, identical on both sides: seeded uniform floats, small ints.
                    let vars = if side == "A" { &sh.va } else { &sh.vb };
                    for (i, b) in rt.manifest.buffers.iter().enumerate() {
                        if b.role != Role::Input {
                            continue;
                        }
                        let n = rt.manifest.buffer_bytes(BufferId(i), vars).map_err(|e| format!("{side}: buffers.{}: {e}", b.name))? / b.dtype.size();
                        let seed = self.opts.seed ^ name_hash(&b.name);
                        let vals = kern_runtime::data::generate(kern_runtime::data::Generated::Random { seed }, n as usize, b.dtype);
                        let bytes = encode(&vals, b.dtype).map_err(|e| format!("{side}: buffers.{}: {e}", b.name))?;
                        rt.write_buffer(BufferId(i), &bytes).map_err(|e| rt_err(side, e))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn all(&mut self, report: &mut Report) -> Result<(), String> {
        if self.opts.kernel_diff {
            report.ops = self.kernel_diff()?;
        }
        if let Some(ck) = &self.weights {
            self.a.load_weights(ck, |_, _| {}).map_err(|e| rt_err("A: loading weights", e))?;
            self.b.load_weights(ck, |_, _| {}).map_err(|e| rt_err("B: loading weights", e))?;
        }
        let perf_shapes = self.precision(report)?;
        if self.opts.perf {
            report.perf = Some(self.perf(&perf_shapes)?);
        }
        Ok(())
    }

    // -------------------------------------------------------------------------- kernel diff

    fn kernel_diff(&mut self) -> Result<Vec<OpDiff>, String> {
        let shapes = self.kernel_shapes();
        let mut out = Vec::new();
        let pairs = self.an.ops.clone();
        let mut cache: HashMap<(usize, u8, DistKey), Vec<u8>> = HashMap::new();
        let mut cache_bytes = 0usize;
        for sh in &shapes {
            self.upload(sh)?;
            for pair in &pairs {
                if !out.iter().any(|d: &OpDiff| d.op == pair.name) {
                    out.push(OpDiff { op: pair.name.clone(), same_impl: pair.same_impl, a_call: String::new(), b_call: String::new(), checks: 0, failures: 0, first_failure: None, worst: None, skipped: None });
                }
                let d = out.iter_mut().find(|d| d.op == pair.name).unwrap();
                if d.skipped.is_some() {
                    continue;
                }
                let (ma, mb) = (&self.a.manifest, &self.b.manifest);
                let calls_a = &ma.programs[0].calls;
                let calls_b = &mb.programs[0].calls;
                let Some(ia) = calls_a.iter().position(|c| c.op == pair.a) else {
                    d.skipped = Some("A's program does not call it".into());
                    continue;
                };
                let ib = calls_b.iter().position(|c| c.op == pair.b && c.label == calls_a[ia].label).or_else(|| calls_b.iter().position(|c| c.op == pair.b));
                let Some(ib) = ib else {
                    d.skipped = Some("B's program does not call it".into());
                    continue;
                };
                d.a_call = calls_a[ia].label.clone();
                d.b_call = calls_b[ib].label.clone();
                let op = &ma.ops[pair.a.0];
                if let Some(why) = bindings_differ(ma, mb, &calls_a[ia].args, &calls_b[ib].args, &sh.va, &sh.vb) {
                    d.skipped = Some(why);
                    continue;
                }
                let uses_state = calls_a[ia].args.iter().any(|b| matches!(b, Binding::State(_)));
                for (di, dist) in Dist::ALL.iter().enumerate() {
                    // Inputs: every float buffer the call reads (not the step ABI's arrays,
                    // which index memory), the same bytes on both sides; outputs poisoned
                    // (0xff: NaN) on both.
                    for (j, p) in op.params.iter().enumerate() {
                        let (Binding::Buf(xa), Binding::Buf(xb)) = (&calls_a[ia].args[j], &calls_b[ib].args[j]) else { continue };
                        let buf = &ma.buffers[xa.0];
                        let reads = match p {
                            OpParam::Buffer { access, .. } => access.reads(),
                            OpParam::Ptr => true,
                            _ => false,
                        };
                        if reads && !is_step_input(ma, *xa) && numeric::is_float(buf.dtype) {
                            let n = (ma.buffer_bytes(*xa, &sh.va).map_err(|e| e.to_string())? / buf.dtype.size()) as usize;
                            // Drawn once per (size, dtype, distribution, parameter) and kept
                            // (weights keep their size across shapes), up to 4 GiB.
                            let key = (n, buf.dtype.size() as u8, DistKey(di, j, buf.dtype.name()));
                            if !cache.contains_key(&key) {
                                if cache_bytes > 4 << 30 {
                                    cache.clear();
                                    cache_bytes = 0;
                                }
                                let seed = self.opts.seed ^ ((di as u64) << 32) ^ (j as u64) << 48;
                                let bytes = tiled(*dist, n, buf.dtype, seed)?;
                                cache_bytes += bytes.len();
                                cache.insert(key.clone(), bytes);
                            }
                            let bytes = &cache[&key];
                            self.a.write_buffer(*xa, bytes).map_err(|e| rt_err("A", e))?;
                            self.b.write_buffer(*xb, bytes).map_err(|e| rt_err("B", e))?;
                        } else if let OpParam::Buffer { access: kern_manifest::Access::Out, .. } = p {
                            self.a.fill_buffer(*xa, 0xff).map_err(|e| rt_err("A", e))?;
                            self.b.fill_buffer(*xb, 0xff).map_err(|e| rt_err("B", e))?;
                        }
                    }
                    if uses_state {
                        for &(sa, sb) in &self.states {
                            self.b.copy_state_from(sb, &self.a, sa).map_err(|e| rt_err("B", e))?;
                        }
                    }
                    self.a.run_calls(0, &sh.va, ia..ia + 1, true).map_err(|e| format!("kernel diff of op `{}` ({}, {}): A: {e}", pair.name, sh.name, dist.name()))?;
                    self.b.run_calls(0, &sh.vb, ib..ib + 1, true).map_err(|e| format!("kernel diff of op `{}` ({}, {}): B: {e}", pair.name, sh.name, dist.name()))?;
                    for (j, p) in op.params.iter().enumerate() {
                        let OpParam::Buffer { access, dtype } = p else { continue };
                        if !access.writes() {
                            continue;
                        }
                        let (Binding::Buf(xa), Binding::Buf(xb)) = (&calls_a[ia].args[j], &calls_b[ib].args[j]) else { continue };
                        let len = ma.buffer_bytes(*xa, &sh.va).map_err(|e| e.to_string())? as usize;
                        let ra = self.a.read_buffer(*xa, len).map_err(|e| rt_err("A", e))?;
                        let rb = self.b.read_buffer(*xb, len).map_err(|e| rt_err("B", e))?;
                        let stats = compare(&ra, &rb, *dtype, &Tolerance::default_for(*dtype));
                        let check = Check { shape: sh.name.clone(), dist: dist.name().into(), output: format!("#{j} `{}`", ma.buffers[xa.0].name), stats };
                        d.checks += 1;
                        if !check.stats.pass {
                            d.failures += 1;
                            if d.first_failure.is_none() {
                                d.first_failure = Some(check.clone());
                            }
                        }
                        if check.stats.max_ulp > 0 && d.worst.as_ref().is_none_or(|w| check.stats.max_rel > w.stats.max_rel) {
                            d.worst = Some(check);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    // -------------------------------------------------------------------------- precision

    fn precision(&mut self, report: &mut Report) -> Result<Vec<Shape>, String> {
        let mut prec = Precision::default();
        let mut perf_shapes = Vec::new();
        let mut logit_parts: Vec<LogitStats> = Vec::new();
        let shapes: Vec<Shape>;
        let mut sched = None;
        if self.a.manifest.step.is_some() {
            let mut s = self.scheduler();
            let mc = self.max_context().saturating_sub(self.opts.decode_steps + 2).max(1);
            for (k, &l) in PROMPTS.iter().take(self.max_seqs).enumerate() {
                let params = SamplingParams { max_tokens: self.opts.decode_steps + 1, ignore_eos: true, ..Default::default() };
                s.add(self.prompt(l.min(mc), k), params).map_err(|e| format!("the scenario's prompt {k}: {e}"))?;
            }
            sched = Some(s);
            shapes = vec![];
        } else {
            shapes = vec![Shape { name: "run".into(), step: None, va: self.vars(&self.a.manifest, &[]), vb: self.vars(&self.b.manifest, &[]) }];
        }
        let (mut golden_prefill, mut golden_decode) = (false, false);
        let mut k = 0usize;
        let mut decode_no = 0usize;
        loop {
            let sh = match &mut sched {
                Some(s) => {
                    let Some(st) = s.schedule(|t, q, _| (t, q)) else { break };
                    let name = if st.is_decode() {
                        decode_no += 1;
                        format!("decode {decode_no} ({} seqs)", st.real_seqs)
                    } else {
                        format!("prefill {} seqs / {} tokens", st.real_seqs, st.real_tokens)
                    };
                    self.step_shape(name, st)
                }
                None => match shapes.get(k) {
                    Some(s) => s.clone(),
                    None => break,
                },
            };
            k += 1;
            let decode = sh.step.as_ref().is_some_and(|s| s.is_decode());
            let golden = if decode { !std::mem::replace(&mut golden_decode, true) } else { !std::mem::replace(&mut golden_prefill, true) };
            if golden {
                perf_shapes.push(sh.clone());
            }
            self.upload(&sh)?;
            let mut sp = StepPrecision { step: sh.name.clone(), tokens: sh.step.as_ref().map_or(0, |s| s.real_tokens), seqs: sh.step.as_ref().map_or(0, |s| s.real_seqs), ..Default::default() };
            if golden {
                self.intervals(&sh, &mut sp)?;
            } else {
                let (na, nb) = (self.an.calls_a.len(), self.an.calls_b.len());
                self.a.run_calls(0, &sh.va, 0..na, false).map_err(|e| rt_err(&format!("A, {}", sh.name), e))?;
                self.b.run_calls(0, &sh.vb, 0..nb, false).map_err(|e| rt_err(&format!("B, {}", sh.name), e))?;
            }
            // Outputs of the step: sampled tokens and logits.
            let mut sampled_a = Vec::new();
            if let (Some(st), Some(abi_a), Some(abi_b)) = (&sh.step, &self.a.manifest.step, &self.b.manifest.step) {
                let ra = read_i32(&self.a, abi_a.sampled, st.real_seqs).map_err(|e| rt_err("A", e))?;
                let rb = read_i32(&self.b, abi_b.sampled, st.real_seqs).map_err(|e| rt_err("B", e))?;
                let mut la = None;
                if let (Some(ba), Some(bb)) = (abi_a.logits, abi_b.logits) {
                    let n = st.real_seqs * self.vocab;
                    let fa = read_f32(&self.a, ba, n).map_err(|e| rt_err("A", e))?;
                    let fb = read_f32(&self.b, bb, n).map_err(|e| rt_err("B", e))?;
                    let ls = numeric::logit_stats(&fa, &fb, self.vocab);
                    sp.logits = Some(ls.clone());
                    logit_parts.push(ls);
                    la = Some((fa, fb));
                }
                sp.sampled = ra.len();
                sp.sampled_agree = ra.iter().zip(&rb).filter(|(x, y)| x == y).count();
                prec.greedy_positions += ra.len();
                prec.greedy_agree += sp.sampled_agree;
                if prec.greedy_first_disagreement.is_none() {
                    if let Some(q) = ra.iter().zip(&rb).position(|(x, y)| x != y) {
                        let extra = la.as_ref().map_or(String::new(), |(fa, fb)| {
                            let v = self.vocab;
                            let (ta, tb) = (numeric::top_k(&fa[q * v..(q + 1) * v], 5), numeric::top_k(&fb[q * v..(q + 1) * v], 5));
                            format!(" (A's token in B's top 5: {}, B's in A's: {})", tb.contains(&(ra[q] as usize)), ta.contains(&(rb[q] as usize)))
                        });
                        prec.greedy_first_disagreement = Some(format!("at {}, sequence {q}: A {} vs B {}{extra}", sh.name, ra[q], rb[q]));
                    }
                }
                sampled_a = ra;
            }
            prec.steps.push(sp);
            if let (Some(s), Some(st)) = (&mut sched, &sh.step) {
                // Teacher forcing: both sides continue with A's tokens.
                let toks: Vec<i32> = sampled_a.iter().map(|&t| t.clamp(0, self.vocab as i32 - 1)).collect();
                s.commit(st, &toks);
            }
        }
        if !logit_parts.is_empty() {
            let l = numeric::merge_logit_stats(&logit_parts);
            if l.kl_mean > self.opts.kl_mean_max {
                prec.logit_failures.push(format!("mean KL divergence {:.3e} > {:.1e} (--kl-mean)", l.kl_mean, self.opts.kl_mean_max));
            }
            if l.top5_violations > 0 {
                prec.logit_failures.push(format!("{} position(s) where one side's top token is not in the other's top 5", l.top5_violations));
            }
            prec.logits = Some(l);
        }
        report.precision = Some(prec);
        Ok(perf_shapes)
    }

    /// Reads the common buffer `c` of both sides at the shape's var values.
    fn read_common(&self, c: usize, sh: &Shape) -> Result<(Vec<u8>, Vec<u8>), String> {
        let cm = &self.an.commons[c];
        let len = self.a.manifest.buffer_bytes(cm.a, &sh.va).map_err(|e| e.to_string())? as usize;
        let ra = self.a.read_buffer(cm.a, len).map_err(|e| rt_err("A", e))?;
        let rb = self.b.read_buffer(cm.b, len).map_err(|e| rt_err("B", e))?;
        Ok((ra, rb))
    }

    fn divergence(&self, sh: &Shape, k: usize, c: usize, stats: numeric::Stats) -> Divergence {
        let iv = &self.an.matching.intervals[k];
        let ops = |calls: &[crate::matching::CallRw], r: &std::ops::Range<usize>| {
            let mut v: Vec<&str> = calls[r.clone()].iter().map(|c| c.op.as_str()).collect();
            v.dedup();
            v.join(", ")
        };
        Divergence {
            step: sh.name.clone(),
            interval: k,
            a_calls: labels(&self.an.calls_a, &iv.a),
            b_calls: labels(&self.an.calls_b, &iv.b),
            a_ops: ops(&self.an.calls_a, &iv.a),
            b_ops: ops(&self.an.calls_b, &iv.b),
            buffer: self.an.commons[c].name.clone(),
            dtype: self.an.commons[c].dtype.name().into(),
            stats,
        }
    }

    /// One step interval by interval: local (B from A's values at each entry), then B
    /// free-running against A's values at each sync point.
    fn intervals(&mut self, sh: &Shape, sp: &mut StepPrecision) -> Result<(), String> {
        let mut snaps = Vec::new();
        for &(sa, sb) in &self.states {
            snaps.push(self.b.snapshot_state(sb).map_err(|e| rt_err("B", e))?);
            self.b.copy_state_from(sb, &self.a, sa).map_err(|e| rt_err("B", e))?;
        }
        let ivs = self.an.matching.intervals.clone();
        let mut golden_out: Vec<Vec<(usize, Vec<u8>)>> = Vec::with_capacity(ivs.len());
        for (k, iv) in ivs.iter().enumerate() {
            for &c in &iv.inputs {
                let cm = &self.an.commons[c];
                if matches!(cm.role, Role::Weight | Role::Input) {
                    continue;
                }
                self.b.copy_buffer_from(cm.b, &self.a, cm.a).map_err(|e| rt_err("B", e))?;
            }
            self.a.run_calls(0, &sh.va, iv.a.clone(), false).map_err(|e| format!("A, {}, {}: {e}", sh.name, labels(&self.an.calls_a, &iv.a)))?;
            self.b.run_calls(0, &sh.vb, iv.b.clone(), false).map_err(|e| format!("B, {}, {}: {e}", sh.name, labels(&self.an.calls_b, &iv.b)))?;
            let mut outs = Vec::new();
            let mut failed = false;
            for &c in &iv.outputs {
                let (ra, rb) = self.read_common(c, sh)?;
                let dt = self.an.commons[c].dtype;
                let st = compare(&ra, &rb, dt, &Tolerance::default_for(dt));
                if !st.pass && !failed {
                    failed = true;
                    if sp.first_local.is_none() {
                        sp.first_local = Some(self.divergence(sh, k, c, st));
                    }
                }
                outs.push((c, ra));
            }
            sp.local_checked += 1;
            sp.local_failures += usize::from(failed);
            golden_out.push(outs);
        }
        // B free-running from its own state.
        for (&(_, sb), snap) in self.states.iter().zip(&snaps) {
            if let Some(s) = snap {
                self.b.restore_state(sb, s).map_err(|e| rt_err("B", e))?;
            }
        }
        for (k, iv) in ivs.iter().enumerate() {
            self.b.run_calls(0, &sh.vb, iv.b.clone(), false).map_err(|e| format!("B, {}, {}: {e}", sh.name, labels(&self.an.calls_b, &iv.b)))?;
            if sp.first_drift.is_some() {
                continue;
            }
            for (c, ra) in &golden_out[k] {
                let cm = &self.an.commons[*c];
                let rb = self.b.read_buffer(cm.b, ra.len()).map_err(|e| rt_err("B", e))?;
                let st = compare(ra, &rb, cm.dtype, &Tolerance::default_for(cm.dtype));
                if !st.pass {
                    sp.first_drift = Some(self.divergence(sh, k, *c, st));
                    break;
                }
            }
        }
        Ok(())
    }

    // -------------------------------------------------------------------------- performance

    fn perf(&mut self, shapes: &[Shape]) -> Result<Perf, String> {
        const FLUSH: usize = 256 << 20;
        let flush = match self.a.context().alloc(FLUSH) {
            Ok(b) => Some(b),
            Err(e) => {
                self.notes.push(format!("no L2 flush buffer ({e}): timings are warm"));
                None
            }
        };
        let reps = self.opts.perf_reps.max(3);
        let thr = self.opts.perf_threshold;
        let floor = 0.002;
        let mut perf = Perf { threshold: thr, reps, l2_flush_bytes: flush.as_ref().map_or(0, |_| FLUSH), steps: vec![] };
        let ivs = self.an.matching.intervals.clone();
        for sh in shapes {
            self.upload(sh)?;
            let time = |rt: &Runtime, vars: &[i64], r: std::ops::Range<usize>| -> Result<f64, String> { rt.time_calls(0, vars, r, flush.as_ref()).map(f64::from).map_err(|e| e.to_string()) };
            let mut rows = Vec::new();
            for iv in &ivs {
                for _ in 0..2 {
                    time(&self.a, &sh.va, iv.a.clone())?;
                    time(&self.b, &sh.vb, iv.b.clone())?;
                }
                let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
                for _ in 0..reps {
                    ta.push(time(&self.a, &sh.va, iv.a.clone())?);
                    tb.push(time(&self.b, &sh.vb, iv.b.clone())?);
                }
                let (a, b) = (Timing::of(&ta), Timing::of(&tb));
                rows.push((a, b));
            }
            // The whole step: eagerly with a cold L2, and as a CUDA graph for decode steps
            // whose sizes are their own bucket (what the engine replays).
            let (na, nb) = (self.an.calls_a.len(), self.an.calls_b.len());
            let (mut ta, mut tb) = (Vec::new(), Vec::new());
            for i in 0..reps + 2 {
                let (x, y) = (time(&self.a, &sh.va, 0..na)?, time(&self.b, &sh.vb, 0..nb)?);
                if i >= 2 {
                    ta.push(x);
                    tb.push(y);
                }
            }
            let (wa, wb) = (Timing::of(&ta), Timing::of(&tb));
            let mut step = StepPerf {
                step: sh.name.clone(),
                whole: PerfRow { name: "whole step (eager)".into(), a: wa, b: wb, class: classify(&wa, &wb, thr, floor) },
                by_op: vec![],
                flagged: vec![],
                intervals_timed: rows.len(),
            };
            let decode = sh.step.as_ref().is_some_and(|s| s.is_decode());
            if decode && self.a.bucket(&sh.va) == sh.va && self.b.bucket(&sh.vb) == sh.vb {
                let (mut ga, mut gb) = (Vec::new(), Vec::new());
                for i in 0..reps + 2 {
                    let x = self.a.run(0, &sh.va, Mode::Graph).map_err(|e| rt_err("A", e))?.gpu_ms as f64;
                    let y = self.b.run(0, &sh.vb, Mode::Graph).map_err(|e| rt_err("B", e))?.gpu_ms as f64;
                    if i >= 2 {
                        ga.push(x);
                        gb.push(y);
                    }
                }
                let (a, b) = (Timing::of(&ga), Timing::of(&gb));
                step.by_op.push(PerfRow { name: "whole step (CUDA graph, warm)".into(), a, b, class: classify(&a, &b, thr, floor) });
            }
            // Per op (1:1 intervals of one op) and per fusion / split.
            let mut by: Vec<(String, f64, f64)> = Vec::new();
            for (iv, (a, b)) in ivs.iter().zip(&rows) {
                let oa: Vec<&str> = self.an.calls_a[iv.a.clone()].iter().map(|c| c.op.as_str()).collect();
                let ob: Vec<&str> = self.an.calls_b[iv.b.clone()].iter().map(|c| c.op.as_str()).collect();
                let name = if oa == ob && oa.len() == 1 { oa[0].to_string() } else { format!("{} ↔ {}", oa.join("+"), ob.join("+")) };
                match by.iter_mut().find(|x| x.0 == name) {
                    Some(x) => {
                        x.1 += a.median;
                        x.2 += b.median;
                    }
                    None => by.push((name, a.median, b.median)),
                }
            }
            for (name, a, b) in by {
                let (ta, tb) = (Timing { median: a, q1: a, q3: a, samples: 1 }, Timing { median: b, q1: b, q3: b, samples: 1 });
                // Sums of medians carry no spread: classify by the threshold alone.
                let class = if (b - a).abs() <= thr * a || (b - a).abs() < floor {
                    PerfClass::Same
                } else if b > a {
                    PerfClass::Slower
                } else {
                    PerfClass::Faster
                };
                step.by_op.push(PerfRow { name, a: ta, b: tb, class });
            }
            let mut flagged: Vec<(f64, PerfRow)> = Vec::new();
            for (k, (iv, (a, b))) in ivs.iter().zip(&rows).enumerate() {
                let class = classify(a, b, thr, floor);
                if matches!(class, PerfClass::Slower | PerfClass::Faster) {
                    let name = format!("#{k} {} ↔ {}", labels(&self.an.calls_a, &iv.a), labels(&self.an.calls_b, &iv.b));
                    flagged.push(((b.median - a.median).abs(), PerfRow { name, a: *a, b: *b, class }));
                }
            }
            flagged.sort_by(|x, y| y.0.total_cmp(&x.0));
            step.flagged = flagged.into_iter().take(10).map(|x| x.1).collect();
            perf.steps.push(step);
        }
        Ok(perf)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DistKey(usize, usize, &'static str);

/// `n` elements of `dist` as `dtype` bytes; above 2^20 elements a block of 2^20 values is
/// repeated (weights of a vocabulary-sized table would otherwise take minutes to draw).
fn tiled(dist: Dist, n: usize, dtype: kern_manifest::DType, seed: u64) -> Result<Vec<u8>, String> {
    const BLOCK: usize = 1 << 20;
    let m = n.min(BLOCK);
    let block = encode(&Values::F64(dist.values(m, dtype, seed)), dtype)?;
    if m == n {
        return Ok(block);
    }
    let mut out = Vec::with_capacity(n * dtype.size() as usize);
    while out.len() + block.len() <= n * dtype.size() as usize {
        out.extend_from_slice(&block);
    }
    let rest = n * dtype.size() as usize - out.len();
    out.extend_from_slice(&block[..rest]);
    Ok(out)
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Why the two calls cannot run on identical inputs (None: they can).
fn bindings_differ(ma: &Manifest, mb: &Manifest, a: &[Binding], b: &[Binding], va: &[i64], vb: &[i64]) -> Option<String> {
    for (j, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = match (x, y) {
            (Binding::Buf(p), Binding::Buf(q)) => {
                let (sa, sb) = (ma.buffer_bytes(*p, va).ok(), mb.buffer_bytes(*q, vb).ok());
                if sa != sb || sa.is_none() {
                    return Some(format!("parameter {j}: A binds `{}` ({sa:?} bytes), B `{}` ({sb:?} bytes)", ma.buffers[p.0].name, mb.buffers[q.0].name));
                }
                true
            }
            (Binding::Var(p), Binding::Var(q)) => ma.vars[p.0].name == mb.vars[q.0].name,
            (Binding::Const(p), Binding::Const(q)) => p == q,
            (Binding::State(p), Binding::State(q)) => ma.states[p.0].name == mb.states[q.0].name,
            (Binding::Null, Binding::Null) => true,
            _ => false,
        };
        if !ok {
            return Some(format!("parameter {j}: A's call binds {x:?}, B's {y:?}"));
        }
    }
    None
}

/// Whether `b` is one of the arrays the step ABI binds (token ids, positions, block tables,
/// sampling parameters…): they come from the scheduler, never from a distribution.
fn is_step_input(m: &Manifest, b: BufferId) -> bool {
    let Some(s) = &m.step else { return false };
    let mut ids = vec![s.token_ids, s.positions, s.seq_lens, s.query_start, s.slot_mapping, s.block_tables, s.last_token];
    if let Some(sm) = &s.sampling {
        ids.extend([sm.temperature, sm.top_k, sm.top_p, sm.seeds]);
    }
    ids.contains(&b)
}

fn upload_step(rt: &Runtime, s: &StepAbi, st: &Step) -> Result<(), RuntimeError> {
    let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    rt.write_buffer(s.token_ids, &i32s(&st.token_ids))?;
    rt.write_buffer(s.positions, &i32s(&st.positions))?;
    rt.write_buffer(s.seq_lens, &i32s(&st.seq_lens))?;
    rt.write_buffer(s.query_start, &i32s(&st.query_start))?;
    rt.write_buffer(s.slot_mapping, &i32s(&st.slot_mapping))?;
    rt.write_buffer(s.block_tables, &i32s(&st.block_tables))?;
    rt.write_buffer(s.last_token, &i32s(&st.last_token))?;
    if let Some(sm) = &s.sampling {
        rt.write_buffer(sm.temperature, &f32s(&st.temperature))?;
        rt.write_buffer(sm.top_k, &i32s(&st.top_k))?;
        rt.write_buffer(sm.top_p, &f32s(&st.top_p))?;
        rt.write_buffer(sm.seeds, &st.seeds.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    }
    Ok(())
}

fn read_i32(rt: &Runtime, b: BufferId, n: usize) -> Result<Vec<i32>, RuntimeError> {
    Ok(rt.read_buffer(b, n * 4)?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn read_f32(rt: &Runtime, b: BufferId, n: usize) -> Result<Vec<f32>, RuntimeError> {
    Ok(rt.read_buffer(b, n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kern_manifest::DType;

    #[test]
    fn tiled_inputs_repeat_one_block_to_any_length() {
        let small = tiled(Dist::Normal, 1000, DType::Bf16, 3).unwrap();
        assert_eq!(small.len(), 2000);
        let n = (1 << 20) * 2 + 7;
        let big = tiled(Dist::Normal, n, DType::F32, 3).unwrap();
        assert_eq!(big.len(), n * 4);
        assert_eq!(big[..16], big[(1 << 20) * 4..(1 << 20) * 4 + 16]);
        assert_eq!(big[n * 4 - 28..], big[..28], "the tail is the block's start");
        assert_ne!(tiled(Dist::Normal, 64, DType::F32, 3).unwrap(), tiled(Dist::Normal, 64, DType::F32, 4).unwrap());
    }

    #[test]
    fn name_hashes_differ() {
        assert_ne!(name_hash("A"), name_hash("B"));
        assert_eq!(name_hash("x"), name_hash("x"));
    }
}
