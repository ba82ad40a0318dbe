//! `.npy` files for `kern run --input/--output`, through the `npyz` crate. bf16 has no numpy
//! dtype: it is written as float32 by default, or as its raw 16-bit patterns (`<u2`) on request.

use crate::data::Values;
use crate::{Result, RuntimeError};
use kern_manifest::types::DType;
use npyz::WriterBuilder;
use std::path::Path;

/// An array read from a `.npy` file.
#[derive(Debug)]
pub struct Array {
    pub shape: Vec<u64>,
    /// The file's dtype string (`<f4`).
    pub descr: String,
    pub values: Values,
}

/// Reads a C-order `.npy` file of a numeric or boolean dtype.
pub fn read(path: &Path) -> Result<Array> {
    let file = path.display().to_string();
    let io = |e: std::io::Error| RuntimeError::Io { file: file.clone(), cause: e };
    let bytes = std::fs::read(path).map_err(io)?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| RuntimeError::Data(format!("{file}: not a readable .npy file: {e}")))?;
    if npy.order() == npyz::Order::Fortran {
        return Err(RuntimeError::Data(format!("{file}: Fortran-order arrays are not supported: save it with np.ascontiguousarray")));
    }
    let shape = npy.shape().to_vec();
    let descr = npy.dtype().descr().trim_matches(['\'', '"']).to_string();
    let bad = |e: std::io::Error| RuntimeError::Data(format!("{file}: cannot read the data: {e}"));
    let values = match descr.trim_start_matches(['<', '|', '=']) {
        "f2" => Values::F64(npy.into_vec::<half::f16>().map_err(bad)?.into_iter().map(f64::from).collect()),
        "f4" => Values::F64(npy.into_vec::<f32>().map_err(bad)?.into_iter().map(f64::from).collect()),
        "f8" => Values::F64(npy.into_vec::<f64>().map_err(bad)?),
        "i1" => Values::I64(npy.into_vec::<i8>().map_err(bad)?.into_iter().map(i64::from).collect()),
        "i2" => Values::I64(npy.into_vec::<i16>().map_err(bad)?.into_iter().map(i64::from).collect()),
        "i4" => Values::I64(npy.into_vec::<i32>().map_err(bad)?.into_iter().map(i64::from).collect()),
        "i8" => Values::I64(npy.into_vec::<i64>().map_err(bad)?),
        "u1" => Values::U64(npy.into_vec::<u8>().map_err(bad)?.into_iter().map(u64::from).collect()),
        "u2" => Values::U64(npy.into_vec::<u16>().map_err(bad)?.into_iter().map(u64::from).collect()),
        "u4" => Values::U64(npy.into_vec::<u32>().map_err(bad)?.into_iter().map(u64::from).collect()),
        "u8" => Values::U64(npy.into_vec::<u64>().map_err(bad)?),
        "b1" => Values::Bool(npy.into_vec::<bool>().map_err(bad)?),
        _ => {
            return Err(RuntimeError::Data(format!(
                "{file}: dtype {descr} is not supported (use a little-endian float, integer or bool array)"
            )))
        }
    };
    Ok(Array { shape, descr, values })
}

