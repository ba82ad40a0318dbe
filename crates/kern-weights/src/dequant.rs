//! Dequantization of ggml block types to f32, bit-exact with the `gguf` Python package's
//! `gguf.quants.dequantize` (0.19.0), and from there to bf16/f16 with one round to nearest
//! even. CI checks the bit-exactness on generated blocks of every type
//! (`scripts/gen-gguf-quants.py`, `tests/gguf_exact.rs`).
//!
//! Each formula evaluates the same f32 operations in the same order as gguf-py (which is
//! ggml's `dequantize_row_*`): f16 scales widened exactly to f32, `(d·scale)·q`, then one
//! final `+ m` or `− dmin·m`. No FMA is used (Rust never contracts `a*b+c`), so the only
//! rounding is the one gguf-py does too. Block layouts: shared/notes/gguf.md §2.
//!
//! Large inputs are split over threads ([`dequantize_into`]); each thread works block by
//! block with a stack buffer, so no f32 copy of a tensor is ever made.

use crate::gguf::GgmlType;
use half::{bf16, f16};
use kern_manifest::DType;

/// The types kern dequantizes, by ggml name.
pub const DEQUANTIZED: &[&str] = &["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"];

/// Below this many blocks one thread does the work (thread start-up would cost more).
const PARALLEL_MIN_BYTES: usize = 1 << 20;

type BlockFn = fn(&[u8], &mut [f32]);

fn block_fn(ty: GgmlType) -> Option<BlockFn> {
    Some(match ty.name {
        "F32" => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        "F16" => |b, o| o[0] = half(b, 0),
        "BF16" => |b, o| o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
        "Q8_0" => q8_0,
        "Q4_0" => q4_0,
        "Q4_1" => q4_1,
        "Q5_0" => q5_0,
        "Q5_1" => q5_1,
        "Q2_K" => q2_k,
        "Q3_K" => q3_k,
        "Q4_K" => q4_k,
        "Q5_K" => q5_k,
        "Q6_K" => q6_k,
        _ => return None,
    })
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// IEEE half → f32, exactly as numpy's `astype(np.float32)` does it: every finite value and
/// infinity exactly, and a NaN keeps its payload *and* its quiet bit (a signaling NaN stays
/// signaling, where the `half` crate and the F16C instruction quiet it). gguf-py widens every
/// f16 scale this way, so the NaN a block with a NaN scale produces has the same bits.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    if h & 0x7c00 == 0x7c00 && h & 0x03ff != 0 {
        return f32::from_bits((u32::from(h & 0x8000) << 16) | 0x7f80_0000 | (u32::from(h & 0x03ff) << 13));
    }
    f16::from_bits(h).to_f32()
}

fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    for (x, &q) in o[..32].iter_mut().zip(&b[2..34]) {
        *x = f32::from(q as i8) * d;
    }
}

fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        o[j] = d * f32::from((qs[j] & 15) as i8 - 8);
        o[j + 16] = d * f32::from((qs[j] >> 4) as i8 - 8);
    }
}

fn q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        o[j] = d * f32::from(qs[j] & 15) + m;
        o[j + 16] = d * f32::from(qs[j] >> 4) + m;
    }
}

fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 15) | (((qh >> j) & 1) as u8) << 4;
        let hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        o[j] = d * f32::from(lo as i8 - 16);
        o[j + 16] = d * f32::from(hi as i8 - 16);
    }
}

fn q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 15) | (((qh >> j) & 1) as u8) << 4;
        let hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        o[j] = d * f32::from(lo) + m;
        o[j + 16] = d * f32::from(hi) + m;
    }
}

fn q2_k(b: &[u8], o: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (half(b, 80), half(b, 82));
    for (g, &c) in scales.iter().enumerate() {
        let dl = d * f32::from(c & 15);
        let ml = dmin * f32::from(c >> 4);
        // Group g holds elements 16g..16g+16: n = g/8 (128-element half), s = (g%8)/2
        // (2-bit plane), l = 16·(g%2) + i.
        let (n, s) = (g / 8, (g % 8) / 2);
        for i in 0..16 {
            let l = 16 * (g % 2) + i;
            let q = (qs[32 * n + l] >> (2 * s)) & 3;
            o[16 * g + i] = dl * f32::from(q) - ml;
        }
    }
}

