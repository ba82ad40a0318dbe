//! Qwen3-MoE (`qwen3_moe`; GGUF `qwen3moe`): Qwen3's attention (q/k norm, no biases, neox
//! RoPE) with mixture-of-experts MLPs ([`crate::moe`]): a router over `num_experts` experts,
//! the top `num_experts_per_tok` per token (renormalized when `norm_topk_prob`), SwiGLU experts
//! of `moe_intermediate_size`, no shared expert. Layer i is MoE when i is not in
//! `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0; the others keep a dense MLP of
//! `intermediate_size`.
//!
//! GGUF files (llama.cpp's `Qwen3MoeModel` converter) stack each projection of all experts of
//! a layer into one tensor, `blk.L.ffn_{gate,up,down}_exps.weight` (ggml dims [H, I, E] /
//! [I, H, E], which kern's reader presents as [E, I, H] / [E, H, I]), and the router as
//! `blk.L.ffn_gate_inp.weight` [E, H]. A layer without a router tensor is dense.

use super::{common_gguf_name, Family, Hf, Meta};
use crate::config::Config;
use crate::moe::MoeSpec;
use kern_weights::gguf::Gguf;
use serde_json::Value;

/// The MoE fields of a Qwen-style config.json, each with its default when absent (`defaults`:
/// num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
/// `norm_topk`: norm_topk_prob's). `mlp_only_layers` indices past the last layer name no layer
/// (transformers ignores them too: `kern random-weights --layers` may cut a model below its
/// dense layers).
pub(crate) fn read_moe(v: &Value, defaults: [u64; 4], norm_topk: bool) -> Result<MoeSpec, String> {
    let hf = Hf(v);
    let dense: Vec<u64> = match v.get("mlp_only_layers").filter(|x| !x.is_null()) {
        None => vec![],
        Some(a) => a
            .as_array()
            .ok_or_else(|| format!("`mlp_only_layers` is {a}, not a list"))?
            .iter()
            .map(|x| x.as_u64().ok_or_else(|| format!("`mlp_only_layers` has {x}: not a layer index")))
            .collect::<Result<_, _>>()?,
    };
    let shared_intermediate = if defaults[3] > 0 { hf.u64("shared_expert_intermediate_size")?.unwrap_or(defaults[3]) } else { 0 };
    Ok(MoeSpec {
        num_experts: hf.u64("num_experts")?.unwrap_or(defaults[0]),
        top_k: hf.u64("num_experts_per_tok")?.unwrap_or(defaults[1]),
        intermediate: hf.u64("moe_intermediate_size")?.unwrap_or(defaults[2]),
        norm_topk_prob: hf.bool("norm_topk_prob")?.unwrap_or(norm_topk),
        decoder_sparse_step: hf.u64("decoder_sparse_step")?.unwrap_or(1),
        mlp_only_layers: dense,
        stacked: false,
        shared_intermediate,
    })
}

pub fn from_hf(v: &Value) -> Result<Config, String> {
    // Qwen3's attention and dense fields (its reader refuses what the kernels cannot do).
    let mut c = super::qwen::from_hf(v)?;
    c.family = Family::Qwen3Moe;
    c.qk_norm = true;
    // Qwen3MoeConfig's defaults: 128 experts, top 8, 768 wide, no renormalisation, no shared expert.
    let spec = read_moe(v, [128, 8, 768, 0], false)?;
    // num_experts 0 is a dense model in transformers' rule.
    c.moe = (spec.num_experts > 0).then_some(spec);
    Ok(c)
}

