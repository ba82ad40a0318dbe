//! Mixture-of-experts layers (issue 26; Qwen3-MoE first): the router, the token permutation, the
//! grouped expert GEMMs and the weighted combine as manifest buffers, ops and calls. The builder
//! ([`crate::manifest`]) calls in here where it writes a layer's MLP; nothing else in it knows
//! about experts. docs/moe.md has the design, packs/kernels/KERNELS.md ("Mixture of experts")
//! the kernels' contracts.
//!
//! One MoE layer, from the post-attention norm's output `h` [tokens, H] to `mlp` [tokens, H]
//! (transformers' `Qwen3MoeSparseMoeBlock`):
//!
//! | call | op | kernel | writes |
//! |---|---|---|---|
//! | `lL.router` | `moe_router` | the dense GEMMs (`gemm_launches`, N = E) | `moe_logits` [tokens, E] bf16 |
//! | `lL.moe_select` | `moe_select` | `moe_topk` (one warp per token: softmax fp32, top-k, renorm), then `moe_route` (one CTA: counts, offsets, stable permutation); steps of ≤ 64 tokens: both in one launch, `moe_topk_route` | `moe_ids`, `moe_w` [tokens, k]; `moe_offsets` [E+1], `moe_sorted`, `moe_pos` [tokens·k] |
//! | `lL.experts_gate_up` | `moe_gate_up` | `moe_gemm_s` / `moe_gemm_w` (grouped, rows gathered) | `moe_gate_up` [tokens·k, 2I] |
//! | `lL.experts_swiglu` | `moe_swiglu` | rowwise `swiglu` over tokens·k rows | `moe_act` [tokens·k, I] |
//! | `lL.experts_down` | `moe_down` | `moe_gemm_s` / `moe_gemm_w` | `moe_y` [tokens·k, H] |
//! | `lL.moe_combine` | `moe_combine` | `moe_combine` (fixed order: ascending expert id) | `mlp` [tokens, H] |
//!
//! Every grid is a var expression sized for the worst case the router can produce (idle CTAs
//! exit after reading the offsets), so a decode bucket's CUDA graph holds for any routing.

use crate::config::Config;
use crate::manifest::PackOptions;
use serde_json::{json, Map, Value};

/// The module (cubin stem) of the MoE kernels.
pub const MODULE: &str = "moe";
/// The most experts the kernels take (`moe_route`'s shared counters, `moe_topk`'s registers).
pub const MAX_EXPERTS: u64 = 512;
/// The most experts per token (`moe_topk` keeps one per lane).
pub const MAX_TOP_K: u64 = 32;
/// Rows per tile of the small grouped GEMM `moe_gemm_s` (decode and batched decode).
pub const TILE_S: u64 = 16;
/// Rows per tile of the large grouped GEMM `moe_gemm_l` (prefill).
pub const TILE_L: u64 = 64;
/// Output columns per CTA of `moe_gemm_s` / `moe_gemm_l`.
pub const BN_S: u64 = 64;
pub const BN_L: u64 = 128;
/// Dynamic shared memory of `moe_gemm_l` (moe.cu's `MoeGemmSmem<64, 128, 2, 3>`: 3 stages of a
/// 64 × 64 x tile and a 128 × 64 weight tile, bf16, then the per-expert tile ends and the
/// tile's 64 row indices; KERNELS.md).
pub const SMEM_L: u64 = 3 * (64 + 128) * 64 * 2 + MAX_EXPERTS * 4 + 64 * 4;
/// Rows per tile and output columns per CTA of the wgmma grouped GEMM `moe_gemm_w` (prefill).
pub const TILE_W: u64 = 128;
pub const BN_W: u64 = 128;
/// Dynamic shared memory of `moe_gemm_w` (moe.cu's MOE_W_SMEM_BYTES + 1024 for its 1024-byte
/// alignment: 4 stages of a 128 × 64 x tile and a 128 × 64 weight tile, bf16, the tile ends, the
/// 128 row indices).
pub const SMEM_W: u64 = 4 * 2 * 128 * 64 * 2 + MAX_EXPERTS * 4 + 128 * 4 + 1024;
/// Steps of at most this many tokens run `moe_gemm_s`, larger ones `moe_gemm_w` (or
/// `moe_gemm_l`, `--moe-gemm mma`). All chain the same k16 steps per output element, so the
/// choice never changes a bit (batch invariance).
pub const SMALL_MAX_TOKENS: u64 = 64;

