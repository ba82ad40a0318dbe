//! Gated DeltaNet hybrids (issue 30: Qwen3-Next, Qwen3.5): the linear-attention layers (`gdn.cu`,
//! packs/kernels/KERNELS.md "Gated DeltaNet") and the gated full-attention layers (`gated.cu`) as
//! manifest buffers, ops and calls. The builder ([`crate::manifest`]) calls in here where a layer's
//! token mixer is written; nothing else in it knows about GDN.
//!
//! One GDN layer, from the input norm's output `h` [tokens, H] to `o` [tokens, H]:
//!
//! | call | op | kernel | writes |
//! |---|---|---|---|
//! | `lL.gdn_in_proj` | `gdn_in_proj` | the dense GEMMs (one weight: the layer's projections concatenated) | `gdn_proj` [tokens, conv_dim + Hv·D + 2·Hv] |
//! | `lL.gdn_split` | `gdn_split` | `gdn_split_proj` (gated.cu; Qwen3-Next's per-key-head groups regrouped) | `gdn_qkv` [tokens, conv_dim], `gdn_z` [tokens, Hv·D], `gdn_b`, `gdn_a` [tokens, Hv] |
//! | `lL.gdn_conv` | `gdn_conv` | `gdn_conv_*` | `gdn_y` [tokens, conv_dim] |
//! | `lL.gdn_conv_state` | `gdn_conv_state` | `gdn_conv_state_*` | the conv state |
//! | `lL.gdn_rule` | `gdn_rule` | `gdn_chunk_*` (steps with tokens > seqs) or `gdn_recurrent_*` | `gdn_o` [tokens, Hv·D], the recurrent state |
//! | `lL.gdn_norm` | `gdn_norm` | `gdn_norm_gated` (in place) | `gdn_o` |
//! | `lL.gdn_out_proj` | `gdn_out_proj` | the dense GEMMs | `o` [tokens, H] |
//!
//! A full-attention layer of a hybrid: `q_proj` writes `[q (D) | gate (D)]` per head, so the QKV
//! GEMM's rows are `[Hq × (q | gate) | k | v]`; `qk_norm_rope_gated` (gated.cu) normalizes q and k
//! ((1 + w) norms), rotates their first `rotary_dim` dims (partial RoPE), writes q to `q` and k, v
//! to the KV cache; attention reads `q`; `attn_output_gate` multiplies its output by
//! `sigmoid(gate)` in place before `o_proj`.
//!
//! The state: one `bytes_per_seq` state `gdn` holding every GDN layer's conv and recurrent state
//! (KERNELS.md's slot layout), declared `snapshot` (its bytes are position-independent and
//! self-contained), reached through the step ABI's `seq_slots`.

use crate::config::{Config, LayerType};
use crate::manifest::PackOptions;
use serde_json::{json, Map, Value};

/// The module (cubin stem) of the GDN kernels.
pub const MODULE: &str = "gdn";
/// The module of the gated attention, projection split and shared-expert kernels.
pub const GATED_MODULE: &str = "gated";
/// The head size the GDN kernels are built for (key and value heads).
pub const D: u64 = 128;
/// The conv1d kernel width the GDN kernels are built for.
pub const KW: u64 = 4;
/// Dynamic shared memory of `gdn_chunk_*` (KERNELS.md: `ChunkSmem<128, 32>`).
pub const CHUNK_SMEM: u64 = 165_120;
/// The per-sequence state's name in the manifest.
pub const STATE: &str = "gdn";

