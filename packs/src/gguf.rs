//! Weight sources for checkpoints that do not use the Hugging Face names the manifest is
//! written with: GGUF files (each family's name table, [`crate::families::gguf_name`]) and
//! checkpoints that keep the decoder under another prefix (a Gemma 3 multimodal checkpoint's
//! `language_model.model.`).
//!
//! Layout: GGUF dims are ne-order (fastest first); `kern_weights` presents them reversed, so a
//! linear layer is [out, in] as in Hugging Face, with the same bytes.

use crate::{PackError, Result};

/// Rewrites every weight source of a generated manifest (`buffers.*.from`: `tensor` and
/// `concat` names) with `map`; a name it does not know is a pack bug. Buffer names stay as
/// they are; `values` and `alias` sources are untouched.
pub fn rename_sources(manifest: &mut serde_json::Value, map: &dyn Fn(&str) -> Option<String>) -> Result<()> {
    let Some(buffers) = manifest.get_mut("buffers").and_then(|b| b.as_object_mut()) else {
        return Err(PackError::Config("generated manifest has no buffers".into()));
    };
    let rename = |v: &mut serde_json::Value| -> Result<()> {
        let hf = v.as_str().unwrap_or_default().to_string();
        let g = map(&hf).ok_or_else(|| PackError::Config(format!("pack bug: tensor `{hf}` has no name in this checkpoint's layout")))?;
        *v = serde_json::Value::String(g);
        Ok(())
    };
    for (_, b) in buffers.iter_mut() {
        let Some(from) = b.get_mut("from") else { continue };
        if let Some(t) = from.get_mut("tensor") {
            rename(t)?;
        }
        if let Some(list) = from.get_mut("concat").and_then(|c| c.as_array_mut()) {
            for t in list {
                rename(t)?;
            }
        }
    }
    Ok(())
}

/// The name of a Hugging Face decoder tensor (`model.…`) in a checkpoint whose decoder lives
/// under `prefix`; other names (`lm_head.weight`) unchanged.
pub fn with_prefix(hf: &str, prefix: &str) -> String {
    match hf.strip_prefix("model.") {
        Some(rest) => format!("{prefix}{rest}"),
        None => hf.to_string(),
    }
}

/// The prefix a checkpoint keeps its decoder tensors under (what comes before
/// `layers.0.input_layernorm.weight`), when it is not `default`: Gemma 3 checkpoints are saved
/// as `language_model.model.` by older and `model.language_model.` by newer transformers.
pub fn decoder_prefix(names: &[&str], default: &str) -> Option<String> {
    const ANCHOR: &str = "layers.0.input_layernorm.weight";
    if names.iter().any(|n| n.strip_prefix(default) == Some(ANCHOR)) {
        return None;
    }
    names.iter().find_map(|n| n.strip_suffix(ANCHOR)).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_checkpoints_decoder_prefix() {
        let newer = ["model.language_model.layers.0.input_layernorm.weight", "model.vision_tower.x"];
        assert_eq!(decoder_prefix(&newer, "language_model.model.").as_deref(), Some("model.language_model."));
        let same = ["language_model.model.layers.0.input_layernorm.weight"];
        assert_eq!(decoder_prefix(&same, "language_model.model."), None);
        assert_eq!(decoder_prefix(&["lm_head.weight"], "model."), None);
    }

    #[test]
    fn prefixes_only_the_decoder() {
        assert_eq!(with_prefix("model.layers.0.mlp.up_proj.weight", "language_model.model."), "language_model.model.layers.0.mlp.up_proj.weight");
        assert_eq!(with_prefix("lm_head.weight", "language_model.model."), "lm_head.weight");
    }
}
