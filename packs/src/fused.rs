//! The fused decode program's ops (issue 15, `PackOptions::decode_fusion`; packs/kernels/GEMM.md,
//! "Fused decode GEMVs"; KERNELS.md, "Fused decode ops").
//!
//! A decode step of at most [`FUSED_MAX_TOKENS`] tokens (the `gemv_bf16` bucket) runs the
//! RMSNorm inside the QKV and gate-up GEMVs (`gemv_bf16_rms`), the SwiGLU inside the down GEMV
//! and the residual adds in the O and down GEMVs' epilogues (`gemv_bf16_add`,
//! `gemv_bf16_swiglu_add`): 7 launches per layer instead of 10, every value bit-identical to the
//! unfused kernels (rowwise.cu's `rms_norm_f32` / `add_rms_norm_f32` / `swiglu`, then
//! `gemv_bf16`). An op's outputs must not depend on the step size, and larger steps run the
//! unfused kernels, so the ops are cut where both decompositions have a boundary:
//!
//! | op | computes | ≤ 8 tokens | > 8 tokens |
//! |---|---|---|---|
//! | `norm_qkv_proj` | h = rmsnorm(x)·w; qkv = h·Wᵀ (+b) | `gemv_bf16_rms` | `rms_norm_f32`, GEMM |
//! | `o_proj_norm_gate_up` | o = attn·Woᵀ; x += o; h = rmsnorm(x)·w; gate_up = h·Wguᵀ | `gemv_bf16_add`, `gemv_bf16_rms` | GEMM, `add_rms_norm_f32`, GEMM |
//! | `down_proj_norm_qkv` | act = swiglu(gate_up); mlp = act·Wdᵀ; x += mlp; h = rmsnorm(x)·w′; qkv = h·W′ᵀ (+b′) | `gemv_bf16_swiglu_add`, `gemv_bf16_rms` | `swiglu`, GEMM, `add_rms_norm_f32`, GEMM |
//! | `swiglu_down_proj` | act = swiglu(gate_up); mlp = act·Wdᵀ | `gemv_bf16_swiglu` | `swiglu`, GEMM |
//!
//! (w′, W′, b′: the next layer's input norm and QKV.) So steps above 8 tokens launch exactly the
//! unfused program's kernels. The GEMMs of more than 8 rows are `gemm_launches`' (without its
//! GEMV launch), whatever it picks for each range.
//!
//! What the block's Config says picks the entries, never a family name: zero-centred `(off + w)`
//! norms ([`Sizes::norm_off`]) run the `_off` forms (`gemv_bf16_rms_off`, `rms_norm_f32_off`,
//! `add_rms_norm_f32_off`), a GeGLU-tanh MLP ([`Sizes::gelu`]) the `geglu` ones
//! (`gemv_bf16_geglu(_add)`, `geglu_tanh`; the last layer's op is then `geglu_down_proj`).
//!
//! **Sandwich norms** ([`Sizes::sandwich`], Gemma 3: h = x + post_attention_norm(o_proj(attn)),
//! the MLP reads pre_feedforward_norm(h), x = h + post_feedforward_norm(mlp)): the post-norm
//! needs the whole row of its projection's output before the residual add, so the O and down
//! GEMVs keep their plain epilogues and the post-norm, the add and the next pre-norm move into
//! the following GEMV's prologue (`gemv_bf16_postnorm_rms`). Every CTA of that GEMV reads the
//! residual while the CTAs owning each piece write the new one, so the new residual goes to
//! another buffer: the program ping-pongs it between `x` and `x2` (x → x2 in the attention half,
//! x2 → x in the MLP half; the last layer's residual stays in `x2`, where the final norm's
//! gather reads it). Per layer:
//!
//! | op | computes | ≤ t tokens | > t tokens |
//! |---|---|---|---|
//! | `o_proj` (the unfused op) | o = attn·Woᵀ | `gemv_bf16` | `gemv_bf16` / GEMM |
//! | `postnorm_gate_up_proj` | x_out = x_in + post(o); h = pre(x_out); gate_up = h·Wguᵀ | `gemv_bf16_postnorm_rms` | `postnorm_add_rms_norm_f32_off`, `gemv_bf16` / GEMM |
//! | `geglu_down_proj` | act = geglu(gate_up); mlp = act·Wdᵀ | `gemv_bf16_geglu` | `geglu_tanh`, `gemv_bf16` / GEMM |
//! | `postnorm_qkv_proj` | x_out = x_in + post_ff(mlp); h = in′(x_out); qkv = h·W′ᵀ (+b′) | `gemv_bf16_postnorm_rms` | `postnorm_add_rms_norm_f32_off`, `gemv_bf16` / GEMM |
//!
//! (the last layer: `geglu_down_proj`, then the unfused `post_norm` of mlp). t is
//! [`SANDWICH_FUSED_MAX_TOKENS`], or 0 (never fused) for a prologue GEMV of more than
//! [`POSTNORM_MAX_CTAS`] CTAs: measured on the H200, a fused GEMV pays its x operand's work in
//! every CTA and its prologue once per wave, which beats the launches it saves only at one token
//! and one wave (Gemma-3-4B: the QKV and the down fused, the gate-up not). The unfused
//! program's post_norm → add_rms_norm pair is rowwise.cu's `rms_norm_off` → `add_rms_norm_f32_off`;
//! `postnorm_add_rms_norm_f32_off` and `gemv_bf16_postnorm_rms` give their bits (the
//! intermediate o_norm / mlp_norm of a non-last layer is not written).

