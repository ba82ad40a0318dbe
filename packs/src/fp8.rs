//! FP8 weights (issue 25): block-scaled E4M3 in the Hugging Face fine-grained FP8 layout
//! (DeepSeek-V3, Qwen3-*-FP8): each projection weight `X.weight` is `F8_E4M3` [N, K] and its
//! `X.weight_scale_inv` is `F32` [ceil(N/128), ceil(K/128)], value = w · scale_inv of its block;
//! config.json says `quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128],
//! "activation_scheme": "dynamic", …}`. Four parts:
//!
//! * the E4M3 codec ([`e4m3_to_f32`], [`e4m3_from_f32`]: PyTorch's c10 conversions bit for bit)
//!   and the block quantization ([`quantize`]: per 128 × 128 block scale_inv = absmax / 448,
//!   w_q = e4m3(clamp(w / scale_inv, ±448)), i.e. PyTorch's `(w / s).clamp(-448, 448).to(float8_e4m3fn)`);
//! * checkpoints in that layout: [`quantize_checkpoint`] (`kern pack --quant fp8`: a bf16 checkpoint
//!   written again as an FP8 one — every projection quantized, everything else copied byte for
//!   byte, config.json with the `quantization_config` — so the pack directory is itself a
//!   standard FP8 checkpoint that transformers and vLLM load) and [`write_random`]
//!   (`kern random-weights --quant fp8`: the bf16 random weights of the same seed, quantized);
//! * [`scheme`]: what a config.json's `quantization_config` asks for (the families call it, so a
//!   GPTQ / AWQ / per-channel config is refused by name instead of failing at load);
//! * [`apply`]: the pack pass (as [`crate::quant`] for GGUF blocks) that rewrites a generated
//!   manifest's projection calls to the FP8 kernels (packs/kernels/gemm_fp8.cu, KERNELS.md "FP8
//!   weights"): steps of at most 64 rows run `gemv_fp8*` (weight-only: bf16 activations, one byte
//!   per weight, batch-invariant); larger steps either dequantize into a bf16 scratch and run the
//!   bf16 wgmma GEMM ([`Fp8Prefill::Dequant`], the default) or quantize the activations per token
//!   group and run the W8A8 wgmma GEMM ([`Fp8Prefill::W8a8`], gemm_fp8_wgmma.cu).

use crate::{io, PackError, Result};
use kern_weights::Checkpoint;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The block edge of the weight scales (and the activation group of the W8A8 GEMM).
pub const BLOCK: usize = 128;
/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;
/// The module of the FP8 GEMVs, dequantization and activation quantization.
pub const MODULE: &str = "gemm_fp8";
/// The module of the W8A8 wgmma GEMM.
pub const WGMMA_MODULE: &str = "gemm_fp8_wgmma";
/// Steps with at most this many rows run the GEMVs.
pub const GEMV_MAX_ROWS: u64 = 64;
/// The bf16 scratch the dequantizing prefill path writes (the same name as the GGUF pass's).
pub const SCRATCH: &str = "wscratch";
/// The W8A8 path's quantized activations and their scales.
pub const XQ: &str = "fp8_xq";
pub const XS: &str = "fp8_xs";

// ---------------------------------------------------------------------- codec

/// One E4M3 byte as f32: exact; 0x7F / 0xFF (S.1111.111) are NaN (PyTorch's
/// `fp8e4m3fn_to_fp32_value`, whose NaN is 0x7FF00000 with the byte's sign).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = u32::from(b & 0x80) << 24;
    let em = u32::from(b & 0x7F);
    if em == 0x7F {
        return f32::from_bits(sign | 0x7FF0_0000);
    }
    if em < 8 {
        return f32::from_bits(sign | (em as f32 * (1.0 / 512.0)).to_bits());
    }
    f32::from_bits(sign | ((em + (120 << 3)) << 20))
}

/// f32 → E4M3 exactly as PyTorch's `Tensor.to(torch.float8_e4m3fn)` (c10's
/// `fp8e4m3fn_from_fp32_value`): round to nearest even, subnormals included; NaN and every
/// magnitude that rounds past 448 (|x| > 464) become NaN (0x7F with the sign) — no saturation.
/// [`e4m3_sat`] is the clamped conversion quantizers use.
pub fn e4m3_from_f32(f: f32) -> u8 {
    const FP8_MAX: u32 = 1087 << 20; // 480.0f: the first value past the range
    const DENORM_MASK: u32 = 141 << 23;
    let mut bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let result: u8 = if bits >= FP8_MAX {
        0x7F
    } else if bits < (121 << 23) {
        // below 2^-6: the magic-number addition rounds into the subnormal range
        let s = f32::from_bits(bits) + f32::from_bits(DENORM_MASK);
        (s.to_bits().wrapping_sub(DENORM_MASK)) as u8
    } else {
        let odd = (bits >> 20) & 1;
        bits = bits.wrapping_add(((7i32 - 127) as u32) << 23).wrapping_add(0x7FFFF);
        bits = bits.wrapping_add(odd);
        (bits >> 20) as u8
    };
    result | (sign >> 24) as u8
}

/// `x.clamp(-448, 448).to(torch.float8_e4m3fn)`: [`e4m3_from_f32`] after saturating; NaN → 0x7F.
pub fn e4m3_sat(f: f32) -> u8 {
    if f.is_nan() {
        return 0x7F;
    }
    e4m3_from_f32(f.clamp(-E4M3_MAX, E4M3_MAX))
}

// ---------------------------------------------------------------------- quantization

/// A matrix in the fine-grained FP8 layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantized {
    /// E4M3 bytes, [n, k] row-major.
    pub weight: Vec<u8>,
    /// The block scales (`weight_scale_inv`), [ceil(n/128), ceil(k/128)] row-major.
    pub scale_inv: Vec<f32>,
}

