//! NCCL loading without a GPU: a stand-in `libnccl.so.2` (tests/data/fake_nccl.c, compiled
//! here with `cc`) is found under NCCL's soname — the only name the pip wheels ship — its
//! version is checked, an old or incomplete library is a typed error, and NCCL's own status
//! codes become errors with NCCL's message. NCCL is loaded once per process, so each case runs
//! in a child process of this test binary with LD_LIBRARY_PATH pointing at its library.

use std::path::{Path, PathBuf};
use std::process::Command;

fn build(dir: &Path, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fake_nccl.c");
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join("libnccl.so.2");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(flags)
        .status()
        .expect("cc runs (a C compiler is needed to build the stand-in libnccl)");
    assert!(st.success(), "cc failed");
    dir.to_path_buf()
}

/// Runs child test `name` of this binary with the library in `dir` first on the search path.
fn child(name: &str, dir: &Path) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--nocapture", "--test-threads", "1"])
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{name}:\n{text}");
}

#[test]
fn a_stand_in_libnccl_so_2_is_found_checked_and_its_errors_are_typed() {
    let tmp = tempfile_dir();
    child("good_library", &build(&tmp.join("good"), &[]));
    child("old_library", &build(&tmp.join("old"), &["-DVERSION=21703"]));
    child("incomplete_library", &build(&tmp.join("incomplete"), &["-DNO_ALLGATHER"]));
    child("failing_library", &build(&tmp.join("failing"), &["-DFAIL_ID"]));
    std::fs::remove_dir_all(&tmp).ok();
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("kern-fake-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
#[ignore = "run by a_stand_in_libnccl_so_2_is_found_checked_and_its_errors_are_typed"]
fn good_library() {
    use kern_cuda::nccl::{group, nccl, UniqueId};
    let info = nccl().expect("the stand-in loads");
    assert_eq!((info.version, info.library.as_str(), info.version_string()), (22703, "libnccl.so.2", "2.27.3".to_string()));
    let id = UniqueId::new().unwrap();
    assert_eq!(id.0[5], 15, "the id NCCL made comes through byte for byte");
    assert_eq!(group(|| Ok(7)).unwrap(), 7);
    // An error inside a group still ends the group (the stand-in would refuse the next one).
    let e = group(|| Err::<(), _>(kern_cuda::CudaError::InvalidArgument("inner".into()))).unwrap_err();
    assert!(e.to_string().contains("inner"), "{e}");
    assert!(group(|| Ok(())).is_ok());
}

#[test]
#[ignore = "run by a_stand_in_libnccl_so_2_is_found_checked_and_its_errors_are_typed"]
fn failing_library() {
    // NCCL's status and its own message.
    let e = kern_cuda::nccl::UniqueId::new().unwrap_err();
    assert!(matches!(e, kern_cuda::CudaError::Nccl { call: "ncclGetUniqueId", code: 3, .. }), "{e:?}");
    assert_eq!(e.to_string(), "NCCL call ncclGetUniqueId failed with ncclInternalError (code 3): fake: internal error");
}

#[test]
#[ignore = "run by a_stand_in_libnccl_so_2_is_found_checked_and_its_errors_are_typed"]
fn old_library() {
    match kern_cuda::nccl::nccl() {
        Err(e @ kern_cuda::CudaError::NcclTooOld { version: 21703, .. }) => {
            assert!(e.to_string().contains("version 2.17.3") && e.to_string().contains("NCCL 2.18 or newer"), "{e}");
        }
        other => panic!("expected NcclTooOld, got {other:?}"),
    }
}

#[test]
#[ignore = "run by a_stand_in_libnccl_so_2_is_found_checked_and_its_errors_are_typed"]
fn incomplete_library() {
    match kern_cuda::nccl::nccl() {
        Err(e @ kern_cuda::CudaError::NcclTooOld { call: "ncclAllGather", .. }) => {
            assert!(e.to_string().contains("does not provide ncclAllGather"), "{e}");
        }
        other => panic!("expected NcclTooOld for ncclAllGather, got {other:?}"),
    }
}
