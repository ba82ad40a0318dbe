//! Where `--model` points: a model directory, a Hugging Face id found in the local Hugging Face
//! cache (downloaded into it first when it is not there: `hub.rs`), or — with no `--model` — the
//! default model `scripts/setup.sh` packs into `$KERN_HOME`. A directory that holds a Hugging
//! Face checkpoint but no `model.json` is packed once into `$KERN_HOME/models/` ([`prepare`]).

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
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
    resolve_in(arg, &default_model_dir(), &hf_cache(), Some(&crate::hub::Hub::from_env()))
}

/// The directory to load for `--model ARG`: [`resolve_model`], then, when that directory has
/// no `model.json` but a Hugging Face `config.json`, its pack under `$KERN_HOME/models/` —
/// made on first use (the manifest and cubins written there, the weights and tokenizer linked
/// from the source) and reused while the source's `config.json` is unchanged.
pub fn prepare(arg: Option<&Path>) -> Result<PathBuf> {
    let dir = resolve_model(arg)?;
    packed(&dir, &kern_home().join("models"), &kernels_dir)
}

/// Where the Qwen pack's built kernels are: `$KERN_KERNELS`, `$KERN_HOME/kernels/packs`
/// (scripts/setup.sh puts them there), the checkout this binary was built in
/// (`<repo>/build/packs`), or `./build/packs`.
pub fn kernels_dir() -> Result<PathBuf> {
    let mut tried = Vec::new();
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(k) = std::env::var_os("KERN_KERNELS").filter(|v| !v.is_empty()) {
        cands.push(PathBuf::from(k));
    }
    cands.push(kern_home().join("kernels/packs"));
    if let Ok(exe) = std::env::current_exe() {
        // <repo>/target/<profile>/kern
        if let Some(repo) = exe.parent().and_then(Path::parent).and_then(Path::parent) {
            cands.push(repo.join("build/packs"));
        }
    }
    cands.push(PathBuf::from("build/packs"));
    for c in cands {
        if c.join("rowwise.sm_90a.cubin").is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    bail!("the packs' kernels are not built (looked in {}): run `bash scripts/setup.sh`, or build them with `bash packs/kernels/build.sh` and set KERN_KERNELS", tried.join(", "))
}

/// `dir` itself when it has a `model.json`; else, for a Hugging Face checkpoint (`config.json`
/// and safetensors), its pack under `models` (made now, or reused).
fn packed(dir: &Path, models: &Path, kernels: &dyn Fn() -> Result<PathBuf>) -> Result<PathBuf> {
    if dir.join("model.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    let config = dir.join("config.json");
    if !config.is_file() {
        bail!("{}: no model.json and no config.json: give a model directory (`kern pack` writes model.json), a Hugging Face checkpoint directory, or an org/name id", dir.display());
    }
    let src = std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    let config_text = std::fs::read(&config).with_context(|| format!("cannot read {}", config.display()))?;
    let stamp = format!("{}\n{:x}\n", src.display(), Sha256::digest(&config_text));
    let out = models.join(pack_name(&src));
    let stamp_file = out.join(".kern-packed-from");
    if out.join("model.json").is_file() && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        return Ok(out);
    }
    crate::pack::model_type(&config)?;
    let mut cfg = kern_packs::Config::from_file(&config)?;
    crate::pack::checkpoint_prefix(Some(&src), &mut cfg);
    let kernels = kernels()?;
    eprintln!("packing {} into {} (first use; `kern pack` does the same)", src.display(), out.display());
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut opts = kern_packs::PackOptions { kernels, ..Default::default() };
    // An FP8 checkpoint (quantization_config fp8) packs as it is, its projections in e4m3.
    kern_packs::fp8::prepare(&config, &out, None, &cfg, &mut opts)?;
    kern_packs::generate(&cfg, &opts, &out)?;
    let mut linked = 0;
    for e in std::fs::read_dir(&src).with_context(|| format!("cannot list {}", src.display()))? {
        let p = e?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else { continue };
        let take = name.ends_with(".safetensors") || matches!(name, "model.safetensors.index.json" | "tokenizer.json" | "tokenizer_config.json" | "generation_config.json" | "config.json");
        if !take {
            continue;
        }
        let link = out.join(name);
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link).with_context(|| format!("cannot replace {}", link.display()))?;
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&p, &link).with_context(|| format!("cannot link {} → {}", link.display(), p.display()))?;
        #[cfg(not(unix))]
        std::fs::copy(&p, &link).with_context(|| format!("cannot copy {} → {}", p.display(), link.display()))?;
        linked += 1;
    }
    if !out.read_dir()?.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().ends_with(".safetensors")) {
        bail!("{}: no safetensors weights next to config.json", src.display());
    }
    std::fs::write(&stamp_file, stamp).with_context(|| format!("cannot write {}", stamp_file.display()))?;
    eprintln!("packed: {} (manifest and kernels), {linked} files linked from {}", out.join("model.json").display(), src.display());
    Ok(out)
}

