//! The model families the pack serves, as a table: each family is a short module that reads its
//! Hugging Face `config.json` and its GGUF metadata into the shared [`Config`], names its
//! tensors in GGUF files, and writes its `config.json` back. Everything else — the manifest,
//! the kernels, random weights — is shared and driven by the [`Config`] alone.
//!
//! | family | `model_type` | GGUF `general.architecture` |
//! |---|---|---|
//! | [`qwen`] | `qwen3`, `qwen2` | `qwen3`, `qwen2` |
//! | [`llama`] | `llama`, `mistral` | `llama` |
//! | [`gemma3`] | `gemma3_text`, `gemma3` (its text model) | `gemma3` |
//! | [`qwen3_moe`] | `qwen3_moe` | `qwen3moe` |
//! | [`qwen3_next`] | `qwen3_next` | — |
//! | [`qwen3_5`] | `qwen3_5_text`, `qwen3_5` (text) | — |
//!
//! Adding a family: a module with the five functions of [`FamilyDef`] and a row in
//! [`FAMILIES`]; no engine crate changes.

pub mod gemma3;
pub mod llama;
pub mod qwen;
pub mod qwen3_5;
pub mod qwen3_moe;
pub mod qwen3_next;

use crate::config::Config;
use kern_weights::gguf::{Gguf, Value as GValue};
use serde_json::Value;
use std::path::Path;

/// A family of models that share tensor names, config keys and GGUF conventions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen,
    Llama,
    Gemma3,
    Qwen3Moe,
    Qwen3Next,
    Qwen35,
}

/// What a family provides.
pub struct FamilyDef {
    pub family: Family,
    /// Its name in `kern pack --help` and error messages.
    pub name: &'static str,
    /// The Hugging Face `model_type` values it reads.
    pub model_types: &'static [&'static str],
    /// The GGUF `general.architecture` values it reads.
    pub gguf_architectures: &'static [&'static str],
    /// What the family is, in a few words (for `kern pack --help`).
    pub about: &'static str,
    /// Token texts that end a turn besides the tokenizer's EOS (a GGUF file may name only
    /// `<eos>`; Gemma's instruct models end turns with `<end_of_turn>`, Llama 3's with
    /// `<|eot_id|>`): `kern pack --gguf` adds the ones the vocabulary has to the stop ids.
    pub end_of_turn: &'static [&'static str],
    from_hf: fn(&Value) -> Result<Config, String>,
    from_gguf: fn(&Gguf, &str, &TensorF32<'_>) -> Result<Config, String>,
    gguf_name: fn(&str) -> Option<String>,
    to_hf_json: fn(&Config) -> Value,
}