/// A hybrid model's linear-attention sizes and its full-attention layers' differences.
#[derive(Clone, Debug, PartialEq)]
pub struct Hybrid {
    /// `linear_num_key_heads` (Hk).
    pub num_k_heads: u64,
    /// `linear_num_value_heads` (Hv, a multiple of Hk).
    pub num_v_heads: u64,
    /// `linear_key_head_dim` (must be [`D`]).
    pub key_head_dim: u64,
    /// `linear_value_head_dim` (must be [`D`]).
    pub value_head_dim: u64,
    /// `linear_conv_kernel_dim` (must be [`KW`]).
    pub conv_kernel: u64,
    /// The full-attention layers' rotated dims: `int(head_dim · partial_rotary_factor)`.
    pub rotary_dim: u64,
    /// `partial_rotary_factor` as the config says it (written back by `to_hf_json`).
    pub partial_rotary_factor: f64,
    /// The projections as Qwen3-Next stores them (`in_proj_qkvz`, `in_proj_ba`, grouped per key
    /// head) instead of Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    pub grouped: bool,
}

impl Hybrid {
    /// Channels of the causal conv: `[q | k | v]` = (2·Hk + Hv)·D.
    pub fn conv_dim(&self) -> u64 {
        (2 * self.num_k_heads + self.num_v_heads) * D
    }
    /// The value width Hv·D (z, the rule's output).
    pub fn value_dim(&self) -> u64 {
        self.num_v_heads * D
    }
    /// The projection GEMM's output width: `[q | k | v | z | b | a]` in some order.
    pub fn proj_dim(&self) -> u64 {
        self.conv_dim() + self.value_dim() + 2 * self.num_v_heads
    }
}

/// The recurrent state's dtype (`kern pack --gdn-state`): the `_f32` or `_bf16` GDN entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdnState {
    /// fp32 (the default; vLLM's and SGLang's recommendation for Qwen3-Next).
    #[default]
    F32,
    /// bf16: half the state, rounded once per step.
    Bf16,
}

/// The values `--gdn-state` takes, for error messages and help.
pub const GDN_STATE_KINDS: &str = "f32 (the default), bf16";

impl std::str::FromStr for GdnState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(GdnState::F32),
            "bf16" => Ok(GdnState::Bf16),
            _ => Err(format!("unknown GDN state dtype `{s}`: supported: {GDN_STATE_KINDS}")),
        }
    }
}

impl std::fmt::Display for GdnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

impl GdnState {
    /// The entries' suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            GdnState::F32 => "f32",
            GdnState::Bf16 => "bf16",
        }
    }
    /// Bytes per element of the recurrent state.
    pub fn bytes(self) -> u64 {
        match self {
            GdnState::F32 => 4,
            GdnState::Bf16 => 2,
        }
    }
}

/// Whether layer `l` is a GDN layer.
pub fn is_linear(cfg: &Config, l: u64) -> bool {
    cfg.layer_type(l) == LayerType::Linear
}

/// The GDN layers before layer `l` (layer `l`'s index in the state).
pub fn linear_index(cfg: &Config, l: u64) -> u64 {
    (0..l).filter(|&i| is_linear(cfg, i)).count() as u64
}

/// The softmax-attention layers before layer `l` (layer `l`'s index in the KV cache).
pub fn attn_index(cfg: &Config, l: u64) -> u64 {
    l - linear_index(cfg, l)
}

/// How many GDN layers `cfg` has.
pub fn linear_layers(cfg: &Config) -> u64 {
    linear_index(cfg, cfg.num_hidden_layers)
}

/// How many softmax-attention layers `cfg` has (the KV cache's layers).
pub fn attn_layers(cfg: &Config) -> u64 {
    cfg.num_hidden_layers - linear_layers(cfg)
}

/// One GDN layer's bytes in a slot (KERNELS.md): the conv state `(KW-1) · conv_dim` bf16, then the
/// recurrent state `Hv · D · D` of the state dtype.
pub fn layer_bytes(h: &Hybrid, state: GdnState) -> u64 {
    (KW - 1) * h.conv_dim() * 2 + h.num_v_heads * D * D * state.bytes()
}

/// The per-sequence state's `bytes_per_seq`: every GDN layer's [`layer_bytes`].
pub fn bytes_per_seq(cfg: &Config, state: GdnState) -> u64 {
    cfg.hybrid.as_ref().map_or(0, |h| linear_layers(cfg) * layer_bytes(h, state))
}

