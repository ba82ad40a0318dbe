//! Gemma 3 text (`gemma3_text`, and the text model of a `gemma3` checkpoint): four norms per
//! block with a zero-centred weight `(1 + w)` computed in fp32, q/k norm, GeGLU with tanh-GELU,
//! the embedding scaled by bf16(sqrt(hidden)), interleaved sliding-window and global layers with
//! their own RoPE bases (local: no scaling; global: `rope_scaling`, linear 8 on 4B+), attention
//! scaled by `query_pre_attn_scalar^-0.5`, head_dim 256, a tied 262k vocabulary.
//!
//! GGUF `gemma3` files have the `1 +` added to every norm weight by llama.cpp's converter
//! ([`NormKind::Offset`] 0) and keep llama.cpp's fixed pattern (every 6th layer global, local
//! base 10000).

use super::{common_gguf_name, Family, Hf, Meta};
use crate::config::{Activation, Config, LayerType, NormKind, RopePairs};
use kern_weights::gguf::Gguf;
use serde_json::{json, Value};

/// Gemma3TextConfig's defaults, for a config (or a `gemma3` checkpoint's `text_config`) that
/// leaves keys out.
fn default(k: &str) -> Option<Value> {
    Some(match k {
        "vocab_size" => json!(262208),
        "hidden_size" => json!(2304),
        "intermediate_size" => json!(9216),
        "num_hidden_layers" => json!(26),
        "num_attention_heads" => json!(8),
        "num_key_value_heads" => json!(4),
        "head_dim" => json!(256),
        "max_position_embeddings" => json!(131072),
        "query_pre_attn_scalar" => json!(256),
        "sliding_window" => json!(4096),
        _ => return None,
    })
}

/// The layer types of the `sliding_window_pattern` rule: every pattern-th layer global.
pub fn pattern_layers(layers: u64, pattern: u64) -> Vec<LayerType> {
    (0..layers).map(|i| if pattern > 0 && (i + 1) % pattern == 0 { LayerType::Full } else { LayerType::Sliding }).collect()
}

pub fn from_hf(v: &Value) -> Result<Config, String> {
    let outer = Hf(v);
    let multimodal = outer.str("model_type")? == Some("gemma3");
    // A `gemma3` checkpoint (Gemma3ForConditionalGeneration) keeps the text model's config in
    // `text_config`, and its weights under `language_model.model.` (as the Hub's files name them).
    let mut text = if multimodal { v.get("text_config").cloned().unwrap_or_else(|| json!({})) } else { v.clone() };
    if let Some(o) = text.as_object_mut() {
        for k in ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "query_pre_attn_scalar", "sliding_window"] {
            if !o.contains_key(k) {
                o.insert(k.into(), default(k).expect("a default"));
            }
        }
        if multimodal && !o.contains_key("tie_word_embeddings") {
            if let Some(t) = v.get("tie_word_embeddings") {
                o.insert("tie_word_embeddings".into(), t.clone());
            }
        }
    }
    let hf = Hf(&text);
    hf.activation(&["gelu_pytorch_tanh"])?;
    for k in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if let Some(c) = hf.f64(k)? {
            return Err(format!("`{k}` is {c}: logit soft-capping (Gemma 2) is not supported; Gemma 3 has none"));
        }
    }
    let layers = hf.need_u64("num_hidden_layers")?;
    let max_pos = hf.u64("max_position_embeddings")?;
    let (rope_theta, rope_scaling) = hf.rope(1e6, max_pos)?;
    let local = match text.get("rope_parameters").and_then(|p| p.get("sliding_attention")) {
        Some(p) => p.get("rope_theta").and_then(Value::as_f64),
        None => None,
    };
    let rope_local_theta = Some(match local {
        Some(t) => t,
        None => hf.f64("rope_local_base_freq")?.unwrap_or(10000.0),
    });
    let mut layer_types = hf.layer_types(layers)?;
    if layer_types.is_empty() {
        layer_types = pattern_layers(layers, hf.u64("sliding_window_pattern")?.unwrap_or(6));
    }
    let bias = hf.bool("attention_bias")?.unwrap_or(false);
    Ok(Config {
        family: Family::Gemma3,
        model_type: if multimodal { "gemma3".into() } else { "gemma3_text".into() },
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
        rope_local_theta,
        tie_word_embeddings: hf.bool("tie_word_embeddings")?.unwrap_or(true),
        max_position_embeddings: max_pos,
        attention_bias: Some(bias),
        o_bias: bias,
        mlp_bias: false,
        moe: None,
        qk_norm: true,
        norm: NormKind::Offset(1.0),
        sandwich_norms: true,
        activation: Activation::GeluTanh,
        embed_scale: true,
        query_pre_attn_scalar: hf.f64("query_pre_attn_scalar")?,
        sliding_window: hf.u64("sliding_window")?,
        layer_types,
        rope_pairs: RopePairs::Halves,
        tensor_prefix: if multimodal { "language_model.model.".into() } else { "model.".into() },
        hybrid: None,
    })
}

