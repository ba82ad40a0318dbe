//! The Hugging Face `config.json` of a Qwen3 / Qwen2 model: the fields the pack needs, checked.

use crate::{io, PackError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    /// Qwen3 gives it; Qwen2 derives it as hidden / heads.
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<u64>,
    /// Qwen2 has QKV biases; Qwen3 has `attention_bias: false`.
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    1e6
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let c: Config = serde_json::from_str(&text).map_err(|e| PackError::Config(format!("{}: not a model config.json: {e}", path.display())))?;
        c.validate().map_err(|e| PackError::Config(format!("{}: {e}", path.display())))?;
        Ok(c)
    }

    pub fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Qwen3 normalizes q and k per head before RoPE.
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// Qwen2 adds biases to the q, k and v projections.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.model_type == "qwen2")
    }

    /// What the pack's kernels support; an error says what is not.
    pub fn validate(&self) -> Result<(), String> {
        if !crate::MODEL_TYPES.contains(&self.model_type.as_str()) {
            return Err(format!("model_type `{}` is not a Qwen pack model (it serves {})", self.model_type, crate::MODEL_TYPES.join(", ")));
        }
        let d = self.head_dim();
        if d != 64 && d != 128 {
            return Err(format!("head_dim {d}: the pack's attention kernels support 64 and 128"));
        }
        let (h, kv) = (self.num_attention_heads, self.kv_heads());
        if kv == 0 || h % kv != 0 || h / kv > 32 {
            return Err(format!("{h} attention heads over {kv} kv heads: the group size must be a whole number up to 32"));
        }
        if !self.hidden_size.is_multiple_of(8) || !self.intermediate_size.is_multiple_of(8) {
            return Err("hidden_size and intermediate_size must be multiples of 8 (16-byte loads in the GEMMs)".into());
        }
        if let Some(a) = &self.hidden_act {
            if a != "silu" {
                return Err(format!("hidden_act `{a}`: the pack's MLP is SwiGLU (silu)"));
            }
        }
        if let Some(s) = &self.rope_scaling {
            if !s.is_null() {
                return Err(format!("rope_scaling {s} is not supported by the pack's RoPE kernel (plain neox rotary)"));
            }
        }
        if self.num_hidden_layers == 0 || self.vocab_size == 0 {
            return Err("num_hidden_layers and vocab_size must be positive".into());
        }
        Ok(())
    }

    /// A `config.json` that transformers loads unchanged.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let arch = if self.model_type == "qwen3" { "Qwen3ForCausalLM" } else { "Qwen2ForCausalLM" };
        let mut v = serde_json::json!({
            "architectures": [arch],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.kv_heads(),
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings.unwrap_or(40960),
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": true,
            "use_sliding_window": false,
            "rope_scaling": null,
        });
        if self.model_type == "qwen3" {
            v["head_dim"] = self.head_dim().into();
            v["attention_bias"] = false.into();
        }
        v
    }
}

/// Real shapes (models-and-data.md), for random weights and benchmarks.
pub const PRESETS: &[(&str, &str)] = &[
    ("qwen3-0.6b", r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":40960}"#),
    ("qwen3-4b", r#"{"model_type":"qwen3","hidden_size":2560,"intermediate_size":9728,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":40960}"#),
    ("qwen3-8b", r#"{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":40960}"#),
    ("qwen2.5-0.5b", r#"{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768}"#),
    ("qwen2.5-1.5b", r#"{"model_type":"qwen2","hidden_size":1536,"intermediate_size":8960,"num_hidden_layers":28,"num_attention_heads":12,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768}"#),
];

pub fn preset(name: &str) -> Result<Config> {
    let (_, json) = PRESETS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        PackError::Config(format!("no preset `{name}` (have: {})", PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")))
    })?;
    let c: Config = serde_json::from_str(json).map_err(|e| PackError::Config(format!("preset {name}: {e}")))?;
    c.validate().map_err(PackError::Config)?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_round_trip() {
        for (name, _) in PRESETS {
            let c = preset(name).unwrap();
            let back: Config = serde_json::from_value(c.to_hf_json()).unwrap();
            assert_eq!(back.head_dim(), c.head_dim(), "{name}");
            assert_eq!(back.qkv_bias(), c.qkv_bias(), "{name}");
        }
        assert_eq!(preset("qwen2.5-0.5b").unwrap().head_dim(), 64);
        assert!(preset("qwen2.5-0.5b").unwrap().qkv_bias());
        assert!(!preset("qwen3-4b").unwrap().qkv_bias());
    }

    #[test]
    fn unsupported_configs_say_why() {
        let mut c = preset("qwen3-4b").unwrap();
        c.head_dim = Some(96);
        assert!(c.validate().unwrap_err().contains("head_dim 96"));
        c.head_dim = Some(128);
        c.model_type = "llama".into();
        assert!(c.validate().unwrap_err().contains("qwen3, qwen2"));
        c.model_type = "qwen3".into();
        c.rope_scaling = Some(serde_json::json!({"type": "yarn", "factor": 4.0}));
        assert!(c.validate().unwrap_err().contains("rope_scaling"));
    }
}
