//! Seeded random weights with real shapes, in the Hugging Face layout (the tensor names of the
//! real checkpoints), plus a `config.json` transformers loads unchanged — so kern and the
//! reference load the very same files. Matrices and biases are normal(0, 0.02) (activations
//! stay finite through 36 layers); norm weights are 1 + normal(0, 0.02), or normal(0, 0.1) for
//! a zero-centred `(1 + w)` norm (Gemma 3: transformers initializes those to 0, where a missing
//! "+1" would go unnoticed; random ones make it show).
//!
//! Every tensor's values depend only on (seed, tensor name, element index), so the output does
//! not depend on thread count or write order. Files above `shard_bytes` are split into shards
//! with a `model.safetensors.index.json`, as the Hub does.

use crate::config::{Config, NormKind};
use crate::{io, PackError, Result};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::BTreeMap;
use std::path::Path;

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// normal(0, 0.02): matrices and biases.
    Normal,
    /// 1 + normal(0, 0.02): the weight of a `w · x̂` norm.
    NormOne,
    /// normal(0, 0.1): the weight of a zero-centred `(1 + w) · x̂` norm.
    NormZero,
    /// normal(0, 0.3): a Gated DeltaNet layer's depthwise conv (4 taps; a larger spread than the
    /// matrices' so the conv does not shrink its inputs to nothing).
    Conv,
    /// normal(-2, 1.5): a GDN layer's `A_log`, so `exp(A_log)` spans fast- and slow-decaying heads
    /// (transformers initializes it as log(uniform(0, 16))).
    ALog,
}

/// One tensor of the checkpoint: name, shape, and how its values are drawn.
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

