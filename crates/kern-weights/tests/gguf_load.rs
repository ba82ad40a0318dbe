//! GGUF tensors served to the manifest weight sources: a directory holding one `.gguf` opens as
//! a checkpoint; block tensors are dequantized into bf16/f32 buffers through `materialize` and
//! `LoadPlan::stream` alike (at any chunk size, across concatenations); a tensor already in the
//! buffer's dtype is copied; shapes are GGUF dims reversed.

mod common;
use common::W;
use half::bf16;
use kern_manifest::{DType, Expr, WeightSource};
use kern_weights::{check, materialize, Checkpoint, LoadPlan};
use common::weight;

fn q8_blocks(n: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![];
    for b in 0..n {
        v.extend_from_slice(&half::f16::from_f32(0.25 * (b + 1) as f32).to_le_bytes());
        v.extend((0..32).map(|i| (i as u8).wrapping_mul(seed).wrapping_add(b as u8)));
    }
    v
}

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut w = W::new();
    let norm: Vec<u8> = (0..64).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    let f16s: Vec<u8> = (0..64).flat_map(|i| half::f16::from_f32(i as f32 / 3.0).to_le_bytes()).collect();
    w.tensor("a", &[64, 2], 8, q8_blocks(4, 3)) // [2, 64] Q8_0
        .tensor("b", &[64, 3], 8, q8_blocks(6, 5)) // [3, 64]
        .tensor("c", &[32, 2], 8, q8_blocks(2, 7)) // [2, 32]
        .tensor("norm", &[64], 0, norm)
        .tensor("h", &[64], 1, f16s);
    std::fs::write(dir.path().join("model.gguf"), w.bytes()).unwrap();
    dir
}

fn f32_of(ckpt: &Checkpoint, name: &str) -> Vec<f32> {
    ckpt.read_as(name, DType::F32).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect()
}

#[test]
fn a_directory_with_one_gguf_serves_every_source() {
    let dir = model_dir();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), "gguf");
    assert_eq!(ckpt.tensor("b").unwrap().shape, [3, 64]);
    let (a, b, c) = (f32_of(&ckpt, "a"), f32_of(&ckpt, "b"), f32_of(&ckpt, "c"));
    assert_eq!(a[0], 0.0);
    assert_eq!(a[33], 0.5 * 4.0, "block 1 (d = 0.5), element 1: q = 1·3 + 1");

    let buffers = vec![
        weight("a", DType::Bf16, &[2, 64], None),
        weight("ab", DType::Bf16, &[5, 64], Some(WeightSource::Concat { tensors: vec!["a".into(), "b".into()], axis: 0, sizes: None })),
        weight("ac", DType::F32, &[2, 96], Some(WeightSource::Concat { tensors: vec!["a".into(), "c".into()], axis: 1, sizes: None })),
        weight("norm", DType::F32, &[64], None),
        weight("norm16", DType::Bf16, &[64], Some(WeightSource::Tensor("norm".into()))),
        weight("h", DType::Bf16, &[64], None),
    ];
    assert!(check(&ckpt, &buffers).is_empty());

    let mut ac = vec![];
    for r in 0..2 {
        ac.extend_from_slice(&a[64 * r..64 * r + 64]);
        ac.extend_from_slice(&c[32 * r..32 * r + 32]);
    }
    let want: Vec<Vec<u8>> = vec![
        bf16_bytes(&a),
        bf16_bytes(&[a.clone(), b.clone()].concat()),
        ac.iter().flat_map(|x| x.to_le_bytes()).collect(),
        (0..64).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect(),
        bf16_bytes(&(0..64).map(|i| i as f32 * 0.5).collect::<Vec<_>>()),
        bf16_bytes(&(0..64).map(|i| half::f16::from_f32(i as f32 / 3.0).to_f32()).collect::<Vec<_>>()),
    ];
    for (b, w) in buffers.iter().zip(&want) {
        let mut out = vec![0u8; b.bytes_at_max as usize];
        materialize(&ckpt, b, &mut out).unwrap();
        assert!(out == *w, "materialize {}", b.name);
    }
    for chunk in [8, 10, 34, 64, 100, 1000, 1 << 20] {
        let plan = LoadPlan::new(&ckpt, &buffers).unwrap().with_chunk_bytes(chunk);
        let mut got: Vec<Vec<u8>> = vec![vec![]; buffers.len()];
        plan.stream(
            |c| -> Result<(), kern_weights::WeightsError> {
                assert!(c.bytes.len() <= chunk.max(8));
                let g = &mut got[c.buffer.0];
                assert_eq!(c.offset as usize, g.len());
                g.extend_from_slice(c.bytes);
                Ok(())
            },
            |_| {},
        )
        .unwrap();
        for ((b, w), g) in buffers.iter().zip(&want).zip(&got) {
            assert!(g == w, "stream at chunk {chunk}: {}", b.name);
        }
    }
}

