//! Llama and the models built on its architecture (Llama 2 / 3.x, SmolLM2, TinyLlama, Mistral,
//! DeepSeek-R1-Distill-Llama, …): Qwen3 without the q/k norm, with optional biases
//! (`attention_bias` on q, k, v and o; `mlp_bias` on gate, up and down), `rope_scaling`
//! (llama3, linear, YaRN), an explicit `head_dim`, and Mistral's sliding window.
//!
//! GGUF `llama` files differ in one way that matters: llama.cpp's converter permutes the q and k
//! rows of each head so that its rotation pairs adjacent dims; the manifest rotates those pairs
//! ([`RopePairs::Adjacent`]) instead of un-permuting the weights, which gives the same attention.
//! Llama 3.1's frequencies come as the tensor `rope_freqs.weight` (divisors), read at pack time.

use super::{common_gguf_name, Family, Hf, Meta};
use crate::config::{Activation, Config, LayerType, NormKind, RopePairs};
use crate::rope::RopeScaling;
use kern_weights::gguf::Gguf;
use serde_json::{json, Value};

pub fn from_hf(v: &Value) -> Result<Config, String> {
    let hf = Hf(v);
    let model_type = hf.str("model_type")?.unwrap_or_default().to_string();
    hf.activation(&["silu"])?;
    let layers = hf.need_u64("num_hidden_layers")?;
    let max_pos = hf.u64("max_position_embeddings")?;
    let (rope_theta, rope_scaling) = hf.rope(10000.0, max_pos)?;
    let bias = hf.bool("attention_bias")?.unwrap_or(false);
    let mut layer_types = hf.layer_types(layers)?;
    // MistralConfig's sliding_window defaults to 4096 when the key is absent; `null` is none.
    // Llama has no sliding window.
    let sliding_window = match model_type.as_str() {
        "mistral" if !hf.has("sliding_window") => Some(4096),
        "mistral" => hf.u64("sliding_window")?,
        _ => None,
    };
    if sliding_window.is_some() && layer_types.is_empty() {
        layer_types = vec![LayerType::Sliding; layers as usize];
    }
    Ok(Config {
        family: Family::Llama,
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
        attention_bias: Some(bias),
        o_bias: bias,
        mlp_bias: hf.bool("mlp_bias")?.unwrap_or(false),
        moe: None,
        qk_norm: false,
        norm: NormKind::Scale,
        sandwich_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        query_pre_attn_scalar: None,
        sliding_window: if layer_types.is_empty() { None } else { sliding_window },
        layer_types,
        rope_pairs: RopePairs::Halves,
        tensor_prefix: "model.".into(),
        hybrid: None,
        model_type,
    })
}

/// A GGUF `llama` file. `divisors` reads an f32 tensor's values (for `rope_freqs.weight`).
pub fn from_gguf(g: &Gguf, arch: &str, divisors: &super::TensorF32<'_>) -> Result<Config, String> {
    let m = Meta { g, arch };
    let mut c = m.base(Family::Llama, "llama")?;
    if c.qk_norm {
        return Err("a `llama` GGUF with q/k norm tensors (`blk.0.attn_q_norm.weight`): not a Llama-architecture model".into());
    }
    c.rope_pairs = RopePairs::Adjacent;
    c.o_bias = m.has("blk.0.attn_output.bias");
    c.mlp_bias = m.has("blk.0.ffn_down.bias");
    c.rope_scaling = m.rope_scaling()?;
    if m.has("rope_freqs.weight") {
        if c.rope_scaling != RopeScaling::None {
            return Err(format!("both `{}` and a `rope_freqs.weight` tensor: one RoPE scaling at a time", m.key("rope.scaling.type")));
        }
        let d = divisors("rope_freqs.weight").ok_or("`rope_freqs.weight` is not an F32 tensor kern can read")?;
        c.rope_scaling = RopeScaling::Divisors(d);
    }
    Ok(c)
}

pub fn gguf_name(hf: &str) -> Option<String> {
    common_gguf_name(hf, &[])
}

/// `layer_types` as transformers writes it.
pub(crate) fn layer_types_json(c: &Config) -> Value {
    c.layer_types.iter().map(|t| if *t == LayerType::Sliding { "sliding_attention" } else { "full_attention" }).collect::<Vec<_>>().into()
}

pub fn to_hf_json(c: &Config) -> Value {
    let mistral = c.model_type == "mistral";
    let (arch, model_type) = if mistral { ("MistralForCausalLM", "mistral") } else { ("LlamaForCausalLM", "llama") };
    let mut v = super::hf_json(c, arch, model_type, 8192, json!({
        "head_dim": c.head_dim(),
        "rope_scaling": c.rope_scaling.to_json(),
        "attention_bias": c.qkv_bias(),
        "mlp_bias": c.mlp_bias,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
    }));
    if mistral {
        v["sliding_window"] = c.sliding_window.into();
        if c.layer_types.contains(&LayerType::Full) {
            v["layer_types"] = layer_types_json(c);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 4096})
    }

    #[test]
    fn llama_fields_and_defaults() {
        let c = from_hf(&base()).unwrap();
        assert_eq!((c.head_dim(), c.rms_norm_eps, c.rope_theta, c.qkv_bias(), c.o_bias, c.mlp_bias, c.qk_norm), (64, 1e-6, 10000.0, false, false, false, false));
        assert_eq!(c.window(0), None);
        let mut v = base();
        v["attention_bias"] = true.into();
        v["mlp_bias"] = true.into();
        v["head_dim"] = 128.into();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = from_hf(&v).unwrap();
        assert!(c.qkv_bias() && c.o_bias && c.mlp_bias);
        assert_eq!(c.head_dim(), 128, "head_dim need not be hidden / heads");
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
        // transformers v5's rope_parameters carry the same.
        let mut v5 = base();
        v5["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5});
        let c = from_hf(&v5).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling.clone()), (5e5, RopeScaling::Linear { factor: 2.0 }));
        let mut dynamic = base();
        dynamic["rope_scaling"] = json!({"type": "dynamic", "factor": 2.0});
        assert!(from_hf(&dynamic).unwrap_err().contains("`dynamic`"));
    }

    #[test]
    fn mistral_sliding_window_defaults_to_4096_and_null_turns_it_off() {
        let mut v = base();
        v["model_type"] = "mistral".into();
        let c = from_hf(&v).unwrap();
        assert_eq!((c.window(0), c.window(1)), (Some(4096), Some(4096)));
        v["sliding_window"] = Value::Null;
        assert_eq!(from_hf(&v).unwrap().window(0), None);
        v["sliding_window"] = 128.into();
        let c = from_hf(&v).unwrap();
        assert_eq!(c.window(1), Some(128));
        assert_eq!(from_hf(&c.to_hf_json()).unwrap(), c, "written and read back");
    }
}
