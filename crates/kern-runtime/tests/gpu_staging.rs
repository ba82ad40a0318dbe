//! Issue 15 on a GPU: a step's inputs through `Runtime::upload` (pinned staging, async copies on
//! the runtime's stream), the run through `enqueue_run` (no host wait) and the result through
//! `read_into` (one synchronize) give exactly what `write_buffer` + `run` + `read_buffer` give.
//! Without a CUDA driver every test here returns at once (CI has none); the GPU suite runs them.
//! The tensor-parallel one needs two GPUs and NCCL, and returns without them.

use kern_cuda::{as_bytes, Context};
use kern_manifest::manifest::BufferId;
use kern_runtime::plan::{plan, PlanOptions};
use kern_runtime::{Mode, Runtime, RuntimeError};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The GPU, or `None` (with a note) where there is no driver.
fn gpu(test: &str) -> Option<Context> {
    if !kern_cuda::driver_available() {
        eprintln!("{test}: skipped (no CUDA driver)");
        return None;
    }
    Some(Context::new(0).expect("a driver is present: device 0 opens"))
}

fn load(ctx: &Context, manifest: &Path) -> (kern_manifest::Manifest, kern_runtime::MemoryPlan) {
    let (major, minor) = ctx.device_arch();
    let opts = kern_manifest::CheckOptions { arch: kern_binary::Arch::new(major * 10 + minor), ..Default::default() };
    let m = kern_manifest::load(manifest, &opts).unwrap_or_else(|d| panic!("{}: {d}", manifest.display()));
    let p = plan(&m, &PlanOptions::default()).unwrap();
    (m, p)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn read_f32(rt: &Runtime, b: BufferId, n: usize) -> Vec<f32> {
    let mut out = vec![0u8; n * 4];
    rt.read_into(b, &mut out).unwrap();
    f32s(&out)
}

#[test]
fn upload_enqueue_run_read_into_match_the_blocking_path() {
    let Some(ctx) = gpu("upload_enqueue_run_read_into_match_the_blocking_path") else { return };
    let (m, p) = load(&ctx, &root().join("examples/vecadd/model.json"));
    let mut rt = Runtime::new(&ctx, m, p).unwrap();
    let [a, b, c] = ["A", "B", "C"].map(|n| rt.manifest.buffer(n).expect("vecadd declares A, B, C"));
    let max = rt.manifest.vars_at_max();
    assert_eq!(rt.last_gpu_ms().unwrap(), None, "no run yet");

    // The blocking path, as `kern run` does it.
    let (x, y) = ([1.0f32, 2.0, 3.0, 4.0], [10.0f32, 20.0, 30.0, 40.0]);
    rt.write_buffer(a, as_bytes(&x)).unwrap();
    rt.write_buffer(b, as_bytes(&y)).unwrap();
    let stats = rt.run(0, &max, Mode::Eager { sync_each: false }).unwrap();
    assert!(stats.gpu_ms >= 0.0);
    let blocking = f32s(&rt.read_buffer(c, 16).unwrap());
    assert_eq!(blocking, [11.0, 22.0, 33.0, 44.0]);
    rt.write_buffer(c, &[0; 16]).unwrap();

    // The step path: upload, queue the run, read (the one wait).
    rt.upload(&[(a, as_bytes(&x)), (b, as_bytes(&y))]).unwrap();
    let stats = rt.enqueue_run(0, &max, Mode::Eager { sync_each: false }).unwrap();
    assert_eq!(stats.gpu_ms, 0.0, "not measured until the run is waited for");
    assert_eq!(read_f32(&rt, c, 4), blocking);
    let ms = rt.last_gpu_ms().unwrap().expect("a run was queued");
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");

    // Many steps in a row through one staging buffer, graph replay included (n = 3 runs in the
    // bucket of 4, with padded rows zeroed): every step sees its own inputs.
    for step in 0..200 {
        let n = 1 + step % 4;
        let xs: Vec<f32> = (0..n).map(|i| (step * 10 + i) as f32).collect();
        let ys: Vec<f32> = (0..n).map(|i| 0.5 * i as f32 - step as f32).collect();
        let mode = if step % 3 == 0 { Mode::Eager { sync_each: false } } else { Mode::Graph };
        rt.upload(&[(a, as_bytes(&xs)), (b, as_bytes(&ys))]).unwrap();
        rt.enqueue_run(0, &[n as i64], mode).unwrap();
        let got = read_f32(&rt, c, n);
        let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x + y).collect();
        assert_eq!(got, want, "step {step} ({mode:?}, n = {n})");
    }

    // Upload lands without a run; a buffer written twice gets the later bytes; an empty write
    // copies nothing.
    rt.upload(&[(a, as_bytes(&[7.0f32; 4])), (a, as_bytes(&[8.0f32, 9.0])), (b, &[])]).unwrap();
    assert_eq!(read_f32(&rt, a, 4), [8.0, 9.0, 7.0, 7.0]);

    // A write that does not fit is refused before anything is copied.
    let e = rt.upload(&[(b, as_bytes(&[1.0f32; 4])), (a, &[0u8; 17])]).unwrap_err();
    assert!(matches!(e, RuntimeError::Data(_)), "{e:?}");
    assert_eq!(e.to_string(), "buffers.A: 17 bytes do not fit its 16 bytes");
    assert_ne!(read_f32(&rt, b, 4), [1.0; 4], "B was not written");
    let e = rt.read_into(c, &mut [0u8; 20]).unwrap_err();
    assert_eq!(e.to_string(), "buffers.C: cannot read 20 bytes from its 16 bytes");

    // The blocking calls still work between async ones, and agree with them.
    rt.write_buffer(a, as_bytes(&x)).unwrap();
    assert_eq!(read_f32(&rt, a, 4), x);
    rt.upload(&[(b, as_bytes(&y))]).unwrap();
    assert_eq!(f32s(&rt.read_buffer(b, 16).unwrap()), y);
}

