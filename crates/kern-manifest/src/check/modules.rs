//! Modules: find the file, hash it, parse it with kern-binary, pick the image for the arch.

use super::Checker;
use crate::diag::JsonPath;
use crate::manifest::{Module, ModuleSource};
use crate::raw::RawModule;
use crate::source::{self, Spec};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Reads at most `cap` bytes; a larger file is an error (never a huge allocation).
pub(crate) fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > cap {
        return Err(format!(
            "{} is larger than {cap} bytes, kern's limit for this file",
            path.display()
        ));
    }
    Ok(bytes)
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Checker<'_> {
    pub(super) fn modules(&mut self) {
        let path = self.section("modules");
        for (i, (name, m)) in self.raw.modules.iter().enumerate() {
            let p = path.entry(name, i);
            self.names.modules.insert(name.clone(), i);
            let loaded = self.module(name, m, &p);
            self.modules.push(loaded);
            self.modules_used.push(false);
        }
    }

    fn module(&mut self, name: &str, m: &RawModule, p: &JsonPath) -> Option<Module> {
        let sp = p.field("source");
        let sha_ok = is_sha256(&m.sha256);
        if !sha_ok {
            let why = if m.sha256.len() == 64 && m.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                "write it in lowercase".to_string()
            } else {
                format!("it has {} characters", m.sha256.chars().count())
            };
            self.sink.error(
                &p.field("sha256"),
                format!("a sha256 is 64 lowercase hex digits: {why}"),
            );
        }
        let spec = source::parse(&m.source)
            .map_err(|e| self.sink.error(&sp, e))
            .ok()?;
        let (src, candidates) = match spec {
            Spec::Local(rel) => {
                let file = source::resolve_local(self.dir, &rel)
                    .map_err(|e| self.sink.error(&sp, e))
                    .ok()?;
                (ModuleSource::Local(rel), vec![file])
            }
            Spec::Hf { org, repo, path } => {
                let cache = self
                    .opts
                    .hf_cache
                    .clone()
                    .or_else(|| source::hf_cache_dir(|k| std::env::var(k).ok()));
                let Some(cache) = cache else {
                    self.sink.error(&sp, "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (HOME is not set either)");
                    return None;
                };
                let found = source::resolve_hf(&cache, &org, &repo, &path)
                    .map_err(|e| self.sink.error(&sp, e))
                    .ok()?;
                (
                    ModuleSource::HuggingFace {
                        repo: format!("{org}/{repo}"),
                        path,
                    },
                    found,
                )
            }
        };
        // Several cached snapshots may hold the file: the first whose hash matches wins, else
        // the preferred one (refs/main) is reported.
        let mut chosen: Option<(PathBuf, Vec<u8>, String)> = None;
        for file in &candidates {
            let bytes = read_capped(file, self.opts.max_module_bytes)
                .map_err(|e| self.sink.error(&sp, e))
                .ok()?;
            let hash = sha256_hex(&bytes);
            let matches = hash == m.sha256;
            if chosen.is_none() || matches {
                chosen = Some((file.clone(), bytes, hash));
            }
            if matches {
                break;
            }
        }
        let (file, bytes, hash) = chosen?;
        if sha_ok && hash != m.sha256 {
            self.sink.error(
                &p.field("sha256"),
                format!(
                    "{} has sha256 {hash}, the manifest says {}: update the manifest's sha256 or rebuild the module",
                    file.display(),
                    m.sha256
                ),
            );
        } else if !sha_ok {
            self.sink
                .error(&p.field("sha256"), format!("the file's sha256 is {hash}"));
        }
        let display = file.display().to_string();
        let binary = kern_binary::read(&bytes, &display)
            .map_err(|e| self.sink.error(&sp, e.to_string()))
            .ok()?;
        let Some((image, _)) = binary.select(self.opts.arch) else {
            let have: Vec<String> = binary
                .images
                .iter()
                .map(|im| {
                    format!(
                        "{:?} {}",
                        im.kind,
                        im.arch.map_or("(no arch)".into(), |a| a.to_string())
                    )
                    .to_lowercase()
                })
                .collect();
            self.sink.error(
                &sp,
                format!(
                    "module `{name}` has no image kern can load on {} (it holds: {}): rebuild it for {}, or check for the arch it was built for",
                    self.opts.arch,
                    if have.is_empty() { "nothing".into() } else { have.join(", ") },
                    self.opts.arch
                ),
            );
            return None;
        };
        Some(Module {
            name: name.to_string(),
            source: src,
            path: file,
            sha256: hash,
            file_bytes: bytes.len() as u64,
            binary,
            image,
        })
    }
}
