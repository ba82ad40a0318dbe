//! kern-weights against small safetensors files written here: single and sharded checkpoints,
//! every weight source, dtype conversion, streaming, and every error a user can meet.

use half::{bf16, f16};
use kern_manifest::{Buffer, BufferId, DType, Role, WeightSource};
use kern_weights::{
    alias_of, check, is_loaded, materialize, unused_tensors, Checkpoint, Chunk, LoadPlan,
    WeightsError,
};
use safetensors::tensor::TensorView as StView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};
mod common;
use common::weight;

/// One tensor to write: name, dtype, shape, bytes.
struct T(&'static str, Dtype, Vec<usize>, Vec<u8>);

fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn iota(n: usize, base: f32) -> Vec<u8> {
    f32s((0..n).map(|i| base + i as f32))
}

fn write(path: &Path, tensors: &[T]) {
    let views: Vec<(&str, StView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.0,
                StView::new(t.1, t.2.clone(), &t.3).expect("valid view"),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).expect("serializes");
    std::fs::write(path, bytes).unwrap();
}

fn tensor(name: &str) -> Option<WeightSource> {
    Some(WeightSource::Tensor(name.into()))
}

fn concat(names: &[&str], axis: usize, sizes: Option<Vec<u64>>) -> Option<WeightSource> {
    Some(WeightSource::Concat {
        tensors: names.iter().map(|s| s.to_string()).collect(),
        axis,
        sizes,
    })
}

fn load(ckpt: &Checkpoint, b: &Buffer) -> Vec<u8> {
    let mut out = vec![0xAA; b.bytes_at_max as usize];
    materialize(ckpt, b, &mut out).unwrap_or_else(|e| panic!("{e}"));
    out
}

fn err_text(r: Result<impl std::fmt::Debug, WeightsError>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "expected `{p}` in:\n{text}");
    }
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A small Qwen-like single-file checkpoint.
fn single(d: &Path) -> PathBuf {
    let p = d.join("model.safetensors");
    write(
        &p,
        &[
            T(
                "model.embed_tokens.weight",
                Dtype::F32,
                vec![4, 3],
                iota(12, 0.0),
            ),
            T(
                "model.norm.weight",
                Dtype::BF16,
                vec![3],
                [1.0f32, 2.0, 3.0]
                    .iter()
                    .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            T(
                "model.layers.0.self_attn.q_proj.weight",
                Dtype::F32,
                vec![2, 3],
                iota(6, 100.0),
            ),
            T(
                "model.layers.0.self_attn.k_proj.weight",
                Dtype::F32,
                vec![1, 3],
                iota(3, 200.0),
            ),
            T(
                "model.layers.0.self_attn.v_proj.weight",
                Dtype::F32,
                vec![1, 3],
                iota(3, 300.0),
            ),
            T(
                "position_ids",
                Dtype::I64,
                vec![2],
                [0i64, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        ],
    );
    p
}

#[test]
fn single_file_by_directory_and_by_path() {
    let d = dir();
    let p = single(d.path());
    for opened in [
        Checkpoint::open(d.path()).unwrap(),
        Checkpoint::open(&p).unwrap(),
    ] {
        assert_eq!(opened.len(), 6);
        assert_eq!(opened.files().collect::<Vec<_>>(), vec![p.as_path()]);
        let t = opened.tensor("model.embed_tokens.weight").unwrap();
        assert_eq!(t.dtype, Some(DType::F32));
        assert_eq!(t.file_dtype, "F32");
        assert_eq!(t.shape, &[4, 3]);
        assert_eq!(t.data, iota(12, 0.0).as_slice());
        assert_eq!(
            opened.tensor("position_ids").unwrap().dtype,
            Some(DType::I64)
        );
    }
    // Any *.safetensors name works for a file, and for a directory holding only that file.
    let d2 = dir();
    let other = d2.path().join("consolidated.safetensors");
    std::fs::copy(&p, &other).unwrap();
    assert_eq!(Checkpoint::open(d2.path()).unwrap().len(), 6);
}

/// Two shards and an index, as `save_pretrained` writes them.
fn sharded(d: &Path) {
    write(
        &d.join("model-00001-of-00002.safetensors"),
        &[
            T("a.weight", Dtype::F32, vec![2, 2], iota(4, 1.0)),
            T("b.weight", Dtype::F32, vec![2], iota(2, 10.0)),
        ],
    );
    write(
        &d.join("model-00002-of-00002.safetensors"),
        &[T(
            "c.weight",
            Dtype::BF16,
            vec![2],
            vec![0x80, 0x3f, 0x00, 0x40],
        )],
    );
    index(d, &[("a.weight", 1), ("b.weight", 1), ("c.weight", 2)]);
}

fn index(d: &Path, map: &[(&str, u32)]) {
    let entries: Vec<String> = map
        .iter()
        .map(|(n, s)| format!("\"{n}\": \"model-0000{s}-of-00002.safetensors\""))
        .collect();
    let text = format!(
        "{{\"metadata\": {{\"total_size\": 28}}, \"weight_map\": {{{}}}}}",
        entries.join(", ")
    );
    std::fs::write(d.join("model.safetensors.index.json"), text).unwrap();
}

#[test]
fn sharded_with_index() {
    let d = dir();
    sharded(d.path());
    for ckpt in [
        Checkpoint::open(d.path()).unwrap(),
        Checkpoint::open(&d.path().join("model.safetensors.index.json")).unwrap(),
    ] {
        assert_eq!(ckpt.files().count(), 2);
        assert_eq!(ckpt.names(), vec!["a.weight", "b.weight", "c.weight"]);
        assert_eq!(
            ckpt.tensor("b.weight").unwrap().data,
            iota(2, 10.0).as_slice()
        );
        let c = ckpt.tensor("c.weight").unwrap();
        assert!(c.file.ends_with("model-00002-of-00002.safetensors"));
        // bf16 [1, 2] loaded as f32.
        let buf = weight("c", DType::F32, &[2], tensor("c.weight"));
        assert_eq!(load(&ckpt, &buf), f32s([1.0, 2.0]));
    }
}

#[test]
fn concat_axis0_appends() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let names = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ];
    let b = weight(
        "qkv",
        DType::F32,
        &[4, 3],
        concat(&names, 0, Some(vec![2, 1, 1])),
    );
    let want = [iota(6, 100.0), iota(3, 200.0), iota(3, 300.0)].concat();
    assert_eq!(load(&ckpt, &b), want);
}

#[test]
fn concat_axis1_interleaves_rows() {
    let d = dir();
    let p = d.path().join("m.safetensors");
    // gate [2, 3] = 0..6, up [2, 2] = 10..14: along axis 1 each row is gate's row then up's.
    write(
        &p,
        &[
            T("gate", Dtype::F32, vec![2, 3], iota(6, 0.0)),
            T(
                "up",
                Dtype::BF16,
                vec![2, 2],
                (10..14)
                    .flat_map(|i| bf16::from_f32(i as f32).to_le_bytes())
                    .collect(),
            ),
        ],
    );
    let ckpt = Checkpoint::open(&p).unwrap();
    let b = weight(
        "gate_up",
        DType::F32,
        &[2, 5],
        concat(&["gate", "up"], 1, None),
    );
    let want = f32s([0.0, 1.0, 2.0, 10.0, 11.0, 3.0, 4.0, 5.0, 12.0, 13.0]);
    assert_eq!(load(&ckpt, &b), want);

    // A 3-D concatenation along the middle axis: [2, a, 2] with a = 1 + 2.
    let d = dir();
    let p = d.path().join("m.safetensors");
    write(
        &p,
        &[
            T("x", Dtype::F32, vec![2, 1, 2], iota(4, 0.0)),
            T("y", Dtype::F32, vec![2, 2, 2], iota(8, 10.0)),
        ],
    );
    let ckpt = Checkpoint::open(&p).unwrap();
    let b = weight(
        "xy",
        DType::F32,
        &[2, 3, 2],
        concat(&["x", "y"], 1, Some(vec![1, 2])),
    );
    let want = f32s([
        0.0, 1.0, 10.0, 11.0, 12.0, 13.0, 2.0, 3.0, 14.0, 15.0, 16.0, 17.0,
    ]);
    assert_eq!(load(&ckpt, &b), want);
}

#[test]
fn conversions() {
    let d = dir();
    let p = d.path().join("m.safetensors");
    let halfway = 1.0 + 2f32.powi(-8); // ties to even → 1.0 in bf16
    let above = 1.0 + 3.0 * 2f32.powi(-8); // ties to even → 1 + 2^-6
    write(
        &p,
        &[
            T(
                "bf",
                Dtype::BF16,
                vec![3],
                [0.5f32, -3.0, 1e30]
                    .iter()
                    .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            T("f", Dtype::F32, vec![3], f32s([halfway, above, 1e-3])),
            T(
                "h",
                Dtype::F16,
                vec![2],
                [0.333f32, 65504.0]
                    .iter()
                    .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
        ],
    );
    let ckpt = Checkpoint::open(&p).unwrap();

    let bf_f32 = load(&ckpt, &weight("a", DType::F32, &[3], tensor("bf")));
    assert_eq!(bf_f32, f32s([0.5, -3.0, bf16::from_f32(1e30).to_f32()]));

    let f32_bf = load(&ckpt, &weight("b", DType::Bf16, &[3], tensor("f")));
    let got: Vec<u16> = f32_bf
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got[0], 0x3f80, "1 + 2^-8 rounds to even (1.0)");
    assert_eq!(got[1], 0x3f82, "1 + 3·2^-8 rounds to even (1 + 2^-6)");
    assert_eq!(got[2], bf16::from_f32(1e-3).to_bits());

    let f16_bf = load(&ckpt, &weight("c", DType::Bf16, &[2], tensor("h")));
    let want: Vec<u8> = [0.333f32, 65504.0]
        .iter()
        .flat_map(|&x| bf16::from_f32(f16::from_f32(x).to_f32()).to_le_bytes())
        .collect();
    assert_eq!(f16_bf, want);
}

#[test]
fn alias_is_not_loaded() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let buffers = vec![
        weight(
            "model.embed_tokens.weight",
            DType::F32,
            &[4, 3],
            tensor("model.embed_tokens.weight"),
        ),
        weight(
            "lm_head.weight",
            DType::F32,
            &[4, 3],
            Some(WeightSource::Alias(BufferId(0))),
        ),
    ];
    assert_eq!(alias_of(&buffers[1]), Some(BufferId(0)));
    assert!(is_loaded(&buffers[0]) && !is_loaded(&buffers[1]));
    let plan = LoadPlan::new(&ckpt, &buffers).unwrap();
    assert_eq!(
        plan.total_bytes(),
        48,
        "the alias's bytes are not counted again"
    );
    assert_eq!(plan.buffers().collect::<Vec<_>>(), vec![(BufferId(0), 48)]);
    assert_eq!(
        plan.aliases().collect::<Vec<_>>(),
        vec![(BufferId(1), BufferId(0))]
    );
    let mut out = vec![0u8; 48];
    assert_has(
        &err_text(materialize(&ckpt, &buffers[1], &mut out)),
        &["buffers.lm_head.weight", "alias"],
    );
}

/// Streams with a chunk size, reassembles each buffer, and checks order and coverage.
fn stream(plan: &LoadPlan<'_>, n: usize) -> Vec<Vec<u8>> {
    let mut bufs: Vec<(BufferId, Vec<u8>)> = vec![];
    let mut last_done = 0;
    let mut progress_calls = 0;
    plan.stream::<WeightsError>(
        |c: Chunk<'_>| {
            assert!(
                !c.bytes.is_empty() && c.bytes.len() <= n.max(8),
                "chunk of {} bytes",
                c.bytes.len()
            );
            if bufs.last().map(|b| b.0) != Some(c.buffer) {
                assert!(
                    bufs.iter().all(|b| b.0 != c.buffer),
                    "buffers come one after another"
                );
                bufs.push((c.buffer, vec![]));
            }
            let b = &mut bufs.last_mut().unwrap().1;
            assert_eq!(
                c.offset,
                b.len() as u64,
                "chunks are in order, without gaps"
            );
            b.extend_from_slice(c.bytes);
            Ok(())
        },
        |p| {
            assert!(p.done > last_done && p.done <= p.total);
            last_done = p.done;
            progress_calls += 1;
        },
    )
    .unwrap();
    assert_eq!(last_done, plan.total_bytes());
    assert!(progress_calls >= bufs.len());
    bufs.into_iter().map(|b| b.1).collect()
}