pub fn from_gguf(g: &Gguf, arch: &str, _: &super::TensorF32<'_>) -> Result<Config, String> {
    let m = Meta { g, arch };
    let mut c = m.base(Family::Gemma3, "gemma3_text")?;
    if !c.qk_norm {
        return Err("no q/k norm tensors (`blk.0.attn_q_norm.weight`): not a Gemma 3 file".into());
    }
    if !c.tie_word_embeddings {
        return Err("an `output.weight` tensor: Gemma 3 ties its output to the embedding; kern does not know this layout".into());
    }
    c.norm = NormKind::Offset(0.0);
    c.sandwich_norms = true;
    c.activation = Activation::GeluTanh;
    c.embed_scale = true;
    c.rope_local_theta = Some(10000.0);
    c.rope_theta = m.f64("rope.freq_base")?.unwrap_or(1e6);
    c.rope_scaling = m.rope_scaling()?;
    c.sliding_window = Some(m.need_u64("attention.sliding_window")?);
    // llama.cpp: every 6th layer global; the 27B model scales attention by hidden / heads,
    // the others by head_dim (its f_attention_scale).
    let pattern = m.u64("attention.sliding_window_pattern")?.unwrap_or(6);
    c.layer_types = pattern_layers(c.num_hidden_layers, pattern);
    c.query_pre_attn_scalar = Some(if c.num_hidden_layers == 62 { (c.hidden_size / c.num_attention_heads) as f64 } else { c.head_dim() as f64 });
    Ok(c)
}

pub fn gguf_name(hf: &str) -> Option<String> {
    common_gguf_name(
        hf,
        &[("post_attention_layernorm", "post_attention_norm"), ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm")],
    )
}

/// `x` as a JSON integer when it is a whole number, else as a float.
fn whole(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

pub fn to_hf_json(c: &Config) -> Value {
    let pattern_matches = c.layer_types == pattern_layers(c.num_hidden_layers, 6);
    let mut v = super::hf_json(c, "Gemma3ForCausalLM", "gemma3_text", 32768, json!({
        "head_dim": c.head_dim(),
        "rope_local_base_freq": c.rope_local_theta.unwrap_or(10000.0),
        "rope_scaling": c.rope_scaling.to_json(),
        // An integer where it is one: transformers 5's strict config refuses 256.0 here.
        "query_pre_attn_scalar": whole(c.query_pre_attn_scalar.unwrap_or(c.head_dim() as f64)),
        "sliding_window": c.sliding_window,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": c.qkv_bias(),
        "final_logit_softcapping": null,
        "attn_logit_softcapping": null,
        "torch_dtype": "bfloat16",
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
    }));
    if pattern_matches {
        v["sliding_window_pattern"] = 6.into();
    }
    v["layer_types"] = super::llama::layer_types_json(c);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rope::RopeScaling;

    #[test]
    fn gemma3_text_and_the_text_part_of_gemma3() {
        let text = json!({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
            "query_pre_attn_scalar": 256, "rope_scaling": null});
        let c = from_hf(&text).unwrap();
        assert_eq!((c.window(0), c.window(5), c.window(6)), (Some(512), None, Some(512)));
        assert_eq!((c.rope_local_theta, c.rope_theta, c.norm, c.tensor_prefix.as_str()), (Some(10000.0), 1e6, NormKind::Offset(1.0), "model."));
        assert_eq!(c.attn_scale(), 1.0 / 16.0);
        assert_eq!(to_hf_json(&c)["query_pre_attn_scalar"], json!(256), "an integer, as transformers' strict config wants");
        let mm = json!({"model_type": "gemma3", "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "num_attention_heads": 8, "num_key_value_heads": 4, "sliding_window": 1024, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}});
        let c = from_hf(&mm).unwrap();
        assert_eq!((c.vocab_size, c.head_dim(), c.tensor_prefix.as_str(), c.tie_word_embeddings), (262208, 256, "language_model.model.", true));
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        let e = from_hf(&json!({"model_type": "gemma3_text", "final_logit_softcapping": 30.0})).unwrap_err();
        assert!(e.contains("soft-capping"), "{e}");
    }

    #[test]
    fn gguf_names_of_the_four_norms() {
        for (hf, g) in [
            ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
            ("model.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight"),
            ("model.layers.0.pre_feedforward_layernorm.weight", "blk.0.ffn_norm.weight"),
            ("model.layers.0.post_feedforward_layernorm.weight", "blk.0.post_ffw_norm.weight"),
            ("model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(g), "{hf}");
        }
    }
}
