//! A small GGUF writer shared by the GGUF tests.
#![allow(dead_code)]

/// A small GGUF writer for the tests: v3, metadata, tensors padded to the alignment.
pub struct W {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    align: u64,
}

pub fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(v.as_bytes());
}

impl W {
    pub fn new() -> W {
        W { kv: vec![], n_kv: 0, tensors: vec![], align: 32 }
    }
    pub fn kv(&mut self, key: &str, ty: u32, val: &[u8]) -> &mut Self {
        s(&mut self.kv, key);
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.kv.extend_from_slice(val);
        self.n_kv += 1;
        self
    }
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut off = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            s(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
            off += (data.len() as u64).div_ceil(self.align) * self.align;
        }
        b.resize((b.len() as u64).div_ceil(self.align) as usize * self.align as usize, 0);
        for (_, _, _, data) in &self.tensors {
            b.extend_from_slice(data);
            b.resize((b.len() as u64).div_ceil(self.align) as usize * self.align as usize, 0);
        }
        b
    }
}

