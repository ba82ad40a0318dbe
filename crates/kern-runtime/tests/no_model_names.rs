//! The invariant "the engine contains no model-specific code", enforced: no engine crate's
//! source names a model family. Models live in manifests and in packs (`packs/`); only the CLI,
//! which dispatches `kern pack` to a pack by `model_type`, may name them.

use std::path::{Path, PathBuf};

const FAMILIES: &[&str] = &["qwen", "llama", "mistral", "mixtral", "gemma", "deepseek", "phi3", "phi-3", "falcon", "gpt2", "gpt-2", "baichuan", "internlm", "chatglm"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn engine_crates_name_no_model_family() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut found = Vec::new();
    for c in std::fs::read_dir(&crates).unwrap().flatten() {
        let name = c.file_name().to_string_lossy().into_owned();
        // The CLI dispatches to packs by model_type; every other crate is engine.
        if name == "kern" || !c.path().join("src").is_dir() {
            continue;
        }
        let mut files = Vec::new();
        sources(&c.path().join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap().to_lowercase();
            checked += 1;
            for fam in FAMILIES {
                if let Some(pos) = text.find(fam) {
                    let line = text[..pos].lines().count();
                    found.push(format!("{}:{line}: names `{fam}`", f.display()));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} source files found: is the crates/ layout different?");
    assert!(found.is_empty(), "engine crates must not name model families:\n{}", found.join("\n"));
}