/// Quantizes an [n, k] f32 matrix per 128 × 128 block (edge blocks are whatever is left):
/// `scale_inv = absmax / 448` (f32 division), `w_q = e4m3_sat(w / scale_inv)` (f32 division, round
/// to nearest even, saturating) — the block maximum maps to 448 exactly. An all-zero block gets
/// scale_inv 1.0. Runs on all cores (block rows in parallel); a NaN or infinite weight is an error.
pub fn quantize(values: &[f32], n: usize, k: usize) -> std::result::Result<Quantized, String> {
    if values.len() != n * k {
        return Err(format!("{} values for a {n} x {k} matrix", values.len()));
    }
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(format!("element ({}, {}) is {}: only finite weights can be quantized", i / k.max(1), i % k.max(1), values[i]));
    }
    let (nb, kb) = (n.div_ceil(BLOCK), k.div_ceil(BLOCK));
    let mut weight = vec![0u8; n * k];
    let mut scale_inv = vec![0f32; nb * kb];
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(32);
    let per = nb.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, (wchunk, schunk)) in weight.chunks_mut(per * BLOCK * k.max(1)).zip(scale_inv.chunks_mut(per * kb.max(1))).enumerate() {
            s.spawn(move || {
                let r0 = c * per * BLOCK;
                let rows = wchunk.len() / k.max(1);
                for bi in 0..rows.div_ceil(BLOCK) {
                    let (ra, rb) = (bi * BLOCK, ((bi + 1) * BLOCK).min(rows));
                    for bj in 0..kb {
                        let (ca, cb) = (bj * BLOCK, ((bj + 1) * BLOCK).min(k));
                        let mut amax = 0f32;
                        for r in ra..rb {
                            for v in &values[(r0 + r) * k + ca..(r0 + r) * k + cb] {
                                amax = amax.max(v.abs());
                            }
                        }
                        let s = if amax > 0.0 { amax / E4M3_MAX } else { 1.0 };
                        schunk[bi * kb + bj] = s;
                        for r in ra..rb {
                            for c2 in ca..cb {
                                wchunk[r * k + c2] = e4m3_sat(values[(r0 + r) * k + c2] / s);
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(Quantized { weight, scale_inv })
}

/// The values a [`Quantized`] matrix stands for, in f32 (`f32(w) · scale_inv`, one rounding).
pub fn dequantize(q: &Quantized, n: usize, k: usize) -> Vec<f32> {
    let kb = k.div_ceil(BLOCK);
    (0..n * k).map(|i| e4m3_to_f32(q.weight[i]) * q.scale_inv[(i / k / BLOCK) * kb + (i % k) / BLOCK]).collect()
}

// ---------------------------------------------------------------------- config.json

/// What a config.json's `quantization_config` declares, when it is FP8 with block scales.
#[derive(Clone, Debug, PartialEq)]
pub struct Scheme {
    /// Modules left in their original dtype (`modules_to_not_convert`).
    pub not_converted: Vec<String>,
}

/// Reads `quantization_config`: `None` when absent; the FP8 block scheme kern runs; or why kern
/// cannot run it (another method, another block size, static activation scales).
pub fn scheme(config: &Value) -> std::result::Result<Option<Scheme>, String> {
    let Some(q) = config.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if method != "fp8" {
        return Err(format!(
            "quantization_config.quant_method is `{method}`: kern runs `fp8` (block-scaled e4m3, weight_block_size [128, 128]) checkpoints and GGUF files; quantize a bf16 checkpoint with `kern pack --quant fp8` instead"
        ));
    }
    if let Some(f) = q.get("fmt").and_then(Value::as_str).filter(|f| *f != "e4m3") {
        return Err(format!("quantization_config.fmt is `{f}`: kern's FP8 kernels take e4m3"));
    }
    match q.get("weight_block_size") {
        Some(b) if b == &json!([128, 128]) => {}
        Some(b) => return Err(format!("quantization_config.weight_block_size is {b}: kern's FP8 kernels take [128, 128] blocks")),
        None => return Err("quantization_config has no weight_block_size: kern runs block-scaled FP8 (weight_scale_inv per [128, 128] block), not per-tensor / per-channel scales".into()),
    }
    if let Some(a) = q.get("activation_scheme").and_then(Value::as_str).filter(|a| *a != "dynamic") {
        return Err(format!("quantization_config.activation_scheme is `{a}`: kern quantizes activations dynamically (or not at all: the decode GEMVs are weight-only)"));
    }
    let not_converted = q.get("modules_to_not_convert").and_then(Value::as_array).map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default();
    Ok(Some(Scheme { not_converted }))
}

/// The `quantization_config` kern writes (the fields of Qwen's and DeepSeek's FP8 checkpoints).
pub fn quantization_config(not_converted: &[String]) -> Value {
    json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": not_converted})
}

// ---------------------------------------------------------------------- checkpoints

/// `kern pack --quant` / `kern random-weights --quant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    Fp8,
}

impl std::str::FromStr for Quant {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fp8" => Ok(Quant::Fp8),
            _ => Err(format!("unknown quantization `{s}`; supported: fp8 (block-scaled e4m3, 128 x 128 weight blocks)")),
        }
    }
}

/// The projection weights `--quant fp8` quantizes: nn.Linear weights of the attention and MLP
/// blocks (the LM head, embeddings and norms stay as they are, as in Qwen's FP8 checkpoints).
pub fn is_projection(name: &str) -> bool {
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].iter().any(|p| name.ends_with(&format!(".{p}.weight")))
}

/// The name of a weight's block scales.
pub fn scale_name(weight: &str) -> String {
    format!("{weight}_scale_inv")
}

/// The FP8 weights of a checkpoint: every `F8_E4M3` tensor → its `_scale_inv` tensor. A 2-D FP8
/// tensor without `F32` scales of the block shape is an error (kern runs only the block layout).
pub fn checkpoint_weights(ckpt: &Checkpoint) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for name in ckpt.names() {
        let Ok(t) = ckpt.tensor(name) else { continue };
        if t.file_dtype != "F8_E4M3" {
            continue;
        }
        let (n, k) = match t.shape {
            [n, k] => (*n, *k),
            s => return Err(format!("FP8 tensor `{name}` has shape {s:?}: kern runs 2-D block-scaled weights")),
        };
        let sn = scale_name(name);
        let want = [n.div_ceil(BLOCK), k.div_ceil(BLOCK)];
        match ckpt.tensor(&sn) {
            Ok(s) if s.file_dtype == "F32" && s.shape == want => {}
            Ok(s) => return Err(format!("`{sn}` is {} {:?}; the block scales of `{name}` ({n} x {k}) are F32 {want:?}", s.file_dtype, s.shape)),
            Err(_) => return Err(format!("FP8 weight `{name}` has no `{sn}`: kern runs the block-scaled layout (weight_block_size [128, 128]), not per-tensor or per-channel scales")),
        }
        out.insert(name.to_string(), sn);
    }
    Ok(out)
}

/// One tensor of an FP8 checkpoint being written.
struct Out {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: usize,
}

fn elem_bytes(dtype: &str) -> usize {
    match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "BF16" | "F16" | "I16" | "U16" => 2,
        _ => 1,
    }
}

/// How a source tensor goes into the FP8 checkpoint.
pub struct Item {
    pub name: String,
    pub shape: Vec<usize>,
    /// The dtype it is written in when it is not quantized (its source dtype, safetensors' name).
    pub dtype: &'static str,
    pub quantize: bool,
}

/// What a written FP8 checkpoint holds.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<PathBuf>,
    /// Weights quantized, and their bytes before and after (weights + scales).
    pub quantized: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Projection weights left as they were (K not a multiple of 128), as module names.
    pub not_converted: Vec<String>,
}

