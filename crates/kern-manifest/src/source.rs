//! Where a module's file is: a path relative to the manifest (never leaving its directory), or
//! `hf:ORG/REPO/PATH` in the local Hugging Face cache.
//!
//! A manifest may come from anywhere (a downloaded model repo), so a relative path is resolved
//! lexically first (no absolute paths, no `..` above the manifest's directory) and then for
//! real (a symlink that leads outside the directory is refused as well). kern never downloads:
//! a Hugging Face source must already be in the cache, and the error says where it was looked
//! for and how to fetch it.

use std::path::{Component, Path, PathBuf};

/// A module source as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Spec {
    Local(String),
    Hf {
        org: String,
        repo: String,
        path: String,
    },
}

pub(crate) fn parse(source: &str) -> Result<Spec, String> {
    if let Some(rest) = source.strip_prefix("hf:") {
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() < 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "`{source}` is not a Hugging Face source: write hf:ORG/REPO/PATH/IN/REPO"
            ));
        }
        if parts[2..].iter().any(|p| *p == ".." || *p == ".") {
            return Err(format!(
                "`{source}`: the path inside the repo may not contain `.` or `..`"
            ));
        }
        return Ok(Spec::Hf {
            org: parts[0].into(),
            repo: parts[1].into(),
            path: parts[2..].join("/"),
        });
    }
    if source.is_empty() {
        return Err(
            "the source is empty: write a path relative to the manifest, or hf:ORG/REPO/PATH"
                .into(),
        );
    }
    let p = Path::new(source);
    // `C:\x` is absolute on Windows, wherever the manifest was written.
    let drive = source.len() >= 2
        && source.as_bytes()[0].is_ascii_alphabetic()
        && source.as_bytes()[1] == b':';
    if p.is_absolute() || p.has_root() || source.starts_with('\\') || drive {
        return Err(format!(
            "`{source}` is absolute: write a path relative to the manifest's directory"
        ));
    }
    let mut depth: i64 = 0;
    for c in p.components() {
        match c {
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!(
                        "`{source}` leaves the manifest's directory: a module must be inside it (copy the file next to the manifest)"
                    ));
                }
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "`{source}` is absolute: write a path relative to the manifest's directory"
                ));
            }
        }
    }
    Ok(Spec::Local(source.to_string()))
}

/// The file a local source names, after checking it exists and really is inside `dir`.
pub(crate) fn resolve_local(dir: &Path, source: &str) -> Result<PathBuf, String> {
    let path = dir.join(source);
    if !path.exists() {
        return Err(format!(
            "`{source}` does not exist: expected the module at {}",
            path.display()
        ));
    }
    let real_dir = dir.canonicalize().map_err(|e| {
        format!(
            "cannot resolve the manifest's directory {}: {e}",
            dir.display()
        )
    })?;
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", path.display()))?;
    if !real.starts_with(&real_dir) {
        return Err(format!(
            "`{source}` resolves (through a symlink) to {}, outside the manifest's directory {}: copy the file into the directory",
            real.display(),
            real_dir.display()
        ));
    }
    if !real.is_file() {
        return Err(format!("`{source}` is not a file ({})", real.display()));
    }
    Ok(path)
}

