//! Fatbin containers: the multi-image packages nvcc embeds in host binaries (and writes with
//! `-fatbin`). Layout in `shared/notes/binary-formats.md`:
//!
//! * container header (16 bytes): u32 magic `0xBA55ED50`, u16 version, u16 header size, u64
//!   size of the entries that follow;
//! * entries, each: u16 kind (1 PTX, 2 ELF), u16, u32 entry header size, u64 stored payload
//!   size, u32 compressed size, u32 options offset, u16 minor, u16 major, u32 arch, u32 name
//!   offset, u32 name length, u64 flags (0x2000 LZ4, 0x8000 zstd), …, u64 uncompressed size at
//!   0x38; payload at entry + header size.
//!
//! Compressed payloads are decompressed with a hard cap ([`MAX_IMAGE_BYTES`]) and must come out
//! at exactly the declared size, so a hostile entry can neither exhaust memory nor lie.

use crate::error::{Ctx, LeBytes};
use crate::{cubin, ptx, Compression, Image, Result};
use std::io::Read;

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;
pub const FLAG_LZ4: u64 = 0x2000;
pub const FLAG_ZSTD: u64 = 0x8000;

/// No single image kern reads decompresses to more than this (real cubins are at most tens of
/// megabytes). Larger declared sizes are refused before any allocation.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// One entry of a fatbin container, as listed (before decompression).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Index of the container (module) this entry belongs to, counted from the first
    /// container in the buffer.
    pub container: u32,
    pub kind: u16,
    /// Offset of the entry header within the buffer that was parsed.
    pub offset: u64,
    pub header_size: u32,
    pub payload_size: u64,
    pub compressed_size: u32,
    pub arch: u32,
    pub flags: u64,
    pub uncompressed_size: u64,
    pub name: Option<String>,
}

impl Entry {
    pub fn compression(&self) -> Compression {
        if self.flags & FLAG_ZSTD != 0 {
            Compression::Zstd
        } else if self.flags & FLAG_LZ4 != 0 {
            Compression::Lz4
        } else {
            Compression::None
        }
    }
}

/// Whether `data` starts with a fatbin container header.
pub fn is_fatbin(data: &[u8]) -> bool {
    data.u32_at(0) == Some(FATBIN_MAGIC)
}

/// Lists the entries of every container in `data` (one section may hold several containers,
/// padded with zeros between them). `base` is `data`'s offset in the file, for errors and for
/// the offsets recorded in the entries.
pub(crate) fn entries(ctx: &Ctx, data: &[u8], base: u64) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    let mut container = 0u32;
    loop {
        // Skip alignment padding between containers.
        while off < data.len() && data[off] == 0 {
            off += 1;
        }
        if off >= data.len() {
            break;
        }
        let at = base + off as u64;
        if data.u32_at(off) != Some(FATBIN_MAGIC) {
            return Err(ctx.err(at, format!("expected a fatbin container (magic 0xba55ed50), found {}", hex_head(&data[off..]))));
        }
        let header_size = data.u16_at(off + 6).ok_or_else(|| ctx.err(at, "truncated fatbin header"))? as usize;
        let size = data.u64_at(off + 8).ok_or_else(|| ctx.err(at, "truncated fatbin header (needs 16 bytes)"))?;
        if header_size < 16 {
            return Err(ctx.err(at + 6, format!("fatbin header size {header_size} is smaller than 16")));
        }
        let start = off.checked_add(header_size).ok_or_else(|| ctx.err(at, "fatbin header size overflows"))?;
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| start.checked_add(s))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| ctx.err(at + 8, format!("fatbin declares {size} bytes of entries, but only {} remain", data.len().saturating_sub(start))))?;
        let mut e = start;
        while e < end {
            let entry = read_entry(ctx, &data[..end], e, base, container)?;
            let next = e as u64 + u64::from(entry.header_size) + entry.payload_size;
            out.push(entry);
            e = usize::try_from(next).map_err(|_| ctx.err(base + e as u64, "entry size overflows"))?;
        }
        off = end;
        container += 1;
    }
    Ok(out)
}