/// Every family, in `kern pack --help` order.
pub const FAMILIES: &[FamilyDef] = &[
    FamilyDef {
        family: Family::Qwen,
        name: "qwen",
        model_types: &["qwen3", "qwen2"],
        gguf_architectures: &["qwen3", "qwen2"],
        about: "Qwen3 dense (q/k norm), Qwen2 / Qwen2.5 (QKV biases)",
        end_of_turn: &["<|im_end|>", "<|endoftext|>"],
        from_hf: qwen::from_hf,
        from_gguf: qwen::from_gguf,
        gguf_name: qwen::gguf_name,
        to_hf_json: qwen::to_hf_json,
    },
    FamilyDef {
        family: Family::Llama,
        name: "llama",
        model_types: &["llama", "mistral"],
        gguf_architectures: &["llama"],
        about: "Llama 2 / 3.x (llama3, linear, YaRN RoPE), SmolLM2, TinyLlama, Mistral (sliding window), DeepSeek-R1-Distill-Llama",
        end_of_turn: &["<|eot_id|>", "<|eom_id|>", "<|im_end|>"],
        from_hf: llama::from_hf,
        from_gguf: llama::from_gguf,
        gguf_name: llama::gguf_name,
        to_hf_json: llama::to_hf_json,
    },
    FamilyDef {
        family: Family::Gemma3,
        name: "gemma3",
        model_types: &["gemma3_text", "gemma3"],
        gguf_architectures: &["gemma3"],
        about: "Gemma 3 text (sliding-window and global layers, (1 + w) norms, GeGLU)",
        end_of_turn: &["<end_of_turn>"],
        from_hf: gemma3::from_hf,
        from_gguf: gemma3::from_gguf,
        gguf_name: gemma3::gguf_name,
        to_hf_json: gemma3::to_hf_json,
    },
    FamilyDef {
        family: Family::Qwen3Moe,
        name: "qwen3_moe",
        model_types: &["qwen3_moe"],
        gguf_architectures: &["qwen3moe"],
        about: "Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B: routed experts, top-k of E, norm_topk_prob, decoder_sparse_step)",
        end_of_turn: &["<|im_end|>", "<|endoftext|>"],
        from_hf: qwen3_moe::from_hf,
        from_gguf: qwen3_moe::from_gguf,
        gguf_name: qwen3_moe::gguf_name,
        to_hf_json: qwen3_moe::to_hf_json,
    },
    FamilyDef {
        family: Family::Qwen3Next,
        name: "qwen3_next",
        model_types: &["qwen3_next"],
        gguf_architectures: &[],
        about: "Qwen3-Next (Gated DeltaNet + gated-attention hybrid, MoE with a shared expert: Qwen3-Next-80B-A3B)",
        end_of_turn: &["<|im_end|>", "<|endoftext|>"],
        from_hf: qwen3_next::from_hf,
        from_gguf: qwen3_next::from_gguf,
        gguf_name: qwen3_next::gguf_name,
        to_hf_json: qwen3_next::to_hf_json,
    },
    FamilyDef {
        family: Family::Qwen35,
        name: "qwen3_5",
        model_types: &["qwen3_5_text", "qwen3_5"],
        gguf_architectures: &[],
        about: "Qwen3.5 text (Gated DeltaNet + gated-attention hybrid, dense MLP)",
        end_of_turn: &["<|im_end|>", "<|endoftext|>"],
        from_hf: qwen3_5::from_hf,
        from_gguf: qwen3_5::from_gguf,
        gguf_name: qwen3_5::gguf_name,
        to_hf_json: qwen3_5::to_hf_json,
    },
];

/// The family table's row of `f`.
pub fn def(f: Family) -> &'static FamilyDef {
    FAMILIES.iter().find(|d| d.family == f).expect("every family has a row")
}

/// Every `model_type` the pack reads, for error messages.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES.iter().flat_map(|d| d.model_types.iter().copied()).collect()
}

/// Every GGUF architecture the pack reads, for error messages.
pub fn gguf_architectures() -> Vec<&'static str> {
    FAMILIES.iter().flat_map(|d| d.gguf_architectures.iter().copied()).collect()
}

/// The family that reads `model_type`.
pub fn for_model_type(model_type: &str) -> Option<&'static FamilyDef> {
    FAMILIES.iter().find(|d| d.model_types.contains(&model_type))
}

/// A Hugging Face config through the reader of its `model_type`.
pub fn from_hf(v: &Value) -> Result<Config, String> {
    let t = v.get("model_type").and_then(Value::as_str).ok_or("no `model_type` field")?;
    let d = for_model_type(t).ok_or_else(|| format!("model_type `{t}` has no family in this kern; supported: {}", model_types().join(", ")))?;
    // A quantized checkpoint kern cannot run is refused here, by name (FP8 blocks pass: crate::fp8).
    crate::fp8::scheme(v)?;
    (d.from_hf)(v)
}

/// Reads an F32 tensor's values from the file being packed (`None`: absent or not F32).
pub type TensorF32<'a> = dyn Fn(&str) -> Option<Vec<f32>> + 'a;

