//! Writing GGUF v3 files: metadata entries and tensors, laid out as [`crate::gguf`] reads them
//! (tensor data at offsets aligned to 32 bytes, the default `general.alignment`). kern reads
//! GGUF; this writer exists so tests across the workspace build small, exact files instead of
//! each carrying its own byte layout.

/// GGUF metadata value types (the subset a writer needs names for).
pub mod ty {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
}

/// A GGUF v3 file being built: `kv` metadata and `tensor`s, then [`Writer::bytes`].
#[derive(Clone, Debug, Default)]
pub struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

/// A GGUF string: u64 length, then the bytes.
pub fn string(v: &str) -> Vec<u8> {
    let mut out = (v.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(v.as_bytes());
    out
}

const ALIGN: usize = 32;

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// A metadata entry: `key`, its GGUF value type id and the value's encoded bytes.
    pub fn kv(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        self.kv.extend_from_slice(&string(key));
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.kv.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    /// A tensor: `name`, GGUF dimensions (innermost first), GGML type id and its data.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut off = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            b.extend_from_slice(&string(name));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
            off += (data.len() as u64).div_ceil(ALIGN as u64) * ALIGN as u64;
        }
        b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
        for (_, _, _, data) in &self.tensors {
            b.extend_from_slice(data);
            b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_it_writes_reads_back() {
        let mut w = Writer::new();
        w.kv("general.name", ty::STRING, &string("tiny")).kv("x.n", ty::U32, &7u32.to_le_bytes());
        w.tensor("a", &[3], 0, [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect());
        w.tensor("b", &[2, 1], 0, [4.0f32, 5.0].iter().flat_map(|x| x.to_le_bytes()).collect());
        let bytes = w.bytes();
        let g = crate::gguf::parse(&bytes, std::path::Path::new("w.gguf")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.tensors.len(), 2);
        assert_eq!(g.metadata.len(), 2);
        let b = g.tensors.iter().find(|t| t.name == "b").unwrap();
        assert_eq!(b.offset % 32, 0);
    }
}