/// Writes `items` as safetensors in `dir` (`model.safetensors`, or shards of about `shard_bytes`
/// with `model.safetensors.index.json`): a quantized item becomes `NAME` (F8_E4M3) and
/// `NAME_scale_inv` (F32), the others are written as `bytes_of` gives them. Every file is laid
/// out before it is written (F32 tensors first, so every tensor starts at a multiple of its
/// element size) and filled tensor by tensor: one source tensor in memory at a time.
fn write_items(dir: &Path, items: &[Item], shard_bytes: u64, bytes_of: &dyn Fn(&Item) -> Result<Vec<u8>>, progress: &mut dyn FnMut(u64, u64)) -> Result<Written> {
    let outs_of = |it: &Item| -> Vec<Out> {
        if it.quantize {
            let (n, k) = (it.shape[0], it.shape[1]);
            vec![
                Out { name: it.name.clone(), dtype: "F8_E4M3", shape: it.shape.clone(), bytes: n * k },
                Out { name: scale_name(&it.name), dtype: "F32", shape: vec![n.div_ceil(BLOCK), k.div_ceil(BLOCK)], bytes: n.div_ceil(BLOCK) * k.div_ceil(BLOCK) * 4 },
            ]
        } else {
            vec![Out { name: it.name.clone(), dtype: it.dtype, shape: it.shape.clone(), bytes: it.shape.iter().product::<usize>() * elem_bytes(it.dtype) }]
        }
    };
    // Shards in order, a weight with its scales.
    let mut shards: Vec<Vec<usize>> = vec![vec![]];
    let mut size = 0u64;
    for (i, it) in items.iter().enumerate() {
        let b: u64 = outs_of(it).iter().map(|o| o.bytes as u64).sum();
        if size > 0 && size + b > shard_bytes {
            shards.push(vec![]);
            size = 0;
        }
        shards.last_mut().expect("one shard").push(i);
        size += b;
    }
    let total: u64 = items.iter().map(|it| it.shape.iter().product::<usize>() as u64 * elem_bytes(it.dtype) as u64).sum();
    let n = shards.len();
    let mut written = Written::default();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    for (si, shard) in shards.iter().enumerate() {
        let file = if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", si + 1) };
        let path = dir.join(&file);
        // Layout: F32 first, then 2-byte, then 1-byte tensors (stable within a size).
        let mut outs: Vec<Out> = shard.iter().flat_map(|&i| outs_of(&items[i])).collect();
        outs.sort_by_key(|o| std::cmp::Reverse(elem_bytes(o.dtype)));
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        let mut offsets = BTreeMap::new();
        let mut at = 0usize;
        for o in &outs {
            header.insert(o.name.clone(), json!({"dtype": o.dtype, "shape": o.shape, "data_offsets": [at, at + o.bytes]}));
            offsets.insert(o.name.clone(), at);
            at += o.bytes;
            weight_map.insert(o.name.clone(), file.clone());
        }
        let mut text = serde_json::to_string(&Value::Object(header)).map_err(|e| PackError::Config(e.to_string()))?.into_bytes();
        while (8 + text.len()) % 8 != 0 {
            text.push(b' ');
        }
        let mut f = std::fs::File::create(&path).map_err(io(&path))?;
        f.write_all(&(text.len() as u64).to_le_bytes()).map_err(io(&path))?;
        f.write_all(&text).map_err(io(&path))?;
        f.set_len((8 + text.len() + at) as u64).map_err(io(&path))?;
        let data0 = (8 + text.len()) as u64;
        let mut put = |name: &str, bytes: &[u8]| -> Result<()> {
            f.seek(SeekFrom::Start(data0 + offsets[name] as u64)).map_err(io(&path))?;
            f.write_all(bytes).map_err(io(&path))
        };
        for &i in shard {
            let it = &items[i];
            let data = bytes_of(it)?;
            done += data.len() as u64;
            written.bytes_before += data.len() as u64;
            if it.quantize {
                let vals = to_f32(&data, it.dtype).ok_or_else(|| PackError::Config(format!("{}: {} cannot be quantized", it.name, it.dtype)))?;
                let q = quantize(&vals, it.shape[0], it.shape[1]).map_err(|e| PackError::Config(format!("{}: {e}", it.name)))?;
                let scales: Vec<u8> = q.scale_inv.iter().flat_map(|s| s.to_le_bytes()).collect();
                put(&it.name, &q.weight)?;
                put(&scale_name(&it.name), &scales)?;
                written.bytes_after += (q.weight.len() + scales.len()) as u64;
                written.quantized += 1;
            } else {
                put(&it.name, &data)?;
                written.bytes_after += data.len() as u64;
            }
            progress(done, total);
        }
        f.flush().map_err(io(&path))?;
        written.files.push(path);
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": written.bytes_after}, "weight_map": weight_map});
        let p = dir.join(kern_weights::INDEX_FILE);
        std::fs::write(&p, serde_json::to_string_pretty(&index).map_err(|e| PackError::Config(e.to_string()))? + "\n").map_err(io(&p))?;
        written.files.push(p);
    }
    Ok(written)
}

/// Little-endian BF16 / F16 / F32 bytes as f32 (exact widening).
fn to_f32(data: &[u8], dtype: &str) -> Option<Vec<f32>> {
    Some(match dtype {
        "BF16" => data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        "F16" => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        "F32" => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => return None,
    })
}

/// Whether a source tensor is quantized: a projection weight, 2-D, a float, K a multiple of 128
/// (the GEMVs' requirement; the others stay and are listed in `modules_to_not_convert`).
fn plan(name: &str, shape: &[usize], dtype: &str, not_converted: &mut Vec<String>) -> bool {
    if !is_projection(name) || shape.len() != 2 || !matches!(dtype, "BF16" | "F16" | "F32") {
        return false;
    }
    if !shape[1].is_multiple_of(BLOCK) {
        not_converted.push(name.trim_end_matches(".weight").to_string());
        return false;
    }
    true
}