use serde_json::{json, Map, Value};

/// The most tokens a step may have for the fused GEMVs: the `gemv_bf16` bucket of
/// `gemm_launches` (whose GEMV launch the fused ops replace).
pub const FUSED_MAX_TOKENS: u64 = 8;

/// The norm-prologue GEMV the ops launch. `gemv_bf16_rms_pf` (the same bits, plus an L2 bulk
/// prefetch of the CTA's weight rows issued before its norm prologue) is the experimental
/// alternative `packs/kernels/verify/fused_verify.py` times beside it.
pub const RMS_ENTRY: &str = "gemv_bf16_rms";

/// The model's sizes the fused ops need (one rank's: the fused program is single-GPU).
pub(crate) struct Sizes {
    /// Hidden size (the residual row).
    pub h: u64,
    /// Intermediate size.
    pub i: u64,
    /// QKV output size.
    pub qkv: u64,
    /// Attention output size (the O projection's K).
    pub attn: u64,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// The `tokens` var's maximum.
    pub max_tokens: u64,
    /// Zero-centred norms: `Some(off)` for `bf16((x̂ · r) · (off + w))` (NormKind::Offset), `None`
    /// for `w · bf16(x̂)`.
    pub norm_off: Option<f32>,
    /// A GeGLU-tanh MLP (else SwiGLU).
    pub gelu: bool,
    /// Four norms per block (the sandwich ops; needs `norm_off`).
    pub sandwich: bool,
}

/// 1 when 1 <= tokens <= FUSED_MAX_TOKENS, else 0 (grid factor of the fused launches).
fn small() -> String {
    format!("max(0, min(1, tokens)) * max(0, min(1, {} - tokens))", FUSED_MAX_TOKENS + 1)
}

/// 1 when tokens > FUSED_MAX_TOKENS, else 0 (grid factor of the unfused launches).
fn large() -> String {
    format!("max(0, min(1, tokens - {FUSED_MAX_TOKENS}))")
}

fn p(i: usize) -> Value {
    json!({"param": i})
}

fn null() -> Value {
    json!({"null": true})
}

/// A fused GEMV launch of `gemm_skinny` (gemv_bf16's CTA: 256 threads, ceil(N/16) CTAs).
fn gemv(entry: &str, params: &[&str], n: u64, args: Vec<Value>) -> Value {
    json!({"module": "gemm_skinny", "entry": entry, "params": params, "block": [256],
           "grid": [format!("ceil({n}/16) * {}", small())], "shared": 0, "args": args})
}

/// A row-wise launch of `rowwise` for steps above FUSED_MAX_TOKENS (one CTA per token).
fn rowwise(entry: &str, params: &[&str], block: u64, args: Vec<Value>) -> Value {
    json!({"module": "rowwise", "entry": entry, "params": params, "block": [block],
           "grid": [format!("tokens * {}", large())], "args": args})
}

