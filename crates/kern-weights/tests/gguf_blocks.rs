//! Issue 25: GGUF block tensors loaded as they are into block-dtype buffers (`q4_k`, …), whose
//! element is one whole block; FP8 safetensors weights with their `weight_scale_inv` loaded
//! unchanged. Exact bytes (against the file's own bytes), concatenation and shards along
//! axis 0 and in blocks, the refusals, and a property test over random shapes, types,
//! offsets and truncations.

mod common;
use common::{weight, W};
use kern_manifest::{DType, Expr, Shard, WeightSource};
use kern_weights::gguf::GgmlType;
use kern_weights::{check, check_rank, materialize, materialize_rank, Checkpoint, LoadPlan, WeightsError};
use proptest::prelude::*;
use std::path::Path;

/// `n` bytes of a deterministic pattern (blocks are opaque: any bytes load).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn ggml(d: DType) -> GgmlType {
    GgmlType::for_dtype(d).unwrap()
}

/// A tensor to write: GGUF dims (innermost first), ggml type id, data.
type Tensor = (Vec<u64>, u32, Vec<u8>);

/// A tensor of `rows` rows of `blocks` blocks of `d`.
fn blocks_of(d: DType, rows: u64, blocks: u64, seed: u64) -> Tensor {
    let dims = vec![blocks * d.block_elems(), rows];
    (dims, ggml(d).id, bytes((rows * blocks * d.size()) as usize, seed))
}

fn write(dir: &Path, tensors: &[(&str, Tensor)]) -> Checkpoint {
    let mut w = W::new();
    for (name, (dims, ty, data)) in tensors {
        w.tensor(name, dims, *ty, data.clone());
    }
    let path = dir.join("model.gguf");
    std::fs::write(&path, w.bytes()).unwrap();
    Checkpoint::open(&path).unwrap()
}

fn load(ckpt: &Checkpoint, b: &kern_manifest::Buffer) -> Vec<u8> {
    let mut out = vec![0xAA; b.bytes_at_max as usize];
    materialize(ckpt, b, &mut out).unwrap_or_else(|e| panic!("{e}"));
    out
}