/// From GGUF metadata: `expert_count`, `expert_used_count`, `expert_feed_forward_length`,
/// `expert_weights_norm` (llama.cpp's qwen3moe graph always renormalizes when the key is
/// absent); which layers are MoE from the router tensors present.
pub fn from_gguf(g: &Gguf, arch: &str, _: &super::TensorF32<'_>) -> Result<Config, String> {
    let m = Meta { g, arch };
    let mut c = m.base(Family::Qwen3Moe, "qwen3_moe")?;
    if !c.qk_norm {
        return Err(format!("architecture `{arch}` lacks the q/k norm tensors (`blk.0.attn_q_norm.weight`)"));
    }
    c.rope_theta = m.f64("rope.freq_base")?.unwrap_or(1e6);
    c.rope_scaling = m.rope_scaling()?;
    let e = m.need_u64("expert_count")?;
    let k = m.need_u64("expert_used_count")?;
    let i = m.need_u64("expert_feed_forward_length")?;
    let norm = match g.get(&m.key("expert_weights_norm")) {
        None => true,
        Some(v) => v.as_u64().map(|x| x != 0).or_else(|| format!("{v:?}").contains("true").then_some(true)).unwrap_or(false),
    };
    let h = c.hidden_size;
    let mut dense = vec![];
    for l in 0..c.num_hidden_layers {
        if !m.has(&format!("blk.{l}.ffn_gate_inp.weight")) {
            dense.push(l);
            continue;
        }
        for (t, want) in [("ffn_gate_inp", vec![e, h]), ("ffn_gate_exps", vec![e, i, h]), ("ffn_up_exps", vec![e, i, h]), ("ffn_down_exps", vec![e, h, i])] {
            let name = format!("blk.{l}.{t}.weight");
            let got = m.shape(&name).ok_or_else(|| format!("no tensor `{name}` (layer {l} has a router)"))?;
            if got != want {
                return Err(format!("`{name}` has shape {got:?}, the metadata says {want:?} (experts, rows, columns)"));
            }
        }
    }
    c.moe = Some(MoeSpec { num_experts: e, top_k: k, intermediate: i, norm_topk_prob: norm, decoder_sparse_step: 1, mlp_only_layers: dense, stacked: true, shared_intermediate: 0 });
    Ok(c)
}

/// llama.cpp's names; the stacked expert names are the ones [`crate::moe::layer_weights`] writes
/// for a stacked checkpoint.
pub fn gguf_name(hf: &str) -> Option<String> {
    common_gguf_name(
        hf,
        &[("mlp.gate", "ffn_gate_inp"), ("mlp.experts.gate_proj", "ffn_gate_exps"), ("mlp.experts.up_proj", "ffn_up_exps"), ("mlp.experts.down_proj", "ffn_down_exps")],
    )
}

pub fn to_hf_json(c: &Config) -> Value {
    let mut v = super::qwen::to_hf_json(&Config { model_type: "qwen3".into(), ..c.clone() });
    v["architectures"] = serde_json::json!(["Qwen3MoeForCausalLM"]);
    v["model_type"] = "qwen3_moe".into();
    if c.layer_types.is_empty() {
        // No window, said explicitly: Qwen3MoeConfig's sliding_window defaults to 4096 (which it
        // drops itself when use_sliding_window is false; other readers might not).
        v["sliding_window"] = Value::Null;
    }
    if let Some(m) = &c.moe {
        v["num_experts"] = m.num_experts.into();
        v["num_experts_per_tok"] = m.top_k.into();
        v["moe_intermediate_size"] = m.intermediate.into();
        v["norm_topk_prob"] = m.norm_topk_prob.into();
        v["decoder_sparse_step"] = m.decoder_sparse_step.into();
        v["mlp_only_layers"] = m.mlp_only_layers.clone().into();
        v["router_aux_loss_coef"] = 0.001.into();
        v["output_router_logits"] = false.into();
    } else {
        v["num_experts"] = 0.into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_moe_keys_and_names_the_gguf_tensors() {
        let c = from_hf(&json!({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 10, "num_experts": 16,
            "num_experts_per_tok": 4, "moe_intermediate_size": 32, "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3]})).unwrap();
        let m = c.moe.clone().unwrap();
        assert_eq!((m.num_experts, m.top_k, m.intermediate, m.norm_topk_prob), (16, 4, 32, true));
        assert_eq!((0..4).map(|l| crate::moe::is_moe_layer(&c, l)).collect::<Vec<_>>(), [false, true, false, false]);
        assert!(c.qk_norm && !c.qkv_bias());
        assert_eq!(from_hf(&to_hf_json(&c)).unwrap(), Config { max_position_embeddings: Some(40960), ..c.clone() }, "config.json written and read back");
        for (hf, g) in [
            ("model.layers.3.mlp.gate.weight", "blk.3.ffn_gate_inp.weight"),
            ("model.layers.3.mlp.experts.gate_proj.weight", "blk.3.ffn_gate_exps.weight"),
            ("model.layers.3.mlp.experts.down_proj.weight", "blk.3.ffn_down_exps.weight"),
            ("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(g), "{hf}");
        }
        let e = from_hf(&json!({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "head_dim": 64, "vocab_size": 10, "mlp_only_layers": [-1]})).unwrap_err();
        assert!(e.contains("mlp_only_layers"), "{e}");
        let e = Config::from_hf(&json!({"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 2, "head_dim": 64, "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 8})).unwrap_err();
        assert!(e.contains("num_experts_per_tok 8"), "{e}");
    }
}
