//! Where `--model` points: a model directory, a Hugging Face id found in the local Hugging Face
//! cache, or — with no `--model` — the default model `scripts/setup.sh` packs into `$KERN_HOME`.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The default model's directory name under `$KERN_HOME/models` (scripts/setup.sh packs it).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b-instruct";

/// `$KERN_HOME`, else `~/.cache/kern`.
pub fn kern_home() -> PathBuf {
    match std::env::var_os("KERN_HOME").filter(|v| !v.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => home().join(".cache/kern"),
    }
}

/// The default model's directory: `$KERN_HOME/models/qwen2.5-coder-0.5b-instruct`.
pub fn default_model_dir() -> PathBuf {
    kern_home().join("models").join(DEFAULT_MODEL)
}

fn home() -> PathBuf {
    std::env::var_os("HOME").filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (the `huggingface_hub` library's own order).
fn hf_cache() -> PathBuf {
    if let Some(c) = std::env::var_os("HF_HUB_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(c);
    }
    if let Some(h) = std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join("hub");
    }
    home().join(".cache/huggingface/hub")
}

/// The model directory for `--model ARG`, or for no `--model`:
/// * an existing directory is itself;
/// * `org/name` that is not a directory is a Hugging Face id, looked up in the local Hugging
///   Face cache (`models--org--name/snapshots/<revision>`, the revision `refs/main` names, else
///   the newest);
/// * no argument is the default model under `$KERN_HOME`, which must have been set up.
pub fn resolve_model(arg: Option<&Path>) -> Result<PathBuf> {
    resolve_in(arg, &default_model_dir(), &hf_cache())
}

fn resolve_in(arg: Option<&Path>, default: &Path, cache: &Path) -> Result<PathBuf> {
    let Some(p) = arg else {
        if default.join("model.json").is_file() {
            return Ok(default.to_path_buf());
        }
        bail!(
            "no --model given and the default model is not set up ({} has no model.json): run `bash scripts/setup.sh` (it downloads and packs Qwen2.5-Coder-0.5B-Instruct), or give --model DIR",
            default.display()
        );
    };
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    if p.exists() {
        bail!("--model {}: not a directory (give the model directory: model.json, weights, tokenizer)", p.display());
    }
    let Some((org, name)) = hf_id(p) else {
        bail!("--model {}: no such directory", p.display());
    };
    let repo = cache.join(format!("models--{org}--{name}"));
    let snapshots = repo.join("snapshots");
    if !snapshots.is_dir() {
        bail!(
            "--model {org}/{name}: no such directory, and not in the local Hugging Face cache ({} does not exist). Download it where a network is available (`huggingface-cli download {org}/{name}`, or `hf download {org}/{name}`) and copy the cache, or give a directory",
            repo.display()
        );
    }
    let main = std::fs::read_to_string(repo.join("refs/main")).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    if let Some(rev) = main {
        let dir = snapshots.join(&rev);
        if dir.is_dir() {
            return Ok(dir);
        }
    }
    let newest = std::fs::read_dir(&snapshots)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
    match newest {
        Some(e) => Ok(e.path()),
        None => bail!("--model {org}/{name}: {} holds no snapshot: the download did not finish; download it again", snapshots.display()),
    }
}

/// `org/name` with Hub-legal characters (letters, digits, `-`, `_`, `.`), else `None`.
fn hf_id(p: &Path) -> Option<(String, String)> {
    let s = p.to_str()?;
    let (org, name) = s.split_once('/')?;
    let ok = |part: &str| {
        !part.is_empty() && !part.starts_with('.') && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (ok(org) && ok(name)).then(|| (org.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kern-model-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn default_model_must_be_set_up() {
        let d = scratch("default");
        let model = d.join("models").join(DEFAULT_MODEL);
        let e = resolve_in(None, &model, &d).unwrap_err().to_string();
        assert!(e.contains("bash scripts/setup.sh") && e.contains(DEFAULT_MODEL), "{e}");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("model.json"), "{}").unwrap();
        assert_eq!(resolve_in(None, &model, &d).unwrap(), model);
    }

    #[test]
    fn directories_and_hugging_face_ids() {
        let d = scratch("hf");
        assert_eq!(resolve_in(Some(&d), &d, &d).unwrap(), d);
        let cache = d.join("hub");
        let e = resolve_in(Some(Path::new("Qwen/Qwen3-0.6B")), &d, &cache).unwrap_err().to_string();
        assert!(e.contains("models--Qwen--Qwen3-0.6B") && e.contains("huggingface-cli download Qwen/Qwen3-0.6B"), "{e}");
        let snaps = cache.join("models--Qwen--Qwen3-0.6B/snapshots");
        std::fs::create_dir_all(snaps.join("aaaa")).unwrap();
        std::fs::create_dir_all(snaps.join("bbbb")).unwrap();
        std::fs::create_dir_all(cache.join("models--Qwen--Qwen3-0.6B/refs")).unwrap();
        std::fs::write(cache.join("models--Qwen--Qwen3-0.6B/refs/main"), "aaaa\n").unwrap();
        assert_eq!(resolve_in(Some(Path::new("Qwen/Qwen3-0.6B")), &d, &cache).unwrap(), snaps.join("aaaa"));
        let e = resolve_in(Some(Path::new("no/such/dir")), &d, &cache).unwrap_err().to_string();
        assert!(e.contains("no such directory"), "{e}");
        assert!(hf_id(Path::new("../x")).is_none() && hf_id(Path::new("./x")).is_none());
    }
}