/// `gemm_launches`' launches without its GEMV (the fused GEMVs replace it), their arguments
/// (x, W, bias, y, M: `{"param": 0..4}`) replaced by `with`.
fn gemm(launches: Vec<Value>, with: [Value; 5]) -> Vec<Value> {
    let before = launches.len();
    let mut out: Vec<Value> = launches.into_iter().filter(|l| l["entry"] != "gemv_bf16").collect();
    assert_eq!(out.len() + 1, before, "gemm_launches has exactly one gemv_bf16 launch (the 1..{FUSED_MAX_TOKENS} bucket)");
    for l in &mut out {
        for a in l["args"].as_array_mut().expect("args") {
            if let Some(i) = a.get("param").and_then(Value::as_u64) {
                *a = with[i as usize].clone();
            }
        }
    }
    out
}

const RMS: [&str; 10] = ["in buffer<f32>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32", "i32", "i32", "f32"];
const ADD: [&str; 8] = ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "inout buffer<f32>", "i32", "i32", "i32"];
const SWIGLU_ADD: [&str; 9] = ["in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "inout buffer<f32>", "i32", "i32", "i32"];
const SWIGLU: [&str; 8] = ["in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32", "i32", "i32"];
const RMS_NORM_F32: [&str; 6] = ["out buffer<bf16>", "in buffer<f32>", "in buffer<bf16>", "i32", "i32", "f32"];
const ADD_RMS_NORM_F32: [&str; 7] = ["out buffer<bf16>", "inout buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "i32", "i32", "f32"];
const SWIGLU_ROW: [&str; 4] = ["out buffer<bf16>", "in buffer<bf16>", "i32", "i32"];

/// The sandwich prologue GEMV the ops launch (gemv_bf16_postnorm_rms_pf: the same bits plus the
/// L2 prefetch of the CTA's weight rows before its two-round norm prologue; timed by
/// fused_verify.py).
pub const POSTNORM_ENTRY: &str = "gemv_bf16_postnorm_rms";

const POSTNORM: [&str; 14] = [
    "in buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "out buffer<f32>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr",
    "out buffer<bf16>", "i32", "i32", "i32", "f32", "f32",
];
const POSTNORM_ROW: [&str; 10] =
    ["out buffer<bf16>", "out buffer<f32>", "in buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "i32", "i32", "f32", "f32"];

/// A launch's params and args with the norm's offset appended (the `_off` entries' last
/// parameter), or unchanged for `w · bf16(x̂)` norms.
fn with_off(entry: &str, params: &[&str], mut args: Vec<Value>, off: Option<f32>) -> (String, Vec<String>, Vec<Value>) {
    let mut ps: Vec<String> = params.iter().map(|x| x.to_string()).collect();
    match off {
        None => (entry.to_string(), ps, args),
        Some(off) => {
            ps.push("f32".into());
            args.push(json!({"f32": off}));
            (format!("{entry}_off"), ps, args)
        }
    }
}

/// The fused program's ops (tables above). `gemm(n, k)`: `gemm_launches` for `y[tokens, n] =
/// x[tokens, k]·Wᵀ` (bf16 out), whose GEMV launch is dropped here.
pub(crate) fn ops(s: &Sizes, gemm_launches: impl Fn(u64, u64) -> Vec<Value>) -> Map<String, Value> {
    let large_steps = s.max_tokens > FUSED_MAX_TOKENS;
    // The unfused launches of steps above FUSED_MAX_TOKENS, only where such steps exist (a
    // launch that can never run does not check).
    let when_large = |ls: Vec<Value>| if large_steps { ls } else { vec![] };
    let (h, i, eps) = (s.h, s.i, s.eps);
    let rms = |res: usize, w: usize, out: usize, wt: usize, bias: Value, y: usize, m: usize, n: u64| {
        let (entry, params, args) = with_off(RMS_ENTRY, &RMS, vec![p(res), p(w), p(out), p(wt), bias, p(y), p(m), json!({"i32": n}), json!({"i32": h}), json!({"f32": eps})], s.norm_off);
        let params: Vec<&str> = params.iter().map(String::as_str).collect();
        gemv(&entry, &params, n, args)
    };
    let rms_norm = |out: usize, x: usize, w: usize, m: usize| {
        let (entry, params, args) = with_off("rms_norm_f32", &RMS_NORM_F32, vec![p(out), p(x), p(w), p(m), json!({"i32": h}), json!({"f32": eps})], s.norm_off);
        let params: Vec<&str> = params.iter().map(String::as_str).collect();
        rowwise(&entry, &params, 128, args)
    };
    let add_rms_norm = |out: usize, res: usize, x: usize, w: usize, m: usize| {
        let (entry, params, args) = with_off("add_rms_norm_f32", &ADD_RMS_NORM_F32, vec![p(out), p(res), p(x), p(w), p(m), json!({"i32": h}), json!({"f32": eps})], s.norm_off);
        let params: Vec<&str> = params.iter().map(String::as_str).collect();
        rowwise(&entry, &params, 128, args)
    };
    // The MLP's activation: the row-wise kernel and the fused down GEMVs' name part.
    let (act_row, act) = if s.gelu { ("geglu_tanh", "geglu") } else { ("swiglu", "swiglu") };
    let swiglu = |a: usize, gu: usize, m: usize| rowwise(act_row, &SWIGLU_ROW, 256, vec![p(a), p(gu), p(m), json!({"i32": i})]);
    let down = |a: usize, gu: usize, wd: usize, mlp: usize, m: usize| {
        let mut l = vec![gemv(&format!("gemv_bf16_{act}"), &SWIGLU, h, vec![p(gu), p(a), p(wd), null(), p(mlp), p(m), json!({"i32": h}), json!({"i32": i})])];
        l.extend(when_large(vec![swiglu(a, gu, m)]));
        l.extend(gemm(gemm_launches(h, i), [p(a), p(wd), null(), p(mlp), p(m)]));
        l
    };
    if s.sandwich {
        return sandwich_ops(s, &gemm_launches, &rms, &rms_norm);
    }

    let mut ops = Map::new();
    // [out h, in x, in w, in Wqkv, ptr bias, out qkv, tokens]
    let mut l = vec![rms(1, 2, 0, 3, p(4), 5, 6, s.qkv)];
    l.extend(when_large(vec![rms_norm(0, 1, 2, 6)]));
    l.extend(gemm(gemm_launches(s.qkv, h), [p(0), p(3), p(4), p(5), p(6)]));
    ops.insert(
        "norm_qkv_proj".into(),
        json!({"params": ["out buffer<bf16>", "in buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": l}}),
    );

    // [in attn, in Wo, out o, inout x, in w_post, out h, in Wgu, out gate_up, tokens]
    let mut l = vec![gemv("gemv_bf16_add", &ADD, h, vec![p(0), p(1), null(), p(2), p(3), p(8), json!({"i32": h}), json!({"i32": s.attn})])];
    l.extend(gemm(gemm_launches(h, s.attn), [p(0), p(1), null(), p(2), p(8)]));
    l.extend(when_large(vec![add_rms_norm(5, 3, 2, 4, 8)]));
    l.push(rms(3, 4, 5, 6, null(), 7, 8, 2 * i));
    l.extend(gemm(gemm_launches(2 * i, h), [p(5), p(6), null(), p(7), p(8)]));
    ops.insert(
        "o_proj_norm_gate_up".into(),
        json!({"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "inout buffer<f32>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
               "impl": {"launches": l}}),
    );

    // [in gate_up, out act, in Wd, out mlp, inout x, in w_in', out h, in Wqkv', ptr bias', out qkv, tokens]
    let mut l = vec![gemv(&format!("gemv_bf16_{act}_add"), &SWIGLU_ADD, h, vec![p(0), p(1), p(2), null(), p(3), p(4), p(10), json!({"i32": h}), json!({"i32": i})])];
    l.extend(when_large(vec![swiglu(1, 0, 10)]));
    l.extend(gemm(gemm_launches(h, i), [p(1), p(2), null(), p(3), p(10)]));
    l.extend(when_large(vec![add_rms_norm(6, 4, 3, 5, 10)]));
    l.push(rms(4, 5, 6, 7, p(8), 9, 10, s.qkv));
    l.extend(gemm(gemm_launches(s.qkv, h), [p(6), p(7), p(8), p(9), p(10)]));
    ops.insert(
        "down_proj_norm_qkv".into(),
        json!({"params": ["in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "inout buffer<f32>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"],
               "impl": {"launches": l}}),
    );

    // [in gate_up, out act, in Wd, out mlp, tokens]
    ops.insert(down_op_name(s), down_op(down(1, 0, 2, 3, 4)));
    ops
}

/// The name of the op `act = act(gate_up); mlp = act·Wdᵀ` (`swiglu_down_proj` or `geglu_down_proj`).
pub(crate) fn down_op_name(s: &Sizes) -> String {
    format!("{}_down_proj", if s.gelu { "geglu" } else { "swiglu" })
}

fn down_op(launches: Vec<Value>) -> Value {
    json!({"params": ["in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"], "impl": {"launches": launches}})
}

/// gemv_bf16's CTAs in one wave on the H200 (2 per SM × 132 SMs). A sandwich prologue GEMV
/// (`gemv_bf16_postnorm_rms`) pays its two-round norm prologue once per wave of CTAs before their
/// weight loads; measured on the H200 (2026-12-03, fused_verify.py, GEMM.md), it beats the two
/// row-wise launches it replaces only when its grid is one wave (Gemma-3-4B's QKV, 256 CTAs:
/// −4.3 µs with the GeGLU down at batch 1) and loses when it is several (4B's gate-up, 1280 CTAs:
/// +18.7 µs). Above this the op runs `postnorm_add_rms_norm_f32_off` and the plain GEMV instead.
pub const POSTNORM_MAX_CTAS: u64 = 264;

/// The most tokens for which the sandwich ops launch their fused GEMVs (`gemv_bf16_postnorm_rms`,
/// `gemv_bf16_geglu`): every CTA computes the x operand of all the step's tokens, so the fused
/// GEMVs' extra work grows with the tokens while the launches they save do not (H200: the GeGLU
/// down + QKV group wins at 1 token and loses at 4). Larger steps run the row-wise kernels and
/// the plain GEMV — the same bits, as at every step size.
pub const SANDWICH_FUSED_MAX_TOKENS: u64 = 1;

/// The sandwich block's ops (module docs, second table): `norm_qkv_proj` (layer 0),
/// `postnorm_gate_up_proj`, `geglu_down_proj` / `swiglu_down_proj`, `postnorm_qkv_proj`; the O
/// projection and the last layer's post-feedforward norm are the unfused program's ops. Each op
/// launches its fused GEMV for 1..t tokens and the row-wise kernel with the plain GEMV / GEMM
/// above (t = [`SANDWICH_FUSED_MAX_TOKENS`], or 0 for a prologue GEMV of more than
/// [`POSTNORM_MAX_CTAS`] CTAs).
fn sandwich_ops(
    s: &Sizes,
    gemm_launches: &impl Fn(u64, u64) -> Vec<Value>,
    rms: &impl Fn(usize, usize, usize, usize, Value, usize, usize, u64) -> Value,
    rms_norm: &impl Fn(usize, usize, usize, usize) -> Value,
) -> Map<String, Value> {
    let off = s.norm_off.expect("sandwich ops need the (off + w) norms (fusion_supported)");
    let (h, i, eps) = (s.h, s.i, s.eps);
    let large_steps = s.max_tokens > FUSED_MAX_TOKENS;
    let when_large = |ls: Vec<Value>| if large_steps { ls } else { vec![] };
    // 1 when 1 <= tokens <= t; 1 when tokens > t.
    let upto = |t: u64| format!("max(0, min(1, tokens)) * max(0, min(1, {} - tokens))", t + 1);
    let above = |t: u64| if t == 0 { "1".to_string() } else { format!("max(0, min(1, tokens - {t}))") };
    // The fused GEMV for 1..t tokens (none for t = 0).
    let fused = |entry: &str, params: &[&str], n: u64, args: Vec<Value>, t: u64| -> Vec<Value> {
        if t == 0 {
            return vec![];
        }
        let mut l = gemv(entry, params, n, args);
        l["grid"][0] = json!(format!("ceil({n}/16) * {}", upto(t)));
        vec![l]
    };
    // A row-wise launch for tokens > t (only where such steps exist).
    let row = |entry: &str, params: &[&str], block: u64, args: Vec<Value>, t: u64| -> Vec<Value> {
        if s.max_tokens <= t {
            return vec![];
        }
        let mut l = rowwise(entry, params, block, args);
        l["grid"][0] = json!(if t == 0 { "tokens".to_string() } else { format!("tokens * {}", above(t)) });
        vec![l]
    };
    // gemm_launches for tokens > t: its GEMV launch (1..8 rows) gated by tokens > t, or dropped
    // when t covers its whole bucket.
    let gemm_above = |launches: Vec<Value>, with: [Value; 5], t: u64| -> Vec<Value> {
        if t >= FUSED_MAX_TOKENS {
            return gemm(launches, with);
        }
        let mut out = launches;
        for l in &mut out {
            for a in l["args"].as_array_mut().expect("args") {
                if let Some(k) = a.get("param").and_then(Value::as_u64) {
                    *a = with[k as usize].clone();
                }
            }
            if l["entry"] == "gemv_bf16" && t > 0 {
                let g = l["grid"][0].as_str().expect("grid").to_string();
                l["grid"][0] = json!(format!("{g} * {}", above(t)));
            }
        }
        out
    };
    let per_wave = |n: u64| if n.div_ceil(16) <= POSTNORM_MAX_CTAS { SANDWICH_FUSED_MAX_TOKENS } else { 0 };
    let mut ops = Map::new();
    // [out h, in x, in w, in Wqkv, ptr bias, out qkv, tokens] (layer 0: x from the embedding)
    let mut l = vec![rms(1, 2, 0, 3, p(4), 5, 6, s.qkv)];
    l.extend(when_large(vec![rms_norm(0, 1, 2, 6)]));
    l.extend(gemm(gemm_launches(s.qkv, h), [p(0), p(3), p(4), p(5), p(6)]));
    ops.insert(
        "norm_qkv_proj".into(),
        json!({"params": ["out buffer<bf16>", "in buffer<f32>", "in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": l}}),
    );
    // [in o, in x_in, in w_post, out x_out, in w_pre, out h, in W, ptr bias, out y, tokens]: x_out =
    // x_in + post(o); h = pre(x_out); y = h·Wᵀ (+bias). N: the projection's rows.
    let postnorm = |n: u64| {
        let t = per_wave(n);
        let mut l = fused(
            POSTNORM_ENTRY,
            &POSTNORM,
            n,
            vec![p(1), p(0), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), json!({"i32": n}), json!({"i32": h}), json!({"f32": eps}), json!({"f32": off})],
            t,
        );
        l.extend(row(
            "postnorm_add_rms_norm_f32_off",
            &POSTNORM_ROW,
            128,
            vec![p(5), p(3), p(1), p(0), p(2), p(4), p(9), json!({"i32": h}), json!({"f32": eps}), json!({"f32": off})],
            t,
        ));
        l.extend(gemm_above(gemm_launches(n, h), [p(5), p(6), p(7), p(8), p(9)], t));
        json!({"params": ["in buffer<bf16>", "in buffer<f32>", "in buffer<bf16>", "out buffer<f32>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"],
               "impl": {"launches": l}})
    };
    ops.insert("postnorm_gate_up_proj".into(), postnorm(2 * i));
    ops.insert("postnorm_qkv_proj".into(), postnorm(s.qkv));
    // [in gate_up, out act, in Wd, out mlp, tokens]
    let (act_row, act) = if s.gelu { ("geglu_tanh", "geglu") } else { ("swiglu", "swiglu") };
    let t = SANDWICH_FUSED_MAX_TOKENS;
    let mut l = fused(&format!("gemv_bf16_{act}"), &SWIGLU, h, vec![p(0), p(1), p(2), null(), p(3), p(4), json!({"i32": h}), json!({"i32": i})], t);
    l.extend(row(act_row, &SWIGLU_ROW, 256, vec![p(1), p(0), p(4), json!({"i32": i})], t));
    l.extend(gemm_above(gemm_launches(h, i), [p(1), p(2), null(), p(3), p(4)], t));
    ops.insert(down_op_name(s), down_op(l));
    ops
}