/// The projection output's column that `gdn_split_proj` copies into column `c` of output `part`
/// (0: `gdn_qkv` [q | k | v], 1: `gdn_z`, 2: `gdn_b`, 3: `gdn_a`). Qwen3.5's weight is the four
/// projections concatenated, so its columns are `[qkv | z | b | a]` in order; Qwen3-Next's is
/// `[in_proj_qkvz | in_proj_ba]`, each grouped per key head as transformers'
/// `fix_query_key_value_ordering` reads them: `[q (D), k (D), v (r·D), z (r·D)] × Hk` and
/// `[b (r), a (r)] × Hk` with `r = Hv / Hk`. (gated.cu computes the same map.)
pub fn split_source(h: &Hybrid, part: usize, c: u64) -> u64 {
    let (hk, hv) = (h.num_k_heads, h.num_v_heads);
    let (conv, vd) = (h.conv_dim(), h.value_dim());
    if !h.grouped {
        return match part {
            0 => c,
            1 => conv + c,
            2 => conv + vd + c,
            _ => conv + vd + hv + c,
        };
    }
    let r = hv / hk;
    let gw = 2 * D + 2 * r * D; // one key head's group of in_proj_qkvz
    match part {
        0 => {
            // [all q | all k | all v]
            let (kd, g_of) = (hk * D, |x: u64, w: u64| (x / w, x % w));
            if c < kd {
                let (g, e) = g_of(c, D);
                g * gw + e
            } else if c < 2 * kd {
                let (g, e) = g_of(c - kd, D);
                g * gw + D + e
            } else {
                let (g, e) = g_of(c - 2 * kd, r * D);
                g * gw + 2 * D + e
            }
        }
        1 => {
            let (g, e) = (c / (r * D), c % (r * D));
            g * gw + 2 * D + r * D + e
        }
        _ => {
            // in_proj_ba after in_proj_qkvz: [b (r), a (r)] per key head
            let base = hk * gw;
            let (g, e) = (c / r, c % r);
            base + g * 2 * r + if part == 2 { 0 } else { r } + e
        }
    }
}

/// What the GDN kernels and the gated attention take (part of [`Config::validate`]).
pub fn validate(cfg: &Config) -> Result<(), String> {
    let Some(h) = &cfg.hybrid else {
        if cfg.layer_types.contains(&LayerType::Linear) {
            return Err("layer_types has linear_attention layers but the family has no Gated DeltaNet sizes".into());
        }
        return Ok(());
    };
    let mut why = vec![];
    if h.key_head_dim != D || h.value_head_dim != D {
        why.push(format!(
            "linear_key_head_dim {} / linear_value_head_dim {}: the Gated DeltaNet kernels are built for head dims of {D} only",
            h.key_head_dim, h.value_head_dim
        ));
    }
    if h.conv_kernel != KW {
        why.push(format!("linear_conv_kernel_dim {}: the Gated DeltaNet conv kernel is built for width {KW} only", h.conv_kernel));
    }
    if h.num_k_heads == 0 || h.num_v_heads == 0 || !h.num_v_heads.is_multiple_of(h.num_k_heads) {
        why.push(format!("linear_num_value_heads {} must be a positive multiple of linear_num_key_heads {}", h.num_v_heads, h.num_k_heads));
    }
    let d = cfg.head_dim();
    let e = d / 32;
    let half = h.rotary_dim / 2;
    if h.rotary_dim < 2 * e || h.rotary_dim > d || h.rotary_dim % 2 != 0 || half % e != 0 || !(half / e).is_power_of_two() {
        why.push(format!(
            "partial rotary of {} dims (partial_rotary_factor {}) of head_dim {d}: qk_norm_rope_gated rotates an even number of dims up to head_dim whose half is {e} × a power of two",
            h.rotary_dim, h.partial_rotary_factor
        ));
    }
    if cfg.qkv_bias() || cfg.o_bias {
        why.push("attention biases (the gated attention kernels have none)".to_string());
    }
    if !matches!(cfg.rope_scaling, crate::rope::RopeScaling::None) {
        why.push("rope scaling (qk_norm_rope_gated computes the default RoPE of the rotated dims only)".to_string());
    }
    if cfg.layer_types.contains(&LayerType::Sliding) {
        why.push("sliding-window layers in a hybrid".to_string());
    }
    if cfg.layer_types.len() as u64 != cfg.num_hidden_layers {
        why.push("no layer kinds (layer_types / full_attention_interval)".to_string());
    } else if attn_layers(cfg) == 0 {
        why.push("no full_attention layer (the pack keeps a KV cache for at least one)".to_string());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", cfg.model_type, why.join("; ")))
    }
}