/// Writes `bytes` (elements of `dtype`) as a `.npy` file of `shape`. 16-bit and 8-bit floats are
/// widened to float32 unless `raw`, which writes their bit patterns as unsigned integers.
pub fn write(path: &Path, bytes: &[u8], dtype: DType, shape: &[u64], raw: bool) -> Result<()> {
    let file = path.display().to_string();
    let io = |e: std::io::Error| RuntimeError::Io { file: file.clone(), cause: e };
    // The directory too (`kern run --out-dir DIR` names one that may not exist yet).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    macro_rules! put {
        ($t:ty, $iter:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new().default_dtype().shape(shape).writer(f).begin_nd().map_err(io)?;
            w.extend($iter).map_err(io)?;
            w.finish().map_err(io)?;
        }};
    }
    if dtype.is_block() {
        // GGUF blocks (weights only) are opaque: their bytes, with the block's bytes as one
        // more dimension.
        let mut s = shape.to_vec();
        s.push(dtype.size());
        return write(path, bytes, DType::U8, &s, raw);
    }
    let w = dtype.size() as usize;
    let words = |bytes: &[u8]| -> Vec<u64> {
        bytes
            .chunks_exact(w)
            .map(|c| {
                let mut a = [0u8; 8];
                a[..w].copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect()
    };
    match dtype {
        DType::Bf16 | DType::F16 if raw => put!(u16, words(bytes).into_iter().map(|x| x as u16)),
        DType::F8e4m3 | DType::F8e5m2 if raw => put!(u8, bytes.iter().copied()),
        DType::Bf16 | DType::F16 | DType::F8e4m3 | DType::F8e5m2 | DType::F32 => {
            let Values::F64(v) = crate::data::decode(bytes, dtype) else { unreachable!("floats decode to F64") };
            put!(f32, v.into_iter().map(|x| x as f32))
        }
        DType::F64 => put!(f64, words(bytes).into_iter().map(f64::from_bits)),
        DType::I8 => put!(i8, bytes.iter().map(|&b| b as i8)),
        DType::U8 => put!(u8, bytes.iter().copied()),
        DType::I16 => put!(i16, words(bytes).into_iter().map(|x| x as u16 as i16)),
        DType::U16 => put!(u16, words(bytes).into_iter().map(|x| x as u16)),
        DType::I32 => put!(i32, words(bytes).into_iter().map(|x| x as u32 as i32)),
        DType::U32 => put!(u32, words(bytes).into_iter().map(|x| x as u32)),
        DType::I64 => put!(i64, words(bytes).into_iter().map(|x| x as i64)),
        DType::U64 => put!(u64, words(bytes).into_iter()),
        DType::Bool => put!(bool, bytes.iter().map(|&b| b != 0)),
        _ => unreachable!("block dtypes are written as bytes above"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{decode, encode};

    #[test]
    fn bf16_written_as_f32_and_raw() {
        let dir = std::env::temp_dir().join(format!("kern-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vals = Values::F64(vec![1.0, 2.0, -3.0, 0.5, 8.0, 9.0]);
        let bytes = encode(&vals, DType::Bf16).unwrap();
        let p = dir.join("a.npy");
        write(&p, &bytes, DType::Bf16, &[2, 3], false).unwrap();
        let a = read(&p).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.descr, "<f4");
        assert_eq!(a.values, vals);
        write(&p, &bytes, DType::Bf16, &[6], true).unwrap();
        let a = read(&p).unwrap();
        assert_eq!(a.descr, "<u2");
        assert_eq!(encode(&a.values, DType::U16).unwrap(), bytes);
        let ints = encode(&Values::I64(vec![-7, 5]), DType::I32).unwrap();
        write(&p, &ints, DType::I32, &[2], false).unwrap();
        assert_eq!(decode(&ints, DType::I32), read(&p).unwrap().values);
        std::fs::write(&p, b"not npy").unwrap();
        assert!(read(&p).unwrap_err().to_string().contains("not a readable .npy"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_directory_is_created() {
        let dir = std::env::temp_dir().join(format!("kern-npy-dir-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let p = dir.join("out").join("x.npy");
        let ints = encode(&Values::I64(vec![1, 2, 3]), DType::I32).unwrap();
        write(&p, &ints, DType::I32, &[3], false).unwrap();
        assert_eq!(read(&p).unwrap().values, Values::I64(vec![1, 2, 3]));
        // A file where the directory should be: a clear error naming the path.
        let blocked = dir.join("file");
        std::fs::write(&blocked, b"x").unwrap();
        let e = write(&blocked.join("y.npy"), &ints, DType::I32, &[3], false).unwrap_err().to_string();
        assert!(e.contains("y.npy"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
