//! GGUF-native weights (issue 25): a pass over a generated manifest that keeps the projection,
//! LM-head and embedding weights of a GGUF file in the file's own blocks (`q4_k`, `q6_k`, …
//! buffers holding the file's bytes) and runs them with the block kernels:
//!
//! * steps of at most [`GEMV_MAX_ROWS`] rows (decode, verify, small prefill chunks) and every
//!   LM head: `gemv_<t>` (gemv_gguf.cu) — the weights are read once per 8 rows, dequantized in
//!   registers against bf16 activations, and a row's bits do not depend on the step's size;
//! * larger steps (prefill): `dequant_<t>_bf16` into one scratch matrix (the bf16 values a
//!   dequantized pack would hold), then the bf16 wgmma GEMM on it;
//! * embeddings: `embedding_<t>` (embedding_gguf.cu), the dequantized pack's values bit for bit.
//!
//! A projection whose parts (q, k, v; gate, up) have different block types (a Q4_K_M file keeps
//! `attn_v` in Q6_K on some layers) is split: one GEMV per part writes its columns of the fused
//! output (`ldy`, `col0`), and the dequantization fills its rows of the scratch. A projection
//! with a part the file stores as a float (F16, F32, BF16) stays bf16, dequantized at load as
//! before. The pass runs on the finished manifest (after GGUF renaming), so the builder stays
//! one builder for every format.

use kern_manifest::DType;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Steps with at most this many rows run the GEMVs (in passes of 8 rows); larger ones
/// dequantize into the scratch and run the bf16 wgmma GEMM (its range starts at 65 rows).
pub const GEMV_MAX_ROWS: u64 = 64;

/// The module of the block GEMVs and dequantization kernels.
pub const GEMV_MODULE: &str = "gemv_gguf";
/// The module of the block embedding lookups.
pub const EMBED_MODULE: &str = "embedding_gguf";
/// The scratch matrix prefill dequantizes into.
pub const SCRATCH: &str = "wscratch";

/// What the pass did, for `kern pack`'s summary.
#[derive(Debug, Default)]
pub struct Native {
    /// Weight buffers now in their file's blocks, by block dtype name.
    pub by_type: BTreeMap<&'static str, u64>,
    /// Projections left in bf16 because a part is a float tensor, by buffer name.
    pub dequantized: Vec<String>,
    /// The modules the manifest now needs besides the builder's.
    pub modules: Vec<&'static str>,
}

/// The ops whose calls are projections `[x, W, bias, y, m]`, and whether their output is fp32.
pub(crate) const PROJECTIONS: &[(&str, bool)] = &[("qkv_proj", false), ("o_proj", false), ("gate_up_proj", false), ("down_proj", false), ("lm_head", true)];

/// 1 when lo <= m <= hi (hi None: no upper bound), else 0, as a grid factor.
pub(crate) fn within(m: &str, lo: u64, hi: Option<u64>) -> String {
    let lower = format!("max(0, min(1, {m} - {}))", lo - 1);
    match hi {
        Some(hi) => format!("{lower} * max(0, min(1, {} - {m}))", hi + 1),
        None => lower,
    }
}

/// One part of a projection's weight: its source tensor, rows and block type.
#[derive(Clone, Debug)]
struct Part {
    tensor: String,
    rows: u64,
    dtype: DType,
}

/// The GEMV family of an N-row projection: the 8-warp entries where the 4-warp grid
/// (ceil(N/16) CTAs) would not fill the GPU twice over (packs/kernels/KERNELS.md).
fn gemv_entry(t: DType, n: u64, f32_out: bool) -> (String, u64, u64) {
    let w8 = n.div_ceil(16) < 264;
    let name = t.name();
    let entry = format!("gemv_{name}{}{}", if w8 { "_w8" } else { "" }, if f32_out { "_f32out" } else { "" });
    // The 8-warp ring's dynamic shared memory (KERNELS.md, "GGUF-native GEMVs").
    let shared = if !w8 {
        0
    } else {
        match t {
            DType::Q3K | DType::Q4K => 55312,
            DType::Q5K | DType::Q8_0 => 67600,
            DType::Q6K => 92176,
            _ => 0,
        }
    };
    (entry, if w8 { 256 } else { 128 }, shared)
}