/// Removes the safetensors files and index of an earlier write from `dir` (the pack directory
/// is the FP8 checkpoint's; `src` is never it).
fn clear_weights(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let p = e.map_err(io(dir))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.ends_with(".safetensors") || name == kern_weights::INDEX_FILE {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// `kern pack --quant fp8`: the checkpoint in `src` (a bf16 Hugging Face directory) written into
/// `out` as an FP8 checkpoint — projections quantized ([`quantize`]), every other tensor copied
/// byte for byte, config.json with `quantization_config`, the tokenizer and other small files
/// copied. `out` must not be `src`. The result is a standard fine-grained FP8 checkpoint.
pub fn quantize_checkpoint(src: &Path, out: &Path, shard_bytes: u64, mut progress: impl FnMut(u64, u64)) -> Result<Written> {
    let same = |a: &Path, b: &Path| matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y);
    if same(src, out) {
        return Err(PackError::Config(format!("--quant fp8 writes a new (FP8) checkpoint into the pack directory: give -o another directory than {}", src.display())));
    }
    let config_path = src.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let mut config: Value = serde_json::from_str(&text).map_err(|e| PackError::Config(format!("{}: {e}", config_path.display())))?;
    if config.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return Err(PackError::Config(format!("{}: already quantized (quantization_config): pack it as it is, without --quant", config_path.display())));
    }
    let ckpt = Checkpoint::open(src).map_err(|e| PackError::Config(format!("{}: {e}", src.display())))?;
    let mut not_converted = vec!["lm_head".to_string()];
    let mut names: Vec<&str> = ckpt.names();
    names.sort();
    let mut items = vec![];
    for name in names {
        let t = ckpt.tensor(name).map_err(|e| PackError::Config(e.to_string()))?;
        let quantize = plan(name, t.shape, t.file_dtype, &mut not_converted);
        items.push(Item { name: name.to_string(), shape: t.shape.to_vec(), dtype: t.file_dtype, quantize });
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    clear_weights(out)?;
    let read = |it: &Item| -> Result<Vec<u8>> { Ok(ckpt.tensor(&it.name).map_err(|e| PackError::Config(e.to_string()))?.data.to_vec()) };
    let mut written = write_items(out, &items, shard_bytes, &read, &mut progress)?;
    config["quantization_config"] = quantization_config(&not_converted);
    let cp = out.join("config.json");
    std::fs::write(&cp, serde_json::to_string_pretty(&config).map_err(|e| PackError::Config(e.to_string()))? + "\n").map_err(io(&cp))?;
    // The tokenizer, generation config, chat template, …: the small regular files beside.
    for e in std::fs::read_dir(src).map_err(io(src))? {
        let p = e.map_err(io(src))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let skip = name.ends_with(".safetensors") || name.ends_with(".gguf") || name.ends_with(".cubin") || name == kern_weights::INDEX_FILE || name == "config.json" || name == "model.json";
        let small = std::fs::metadata(&p).is_ok_and(|m| m.is_file() && m.len() <= 64 << 20);
        if !skip && small {
            let dst = out.join(&name);
            std::fs::copy(&p, &dst).map_err(io(&dst))?;
        }
    }
    written.not_converted = not_converted;
    Ok(written)
}

/// `kern random-weights --quant fp8`: the random weights [`crate::random::write`] draws for
/// `(cfg, seed)`, with the projections quantized — the FP8 twin of that bf16 checkpoint — and
/// config.json with `quantization_config`.
pub fn write_random(cfg: &crate::Config, seed: u64, dir: &Path, shard_bytes: u64, mut progress: impl FnMut(u64, u64)) -> Result<Written> {
    cfg.validate().map_err(PackError::Config)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    clear_weights(dir)?;
    let specs = crate::random::tensors(cfg);
    let mut not_converted = vec!["lm_head".to_string()];
    let items: Vec<Item> = specs
        .iter()
        .map(|s| {
            let quantize = plan(&s.name, &s.shape, "BF16", &mut not_converted);
            Item { name: s.name.clone(), shape: s.shape.clone(), dtype: "BF16", quantize }
        })
        .collect();
    let by_name: BTreeMap<&str, &crate::random::TensorSpec> = specs.iter().map(|s| (s.name.as_str(), s)).collect();
    let read = |it: &Item| -> Result<Vec<u8>> { Ok(crate::random::generate_tensor(seed, by_name[it.name.as_str()])) };
    let mut written = write_items(dir, &items, shard_bytes, &read, &mut progress)?;
    let mut config = cfg.to_hf_json();
    config["quantization_config"] = quantization_config(&not_converted);
    let cp = dir.join("config.json");
    std::fs::write(&cp, serde_json::to_string_pretty(&config).map_err(|e| PackError::Config(e.to_string()))? + "\n").map_err(io(&cp))?;
    written.not_converted = not_converted;
    Ok(written)
}

/// `kern pack --config`'s FP8 step. With `quant`, the checkpoint beside `config` is quantized
/// into `out` ([`quantize_checkpoint`]) and the pack loads that one. Then `opts.fp8.weights` gets
/// the FP8 weights of the checkpoint the pack will load: read from its tensors when it is there
/// ([`checkpoint_weights`]), else — a config.json alone — named from the config (every projection
/// of every layer but `modules_to_not_convert`, scales `NAME_scale_inv`). Returns that
/// checkpoint's directory and a line for `kern pack`'s summary; `None` without FP8.
pub fn prepare(config: &Path, out: &Path, quant: Option<Quant>, cfg: &crate::Config, opts: &mut crate::PackOptions) -> Result<Option<(PathBuf, String)>> {
    let src = config.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    let mut what = String::new();
    let dir = if quant.is_some() {
        eprintln!("quantizing {} to FP8 (128 x 128 e4m3 blocks) into {}", src.display(), out.display());
        let w = quantize_checkpoint(&src, out, 4 << 30, |_, _| {})?;
        what = format!(
            "quantized {} projection weights to FP8 ({:.1} MiB -> {:.1} MiB with the rest copied; not converted: {}); ",
            w.quantized,
            w.bytes_before as f64 / (1 << 20) as f64,
            w.bytes_after as f64 / (1 << 20) as f64,
            w.not_converted.join(", ")
        );
        out.to_path_buf()
    } else {
        src
    };
    let text = std::fs::read_to_string(dir.join("config.json")).map_err(io(&dir.join("config.json")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| PackError::Config(format!("{}: {e}", dir.join("config.json").display())))?;
    let declared = scheme(&v).map_err(|e| PackError::Config(format!("{}: {e}", dir.join("config.json").display())))?;
    let weights = match Checkpoint::open(&dir) {
        Ok(ckpt) => checkpoint_weights(&ckpt).map_err(|e| PackError::Config(format!("{}: {e}", dir.display())))?,
        Err(_) => match &declared {
            Some(s) => crate::random::tensors(cfg)
                .into_iter()
                .filter(|t| is_projection(&t.name) && !s.not_converted.iter().any(|m| t.name.starts_with(&format!("{m}.")) || t.name.ends_with(&format!(".{m}.weight"))))
                .map(|t| {
                    let name = crate::gguf::with_prefix(&t.name, &cfg.tensor_prefix);
                    (name.clone(), scale_name(&name))
                })
                .collect(),
            None => BTreeMap::new(),
        },
    };
    if weights.is_empty() {
        if declared.is_some() {
            return Err(PackError::Config(format!("{}: config.json declares FP8 (quantization_config) but the checkpoint has no F8_E4M3 tensor", dir.display())));
        }
        return Ok(None);
    }
    what.push_str(&format!("{} FP8 weights with 128 x 128 block scales, prefill {:?}", weights.len(), opts.fp8.prefill));
    opts.fp8.weights = weights;
    Ok(Some((dir, what)))
}

// ---------------------------------------------------------------------- the pack pass

/// How steps of more than [`GEMV_MAX_ROWS`] rows (prefill) run FP8 projections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fp8Prefill {
    /// `dequant_fp8_bf16` into a bf16 scratch, then the bf16 wgmma GEMM (gemm_wgmma.cu): the
    /// dequantized checkpoint's exact values, on the GPU-verified bf16 GEMM.
    #[default]
    Dequant,
    /// `quant_fp8_act` (per token and 128 channels, dynamic) then the W8A8 wgmma GEMM
    /// (gemm_fp8_wgmma.cu): twice the tensor-core rate; the activations' rounding to e4m3 is
    /// what vLLM / SGLang / transformers' FP8 do too.
    W8a8,
}

impl std::str::FromStr for Fp8Prefill {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "dequant" => Ok(Fp8Prefill::Dequant),
            "w8a8" => Ok(Fp8Prefill::W8a8),
            _ => Err(format!("unknown FP8 prefill `{s}`; supported: dequant, w8a8")),
        }
    }
}