/// The prefill grouped GEMM (`kern pack --moe-gemm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MoeGemm {
    /// `moe_gemm_w` (the default): wgmma, 128 × 128 tiles.
    #[default]
    Wgmma,
    /// `moe_gemm_l`: mma.sync, 64 × 128 tiles (what every pack ran before `moe_gemm_w`).
    Mma,
}

/// The values `--moe-gemm` takes.
pub const MOE_GEMM_KINDS: &str = "wgmma (the default: moe_gemm_w), mma (moe_gemm_l)";

impl std::str::FromStr for MoeGemm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "wgmma" => Ok(MoeGemm::Wgmma),
            "mma" => Ok(MoeGemm::Mma),
            _ => Err(format!("unknown MoE GEMM `{s}`: supported: {MOE_GEMM_KINDS}")),
        }
    }
}

impl std::fmt::Display for MoeGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MoeGemm::Wgmma => "wgmma",
            MoeGemm::Mma => "mma",
        })
    }
}

/// A model's mixture-of-experts layers (Hugging Face `Qwen3MoeConfig`'s keys).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    /// `num_experts` (E).
    pub num_experts: u64,
    /// `num_experts_per_tok` (k).
    pub top_k: u64,
    /// `moe_intermediate_size`: each expert's SwiGLU width (I).
    pub intermediate: u64,
    /// `norm_topk_prob`: the k probabilities are divided by their sum.
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step`: layer i is MoE when (i + 1) % step == 0 ...
    pub decoder_sparse_step: u64,
    /// ... and i is not in `mlp_only_layers` (those keep the dense MLP of `intermediate_size`).
    pub mlp_only_layers: Vec<u64>,
    /// The checkpoint stores each projection of all experts as one [E, rows, cols] tensor
    /// (GGUF `ffn_{gate,up,down}_exps`) instead of one tensor per expert (Hugging Face
    /// `mlp.experts.E.{gate,up,down}_proj.weight`).
    pub stacked: bool,
    /// Qwen3-Next's shared expert: a SwiGLU of this width that every token runs, scaled by
    /// `sigmoid(shared_expert_gate(x))` and added to the routed experts' sum. 0: none.
    pub shared_intermediate: u64,
}

impl MoeSpec {
    /// Whether layer `l` routes its tokens to experts (transformers' `Qwen3MoeDecoderLayer`).
    pub fn is_moe(&self, l: u64) -> bool {
        !self.mlp_only_layers.contains(&l) && self.num_experts > 0 && self.decoder_sparse_step > 0 && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Whether layer `l` of `cfg` is a mixture-of-experts layer.
pub fn is_moe_layer(cfg: &Config, l: u64) -> bool {
    cfg.moe.as_ref().is_some_and(|m| m.is_moe(l))
}

/// Whether some layer of `cfg` keeps the dense MLP.
fn has_dense_layer(cfg: &Config) -> bool {
    (0..cfg.num_hidden_layers).any(|l| !is_moe_layer(cfg, l))
}

/// What the MoE kernels take (part of [`Config::validate`]).
pub fn validate(cfg: &Config) -> Result<(), String> {
    let Some(m) = &cfg.moe else { return Ok(()) };
    let mut why = vec![];
    if m.num_experts == 0 || m.num_experts > MAX_EXPERTS {
        why.push(format!("num_experts {}: the MoE kernels take 1 to {MAX_EXPERTS} experts", m.num_experts));
    }
    if m.top_k == 0 || m.top_k > MAX_TOP_K || m.top_k > m.num_experts {
        why.push(format!("num_experts_per_tok {}: the router takes 1 to {MAX_TOP_K} experts per token, at most num_experts", m.top_k));
    }
    if m.intermediate == 0 || !m.intermediate.is_multiple_of(8) {
        why.push(format!("moe_intermediate_size {}: a positive multiple of 8 (16-byte loads in the grouped GEMMs)", m.intermediate));
    }
    if m.decoder_sparse_step == 0 {
        why.push("decoder_sparse_step 0: at least 1".into());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

/// The pack options an MoE manifest cannot take yet, every reason.
pub fn check(cfg: &Config, opts: &PackOptions) -> Result<(), String> {
    if cfg.moe.is_none() {
        if opts.router_logits != RouterLogits::Bf16 {
            return Err(format!("--router-logits {}: {} has no mixture-of-experts router (the option is for qwen3_moe and qwen3_next); leave it out", opts.router_logits, cfg.model_type));
        }
        if opts.moe_gemm != MoeGemm::Wgmma {
            return Err(format!("--moe-gemm {}: {} has no mixture-of-experts layer (the option is for qwen3_moe and qwen3_next); leave it out", opts.moe_gemm, cfg.model_type));
        }
        return Ok(());
    }
    let mut why = vec![];
    if opts.tp.is_some_and(|t| t > 1) {
        why.push("--tp: tensor parallelism of the experts is not written yet (docs/moe.md describes expert parallelism)");
    }
    if opts.decode_fusion {
        why.push("--decode-fusion on: the fused decode GEMVs implement the dense MLP only; pack with --decode-fusion off");
    }
    if opts.max_tokens.saturating_mul(cfg.moe.as_ref().map_or(1, |m| m.top_k)) > i32::MAX as u64 / 16 {
        why.push("--max-tokens: tokens × experts per token must fit the kernels' 32-bit row indices");
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", cfg.model_type, why.join("; ")))
    }
}

/// The module the manifest needs besides the builder's (`None` for a dense model).
pub fn module(cfg: &Config) -> Option<&'static str> {
    cfg.moe.as_ref().map(|_| MODULE)
}

fn weight(shape: Value, from: Value) -> Value {
    json!({"dtype": "bf16", "shape": shape, "role": "weight", "from": from})
}

/// Layer `l`'s MoE weights into `b`; false (nothing written) for a dense layer. The router
/// `mlp.gate.weight` [E, H]; the experts' gate and up projections fused per expert into
/// `mlp.experts.gate_up_proj.weight` [E, 2I, H] (expert e's gate rows, then its up rows: the
/// dense `gate_up_proj` layout, E times) and `mlp.experts.down_proj.weight` [E, H, I]. From
/// per-expert tensors the buffers are 2-D ([E·2I, H], [E·H, I]: the same bytes) because a
/// concatenation joins tensors of the buffer's rank; from stacked tensors (GGUF) they are 3-D.
pub fn layer_weights(cfg: &Config, l: u64, b: &mut Map<String, Value>) -> bool {
    let Some(m) = cfg.moe.as_ref().filter(|m| m.is_moe(l)) else { return false };
    let (e, i, h) = (m.num_experts, m.intermediate, cfg.hidden_size);
    let p = format!("model.layers.{l}.mlp");
    b.insert(format!("{p}.gate.weight"), weight(json!([e, h]), json!({"tensor": format!("{p}.gate.weight")})));
    let (gate_up, down) = if m.stacked {
        // Names that the family's GGUF table maps to blk.L.ffn_{gate,up,down}_exps.
        (
            weight(json!([e, 2 * i, h]), json!({"concat": [format!("{p}.experts.gate_proj.weight"), format!("{p}.experts.up_proj.weight")], "axis": 1, "sizes": [i, i]})),
            weight(json!([e, h, i]), json!({"tensor": format!("{p}.experts.down_proj.weight")})),
        )
    } else {
        let gu: Vec<String> = (0..e).flat_map(|x| [format!("{p}.experts.{x}.gate_proj.weight"), format!("{p}.experts.{x}.up_proj.weight")]).collect();
        let dn: Vec<String> = (0..e).map(|x| format!("{p}.experts.{x}.down_proj.weight")).collect();
        (
            weight(json!([e * 2 * i, h]), json!({"concat": gu, "axis": 0, "sizes": vec![i; 2 * e as usize]})),
            weight(json!([e * h, i]), json!({"concat": dn, "axis": 0, "sizes": vec![h; e as usize]})),
        )
    };
    b.insert(format!("{p}.experts.gate_up_proj.weight"), gate_up);
    b.insert(format!("{p}.experts.down_proj.weight"), down);
    if m.shared_intermediate > 0 {
        // Qwen3-Next's shared expert (a SwiGLU every token runs) and its sigmoid gate [1, H].
        let si = m.shared_intermediate;
        b.insert(format!("{p}.shared_expert.gate_up_proj.weight"),
            weight(json!([2 * si, h]), json!({"concat": [format!("{p}.shared_expert.gate_proj.weight"), format!("{p}.shared_expert.up_proj.weight")], "axis": 0, "sizes": [si, si]})));
        b.insert(format!("{p}.shared_expert.down_proj.weight"), weight(json!([h, si]), json!({"tensor": format!("{p}.shared_expert.down_proj.weight")})));
        b.insert(format!("{p}.shared_expert_gate.weight"), weight(json!([1, h]), json!({"tensor": format!("{p}.shared_expert_gate.weight")})));
    }
    true
}

/// 1 when lo <= tokens <= hi (hi None: no upper bound), else 0, as a grid factor.
fn within(lo: u64, hi: Option<u64>) -> String {
    let lower = format!("max(0, min(1, tokens - {}))", lo - 1);
    match hi {
        Some(hi) => format!("{lower} * max(0, min(1, {} - tokens))", hi + 1),
        None => lower,
    }
}

/// The grouped GEMM launches `y[P, N] = A[P, K] · W[e(r)]ᵀ` over the expert-sorted rows (P =
/// tokens·k): `moe_gemm_s` up to [`SMALL_MAX_TOKENS`] tokens, `moe_gemm_l` above (only the
/// ranges the var reaches). `gather`: A's row r is x's row `moe_sorted[r] / k` (the gate-up
/// GEMM reads h in token order), else row r itself (the down GEMM reads the sorted act).
fn grouped_gemm(m: &crate::moe::MoeSpec, n: u64, k: u64, gather: bool, max_tokens: u64, large: MoeGemm) -> Vec<Value> {
    let (e, topk) = (m.num_experts, m.top_k);
    let launch = |entry: &str, tile: u64, bn: u64, shared: u64, gate: String| {
        let block = if entry == "moe_gemm_w" { 256 } else { 128 };
        // The worst case of Σ_e ceil(count_e / tile): floor(P / tile) + min(E, P).
        json!({"module": MODULE, "entry": entry,
               "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<i32>", "in buffer<i32>", "i32", "i32", "i32", "i32", "i32", "i32"],
               "block": [block], "grid": [format!("(tokens * {topk} / {tile} + min({e}, tokens * {topk})) * {gate}"), format!("ceil({n}/{bn})")], "shared": shared,
               "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"i32": n}, {"i32": k}, {"i32": e}, {"i32": topk}, {"i32": i32::from(gather)}]})
    };
    let mut out = vec![launch("moe_gemm_s", TILE_S, BN_S, 0, within(1, Some(SMALL_MAX_TOKENS)))];
    if max_tokens > SMALL_MAX_TOKENS {
        out.push(match large {
            MoeGemm::Wgmma => launch("moe_gemm_w", TILE_W, BN_W, SMEM_W, within(SMALL_MAX_TOKENS + 1, None)),
            MoeGemm::Mma => launch("moe_gemm_l", TILE_L, BN_L, SMEM_L, within(SMALL_MAX_TOKENS + 1, None)),
        });
    }
    out
}

/// The router logits' dtype (`kern pack --router-logits`): what the router GEMM writes and the
/// top-k reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterLogits {
    /// bf16 (the default): as transformers' bf16 model computes them (`F.linear` in bf16), so
    /// kern picks the experts its bf16 reference picks.
    #[default]
    Bf16,
    /// fp32: the router GEMM's `_f32out` entries and `moe_topk_f32` / `moe_topk_route_f32`. The
    /// experts are then the ones the fp32 logits pick: where two logits round to a tie or swap in
    /// bf16 (a random router: 6% of tokens at E = 512, top-10, in the host emulation), the choice
    /// follows the unrounded values, as an fp32 reference's does.
    F32,
}

/// The values `--router-logits` takes, for error messages and help.
pub const ROUTER_LOGITS_KINDS: &str = "bf16 (the default), f32";

impl std::str::FromStr for RouterLogits {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" => Ok(RouterLogits::Bf16),
            "f32" => Ok(RouterLogits::F32),
            _ => Err(format!("unknown router logits dtype `{s}`: supported: {ROUTER_LOGITS_KINDS}")),
        }
    }
}

impl std::fmt::Display for RouterLogits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouterLogits::Bf16 => "bf16",
            RouterLogits::F32 => "f32",
        })
    }
}

/// The MoE activations and ops into `b` and `ops` (nothing for a dense model). `gemm(n, k)` is
/// the builder's dense GEMM launches for an [n, k] weight at `tokens` rows, with fp32 output when
/// the bool is set (the router's, with `--router-logits f32`). Without a dense layer the dense
/// MLP's ops are left out (no call would use them).
pub fn extend(cfg: &Config, opts: &PackOptions, b: &mut Map<String, Value>, ops: &mut Value, gemm: impl Fn(u64, u64, bool) -> Vec<Value>) {
    let Some(m) = &cfg.moe else { return };
    let (e, topk, i, h) = (m.num_experts, m.top_k, m.intermediate, cfg.hidden_size);
    let pairs = format!("tokens*{topk}");
    let f32_logits = opts.router_logits == RouterLogits::F32;
    let (ldt, lsfx) = if f32_logits { ("f32", "_f32") } else { ("bf16", "") };
    let logits_in = format!("in buffer<{ldt}>");
    for (name, dtype, shape) in [
        ("moe_logits", ldt, json!(["tokens", e])),
        ("moe_ids", "i32", json!(["tokens", topk])),
        ("moe_w", "f32", json!(["tokens", topk])),
        ("moe_offsets", "i32", json!([e + 1])),
        ("moe_sorted", "i32", json!([pairs])),
        ("moe_pos", "i32", json!([pairs])),
        ("moe_gate_up", "bf16", json!([pairs, 2 * i])),
        ("moe_act", "bf16", json!([pairs, i])),
        ("moe_y", "bf16", json!([pairs, h])),
    ] {
        b.insert(name.into(), json!({"dtype": dtype, "shape": shape}));
    }
    let o = ops.as_object_mut().expect("ops is an object");
    if !has_dense_layer(cfg) {
        for unused in ["gate_up_proj", "down_proj", "swiglu"] {
            o.remove(unused);
        }
        b.remove("gate_up");
        b.remove("act");
    }
    let proj = ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"];
    let router = ["in buffer<bf16>", "in buffer<bf16>", "ptr", if f32_logits { "out buffer<f32>" } else { "out buffer<bf16>" }, "i32"];
    o.insert("moe_router".into(), json!({"params": router, "impl": {"launches": gemm(e, h, f32_logits)}}));
    // Routing: [logits, ids, w, offsets, sorted, pos, tokens]. Flags bit 0: norm_topk_prob. Up to
    // SMALL_MAX_TOKENS tokens one launch does both (moe_topk_route: the same bits, a launch fewer
    // per layer at decode); above, a warp per token, then the one-CTA permutation.
    let flags = i32::from(m.norm_topk_prob);
    let mut select = vec![json!({"module": MODULE, "entry": format!("moe_topk_route{lsfx}"),
        "params": [logits_in, "out buffer<i32>", "out buffer<f32>", "out buffer<i32>", "out buffer<i32>", "out buffer<i32>", "i32", "i32", "i32", "i32"],
        "block": [1024], "grid": [within(1, Some(SMALL_MAX_TOKENS))],
        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"i32": e}, {"i32": topk}, {"i32": flags}]})];
    if opts.max_tokens > SMALL_MAX_TOKENS {
        let large = within(SMALL_MAX_TOKENS + 1, None);
        select.push(json!({"module": MODULE, "entry": format!("moe_topk{lsfx}"),
            "params": [logits_in, "out buffer<i32>", "out buffer<f32>", "i32", "i32", "i32", "i32"],
            "block": [128], "grid": [format!("ceil(tokens/4) * {large}")],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 6}, {"i32": e}, {"i32": topk}, {"i32": flags}]}));
        select.push(json!({"module": MODULE, "entry": "moe_route",
            "params": ["in buffer<i32>", "out buffer<i32>", "out buffer<i32>", "out buffer<i32>", "i32", "i32", "i32"],
            "block": [1024], "grid": [large],
            "args": [{"param": 1}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"i32": e}, {"i32": topk}]}));
    }
    o.insert("moe_select".into(), json!({"params": [logits_in, "out buffer<i32>", "out buffer<f32>", "out buffer<i32>", "out buffer<i32>", "out buffer<i32>", "i32"],
        "impl": {"launches": select}}));
    let grouped = ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<i32>", "in buffer<i32>", "i32"];
    o.insert("moe_gate_up".into(), json!({"params": grouped, "impl": {"launches": grouped_gemm(m, 2 * i, h, true, opts.max_tokens, opts.moe_gemm)}}));
    o.insert("moe_down".into(), json!({"params": grouped, "impl": {"launches": grouped_gemm(m, h, i, false, opts.max_tokens, opts.moe_gemm)}}));
    // rowwise's swiglu over the tokens·k sorted rows: its row bound is the buffer's (the grid
    // stops at the step's rows), so the op needs no count.
    o.insert("moe_swiglu".into(), json!({"params": ["out buffer<bf16>", "in buffer<bf16>"], "impl": {"launches": [{
        "module": "rowwise", "entry": "swiglu", "params": ["out buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
        "block": [256], "grid": [format!("tokens*{topk}")],
        "args": [{"param": 0}, {"param": 1}, {"i32": opts.max_tokens * topk}, {"i32": i}]}]}}));
    // Bit 0 of the flags would add the k terms as transformers' bf16 index_add_ does (a rounding
    // per add); the manifest sums in fp32 and rounds once.
    if m.shared_intermediate > 0 {
        // The shared expert: its own SwiGLU through the dense GEMMs, then gated.cu's
        // shared_expert_gate_add (mlp += bf16(sigmoid(h · w_gate)) · shared).
        let si = m.shared_intermediate;
        for (name, width) in [("shared_gate_up", 2 * si), ("shared_act", si), ("shared_y", h)] {
            b.insert(name.into(), json!({"dtype": "bf16", "shape": ["tokens", width]}));
        }
        o.insert("shared_gate_up".into(), json!({"params": proj, "impl": {"launches": gemm(2 * si, h, false)}}));
        o.insert("shared_down".into(), json!({"params": proj, "impl": {"launches": gemm(h, si, false)}}));
        o.insert("shared_swiglu".into(), json!({"params": ["out buffer<bf16>", "in buffer<bf16>", "i32"], "impl": {"launches": [{
            "module": "rowwise", "entry": "swiglu", "params": ["out buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
            "block": [256], "grid": ["tokens"], "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"i32": si}]}]}}));
        o.insert("shared_gate_add".into(), json!({"params": ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32"], "impl": {"launches": [{
            "module": crate::gdn::GATED_MODULE, "entry": "shared_expert_gate_add",
            "params": ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
            "block": [256], "grid": ["tokens"], "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"i32": h}]}]}}));
    }
    o.insert("moe_combine".into(), json!({"params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<f32>", "in buffer<i32>", "i32"], "impl": {"launches": [{
        "module": MODULE, "entry": "moe_combine",
        "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<f32>", "in buffer<i32>", "i32", "i32", "i32", "i32"],
        "block": [256], "grid": ["tokens"],
        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"i32": h}, {"i32": topk}, {"i32": 0}]}]}}));
}

/// Layer `l`'s MoE calls, from the post-attention norm's output `h` to `mlp` (the buffers the
/// dense MLP reads and writes); with a shared expert, its calls after the routed ones.
pub fn calls(cfg: &Config, l: u64) -> Vec<Value> {
    let buf = |n: &str| json!({"buf": n});
    let tokens = json!({"var": "tokens"});
    let p = format!("model.layers.{l}.mlp");
    let mut out = vec![
        json!({"label": format!("l{l}.router"), "op": "moe_router", "args": [buf("h"), buf(&format!("{p}.gate.weight")), {"null": true}, buf("moe_logits"), tokens]}),
        json!({"label": format!("l{l}.moe_select"), "op": "moe_select",
               "args": [buf("moe_logits"), buf("moe_ids"), buf("moe_w"), buf("moe_offsets"), buf("moe_sorted"), buf("moe_pos"), tokens]}),
        json!({"label": format!("l{l}.experts_gate_up"), "op": "moe_gate_up",
               "args": [buf("h"), buf(&format!("{p}.experts.gate_up_proj.weight")), buf("moe_gate_up"), buf("moe_offsets"), buf("moe_sorted"), tokens]}),
        json!({"label": format!("l{l}.experts_swiglu"), "op": "moe_swiglu", "args": [buf("moe_act"), buf("moe_gate_up")]}),
        json!({"label": format!("l{l}.experts_down"), "op": "moe_down",
               "args": [buf("moe_act"), buf(&format!("{p}.experts.down_proj.weight")), buf("moe_y"), buf("moe_offsets"), buf("moe_sorted"), tokens]}),
        json!({"label": format!("l{l}.moe_combine"), "op": "moe_combine", "args": [buf("mlp"), buf("moe_y"), buf("moe_ids"), buf("moe_w"), buf("moe_pos"), tokens]}),
    ];
    if cfg.moe.as_ref().is_some_and(|m| m.shared_intermediate > 0) {
        out.extend([
            json!({"label": format!("l{l}.shared_gate_up"), "op": "shared_gate_up", "args": [buf("h"), buf(&format!("{p}.shared_expert.gate_up_proj.weight")), {"null": true}, buf("shared_gate_up"), tokens]}),
            json!({"label": format!("l{l}.shared_swiglu"), "op": "shared_swiglu", "args": [buf("shared_act"), buf("shared_gate_up"), tokens]}),
            json!({"label": format!("l{l}.shared_down"), "op": "shared_down", "args": [buf("shared_act"), buf(&format!("{p}.shared_expert.down_proj.weight")), {"null": true}, buf("shared_y"), tokens]}),
            json!({"label": format!("l{l}.shared_gate_add"), "op": "shared_gate_add", "args": [buf("mlp"), buf("shared_y"), buf("h"), buf(&format!("{p}.shared_expert_gate.weight")), tokens]}),
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(step: u64, dense: Vec<u64>) -> MoeSpec {
        MoeSpec { num_experts: 8, top_k: 2, intermediate: 64, norm_topk_prob: true, decoder_sparse_step: step, mlp_only_layers: dense, stacked: false, shared_intermediate: 0 }
    }

    #[test]
    fn layers_are_moe_as_transformers_decides() {
        let m = spec(1, vec![]);
        assert!((0..4).all(|l| m.is_moe(l)));
        let m = spec(2, vec![3]);
        assert_eq!((0..6).map(|l| m.is_moe(l)).collect::<Vec<_>>(), [false, true, false, false, false, true]);
    }

    #[test]
    fn the_grouped_gemm_grid_covers_every_routing() {
        // Σ_e ceil(c_e / tile) over every split of P pairs into E counts is at most
        // floor(P / tile) + min(E, P): the grid's bound (exhaustive for small P, E).
        fn worst(p: u64, e: u64, tile: u64) -> u64 {
            // the most tiles: as many experts as possible with one pair past a tile boundary
            let mut best = 0;
            for used in 1..=e.min(p) {
                // `used` experts, each with c = 1 (mod tile) where possible
                let extra = p - used;
                best = best.max(used + extra / tile);
            }
            best
        }
        for (p, e) in [(1, 8), (8, 8), (64, 128), (512, 128), (4096, 128), (100, 3)] {
            for tile in [TILE_S, TILE_L] {
                assert!(worst(p, e, tile) <= p / tile + e.min(p), "P {p} E {e} tile {tile}");
            }
        }
    }
}
