//! The GPU part of `kern test`: both manifests loaded onto one device (two runtimes in one
//! context), the kernel diff, the precision diff over a scheduled multi-sequence scenario, and
//! the performance diff. Everything it measures goes into the [`Report`]; the judging is done by
//! the pure modules ([`crate::numeric`], [`crate::report`]).

use crate::matching::labels;
use crate::traffic;
use crate::numeric::{self, classify, Dist, LogitStats, PerfClass, Timing, Tolerance};
use crate::pairing::{self, Analysis, Incomparable};
use crate::report::{Check, Divergence, IntervalPair, MatchSummary, OpDiff, Perf, PerfRow, Precision, Report, StepPerf, StepPrecision};
use kern_manifest::manifest::{Binding, BufferId, Manifest, StateId, Step as StepAbi};
use kern_manifest::{OpParam, Role, StateSize};
use kern_runtime::data::{encode, Values};
use kern_runtime::plan::{self, MemoryPlan, PlanOptions};
use kern_runtime::{Mode, Runtime, RuntimeError};
use kern_sched::{BlockManager, SamplingParams, Scheduler, SchedulerConfig, Step};
use std::collections::HashMap;

mod floor;
mod kernel;
mod options;
mod perf;
mod precision;
mod text;

pub use options::{Options, PrecisionOptions};
pub use text::parse_token_ids;

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
    /// Precision mode's text to score.
    scoring: Option<text::TextPlan>,
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
        let scoring = match (&opts.precision, &ma.step) {
            (Some(p), Some(_)) => Some(text::plan(p, &tok_dir, vocab, max_context, max_seqs, opts.seed, &mut notes)?),
            _ => None,
        };
        if let Some(t) = &scoring {
            pages = pages.max(t.pages(page_tokens) + 2);
        }
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
        Ok(Session { a, b, an, opts, states, notes, weights, pages, page_tokens, pages_per_seq, chunk, max_seqs, vocab, base, text, scoring })
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
        if let Some(p) = &self.opts.precision {
            report.precision_mode = true;
            let score = self.score_text()?;
            let prec = report.precision.clone().unwrap_or_default();
            let mut budget = crate::precision::budget(p.gates, &prec, score);
            if let Some(path) = &p.plot {
                let rows = crate::precision::layer_rows(&prec);
                let title = format!("{} vs {}: error through the layers", self.opts.b.display(), self.opts.a.display());
                match std::fs::write(path, crate::precision::plot(&rows, &title).to_svg()) {
                    Ok(()) => budget.plot = Some(path.display().to_string()),
                    Err(e) => self.notes.push(format!("the plot {}: {e}", path.display())),
                }
            }
            report.budget = Some(budget);
        }
        if self.opts.perf {
            report.perf = Some(self.perf(&perf_shapes)?);
        }
        Ok(())
    }
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
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

/// The row length of buffer `b` at `vars` (its last dimension; 0 for a vector): the blocks of
/// the bias statistics.
fn row_len(m: &Manifest, b: BufferId, vars: &[i64]) -> usize {
    match m.shape(b, vars) {
        Ok(s) if s.len() >= 2 => s.last().map_or(0, |&d| d.max(0) as usize),
        _ => 0,
    }
}

fn read_f32(rt: &Runtime, b: BufferId, n: usize) -> Result<Vec<f32>, RuntimeError> {
    Ok(rt.read_buffer(b, n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_hashes_differ() {
        assert_ne!(name_hash("A"), name_hash("B"));
        assert_eq!(name_hash("x"), name_hash("x"));
    }
}
