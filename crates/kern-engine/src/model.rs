//! The boundary between the engine and whatever computes a step: [`Model`]. The real one is
//! [`crate::gpu::GpuModel`] (a manifest's program on a GPU through `kern-runtime`); the other
//! is [`crate::fake::FakeModel`], deterministic and CPU-only, which the engine's and the
//! server's tests run against.

use crate::constraint::TokenMask;
use kern_sched::Step;

/// What the engine needs to know about a model to schedule it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Most new tokens in one step (the step ABI's `tokens` var max).
    pub max_step_tokens: usize,
    /// Most sequences in one step (the `seqs` var max).
    pub max_step_seqs: usize,
    /// Block-table row length (the `pages` var max).
    pub pages_per_seq: usize,
    /// Tokens per KV page.
    pub page_tokens: usize,
    /// Pages in the KV pool.
    pub total_pages: usize,
    /// Rows of the `logits` output (0 when the model has none).
    pub vocab: usize,
    /// Whether the step returns last-position logits on request (needed for logprobs and for
    /// sampling on the host).
    pub logits: bool,
    /// Whether the program samples with temperature / top-k / top-p itself (else it is greedy
    /// only, and sampled requests are sampled on the host from the logits).
    pub gpu_sampling: bool,
    /// Whether the model declares a per-sequence state (one slot per running sequence, e.g. a
    /// recurrent state). The prefix cache then needs snapshots of it
    /// ([`Model::snapshot_slots`]); without them it is off.
    pub per_seq_state: bool,
    /// Draft tokens per verify step of the model's draft program (the manifest's
    /// `speculative.k`); None when the model declares no draft program.
    pub draft_k: Option<usize>,
}

impl ModelInfo {
    /// The longest context a sequence may reach.
    pub fn max_context(&self) -> usize {
        self.pages_per_seq * self.page_tokens
    }
}

/// One step's results, for the real (unpadded) sequences of the step.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// The sampled (or greedy) next token of each real sequence.
    pub sampled: Vec<i32>,
    /// `[real_seqs, vocab]` last-position logits, when they were asked for.
    pub logits: Option<Vec<f32>>,
}

/// A step that failed. A failure is fatal for the engine: GPU faults are sticky, so the
/// requests in flight fail and the process should exit (a supervisor restarts it).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

/// Something that runs steps. Constructed on the engine's thread (a CUDA context is bound to
/// the thread that made it) and used only there.
pub trait Model {
    fn info(&self) -> &ModelInfo;

    /// The padded sizes `(tokens, seqs)` the step is built at (CUDA-graph buckets for decode
    /// steps). The default pads nothing.
    fn pad(&self, tokens: usize, seqs: usize, _decode: bool) -> (usize, usize) {
        (tokens, seqs)
    }

    /// Runs one step; `want_logits` asks for the last-position logits too. The step's snapshot
    /// copies are the model's to make, in order: `step.snapshot_restores` (snapshot slot →
    /// sequence slot) before the program, `step.snapshot_saves` (sequence slot → snapshot slot)
    /// after it, both ordered with the program (on its stream), so a restore reads a snapshot
    /// before a save of the same step reuses its slot, and a save copies what the step left.
    fn step(&mut self, step: &Step, want_logits: bool) -> Result<StepOutput, ModelError>;

    /// Snapshot slots of the per-sequence states (their manifest declares `snapshot`, and the
    /// memory plan gave them memory); 0: the model keeps no snapshots, so a model with a
    /// per-sequence state runs with the prefix cache off.
    fn snapshot_slots(&self) -> usize {
        0
    }

    /// Whether the model applies a [`TokenMask`] before it samples (its manifest binds the step
    /// ABI's `token_mask` and `mask_rows` inputs, and its sampler honours them). Without it the
    /// engine masks on the host, through the `logits` output.
    fn token_mask(&self) -> bool {
        false
    }

    /// Runs one step like [`Model::step`], with `mask` constraining the sampling (given only
    /// when [`Model::token_mask`]); `while_running` is called once the step's work is queued and
    /// before its outputs are waited for, so host work done there overlaps the GPU.
    fn step_with(&mut self, step: &Step, want_logits: bool, mask: Option<&TokenMask>, while_running: &mut dyn FnMut()) -> Result<StepOutput, ModelError> {
        if mask.is_some_and(TokenMask::any) {
            return Err(ModelError("this model applies no token mask (its manifest binds no `token_mask` step input)".into()));
        }
        while_running();
        self.step(step, want_logits)
    }

    /// Runs one step of the draft program (`ModelInfo::draft_k` is set) on its own state;
    /// returns each real row's greedy next token.
    fn draft_step(&mut self, _step: &Step) -> Result<Vec<i32>, ModelError> {
        Err(ModelError("this model declares no draft program (the manifest's `speculative` section)".into()))
    }

    /// Bytes of one KV page over all per-token states; 0 when the model cannot copy pages (no
    /// host tier then).
    fn page_bytes(&self) -> usize {
        0
    }

    /// Allocates host memory for `slots` pages of the host tier.
    fn init_host_tier(&mut self, _slots: usize) -> Result<(), ModelError> {
        Err(ModelError("this model cannot offload KV pages to host memory".into()))
    }

    /// Copies GPU pages to host slots, `(gpu page, host slot)`, after the last step (which
    /// computed them), without delaying the next step; a later step that overwrites one of these
    /// pages waits for its copy.
    fn store_pages(&mut self, _pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        Ok(())
    }

    /// Copies host slots into GPU pages, `(host slot, gpu page)`, before the next step.
    fn restore_pages(&mut self, _pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        Ok(())
    }

    /// Bytes restored from host memory and the GPU time those copies took, so far.
    fn restore_timing(&mut self) -> (u64, f64) {
        (0, 0.0)
    }

    /// GPU time of the last step's program run (CUDA events), when the model measures it.
    fn last_gpu_ms(&self) -> Option<f32> {
        None
    }

    /// Bytes of weights the model reads per step (the memory floor of a decode step).
    fn weight_bytes(&self) -> u64 {
        0
    }

    /// Device-to-device copy bandwidth measured now, GB/s (the floor's denominator).
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        None
    }

    /// Work before the first request (e.g. capturing CUDA graphs); `progress(done, total)`.
    fn warm_up(&mut self, _progress: &mut dyn FnMut(usize, usize)) -> Result<(), ModelError> {
        Ok(())
    }
}