/// The config of a GGUF checkpoint, from its metadata and tensors; `file` names it in errors.
pub fn from_gguf(ckpt: &kern_weights::Checkpoint, file: &Path) -> Result<Config, String> {
    let g = ckpt.gguf().ok_or("not a GGUF file")?;
    let read = |name: &str| -> Option<Vec<f32>> {
        let t = ckpt.tensor(name).ok()?;
        (t.file_dtype == "F32").then(|| t.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    };
    from_gguf_meta(g, file, &read)
}

/// [`from_gguf`] from the metadata alone, with `read` for the few tensors a family reads.
pub fn from_gguf_meta(g: &Gguf, file: &Path, read: &TensorF32<'_>) -> Result<Config, String> {
    let arch = g.architecture().ok_or_else(|| format!("{}: no `general.architecture` key: not a model GGUF", file.display()))?;
    let d = FAMILIES.iter().find(|d| d.gguf_architectures.contains(&arch)).ok_or_else(|| {
        format!("{}: architecture `{arch}` has no family in this kern; GGUF architectures supported: {}", file.display(), gguf_architectures().join(", "))
    })?;
    let c = (d.from_gguf)(g, arch, read).map_err(|e| format!("{}: {e}", file.display()))?;
    c.validate().map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(c)
}

/// The GGUF name of a manifest weight source (Hugging Face name), for `cfg`'s family.
pub fn gguf_name(cfg: &Config, hf: &str) -> Option<String> {
    (def(cfg.family).gguf_name)(hf)
}

/// `cfg` as its family's `config.json`.
pub fn to_hf_json(cfg: &Config) -> Value {
    (def(cfg.family).to_hf_json)(cfg)
}

// ---------------------------------------------------------------------- shared writer

/// `cfg` as a `config.json`: the fields every family writes alike — architecture, model type,
/// sizes, heads, vocabulary, norm epsilon, RoPE base, tied embeddings and the context
/// (`max_positions` when `cfg` has none) — then the family's own `extra` fields, in that order.
pub(crate) fn hf_json(cfg: &Config, arch: &str, model_type: &str, max_positions: u64, extra: Value) -> Value {
    let mut v = serde_json::json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.kv_heads(),
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings.unwrap_or(max_positions),
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

// ---------------------------------------------------------------------- shared readers

/// Typed reads of a Hugging Face config's fields; errors name the field.
pub(crate) struct Hf<'a>(pub &'a Value);

impl Hf<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    pub fn u64(&self, k: &str) -> Result<Option<u64>, String> {
        self.get(k).map(|v| v.as_u64().ok_or_else(|| format!("`{k}` is {v}, not a non-negative integer"))).transpose()
    }
    pub fn need_u64(&self, k: &str) -> Result<u64, String> {
        self.u64(k)?.ok_or_else(|| format!("no `{k}` field"))
    }
    pub fn f64(&self, k: &str) -> Result<Option<f64>, String> {
        self.get(k).map(|v| v.as_f64().ok_or_else(|| format!("`{k}` is {v}, not a number"))).transpose()
    }
    pub fn bool(&self, k: &str) -> Result<Option<bool>, String> {
        self.get(k).map(|v| v.as_bool().ok_or_else(|| format!("`{k}` is {v}, not true or false"))).transpose()
    }
    pub fn str(&self, k: &str) -> Result<Option<&str>, String> {
        self.get(k).map(|v| v.as_str().ok_or_else(|| format!("`{k}` is {v}, not a string"))).transpose()
    }
    /// Whether the key is present (even as `null`).
    pub fn has(&self, k: &str) -> bool {
        self.0.get(k).is_some()
    }
    /// The activation must be one of `allowed` (checked under `hidden_act` and `hidden_activation`).
    pub fn activation(&self, allowed: &[&str]) -> Result<Option<String>, String> {
        for k in ["hidden_act", "hidden_activation"] {
            if let Some(a) = self.str(k)? {
                if !allowed.contains(&a) {
                    return Err(format!("`{k}` is `{a}`: this family's MLP takes {}", allowed.join(" or ")));
                }
                return Ok(Some(a.to_string()));
            }
        }
        Ok(None)
    }
    /// `layer_types` (transformers v5: `full_attention` / `sliding_attention` per layer).
    pub fn layer_types(&self, layers: u64) -> Result<Vec<crate::config::LayerType>, String> {
        use crate::config::LayerType;
        let Some(v) = self.get("layer_types") else { return Ok(vec![]) };
        let a = v.as_array().ok_or_else(|| format!("`layer_types` is {v}, not a list"))?;
        if a.len() as u64 != layers {
            return Err(format!("`layer_types` has {} entries for {layers} layers", a.len()));
        }
        a.iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("full_attention") => Ok(LayerType::Full),
                Some("sliding_attention") => Ok(LayerType::Sliding),
                Some("linear_attention") => Ok(LayerType::Linear),
                _ => Err(format!("`layer_types[{i}]` is {t}: kern knows full_attention, sliding_attention and linear_attention")),
            })
            .collect()
    }
    /// The RoPE base and scaling of full-attention layers, from `rope_theta` + `rope_scaling`
    /// or transformers v5's `rope_parameters` (flat, or per layer type under `full_attention`).
    pub fn rope(&self, default_theta: f64, max_pos: Option<u64>) -> Result<(f64, crate::rope::RopeScaling), String> {
        let params = self.get("rope_parameters").map(|p| p.get("full_attention").unwrap_or(p));
        let theta = match params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t,
            None => self.f64("rope_theta")?.unwrap_or(default_theta),
        };
        let scaling = match (params, self.get("rope_scaling")) {
            (Some(p), _) => crate::rope::RopeScaling::from_json(p, max_pos)?,
            (None, Some(s)) => crate::rope::RopeScaling::from_json(s, max_pos)?,
            (None, None) => crate::rope::RopeScaling::None,
        };
        Ok((theta, scaling))
    }
}

