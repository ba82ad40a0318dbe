//! Shard sources (issue 17, tensor parallelism): one rank's slice of a checkpoint tensor, or of
//! every tensor of a concatenation, checked element by element against slicing done here by
//! index arithmetic; and the errors when a tensor does not divide into its parts.

use kern_manifest::{Buffer, DType, Expr, Role, Shard, WeightSource};
use kern_weights::{check_rank, materialize_rank, Checkpoint, LoadPlan, WeightsError};
use safetensors::tensor::TensorView as StView;
use safetensors::Dtype;
use std::path::Path;

fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Element (r, c) of an iota tensor of `cols` columns starting at `base`.
fn at(base: f32, cols: usize, r: usize, c: usize) -> f32 {
    base + (r * cols + c) as f32
}

fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, StView<'_>)> = tensors
        .iter()
        .map(|t| (t.0, StView::new(t.1, t.2.clone(), &t.3).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn iota(n: usize, base: f32) -> Vec<u8> {
    f32s((0..n).map(|i| base + i as f32))
}

/// q [4, 6], k [2, 6], v [2, 6] (f32 iotas from 0, 100, 200), odd [5, 2], h [4, 6] in bf16.
fn checkpoint(d: &Path) -> Checkpoint {
    let p = d.join("model.safetensors");
    let bf: Vec<u8> = (0..24).flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes()).collect();
    write(
        &p,
        &[
            ("q", Dtype::F32, vec![4, 6], iota(24, 0.0)),
            ("k", Dtype::F32, vec![2, 6], iota(12, 100.0)),
            ("v", Dtype::F32, vec![2, 6], iota(12, 200.0)),
            ("odd", Dtype::F32, vec![5, 2], iota(10, 0.0)),
            ("h", Dtype::BF16, vec![4, 6], bf),
        ],
    );
    Checkpoint::open(&p).unwrap()
}

fn shard(dim: usize, parts: u64, part: &str) -> Shard {
    Shard { dim, parts, part: Expr::parse(part, |n| (n == "rank").then_some(0)).unwrap() }
}

fn weight(name: &str, shape: &[i64], source: WeightSource) -> Buffer {
    Buffer {
        name: name.into(),
        dtype: DType::F32,
        shape: shape.iter().map(|&d| Expr::constant(d)).collect(),
        role: Role::Weight,
        source: Some(source),
        bytes_at_max: shape.iter().product::<i64>() as u64 * 4,
    }
}

fn sharded(of: WeightSource, s: Shard) -> WeightSource {
    WeightSource::Shard { of: Box::new(of), shard: s }
}

fn load(ckpt: &Checkpoint, b: &Buffer, rank: u32) -> Vec<f32> {
    let mut out = vec![0xAA; b.bytes_at_max as usize];
    materialize_rank(ckpt, b, rank, &mut out).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    floats(&out)
}

#[test]
fn rows_and_columns_of_one_tensor() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(d.path());
    // Row-parallel cut (dim 0, 2 parts): rank r holds rows 2r, 2r+1.
    let rows = weight("rows", &[2, 6], sharded(WeightSource::Tensor("q".into()), shard(0, 2, "rank")));
    for rank in 0..2 {
        let want: Vec<f32> = (0..2).flat_map(|r| (0..6).map(move |c| at(0.0, 6, 2 * rank + r, c))).collect();
        assert_eq!(load(&ckpt, &rows, rank as u32), want, "rank {rank}");
    }
    // Column cut (dim 1, 3 parts): rank r holds columns 2r, 2r+1 of every row.
    let cols = weight("cols", &[4, 2], sharded(WeightSource::Tensor("q".into()), shard(1, 3, "rank")));
    for rank in 0..3 {
        let want: Vec<f32> = (0..4).flat_map(|r| (0..2).map(move |c| at(0.0, 6, r, 2 * rank + c))).collect();
        assert_eq!(load(&ckpt, &cols, rank as u32), want, "rank {rank}");
    }
    // A bf16 tensor converted to the f32 buffer while sliced.
    let conv = weight("conv", &[4, 3], sharded(WeightSource::Tensor("h".into()), shard(1, 2, "rank")));
    let want: Vec<f32> = (0..4).flat_map(|r| (0..3).map(move |c| at(0.0, 6, r, 3 + c))).collect();
    assert_eq!(load(&ckpt, &conv, 1), want);
    // Two ranks sharing one slice: `rank / 2` over 2 parts, rank 3 takes part 1.
    let shared = weight("shared", &[2, 6], sharded(WeightSource::Tensor("q".into()), shard(0, 2, "rank / 2")));
    assert_eq!(load(&ckpt, &shared, 3), load(&ckpt, &rows, 1));
    assert_eq!(load(&ckpt, &shared, 1), load(&ckpt, &rows, 0));
}