fn hex_head(d: &[u8]) -> String {
    d.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn read_entry(ctx: &Ctx, data: &[u8], off: usize, base: u64, container: u32) -> Result<Entry> {
    let at = base + off as u64;
    let short = || ctx.err(at, format!("truncated fatbin entry header (needs 64 bytes, {} remain)", data.len() - off));
    let kind = data.u16_at(off).ok_or_else(short)?;
    let header_size = data.u32_at(off + 4).ok_or_else(short)?;
    let payload_size = data.u64_at(off + 8).ok_or_else(short)?;
    let compressed_size = data.u32_at(off + 0x10).ok_or_else(short)?;
    let arch = data.u32_at(off + 0x1c).ok_or_else(short)?;
    let name_off = data.u32_at(off + 0x20).ok_or_else(short)?;
    let name_len = data.u32_at(off + 0x24).ok_or_else(short)?;
    let flags = data.u64_at(off + 0x28).ok_or_else(short)?;
    let uncompressed_size = data.u64_at(off + 0x38).ok_or_else(short)?;
    if header_size < 0x40 {
        return Err(ctx.err(at + 4, format!("fatbin entry header size {header_size} is smaller than 64")));
    }
    let remaining = (data.len() - off) as u64;
    if u64::from(header_size) + payload_size > remaining {
        return Err(ctx.err(
            at + 8,
            format!("fatbin entry declares a {header_size}-byte header and {payload_size}-byte payload, but only {remaining} bytes remain"),
        ));
    }
    if kind != KIND_PTX && kind != KIND_ELF {
        return Err(ctx.err(at, format!("unknown fatbin entry kind {kind} (1 = PTX, 2 = ELF)")));
    }
    // The object name, when present, lies inside the entry header.
    let name = if name_len > 0 && name_off >= 0x40 && u64::from(name_off) + u64::from(name_len) <= u64::from(header_size) {
        data.slice_at(off + name_off as usize, name_len as usize)
            .map(|b| String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(b)).into_owned())
    } else {
        None
    };
    Ok(Entry { container, kind, offset: at, header_size, payload_size, compressed_size, arch, flags, uncompressed_size, name })
}

/// The decompressed payload of `entry` (whose header is at `entry.offset - base` in `data`).
pub(crate) fn payload(ctx: &Ctx, data: &[u8], base: u64, entry: &Entry) -> Result<Vec<u8>> {
    let start = (entry.offset - base) as usize + entry.header_size as usize;
    let stored = data
        .slice_at(start, entry.payload_size as usize)
        .ok_or_else(|| ctx.err(entry.offset, "fatbin entry payload lies past the end"))?;
    let comp = entry.compression();
    if comp == Compression::None {
        return Ok(stored.to_vec());
    }
    let at = entry.offset;
    let csize = entry.compressed_size as usize;
    let input = stored.get(..csize).ok_or_else(|| {
        ctx.err(at + 0x10, format!("compressed size {csize} is larger than the stored payload ({} bytes)", stored.len()))
    })?;
    let want = entry.uncompressed_size;
    if want > MAX_IMAGE_BYTES {
        return Err(ctx.err(at + 0x38, format!("entry declares {want} bytes uncompressed, above kern's limit of {MAX_IMAGE_BYTES} bytes per image")));
    }
    let want = want as usize;
    let out = match comp {
        Compression::Lz4 => {
            // An LZ4 block cannot expand more than 255:1, so a larger claim is a lie.
            if want > csize.saturating_mul(255).saturating_add(64) {
                return Err(ctx.err(at + 0x38, format!("entry claims {want} bytes from {csize} LZ4 bytes, beyond LZ4's maximum ratio")));
            }
            let mut out = vec![0u8; want];
            let n = lz4_flex::block::decompress_into(input, &mut out)
                .map_err(|e| ctx.err(at, format!("LZ4 payload is corrupt: {e}")))?;
            out.truncate(n);
            out
        }
        Compression::Zstd => {
            let mut dec = ruzstd::decoding::StreamingDecoder::new(input)
                .map_err(|e| ctx.err(at, format!("zstd payload is corrupt: {e}")))?;
            let mut out = Vec::with_capacity(want.min(csize.saturating_mul(16)));
            // Read at most one byte past the declared size: enough to detect a lie, never more.
            (&mut dec)
                .take(want as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| ctx.err(at, format!("zstd payload is corrupt: {e}")))?;
            out
        }
        Compression::None => unreachable!("handled above"),
    };
    if out.len() != want {
        return Err(ctx.err(at + 0x38, format!("payload decompresses to {}{} bytes, the entry declares {want}", out.len(), if out.len() > want { "+" } else { "" })));
    }
    Ok(out)
}

/// Reads every image of the containers in `data`; containers are numbered from
/// `first_container`.
pub(crate) fn read_images(ctx: &Ctx, data: &[u8], base: u64, first_container: u32) -> Result<Vec<Image>> {
    let mut images = Vec::new();
    for (i, e) in entries(ctx, data, base)?.iter().enumerate() {
        let kind = if e.kind == KIND_ELF { "ELF" } else { "PTX" };
        let ectx = ctx.nested(format!("fatbin entry {i} ({kind}, arch {}) at {:#x}", e.arch, e.offset));
        let bytes = payload(&ectx, data, base, e)?;
        let comp = e.compression();
        let mut im = if e.kind == KIND_ELF {
            if !cubin::is_cubin(&bytes) {
                return Err(ectx.err(0, "entry of kind ELF does not hold a CUDA ELF"));
            }
            cubin::read_cubin(&ectx, &bytes, e.offset, comp)?
        } else {
            ptx::read_ptx(&ectx, &bytes, e.offset, comp)?
        };
        if im.arch.is_none() && e.arch > 0 {
            im.arch = Some(crate::Arch::new(e.arch));
        }
        im.name = e.name.clone();
        im.container = first_container + e.container;
        images.push(im);
    }
    Ok(images)
}