/// The pack options a hybrid manifest cannot take, every reason.
pub fn check(cfg: &Config, opts: &PackOptions) -> Result<(), String> {
    if cfg.hybrid.is_none() {
        return Ok(());
    }
    let mut why = vec![];
    if opts.tp.is_some_and(|t| t > 1) {
        why.push("--tp: tensor parallelism of the Gated DeltaNet layers is not written yet");
    }
    if opts.draft.is_some() {
        why.push("--draft: speculative decoding needs per-token states only (a per-sequence state cannot roll back rejected drafts; docs/step-abi.md)");
    }
    if opts.decode_fusion {
        why.push("--decode-fusion on: the fused decode GEMVs implement softmax-attention blocks only; pack with --decode-fusion off");
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", cfg.model_type, why.join("; ")))
    }
}

/// The modules the manifest needs for `cfg` besides the builder's and MoE's.
pub fn modules(cfg: &Config) -> Vec<&'static str> {
    if cfg.hybrid.is_some() {
        vec![MODULE, GATED_MODULE]
    } else if cfg.moe.as_ref().is_some_and(|m| m.shared_intermediate > 0) {
        vec![GATED_MODULE]
    } else {
        vec![]
    }
}

fn weight(dtype: &str, shape: Value, from: Value) -> Value {
    json!({"dtype": dtype, "shape": shape, "role": "weight", "from": from})
}

/// Layer `l`'s GDN weights into `b` (nothing for an attention layer). The projections become one
/// GEMM weight `linear_attn.in_proj.weight` [conv_dim + Hv·D + 2·Hv, H] (Qwen3-Next: `[in_proj_qkvz
/// | in_proj_ba]`, Qwen3.5: `[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]`); `conv1d.weight`
/// [conv_dim, 1, KW] as it is (the kernel reads `[conv_dim][KW]`); `A_log` and `dt_bias` as fp32.
pub fn layer_weights(cfg: &Config, l: u64, b: &mut Map<String, Value>) -> bool {
    let Some(h) = cfg.hybrid.as_ref().filter(|_| is_linear(cfg, l)) else { return false };
    let p = format!("model.layers.{l}.linear_attn");
    let (hs, hv) = (cfg.hidden_size, h.num_v_heads);
    let proj = if h.grouped {
        json!({"concat": [format!("{p}.in_proj_qkvz.weight"), format!("{p}.in_proj_ba.weight")], "axis": 0,
               "sizes": [h.conv_dim() + h.value_dim(), 2 * hv]})
    } else {
        json!({"concat": [format!("{p}.in_proj_qkv.weight"), format!("{p}.in_proj_z.weight"), format!("{p}.in_proj_b.weight"), format!("{p}.in_proj_a.weight")],
               "axis": 0, "sizes": [h.conv_dim(), h.value_dim(), hv, hv]})
    };
    b.insert(format!("{p}.in_proj.weight"), weight("bf16", json!([h.proj_dim(), hs]), proj));
    b.insert(format!("{p}.conv1d.weight"), weight("bf16", json!([h.conv_dim(), 1, KW]), json!({"tensor": format!("{p}.conv1d.weight")})));
    b.insert(format!("{p}.A_log"), weight("f32", json!([hv]), json!({"tensor": format!("{p}.A_log")})));
    b.insert(format!("{p}.dt_bias"), weight("f32", json!([hv]), json!({"tensor": format!("{p}.dt_bias")})));
    b.insert(format!("{p}.norm.weight"), weight("bf16", json!([D]), json!({"tensor": format!("{p}.norm.weight")})));
    b.insert(format!("{p}.out_proj.weight"), weight("bf16", json!([hs, h.value_dim()]), json!({"tensor": format!("{p}.out_proj.weight")})));
    true
}