#[test]
fn streaming_equals_materialize_at_any_chunk_size() {
    let d = dir();
    let p = d.path().join("m.safetensors");
    let rows = 37;
    write(
        &p,
        &[
            T("big", Dtype::F32, vec![rows, 5], iota(rows * 5, 0.0)),
            T(
                "q",
                Dtype::BF16,
                vec![rows, 3],
                (0..rows * 3)
                    .flat_map(|i| bf16::from_f32(i as f32).to_le_bytes())
                    .collect(),
            ),
            T("k", Dtype::F32, vec![rows, 2], iota(rows * 2, 1000.0)),
            T(
                "ids",
                Dtype::I32,
                vec![7],
                (0..7i32).flat_map(i32::to_le_bytes).collect(),
            ),
        ],
    );
    let ckpt = Checkpoint::open(&p).unwrap();
    let buffers = vec![
        weight("big", DType::F32, &[rows as i64, 5], None), // default: the tensor of its name
        weight("big16", DType::Bf16, &[rows as i64, 5], tensor("big")),
        weight(
            "qk1",
            DType::Bf16,
            &[rows as i64, 5],
            concat(&["q", "k"], 1, None),
        ),
        weight("qk0", DType::F32, &[1, rows as i64 * 5], None).with_source(concat(
            &["q", "k"],
            1,
            None,
        )),
        weight("ids", DType::I32, &[7], None),
    ];
    // qk0 above is a deliberate misfit: [37, 3] and [37, 2] cannot form [1, 185].
    let problems = check(&ckpt, &buffers);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    let buffers: Vec<Buffer> = buffers.into_iter().filter(|b| b.name != "qk0").collect();
    assert!(check(&ckpt, &buffers).is_empty());
    let plan = LoadPlan::new(&ckpt, &buffers).unwrap();
    let want: Vec<Vec<u8>> = buffers.iter().map(|b| load(&ckpt, b)).collect();
    assert_eq!(
        plan.total_bytes(),
        want.iter().map(|w| w.len() as u64).sum::<u64>()
    );
    for n in [1, 8, 10, 64, 100, 333, 1 << 20] {
        let plan = LoadPlan::new(&ckpt, &buffers).unwrap().with_chunk_bytes(n);
        assert_eq!(stream(&plan, n), want, "chunk size {n}");
    }
    // The sink's error stops the stream and comes back.
    let plan = LoadPlan::new(&ckpt, &buffers).unwrap().with_chunk_bytes(64);
    let mut calls = 0;
    let r = plan.stream::<WeightsError>(
        |_| {
            calls += 1;
            Err(WeightsError::Buffer {
                buffer: "x".into(),
                message: "device full".into(),
            })
        },
        |_| {},
    );
    assert_has(&err_text(r), &["device full"]);
    assert_eq!(calls, 1);
}