/// The FP8 side of [`crate::PackOptions`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fp8Options {
    /// Checkpoint tensor → its block-scale tensor, for every FP8 weight ([`checkpoint_weights`]).
    /// Empty: no FP8 pass.
    pub weights: BTreeMap<String, String>,
    pub prefill: Fp8Prefill,
}

/// What the pass did, for `kern pack`'s summary.
#[derive(Debug, Default)]
pub struct Applied {
    /// Projection weight buffers now FP8.
    pub weights: usize,
    /// Projections split into per-part GEMVs (a part's N not a multiple of 128).
    pub split: Vec<String>,
    /// The modules the manifest now needs besides the builder's.
    pub modules: Vec<&'static str>,
}

use crate::quant::{within, PROJECTIONS};

/// One part of a projection's weight: its tensor, its scale tensor, its rows.
#[derive(Clone, Debug)]
struct Part {
    tensor: String,
    scale: String,
    rows: u64,
}

/// The GEMV family of an N-row weight: 8 warps where ceil(N/16) CTAs would not fill an H200 twice.
fn gemv_entry(n: u64, f32_out: bool) -> (String, u64) {
    let w8 = n.div_ceil(16) < 264;
    (format!("gemv_fp8{}{}", if w8 { "_w8" } else { "" }, if f32_out { "_f32out" } else { "" }), if w8 { 256 } else { 128 })
}