/// Every buffer streamed at `chunk` bytes, concatenated per buffer.
fn stream(ckpt: &Checkpoint, buffers: &[kern_manifest::Buffer], chunk: usize) -> Vec<Vec<u8>> {
    let plan = LoadPlan::new(ckpt, buffers).unwrap_or_else(|e| panic!("{e}")).with_chunk_bytes(chunk);
    let mut got = vec![vec![]; buffers.len()];
    plan.stream(
        |c| -> Result<(), WeightsError> {
            assert!(c.bytes.len() <= chunk.max(8));
            let g: &mut Vec<u8> = &mut got[c.buffer.0];
            assert_eq!(c.offset as usize, g.len());
            g.extend_from_slice(c.bytes);
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    got
}

fn src(name: &str) -> Option<WeightSource> {
    Some(WeightSource::Tensor(name.into()))
}

fn concat(names: &[&str], axis: usize) -> Option<WeightSource> {
    Some(WeightSource::Concat { tensors: names.iter().map(|s| s.to_string()).collect(), axis, sizes: None })
}

fn shard(of: Option<WeightSource>, dim: usize, parts: u64) -> Option<WeightSource> {
    let part = Expr::parse("rank", |n| (n == "rank").then_some(0)).unwrap();
    Some(WeightSource::Shard { of: Box::new(of.unwrap()), shard: Shard { dim, parts, part } })
}

fn one_problem(ckpt: &Checkpoint, b: &kern_manifest::Buffer) -> String {
    let p = check(ckpt, std::slice::from_ref(b));
    assert_eq!(p.len(), 1, "{p:?}");
    p[0].to_string()
}

#[test]
fn every_block_dtype_loads_the_files_bytes() {
    for (i, d) in DType::BLOCKS.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let t = blocks_of(d, 3, 2, i as u64);
        let data = t.2.clone();
        let ckpt = write(dir.path(), &[("w", t)]);
        let view = ckpt.tensor("w").unwrap();
        assert_eq!(view.ggml, Some(ggml(d)), "the pack's question: which ggml type is it");
        assert_eq!(view.shape, [3, 2 * d.block_elems() as usize], "shapes count values");
        assert_eq!((view.native_dtype(), view.native_shape()), (Some(d), Some(vec![3, 2])));
        assert_eq!(view.data, &data[..], "{d}");
        let b = weight("w", d, &[3, 2], None);
        assert_eq!(b.bytes_at_max, 6 * d.size());
        assert!(check(&ckpt, std::slice::from_ref(&b)).is_empty(), "{d}");
        assert_eq!(load(&ckpt, &b), data, "{d}: materialize");
        for chunk in [8, 100, d.size() as usize, 1 << 20] {
            assert_eq!(stream(&ckpt, std::slice::from_ref(&b), chunk)[0], data, "{d}: stream at {chunk}");
        }
        assert_eq!(ckpt.read_as("w", d).unwrap(), data, "{d}: read_as");
        // The float path is unchanged: the same tensor dequantized into bf16.
        let f = weight("w", DType::Bf16, &[3, 2 * d.block_elems() as i64], None);
        assert!(check(&ckpt, std::slice::from_ref(&f)).is_empty(), "{d}");
    }
}

#[test]
fn fused_qkv_and_shards_take_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // q: 4 rows, k and v: 2 rows; 3 Q4_K blocks (768 values) per row.
    let (q, k, v) = (blocks_of(DType::Q4K, 4, 3, 1), blocks_of(DType::Q4K, 2, 3, 2), blocks_of(DType::Q4K, 2, 3, 3));
    let (qd, kd, vd) = (q.2.clone(), k.2.clone(), v.2.clone());
    let row = 3 * 144;
    let ckpt = write(dir.path(), &[("q", q), ("k", k), ("v", v)]);
    let qkv = weight("qkv", DType::Q4K, &[8, 3], concat(&["q", "k", "v"], 0));
    assert_eq!(load(&ckpt, &qkv), [qd.clone(), kd.clone(), vd.clone()].concat());
    for chunk in [8, 150, 1000] {
        assert_eq!(stream(&ckpt, std::slice::from_ref(&qkv), chunk)[0], [qd.clone(), kd.clone(), vd.clone()].concat());
    }
    // Along the last axis the concatenation counts blocks: each row is k's row, then v's.
    let kv = weight("kv", DType::Q4K, &[2, 6], concat(&["k", "v"], 1));
    let want: Vec<u8> = (0..2).flat_map(|r| [&kd[r * row..(r + 1) * row], &vd[r * row..(r + 1) * row]].concat()).collect();
    assert_eq!(load(&ckpt, &kv), want);
    // Shards: rows (axis 0) and blocks (axis 1), each rank its slice of the file's bytes.
    let rows = weight("q_r", DType::Q4K, &[2, 3], shard(src("q"), 0, 2));
    let cols = weight("q_c", DType::Q4K, &[4, 1], shard(src("q"), 1, 3));
    for rank in 0..2u32 {
        let r = rank as usize;
        let mut out = vec![0u8; rows.bytes_at_max as usize];
        materialize_rank(&ckpt, &rows, rank, &mut out).unwrap();
        assert_eq!(out, qd[2 * r * row..2 * (r + 1) * row], "rows, rank {rank}");
        let mut out = vec![0u8; cols.bytes_at_max as usize];
        materialize_rank(&ckpt, &cols, rank, &mut out).unwrap();
        let want: Vec<u8> = (0..4).flat_map(|i| qd[i * row + r * 144..i * row + (r + 1) * 144].to_vec()).collect();
        assert_eq!(out, want, "blocks, rank {rank}");
    }
    // A sharded fused QKV along axis 0.
    let qkv_r = weight("qkv_r", DType::Q4K, &[4, 3], shard(concat(&["q", "k", "v"], 0), 0, 2));
    let mut out = vec![0u8; qkv_r.bytes_at_max as usize];
    materialize_rank(&ckpt, &qkv_r, 1, &mut out).unwrap();
    assert_eq!(out, [&qd[2 * row..], &kd[row..], &vd[row..]].concat());
    // 3 blocks per row do not divide into 2 parts: a cut through a block is refused.
    let half = weight("q_h", DType::Q4K, &[4, 1], shard(src("q"), 1, 2));
    let p = check_rank(&ckpt, std::slice::from_ref(&half), 0);
    assert_eq!(p.len(), 1, "{p:?}");
    let text = p[0].to_string();
    assert!(text.contains("checkpoint tensor `q` is 3 blocks of 256 values (q4_k) long along dimension 1, which does not divide into 2 parts"), "{text}");
}