trait WithSource {
    fn with_source(self, s: Option<WeightSource>) -> Self;
}
impl WithSource for Buffer {
    fn with_source(mut self, s: Option<WeightSource>) -> Self {
        self.source = s;
        self
    }
}

#[test]
fn unknown_tensor_suggests_similar_names() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let text = err_text(ckpt.tensor("model.layers.0.self_attn.q_prj.weight"));
    assert_has(
        &text,
        &[
            "has no tensor `model.layers.0.self_attn.q_prj.weight`",
            &d.path().display().to_string(),
            "similar names: `model.layers.0.self_attn.q_proj.weight`",
        ],
    );
    let b = weight("w", DType::F32, &[3], tensor("model.nrm.weight"));
    let problems = check(&ckpt, &[b]);
    assert_eq!(problems.len(), 1);
    assert_has(
        &problems[0].to_string(),
        &[
            "buffers.w: checkpoint",
            "`model.nrm.weight`",
            "`model.norm.weight`",
        ],
    );
}

#[test]
fn wrong_shape_names_both_shapes() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let b = weight("model.embed_tokens.weight", DType::F32, &[3, 4], None);
    let text = err_text(materialize(&ckpt, &b, &mut [0u8; 48]));
    assert_has(
        &text,
        &["buffers.model.embed_tokens.weight: checkpoint tensor `model.embed_tokens.weight` has shape [4, 3], the manifest declares [3, 4]", "model.safetensors"],
    );
    // Concatenations that do not add up, or whose other dimensions differ.
    let names = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ];
    let sum = weight("qk", DType::F32, &[4, 3], concat(&names, 0, None));
    assert_has(
        &err_text(materialize(&ckpt, &sum, &mut [0u8; 48])),
        &[
            "buffers.qk:",
            "add up to 3 along axis 0 (2 + 1), the manifest declares 4",
        ],
    );
    let sizes = weight(
        "qk",
        DType::F32,
        &[3, 3],
        concat(&names, 0, Some(vec![1, 2])),
    );
    assert_has(
        &err_text(materialize(&ckpt, &sizes, &mut [0u8; 36])),
        &["is 2 long along axis 0, and `sizes` says 1"],
    );
    let other = weight("qk", DType::F32, &[2, 4], concat(&names, 1, None));
    assert_has(
        &err_text(materialize(&ckpt, &other, &mut [0u8; 32])),
        &["must have shape [2, *]"],
    );
    // The output slice must be the buffer's size.
    let ok = weight("model.norm.weight", DType::F32, &[3], None);
    assert_has(
        &err_text(materialize(&ckpt, &ok, &mut [0u8; 11])),
        &["output slice is 11 bytes, the buffer 12"],
    );
}

