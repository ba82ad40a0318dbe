//! Host arrays: typed values ↔ the raw little-endian bytes kernels read, dtype conversion, and
//! generated inputs (`random`, `range`) for `kern run`.

use kern_manifest::types::DType;

/// Host values of one element type, the form `.npy` files are read into and written from.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F64(Vec<f64>),
    I64(Vec<i64>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::F64(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::Bool(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Encodes `vals` as `dtype` bytes. Floats convert to any float dtype (rounding to nearest);
/// integers to any integer dtype they fit; anything else is an error naming both types.
pub fn encode(vals: &Values, dtype: DType) -> Result<Vec<u8>, String> {
    let n = vals.len();
    let mut out = Vec::with_capacity(n * dtype.size() as usize);
    let is_float = matches!(dtype, DType::Bf16 | DType::F16 | DType::F32 | DType::F64 | DType::F8e4m3 | DType::F8e5m2);
    match vals {
        Values::F64(v) if is_float => {
            for &x in v {
                put_float(&mut out, dtype, x);
            }
        }
        Values::I64(_) | Values::U64(_) if is_float => {
            // Small integers to floats are exact enough for test inputs; allow it.
            for i in 0..n {
                put_float(&mut out, dtype, int_at(vals, i) as f64);
            }
        }
        Values::I64(_) | Values::U64(_) => {
            for i in 0..n {
                put_int(&mut out, dtype, int_at(vals, i)).map_err(|e| format!("element {i}: {e}"))?;
            }
        }
        Values::Bool(v) if dtype == DType::Bool => out.extend(v.iter().map(|&b| u8::from(b))),
        Values::Bool(v) if !is_float => {
            for &b in v {
                put_int(&mut out, dtype, i128::from(b))?;
            }
        }
        _ => return Err(format!("cannot convert {} values to {}", vals_kind(vals), dtype.name())),
    }
    Ok(out)
}

fn vals_kind(v: &Values) -> &'static str {
    match v {
        Values::F64(_) => "floating-point",
        Values::I64(_) | Values::U64(_) => "integer",
        Values::Bool(_) => "boolean",
    }
}

fn int_at(v: &Values, i: usize) -> i128 {
    match v {
        Values::I64(x) => i128::from(x[i]),
        Values::U64(x) => i128::from(x[i]),
        Values::Bool(x) => i128::from(x[i]),
        Values::F64(x) => x[i] as i128,
    }
}

fn put_float(out: &mut Vec<u8>, dtype: DType, x: f64) {
    match dtype {
        DType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
        DType::F16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
        DType::F8e4m3 => out.push(f8_e4m3(x as f32)),
        DType::F8e5m2 => out.push((half::f16::from_f64(x).to_bits() >> 8) as u8),
        _ => unreachable!("float dtype"),
    }
}

/// f32 → fp8 e4m3fn, round to nearest even, saturating to ±448 (no infinities in e4m3fn).
fn f8_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(448.0);
    if a < 2f32.powi(-9) * 0.5 {
        return sign;
    }
    // Find the nearest representable value by search over the 127 codes (slow, exact).
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for code in 0u8..0x7f {
        let v = f8_e4m3_value(code);
        let err = (v - a).abs();
        if err < best_err || (err == best_err && code % 2 == 0) {
            best = code;
            best_err = err;
        }
    }
    sign | best
}

fn f8_e4m3_value(code: u8) -> f32 {
    let e = (code >> 3) & 0xf;
    let m = f32::from(code & 7);
    if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(i32::from(e) - 7)
    }
}

fn put_int(out: &mut Vec<u8>, dtype: DType, v: i128) -> Result<(), String> {
    let range = |lo: i128, hi: i128| {
        if v < lo || v > hi {
            Err(format!("{v} does not fit in {}", dtype.name()))
        } else {
            Ok(())
        }
    };
    match dtype {
        DType::I8 => range(i8::MIN.into(), i8::MAX.into()).map(|_| out.push(v as i8 as u8)),
        DType::U8 => range(0, u8::MAX.into()).map(|_| out.push(v as u8)),
        DType::I16 => range(i16::MIN.into(), i16::MAX.into()).map(|_| out.extend_from_slice(&(v as i16).to_le_bytes())),
        DType::U16 => range(0, u16::MAX.into()).map(|_| out.extend_from_slice(&(v as u16).to_le_bytes())),
        DType::I32 => range(i32::MIN.into(), i32::MAX.into()).map(|_| out.extend_from_slice(&(v as i32).to_le_bytes())),
        DType::U32 => range(0, u32::MAX.into()).map(|_| out.extend_from_slice(&(v as u32).to_le_bytes())),
        DType::I64 => range(i64::MIN.into(), i64::MAX.into()).map(|_| out.extend_from_slice(&(v as i64).to_le_bytes())),
        DType::U64 => range(0, u64::MAX.into()).map(|_| out.extend_from_slice(&(v as u64).to_le_bytes())),
        DType::Bool => range(0, 1).map(|_| out.push(v as u8)),
        _ => Err(format!("{} is not an integer type", dtype.name())),
    }
}

