//! `.nv.info` records: the per-kernel metadata of a cubin (parameter layout, block-size
//! limits, register counts). NVIDIA documents no layout; this follows the readers listed in
//! `shared/notes/binary-formats.md` and is golden-tested against `cuobjdump -elf`.
//!
//! A section is a sequence of records: `u8 format, u8 attribute`, then for format 4 (SVAL) a
//! `u16` payload length and the payload; for every other format a `u16` value (4 bytes in all).

use crate::error::{Ctx, LeBytes};
use crate::Result;

pub const FMT_NVAL: u8 = 1;
pub const FMT_BVAL: u8 = 2;
pub const FMT_HVAL: u8 = 3;
pub const FMT_SVAL: u8 = 4;

/// Attribute ids kern uses (EIATTR_*).
pub mod attr {
    pub const MAX_THREADS: u8 = 0x05;
    pub const PARAM_CBANK: u8 = 0x0a;
    pub const REQNTID: u8 = 0x10;
    pub const FRAME_SIZE: u8 = 0x11;
    pub const MIN_STACK_SIZE: u8 = 0x12;
    pub const KPARAM_INFO: u8 = 0x17;
    pub const CBANK_PARAM_SIZE: u8 = 0x19;
    pub const MAXREG_COUNT: u8 = 0x1b;
    pub const EXIT_INSTR_OFFSETS: u8 = 0x1c;
    pub const REGCOUNT: u8 = 0x2f;
    pub const CUDA_API_VERSION: u8 = 0x37;
}

/// The name `cuobjdump` prints for an attribute id, for the ones kern has seen.
pub fn attr_name(id: u8) -> Option<&'static str> {
    Some(match id {
        0x04 => "EIATTR_CTAIDZ_USED",
        0x05 => "EIATTR_MAX_THREADS",
        0x0a => "EIATTR_PARAM_CBANK",
        0x0f => "EIATTR_SYNC_STACK",
        0x10 => "EIATTR_REQNTID",
        0x11 => "EIATTR_FRAME_SIZE",
        0x12 => "EIATTR_MIN_STACK_SIZE",
        0x17 => "EIATTR_KPARAM_INFO",
        0x19 => "EIATTR_CBANK_PARAM_SIZE",
        0x1b => "EIATTR_MAXREG_COUNT",
        0x1c => "EIATTR_EXIT_INSTR_OFFSETS",
        0x1e => "EIATTR_CRS_STACK_SIZE",
        0x2f => "EIATTR_REGCOUNT",
        0x36 => "EIATTR_SW_WAR",
        0x37 => "EIATTR_CUDA_API_VERSION",
        0x4c => "EIATTR_NUM_BARRIERS",
        0x50 => "EIATTR_SPARSE_MMA_MASK",
        0x5f => "EIATTR_MERCURY_ISA_VERSION",
        _ => return None,
    })
}

/// One record. `value` is the BVAL/HVAL value; `payload` the SVAL bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Offset of the record within its section.
    pub offset: usize,
    pub format: u8,
    pub attr: u8,
    pub value: u16,
    pub payload: &'a [u8],
}

/// Splits a `.nv.info` section into records. `base` is the section's file offset (for errors).
pub(crate) fn records<'a>(ctx: &Ctx, data: &'a [u8], base: u64) -> Result<Vec<Record<'a>>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < data.len() {
        let at = base + off as u64;
        let (format, attr) = match data.slice_at(off, 2) {
            Some(b) => (b[0], b[1]),
            None => return Err(ctx.err(at, "truncated .nv.info record header")),
        };
        let value = data
            .u16_at(off + 2)
            .ok_or_else(|| ctx.err(at, "truncated .nv.info record (needs 4 bytes)"))?;
        match format {
            FMT_SVAL => {
                let len = value as usize;
                let payload = data.slice_at(off + 4, len).ok_or_else(|| {
                    ctx.err(at, format!(".nv.info record {:#04x} declares {len} payload bytes, past the end of the section ({} bytes)", attr, data.len()))
                })?;
                out.push(Record { offset: off, format, attr, value: 0, payload });
                off += 4 + len;
            }
            FMT_NVAL | FMT_BVAL | FMT_HVAL => {
                out.push(Record { offset: off, format, attr, value, payload: &[] });
                off += 4;
            }
            _ => return Err(ctx.err(at, format!("unknown .nv.info record format {format} (attribute {attr:#04x})"))),
        }
    }
    Ok(out)
}

/// One KPARAM_INFO payload (12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KParamInfo {
    pub index: u32,
    pub ordinal: u16,
    pub offset: u16,
    /// Log2 of the pointee alignment (0 when unknown).
    pub log_align: u8,
    pub space: u8,
    pub cbank: u8,
    /// false when the parameter is not in the constant bank.
    pub in_cbank: bool,
    pub size: u32,
}

impl KParamInfo {
    pub(crate) fn parse(p: &[u8]) -> Option<KParamInfo> {
        if p.len() < 12 {
            return None;
        }
        let index = p.u32_at(0)?;
        let ordinal = p.u16_at(4)?;
        let offset = p.u16_at(6)?;
        let w = p.u32_at(8)?;
        Some(KParamInfo {
            index,
            ordinal,
            offset,
            log_align: (w & 0xff) as u8,
            space: ((w >> 8) & 0xf) as u8,
            cbank: ((w >> 12) & 0x1f) as u8,
            in_cbank: (w >> 17) & 1 == 0,
            size: w >> 18,
        })
    }
}

/// The SVAL payload as little-endian u32 words, when its length is a multiple of 4.
pub(crate) fn u32s(p: &[u8]) -> Option<Vec<u32>> {
    if !p.len().is_multiple_of(4) {
        return None;
    }
    (0..p.len() / 4).map(|i| p.u32_at(i * 4)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kparam_worked_example() {
        // From binary-formats.md: ordinal 2, offset 0x10, size 8.
        let bytes = [0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0, 0x02, 0x00, 0x10, 0x00, 0x00, 0xf0, 0x21, 0x00];
        let ctx = Ctx::new("t");
        let recs = records(&ctx, &bytes, 0).unwrap();
        assert_eq!(recs.len(), 1);
        let k = KParamInfo::parse(recs[0].payload).unwrap();
        assert_eq!((k.ordinal, k.offset, k.size, k.cbank, k.in_cbank), (2, 0x10, 8, 0x1f, true));
    }

    #[test]
    fn truncated_and_unknown_records_are_errors() {
        let ctx = Ctx::new("f.cubin");
        let e = records(&ctx, &[0x04, 0x17, 0xff, 0x00, 1, 2], 0x100).unwrap_err().to_string();
        assert!(e.contains("f.cubin") && e.contains("0x100") && e.contains("past the end"), "{e}");
        assert!(records(&ctx, &[0x09, 0x17, 0, 0], 0).is_err());
        assert!(records(&ctx, &[0x03, 0x1b, 0xff], 0).is_err());
        assert!(records(&ctx, &[], 0).unwrap().is_empty());
    }
}
