//! The model config the pack writes manifests from: one normalized description of a dense
//! decoder, filled by each family's reader ([`crate::families`]) from a Hugging Face
//! `config.json` or a GGUF file's metadata. What differs between families is data here — the
//! norm's form, the activation, biases, q/k norm, RoPE per layer, sliding windows — never code
//! in the manifest builder.

use crate::families::{self, Family};
use crate::rope::RopeScaling;
use crate::{io, PackError, Result};
use std::path::Path;

/// A dense decoder's config, normalized across families.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Which family's conventions (tensor names, GGUF keys, config.json it writes back).
    pub family: Family,
    /// The Hugging Face `model_type` (or the GGUF architecture's equivalent).
    pub model_type: String,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: Option<u64>,
    /// Explicit head size; `None`: hidden / heads.
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    pub rms_norm_eps: f64,
    /// The RoPE base of full-attention layers (and of every layer without `rope_local_theta`).
    pub rope_theta: f64,
    /// RoPE scaling of full-attention layers (llama3, linear, YaRN).
    pub rope_scaling: RopeScaling,
    /// Gemma 3: the RoPE base of sliding-window layers (no scaling there).
    pub rope_local_theta: Option<f64>,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: Option<u64>,
    /// Biases on the q, k and v projections (Qwen2; Llama's `attention_bias` also on o).
    pub attention_bias: Option<bool>,
    /// Llama's `attention_bias` puts a bias on the o projection too (Qwen2's does not).
    pub o_bias: bool,
    /// Biases on the gate, up and down projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Mixture of experts (Qwen3-MoE): which layers route each token to k of E expert MLPs,
    /// and their sizes ([`crate::moe`]). `None`: every layer has the dense MLP.
    pub moe: Option<crate::moe::MoeSpec>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// How a norm applies its weight.
    pub norm: NormKind,
    /// Gemma 3: a norm after attention and after the MLP as well as before each (four per block).
    pub sandwich_norms: bool,
    /// The MLP's gated activation.
    pub activation: Activation,
    /// Gemma: the embedding is multiplied by bf16(sqrt(hidden)).
    pub embed_scale: bool,
    /// Attention's score scale is `query_pre_attn_scalar^-0.5` (Gemma) instead of head_dim^-0.5.
    pub query_pre_attn_scalar: Option<f64>,
    /// The window of sliding-window layers (keys p - window + 1 ..= p).
    pub sliding_window: Option<u64>,
    /// Per layer: full or sliding-window attention. Empty: every layer full.
    pub layer_types: Vec<LayerType>,
    /// How RoPE pairs head dims: the halves (Hugging Face, neox) or adjacent pairs (a GGUF
    /// `llama` file, whose q/k rows llama.cpp's converter permuted).
    pub rope_pairs: RopePairs,
    /// The prefix of the checkpoint's decoder tensors (`model.`; a Gemma 3 multimodal checkpoint
    /// keeps its text model under `model.language_model.`).
    pub tensor_prefix: String,
    /// Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5; [`crate::gdn`]): the linear-attention layers'
    /// sizes, and the full-attention layers' output gate and partial RoPE. `None`: every layer
    /// is softmax attention.
    pub hybrid: Option<crate::gdn::Hybrid>,
}

/// How an RMSNorm applies its weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    /// `w · bf16(x̂)` (Qwen3RMSNorm, LlamaRMSNorm: the normalized value rounded to bf16 before
    /// the weight multiplies it).
    Scale,
    /// `bf16(x̂ · (offset + w))` in fp32 (Gemma3RMSNorm: offset 1, weights centred on 0; a GGUF
    /// file has the 1 added by its converter: offset 0).
    Offset(f32),
}

/// The MLP's gated activation: `act(gate) · up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): Qwen, Llama.
    Silu,
    /// tanh-approximated GELU (GeGLU): Gemma.
    GeluTanh,
}

/// A layer's attention kind (transformers' `layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    Full,
    Sliding,
    /// A Gated DeltaNet layer (transformers' `linear_attention`): no KV, a per-sequence state.
    Linear,
}

/// How RoPE pairs the dims of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// (i, i + D/2): Hugging Face's rotate_half (neox).
    Halves,
    /// (2i, 2i + 1): the permuted q/k rows of a GGUF `llama` file.
    Adjacent,
}