fn q3_k(b: &[u8], o: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sb = &b[96..108];
    let d = half(b, 108);
    for g in 0..16 {
        let lo = if g < 8 { sb[g] & 15 } else { sb[g - 8] >> 4 };
        let hi = (sb[8 + g % 4] >> (2 * (g / 4))) & 3;
        let sc = (lo | hi << 4) as i8 - 32;
        let dl = d * f32::from(sc);
        let (n, s) = (g / 8, (g % 8) / 2);
        for i in 0..16 {
            let l = 16 * (g % 2) + i;
            let q = ((qs[32 * n + l] >> (2 * s)) & 3) as i8;
            let h = (hmask[l] >> (4 * n + s)) & 1;
            let q = q - if h == 0 { 4 } else { 0 };
            o[16 * g + i] = dl * f32::from(q);
        }
    }
}

/// The 6-bit scale and min of sub-block `k` (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(s: &[u8], k: usize) -> (u8, u8) {
    if k < 4 {
        (s[k] & 63, s[k + 4] & 63)
    } else {
        ((s[k + 4] & 15) | (s[k - 4] >> 6) << 4, (s[k + 4] >> 4) | (s[k] >> 6) << 4)
    }
}

fn q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for k in 0..8 {
        let (sc, m) = scale_min_k4(scales, k);
        let dl = d * f32::from(sc);
        let ml = dmin * f32::from(m);
        let bytes = &qs[32 * (k / 2)..32 * (k / 2) + 32];
        let shift = 4 * (k % 2);
        for (l, &q) in bytes.iter().enumerate() {
            o[32 * k + l] = dl * f32::from((q >> shift) & 15) - ml;
        }
    }
}

fn q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for k in 0..8 {
        let (sc, m) = scale_min_k4(scales, k);
        let dl = d * f32::from(sc);
        let ml = dmin * f32::from(m);
        let bytes = &qs[32 * (k / 2)..32 * (k / 2) + 32];
        let shift = 4 * (k % 2);
        for l in 0..32 {
            let q = ((bytes[l] >> shift) & 15) | ((qh[l] >> k) & 1) << 4;
            o[32 * k + l] = dl * f32::from(q) - ml;
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = half(b, 208);
    for g in 0..16 {
        let dl = d * f32::from(scales[g] as i8);
        // Group g: n = g/8, t = (g%8)/2 (which 32-element quarter), l = 16·(g%2) + i.
        let (n, t) = (g / 8, (g % 8) / 2);
        for i in 0..16 {
            let l = 16 * (g % 2) + i;
            let low = ql[64 * n + 32 * (t % 2) + l];
            let low4 = if t < 2 { low & 15 } else { low >> 4 };
            let hi2 = (qh[32 * n + l] >> (2 * t)) & 3;
            let q = (low4 | hi2 << 4) as i8 - 32;
            o[16 * g + i] = dl * f32::from(q);
        }
    }
}

/// Why a tensor cannot be dequantized.
pub fn unsupported(ty: GgmlType) -> String {
    format!("kern cannot dequantize ggml type {ty} (it dequantizes {})", DEQUANTIZED.join(", "))
}

/// Dequantizes whole blocks of `ty` from `src` into `out` (one f32 per element), on the calling
/// thread.
///
/// # Panics
/// When `ty` is not dequantizable or the lengths disagree (callers check both).
pub fn dequantize_f32(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let f = block_fn(ty).unwrap_or_else(|| panic!("{}", unsupported(ty)));
    let (be, bb) = (ty.block_elems as usize, ty.block_bytes as usize);
    assert_eq!(src.len() % bb, 0, "partial {ty} block");
    assert_eq!(out.len(), src.len() / bb * be, "element counts differ");
    for (b, o) in src.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        f(b, o);
    }
}

/// Dequantizes whole blocks of `ty` from `src` straight into `dst` in dtype `to` (bf16, f16,
/// f32 or f64; little-endian), rounding f32 to nearest even for the 16-bit types. Splits the
/// work over the machine's cores when it is large.
///
/// # Panics
/// When `ty` is not dequantizable, `to` is not a float type, or the lengths disagree.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [u8], to: DType) {
    let (be, bb) = (ty.block_elems as usize, ty.block_bytes as usize);
    let out_size = to.size() as usize;
    assert!(matches!(to, DType::Bf16 | DType::F16 | DType::F32 | DType::F64), "dequantize to {}", to.name());
    assert_eq!(src.len() % bb, 0, "partial {ty} block");
    let blocks = src.len() / bb;
    assert_eq!(dst.len(), blocks * be * out_size, "element counts differ");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads <= 1 || src.len() < PARALLEL_MIN_BYTES {
        return dequantize_serial(ty, src, dst, to);
    }
    let per = blocks.div_ceil(threads);
    std::thread::scope(|s| {
        for (sc, dc) in src.chunks(per * bb).zip(dst.chunks_mut(per * be * out_size)) {
            s.spawn(move || dequantize_serial(ty, sc, dc, to));
        }
    });
}

