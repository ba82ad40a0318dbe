//! Qwen3.5 text (`qwen3_5_text`, and the text model of a `qwen3_5` checkpoint): the Gated DeltaNet
//! hybrid of Qwen3-Next ([`super::qwen3_next`], [`crate::gdn`]) with a dense SwiGLU MLP in every
//! layer and the GDN projections stored separately (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
//! `in_proj_a`: no regrouping). Its interleaved MRoPE gives text tokens (the same position in all
//! three sections) the plain RoPE of the rotated dims, which is what the pack computes; image and
//! video positions are not supported (the pack serves text).

use super::{Family, Hf};
use crate::config::Config;
use serde_json::{json, Value};

pub fn from_hf(v: &Value) -> Result<Config, String> {
    let outer = Hf(v);
    let multimodal = outer.str("model_type")? == Some("qwen3_5");
    // A `qwen3_5` checkpoint (Qwen3_5ForConditionalGeneration) keeps the text model's config in
    // `text_config` and its weights under `model.language_model.`.
    let mut text = if multimodal { v.get("text_config").cloned().ok_or("model_type `qwen3_5` without a `text_config`")? } else { v.clone() };
    if multimodal {
        if let (Some(o), Some(t)) = (text.as_object_mut(), v.get("tie_word_embeddings")) {
            o.entry("tie_word_embeddings").or_insert(t.clone());
        }
    }
    // Qwen3_5TextConfig's defaults for the sizes a config may leave out.
    if let Some(o) = text.as_object_mut() {
        for (k, d) in [("vocab_size", json!(248320)), ("head_dim", json!(256)), ("max_position_embeddings", json!(32768))] {
            o.entry(k).or_insert(d);
        }
    }
    let mut c = super::qwen3_next::read_hybrid(&text, Family::Qwen35, "qwen3_5_text", false)?;
    if multimodal {
        c.tensor_prefix = "model.language_model.".into();
    }
    Ok(c)
}

pub fn from_gguf(_: &kern_weights::gguf::Gguf, arch: &str, _: &super::TensorF32<'_>) -> Result<Config, String> {
    Err(format!("GGUF architecture `{arch}`: the Gated DeltaNet hybrids are packed from Hugging Face checkpoints only (kern pack --config)"))
}

pub fn gguf_name(_: &str) -> Option<String> {
    None
}

pub fn to_hf_json(c: &Config) -> Value {
    super::qwen3_next::hybrid_json(c, "Qwen3_5ForCausalLM", "qwen3_5_text")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LayerType;

    #[test]
    fn reads_the_text_config_and_refuses_what_the_kernels_lack() {
        let base = json!({"model_type": "qwen3_5_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 100, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}});
        let c = Config::from_hf(&base).unwrap();
        assert_eq!(c.layer_types, [LayerType::Linear, LayerType::Full, LayerType::Linear, LayerType::Full]);
        assert_eq!((c.rope_theta, c.hybrid.as_ref().unwrap().rotary_dim, c.moe.is_none()), (1e7, 32, true));
        assert_eq!(Config::from_hf(&to_hf_json(&c)).unwrap(), c, "config.json written and read back");
        let mm = json!({"model_type": "qwen3_5", "text_config": base, "tie_word_embeddings": true});
        let m = Config::from_hf(&mm).unwrap();
        assert_eq!((m.tensor_prefix.as_str(), m.tie_word_embeddings), ("model.language_model.", true));
        for (k, val, want) in [
            ("linear_key_head_dim", json!(64), "head dims of 128 only"),
            ("linear_value_head_dim", json!(256), "head dims of 128 only"),
            ("linear_conv_kernel_dim", json!(3), "width 4 only"),
            ("linear_num_value_heads", json!(3), "multiple of linear_num_key_heads"),
            ("attention_bias", json!(true), "attention_bias"),
            ("mamba_ssm_dtype", json!("float16"), "mamba_ssm_dtype"),
            ("rope_parameters", json!({"rope_type": "yarn", "factor": 4.0}), "rope type `yarn`"),
        ] {
            let mut v = base.clone();
            v[k] = val;
            let e = Config::from_hf(&v).unwrap_err();
            assert!(e.contains(want), "{k}: {e}");
        }
        let mut v = base.clone();
        v["layer_types"] = json!(vec!["linear_attention"; 4]);
        assert!(Config::from_hf(&v).unwrap_err().contains("no full_attention layer"));
    }
}
