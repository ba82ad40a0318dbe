//! The per-sequence state example (`examples/perseq`): `kern check` accepts it, and refuses a
//! manifest with a per-sequence state whose step binds no `seq_slots`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn check(path: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["check", path.to_str().unwrap()]).current_dir(root()).output().unwrap();
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn a_per_sequence_state_needs_seq_slots() {
    let dir = root().join("examples/perseq");
    let (code, out) = check(&dir.join("model.json"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("sum        4 B per seq"), "{out}");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
    m["step"]["buffers"].as_object_mut().unwrap().remove("seq_slots");
    let tmp = std::env::temp_dir().join(format!("kern-perseq-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(dir.join("perseq.sm_90.cubin"), tmp.join("perseq.sm_90.cubin")).unwrap();
    std::fs::write(tmp.join("model.json"), m.to_string()).unwrap();
    let (code, out) = check(&tmp.join("model.json"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("state `sum` is per sequence") && out.contains("seq_slots"), "{out}");
}

/// `kern plan` shows the snapshot pool of a per-sequence state that declares `snapshot` (and
/// none without it), inside the total.
#[test]
fn kern_plan_lists_the_snapshot_pool() {
    let dir = root().join("examples/perseq");
    let plan = |path: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["plan", path.to_str().unwrap(), "--gpu-mem", "1GiB", "--reserve", "0"]).current_dir(root()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(!plan(&dir.join("model.json")).contains("snapshots"));
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
    m["states"]["sum"]["snapshot"] = serde_json::Value::Bool(true);
    let tmp = std::env::temp_dir().join(format!("kern-perseq-plan-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(dir.join("perseq.sm_90.cubin"), tmp.join("perseq.sm_90.cubin")).unwrap();
    std::fs::write(tmp.join("model.json"), m.to_string()).unwrap();
    let out = plan(&tmp.join("model.json"));
    let line = out.lines().find(|l| l.trim_start().starts_with("snapshots")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("4 B per slot") && line.contains("slots"), "{line}");
    let _ = std::fs::remove_dir_all(&tmp);
}
