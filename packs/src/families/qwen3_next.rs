//! Qwen3-Next (`qwen3_next`): a Gated DeltaNet hybrid ([`crate::gdn`]). Layer i is
//! `linear_attention` (GDN) unless (i + 1) % `full_attention_interval` == 0 (or as `layer_types`
//! says); the full-attention layers have an output gate (`q_proj` writes `[q | gate]` per head;
//! `o = attn · sigmoid(gate)` before `o_proj`), (1 + w) q / k norms and RoPE on the first
//! `partial_rotary_factor` of each head; every norm is zero-centred (1 + w) but the GDN layer's
//! gated norm (plain w); MLPs are mixture-of-experts with a shared expert
//! ([`crate::moe::MoeSpec::shared_intermediate`]) scaled by `sigmoid(shared_expert_gate(x))`
//! (or dense for `mlp_only_layers`). The GDN projections are stored grouped per key head
//! (`in_proj_qkvz`, `in_proj_ba`) and split by `gdn_split_proj`. `mtp.*` weights are not used.
//!
//! Refused by name: GDN head dims other than 128, conv widths other than 4, rope scaling,
//! attention biases, a recurrent-state layout the kernels do not have.

use super::{Family, Hf};
use crate::config::{Activation, Config, LayerType, NormKind, RopePairs};
use crate::gdn::Hybrid;
use serde_json::{json, Value};

/// The config fields both hybrids share (Qwen3NextConfig / Qwen3_5TextConfig names and
/// defaults); `grouped`: Qwen3-Next's per-key-head projections.
pub(crate) fn read_hybrid(v: &Value, family: Family, model_type: &str, grouped: bool) -> Result<Config, String> {
    let hf = Hf(v);
    hf.activation(&["silu"])?;
    let layers = hf.need_u64("num_hidden_layers")?;
    let heads = hf.need_u64("num_attention_heads")?;
    let head_dim = hf.u64("head_dim")?.unwrap_or(256);
    let max_pos = hf.u64("max_position_embeddings")?;
    // rope_parameters (transformers v5) or the legacy top-level keys.
    let params = v.get("rope_parameters").filter(|p| !p.is_null());
    let pget = |k: &str| params.and_then(|p| p.get(k)).filter(|x| !x.is_null()).or_else(|| v.get(k).filter(|x| !x.is_null()));
    let theta = match pget("rope_theta") {
        Some(t) => t.as_f64().ok_or_else(|| format!("`rope_theta` is {t}, not a number"))?,
        None => 10000.0,
    };
    let factor = match pget("partial_rotary_factor") {
        Some(f) => f.as_f64().ok_or_else(|| format!("`partial_rotary_factor` is {f}, not a number"))?,
        None => 0.25,
    };
    for src in [params, v.get("rope_scaling").filter(|x| !x.is_null())].into_iter().flatten() {
        let kind = src.get("rope_type").or_else(|| src.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(format!("rope type `{kind}`: the hybrids' gated attention takes the default RoPE of the rotated dims only"));
        }
    }
    if factor <= 0.0 || factor > 1.0 {
        return Err(format!("`partial_rotary_factor` {factor}: must be in (0, 1]"));
    }
    let rotary_dim = (head_dim as f64 * factor) as u64;
    // layer_types, or transformers' rule from full_attention_interval.
    let mut layer_types = hf.layer_types(layers)?;
    if layer_types.is_empty() {
        let interval = hf.u64("full_attention_interval")?.unwrap_or(4);
        if interval == 0 {
            return Err("`full_attention_interval` 0: at least 1".into());
        }
        layer_types = (0..layers).map(|i| if (i + 1) % interval == 0 { LayerType::Full } else { LayerType::Linear }).collect();
    }
    if let Some(t) = layer_types.iter().position(|t| *t == LayerType::Sliding) {
        return Err(format!("`layer_types[{t}]` is sliding_attention: the hybrids have full_attention and linear_attention layers only"));
    }
    if hf.bool("attention_bias")?.unwrap_or(false) {
        return Err("`attention_bias` true: the gated attention kernels have no q / k / v / o biases".into());
    }
    if let Some(dt) = hf.str("mamba_ssm_dtype")? {
        if dt != "float32" && dt != "bfloat16" {
            return Err(format!("`mamba_ssm_dtype` `{dt}`: the GDN kernels keep the state in float32 (default) or bfloat16 (--gdn-state bf16)"));
        }
    }
    let hybrid = Hybrid {
        num_k_heads: hf.u64("linear_num_key_heads")?.unwrap_or(16),
        num_v_heads: hf.u64("linear_num_value_heads")?.unwrap_or(32),
        key_head_dim: hf.u64("linear_key_head_dim")?.unwrap_or(128),
        value_head_dim: hf.u64("linear_value_head_dim")?.unwrap_or(128),
        conv_kernel: hf.u64("linear_conv_kernel_dim")?.unwrap_or(4),
        rotary_dim,
        partial_rotary_factor: factor,
        grouped,
    };
    Ok(Config {
        family,
        model_type: model_type.to_string(),
        hidden_size: hf.need_u64("hidden_size")?,
        intermediate_size: hf.need_u64("intermediate_size")?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: hf.u64("num_key_value_heads")?,
        head_dim: Some(head_dim),
        vocab_size: hf.need_u64("vocab_size")?,
        rms_norm_eps: hf.f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: theta,
        rope_scaling: crate::rope::RopeScaling::None,
        rope_local_theta: None,
        tie_word_embeddings: hf.bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: max_pos,
        attention_bias: Some(false),
        o_bias: false,
        mlp_bias: false,
        moe: None,
        qk_norm: true,
        norm: NormKind::Offset(1.0),
        sandwich_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        query_pre_attn_scalar: None,
        sliding_window: None,
        layer_types,
        rope_pairs: RopePairs::Halves,
        tensor_prefix: "model.".into(),
        hybrid: Some(hybrid),
    })
}