#[test]
fn refusals_name_both_types_and_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = write(
        dir.path(),
        &[
            ("blk.0.attn_q.weight", blocks_of(DType::Q4K, 4, 2, 1)),
            ("blk.0.attn_v.weight", blocks_of(DType::Q6K, 2, 2, 2)),
            ("norm", (vec![512, 1], 0, bytes(512 * 4, 3))),
            ("odd", (vec![64, 2], 20, bytes(2 * 2 * 18, 4))), // IQ4_NL: no dtype
        ],
    );
    // Another block type.
    let t = one_problem(&ckpt, &weight("blk.0.attn_v.weight", DType::Q4K, &[2, 2], None));
    assert!(t.contains("buffers.blk.0.attn_v.weight: checkpoint tensor `blk.0.attn_v.weight` is Q6_K; the manifest declares q4_k, which takes a GGUF Q4_K tensor's blocks as they are: declare this weight `q6_k`"), "{t}");
    // A float GGUF tensor: no quantizing at load.
    let t = one_problem(&ckpt, &weight("norm", DType::Q8_0, &[1, 16], None));
    assert!(t.contains("is F32; the manifest declares q8_0") && t.contains("declare this weight `f32` (kern does not quantize at load)"), "{t}");
    // A block type kern has no dtype for.
    let t = one_problem(&ckpt, &weight("odd", DType::Q4_0, &[2, 2], None));
    assert!(t.contains("is IQ4_NL; the manifest declares q4_0"), "{t}");
    // The shape: the last dimension counts blocks.
    let t = one_problem(&ckpt, &weight("blk.0.attn_q.weight", DType::Q4K, &[4, 512], None));
    assert!(t.contains("checkpoint tensor `blk.0.attn_q.weight` is Q4_K of shape [4, 512] in values, which is [4, 2] in blocks of 256 values; the manifest declares [4, 512]"), "{t}");
    let t = one_problem(&ckpt, &weight("blk.0.attn_q.weight", DType::Q4K, &[2, 4], None));
    assert!(t.contains("[4, 2] in blocks of 256 values; the manifest declares [2, 4]"), "{t}");
    // A fused QKV of mixed types (a Q4_K_M file's q in Q4_K and v in Q6_K): the odd one named.
    let qv = weight("qv", DType::Q4K, &[6, 2], concat(&["blk.0.attn_q.weight", "blk.0.attn_v.weight"], 0));
    let t = one_problem(&ckpt, &qv);
    assert!(t.contains("checkpoint tensor `blk.0.attn_v.weight` is Q6_K; the manifest declares q4_k"), "{t}");
    // A concatenation whose rows differ in blocks.
    let ckpt2 = write(tempfile::tempdir().unwrap().path(), &[("a", blocks_of(DType::Q8_0, 2, 2, 1)), ("b", blocks_of(DType::Q8_0, 2, 3, 2))]);
    let t = one_problem(&ckpt2, &weight("ab", DType::Q8_0, &[4, 2], concat(&["a", "b"], 0)));
    assert!(t.contains("checkpoint tensor `b` has shape [2, 3] in blocks of 32 values ([2, 96] in values); to be concatenated along axis 0 into [4, 2] it must have shape [*, 2]"), "{t}");
    // read_as into another block type is refused.
    assert!(ckpt.read_as("blk.0.attn_v.weight", DType::Q4K).is_err());
}

