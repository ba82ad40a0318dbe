//! Downloading a model from the Hugging Face Hub into the local Hugging Face cache, for
//! `--model org/name` when the cache does not have it yet.
//!
//! The files a model directory needs — `config.json`, the safetensors weights (one file, or the
//! shards and their `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json` — are fetched from `$HF_ENDPOINT` (default `https://huggingface.co`)
//! at the revision `main` names, with `$HF_TOKEN` for gated or private models, and written to
//! `<cache>/models--org--name/snapshots/<commit>/` with `refs/main` naming the commit, so the
//! Hugging Face tools find them there too. A progress bar counts the bytes. `HF_HUB_OFFLINE=1`
//! forbids the download; no network gives a message that says what to do instead.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where the Hub is and how to talk to it.
#[derive(Clone, Debug)]
pub struct Hub {
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
}

impl Hub {
    /// From the environment: `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE` (as `huggingface_hub`).
    pub fn from_env() -> Hub {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Hub {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()).trim_end_matches('/').to_string(),
            token: var("HF_TOKEN"),
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false")),
        }
    }
}

/// Whether kern fetches `file` of a model repository.
fn wanted(file: &str) -> bool {
    matches!(file, "config.json" | "generation_config.json" | "tokenizer.json" | "tokenizer_config.json" | "model.safetensors.index.json")
        || (file.ends_with(".safetensors") && !file.contains('/'))
}

/// Downloads `org/name` into the cache at `repo` (`<cache>/models--org--name`); returns the
/// snapshot directory. Runs on its own thread, so it works inside an async runtime too.
pub fn download(hub: &Hub, org: &str, name: &str, repo: &Path) -> Result<PathBuf> {
    if hub.offline {
        bail!("--model {org}/{name}: not in the local Hugging Face cache ({} does not exist), and HF_HUB_OFFLINE forbids downloading it: unset HF_HUB_OFFLINE, or download it where a network is available (`hf download {org}/{name}`) and copy the cache", repo.display());
    }
    let (hub, org, name, repo) = (hub.clone(), org.to_string(), name.to_string(), repo.to_path_buf());
    std::thread::spawn(move || download_blocking(&hub, &org, &name, &repo)).join().map_err(|_| anyhow!("the download thread panicked"))?
}

fn download_blocking(hub: &Hub, org: &str, name: &str, repo: &Path) -> Result<PathBuf> {
    let mut builder = reqwest::blocking::Client::builder()
        .user_agent(concat!("kern/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(None);
    // A mirror on this machine is reached directly, whatever proxy the environment names.
    let host = hub.endpoint.split("://").nth(1).unwrap_or("").split(['/', ':']).next().unwrap_or("");
    if matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
        builder = builder.no_proxy();
    }
    let client = builder.build()?;
    let get = |url: &str| {
        let mut r = client.get(url);
        if let Some(t) = &hub.token {
            r = r.bearer_auth(t);
        }
        r.send().map_err(|e| {
            anyhow!(
                "--model {org}/{name}: not in the local Hugging Face cache, and {} cannot be reached ({e}): without a network, download it elsewhere (`hf download {org}/{name}`) and copy the cache ({}), or give a model directory",
                hub.endpoint,
                repo.parent().map_or_else(String::new, |p| p.display().to_string())
            )
        })
    };
    let status_error = |what: &str, s: reqwest::StatusCode| -> anyhow::Error {
        match s.as_u16() {
            401 | 403 => anyhow!("--model {org}/{name}: the Hub refused {what} ({s}): the model is gated or private — accept its license on the Hub and set HF_TOKEN"),
            404 => anyhow!("--model {org}/{name}: no such model on the Hub ({what}: {s}); check the id"),
            _ => anyhow!("--model {org}/{name}: the Hub answered {s} for {what}"),
        }
    };
    // `blobs=true` adds each file's size, for one progress bar over the whole download.
    let info_url = format!("{}/api/models/{org}/{name}/revision/main?blobs=true", hub.endpoint);
    let r = get(&info_url)?;
    if !r.status().is_success() {
        return Err(status_error("the model's file list", r.status()));
    }
    let body = r.bytes().with_context(|| format!("{info_url}: reading the answer"))?;
    let info: serde_json::Value = serde_json::from_slice(&body).with_context(|| format!("{info_url}: not the Hub's JSON"))?;
    let sha = info["sha"].as_str().filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric())).ok_or_else(|| anyhow!("{info_url}: no commit `sha`"))?.to_string();
    let files: Vec<(String, Option<u64>)> = info["siblings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["rfilename"].as_str().filter(|f| wanted(f)).map(|f| (f.to_string(), s["size"].as_u64())))
        .collect();
    if !files.iter().any(|(f, _)| f == "config.json") || !files.iter().any(|(f, _)| f.ends_with(".safetensors")) {
        let names: Vec<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
        bail!("--model {org}/{name}: the repository has no config.json and safetensors weights (files: {}): kern loads Hugging Face checkpoints in safetensors, or a GGUF file through `kern pack --gguf`", names.join(", "));
    }
    let snapshot = repo.join("snapshots").join(&sha);
    std::fs::create_dir_all(&snapshot).with_context(|| format!("cannot create {}", snapshot.display()))?;
    // Files an earlier, interrupted download finished are kept.
    let todo: Vec<&(String, Option<u64>)> = files.iter().filter(|(f, _)| !snapshot.join(f).is_file()).collect();
    let bar = indicatif::ProgressBar::new(todo.iter().filter_map(|(_, n)| *n).sum());
    bar.set_style(indicatif::ProgressStyle::with_template("downloading {msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.set_message(format!("{org}/{name}"));
    let mut total = 0u64;
    // One file at a time: a request is made only when its file is read.
    for (f, size) in todo {
        let url = format!("{}/{org}/{name}/resolve/{sha}/{f}", hub.endpoint);
        let mut r = get(&url)?;
        if !r.status().is_success() {
            return Err(status_error(f, r.status()));
        }
        if size.is_none() {
            bar.inc_length(r.content_length().unwrap_or(0));
        }
        let dst = snapshot.join(f);
        let part = dst.with_extension("kern-part");
        let mut out = std::fs::File::create(&part).with_context(|| format!("cannot write {}", part.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = r.read(&mut buf).with_context(|| format!("downloading {f}: the connection broke: run the command again to resume"))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).with_context(|| format!("cannot write {}", part.display()))?;
            bar.inc(n as u64);
            total += n as u64;
        }
        out.sync_all().ok();
        std::fs::rename(&part, &dst).with_context(|| format!("cannot move {} into place", part.display()))?;
    }
    bar.finish_and_clear();
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::write(repo.join("refs/main"), &sha).with_context(|| format!("cannot write {}", repo.join("refs/main").display()))?;
    eprintln!("downloaded {org}/{name} ({} files, {:.2} GB) into {}", files.len(), total as f64 / 1e9, snapshot.display());
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::wanted;

    #[test]
    fn only_what_a_model_directory_needs() {
        for f in ["config.json", "model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            assert!(wanted(f), "{f}");
        }
        for f in ["pytorch_model.bin", "README.md", "onnx/model.onnx", "sub/model.safetensors", ".gitattributes", "merges.txt"] {
            assert!(!wanted(f), "{f}");
        }
    }
}