/// Rewrites `m` (a generated manifest whose weight sources name checkpoint tensors) so that the
/// projections whose tensors are FP8 in `opts.weights` run the FP8 kernels. `max_tokens`: the
/// `tokens` var's maximum; `pdl`: the launches of steps of at most 8 rows get the PDL attribute.
pub fn apply(m: &mut Value, opts: &Fp8Options, max_tokens: u64, pdl: bool) -> std::result::Result<Applied, String> {
    let mut out = Applied::default();
    let buffers = m["buffers"].as_object().cloned().ok_or("manifest without buffers")?;
    // The parts of a weight buffer (following an alias) when every one is FP8; None when none is.
    let parts_of = |name: &str| -> std::result::Result<Option<(Vec<Part>, u64)>, String> {
        let Some(mut b) = buffers.get(name) else { return Ok(None) };
        if let Some(a) = b["from"]["alias"].as_str() {
            match buffers.get(a) {
                Some(t) => b = t,
                None => return Ok(None),
            }
        }
        let (Some(n), Some(k)) = (b["shape"][0].as_u64(), b["shape"][1].as_u64()) else { return Ok(None) };
        let from = &b["from"];
        let parts: Vec<(String, u64)> = if let Some(t) = from["tensor"].as_str() {
            vec![(t.to_string(), n)]
        } else if let Some(list) = from["concat"].as_array() {
            let sizes: Vec<u64> = from["sizes"].as_array().map(|s| s.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
            if from["axis"].as_u64().unwrap_or(0) != 0 || sizes.len() != list.len() {
                return Ok(None);
            }
            list.iter().zip(sizes).filter_map(|(t, r)| Some((t.as_str()?.to_string(), r))).collect()
        } else {
            return Ok(None);
        };
        let fp8: Vec<bool> = parts.iter().map(|(t, _)| opts.weights.contains_key(t)).collect();
        if fp8.iter().all(|f| !f) {
            return Ok(None);
        }
        if fp8.iter().any(|f| !f) {
            return Err(format!("{name}: its parts mix FP8 and other tensors ({}); kern cannot dequantize FP8 at load", parts.iter().map(|p| p.0.as_str()).collect::<Vec<_>>().join(", ")));
        }
        if from.get("shard").is_some() {
            return Err(format!("{name}: FP8 weights with tensor parallelism are not supported yet (the block scales would need sharding too)"));
        }
        if !k.is_multiple_of(BLOCK as u64) {
            return Err(format!("{name}: K = {k} is not a multiple of 128, which the FP8 GEMVs need"));
        }
        Ok(Some((parts.into_iter().map(|(tensor, rows)| Part { scale: opts.weights[&tensor].clone(), tensor, rows }).collect(), k)))
    };

    let mut new_ops = Map::new();
    let mut new_buffers: Map<String, Value> = Map::new();
    let mut retyped: BTreeMap<String, (String, Vec<Part>)> = BTreeMap::new(); // buffer -> (scale buffer, parts)
    let (mut scratch_elems, mut xq_elems, mut xs_elems) = (0u64, 0u64, 0u64);
    let mut wgmma_bf16 = false;
    let programs: Vec<String> = std::iter::once("program".to_string()).chain(m["programs"].as_object().map(|p| p.keys().map(|k| format!("programs.{k}")).collect::<Vec<_>>()).unwrap_or_default()).collect();
    for prog in &programs {
        let calls = match prog.strip_prefix("programs.") {
            Some(k) => m["programs"][k]["calls"].as_array().cloned(),
            None => m["program"]["calls"].as_array().cloned(),
        }
        .unwrap_or_default();
        let mut rewritten = Vec::with_capacity(calls.len());
        for mut call in calls {
            let op = call["op"].as_str().unwrap_or_default().to_string();
            let Some(&(_, f32_out)) = PROJECTIONS.iter().find(|(o, _)| *o == op) else {
                rewritten.push(call);
                continue;
            };
            let args = call["args"].as_array().cloned().unwrap_or_default();
            let w = args.get(1).and_then(|a| a["buf"].as_str()).unwrap_or_default().to_string();
            let Some((parts, k)) = parts_of(&w)? else {
                rewritten.push(call);
                continue;
            };
            let n_total: u64 = parts.iter().map(|p| p.rows).sum();
            let fused = parts.len() == 1 || parts.iter().all(|p| p.rows.is_multiple_of(BLOCK as u64));
            // (weight buffer, scale buffer, rows) per launch group.
            let mut w_bufs: Vec<(String, String, u64)> = vec![];
            let target = buffers.get(&w).and_then(|b| b["from"]["alias"].as_str()).unwrap_or(&w).to_string();
            if fused {
                let sname = format!("{target}.scale_inv");
                retyped.insert(target.clone(), (sname.clone(), parts.clone()));
                w_bufs.push((w.clone(), sname, n_total));
            } else {
                out.split.push(w.clone());
                for (i, p) in parts.iter().enumerate() {
                    let name = format!("{target}.part{i}");
                    let sname = format!("{name}.scale_inv");
                    new_buffers.insert(name.clone(), json!({"dtype": "f8e4m3", "shape": [p.rows, k], "role": "weight", "from": {"tensor": p.tensor}}));
                    new_buffers.insert(sname.clone(), json!({"dtype": "f32", "shape": [p.rows.div_ceil(BLOCK as u64), k / BLOCK as u64], "role": "weight", "from": {"tensor": p.scale}}));
                    w_bufs.push((name, sname, p.rows));
                }
            }
            // Biases: the fused one, or one per part (split GEMVs add their own).
            let bias = args.get(2).cloned().unwrap_or(json!({"null": true}));
            let mut part_bias = vec![];
            if !fused {
                let src = bias["buf"].as_str().and_then(|b| buffers.get(b).map(|v| (b.to_string(), v.clone())));
                for (i, p) in parts.iter().enumerate() {
                    match &src {
                        Some((bname, bv)) => {
                            let t = bv["from"]["concat"][i].as_str().ok_or_else(|| format!("{bname}: a split projection's bias must be a concatenation"))?;
                            let name = format!("{bname}.part{i}");
                            new_buffers.insert(name.clone(), json!({"dtype": "bf16", "shape": [p.rows], "role": "weight", "from": {"tensor": t}}));
                            part_bias.push(json!({"buf": name}));
                        }
                        None => part_bias.push(json!({"null": true})),
                    }
                }
            }
            let m_var = args.get(4).and_then(|a| a["var"].as_str()).unwrap_or("tokens").to_string();
            let m_max = if m_var == "seqs" { m["vars"]["seqs"]["max"].as_u64().unwrap_or(1) } else { max_tokens };
            // The LM head always runs the GEMVs (its dequantized copy would be the vocabulary).
            let prefill = if f32_out || m_max <= GEMV_MAX_ROWS {
                None
            } else if opts.prefill == Fp8Prefill::W8a8 && fused {
                xq_elems = xq_elems.max(max_tokens * k);
                xs_elems = xs_elems.max(max_tokens * (k / BLOCK as u64));
                Some(Fp8Prefill::W8a8)
            } else {
                scratch_elems = scratch_elems.max(n_total * k);
                wgmma_bf16 = true;
                Some(Fp8Prefill::Dequant)
            };
            let name = format!("{op}_fp8{}{}", if fused { String::new() } else { format!("_x{}", parts.len()) }, match prefill {
                Some(Fp8Prefill::W8a8) => "_w8a8",
                _ => "",
            });
            if !new_ops.contains_key(&name) {
                new_ops.insert(name.clone(), proj_op(&w_bufs, k, n_total, &m_var, m_max, f32_out, prefill, pdl));
            }
            // [x, (W_i, S_i)…, part biases…, bias, y, m, scratch…]
            let mut a = vec![args[0].clone()];
            for (wb, sb, _) in &w_bufs {
                a.push(json!({"buf": wb}));
                a.push(json!({"buf": sb}));
            }
            a.extend(part_bias);
            a.push(bias);
            a.push(args[3].clone());
            a.push(args[4].clone());
            match prefill {
                Some(Fp8Prefill::Dequant) => a.push(json!({"buf": SCRATCH})),
                Some(Fp8Prefill::W8a8) => {
                    a.push(json!({"buf": XQ}));
                    a.push(json!({"buf": XS}));
                }
                None => {}
            }
            call["op"] = json!(name);
            call["args"] = Value::Array(a);
            rewritten.push(call);
        }
        match prog.strip_prefix("programs.") {
            Some(k) => m["programs"][k]["calls"] = Value::Array(rewritten),
            None => m["program"]["calls"] = Value::Array(rewritten),
        }
    }
    if new_ops.is_empty() {
        return Ok(out);
    }
    let bufs = m["buffers"].as_object_mut().expect("buffers");
    for (name, (sname, parts)) in &retyped {
        let Some(b) = bufs.get_mut(name) else { continue };
        b["dtype"] = json!("f8e4m3");
        let (n, k) = (b["shape"][0].as_u64().unwrap_or(0), b["shape"][1].as_u64().unwrap_or(0));
        let from = if parts.len() == 1 {
            json!({"tensor": parts[0].scale})
        } else {
            json!({"concat": parts.iter().map(|p| p.scale.clone()).collect::<Vec<_>>(), "axis": 0, "sizes": parts.iter().map(|p| p.rows / BLOCK as u64).collect::<Vec<_>>()})
        };
        bufs.insert(sname.clone(), json!({"dtype": "f32", "shape": [n.div_ceil(BLOCK as u64), k.div_ceil(BLOCK as u64)], "role": "weight", "from": from}));
        out.weights += 1;
    }
    // Aliases of a retyped weight take its dtype (a tied FP8 LM head).
    let aliases: Vec<(String, String)> = bufs.iter().filter_map(|(n, b)| Some((n.clone(), b["from"]["alias"].as_str()?.to_string()))).collect();
    for (n, target) in aliases {
        if retyped.contains_key(&target) {
            bufs.get_mut(&n).expect("listed")["dtype"] = json!("f8e4m3");
        }
    }
    out.weights += new_buffers.keys().filter(|k| k.ends_with(".scale_inv")).count();
    bufs.extend(new_buffers);
    if scratch_elems > 0 {
        bufs.insert(SCRATCH.into(), json!({"dtype": "bf16", "shape": [scratch_elems]}));
    }
    if xq_elems > 0 {
        bufs.insert(XQ.into(), json!({"dtype": "f8e4m3", "shape": [xq_elems]}));
        bufs.insert(XS.into(), json!({"dtype": "f32", "shape": [xs_elems]}));
    }
    // Drop what no call binds any more (the fused weights a split replaced, unused ops, modules).
    let used = used_names(m);
    m["buffers"].as_object_mut().expect("buffers").retain(|n, b| b["role"] != "weight" || used.contains(n));
    m["ops"].as_object_mut().ok_or("manifest without ops")?.extend(new_ops);
    let called = called_ops(m);
    m["ops"].as_object_mut().expect("ops").retain(|n, _| called.contains(n));
    let launched: BTreeSet<String> = m["ops"]
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .flat_map(|op| op["impl"]["launches"].as_array().cloned().unwrap_or_default())
        .filter_map(|l| l["module"].as_str().map(str::to_string))
        .collect();
    out.modules.push(MODULE);
    if launched.contains(WGMMA_MODULE) {
        out.modules.push(WGMMA_MODULE);
    }
    if let Some(mods) = m["modules"].as_object_mut() {
        mods.retain(|n, _| launched.contains(n) || out.modules.contains(&n.as_str()));
    }
    if wgmma_bf16 && !m["modules"].as_object().is_some_and(|o| o.contains_key("gemm_wgmma")) {
        return Err("the FP8 prefill path needs the gemm_wgmma module, which the manifest does not load".into());
    }
    Ok(out)
}

/// Every buffer name a call binds, and every buffer an alias points at.
fn used_names(m: &Value) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut progs = vec![&m["program"]];
    if let Some(p) = m["programs"].as_object() {
        progs.extend(p.values());
    }
    for p in progs {
        for c in p["calls"].as_array().into_iter().flatten() {
            for a in c["args"].as_array().into_iter().flatten() {
                if let Some(b) = a["buf"].as_str() {
                    used.insert(b.to_string());
                }
            }
        }
    }
    for (_, b) in m["buffers"].as_object().into_iter().flatten() {
        if let Some(a) = b["from"]["alias"].as_str() {
            used.insert(a.to_string());
        }
    }
    used
}