/// Tensor parallelism (two GPUs, NCCL): inputs broadcast by `ParallelRuntime::upload`, runs
/// queued on both ranks, rank 0 read with `read_into` — the same as the blocking path. The
/// weights stay zero (never loaded): C = A + 0, all-reduced over 2 ranks, all-gathered.
#[test]
fn parallel_upload_and_read_into_match_the_blocking_path() {
    let Some(ctx0) = gpu("parallel_upload_and_read_into_match_the_blocking_path") else { return };
    if Context::device_count().unwrap_or(0) < 2 || !kern_cuda::nccl::nccl_available() {
        eprintln!("parallel_upload_and_read_into_match_the_blocking_path: skipped (needs 2 GPUs and NCCL)");
        return;
    }
    // The manifest names the VecAdd cubin of examples/vecadd: put both in one directory.
    let dir = std::env::temp_dir().join(format!("kern-gpu-staging-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root().join("tests/manifests/parallel/model.json"), dir.join("model.json")).unwrap();
    std::fs::copy(root().join("examples/vecadd/vecadd.sm_90.cubin"), dir.join("vecadd.sm_90.cubin")).unwrap();
    let mut setups = vec![];
    for ctx in [ctx0, Context::new(1).unwrap()] {
        let (manifest, plan) = load(&ctx, &dir.join("model.json"));
        setups.push(kern_runtime::RankSetup { ctx, manifest, plan });
    }
    let id = kern_cuda::nccl::UniqueId::new().unwrap();
    let mut pr = kern_runtime::ParallelRuntime::new(setups, 0, &id).unwrap();
    let m = &pr.ranks()[0].manifest;
    let (a, g) = (m.buffer("A").unwrap(), m.buffer("G").unwrap());
    let max = m.vars_at_max();

    let x = [1.0f32, 2.0, 3.0, 4.0];
    pr.write_buffer(a, as_bytes(&x)).unwrap();
    pr.run(0, &max, Mode::Eager { sync_each: false }).unwrap();
    let blocking = f32s(&pr.read_buffer(g, 32).unwrap());
    assert_eq!(blocking, [2.0, 4.0, 6.0, 8.0, 2.0, 4.0, 6.0, 8.0]);

    for (step, mode) in [Mode::Eager { sync_each: false }, Mode::Graph, Mode::Graph].into_iter().enumerate() {
        let xs: Vec<f32> = x.iter().map(|v| v * (step + 1) as f32).collect();
        pr.upload(&[(a, as_bytes(&xs))]).unwrap();
        for (r, got) in pr.read_buffer_all(a, 16).unwrap().iter().enumerate() {
            assert_eq!(f32s(got), xs, "rank {r} got the broadcast input");
        }
        pr.enqueue_run(0, &max, mode).unwrap();
        let mut out = [0u8; 32];
        pr.read_into(g, &mut out).unwrap();
        let want: Vec<f32> = blocking.iter().map(|v| v * (step + 1) as f32).collect();
        assert_eq!(f32s(&out), want, "step {step} ({mode:?})");
        assert!(pr.last_gpu_ms().unwrap().is_some());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