/// The Hugging Face hub cache directory: `$HF_HUB_CACHE`, else `$HUGGINGFACE_HUB_CACHE`, else
/// `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn hf_cache_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(d) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return Some(PathBuf::from(d));
    }
    if let Some(h) = set("HF_HOME") {
        return Some(PathBuf::from(h).join("hub"));
    }
    if let Some(x) = set("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("huggingface").join("hub"));
    }
    set("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// The cached copies of `org/repo/path`, best first: the snapshot `refs/main` names, then the
/// other snapshots in name order. Errors name the exact path(s) looked for.
pub(crate) fn resolve_hf(
    cache: &Path,
    org: &str,
    repo: &str,
    path: &str,
) -> Result<Vec<PathBuf>, String> {
    let repo_dir = cache.join(format!("models--{org}--{repo}"));
    let snapshots = repo_dir.join("snapshots");
    let main = std::fs::read_to_string(repo_dir.join("refs").join("main"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let mut revisions: Vec<String> = match std::fs::read_dir(&snapshots) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    revisions.sort();
    if let Some(m) = &main {
        if let Some(i) = revisions.iter().position(|r| r == m) {
            let m = revisions.remove(i);
            revisions.insert(0, m);
        }
    }
    let real_repo = repo_dir.canonicalize().ok();
    let found: Vec<PathBuf> = revisions
        .iter()
        .map(|r| snapshots.join(r).join(path))
        .filter(|p| p.is_file())
        // Snapshot files are symlinks into the repo's blobs/; anything leading elsewhere is not
        // the cache's.
        .filter(|p| match (&real_repo, p.canonicalize()) {
            (Some(repo), Ok(real)) => real.starts_with(repo),
            _ => false,
        })
        .collect();
    if !found.is_empty() {
        return Ok(found);
    }
    let expected = match &main {
        Some(m) => snapshots.join(m).join(path).display().to_string(),
        None => snapshots
            .join("<revision>")
            .join(path)
            .display()
            .to_string(),
    };
    Err(format!(
        "hf:{org}/{repo}/{path} is not in the local Hugging Face cache: expected {expected}; fetch it with `huggingface-cli download {org}/{repo} {path}` (kern never downloads) or set HF_HUB_CACHE"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn relative_paths_stay_inside() {
        assert_eq!(parse("a.cubin"), Ok(Spec::Local("a.cubin".into())));
        assert_eq!(
            parse("kernels/../a.cubin"),
            Ok(Spec::Local("kernels/../a.cubin".into()))
        );
        assert_eq!(parse("./k/a.cubin"), Ok(Spec::Local("./k/a.cubin".into())));
        assert!(parse("../x.cubin")
            .unwrap_err()
            .contains("leaves the manifest's directory"));
        assert!(parse("k/../../x.cubin")
            .unwrap_err()
            .contains("leaves the manifest's directory"));
        assert!(parse("/etc/passwd").unwrap_err().contains("is absolute"));
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("hf:org/repo")
            .unwrap_err()
            .contains("hf:ORG/REPO/PATH"));
        assert!(parse("hf:org/repo/../x").unwrap_err().contains("`..`"));
        assert_eq!(
            parse("hf:kernels-community/activation/build/a.so"),
            Ok(Spec::Hf {
                org: "kernels-community".into(),
                repo: "activation".into(),
                path: "build/a.so".into()
            })
        );
    }

    #[test]
    fn symlinks_out_of_the_directory_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("model");
        fs::create_dir(&dir).unwrap();
        fs::write(t.path().join("outside.cubin"), b"x").unwrap();
        fs::write(dir.join("inside.cubin"), b"x").unwrap();
        std::os::unix::fs::symlink(t.path().join("outside.cubin"), dir.join("link.cubin")).unwrap();
        std::os::unix::fs::symlink(dir.join("inside.cubin"), dir.join("ok.cubin")).unwrap();
        assert!(resolve_local(&dir, "inside.cubin").is_ok());
        assert!(resolve_local(&dir, "ok.cubin").is_ok());
        let e = resolve_local(&dir, "link.cubin").unwrap_err();
        assert!(e.contains("outside the manifest's directory"), "{e}");
        let e = resolve_local(&dir, "missing.cubin").unwrap_err();
        assert!(
            e.contains(&format!(
                "expected the module at {}",
                dir.join("missing.cubin").display()
            )),
            "{e}"
        );
    }

    #[test]
    fn hf_cache_dir_from_env() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            hf_cache_dir(env(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h")])),
            Some("/c".into())
        );
        assert_eq!(
            hf_cache_dir(env(&[("HF_HOME", "/h"), ("HOME", "/home/u")])),
            Some("/h/hub".into())
        );
        assert_eq!(
            hf_cache_dir(env(&[("HOME", "/home/u")])),
            Some("/home/u/.cache/huggingface/hub".into())
        );
        assert_eq!(
            hf_cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/home/u")])),
            Some("/x/huggingface/hub".into())
        );
        assert_eq!(hf_cache_dir(env(&[])), None);
    }

    /// Lays out a cache like huggingface_hub does: blobs, snapshot symlinks, refs/main.
    fn fake_repo(cache: &Path, revs: &[&str], main: Option<&str>, file: &str) {
        let repo = cache.join("models--org--kern");
        fs::create_dir_all(repo.join("blobs")).unwrap();
        for r in revs {
            let blob = repo.join("blobs").join(format!("blob-{r}"));
            fs::write(&blob, r.as_bytes()).unwrap();
            let snap = repo.join("snapshots").join(r).join(file);
            fs::create_dir_all(snap.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&blob, &snap).unwrap();
        }
        if let Some(m) = main {
            fs::create_dir_all(repo.join("refs")).unwrap();
            fs::write(repo.join("refs").join("main"), format!("{m}\n")).unwrap();
        }
    }

    #[test]
    fn hf_found_in_the_cache() {
        let t = tempfile::tempdir().unwrap();
        fake_repo(t.path(), &["aaa", "bbb"], Some("bbb"), "build/k.cubin");
        let found = resolve_hf(t.path(), "org", "kern", "build/k.cubin").unwrap();
        assert_eq!(
            found[0],
            t.path()
                .join("models--org--kern/snapshots/bbb/build/k.cubin")
        );
        assert_eq!(found.len(), 2);
        assert_eq!(fs::read(&found[0]).unwrap(), b"bbb");
    }

    #[test]
    fn hf_missing_names_the_expected_path() {
        let t = tempfile::tempdir().unwrap();
        let e = resolve_hf(t.path(), "org", "kern", "k.cubin").unwrap_err();
        let want = t
            .path()
            .join("models--org--kern/snapshots/<revision>/k.cubin");
        assert!(e.contains(&format!("expected {}", want.display())), "{e}");
        assert!(
            e.contains("huggingface-cli download org/kern k.cubin"),
            "{e}"
        );
        fake_repo(t.path(), &["abc"], Some("abc"), "other.cubin");
        let e = resolve_hf(t.path(), "org", "kern", "k.cubin").unwrap_err();
        let want = t.path().join("models--org--kern/snapshots/abc/k.cubin");
        assert!(e.contains(&format!("expected {}", want.display())), "{e}");
    }
}
