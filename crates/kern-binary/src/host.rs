//! Host binaries (shared objects and executables) with embedded device code: nvcc puts the
//! fatbin containers in the section `.nv_fatbin` (or `__nv_relfatbin` for relocatable device
//! code). The host ELF itself is read with the `object` crate.

use crate::error::Ctx;
use crate::{fatbin, Image, Result};
use object::{Object, ObjectSection};

/// Sections that hold fatbin containers.
pub const FATBIN_SECTIONS: &[&str] = &[".nv_fatbin", "__nv_relfatbin"];

pub(crate) fn read_host(ctx: &Ctx, data: &[u8]) -> Result<Vec<Image>> {
    let file = object::File::parse(data).map_err(|e| ctx.err(0, format!("invalid host ELF: {e}")))?;
    let mut images = Vec::new();
    let mut found = false;
    for sec in file.sections() {
        let Ok(name) = sec.name() else { continue };
        if !FATBIN_SECTIONS.contains(&name) {
            continue;
        }
        found = true;
        let Some((off, _)) = sec.file_range() else { continue };
        let bytes = sec.data().map_err(|e| ctx.err(off, format!("section {name} lies past the end of the file: {e}")))?;
        let sctx = ctx.nested(format!("section {name}"));
        let first = images.iter().map(|im: &Image| im.container + 1).max().unwrap_or(0);
        images.extend(fatbin::read_images(&sctx, bytes, off, first)?);
    }
    if !found {
        return Err(ctx.err(0, "this host binary has no .nv_fatbin or __nv_relfatbin section: it embeds no device code"));
    }
    Ok(images)
}
