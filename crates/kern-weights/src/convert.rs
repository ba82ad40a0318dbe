//! Element-wise dtype conversion between the floating-point types a checkpoint stores and the
//! ones a manifest declares: bf16, f16, f32 and f64, rounding to nearest even (the `half`
//! crate's conversions, which keep NaN a NaN and turn out-of-range values into infinities).
//! Every other dtype must match the manifest's exactly: kern does not guess what an integer
//! or FP8 tensor in another type means. GGUF block dtypes (`q4_k`, …) are copied as they are,
//! one block per element.

use half::{bf16, f16};
use kern_manifest::DType;

/// Whether [`convert`] turns `from` into `to`.
pub fn convertible(from: DType, to: DType) -> bool {
    from == to || (is_float(from) && is_float(to))
}

/// What a checkpoint tensor's bytes are: elements of a plain dtype, or ggml blocks that are
/// dequantized (through f32) when loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Plain(DType),
    Blocks(crate::gguf::GgmlType),
}

impl Source {
    /// Bytes of the smallest unit that converts on its own (an element or a block).
    pub fn unit_bytes(self) -> usize {
        match self {
            Source::Plain(d) => d.size() as usize,
            Source::Blocks(t) => t.block_bytes as usize,
        }
    }

    /// Elements in that unit.
    pub fn unit_elems(self) -> usize {
        match self {
            Source::Plain(_) => 1,
            Source::Blocks(t) => t.block_elems as usize,
        }
    }

    /// Bytes of `elems` elements, when that is a whole number of units.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        match self {
            Source::Plain(d) => elems.checked_mul(d.size()),
            Source::Blocks(t) => t.bytes_for(elems),
        }
    }
}

/// Converts whole units of `src` into `dst` (dtype `to`): [`convert`] for plain elements,
/// [`crate::dequant::dequantize_into`] for blocks.
pub(crate) fn convert_source(src: &[u8], from: Source, dst: &mut [u8], to: DType) {
    match from {
        Source::Plain(d) => convert(src, d, dst, to),
        Source::Blocks(t) => crate::dequant::dequantize_into(t, src, dst, to),
    }
}

pub(crate) fn is_float(d: DType) -> bool {
    matches!(d, DType::Bf16 | DType::F16 | DType::F32 | DType::F64)
}

/// Converts the little-endian elements of `src` (of dtype `from`) into `dst` (of dtype `to`).
///
/// # Panics
/// When `convertible(from, to)` is false or the slices hold different element counts (the
/// callers check both before).
pub fn convert(src: &[u8], from: DType, dst: &mut [u8], to: DType) {
    assert!(
        convertible(from, to),
        "no conversion from {} to {}",
        from.name(),
        to.name()
    );
    let n = src.len() / from.size() as usize;
    assert_eq!(
        src.len() % from.size() as usize,
        0,
        "partial source element"
    );
    assert_eq!(dst.len(), n * to.size() as usize, "element counts differ");
    if from == to {
        dst.copy_from_slice(src);
        return;
    }
    // Every bf16, f16 and f32 value is exactly an f32, so those go through f32 with one
    // rounding at the end; f64 sources round once, straight to the target.
    match (from, to) {
        (DType::F64, DType::F32) => {
            map::<8, 4>(src, dst, |b| (f64::from_le_bytes(b) as f32).to_le_bytes())
        }
        (DType::F64, DType::F16) => map::<8, 2>(src, dst, |b| {
            f16::from_f64(f64::from_le_bytes(b)).to_le_bytes()
        }),
        (DType::F64, DType::Bf16) => map::<8, 2>(src, dst, |b| {
            bf16::from_f64(f64::from_le_bytes(b)).to_le_bytes()
        }),
        (DType::Bf16, to) => from_f32::<2>(src, dst, to, |b| bf16::from_le_bytes(b).to_f32()),
        (DType::F16, to) => from_f32::<2>(src, dst, to, |b| f16::from_le_bytes(b).to_f32()),
        (DType::F32, to) => from_f32::<4>(src, dst, to, f32::from_le_bytes),
        _ => unreachable!("convertible() admitted {} → {}", from.name(), to.name()),
    }
}

fn from_f32<const A: usize>(src: &[u8], dst: &mut [u8], to: DType, read: impl Fn([u8; A]) -> f32) {
    match to {
        DType::Bf16 => map::<A, 2>(src, dst, |b| bf16::from_f32(read(b)).to_le_bytes()),
        DType::F16 => map::<A, 2>(src, dst, |b| f16::from_f32(read(b)).to_le_bytes()),
        DType::F32 => map::<A, 4>(src, dst, |b| read(b).to_le_bytes()),
        DType::F64 => map::<A, 8>(src, dst, |b| f64::from(read(b)).to_le_bytes()),
        _ => unreachable!("not a float target: {}", to.name()),
    }
}

fn map<const A: usize, const B: usize>(src: &[u8], dst: &mut [u8], f: impl Fn([u8; A]) -> [u8; B]) {
    for (s, d) in src.chunks_exact(A).zip(dst.chunks_exact_mut(B)) {
        d.copy_from_slice(&f(s.try_into().expect("A bytes")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to the even
        // mantissa (1). 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to 1 + 2^-6.
        // Just above a halfway point rounds up.
        let src = f32s(&[
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            1.0 + 2f32.powi(-8) + 2f32.powi(-20),
        ]);
        let mut dst = vec![0u8; 6];
        convert(&src, DType::F32, &mut dst, DType::Bf16);
        let got: Vec<u16> = dst
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![0x3f80, 0x3f82, 0x3f81]);
    }

    #[test]
    fn specials_survive() {
        let src = f32s(&[f32::INFINITY, -0.0, f32::NAN, 1e6]);
        let mut dst = vec![0u8; 8];
        convert(&src, DType::F32, &mut dst, DType::F16);
        let got: Vec<f16> = dst
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got[0], f16::INFINITY);
        assert!(got[1].is_sign_negative() && got[1] == f16::ZERO);
        assert!(got[2].is_nan());
        assert_eq!(got[3], f16::INFINITY, "above f16's range becomes infinity");
    }

    #[test]
    fn only_floats_convert() {
        assert!(convertible(DType::I32, DType::I32));
        assert!(!convertible(DType::I32, DType::F32));
        assert!(!convertible(DType::F8e4m3, DType::Bf16));
        assert!(convertible(DType::F64, DType::Bf16));
    }
}
