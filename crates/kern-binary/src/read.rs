//! Format detection: one entry point for any GPU binary.

use crate::error::{Ctx, Error};
use crate::{cubin, fatbin, host, ptx, Binary, Compression, FileKind, Result};
use std::path::Path;

/// Reads a GPU binary from memory. `file` names it in errors and in the result.
pub fn read(data: &[u8], file: &str) -> Result<Binary> {
    let ctx = Ctx::new(file);
    let (kind, images) = if cubin::is_cubin(data) {
        (FileKind::Cubin, vec![cubin::read_cubin(&ctx, data, 0, Compression::None)?])
    } else if data.starts_with(b"\x7fELF") {
        (FileKind::HostElf, host::read_host(&ctx, data)?)
    } else if fatbin::is_fatbin(data) {
        (FileKind::Fatbin, fatbin::read_images(&ctx, data, 0, 0)?)
    } else if ptx::is_ptx(data) {
        (FileKind::Ptx, vec![ptx::read_ptx(&ctx, data, 0, Compression::None)?])
    } else {
        let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(Error::Unrecognized {
            file: file.to_string(),
            reason: format!(
                "it starts with [{}]; kern reads a cubin or host ELF (7f 45 4c 46), a fatbin (50 ed 55 ba) or PTX text (with .version and .entry/.target)",
                head.join(" ")
            ),
        });
    };
    Ok(Binary { file: file.to_string(), kind, images })
}

/// Reads a GPU binary from disk.
pub fn read_file(path: impl AsRef<Path>) -> Result<Binary> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let data = std::fs::read(path).map_err(|cause| Error::Io { file: name.clone(), cause })?;
    read(&data, &name)
}