/// Decodes `dtype` bytes to host values (16-bit and 8-bit floats widen to f64).
pub fn decode(bytes: &[u8], dtype: DType) -> Values {
    let w = dtype.size() as usize;
    let chunks = bytes.chunks_exact(w);
    let le = |c: &[u8]| {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(a)
    };
    match dtype {
        DType::Bf16 => Values::F64(chunks.map(|c| half::bf16::from_bits(le(c) as u16).to_f64()).collect()),
        DType::F16 => Values::F64(chunks.map(|c| half::f16::from_bits(le(c) as u16).to_f64()).collect()),
        DType::F32 => Values::F64(chunks.map(|c| f64::from(f32::from_bits(le(c) as u32))).collect()),
        DType::F64 => Values::F64(chunks.map(|c| f64::from_bits(le(c))).collect()),
        DType::F8e4m3 => Values::F64(
            chunks
                .map(|c| {
                    let s = if c[0] & 0x80 != 0 { -1.0 } else { 1.0 };
                    if c[0] & 0x7f == 0x7f {
                        f64::NAN
                    } else {
                        s * f64::from(f8_e4m3_value(c[0] & 0x7f))
                    }
                })
                .collect(),
        ),
        DType::F8e5m2 => Values::F64(chunks.map(|c| half::f16::from_bits(u16::from(c[0]) << 8).to_f64()).collect()),
        DType::I8 => Values::I64(chunks.map(|c| i64::from(c[0] as i8)).collect()),
        DType::I16 => Values::I64(chunks.map(|c| i64::from(le(c) as u16 as i16)).collect()),
        DType::I32 => Values::I64(chunks.map(|c| i64::from(le(c) as u32 as i32)).collect()),
        DType::I64 => Values::I64(chunks.map(|c| le(c) as i64).collect()),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => Values::U64(chunks.map(le).collect()),
        DType::Bool => Values::Bool(chunks.map(|c| c[0] != 0).collect()),
        // GGUF blocks (weights only) are opaque: their bytes.
        _ => Values::U64(bytes.iter().map(|&b| u64::from(b)).collect()),
    }
}

/// Generated contents for `kern run --input BUF=random|range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generated {
    /// Floats uniform in [-1, 1); integers uniform in [0, 64); seeded.
    Random { seed: u64 },
    /// 0, 1, 2, … in the buffer's dtype.
    Range,
}

pub fn generate(g: Generated, n: usize, dtype: DType) -> Values {
    let is_float = matches!(dtype, DType::Bf16 | DType::F16 | DType::F32 | DType::F64 | DType::F8e4m3 | DType::F8e5m2);
    match g {
        Generated::Range if is_float => Values::F64((0..n).map(|i| i as f64).collect()),
        Generated::Range if dtype == DType::Bool => Values::Bool((0..n).map(|i| i % 2 == 1).collect()),
        Generated::Range => Values::I64((0..n).map(|i| i as i64).collect()),
        Generated::Random { seed } => {
            let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
            let mut next = move || {
                // splitmix64
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            };
            if is_float {
                Values::F64((0..n).map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0).collect())
            } else if dtype == DType::Bool {
                Values::Bool((0..n).map(|_| next() & 1 == 1).collect())
            } else {
                Values::I64((0..n).map(|_| (next() % 64) as i64).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let v = Values::F64(vec![1.0, -2.5, 0.1]);
        let b = encode(&v, DType::Bf16).unwrap();
        assert_eq!(b.len(), 6);
        let back = decode(&b, DType::Bf16);
        let Values::F64(x) = back else { panic!() };
        assert_eq!(x[0], 1.0);
        assert_eq!(x[1], -2.5);
        assert!((x[2] - 0.1).abs() < 1e-3 && x[2] != 0.1);
        let ints = Values::I64(vec![-1, 300]);
        assert!(encode(&ints, DType::U8).unwrap_err().contains("-1 does not fit in u8"));
        assert_eq!(decode(&encode(&ints, DType::I32).unwrap(), DType::I32), ints);
        assert!(encode(&Values::F64(vec![1.5]), DType::I32).is_err());
        assert_eq!(decode(&encode(&Values::F64(vec![448.0, -0.5]), DType::F8e4m3).unwrap(), DType::F8e4m3), Values::F64(vec![448.0, -0.5]));
    }

    #[test]
    fn generated_is_seeded() {
        let a = generate(Generated::Random { seed: 1 }, 100, DType::F32);
        assert_eq!(a, generate(Generated::Random { seed: 1 }, 100, DType::F32));
        assert_ne!(a, generate(Generated::Random { seed: 2 }, 100, DType::F32));
        let Values::F64(x) = a else { panic!() };
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_eq!(generate(Generated::Range, 3, DType::I32), Values::I64(vec![0, 1, 2]));
    }
}