/// Typed reads of GGUF metadata `ARCH.KEY`; errors name the key.
pub(crate) struct Meta<'a> {
    pub g: &'a Gguf,
    pub arch: &'a str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn u64(&self, k: &str) -> Result<Option<u64>, String> {
        match self.g.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("`{}` is {v:?}, not a non-negative integer (per-layer arrays are not supported)", self.key(k))),
        }
    }
    pub fn need_u64(&self, k: &str) -> Result<u64, String> {
        self.u64(k)?.ok_or_else(|| format!("no `{}` key", self.key(k)))
    }
    /// A float key as the decimal a config.json would write (GGUF stores f32: 1e-6, not
    /// 9.999999974752427e-7).
    pub fn f64(&self, k: &str) -> Result<Option<f64>, String> {
        match self.g.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(f32_decimal(x))).ok_or_else(|| format!("`{}` is {v:?}, not a number", self.key(k))),
        }
    }
    pub fn str(&self, k: &str) -> Option<&str> {
        self.g.get(&self.key(k)).and_then(GValue::as_str)
    }
    pub fn shape(&self, name: &str) -> Option<Vec<u64>> {
        self.g.tensor(name).map(|t| t.shape())
    }
    pub fn has(&self, name: &str) -> bool {
        self.g.tensor(name).is_some()
    }

    /// The fields every decoder GGUF has: hidden, layers, heads, kv heads, head_dim (from the
    /// Q projection's rows, checked against key_length / value_length), vocab (checked against
    /// the embedding), ffn, eps, theta, context, tied output. `family` and `model_type` set;
    /// the family fills the rest.
    pub fn base(&self, family: Family, model_type: &str) -> Result<Config, String> {
        let hidden = self.need_u64("embedding_length")?;
        let layers = self.need_u64("block_count")?;
        let heads = self.need_u64("attention.head_count")?;
        let kv_heads = self.u64("attention.head_count_kv")?.unwrap_or(heads);
        let q = self.shape("blk.0.attn_q.weight").ok_or("no tensor `blk.0.attn_q.weight`")?;
        if q.len() != 2 || heads == 0 || q[0] % heads != 0 || q[1] != hidden {
            return Err(format!("`blk.0.attn_q.weight` has shape {q:?}, which is not [heads × head_dim, {hidden}] for {heads} heads"));
        }
        let head_dim = q[0] / heads;
        for k in ["attention.key_length", "attention.value_length"] {
            if let Some(d) = self.u64(k)? {
                if d != head_dim {
                    return Err(format!("`{}` is {d}, but `blk.0.attn_q.weight` {q:?} gives head_dim {head_dim}", self.key(k)));
                }
            }
        }
        if let Some(d) = self.u64("rope.dimension_count")? {
            if d != head_dim {
                return Err(format!("`{}` is {d}: partial rotary (≠ head_dim {head_dim}) is not supported by the RoPE kernel", self.key("rope.dimension_count")));
            }
        }
        let embd = self.shape("token_embd.weight").ok_or("no tensor `token_embd.weight`")?;
        let tokens = self.g.get("tokenizer.ggml.tokens").and_then(GValue::as_array).map(|a| a.len() as u64);
        let vocab = match self.u64("vocab_size")? {
            Some(v) => v,
            None => tokens.unwrap_or(embd[0]),
        };
        if embd != [vocab, hidden] {
            return Err(format!("`token_embd.weight` has shape {embd:?}, the metadata says [{vocab}, {hidden}] (vocab, hidden)"));
        }
        let eps = self.f64("attention.layer_norm_rms_epsilon")?.ok_or_else(|| format!("no `{}` key", self.key("attention.layer_norm_rms_epsilon")))?;
        Ok(Config {
            family,
            model_type: model_type.to_string(),
            hidden_size: hidden,
            intermediate_size: self.need_u64("feed_forward_length")?,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: Some(kv_heads),
            head_dim: Some(head_dim),
            vocab_size: vocab,
            rms_norm_eps: eps,
            rope_theta: self.f64("rope.freq_base")?.unwrap_or(10000.0),
            rope_scaling: crate::rope::RopeScaling::None,
            rope_local_theta: None,
            tie_word_embeddings: !self.has("output.weight"),
            max_position_embeddings: self.u64("context_length")?,
            attention_bias: Some(self.has("blk.0.attn_q.bias")),
            o_bias: false,
            mlp_bias: false,
            moe: None,
            qk_norm: self.has("blk.0.attn_q_norm.weight"),
            norm: crate::config::NormKind::Scale,
            sandwich_norms: false,
            activation: crate::config::Activation::Silu,
            embed_scale: false,
            query_pre_attn_scalar: None,
            sliding_window: None,
            layer_types: vec![],
            rope_pairs: crate::config::RopePairs::Halves,
            tensor_prefix: "model.".into(),
            hybrid: None,
        })
    }

    /// `ARCH.rope.scaling.type` / `.factor` (linear, yarn) as a scaling.
    pub fn rope_scaling(&self) -> Result<crate::rope::RopeScaling, String> {
        use crate::rope::RopeScaling;
        let factor = self.f64("rope.scaling.factor")?;
        match self.str("rope.scaling.type") {
            None | Some("none") => Ok(RopeScaling::None),
            Some("linear") => Ok(RopeScaling::Linear { factor: factor.ok_or_else(|| format!("`{}` is linear but no factor is given", self.key("rope.scaling.type")))? }),
            Some("yarn") => {
                let orig = self.u64("rope.scaling.original_context_length")?;
                RopeScaling::from_json(&serde_json::json!({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}), None)
            }
            Some(t) => Err(format!("`{}` is `{t}`: kern's RoPE takes none, linear and yarn from GGUF metadata", self.key("rope.scaling.type"))),
        }
    }
}