pub fn from_hf(v: &Value) -> Result<Config, String> {
    let mut c = read_hybrid(v, Family::Qwen3Next, "qwen3_next", true)?;
    // Qwen3NextConfig's defaults: 512 experts, top 10, 512 wide, renormalised, a 512-wide shared expert.
    let spec = super::qwen3_moe::read_moe(v, [512, 10, 512, 512], true)?;
    if spec.num_experts > 0 && spec.shared_intermediate == 0 {
        return Err("`shared_expert_intermediate_size` 0: Qwen3-Next's MoE layers always have a shared expert".into());
    }
    c.moe = (spec.num_experts > 0).then_some(spec);
    Ok(c)
}

/// GGUF `qwen3next` files are not read yet (their `ssm_*` tensors and the +1 baked into norms
/// need their own table).
pub fn from_gguf(_: &kern_weights::gguf::Gguf, arch: &str, _: &super::TensorF32<'_>) -> Result<Config, String> {
    Err(format!("GGUF architecture `{arch}`: the Gated DeltaNet hybrids are packed from Hugging Face checkpoints only (kern pack --config)"))
}

pub fn gguf_name(_: &str) -> Option<String> {
    None
}

/// The keys both hybrids write back (`rope_theta` and `partial_rotary_factor` at the top level:
/// transformers v4 reads them there, v5 moves them into `rope_parameters`).
pub(crate) fn hybrid_json(c: &Config, arch: &str, model_type: &str) -> Value {
    let h = c.hybrid.as_ref().expect("a hybrid config");
    let types: Vec<&str> = c.layer_types.iter().map(|t| if *t == LayerType::Linear { "linear_attention" } else { "full_attention" }).collect();
    // full_attention_interval when the layers follow the rule (older readers compute them from it).
    let interval = (1..=c.num_hidden_layers).find(|&k| c.layer_types.iter().enumerate().all(|(i, t)| (*t == LayerType::Full) == (i as u64 + 1).is_multiple_of(k)));
    let mut v = super::hf_json(c, arch, model_type, 32768, json!({
        "head_dim": c.head_dim(),
        "partial_rotary_factor": h.partial_rotary_factor,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "linear_num_key_heads": h.num_k_heads,
        "linear_num_value_heads": h.num_v_heads,
        "linear_key_head_dim": h.key_head_dim,
        "linear_value_head_dim": h.value_head_dim,
        "linear_conv_kernel_dim": h.conv_kernel,
        "layer_types": types,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }));
    if let Some(k) = interval {
        v["full_attention_interval"] = k.into();
    }
    v
}

pub fn to_hf_json(c: &Config) -> Value {
    let mut v = hybrid_json(c, "Qwen3NextForCausalLM", "qwen3_next");
    match &c.moe {
        Some(m) => {
            v["num_experts"] = m.num_experts.into();
            v["num_experts_per_tok"] = m.top_k.into();
            v["moe_intermediate_size"] = m.intermediate.into();
            v["shared_expert_intermediate_size"] = m.shared_intermediate.into();
            v["norm_topk_prob"] = m.norm_topk_prob.into();
            v["decoder_sparse_step"] = m.decoder_sparse_step.into();
            v["mlp_only_layers"] = m.mlp_only_layers.clone().into();
            v["router_aux_loss_coef"] = 0.001.into();
            v["output_router_logits"] = false.into();
        }
        None => v["num_experts"] = 0.into(),
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_layer_kinds_partial_rotary_and_the_shared_expert() {
        let c = from_hf(&json!({"model_type": "qwen3_next", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "full_attention_interval": 4, "rope_theta": 1e7})).unwrap();
        let kinds: Vec<bool> = (0..8).map(|l| crate::gdn::is_linear(&c, l)).collect();
        assert_eq!(kinds, [true, true, true, false, true, true, true, false]);
        let h = c.hybrid.clone().unwrap();
        assert_eq!((h.rotary_dim, h.grouped, h.conv_dim()), (32, true, (2 * 2 + 4) * 128));
        assert_eq!(c.moe.as_ref().unwrap().shared_intermediate, 128);
        assert_eq!(c.norm, NormKind::Offset(1.0));
        assert_eq!(from_hf(&to_hf_json(&c)).unwrap(), Config { max_position_embeddings: Some(32768), ..c.clone() }, "config.json written and read back");
    }
}