#[test]
fn wrong_dtype_int_vs_float() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let b = weight("position_ids", DType::Bf16, &[2], None);
    assert_has(
        &err_text(materialize(&ckpt, &b, &mut [0u8; 4])),
        &["buffers.position_ids: checkpoint tensor `position_ids` is I64, the manifest declares bf16"],
    );
    let b = weight("x", DType::I32, &[3], tensor("model.norm.weight"));
    assert_has(
        &err_text(materialize(&ckpt, &b, &mut [0u8; 12])),
        &["is BF16, the manifest declares i32"],
    );
    // Integers load when they match exactly.
    let b = weight("position_ids", DType::I64, &[2], None);
    assert_eq!(
        load(&ckpt, &b),
        [0i64, 1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>()
    );
}

#[test]
fn check_lists_every_problem() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let buffers = vec![
        weight("model.embed_tokens.weight", DType::F32, &[4, 3], None),
        weight("missing.one", DType::F32, &[3], None),
        weight("model.norm.weight", DType::F32, &[4], None),
        weight("position_ids", DType::F32, &[2], None),
        weight(
            "qkv",
            DType::F32,
            &[4, 3],
            concat(
                &["nope.q", "model.layers.0.self_attn.k_proj.weight", "nope.v"],
                0,
                None,
            ),
        ),
        Buffer {
            role: Role::Activation,
            ..weight("x", DType::F32, &[3], None)
        },
    ];
    let problems: Vec<String> = check(&ckpt, &buffers)
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(problems.len(), 5, "{problems:#?}");
    assert_has(
        &problems[0],
        &["buffers.missing.one:", "no tensor `missing.one`"],
    );
    assert_has(
        &problems[1],
        &[
            "buffers.model.norm.weight:",
            "has shape [3], the manifest declares [4]",
        ],
    );
    assert_has(&problems[2], &["buffers.position_ids:", "is I64"]);
    assert_has(&problems[3], &["buffers.qkv:", "`nope.q`"]);
    assert_has(&problems[4], &["buffers.qkv:", "`nope.v`"]);
    let all = err_text(LoadPlan::new(&ckpt, &buffers));
    assert_has(
        &all,
        &[
            "5 problems between the manifest and checkpoint",
            "\n  buffers.missing.one",
        ],
    );
    assert!(unused_tensors(&ckpt, &buffers[..1]).contains(&"model.norm.weight"));
}