/// The GDN activations, ops and the `seq_slots` input into `b` and `ops` (nothing without a
/// hybrid). `gemm(n, k)` is the builder's dense GEMM launches for an [n, k] weight at `tokens` rows.
pub fn extend(cfg: &Config, opts: &PackOptions, b: &mut Map<String, Value>, ops: &mut Value, gemm: impl Fn(u64, u64) -> Vec<Value>) {
    let Some(h) = &cfg.hybrid else { return };
    let (hk, hv, conv, vd) = (h.num_k_heads, h.num_v_heads, h.conv_dim(), h.value_dim());
    b.insert("seq_slots".into(), json!({"dtype": "i32", "shape": ["seqs"], "role": "input"}));
    for (name, width) in [("gdn_proj", h.proj_dim()), ("gdn_qkv", conv), ("gdn_z", vd), ("gdn_b", hv), ("gdn_a", hv), ("gdn_y", conv), ("gdn_o", vd)] {
        b.insert(name.into(), json!({"dtype": "bf16", "shape": ["tokens", width]}));
    }
    let n_layers = linear_layers(cfg);
    let sfx = opts.gdn_state.suffix();
    let o = ops.as_object_mut().expect("ops is an object");
    let proj = ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"];
    o.insert("gdn_in_proj".into(), json!({"params": proj, "impl": {"launches": gemm(h.proj_dim(), cfg.hidden_size)}}));
    o.insert("gdn_out_proj".into(), json!({"params": proj, "impl": {"launches": gemm(cfg.hidden_size, vd)}}));
    o.insert("gdn_split".into(), json!({
        "params": ["out buffer<bf16>", "out buffer<bf16>", "out buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "i32"],
        "impl": {"launches": [{"module": GATED_MODULE, "entry": "gdn_split_proj",
            "params": ["out buffer<bf16>", "out buffer<bf16>", "out buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "i32", "i32", "i32", "i32", "i32", "i32"],
            "block": [256], "grid": ["tokens"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"i32": h.proj_dim()},
                     {"i32": hk}, {"i32": hv}, {"i32": D}, {"i32": i32::from(h.grouped)}]}]}}));
    let seq_in = ["in buffer<i32>", "in buffer<i32>", "in buffer<i32>"];
    // [y, x, w, state, query_start, positions, seq_slots, seqs, tokens, layer]
    o.insert("gdn_conv".into(), json!({
        "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "state", seq_in[0], seq_in[1], seq_in[2], "i32", "i32", "i32"],
        "impl": {"launches": [{"module": MODULE, "entry": format!("gdn_conv_{sfx}"),
            "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "ptr", "in buffer<i32>", "in buffer<i32>", "in buffer<i32>",
                       "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"],
            "block": [128], "grid": [format!("ceil({conv}/1024)"), "ceil(tokens/16)"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"param": 7}, {"param": 8},
                     {"i32": conv}, {"i32": conv}, {"i32": hk}, {"i32": hv}, {"param": 9}, {"i32": n_layers}]}]}}));
    // [x, state, query_start, positions, seq_slots, seqs, layer]
    o.insert("gdn_conv_state".into(), json!({
        "params": ["in buffer<bf16>", "state", seq_in[0], seq_in[1], seq_in[2], "i32", "i32"],
        "impl": {"launches": [{"module": MODULE, "entry": format!("gdn_conv_state_{sfx}"),
            "params": ["in buffer<bf16>", "ptr", "in buffer<i32>", "in buffer<i32>", "in buffer<i32>", "i32", "i32", "i32", "i32", "i32", "i32"],
            "block": [128], "grid": [format!("ceil({conv}/256)"), "seqs"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"i32": conv}, {"i32": hk}, {"i32": hv},
                     {"param": 6}, {"i32": n_layers}]}]}}));
    // [o, y, b, a, A_log, dt_bias, state, query_start, positions, seq_slots, seqs, layer]: the
    // chunked rule for steps with tokens > seqs, the recurrent one otherwise (KERNELS.md: both are
    // right for any rows; the choice is speed).
    let prefill = "max(0, min(1, tokens - seqs))";
    let rule = |entry: &str, grid: Value, block: u64, shared: u64| {
        json!({"module": MODULE, "entry": entry,
            "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<f32>", "in buffer<f32>", "ptr",
                       "in buffer<i32>", "in buffer<i32>", "in buffer<i32>", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"],
            "block": [block], "grid": grid, "shared": shared,
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"param": 7}, {"param": 8},
                     {"param": 9}, {"param": 10}, {"i32": conv}, {"i32": hv}, {"i32": vd}, {"i32": hk}, {"i32": hv}, {"param": 11}, {"i32": n_layers}]})
    };
    let mut launches = vec![];
    if opts.batch_invariant {
        // The recurrent rule at every step size (`--batch-invariant`): it walks a row's tokens
        // in order, so with the fp32 state a token's bits do not depend on where its prompt was
        // cut or on what else is in the step (docs/batch-invariance.md).
        launches.push(rule(&format!("gdn_recurrent_{sfx}"), json!(["seqs", hv, 2]), D, 0));
    } else {
        // A step with tokens > seqs exists only when a step may have more tokens than one.
        if opts.max_tokens > 1 {
            launches.push(rule(&format!("gdn_chunk_{sfx}"), json!([format!("seqs * {prefill}"), hv, 4]), 256, CHUNK_SMEM));
        }
        launches.push(rule(&format!("gdn_recurrent_{sfx}"), json!([format!("seqs * (1 - {prefill})"), hv, 2]), D, 0));
    }
    o.insert("gdn_rule".into(), json!({
        "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<f32>", "in buffer<f32>", "state",
                   seq_in[0], seq_in[1], seq_in[2], "i32", "i32"],
        "impl": {"launches": launches}}));
    // [o (in place), z, w, tokens]
    o.insert("gdn_norm".into(), json!({
        "params": ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32"],
        "impl": {"launches": [{"module": MODULE, "entry": "gdn_norm_gated",
            "params": ["inout buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32", "i32", "i32", "i32", "i32", "f32"],
            "block": [256], "grid": ["tokens", hv.div_ceil(8)],
            "args": [{"param": 0}, {"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"i32": hv}, {"i32": vd}, {"i32": vd}, {"i32": vd},
                     {"f32": cfg.rms_norm_eps}]}]}}));
}

