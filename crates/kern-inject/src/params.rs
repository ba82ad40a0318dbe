//! Copying a launch's parameters into the buffer the kernel sees.
//!
//! A launch passes its arguments either as `kernelParams` (an array of pointers, one per
//! parameter, whose sizes and offsets only the kernel image knows: `cuFuncGetParamInfo`) or as
//! `extra` (a key/value list holding one packed buffer and its size). Both are turned into the
//! same thing: the parameter buffer, each parameter at its offset, padding zeroed.

use std::ffi::c_void;

use kern_dump::format::{ParamSlot, ParamSource, MAX_PARAM_BYTES};

use crate::ffi::{
    CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END,
};

/// Longest `extra` list walked before giving up on a missing terminator.
const MAX_EXTRA_ENTRIES: usize = 64;

#[derive(Debug, PartialEq, Eq)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub source: ParamSource,
}

impl Captured {
    fn unavailable() -> Self {
        Captured {
            bytes: Vec::new(),
            source: ParamSource::Unavailable,
        }
    }
}

/// Copies the parameters of one launch.
///
/// # Safety
/// `kernel_params` and `extra` are the arguments of a launch that is still in progress (the
/// callback runs inside the driver call), so they point to valid memory as the driver API
/// defines it: `kernel_params` to `layout.len()` pointers to parameters of the layout's sizes,
/// `extra` to a `CU_LAUNCH_PARAM_END`-terminated key/value list. Null pointers are allowed.
pub unsafe fn capture(
    layout: Option<&[ParamSlot]>,
    kernel_params: *const *const c_void,
    extra: *const *const c_void,
) -> Captured {
    if !kernel_params.is_null() {
        let Some(layout) = layout else {
            return Captured::unavailable();
        };
        if layout.is_empty() {
            return Captured {
                bytes: Vec::new(),
                source: ParamSource::None,
            };
        }
        let total = layout.iter().map(|s| s.end() as usize).max().unwrap_or(0);
        if total > MAX_PARAM_BYTES {
            return Captured::unavailable();
        }
        let mut bytes = vec![0u8; total];
        for (i, slot) in layout.iter().enumerate() {
            // SAFETY: the caller guarantees `layout.len()` entries.
            let p = unsafe { *kernel_params.add(i) } as *const u8;
            if p.is_null() {
                return Captured::unavailable();
            }
            let (off, size) = (slot.offset() as usize, slot.size() as usize);
            // SAFETY: parameter `i` is `size` readable bytes; the destination range lies
            // within `bytes` because `total` is the largest end.
            unsafe { std::ptr::copy_nonoverlapping(p, bytes.as_mut_ptr().add(off), size) };
        }
        return Captured {
            bytes,
            source: ParamSource::KernelParams,
        };
    }
    if !extra.is_null() {
        // SAFETY: forwarded from the caller.
        return unsafe { capture_extra(extra) };
    }
    match layout {
        Some([]) => Captured {
            bytes: Vec::new(),
            source: ParamSource::None,
        },
        _ => Captured::unavailable(),
    }
}