#[test]
fn a_sharded_concatenation_is_this_rank_s_slice_of_each_tensor() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(d.path());
    let qkv = WeightSource::Concat { tensors: vec!["q".into(), "k".into(), "v".into()], axis: 0, sizes: Some(vec![2, 1, 1]) };
    let b = weight("qkv", &[4, 6], sharded(qkv, shard(0, 2, "rank")));
    for rank in 0..2usize {
        let mut want = vec![];
        for r in 0..2 {
            want.extend((0..6).map(|c| at(0.0, 6, 2 * rank + r, c)));
        }
        want.extend((0..6).map(|c| at(100.0, 6, rank, c)));
        want.extend((0..6).map(|c| at(200.0, 6, rank, c)));
        assert_eq!(load(&ckpt, &b, rank as u32), want, "rank {rank}");
    }
    // Along axis 1: every row is [q's slice, k's slice] — here q and k of 2 rows each.
    let qk = WeightSource::Concat { tensors: vec!["v".into(), "k".into()], axis: 1, sizes: None };
    let b = weight("vk", &[2, 6], sharded(qk, shard(1, 2, "rank")));
    let want: Vec<f32> = (0..2)
        .flat_map(|r| (0..3).map(move |c| at(200.0, 6, r, 3 + c)).chain((0..3).map(move |c| at(100.0, 6, r, 3 + c))))
        .collect();
    assert_eq!(load(&ckpt, &b, 1), want);
    // Streaming gives the same bytes as materializing.
    let buffers = vec![b];
    let plan = LoadPlan::for_rank(&ckpt, &buffers, 1).unwrap().with_chunk_bytes(8);
    let mut streamed = vec![0u8; buffers[0].bytes_at_max as usize];
    plan.stream(
        |c| -> Result<(), WeightsError> {
            streamed[c.offset as usize..c.offset as usize + c.bytes.len()].copy_from_slice(c.bytes);
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(floats(&streamed), want);
}

#[test]
fn tensors_that_do_not_divide_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(d.path());
    let odd = weight("odd_half", &[2, 2], sharded(WeightSource::Tensor("odd".into()), shard(0, 2, "rank")));
    let text: Vec<String> = check_rank(&ckpt, &[odd], 0).iter().map(|e| e.to_string()).collect();
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(text[0].contains("buffers.odd_half: checkpoint tensor `odd` is 5 long along dimension 0, which does not divide into 2 parts"), "{text:?}");
    // A slice that is not the buffer's shape.
    let wrong = weight("wrong", &[3, 6], sharded(WeightSource::Tensor("q".into()), shard(0, 2, "rank")));
    let text = check_rank(&ckpt, &[wrong], 1)[0].to_string();
    assert!(text.contains("the slice of checkpoint tensor `q` has shape [2, 6], the manifest declares [3, 6]"), "{text}");
    // A concatenation whose slices do not add up to the buffer.
    let qkv = WeightSource::Concat { tensors: vec!["q".into(), "k".into()], axis: 0, sizes: None };
    let short = weight("qk", &[4, 6], sharded(qkv, shard(0, 2, "rank")));
    let text = check_rank(&ckpt, &[short], 0)[0].to_string();
    assert!(text.contains("the tensors add up to 3 along axis 0 (2 + 1), the manifest declares 4"), "{text}");
    // A rank without a slice.
    let rows = weight("rows", &[2, 6], sharded(WeightSource::Tensor("q".into()), shard(0, 2, "rank")));
    let text = check_rank(&ckpt, &[rows], 2)[0].to_string();
    assert!(text.contains("shard part `rank` is 2 at rank 2, outside 0..2"), "{text}");
}