#[test]
fn missing_shard_file() {
    let d = dir();
    sharded(d.path());
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &[
            "model.safetensors.index.json",
            "missing",
            "`model-00002-of-00002.safetensors` (for 1 tensor, e.g. `c.weight`)",
        ],
    );
}

#[test]
fn index_must_agree_with_shards() {
    let d = dir();
    sharded(d.path());
    index(
        d.path(),
        &[("a.weight", 2), ("b.weight", 1), ("c.weight", 2)],
    );
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &[
            "disagrees",
            "`a.weight` in `model-00002-of-00002.safetensors`",
        ],
    );
    index(d.path(), &[("a.weight", 1), ("zzz", 1), ("c.weight", 2)]);
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &["`zzz`", "no such tensor"],
    );
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        "{\"weight_map\": {\"a\": \"../x.safetensors\"}}",
    )
    .unwrap();
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &["plain names inside the checkpoint's directory"],
    );
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        "{\"weight_map\": [",
    )
    .unwrap();
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &["model.safetensors.index.json: not valid JSON"],
    );
}

#[test]
fn duplicate_tensor_across_shards() {
    let d = dir();
    sharded(d.path());
    write(
        &d.path().join("model-00002-of-00002.safetensors"),
        &[
            T("c.weight", Dtype::F32, vec![1], iota(1, 0.0)),
            T("a.weight", Dtype::F32, vec![1], iota(1, 0.0)),
        ],
    );
    assert_has(
        &err_text(Checkpoint::open(d.path())),
        &[
            "tensor `a.weight` is in both",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ],
    );
}