/// # Safety
/// `extra` is a valid `extra` list (see [`capture`]).
unsafe fn capture_extra(extra: *const *const c_void) -> Captured {
    let mut buffer: *const u8 = std::ptr::null();
    let mut size: Option<usize> = None;
    let mut i = 0;
    loop {
        if i >= 2 * MAX_EXTRA_ENTRIES {
            return Captured::unavailable();
        }
        // SAFETY: entries up to the terminator are readable.
        let key = unsafe { *extra.add(i) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        // SAFETY: every key but the terminator is followed by its value.
        let value = unsafe { *extra.add(i + 1) };
        match key {
            CU_LAUNCH_PARAM_BUFFER_POINTER => buffer = value as *const u8,
            CU_LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                size = Some(unsafe { *(value as *const usize) });
            }
            _ => {}
        }
        i += 2;
    }
    match (buffer.is_null(), size) {
        (false, Some(size)) => {
            let kept = size.min(MAX_PARAM_BYTES);
            // SAFETY: the buffer holds `size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(buffer, kept) }.to_vec();
            let source = if kept < size {
                ParamSource::ExtraTruncated
            } else {
                ParamSource::Extra
            };
            Captured { bytes, source }
        }
        _ => Captured::unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptrs(args: &[*const c_void]) -> Vec<*const c_void> {
        args.to_vec()
    }

    #[test]
    fn kernel_params_land_at_their_offsets() {
        // A kernel (float* a, int n, double x): offsets 0, 8, 16 (4 bytes of padding at 12).
        let a: u64 = 0x7f00_1234_5678;
        let n: i32 = -2;
        let x: f64 = 1.5;
        let args = ptrs(&[
            &a as *const u64 as _,
            &n as *const i32 as _,
            &x as *const f64 as _,
        ]);
        let layout = [ParamSlot(0, 8), ParamSlot(8, 4), ParamSlot(16, 8)];
        let c = unsafe { capture(Some(&layout), args.as_ptr(), std::ptr::null()) };
        assert_eq!(c.source, ParamSource::KernelParams);
        let mut expected = Vec::new();
        expected.extend_from_slice(&a.to_le_bytes());
        expected.extend_from_slice(&n.to_le_bytes());
        expected.extend_from_slice(&[0; 4]);
        expected.extend_from_slice(&x.to_le_bytes());
        assert_eq!(c.bytes, expected);
    }

    #[test]
    fn extra_buffer_is_copied() {
        let buf: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let size: usize = buf.len();
        let extra = ptrs(&[
            CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
            buf.as_ptr() as *const c_void,
            CU_LAUNCH_PARAM_BUFFER_SIZE as *const c_void,
            &size as *const usize as *const c_void,
            CU_LAUNCH_PARAM_END as *const c_void,
        ]);
        let layout = [ParamSlot(0, 8), ParamSlot(8, 4)];
        let c = unsafe { capture(Some(&layout), std::ptr::null(), extra.as_ptr()) };
        assert_eq!(
            c,
            Captured {
                bytes: buf.to_vec(),
                source: ParamSource::Extra
            }
        );
        // The layout is not needed for `extra`.
        let c = unsafe { capture(None, std::ptr::null(), extra.as_ptr()) };
        assert_eq!(c.source, ParamSource::Extra);
    }

    #[test]
    fn oversized_extra_is_truncated_and_flagged() {
        let buf = vec![7u8; MAX_PARAM_BYTES + 10];
        let size = buf.len();
        let extra = ptrs(&[
            CU_LAUNCH_PARAM_BUFFER_SIZE as *const c_void,
            &size as *const usize as *const c_void,
            CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
            buf.as_ptr() as *const c_void,
            CU_LAUNCH_PARAM_END as *const c_void,
        ]);
        let c = unsafe { capture(None, std::ptr::null(), extra.as_ptr()) };
        assert_eq!(c.source, ParamSource::ExtraTruncated);
        assert_eq!(c.bytes.len(), MAX_PARAM_BYTES);
    }

    #[test]
    fn malformed_or_missing_inputs() {
        // extra without a size.
        let buf = [0u8; 4];
        let extra = ptrs(&[
            CU_LAUNCH_PARAM_BUFFER_POINTER as *const c_void,
            buf.as_ptr() as *const c_void,
            CU_LAUNCH_PARAM_END as *const c_void,
        ]);
        assert_eq!(
            unsafe { capture(None, std::ptr::null(), extra.as_ptr()) }.source,
            ParamSource::Unavailable
        );
        // kernelParams without a layout.
        let x = 1u32;
        let args = ptrs(&[&x as *const u32 as _]);
        assert_eq!(
            unsafe { capture(None, args.as_ptr(), std::ptr::null()) }.source,
            ParamSource::Unavailable
        );
        // A kernel without parameters.
        assert_eq!(
            unsafe { capture(Some(&[]), std::ptr::null(), std::ptr::null()) }.source,
            ParamSource::None
        );
        assert_eq!(
            unsafe { capture(Some(&[]), args.as_ptr(), std::ptr::null()) }.source,
            ParamSource::None
        );
        // Nothing at all, layout unknown.
        assert_eq!(
            unsafe { capture(None, std::ptr::null(), std::ptr::null()) }.source,
            ParamSource::Unavailable
        );
        // A null parameter pointer.
        let args = ptrs(&[std::ptr::null()]);
        let layout = [ParamSlot(0, 4)];
        assert_eq!(
            unsafe { capture(Some(&layout), args.as_ptr(), std::ptr::null()) }.source,
            ParamSource::Unavailable
        );
    }
}