/// Layer `l`'s GDN calls, from the input norm's output `h` to `o` (what attention writes).
pub fn calls(cfg: &Config, l: u64) -> Vec<Value> {
    let buf = |n: &str| json!({"buf": n});
    let var = |n: &str| json!({"var": n});
    let state = json!({"state": STATE});
    let gl = json!({"i32": linear_index(cfg, l)});
    let p = format!("model.layers.{l}.linear_attn");
    let w = |n: &str| buf(&format!("{p}.{n}"));
    let seq = [buf("query_start"), buf("positions"), buf("seq_slots")];
    vec![
        json!({"label": format!("l{l}.gdn_in_proj"), "op": "gdn_in_proj", "args": [buf("h"), w("in_proj.weight"), {"null": true}, buf("gdn_proj"), var("tokens")]}),
        json!({"label": format!("l{l}.gdn_split"), "op": "gdn_split", "args": [buf("gdn_qkv"), buf("gdn_z"), buf("gdn_b"), buf("gdn_a"), buf("gdn_proj"), var("tokens")]}),
        json!({"label": format!("l{l}.gdn_conv"), "op": "gdn_conv",
               "args": [buf("gdn_y"), buf("gdn_qkv"), w("conv1d.weight"), state, seq[0], seq[1], seq[2], var("seqs"), var("tokens"), gl]}),
        json!({"label": format!("l{l}.gdn_conv_state"), "op": "gdn_conv_state",
               "args": [buf("gdn_qkv"), state, seq[0], seq[1], seq[2], var("seqs"), gl]}),
        json!({"label": format!("l{l}.gdn_rule"), "op": "gdn_rule",
               "args": [buf("gdn_o"), buf("gdn_y"), buf("gdn_b"), buf("gdn_a"), w("A_log"), w("dt_bias"), state, seq[0], seq[1], seq[2], var("seqs"), gl]}),
        json!({"label": format!("l{l}.gdn_norm"), "op": "gdn_norm", "args": [buf("gdn_o"), buf("gdn_z"), w("norm.weight"), var("tokens")]}),
        json!({"label": format!("l{l}.gdn_out_proj"), "op": "gdn_out_proj", "args": [buf("gdn_o"), w("out_proj.weight"), {"null": true}, buf("o"), var("tokens")]}),
    ]
}

