//! Qwen2 / Qwen3 from a GGUF file (llama.cpp's format): the model config from the metadata,
//! checked against the tensors, and the mapping from the Hugging Face tensor names the manifest
//! is written with to GGUF's names (shared/notes/gguf.md §3, §4).
//!
//! Layout: GGUF dims are ne-order (fastest first); `kern_weights` presents them reversed, so a
//! linear layer is [out, in] as in Hugging Face, with the same bytes. llama.cpp's converter
//! permutes Q/K rows only for its `llama` architecture (`LlamaModel.modify_tensors`); its
//! `Qwen2Model` / `Qwen3Model` write the tensors unchanged, and both use NEOX (rotate-half)
//! RoPE like transformers — so the pack takes Qwen GGUF tensors as they are.

use crate::config::Config;
use crate::{PackError, Result};
use kern_weights::gguf::{Gguf, Value};
use std::path::Path;

/// The GGUF architectures (`general.architecture`) this pack serves.
pub const ARCHITECTURES: &[&str] = &["qwen2", "qwen3"];

/// The GGUF name of a Hugging Face tensor name the manifest uses, or `None` for a name with no
/// GGUF counterpart.
pub fn tensor_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<u64>().ok()?;
    let (module, kind) = part.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{g}.{kind}"))
}

/// Rewrites every weight source of a generated manifest (`buffers.*.from`: `tensor` and
/// `concat` names) from Hugging Face names to GGUF names. Buffer names stay as they are.
pub fn rename_sources(manifest: &mut serde_json::Value) -> Result<()> {
    let Some(buffers) = manifest.get_mut("buffers").and_then(|b| b.as_object_mut()) else {
        return Err(PackError::Config("generated manifest has no buffers".into()));
    };
    let map = |v: &mut serde_json::Value| -> Result<()> {
        let hf = v.as_str().unwrap_or_default().to_string();
        let g = tensor_name(&hf).ok_or_else(|| PackError::Config(format!("pack bug: tensor `{hf}` has no GGUF name")))?;
        *v = serde_json::Value::String(g);
        Ok(())
    };
    for (_, b) in buffers.iter_mut() {
        let Some(from) = b.get_mut("from") else { continue };
        if let Some(t) = from.get_mut("tensor") {
            map(t)?;
        }
        if let Some(list) = from.get_mut("concat").and_then(|c| c.as_array_mut()) {
            for t in list {
                map(t)?;
            }
        }
    }
    Ok(())
}

/// The shortest decimal that reads back as the same f32 (1e-6, not 9.999999974752427e-7):
/// GGUF stores eps and theta as f32; the manifest writes the value a config.json would have.
fn f32_decimal(v: f64) -> f64 {
    format!("{}", v as f32).parse().unwrap_or(v)
}