/// Rewrites `m` (a generated manifest whose weight sources name checkpoint tensors) so that the
/// weights whose tensors `format` gives a block dtype stay in those blocks. `max_tokens`: the
/// `tokens` var's maximum (a dequantization path exists only when a step can exceed
/// [`GEMV_MAX_ROWS`]); `pdl`: give the launches of steps of at most 8 rows the PDL attribute.
pub fn apply(m: &mut Value, format: &dyn Fn(&str) -> Option<DType>, max_tokens: u64, pdl: bool) -> Result<Native, String> {
    let mut out = Native::default();
    let buffers = m["buffers"].as_object().cloned().ok_or("manifest without buffers")?;
    // The block parts of a weight buffer (following an alias), or why it stays bf16.
    let parts_of = |name: &str| -> Option<(Vec<Part>, u64)> {
        let mut b = buffers.get(name)?;
        if let Some(a) = b["from"]["alias"].as_str() {
            b = buffers.get(a)?;
        }
        let shape = b["shape"].as_array()?;
        let (n, k) = (shape.first()?.as_u64()?, shape.get(1)?.as_u64()?);
        let from = &b["from"];
        let parts: Vec<(String, u64)> = if let Some(t) = from["tensor"].as_str() {
            vec![(t.to_string(), n)]
        } else if let Some(list) = from["concat"].as_array() {
            let sizes: Vec<u64> = from["sizes"].as_array()?.iter().filter_map(Value::as_u64).collect();
            if from["axis"].as_u64().unwrap_or(0) != 0 || sizes.len() != list.len() {
                return None;
            }
            list.iter().zip(sizes).map(|(t, r)| Some((t.as_str()?.to_string(), r))).collect::<Option<_>>()?
        } else {
            return None;
        };
        let parts: Vec<Part> = parts.into_iter().map(|(tensor, rows)| Some(Part { dtype: format(&tensor)?, tensor, rows })).collect::<Option<_>>()?;
        if from.get("shard").is_some() || parts.iter().any(|p| !k.is_multiple_of(p.dtype.block_elems())) {
            return None;
        }
        Some((parts, k))
    };

    let mut new_ops = Map::new();
    let mut new_buffers: Map<String, Value> = Map::new();
    let mut retyped: BTreeMap<String, (DType, u64)> = BTreeMap::new(); // buffer -> (dtype, K)
    let mut scratch_elems = 0u64;
    let dequant_path = max_tokens > GEMV_MAX_ROWS;
    let programs: Vec<String> = std::iter::once("program".to_string())
        .chain(m["programs"].as_object().map(|p| p.keys().map(|k| format!("programs.{k}")).collect::<Vec<_>>()).unwrap_or_default())
        .collect();
    for prog in &programs {
        let calls = match prog.strip_prefix("programs.") {
            Some(k) => m["programs"][k]["calls"].as_array().cloned(),
            None => m["program"]["calls"].as_array().cloned(),
        }
        .unwrap_or_default();
        let mut rewritten = Vec::with_capacity(calls.len());
        for mut call in calls {
            let op = call["op"].as_str().unwrap_or_default().to_string();
            if let Some(&(_, f32_out)) = PROJECTIONS.iter().find(|(o, _)| *o == op) {
                let args = call["args"].as_array().cloned().unwrap_or_default();
                let w = args.get(1).and_then(|a| a["buf"].as_str()).unwrap_or_default().to_string();
                let Some((parts, k)) = parts_of(&w) else {
                    if !out.dequantized.contains(&w) && buffers.get(&w).is_some_and(|b| b["from"].get("alias").is_none()) {
                        out.dequantized.push(w.clone());
                    }
                    rewritten.push(call);
                    continue;
                };
                let same = parts.iter().all(|p| p.dtype == parts[0].dtype);
                let n_total: u64 = parts.iter().map(|p| p.rows).sum();
                // The weight buffers: the fused one retyped, or one per part.
                let mut w_bufs = vec![];
                if same {
                    retyped.insert(w.clone(), (parts[0].dtype, k));
                    w_bufs.push((w.clone(), parts[0].dtype, n_total));
                } else {
                    for (i, p) in parts.iter().enumerate() {
                        let name = format!("{w}.part{i}");
                        new_buffers.insert(name.clone(), json!({"dtype": p.dtype.name(), "shape": [p.rows, k / p.dtype.block_elems()], "role": "weight", "from": {"tensor": p.tensor}}));
                        w_bufs.push((name, p.dtype, p.rows));
                    }
                }
                // Biases: the fused one for the GEMM; one per part for the split GEMVs.
                let bias = args.get(2).cloned().unwrap_or(json!({"null": true}));
                let mut part_bias = vec![];
                if !same {
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
                // The LM head (fp32 out, `seqs` rows) always runs the GEMVs: its dequantized
                // copy would be the whole vocabulary.
                let gemm = dequant_path && !f32_out && m_max > GEMV_MAX_ROWS;
                if gemm {
                    scratch_elems = scratch_elems.max(n_total * k);
                }
                let types: Vec<&str> = w_bufs.iter().map(|(_, t, _)| t.name()).collect();
                let name = format!("{op}_{}", types.join("_"));
                if !new_ops.contains_key(&name) {
                    new_ops.insert(name.clone(), proj_op(&w_bufs, k, n_total, &m_var, m_max, f32_out, gemm, pdl));
                }
                // [x, W parts…, part biases…, fused bias, y, m, scratch?]
                let mut a = vec![args[0].clone()];
                a.extend(w_bufs.iter().map(|(b, _, _)| json!({"buf": b})));
                a.extend(part_bias);
                a.push(bias);
                a.push(args[3].clone());
                a.push(args[4].clone());
                if gemm {
                    a.push(json!({"buf": SCRATCH}));
                }
                call["op"] = json!(name);
                call["args"] = Value::Array(a);
                for (_, t, _) in &w_bufs {
                    *out.by_type.entry(t.name()).or_default() += 1;
                }
            } else if op == "embedding" {
                let args = call["args"].as_array().cloned().unwrap_or_default();
                let table = args.get(1).and_then(|a| a["buf"].as_str()).unwrap_or_default().to_string();
                if let Some((parts, k)) = parts_of(&table).filter(|(p, _)| p.len() == 1) {
                    let t = parts[0].dtype;
                    retyped.insert(table.clone(), (t, k));
                    let res = args[0]["buf"].as_str().unwrap_or_default();
                    let f32_res = buffers.get(res).is_some_and(|b| b["dtype"] == "f32");
                    let old = &m["ops"]["embedding"]["impl"]["launches"][0];
                    let scale = old["args"][6].clone();
                    let name = format!("embedding_{}", t.name());
                    if !new_ops.contains_key(&name) {
                        new_ops.insert(name.clone(), embed_op(t, f32_res, k, parts[0].rows, scale, pdl));
                    }
                    call["op"] = json!(name);
                    *out.by_type.entry(t.name()).or_default() += 1;
                }
            }
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
    // Retype the weights kept whole (and aliases of them: a tied LM head).
    let bufs = m["buffers"].as_object_mut().expect("buffers");
    for (name, (t, k)) in &retyped {
        if let Some(b) = bufs.get_mut(name) {
            b["dtype"] = json!(t.name());
            b["shape"][1] = json!(k / t.block_elems());
        }
    }
    let aliases: Vec<(String, String)> = bufs.iter().filter_map(|(n, b)| Some((n.clone(), b["from"]["alias"].as_str()?.to_string()))).collect();
    for (n, target) in aliases {
        if let Some((t, k)) = retyped.get(&target) {
            let b = bufs.get_mut(&n).expect("listed");
            b["dtype"] = json!(t.name());
            b["shape"][1] = json!(k / t.block_elems());
        }
    }
    bufs.extend(new_buffers);
    if scratch_elems > 0 {
        bufs.insert(SCRATCH.into(), json!({"dtype": "bf16", "shape": [scratch_elems]}));
    }
    // Drop what no call binds any more (the fused weights a split replaced, unused ops).
    let used = used_names(m);
    let bufs = m["buffers"].as_object_mut().expect("buffers");
    bufs.retain(|n, b| b["role"] != "weight" || used.contains(n));
    let ops = m["ops"].as_object_mut().expect("ops");
    ops.extend(new_ops);
    let called: std::collections::HashSet<String> = calls_ops(m);
    m["ops"].as_object_mut().expect("ops").retain(|n, _| called.contains(n));
    // Modules no launch uses any more (the bf16 GEMVs a small model no longer runs).
    let launched: std::collections::HashSet<String> = m["ops"]
        .as_object()
        .into_iter()
        .flat_map(|o| o.values())
        .flat_map(|op| op["impl"]["launches"].as_array().cloned().unwrap_or_default())
        .filter_map(|l| l["module"].as_str().map(str::to_string))
        .collect();
    if let Some(mods) = m["modules"].as_object_mut() {
        mods.retain(|n, _| launched.contains(n) || n == GEMV_MODULE || n == EMBED_MODULE);
    }
    out.modules.push(GEMV_MODULE);
    if called.iter().any(|o| o.starts_with("embedding_")) {
        out.modules.push(EMBED_MODULE);
    }
    Ok(out)
}

/// Every buffer name a call binds, and every buffer an alias points at.
fn used_names(m: &Value) -> std::collections::HashSet<String> {
    let mut used = std::collections::HashSet::new();
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

fn calls_ops(m: &Value) -> std::collections::HashSet<String> {
    let mut ops = std::collections::HashSet::new();
    let mut progs = vec![&m["program"]];
    if let Some(p) = m["programs"].as_object() {
        progs.extend(p.values());
    }
    for p in progs {
        for c in p["calls"].as_array().into_iter().flatten() {
            if let Some(o) = c["op"].as_str() {
                ops.insert(o.to_string());
            }
        }
    }
    ops
}

/// A projection op over block weights: params `[x, W_0…, (bias_0…,) bias, y, m, scratch?]`
/// (the per-part biases only when the weight is split into parts).
#[allow(clippy::too_many_arguments)]
fn proj_op(w: &[(String, DType, u64)], k: u64, n_total: u64, m: &str, m_max: u64, f32_out: bool, gemm: bool, pdl: bool) -> Value {
    let out_t = if f32_out { "out buffer<f32>" } else { "out buffer<bf16>" };
    let np = w.len();
    let mut params = vec![json!("in buffer<bf16>")];
    params.extend(w.iter().map(|(_, t, _)| json!(format!("in buffer<{}>", t.name()))));
    let split = np > 1;
    let np_b = if split { np } else { 0 };
    params.extend((0..np_b).map(|_| json!("ptr")));
    params.push(json!("ptr"));
    params.push(json!(out_t));
    params.push(json!("i32"));
    if gemm {
        params.push(json!("out buffer<bf16>"));
    }
    let (bias_fused, y, mv, scratch) = (1 + np + np_b, 2 + np + np_b, 3 + np + np_b, 4 + np + np_b);
    let mut launches = vec![];
    // GEMVs for 1..=min(m_max, 64) rows (all rows without a dequantization path), in two
    // ranges so that steps of at most 8 rows can launch with PDL.
    let top = if gemm { GEMV_MAX_ROWS } else { m_max };
    let ranges: Vec<(u64, Option<u64>, bool)> = if pdl && top > 8 { vec![(1, Some(8), true), (9, if gemm { Some(top) } else { None }, false)] } else { vec![(1, if gemm { Some(top) } else { None }, pdl)] };
    for (lo, hi, with_pdl) in ranges {
        let mut col0 = 0;
        for (i, (_, t, rows)) in w.iter().enumerate() {
            let (entry, block, shared) = gemv_entry(*t, *rows, f32_out);
            // A split part adds its own bias; a whole weight the fused one.
            let bias = if split { json!({"param": 1 + np + i}) } else { json!({"param": bias_fused}) };
            let mut l = json!({
                "module": GEMV_MODULE, "entry": entry,
                "params": ["in buffer<bf16>", format!("in buffer<{}>", t.name()), "ptr", out_t, "i32", "i32", "i32", "i32", "i32"],
                "block": [block], "grid": [format!("ceil({rows}/16) * {}", within(m, lo, hi))], "shared": shared,
                "args": [{"param": 0}, {"param": 1 + i}, bias, {"param": y}, {"param": mv}, {"i32": rows}, {"i32": k}, {"i32": n_total}, {"i32": col0}]});
            if with_pdl {
                l["pdl"] = json!(true);
            }
            launches.push(l);
            col0 += rows;
        }
    }
    if gemm {
        // Prefill: every part dequantized into its rows of the scratch, then one bf16 GEMM.
        let mut row0 = 0;
        for (i, (_, t, rows)) in w.iter().enumerate() {
            launches.push(json!({
                "module": GEMV_MODULE, "entry": format!("dequant_{}_bf16", t.name()),
                "params": [format!("in buffer<{}>", t.name()), "out buffer<bf16>", "i32", "i32", "i32"],
                "block": [256], "grid": [format!("ceil({}/2048) * {}", rows * k, within(m, GEMV_MAX_ROWS + 1, None))],
                "args": [{"param": 1 + i}, {"param": scratch}, {"i32": rows}, {"i32": k}, {"i32": row0}]}));
            row0 += rows;
        }
        let (wg, bn) = if n_total >= 4096 { ("gemm_bf16_wgmma", 256) } else { ("gemm_bf16_wgmma_n128", 128) };
        launches.push(json!({
            "module": "gemm_wgmma", "entry": format!("{wg}{}", if f32_out { "_f32out" } else { "" }),
            "params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", out_t, "i32", "i32", "i32"],
            "block": [256], "grid": [format!("ceil({m}/128) * {}", within(m, GEMV_MAX_ROWS + 1, None)), format!("ceil({n_total}/{bn})")], "shared": 197632,
            "args": [{"param": 0}, {"param": scratch}, {"param": bias_fused}, {"param": y}, {"param": mv}, {"i32": n_total}, {"i32": k}]}));
    }
    let _ = m_max;
    json!({"params": params, "impl": {"launches": launches}})
}

/// An embedding op over a block table: params as `embedding`'s `[out, table, ids, tokens]`.
fn embed_op(t: DType, f32_res: bool, hidden: u64, vocab: u64, scale: Value, pdl: bool) -> Value {
    let out_t = if f32_res { "out buffer<f32>" } else { "out buffer<bf16>" };
    let table = format!("in buffer<{}>", t.name());
    let launch = |grid: String, with_pdl: bool| {
        let mut l = json!({
            "module": EMBED_MODULE, "entry": format!("embedding_{}{}", t.name(), if f32_res { "_f32" } else { "" }),
            "params": [out_t, table, "in buffer<i32>", "i32", "i32", "i32", "f32"],
            "block": [128], "grid": [grid],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"i32": hidden}, {"i32": vocab}, scale]});
        if with_pdl {
            l["pdl"] = json!(true);
        }
        l
    };
    let launches = if pdl {
        vec![launch(format!("tokens * {}", within("tokens", 1, Some(8))), true), launch(format!("tokens * {}", within("tokens", 9, None)), false)]
    } else {
        vec![launch("tokens".into(), false)]
    };
    json!({"params": [out_t, table, "in buffer<i32>", "i32"], "impl": {"launches": launches}})
}