/// The shortest decimal that reads back as the same f32.
pub(crate) fn f32_decimal(v: f64) -> f64 {
    format!("{}", v as f32).parse().unwrap_or(v)
}

/// The GGUF name of a Hugging Face decoder tensor that Qwen, Llama and Gemma 3 name alike
/// (llama.cpp's `llama-arch.cpp` table); `extra` maps a family's own module names first.
pub(crate) fn common_gguf_name(hf: &str, extra: &[(&str, &str)]) -> Option<String> {
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
    let g = match extra.iter().find(|(m, _)| *m == module) {
        Some((_, g)) => *g,
        None => match module {
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
        },
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{g}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_routes_every_model_type_and_architecture_once() {
        let mut seen = std::collections::HashSet::new();
        for t in model_types() {
            assert!(seen.insert(t), "{t} twice");
            assert!(for_model_type(t).is_some());
        }
        let e = from_hf(&serde_json::json!({"model_type": "phi3"})).unwrap_err();
        assert!(e.contains("`phi3`") && e.contains("llama") && e.contains("gemma3_text"), "{e}");
    }

    #[test]
    fn f32_metadata_reads_as_its_decimal() {
        assert_eq!(f32_decimal(f64::from(1e-6f32)), 1e-6);
        assert_eq!(f32_decimal(1e6), 1e6);
    }
}