fn dequantize_serial(ty: GgmlType, src: &[u8], dst: &mut [u8], to: DType) {
    let f = block_fn(ty).unwrap_or_else(|| panic!("{}", unsupported(ty)));
    let (be, bb) = (ty.block_elems as usize, ty.block_bytes as usize);
    let out_size = to.size() as usize;
    // Several blocks per step so that plain types (one element per "block") stay fast.
    let per = (256 / be).max(1);
    let mut tmp = [0f32; 256];
    for (sb, db) in src.chunks(per * bb).zip(dst.chunks_mut(per * be * out_size)) {
        let n = sb.len() / bb * be;
        for (b, o) in sb.chunks_exact(bb).zip(tmp[..n].chunks_exact_mut(be)) {
            f(b, o);
        }
        write(&tmp[..n], db, to);
    }
}

fn write(vals: &[f32], dst: &mut [u8], to: DType) {
    match to {
        DType::Bf16 => {
            for (v, d) in vals.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, d) in vals.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        DType::F32 => {
            for (v, d) in vals.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F64 => {
            for (v, d) in vals.iter().zip(dst.chunks_exact_mut(8)) {
                d.copy_from_slice(&f64::from(*v).to_le_bytes());
            }
        }
        _ => unreachable!("checked by dequantize_into"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(name: &str) -> GgmlType {
        GgmlType::by_name(name).unwrap()
    }

    fn deq(name: &str, block: &[u8]) -> Vec<f32> {
        let t = ty(name);
        let mut out = vec![0f32; block.len() / t.block_bytes as usize * t.block_elems as usize];
        dequantize_f32(t, block, &mut out);
        out
    }

    #[test]
    fn q8_0_by_hand() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for i in 0..32 {
            b[2 + i] = (i as i8 - 16) as u8;
        }
        let x = deq("Q8_0", &b);
        assert_eq!(x[0], -8.0);
        assert_eq!(x[31], 7.5);
    }

    #[test]
    fn q4_0_low_nibbles_first_half() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        b[2] = 0xF0; // element 0: nibble 0 → -8; element 16: nibble 15 → 7
        let x = deq("Q4_0", &b);
        assert_eq!((x[0], x[16], x[1]), (-16.0, 14.0, -16.0));
    }

    #[test]
    fn q6_k_layout() {
        // All-zero low/high bits give q = -32 everywhere; scale k for group k.
        let mut b = vec![0u8; 210];
        for g in 0..16 {
            b[192 + g] = g as u8;
        }
        b[208..210].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        let x = deq("Q6_K", &b);
        for (e, v) in x.iter().enumerate() {
            assert_eq!(*v, -32.0 * (e / 16) as f32, "element {e}");
        }
    }

    #[test]
    fn parallel_equals_serial() {
        let t = ty("Q4_K");
        let src: Vec<u8> = (0..(PARALLEL_MIN_BYTES / 144 + 7) * 144).map(|i| (i * 7919 % 251) as u8).collect();
        let n = src.len() / 144 * 256;
        let mut a = vec![0u8; n * 2];
        let mut b = vec![0u8; n * 2];
        dequantize_into(t, &src, &mut a, DType::Bf16);
        dequantize_serial(t, &src, &mut b, DType::Bf16);
        assert!(a == b);
    }

    #[test]
    fn f16_nan_keeps_its_bits_like_numpy() {
        // Values printed by numpy 2.4: np.array([..], np.uint16).view(np.float16).astype(np.float32)
        let cases = [(0x7c01u16, 0x7f80_2000u32), (0xfc01, 0xff80_2000), (0x7e00, 0x7fc0_0000), (0x7d55, 0x7faa_a000), (0x0001, 0x3380_0000), (0x8001, 0xb380_0000), (0x7c00, 0x7f80_0000)];
        for (h, f) in cases {
            assert_eq!(f16_to_f32(h).to_bits(), f, "{h:#x}");
        }
    }

    #[test]
    fn every_listed_type_has_a_formula() {
        for n in DEQUANTIZED {
            assert!(block_fn(ty(n)).is_some(), "{n}");
            assert!(ty(n).dequantizable());
        }
        assert!(!ty("IQ2_XXS").dequantizable());
        assert!(unsupported(ty("IQ2_XXS")).contains("IQ2_XXS"));
    }
}