/// The pack's directory name: `org--name` for a Hugging Face cache snapshot
/// (`…/models--org--name/snapshots/<commit>`), else the directory's name and a hash of its path.
fn pack_name(src: &Path) -> String {
    let repo = src.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots")).and_then(Path::parent).and_then(|r| r.file_name()).and_then(|n| n.to_str());
    if let Some(id) = repo.and_then(|r| r.strip_prefix("models--")) {
        return id.to_string();
    }
    let name = src.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let h = Sha256::digest(src.to_string_lossy().as_bytes());
    format!("{name}-{:02x}{:02x}{:02x}{:02x}", h[0], h[1], h[2], h[3])
}

fn resolve_in(arg: Option<&Path>, default: &Path, cache: &Path, hub: Option<&crate::hub::Hub>) -> Result<PathBuf> {
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
    let complete = std::fs::read_to_string(repo.join("refs/main")).is_ok();
    if let (Some(hub), false) = (hub, complete) {
        // Not there, or an interrupted download (refs/main is written last): fetch it.
        return crate::hub::download(hub, &org, &name, &repo);
    }
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
pub(crate) fn hf_id(p: &Path) -> Option<(String, String)> {
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
        let e = resolve_in(None, &model, &d, None).unwrap_err().to_string();
        assert!(e.contains("bash scripts/setup.sh") && e.contains(DEFAULT_MODEL), "{e}");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("model.json"), "{}").unwrap();
        assert_eq!(resolve_in(None, &model, &d, None).unwrap(), model);
    }

    #[test]
    fn directories_and_hugging_face_ids() {
        let d = scratch("hf");
        assert_eq!(resolve_in(Some(&d), &d, &d, None).unwrap(), d);
        let cache = d.join("hub");
        let e = resolve_in(Some(Path::new("Qwen/Qwen3-0.6B")), &d, &cache, None).unwrap_err().to_string();
        assert!(e.contains("models--Qwen--Qwen3-0.6B") && e.contains("huggingface-cli download Qwen/Qwen3-0.6B"), "{e}");
        let snaps = cache.join("models--Qwen--Qwen3-0.6B/snapshots");
        std::fs::create_dir_all(snaps.join("aaaa")).unwrap();
        std::fs::create_dir_all(snaps.join("bbbb")).unwrap();
        std::fs::create_dir_all(cache.join("models--Qwen--Qwen3-0.6B/refs")).unwrap();
        std::fs::write(cache.join("models--Qwen--Qwen3-0.6B/refs/main"), "aaaa\n").unwrap();
        assert_eq!(resolve_in(Some(Path::new("Qwen/Qwen3-0.6B")), &d, &cache, None).unwrap(), snaps.join("aaaa"));
        let e = resolve_in(Some(Path::new("no/such/dir")), &d, &cache, None).unwrap_err().to_string();
        assert!(e.contains("no such directory"), "{e}");
        assert!(hf_id(Path::new("../x")).is_none() && hf_id(Path::new("./x")).is_none());
    }

    /// A stand-in for the Hub on 127.0.0.1: `files` by URL path (each answered once, then the
    /// connection closed); anything else 404; with `token`, requests without it get 401. Returns
    /// the endpoint and the paths requested.
    fn fake_hub(files: Vec<(String, Vec<u8>)>, token: Option<&'static str>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut c) = conn else { continue };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&req).to_string();
                let path = text.split_whitespace().nth(1).unwrap_or("").to_string();
                log.lock().unwrap().push(path.clone());
                let authorized = token.is_none_or(|t| text.to_ascii_lowercase().contains(&format!("authorization: bearer {t}")));
                let (status, body) = match files.iter().find(|(p, _)| *p == path) {
                    _ if !authorized => ("401 Unauthorized", b"no".to_vec()),
                    Some((_, b)) => ("200 OK", b.clone()),
                    None => ("404 Not Found", b"not found".to_vec()),
                };
                let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = c.write_all(&body);
            }
        });
        (format!("http://{addr}"), seen)
    }

    fn kernels() -> PathBuf {
        let k = std::env::var_os("KERN_PACK_KERNELS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/packs"));
        assert!(k.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/kernels/build.sh", k.display());
        k
    }

    #[test]
    fn a_hub_model_is_downloaded_into_the_cache_then_packed_once() {
        let d = scratch("download");
        let config = serde_json::to_vec_pretty(&kern_packs::config::preset("qwen3-0.6b").unwrap().to_hf_json()).unwrap();
        let api = serde_json::json!({"sha": "0123abcd", "siblings": [
            {"rfilename": "config.json"}, {"rfilename": "model.safetensors", "size": 100_000}, {"rfilename": "tokenizer.json"},
            {"rfilename": "README.md"}, {"rfilename": "pytorch_model.bin"}]});
        let files = vec![
            ("/api/models/org/tiny/revision/main?blobs=true".to_string(), serde_json::to_vec(&api).unwrap()),
            ("/org/tiny/resolve/0123abcd/config.json".to_string(), config.clone()),
            ("/org/tiny/resolve/0123abcd/model.safetensors".to_string(), vec![7u8; 100_000]),
            ("/org/tiny/resolve/0123abcd/tokenizer.json".to_string(), b"{}".to_vec()),
        ];
        let (endpoint, seen) = fake_hub(files, Some("sekrit"));
        let cache = d.join("hub");
        let hub = crate::hub::Hub { endpoint, token: Some("sekrit".into()), offline: false };
        let snap = resolve_in(Some(Path::new("org/tiny")), &d, &cache, Some(&hub)).unwrap();
        assert_eq!(snap, cache.join("models--org--tiny/snapshots/0123abcd"));
        assert_eq!(std::fs::read(snap.join("config.json")).unwrap(), config);
        assert_eq!(std::fs::read(snap.join("model.safetensors")).unwrap().len(), 100_000);
        assert_eq!(std::fs::read_to_string(cache.join("models--org--tiny/refs/main")).unwrap(), "0123abcd");
        let requested = seen.lock().unwrap().clone();
        assert_eq!(requested.len(), 4, "the file list and the three files kern needs: {requested:?}");
        assert!(!requested.iter().any(|p| p.ends_with("README.md") || p.ends_with(".bin")));
        // Now cached: no request at all.
        assert_eq!(resolve_in(Some(Path::new("org/tiny")), &d, &cache, Some(&hub)).unwrap(), snap);
        assert_eq!(seen.lock().unwrap().len(), 4);
        // Packed on first use, into models/org--tiny, with the weights linked; reused after.
        let models = d.join("models");
        let k = kernels();
        let out = packed(&snap, &models, &|| Ok(k.clone())).unwrap();
        assert_eq!(out, models.join("org--tiny"));
        assert!(out.join("model.json").is_file() && out.join("rowwise.pdl.sm_90a.cubin").is_file());
        assert!(std::fs::symlink_metadata(out.join("model.safetensors")).unwrap().file_type().is_symlink());
        assert!(out.join("tokenizer.json").exists());
        let t0 = std::fs::metadata(out.join("model.json")).unwrap().modified().unwrap();
        let again = packed(&snap, &models, &|| panic!("a pack that is up to date is not made again")).unwrap();
        assert_eq!(again, out);
        assert_eq!(std::fs::metadata(out.join("model.json")).unwrap().modified().unwrap(), t0);
        // A directory with model.json is used as it is.
        assert_eq!(packed(&out, &models, &|| panic!("not packed")).unwrap(), out);
    }

    #[test]
    fn download_failures_say_what_to_do() {
        let d = scratch("download-fail");
        let cache = d.join("hub");
        let id = Path::new("org/gone");
        let offline = crate::hub::Hub { endpoint: "http://127.0.0.1:1".into(), token: None, offline: true };
        let e = format!("{:#}", resolve_in(Some(id), &d, &cache, Some(&offline)).unwrap_err());
        assert!(e.contains("HF_HUB_OFFLINE") && e.contains("hf download org/gone"), "{e}");
        // Nothing listens on port 1: no network.
        let unreachable = crate::hub::Hub { offline: false, ..offline };
        let e = format!("{:#}", resolve_in(Some(id), &d, &cache, Some(&unreachable)).unwrap_err());
        assert!(e.contains("cannot be reached") && e.contains("hf download org/gone"), "{e}");
        let (endpoint, _) = fake_hub(vec![], None);
        let e = format!("{:#}", resolve_in(Some(id), &d, &cache, Some(&crate::hub::Hub { endpoint, token: None, offline: false })).unwrap_err());
        assert!(e.contains("no such model on the Hub"), "{e}");
        let (endpoint, _) = fake_hub(vec![("/api/models/org/gone/revision/main?blobs=true".into(), b"{}".to_vec())], Some("t"));
        let e = format!("{:#}", resolve_in(Some(id), &d, &cache, Some(&crate::hub::Hub { endpoint, token: None, offline: false })).unwrap_err());
        assert!(e.contains("gated or private") && e.contains("HF_TOKEN"), "{e}");
        // A repository without safetensors weights is refused by name.
        let api = serde_json::json!({"sha": "ff", "siblings": [{"rfilename": "config.json"}, {"rfilename": "pytorch_model.bin"}]});
        let (endpoint, _) = fake_hub(vec![("/api/models/org/gone/revision/main?blobs=true".into(), serde_json::to_vec(&api).unwrap())], None);
        let e = format!("{:#}", resolve_in(Some(id), &d, &cache, Some(&crate::hub::Hub { endpoint, token: None, offline: false })).unwrap_err());
        assert!(e.contains("safetensors"), "{e}");
        // A checkpoint directory that is not one.
        let e = packed(&d, &d.join("models"), &|| panic!("nothing to pack")).unwrap_err().to_string();
        assert!(e.contains("no model.json and no config.json"), "{e}");
    }
}