/// The gated attention's two ops: `qk_norm_rope_gated` [q, qkv, state, q_norm, k_norm, positions,
/// slot_mapping, tokens, layer] for a KV state of `num_layers` layers, and `attn_output_gate`
/// [attn, qkv, tokens]. `qkv_width` = (2·Hq + 2·Hkv)·D; `flags`, `norm_offset` as rope.cu's.
#[allow(clippy::too_many_arguments)]
pub fn gated_attention_ops(cfg: &Config, hq: u64, hkv: u64, d: u64, num_layers: u64, page_tokens: u64, flags: i64, norm_offset: f32) -> (Value, Value) {
    let rot = cfg.hybrid.as_ref().map_or(d, |h| h.rotary_dim);
    let rope = json!({
        "params": ["out buffer<bf16>", "in buffer<bf16>", "state", "in buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<i32>", "i32", "i32"],
        "impl": {"launches": [{"module": GATED_MODULE, "entry": "qk_norm_rope_gated",
            "params": ["out buffer<bf16>", "in buffer<bf16>", "ptr", "in buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<i32>",
                       "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "f32", "f32", "i32", "f32"],
            "block": [256], "grid": ["tokens", (hq + 2 * hkv).div_ceil(8)],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6}, {"param": 7},
                     {"i32": hq}, {"i32": hkv}, {"i32": d}, {"i32": rot}, {"param": 8}, {"i32": num_layers}, {"i32": page_tokens},
                     {"f32": cfg.rope_theta}, {"f32": cfg.rms_norm_eps}, {"i32": flags}, {"f32": norm_offset}]}]}});
    let gate = json!({
        "params": ["inout buffer<bf16>", "in buffer<bf16>", "i32"],
        "impl": {"launches": [{"module": GATED_MODULE, "entry": "attn_output_gate",
            "params": ["inout buffer<bf16>", "in buffer<bf16>", "i32", "i32", "i32", "i32"],
            "block": [256], "grid": ["tokens"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"i32": hq}, {"i32": d}, {"i32": (2 * hq + 2 * hkv) * d}]}]}});
    (rope, gate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid(hk: u64, hv: u64, grouped: bool) -> Hybrid {
        Hybrid { num_k_heads: hk, num_v_heads: hv, key_head_dim: D, value_head_dim: D, conv_kernel: KW, rotary_dim: 64, partial_rotary_factor: 0.25, grouped }
    }

    #[test]
    fn layer_bytes_follow_kernels_md() {
        // Qwen3-Next-80B-A3B: Hk 16, Hv 32 → 2,146,304 bytes per layer (fp32), 1,097,728 (bf16).
        let h = hybrid(16, 32, true);
        assert_eq!(h.conv_dim(), 8192);
        assert_eq!(layer_bytes(&h, GdnState::F32), 2_146_304);
        assert_eq!(layer_bytes(&h, GdnState::Bf16), 1_097_728);
        assert_eq!(36 * layer_bytes(&h, GdnState::F32), 77_266_944);
    }
}