#[test]
fn corrupt_and_truncated_files() {
    let d = dir();
    let p = single(d.path());
    let good = std::fs::read(&p).unwrap();
    let case = |bytes: &[u8], want: &[&str]| {
        std::fs::write(&p, bytes).unwrap();
        let text = err_text(Checkpoint::open(&p));
        assert_has(
            &text,
            &[&p.display().to_string(), "not a valid safetensors file"],
        );
        assert_has(&text, want);
    };
    // The JSON header damaged in place.
    let mut bad = good.clone();
    bad[8] = b'#';
    case(&bad, &["header is not valid safetensors JSON"]);
    // Cut inside the tensor data, and inside the header.
    case(&good[..good.len() - 5], &["truncated"]);
    case(
        &good[..40],
        &["runs past the end of the file (40 bytes)", "truncated"],
    );
    case(&good[..3], &["too short"]);
    case(&[], &["the file is 0 bytes"]);
    // A header length far past the file.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    case(&huge, &["header"]);
    // Offsets that point past the data.
    let header = br#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header);
    f.extend_from_slice(&[0u8; 8]);
    case(&f, &["truncated"]);
    // A directory with no checkpoint at all.
    let empty = dir();
    assert_has(
        &err_text(Checkpoint::open(empty.path())),
        &["no checkpoint here"],
    );
    assert_has(
        &err_text(Checkpoint::open(&empty.path().join("nope"))),
        &["cannot open the checkpoint"],
    );
}

#[test]
fn a_checked_manifest_loads() {
    // The checker fills in default sources and resolves aliases; kern-weights takes its output.
    let d = dir();
    single(d.path());
    let manifest = r#"{
      "schema_version": "4.1", "model": "tiny",
      "buffers": {
        "model.embed_tokens.weight": { "dtype": "bf16", "shape": [4, 3], "role": "weight" },
        "lm_head.weight": { "dtype": "bf16", "shape": [4, 3], "role": "weight", "from": { "alias": "model.embed_tokens.weight" } },
        "qkv": { "dtype": "f32", "shape": [4, 3], "role": "weight",
                 "from": { "concat": ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.0.self_attn.v_proj.weight"], "axis": 0, "sizes": [2, 1, 1] } },
        "x": { "dtype": "f32", "shape": [3] }
      },
      "program": { "calls": [] }
    }"#;
    let path = d.path().join("model.json");
    let m = match kern_manifest::check_bytes(manifest.as_bytes(), &path, &Default::default()) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    };
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let plan = LoadPlan::for_manifest(&ckpt, &m).unwrap();
    assert_eq!(plan.total_bytes(), 24 + 48);
    assert_eq!(plan.aliases().count(), 1);
    let got = stream(&plan, 1 << 20);
    let embed: Vec<u8> = (0..12)
        .flat_map(|i| bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    assert_eq!(
        got,
        vec![
            embed,
            [iota(6, 100.0), iota(3, 200.0), iota(3, 300.0)].concat()
        ]
    );
}

/// A `values` source (kern 4.1) is loaded from the manifest's own bytes: no checkpoint tensor is
/// looked up, the plan counts its bytes, and streaming and materializing give those bytes.
#[test]
fn values_source_loads_the_manifest_bytes() {
    let d = dir();
    single(d.path());
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let bytes = f32s([0.5, 0.25, 0.125]);
    let buffers = vec![
        weight("model.embed_tokens.weight", DType::F32, &[4, 3], tensor("model.embed_tokens.weight")),
        weight("rope.inv_freq", DType::F32, &[3], Some(WeightSource::Values(bytes.clone()))),
    ];
    assert!(check(&ckpt, &buffers).is_empty());
    assert!(is_loaded(&buffers[1]));
    let plan = LoadPlan::new(&ckpt, &buffers).unwrap();
    assert_eq!(plan.total_bytes(), 48 + 12);
    let mut out = vec![0u8; 12];
    materialize(&ckpt, &buffers[1], &mut out).unwrap();
    assert_eq!(out, bytes);
    for n in [8, 12, 64] {
        let plan = LoadPlan::new(&ckpt, &buffers).unwrap().with_chunk_bytes(n);
        assert_eq!(stream(&plan, n)[1], bytes, "chunk size {n}");
    }
    // A mismatch between the bytes and the shape (a manifest built by hand, not checked) is
    // an error naming the buffer, never an out-of-bounds copy.
    let bad = weight("short", DType::F32, &[4], Some(WeightSource::Values(bytes)));
    let text = format!("{:?}", check(&ckpt, &[bad]));
    assert!(text.contains("short") && text.contains("12 bytes of values for a buffer of 16 bytes"), "{text}");
}