/// One safetensors file of `(name, dtype, shape, bytes)`.
fn safetensors(path: &Path, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> =
        tensors.iter().map(|t| (t.0, safetensors::tensor::TensorView::new(t.1, t.2.clone(), &t.3).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn fp8_weights_and_their_scales_load_unchanged() {
    use safetensors::Dtype;
    // The Hugging Face fine-grained FP8 layout: e4m3 weight [N, K], f32 weight_scale_inv
    // [ceil(N/128), ceil(K/128)]; N = 300 and K = 256 leave a partial block of rows.
    let dir = tempfile::tempdir().unwrap();
    let (w, s) = (bytes(300 * 256, 7), bytes(3 * 2 * 4, 8));
    let (k, ks) = (bytes(128 * 256, 9), bytes(2 * 4, 10));
    safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("l.q_proj.weight", Dtype::F8_E4M3, vec![300, 256], w.clone()),
            ("l.q_proj.weight_scale_inv", Dtype::F32, vec![3, 2], s.clone()),
            ("l.k_proj.weight", Dtype::F8_E4M3, vec![128, 256], k.clone()),
            ("l.k_proj.weight_scale_inv", Dtype::F32, vec![1, 2], ks.clone()),
        ],
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let v = ckpt.tensor("l.q_proj.weight").unwrap();
    assert_eq!((v.dtype, v.native_dtype(), v.native_shape()), (Some(DType::F8e4m3), Some(DType::F8e4m3), Some(vec![300, 256])));
    let buffers = vec![
        weight("q", DType::F8e4m3, &[300, 256], src("l.q_proj.weight")),
        weight("q.scale_inv", DType::F32, &[3, 2], src("l.q_proj.weight_scale_inv")),
        weight("qk", DType::F8e4m3, &[428, 256], concat(&["l.q_proj.weight", "l.k_proj.weight"], 0)),
        weight("q_r", DType::F8e4m3, &[150, 256], shard(src("l.q_proj.weight"), 0, 2)),
    ];
    assert!(check(&ckpt, &buffers).is_empty());
    let want = [w.clone(), s.clone(), [w.clone(), k.clone()].concat(), w[..150 * 256].to_vec()];
    for (b, want) in buffers.iter().zip(&want) {
        assert_eq!(&load(&ckpt, b), want, "{}", b.name);
    }
    for chunk in [8, 1000, 1 << 20] {
        assert_eq!(stream(&ckpt, &buffers, chunk), want, "stream at {chunk}");
    }
    // FP8 is never converted: a bf16 buffer for an e4m3 tensor is refused, and so is a block
    // buffer for a safetensors tensor.
    let t = one_problem(&ckpt, &weight("q", DType::Bf16, &[300, 256], src("l.q_proj.weight")));
    assert!(t.contains("is F8_E4M3, the manifest declares bf16"), "{t}");
    let t = one_problem(&ckpt, &weight("q", DType::Q8_0, &[300, 8], src("l.q_proj.weight")));
    assert!(t.contains("is F8_E4M3; the manifest declares q8_0") && t.contains("loads from a GGUF file only"), "{t}");
}

/// Where the writer puts the first tensor's data offset: the header (24 bytes, no metadata),
/// then the name, the dimension count, the dims and the type.
fn offset_at(name: &str, n_dims: usize) -> usize {
    24 + 8 + name.len() + 4 + 8 * n_dims + 4
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Random block types, shapes, declared shapes, sources, chunk sizes, data offsets and
    /// truncations: opening, checking and loading never panic or read out of bounds, and
    /// whatever loads is exactly the file's bytes of the tensor.
    #[test]
    fn block_loading_is_exact_or_refused(
        ty in 0usize..10,
        other in prop_oneof![3 => Just(None), 1 => (0usize..10).prop_map(Some)],
        rows in 1u64..5,
        blocks in 1u64..4,
        rows2 in 1u64..4,
        declared in proptest::collection::vec(0u64..9, 1..4),
        use_declared in prop::bool::weighted(0.25),
        fused in any::<bool>(),
        parts in 1u64..4,
        sharded in any::<bool>(),
        dim in 0usize..2,
        chunk in 1usize..600,
        offset in prop_oneof![3 => Just(None), 1 => (0u64..64).prop_map(|k| Some(32 * k)), 1 => any::<u64>().prop_map(Some)],
        cut in prop_oneof![3 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)],
        seed in any::<u64>(),
    ) {
        let d = DType::BLOCKS[ty];
        // A fused tensor of the same type, or now and then of another (refused unless equal).
        let d2 = other.map_or(d, |o| DType::BLOCKS[o]);
        let a = blocks_of(d, rows, blocks, seed);
        let b = blocks_of(d2, rows2, blocks, seed ^ 1);
        let (ad, bd) = (a.2.clone(), b.2.clone());
        let mut w = W::new();
        w.tensor("a", &a.0, a.1, a.2).tensor("b", &b.0, b.1, b.2);
        let mut file = w.bytes();
        if let Some(off) = offset {
            // Move tensor `a`'s data anywhere (aligned or not, inside the file or not).
            let at = offset_at("a", 2);
            file[at..at + 8].copy_from_slice(&off.to_le_bytes());
        }
        if let Some(i) = cut {
            file.truncate(i.index(file.len()));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, &file).unwrap();
        let Ok(ckpt) = Checkpoint::open(&path) else { return Ok(()) };
        let source = if fused { concat(&["a", "b"], 0) } else { src("a") };
        let source = if sharded { shard(source, dim, parts) } else { source };
        let natural: Vec<i64> = vec![(rows + if fused { rows2 } else { 0 }) as i64, blocks as i64];
        let mut shape = if use_declared { declared.iter().map(|&x| x as i64).collect() } else { natural.clone() };
        if sharded && !use_declared && dim < shape.len() {
            shape[dim] /= parts as i64;
        }
        let buf = weight("w", d, &shape, source);
        let problems = check(&ckpt, std::slice::from_ref(&buf));
        let mut out = vec![0u8; buf.bytes_at_max as usize];
        let loaded = materialize(&ckpt, &buf, &mut out);
        prop_assert_eq!(problems.is_empty(), loaded.is_ok(), "check and materialize agree: {:?}", problems);
        if loaded.is_err() {
            return Ok(());
        }
        // It loaded: the buffer is the file's bytes (read back through the checkpoint, which
        // may have moved with `offset`).
        let fa = ckpt.tensor("a").unwrap().data.to_vec();
        prop_assert_eq!(fa.len(), ad.len());
        if offset.is_none() {
            prop_assert_eq!(&fa, &ad);
        }
        let row = (blocks * d.size()) as usize;
        let mut tensors = vec![fa.clone()];
        if fused {
            tensors.push(ckpt.tensor("b").unwrap().data.to_vec());
            if offset.is_none() {
                prop_assert_eq!(&tensors[1], &bd);
            }
        }
        // Each tensor's slice (a sharded concatenation cuts every tensor), laid end to end.
        let want: Vec<u8> = tensors
            .iter()
            .flat_map(|t| {
                if !sharded {
                    t.clone()
                } else if dim == 0 {
                    t[..t.len() / parts as usize].to_vec()
                } else {
                    let w = row / parts as usize;
                    t.chunks(row).flat_map(|r| r[..w].to_vec()).collect()
                }
            })
            .collect();
        prop_assert_eq!(&out, &want);
        let streamed = stream(&ckpt, std::slice::from_ref(&buf), chunk);
        prop_assert_eq!(&streamed[0], &want);
    }
}