impl Config {
    /// Reads a Hugging Face `config.json` with the reader of its `model_type`'s family.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| PackError::Config(format!("{}: not a model config.json: {e}", path.display())))?;
        let c = Config::from_hf(&v).map_err(|e| PackError::Config(format!("{}: {e}", path.display())))?;
        Ok(c)
    }

    /// A Hugging Face config (as JSON) through its family's reader, checked.
    pub fn from_hf(v: &serde_json::Value) -> Result<Config, String> {
        let c = families::from_hf(v)?;
        c.validate()?;
        Ok(c)
    }

    pub fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Per-head q/k RMSNorm before RoPE.
    pub fn qk_norm(&self) -> bool {
        self.qk_norm
    }

    /// Biases on the q, k and v projections.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(false)
    }

    /// Layer `l`'s attention kind.
    pub fn layer_type(&self, l: u64) -> LayerType {
        self.layer_types.get(l as usize).copied().unwrap_or(LayerType::Full)
    }

    /// Layer `l`'s sliding window, if it has one.
    pub fn window(&self, l: u64) -> Option<u64> {
        match self.layer_type(l) {
            LayerType::Sliding => self.sliding_window,
            LayerType::Full | LayerType::Linear => None,
        }
    }

    /// Attention's score scale.
    pub fn attn_scale(&self) -> f64 {
        1.0 / self.query_pre_attn_scalar.unwrap_or(self.head_dim() as f64).sqrt()
    }

    /// The embedding's scale: bf16(sqrt(hidden)) for Gemma (transformers rounds the scale to the
    /// weights' dtype before multiplying), 1 otherwise.
    pub fn embedding_scale(&self) -> f32 {
        if self.embed_scale {
            half::bf16::from_f64((self.hidden_size as f64).sqrt()).to_f32()
        } else {
            1.0
        }
    }

    /// What the pack's kernels support; an error says what is not.
    pub fn validate(&self) -> Result<(), String> {
        let d = self.head_dim();
        if d != 64 && d != 128 && d != 256 {
            return Err(format!("head_dim {d}: the pack's attention kernels support 64, 128 and 256"));
        }
        let (h, kv) = (self.num_attention_heads, self.kv_heads());
        if kv == 0 || h % kv != 0 || h / kv > 32 {
            return Err(format!("{h} attention heads over {kv} kv heads: the group size must be a whole number up to 32"));
        }
        if d == 256 && h / kv > 16 {
            return Err(format!("{h} attention heads over {kv} kv heads with head_dim 256: the kernels take at most 16 query heads per kv head"));
        }
        if !self.hidden_size.is_multiple_of(8) || !self.intermediate_size.is_multiple_of(8) {
            return Err("hidden_size and intermediate_size must be multiples of 8 (16-byte loads in the GEMMs)".into());
        }
        if self.num_hidden_layers == 0 || self.vocab_size == 0 {
            return Err("num_hidden_layers and vocab_size must be positive".into());
        }
        if !self.layer_types.is_empty() && self.layer_types.len() as u64 != self.num_hidden_layers {
            return Err(format!("layer_types has {} entries for {} layers", self.layer_types.len(), self.num_hidden_layers));
        }
        if self.layer_types.contains(&LayerType::Sliding) && self.sliding_window.is_none_or(|w| w == 0) {
            return Err("layer_types has sliding_attention layers but sliding_window is not a positive number".into());
        }
        if self.sliding_window.is_some_and(|w| w > i32::MAX as u64) {
            return Err("sliding_window does not fit the kernels' 32-bit window".into());
        }
        crate::rope::check(&self.rope_scaling, d)?;
        crate::moe::validate(self)?;
        crate::gdn::validate(self)?;
        Ok(())
    }

    /// A `config.json` that transformers loads unchanged (the family's own layout).
    pub fn to_hf_json(&self) -> serde_json::Value {
        families::to_hf_json(self)
    }
}