/// The tensors of a checkpoint for `cfg` in the Hugging Face layout, in the Hub's order.
pub fn tensors(cfg: &Config) -> Vec<TensorSpec> {
    let (h, i, d) = (cfg.hidden_size as usize, cfg.intermediate_size as usize, cfg.head_dim() as usize);
    let (hq, hkv, v) = (cfg.num_attention_heads as usize, cfg.kv_heads() as usize, cfg.vocab_size as usize);
    let t = |name: String, shape: Vec<usize>, init: Init| TensorSpec { name, shape, init };
    let norm = match cfg.norm {
        NormKind::Scale => Init::NormOne,
        NormKind::Offset(_) => Init::NormZero,
    };
    let lin = Init::Normal;
    let mut out = vec![t("model.embed_tokens.weight".into(), vec![v, h], lin)];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        out.push(t(format!("{p}.input_layernorm.weight"), vec![h], norm));
        if let Some(g) = cfg.hybrid.as_ref().filter(|_| crate::gdn::is_linear(cfg, l)) {
            // A Gated DeltaNet layer (crate::gdn), in its family's layout.
            let (hk, hv, dd) = (g.num_k_heads as usize, g.num_v_heads as usize, crate::gdn::D as usize);
            let (conv, vd) = (g.conv_dim() as usize, g.value_dim() as usize);
            let a = format!("{p}.linear_attn");
            if g.grouped {
                out.push(t(format!("{a}.in_proj_qkvz.weight"), vec![2 * hk * dd + 2 * vd, h], lin));
                out.push(t(format!("{a}.in_proj_ba.weight"), vec![2 * hv, h], lin));
            } else {
                out.push(t(format!("{a}.in_proj_qkv.weight"), vec![conv, h], lin));
                out.push(t(format!("{a}.in_proj_z.weight"), vec![vd, h], lin));
                out.push(t(format!("{a}.in_proj_b.weight"), vec![hv, h], lin));
                out.push(t(format!("{a}.in_proj_a.weight"), vec![hv, h], lin));
            }
            out.push(t(format!("{a}.conv1d.weight"), vec![conv, 1, crate::gdn::KW as usize], Init::Conv));
            out.push(t(format!("{a}.dt_bias"), vec![hv], Init::NormOne));
            out.push(t(format!("{a}.A_log"), vec![hv], Init::ALog));
            out.push(t(format!("{a}.norm.weight"), vec![dd], Init::NormOne));
            out.push(t(format!("{a}.out_proj.weight"), vec![h, vd], lin));
        } else {
            // A hybrid's q projection writes [q | gate] per head.
            let q_rows = if cfg.hybrid.is_some() { 2 * hq * d } else { hq * d };
            out.push(t(format!("{p}.self_attn.q_proj.weight"), vec![q_rows, h], lin));
            out.push(t(format!("{p}.self_attn.k_proj.weight"), vec![hkv * d, h], lin));
            out.push(t(format!("{p}.self_attn.v_proj.weight"), vec![hkv * d, h], lin));
            if cfg.qkv_bias() {
                out.push(t(format!("{p}.self_attn.q_proj.bias"), vec![hq * d], lin));
                out.push(t(format!("{p}.self_attn.k_proj.bias"), vec![hkv * d], lin));
                out.push(t(format!("{p}.self_attn.v_proj.bias"), vec![hkv * d], lin));
            }
            if cfg.qk_norm() {
                out.push(t(format!("{p}.self_attn.q_norm.weight"), vec![d], norm));
                out.push(t(format!("{p}.self_attn.k_norm.weight"), vec![d], norm));
            }
            out.push(t(format!("{p}.self_attn.o_proj.weight"), vec![h, hq * d], lin));
            if cfg.o_bias {
                out.push(t(format!("{p}.self_attn.o_proj.bias"), vec![h], lin));
            }
        }
        out.push(t(format!("{p}.post_attention_layernorm.weight"), vec![h], norm));
        if cfg.sandwich_norms {
            out.push(t(format!("{p}.pre_feedforward_layernorm.weight"), vec![h], norm));
            out.push(t(format!("{p}.post_feedforward_layernorm.weight"), vec![h], norm));
        }
        if let Some(m) = cfg.moe.as_ref().filter(|m| m.is_moe(l)) {
            // A mixture-of-experts layer: the router, then every expert's SwiGLU (the Hub's
            // per-expert layout, which transformers reads for Qwen3MoeForCausalLM).
            let (e, mi) = (m.num_experts as usize, m.intermediate as usize);
            out.push(t(format!("{p}.mlp.gate.weight"), vec![e, h], lin));
            for x in 0..e {
                out.push(t(format!("{p}.mlp.experts.{x}.gate_proj.weight"), vec![mi, h], lin));
                out.push(t(format!("{p}.mlp.experts.{x}.up_proj.weight"), vec![mi, h], lin));
                out.push(t(format!("{p}.mlp.experts.{x}.down_proj.weight"), vec![h, mi], lin));
            }
            if m.shared_intermediate > 0 {
                let si = m.shared_intermediate as usize;
                out.push(t(format!("{p}.mlp.shared_expert.gate_proj.weight"), vec![si, h], lin));
                out.push(t(format!("{p}.mlp.shared_expert.up_proj.weight"), vec![si, h], lin));
                out.push(t(format!("{p}.mlp.shared_expert.down_proj.weight"), vec![h, si], lin));
                out.push(t(format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h], lin));
            }
            continue;
        }
        out.push(t(format!("{p}.mlp.gate_proj.weight"), vec![i, h], lin));
        out.push(t(format!("{p}.mlp.up_proj.weight"), vec![i, h], lin));
        out.push(t(format!("{p}.mlp.down_proj.weight"), vec![h, i], lin));
        if cfg.mlp_bias {
            out.push(t(format!("{p}.mlp.gate_proj.bias"), vec![i], lin));
            out.push(t(format!("{p}.mlp.up_proj.bias"), vec![i], lin));
            out.push(t(format!("{p}.mlp.down_proj.bias"), vec![h], lin));
        }
    }
    out.push(t("model.norm.weight".into(), vec![h], norm));
    if !cfg.tie_word_embeddings {
        out.push(t("lm_head.weight".into(), vec![v, h], lin));
    }
    out
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn name_hash(seed: u64, name: &str) -> u64 {
    name.bytes().fold(splitmix(seed), |h, b| splitmix(h ^ u64::from(b)))
}