#[test]
fn three_d_concatenation_and_integer_buffers() {
    // Every GGUF row (ne[0]) is whole blocks, so any concatenation axis takes whole blocks.
    let mut w = W::new();
    w.tensor("x", &[32, 2, 2], 8, q8_blocks(4, 1)).tensor("y", &[32, 1, 2], 8, q8_blocks(2, 2));
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("m.gguf"), w.bytes()).unwrap();
    let c = Checkpoint::open(&d.path().join("m.gguf")).unwrap();
    let xy = weight("xy", DType::F32, &[2, 3, 32], Some(WeightSource::Concat { tensors: vec!["x".into(), "y".into()], axis: 1, sizes: None }));
    let mut out = vec![0u8; xy.bytes_at_max as usize];
    materialize(&c, &xy, &mut out).unwrap();
    let (x, y) = (f32_of(&c, "x"), f32_of(&c, "y"));
    let want: Vec<f32> = [&x[0..64], &y[0..32], &x[64..128], &y[32..64]].concat();
    assert!(out == want.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());

    let dir = model_dir();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let int = weight("a", DType::I32, &[2, 64], None);
    let p = check(&ckpt, std::slice::from_ref(&int));
    assert_eq!(p.len(), 1);
    assert!(p[0].to_string().contains("Q8_0"), "{}", p[0]);
}

/// Issue 17: shards of GGUF block tensors. A cut at block boundaries dequantizes each rank's
/// blocks (equal to slicing the dequantized tensor); a cut inside a block is a clear error.
#[test]
fn shards_of_block_tensors_take_whole_blocks() {
    use kern_manifest::Shard;
    let dir = model_dir();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let a = f32_of(&ckpt, "a"); // [2, 64]: two Q8_0 blocks of 32 per row
    let shard = |dim, parts| Shard { dim, parts, part: Expr::parse("rank", |n| (n == "rank").then_some(0)).unwrap() };
    let cut = |shape: &[i64], dim, parts| {
        weight("a_r", DType::F32, shape, Some(WeightSource::Shard { of: Box::new(WeightSource::Tensor("a".into())), shard: shard(dim, parts) }))
    };
    let cols = cut(&[2, 32], 1, 2);
    let rows = cut(&[1, 64], 0, 2);
    for rank in 0..2u32 {
        let r = rank as usize;
        let mut out = vec![0u8; cols.bytes_at_max as usize];
        kern_weights::materialize_rank(&ckpt, &cols, rank, &mut out).unwrap();
        let want: Vec<f32> = (0..2).flat_map(|row| a[64 * row + 32 * r..64 * row + 32 * r + 32].to_vec()).collect();
        assert!(out == want.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(), "columns, rank {rank}");
        let mut out = vec![0u8; rows.bytes_at_max as usize];
        kern_weights::materialize_rank(&ckpt, &rows, rank, &mut out).unwrap();
        assert!(out == a[64 * r..64 * r + 64].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(), "rows, rank {rank}");
    }
    // 16 columns per rank cut every block in half.
    let p = kern_weights::check_rank(&ckpt, &[cut(&[2, 16], 1, 4)], 1);
    assert_eq!(p.len(), 1, "{p:?}");
    let text = p[0].to_string();
    assert!(text.contains("checkpoint tensor `a` is Q8_0 in blocks of 32 elements, which a shard along axis 1 would cut"), "{text}");
}