/// The model config of a Qwen2 / Qwen3 GGUF file, from its metadata and tensor shapes.
/// `file` names the file in errors.
pub fn config(g: &Gguf, file: &Path) -> Result<Config> {
    let bad = |m: String| PackError::Config(format!("{}: {m}", file.display()));
    let arch = g.architecture().ok_or_else(|| bad("no `general.architecture` key: not a model GGUF".into()))?;
    if !ARCHITECTURES.contains(&arch) {
        return Err(bad(format!("architecture `{arch}` has no pack in this kern; GGUF architectures supported: {}", ARCHITECTURES.join(", "))));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| -> Result<Option<u64>> {
        match g.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(format!("`{}` is {v:?}, not a non-negative integer (per-layer arrays are not supported)", key(k)))),
        }
    };
    let need = |k: &str| -> Result<u64> { uint(k)?.ok_or_else(|| bad(format!("no `{}` key", key(k)))) };
    let float = |k: &str| -> Result<Option<f64>> {
        match g.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(f32_decimal(x))).ok_or_else(|| bad(format!("`{}` is {v:?}, not a number", key(k)))),
        }
    };
    let hidden = need("embedding_length")?;
    let layers = need("block_count")?;
    let heads = need("attention.head_count")?;
    let kv_heads = uint("attention.head_count_kv")?.unwrap_or(heads);
    let shape = |name: &str| g.tensor(name).map(|t| t.shape());

    // head_dim from the Q projection's rows (Qwen3 has head_dim ≠ hidden / heads); the
    // metadata's key_length, when present, must agree.
    let q = shape("blk.0.attn_q.weight").ok_or_else(|| bad("no tensor `blk.0.attn_q.weight`".into()))?;
    if q.len() != 2 || heads == 0 || q[0] % heads != 0 || q[1] != hidden {
        return Err(bad(format!("`blk.0.attn_q.weight` has shape {q:?}, which is not [heads × head_dim, {hidden}] for {heads} heads")));
    }
    let head_dim = q[0] / heads;
    for k in ["attention.key_length", "attention.value_length"] {
        if let Some(d) = uint(k)? {
            if d != head_dim {
                return Err(bad(format!("`{}` is {d}, but `blk.0.attn_q.weight` {q:?} gives head_dim {head_dim}", key(k))));
            }
        }
    }
    if let Some(d) = uint("rope.dimension_count")? {
        if d != head_dim {
            return Err(bad(format!("`{}` is {d}: partial rotary (≠ head_dim {head_dim}) is not supported by the pack's RoPE kernel", key("rope.dimension_count"))));
        }
    }
    if let Some(t) = g.get(&key("rope.scaling.type")).and_then(Value::as_str) {
        if t != "none" {
            return Err(bad(format!("`{}` is `{t}`: RoPE scaling is not supported by the pack's RoPE kernel (plain neox rotary)", key("rope.scaling.type"))));
        }
    }

    let embd = shape("token_embd.weight").ok_or_else(|| bad("no tensor `token_embd.weight`".into()))?;
    let tokens = g.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(|a| a.len() as u64);
    let vocab = match uint("vocab_size")? {
        Some(v) => v,
        None => tokens.unwrap_or(embd[0]),
    };
    if embd != [vocab, hidden] {
        return Err(bad(format!("`token_embd.weight` has shape {embd:?}, the metadata says [{vocab}, {hidden}] (vocab, hidden)")));
    }
    let ffn = need("feed_forward_length")?;
    let has = |n: &str| g.tensor(n).is_some();
    let qk_norm = has("blk.0.attn_q_norm.weight");
    if (arch == "qwen3") != qk_norm {
        return Err(bad(format!("architecture `{arch}` {} q/k norm tensors (`blk.0.attn_q_norm.weight`)", if qk_norm { "should not have" } else { "lacks the" })));
    }
    let cfg = Config {
        model_type: arch.to_string(),
        hidden_size: hidden,
        intermediate_size: ffn,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: Some(kv_heads),
        head_dim: Some(head_dim),
        vocab_size: vocab,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| bad(format!("no `{}` key", key("attention.layer_norm_rms_epsilon"))))?,
        rope_theta: float("rope.freq_base")?.unwrap_or(10000.0),
        tie_word_embeddings: !has("output.weight"),
        max_position_embeddings: uint("context_length")?,
        attention_bias: Some(has("blk.0.attn_q.bias")),
        hidden_act: Some("silu".into()),
        rope_scaling: None,
        torch_dtype: None,
    };
    cfg.validate().map_err(bad)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_llama_cpp() {
        for (hf, g) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
            ("model.layers.11.self_attn.q_proj.bias", "blk.11.attn_q.bias"),
            ("model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"),
            ("model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"),
            ("model.layers.2.post_attention_layernorm.weight", "blk.2.ffn_norm.weight"),
            ("model.layers.2.mlp.down_proj.weight", "blk.2.ffn_down.weight"),
        ] {
            assert_eq!(tensor_name(hf).as_deref(), Some(g), "{hf}");
        }
        assert_eq!(tensor_name("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(tensor_name("model.rotary_emb.inv_freq"), None);
    }

    #[test]
    fn f32_metadata_reads_as_its_decimal() {
        assert_eq!(f32_decimal(f64::from(1e-6f32)), 1e-6);
        assert_eq!(f32_decimal(1e6), 1e6);
    }
}