/// Fills `out` (bf16 little-endian) with the tensor's values for elements `start..`.
fn fill(out: &mut [u8], key: u64, start: usize, init: Init) {
    let (base, std) = match init {
        Init::Normal => (0.0, 0.02),
        Init::NormOne => (1.0, 0.02),
        Init::NormZero => (0.0, 0.1),
        Init::Conv => (0.0, 0.3),
        Init::ALog => (-2.0, 1.5),
    };
    for (j, pair) in out.chunks_exact_mut(4).enumerate() {
        // Two normals per Box-Muller draw, from the element index: order-independent.
        let idx = (start / 2 + j) as u64;
        let r = splitmix(key ^ splitmix(idx));
        let u1 = ((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (splitmix(r) >> 11) as f64 / (1u64 << 53) as f64;
        let rad = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        pair[..2].copy_from_slice(&half::bf16::from_f64(base + std * rad * c).to_le_bytes());
        pair[2..].copy_from_slice(&half::bf16::from_f64(base + std * rad * s).to_le_bytes());
    }
    if out.len() % 4 == 2 {
        let n = out.len();
        let idx = ((start + n / 2 - 1) / 2) as u64;
        let r = splitmix(key ^ splitmix(idx));
        let u1 = ((r >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (splitmix(r) >> 11) as f64 / (1u64 << 53) as f64;
        let v = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        out[n - 2..].copy_from_slice(&half::bf16::from_f64(base + std * v).to_le_bytes());
    }
}

/// One tensor's bf16 bytes, generated on all cores.
pub fn generate_tensor(seed: u64, spec: &TensorSpec) -> Vec<u8> {
    let n: usize = spec.shape.iter().product();
    let mut data = vec![0u8; n * 2];
    let key = name_hash(seed, &spec.name);
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(32);
    // Chunks of an even number of elements, so Box-Muller pairs never straddle two chunks.
    let chunk_elems = (n.div_ceil(threads).max(1 << 16) + 1) & !1;
    std::thread::scope(|s| {
        for (c, part) in data.chunks_mut(chunk_elems * 2).enumerate() {
            s.spawn(move || fill(part, key, c * chunk_elems, spec.init));
        }
    });
    data
}

/// Writes `dir/config.json` and the weights (`model.safetensors`, or shards of at most
/// `shard_bytes` plus `model.safetensors.index.json`). `progress(done, total)` in bytes.
pub fn write(cfg: &Config, seed: u64, dir: &Path, shard_bytes: u64, mut progress: impl FnMut(u64, u64)) -> Result<()> {
    cfg.validate().map_err(PackError::Config)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cfg_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_hf_json()).map_err(|e| PackError::Config(e.to_string()))?;
    std::fs::write(&cfg_path, text + "\n").map_err(io(&cfg_path))?;
    let specs = tensors(cfg);
    let total: u64 = specs.iter().map(|s| s.shape.iter().product::<usize>() as u64 * 2).sum();
    // Group tensors into shards in order.
    let mut shards: Vec<Vec<&TensorSpec>> = vec![vec![]];
    let mut size = 0u64;
    for s in &specs {
        let b = s.shape.iter().product::<usize>() as u64 * 2;
        if size > 0 && size + b > shard_bytes {
            shards.push(vec![]);
            size = 0;
        }
        shards.last_mut().expect("one shard").push(s);
        size += b;
    }
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    for (k, shard) in shards.iter().enumerate() {
        let file = if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", k + 1) };
        let datas: Vec<Vec<u8>> = shard
            .iter()
            .map(|s| {
                let d = generate_tensor(seed, s);
                done += d.len() as u64;
                progress(done, total);
                d
            })
            .collect();
        let views: Vec<(String, TensorView)> = shard
            .iter()
            .zip(&datas)
            .map(|(s, d)| Ok((s.name.clone(), TensorView::new(Dtype::BF16, s.shape.clone(), d).map_err(|e| PackError::Config(format!("{}: {e}", s.name)))?)))
            .collect::<Result<_>>()?;
        let path = dir.join(&file);
        let meta = Some([("format".to_string(), "pt".to_string())].into_iter().collect());
        safetensors::tensor::serialize_to_file(views, meta, &path).map_err(|e| PackError::Config(format!("{}: {e}", path.display())))?;
        for s in shard {
            weight_map.insert(s.name.clone(), file.clone());
        }
    }
    if n > 1 {
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let p = dir.join("model.safetensors.index.json");
        std::fs::write(&p, serde_json::to_string_pretty(&index).map_err(|e| PackError::Config(e.to_string()))?).map_err(io(&p))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Config {
        Config::from_hf(&serde_json::from_str(r#"{"model_type":"qwen3","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":64,"vocab_size":100,"tie_word_embeddings":true}"#).unwrap()).unwrap()
    }

    #[test]
    fn deterministic_and_thread_independent() {
        let spec = TensorSpec { name: "w".into(), shape: vec![1001, 3], init: Init::Normal };
        let a = generate_tensor(7, &spec);
        let mut b = vec![0u8; a.len()];
        // One chunk, serially: the same bytes as the parallel run.
        fill(&mut b, name_hash(7, "w"), 0, Init::Normal);
        assert_eq!(a, b);
        assert_ne!(a, generate_tensor(8, &spec));
        let vals: Vec<f32> = a.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        let mean = vals.iter().sum::<f32>() / vals.len() as f32;
        let std = (vals.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / vals.len() as f32).sqrt();
        assert!(mean.abs() < 0.003 && (std - 0.02).abs() < 0.002, "mean {mean} std {std}");
        let norm = generate_tensor(7, &TensorSpec { name: "n".into(), shape: vec![500], init: Init::NormOne });
        let nm: f32 = norm.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).sum::<f32>() / 500.0;
        assert!((nm - 1.0).abs() < 0.01);
    }

    #[test]
    fn writes_single_and_sharded_checkpoints() {
        let dir = std::env::temp_dir().join(format!("kern-rw-{}", std::process::id()));
        let cfg = tiny();
        write(&cfg, 0, &dir.join("one"), u64::MAX, |_, _| {}).unwrap();
        assert!(dir.join("one/model.safetensors").exists());
        let cfg_back = Config::from_file(&dir.join("one/config.json")).unwrap();
        assert_eq!(cfg_back, Config { max_position_embeddings: Some(40960), ..cfg.clone() });
        write(&cfg, 0, &dir.join("sharded"), 20_000, |_, _| {}).unwrap();
        let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("sharded/model.safetensors.index.json")).unwrap()).unwrap();
        let n = tensors(&cfg).len();
        assert_eq!(index["weight_map"].as_object().unwrap().len(), n);
        // The same tensor has the same bytes in both layouts.
        let a = std::fs::read(dir.join("one/model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&a).unwrap();
        let file = index["weight_map"]["model.layers.1.mlp.down_proj.weight"].as_str().unwrap();
        let b = std::fs::read(dir.join("sharded").join(file)).unwrap();
        let st2 = safetensors::SafeTensors::deserialize(&b).unwrap();
        assert_eq!(st.tensor("model.layers.1.mlp.down_proj.weight").unwrap().data(), st2.tensor("model.layers.1.mlp.down_proj.weight").unwrap().data());
        assert!(st.tensor("lm_head.weight").is_err(), "tied: no lm_head");
    }
}