/// Real shapes, for random weights and benchmarks (`kern random-weights --preset`).
pub const PRESETS: &[(&str, &str)] = &[
    ("qwen3-0.6b", r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":40960,"rope_theta":1000000.0}"#),
    ("qwen3-1.7b", r#"{"model_type":"qwen3","hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":40960,"rope_theta":1000000.0}"#),
    ("qwen3-4b", r#"{"model_type":"qwen3","hidden_size":2560,"intermediate_size":9728,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":40960,"rope_theta":1000000.0}"#),
    ("qwen3-8b", r#"{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":40960,"rope_theta":1000000.0}"#),
    ("qwen2.5-0.5b", r#"{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768,"rope_theta":1000000.0}"#),
    ("qwen2.5-1.5b", r#"{"model_type":"qwen2","hidden_size":1536,"intermediate_size":8960,"num_hidden_layers":28,"num_attention_heads":12,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768,"rope_theta":1000000.0}"#),
    ("llama-3.2-1b", r#"{"model_type":"llama","hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,"tie_word_embeddings":true,"max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#),
    ("llama-3.1-8b", r#"{"model_type":"llama","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":128256,"tie_word_embeddings":false,"max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#),
    ("smollm2-135m", r#"{"model_type":"llama","hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,"tie_word_embeddings":true,"max_position_embeddings":8192,"rms_norm_eps":1e-5,"rope_theta":100000.0}"#),
    ("mistral-7b", r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":32768,"tie_word_embeddings":false,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"rope_theta":1000000.0,"sliding_window":null}"#),
    ("mistral-7b-v0.1", r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":32000,"tie_word_embeddings":false,"max_position_embeddings":32768,"rms_norm_eps":1e-5,"rope_theta":10000.0,"sliding_window":4096}"#),
    ("gemma-3-270m", r#"{"model_type":"gemma3_text","hidden_size":640,"intermediate_size":2048,"num_hidden_layers":18,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"vocab_size":262144,"max_position_embeddings":32768,"query_pre_attn_scalar":256,"sliding_window":512,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,"rope_scaling":null}"#),
    ("gemma-3-1b", r#"{"model_type":"gemma3_text","hidden_size":1152,"intermediate_size":6912,"num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"vocab_size":262144,"max_position_embeddings":32768,"query_pre_attn_scalar":256,"sliding_window":512,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,"rope_scaling":null}"#),
    ("gemma-3-4b", r#"{"model_type":"gemma3_text","hidden_size":2560,"intermediate_size":10240,"num_hidden_layers":34,"num_attention_heads":8,"num_key_value_heads":4,"head_dim":256,"vocab_size":262208,"max_position_embeddings":131072,"query_pre_attn_scalar":256,"sliding_window":1024,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,"rope_scaling":{"rope_type":"linear","factor":8.0}}"#),
    // Mixture of experts (issue 26): Qwen3-30B-A3B's real shape, and a small one for parity
    // (64 experts, top-4 without renormalization, a dense layer among the MoE ones).
    ("qwen3-30b-a3b", r#"{"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":40960,"rope_theta":1000000.0,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[]}"#),
    ("qwen3-moe-small", r#"{"model_type":"qwen3_moe","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":6,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":40960,"rope_theta":1000000.0,"num_experts":64,"num_experts_per_tok":4,"moe_intermediate_size":256,"norm_topk_prob":false,"decoder_sparse_step":1,"mlp_only_layers":[1]}"#),
    // Gated DeltaNet hybrids (issue 30): Qwen3-Next-80B-A3B's real shape, and two small configs per
    // family with both layer kinds (head_dim 128 and 256, key / value heads 4 / 8 and 2 / 4).
    ("qwen3-next-80b-a3b", r#"{"model_type":"qwen3_next","hidden_size":2048,"intermediate_size":5120,"num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":262144,"rope_theta":10000000.0,"partial_rotary_factor":0.25,"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"full_attention_interval":4,"num_experts":512,"num_experts_per_tok":10,"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[]}"#),
    ("qwen3-next-small", r#"{"model_type":"qwen3_next","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":8,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":32768,"rope_theta":10000000.0,"partial_rotary_factor":0.25,"linear_num_key_heads":4,"linear_num_value_heads":8,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"full_attention_interval":4,"num_experts":32,"num_experts_per_tok":4,"moe_intermediate_size":256,"shared_expert_intermediate_size":512,"norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[]}"#),
    ("qwen3-next-small-d256", r#"{"model_type":"qwen3_next","hidden_size":1024,"intermediate_size":2048,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":256,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768,"rope_theta":10000000.0,"partial_rotary_factor":0.25,"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"full_attention_interval":2,"num_experts":16,"num_experts_per_tok":2,"moe_intermediate_size":128,"shared_expert_intermediate_size":256,"norm_topk_prob":false,"decoder_sparse_step":1,"mlp_only_layers":[2]}"#),
    ("qwen3.5-small", r#"{"model_type":"qwen3_5_text","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":8,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true,"max_position_embeddings":32768,"rope_theta":10000000.0,"partial_rotary_factor":0.25,"linear_num_key_heads":4,"linear_num_value_heads":8,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"full_attention_interval":4}"#),
    ("qwen3.5-small-d256", r#"{"model_type":"qwen3_5_text","hidden_size":1024,"intermediate_size":3584,"num_hidden_layers":6,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"vocab_size":151936,"tie_word_embeddings":false,"max_position_embeddings":32768,"rope_theta":10000000.0,"partial_rotary_factor":0.25,"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"full_attention_interval":3}"#),
];

/// A preset by name, through its family's reader.
pub fn preset(name: &str) -> Result<Config> {
    let (_, json) = PRESETS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        PackError::Config(format!("no preset `{name}` (have: {})", PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")))
    })?;
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| PackError::Config(format!("preset {name}: {e}")))?;
    Config::from_hf(&v).map_err(|e| PackError::Config(format!("preset {name}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_round_trip() {
        for (name, _) in PRESETS {
            let c = preset(name).unwrap();
            let back = Config::from_hf(&c.to_hf_json()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(back, c, "{name}: config.json written and read back");
        }
        assert_eq!(preset("qwen2.5-0.5b").unwrap().head_dim(), 64);
        assert!(preset("qwen2.5-0.5b").unwrap().qkv_bias());
        assert!(!preset("qwen3-4b").unwrap().qkv_bias());
        let g = preset("gemma-3-1b").unwrap();
        assert_eq!((g.head_dim(), g.embedding_scale(), g.window(0), g.window(5), g.window(11)), (256, 34.0, Some(512), None, None));
        assert_eq!(preset("gemma-3-4b").unwrap().embedding_scale(), 50.5);
        assert_eq!(preset("smollm2-135m").unwrap().head_dim(), 64);
    }

    #[test]
    fn unsupported_configs_say_why() {
        let mut c = preset("qwen3-4b").unwrap();
        c.head_dim = Some(96);
        assert!(c.validate().unwrap_err().contains("head_dim 96"));
        c.head_dim = Some(128);
        c.layer_types = vec![LayerType::Sliding; 36];
        assert!(c.validate().unwrap_err().contains("sliding_window"), "a sliding layer needs a window");
    }
}
