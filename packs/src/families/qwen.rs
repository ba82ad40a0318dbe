//! Qwen3 dense and Qwen2 / Qwen2.5: the family kern started with. Qwen3 normalizes q and k per
//! head before RoPE and has no biases; Qwen2 adds QKV biases and has no q/k norm. Both use
//! SwiGLU, `w · bf16(x̂)` RMSNorm and neox RoPE; GGUF files keep the Hugging Face rows as they are.

use super::{common_gguf_name, Family, Hf, Meta};
use crate::config::{Activation, Config, LayerType, NormKind, RopePairs};
use kern_weights::gguf::Gguf;
use serde_json::{json, Value};

pub fn from_hf(v: &Value) -> Result<Config, String> {
    let hf = Hf(v);
    let model_type = hf.str("model_type")?.unwrap_or_default().to_string();
    hf.activation(&["silu"])?;
    let layers = hf.need_u64("num_hidden_layers")?;
    let max_pos = hf.u64("max_position_embeddings")?;
    // transformers' Qwen2Config / Qwen3Config default (real checkpoints set 1e6).
    let (rope_theta, rope_scaling) = hf.rope(10000.0, max_pos)?;
    // Qwen2's sliding window covers the layers from max_window_layers on, when turned on.
    let mut layer_types = hf.layer_types(layers)?;
    let mut sliding_window = None;
    if hf.bool("use_sliding_window")?.unwrap_or(false) {
        sliding_window = hf.u64("sliding_window")?;
        if layer_types.is_empty() {
            let from = hf.u64("max_window_layers")?.unwrap_or(layers);
            layer_types = (0..layers).map(|i| if i >= from { LayerType::Sliding } else { LayerType::Full }).collect();
        }
    }
    if layer_types.iter().all(|t| *t == LayerType::Full) {
        layer_types.clear();
        sliding_window = None;
    }
    Ok(Config {
        family: Family::Qwen,
        hidden_size: hf.need_u64("hidden_size")?,
        intermediate_size: hf.need_u64("intermediate_size")?,
        num_hidden_layers: layers,
        num_attention_heads: hf.need_u64("num_attention_heads")?,
        num_key_value_heads: hf.u64("num_key_value_heads")?,
        // Resolved here, so a config read back from the config.json the family writes is equal.
        head_dim: Some(match hf.u64("head_dim")? {
            Some(d) => d,
            None => hf.need_u64("hidden_size")? / hf.need_u64("num_attention_heads")?.max(1),
        }),
        vocab_size: hf.need_u64("vocab_size")?,
        rms_norm_eps: hf.f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta,
        rope_scaling,
        rope_local_theta: None,
        tie_word_embeddings: hf.bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: max_pos,
        attention_bias: Some(hf.bool("attention_bias")?.unwrap_or(model_type == "qwen2")),
        o_bias: false,
        mlp_bias: false,
        moe: None,
        qk_norm: model_type == "qwen3",
        norm: NormKind::Scale,
        sandwich_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        query_pre_attn_scalar: None,
        sliding_window,
        layer_types,
        rope_pairs: RopePairs::Halves,
        tensor_prefix: "model.".into(),
        hybrid: None,
        model_type,
    })
}

/// Qwen GGUF files: llama.cpp's `Qwen2Model` / `Qwen3Model` converters write the tensors
/// unchanged (neox RoPE, no q/k permutation).
pub fn from_gguf(g: &Gguf, arch: &str, _: &super::TensorF32<'_>) -> Result<Config, String> {
    let m = Meta { g, arch };
    let mut c = m.base(Family::Qwen, arch)?;
    if (arch == "qwen3") != c.qk_norm {
        return Err(format!("architecture `{arch}` {} q/k norm tensors (`blk.0.attn_q_norm.weight`)", if c.qk_norm { "should not have" } else { "lacks the" }));
    }
    c.rope_theta = m.f64("rope.freq_base")?.unwrap_or(1e6);
    c.rope_scaling = m.rope_scaling()?;
    Ok(c)
}

pub fn gguf_name(hf: &str) -> Option<String> {
    common_gguf_name(hf, &[])
}

pub fn to_hf_json(c: &Config) -> Value {
    let arch = if c.model_type == "qwen3" { "Qwen3ForCausalLM" } else { "Qwen2ForCausalLM" };
    let mut v = super::hf_json(c, arch, &c.model_type, 40960, json!({
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "use_sliding_window": false,
        "rope_scaling": c.rope_scaling.to_json(),
    }));
    if c.model_type == "qwen3" {
        v["head_dim"] = c.head_dim().into();
        v["attention_bias"] = false.into();
    }
    if !c.layer_types.is_empty() {
        v["use_sliding_window"] = true.into();
        v["sliding_window"] = c.sliding_window.into();
        v["layer_types"] = super::llama::layer_types_json(c);
        v["max_window_layers"] = c.layer_types.iter().position(|t| *t == LayerType::Sliding).unwrap_or(0).into();
    }
    v
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
            assert_eq!(gguf_name(hf).as_deref(), Some(g), "{hf}");
        }
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(gguf_name("model.rotary_emb.inv_freq"), None);
    }

    #[test]
    fn qwen2_sliding_window_layers_and_refusals() {
        let c = from_hf(&json!({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 2, "vocab_size": 10, "use_sliding_window": true, "sliding_window": 32, "max_window_layers": 2})).unwrap();
        assert_eq!((c.window(1), c.window(2), c.window(3)), (None, Some(32), Some(32)));
        assert!(c.qkv_bias() && !c.qk_norm());
        let e = from_hf(&json!({"model_type": "qwen3", "hidden_act": "gelu"})).unwrap_err();
        assert!(e.contains("`hidden_act` is `gelu`"), "{e}");
    }
}