fn called_ops(m: &Value) -> BTreeSet<String> {
    let mut progs = vec![&m["program"]];
    if let Some(p) = m["programs"].as_object() {
        progs.extend(p.values());
    }
    progs.iter().flat_map(|p| p["calls"].as_array().cloned().unwrap_or_default()).filter_map(|c| c["op"].as_str().map(str::to_string)).collect()
}

/// An FP8 projection op: params `[x, (W_i, S_i)…, (bias_i…,) bias, y, m, scratch…]` (per-part
/// biases only when split; scratch: the bf16 matrix, or the W8A8 path's xq and xs).
#[allow(clippy::too_many_arguments)]
fn proj_op(w: &[(String, String, u64)], k: u64, n_total: u64, m: &str, m_max: u64, f32_out: bool, prefill: Option<Fp8Prefill>, pdl: bool) -> Value {
    let out_t = if f32_out { "out buffer<f32>" } else { "out buffer<bf16>" };
    let np = w.len();
    let split = np > 1;
    let np_b = if split { np } else { 0 };
    let mut params = vec![json!("in buffer<bf16>")];
    for _ in w {
        params.push(json!("in buffer<f8e4m3>"));
        params.push(json!("in buffer<f32>"));
    }
    params.extend((0..np_b).map(|_| json!("ptr")));
    let bias_fused = params.len();
    params.push(json!("ptr"));
    let y = params.len();
    params.push(json!(out_t));
    let mv = params.len();
    params.push(json!("i32"));
    let scratch = params.len();
    match prefill {
        Some(Fp8Prefill::Dequant) => params.push(json!("out buffer<bf16>")),
        Some(Fp8Prefill::W8a8) => {
            params.push(json!("out buffer<f8e4m3>"));
            params.push(json!("out buffer<f32>"));
        }
        None => {}
    }
    let mut launches = vec![];
    let top = if prefill.is_some() { Some(GEMV_MAX_ROWS) } else { None };
    let ranges: Vec<(u64, Option<u64>, bool)> = if pdl && m_max > 8 { vec![(1, Some(8), true), (9, top, false)] } else { vec![(1, top, pdl)] };
    for (lo, hi, with_pdl) in ranges {
        if lo > m_max {
            continue;
        }
        let mut col0 = 0;
        for (i, (_, _, rows)) in w.iter().enumerate() {
            let (entry, block) = gemv_entry(*rows, f32_out);
            let bias = if split { json!({"param": 1 + 2 * np + i}) } else { json!({"param": bias_fused}) };
            let mut l = json!({
                "module": MODULE, "entry": entry,
                "params": ["in buffer<bf16>", "in buffer<f8e4m3>", "in buffer<f32>", "ptr", out_t, "i32", "i32", "i32", "i32", "i32"],
                "block": [block], "grid": [format!("ceil({rows}/16) * {}", within(m, lo, hi))],
                "args": [{"param": 0}, {"param": 1 + 2 * i}, {"param": 2 + 2 * i}, bias, {"param": y}, {"param": mv}, {"i32": rows}, {"i32": k}, {"i32": n_total}, {"i32": col0}]});
            if with_pdl {
                l["pdl"] = json!(true);
            }
            launches.push(l);
            col0 += rows;
        }
    }
    let big = within(m, GEMV_MAX_ROWS + 1, None);
    match prefill {
        Some(Fp8Prefill::Dequant) => {
            let mut row0 = 0;
            for (i, (_, _, rows)) in w.iter().enumerate() {
                launches.push(json!({
                    "module": MODULE, "entry": "dequant_fp8_bf16",
                    "params": ["in buffer<f8e4m3>", "in buffer<f32>", "out buffer<bf16>", "i32", "i32", "i32"],
                    "block": [256], "grid": [format!("ceil({}/2048) * {big}", rows * k)],
                    "args": [{"param": 1 + 2 * i}, {"param": 2 + 2 * i}, {"param": scratch}, {"i32": rows}, {"i32": k}, {"i32": row0}]}));
                row0 += rows;
            }
            let (wg, bn) = if n_total >= 4096 { ("gemm_bf16_wgmma", 256) } else { ("gemm_bf16_wgmma_n128", 128) };
            launches.push(json!({
                "module": "gemm_wgmma", "entry": format!("{wg}{}", if f32_out { "_f32out" } else { "" }),
                "params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", out_t, "i32", "i32", "i32"],
                "block": [256], "grid": [format!("ceil({m}/128) * {big}"), format!("ceil({n_total}/{bn})")], "shared": 197632,
                "args": [{"param": 0}, {"param": scratch}, {"param": bias_fused}, {"param": y}, {"param": mv}, {"i32": n_total}, {"i32": k}]}));
        }
        Some(Fp8Prefill::W8a8) => {
            launches.push(json!({
                "module": MODULE, "entry": "quant_fp8_act",
                "params": ["in buffer<bf16>", "out buffer<f8e4m3>", "out buffer<f32>", "i32", "i32"],
                "block": [256], "grid": [format!("ceil({m} * {k} / 1024) * {big}")],
                "args": [{"param": 0}, {"param": scratch}, {"param": scratch + 1}, {"param": mv}, {"i32": k}]}));
            launches.push(json!({
                "module": WGMMA_MODULE, "entry": format!("gemm_fp8_wgmma{}", if f32_out { "_f32out" } else { "" }),
                "params": ["in buffer<f8e4m3>", "in buffer<f32>", "in buffer<f8e4m3>", "in buffer<f32>", "ptr", out_t, "i32", "i32", "i32"],
                "block": [256], "grid": [format!("ceil({m}/128) * {big}"), format!("ceil({n_total}/128)")], "shared": 197632,
                "args": [{"param": scratch}, {"param": scratch + 1}, {"param": 1}, {"param": 2}, {"param": bias_fused}, {"param": y}, {"param": mv}, {"i32": n_total}, {"i32": k}]}));
        }
        None => {}
    }
    json!({"params": params, "impl": {"launches": launches}})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of an e4m3 code from its definition (independent of [`e4m3_to_f32`]).
    fn def(b: u8) -> f64 {
        let (e, m) = (i32::from((b >> 3) & 15), f64::from(b & 7));
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        if e == 15 && m == 7.0 {
            f64::NAN
        } else if e == 0 {
            s * m / 512.0
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    /// The nearest code by search, ties to the even code, |x| > 464 → NaN (PyTorch's unsaturated cast).
    fn nearest(f: f32) -> u8 {
        if f.is_nan() || f.abs() > 464.0 {
            return 0x7F | if f.is_sign_negative() { 0x80 } else { 0 };
        }
        let a = f64::from(f.abs());
        let mut best = 0u8;
        for c in 1..=0x7Eu8 {
            let (d, bd) = ((def(c) - a).abs(), (def(best) - a).abs());
            if d < bd || (d == bd && c & 1 == 0 && best & 1 == 1) {
                best = c;
            }
        }
        best | if f.is_sign_negative() { 0x80 } else { 0 }
    }

    #[test]
    fn decode_is_the_e4m3_definition() {
        for b in 0..=255u8 {
            let (v, d) = (e4m3_to_f32(b), def(b));
            if d.is_nan() {
                assert!(v.is_nan() && v.is_sign_negative() == (b & 0x80 != 0), "{b:#04x}");
                assert_eq!(v.to_bits() & 0x7fff_ffff, 0x7FF0_0000, "PyTorch's NaN bits");
            } else {
                assert_eq!(f64::from(v), d, "{b:#04x}");
                assert_eq!(v.is_sign_negative(), b & 0x80 != 0);
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
    }

    #[test]
    fn encode_is_round_to_nearest_even_as_pytorch() {
        // Every code's value, the midpoints between codes and their neighbours, and the edges.
        let mut probes = vec![0.0f32, -0.0, 448.0, 450.0, 464.0, 464.001, 479.0, 480.0, 1e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, 2f32.powi(-10), 2f32.powi(-10) * 1.0001];
        for c in 0..0x7Eu8 {
            for v in [def(c), def(c + 1), (def(c) + def(c + 1)) / 2.0] {
                let f = v as f32;
                probes.extend([f, f32::from_bits(f.to_bits().wrapping_sub(1)), f32::from_bits(f.to_bits() + 1)]);
            }
        }
        let mut z = 1u64;
        for _ in 0..100_000 {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            probes.push(f32::from_bits((z >> 32) as u32 & 0x7fff_ffff).min(600.0) * if z & 1 == 0 { 1.0 } else { -1.0 });
            probes.push(((z >> 40) as f32 / (1u64 << 24) as f32) * 2f32.powi((z % 24) as i32 - 14));
        }
        for f in probes {
            let (got, want) = (e4m3_from_f32(f), nearest(f));
            assert_eq!(got, want, "{f:e} ({:#010x})", f.to_bits());
            // Round trip of every code.
        }
        for b in 0..=255u8 {
            if b & 0x7F != 0x7F {
                assert_eq!(e4m3_from_f32(e4m3_to_f32(b)), b, "{b:#04x}");
            }
        }
        assert_eq!(e4m3_sat(1e9), 0x7E);
        assert_eq!(e4m3_sat(-500.0), 0xFE);
        assert_eq!(e4m3_sat(f32::NAN), 0x7F);
        assert_eq!(e4m3_from_f32(470.0), 0x7F, "unsaturated: past 464 is NaN, as torch");
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
    }

    #[test]
    fn block_quantization_round_trip() {
        // 300 x 392: edge blocks in both dimensions; one block with a large outlier, one all zero.
        let (n, k) = (300usize, 392usize);
        let mut s = 7u64;
        let mut w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
        w[5 * k + 7] = 3.5; // block (0, 0)
        for r in 128..256 {
            for c in 256..384 {
                w[r * k + c] = 0.0; // block (1, 2)
            }
        }
        let q = quantize(&w, n, k).unwrap();
        assert_eq!(q.scale_inv.len(), 3 * 4);
        assert_eq!(q.scale_inv[6], 1.0, "an all-zero block's scale");
        let back = dequantize(&q, n, k);
        for bi in 0..3 {
            for bj in 0..4 {
                let s = q.scale_inv[bi * 4 + bj];
                let (mut amax, mut hit) = (0f32, false);
                for r in bi * 128..((bi + 1) * 128).min(n) {
                    for c in bj * 128..((bj + 1) * 128).min(k) {
                        let (x, y) = (w[r * k + c], back[r * k + c]);
                        amax = amax.max(x.abs());
                        // Each weight within half a code step: e4m3 has 3 mantissa bits, so
                        // |error| <= 2^-4 |x| for normals, <= 2^-10 · s in the subnormal range.
                        assert!((x - y).abs() <= (x.abs() / 16.0).max(s / 1024.0) * 1.0001, "({r}, {c}): {x} -> {y} (s {s})");
                        hit |= q.weight[r * k + c] & 0x7F == 0x7E;
                        // The code is exactly the torch cast of w / s.
                        assert_eq!(q.weight[r * k + c], e4m3_sat(x / s));
                    }
                }
                if amax > 0.0 {
                    assert_eq!(s, amax / 448.0, "block ({bi}, {bj})");
                    assert!(hit, "the block maximum maps to 448");
                }
            }
        }
        assert!(quantize(&[f32::NAN; 4], 2, 2).unwrap_err().contains("NaN"));
        assert!(quantize(&[0.0; 3], 2, 2).is_err());
    }

    #[test]
    fn reads_quantization_config() {
        assert_eq!(scheme(&json!({"model_type": "qwen3"})).unwrap(), None);
        let qwen = json!({"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}});
        assert_eq!(scheme(&qwen).unwrap(), Some(Scheme { not_converted: vec![] }));
        assert_eq!(scheme(&json!({"quantization_config": quantization_config(&["lm_head".into()])})).unwrap(), Some(Scheme { not_converted: vec!["lm_head".into()] }));
        let e = scheme(&json!({"quantization_config": {"quant_method": "gptq", "bits": 4}})).unwrap_err();
        assert!(e.contains("`gptq`") && e.contains("--quant fp8"), "{e}");
        let e = scheme(&json!({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})).unwrap_err();
        assert!(e.contains("no weight_block_size"), "{e}");
        let e = scheme(&json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [1, 128]}})).unwrap_err();
        assert!(e.contains("[1,128]"), "{e}");
        let e = scheme(&json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}})).unwrap_err();
        assert!(e.contains("static"), "{e}");
        assert_eq!("fp8".parse::<Quant>(), Ok(Quant::Fp8));
        assert!("int4".parse::<Quant>().unwrap_err().contains("supported: fp8"));
        assert_eq!("w8a8".parse::<Fp8Prefill>(), Ok(Fp8Prefill::W8a8));
    }
}
