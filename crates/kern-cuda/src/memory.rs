//! Device memory ([`DeviceBuffer`]), page-locked host memory ([`PinnedBuffer`]) and the
//! copies between them.
//!
//! The plain methods (`copy_from_host`, `copy_to_host`, `memset_u8`, `copy_from_device`) are
//! *fully blocking*: they first wait for all work queued in the context (on every stream),
//! then do the operation, and return once it has completed. That makes them safe to mix with
//! kernels queued on kern's non-blocking streams, at the cost of a device-wide wait; use them
//! for setup (weights, tests), and the `_async` variants on a [`Stream`] on hot paths.

use crate::context::Context;
use crate::error::{check, CudaError, Result};
use crate::stream::Stream;
use cudarc::driver::sys;
use std::ffi::c_void;

/// A device allocation (`cuMemAlloc`), freed on drop. Contents are uninitialized unless
/// created with [`Context::alloc_zeroed`].
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Context,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc_v2 in this context and is freed exactly once.
            // Errors cannot be reported from Drop and are ignored.
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

impl Context {
    /// Allocates `len` bytes of device memory (uninitialized). A zero-length buffer is
    /// valid and has device pointer 0.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let mut ptr: sys::CUdeviceptr = 0;
        if len > 0 {
            self.bind()?;
            // SAFETY: context bound; `ptr` is a valid out-pointer; `len` > 0.
            check("cuMemAlloc_v2", unsafe {
                sys::cuMemAlloc_v2(&mut ptr, len)
            })?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: self.clone(),
        })
    }

    /// Allocates `len` bytes of device memory set to zero.
    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer> {
        let buf = self.alloc(len)?;
        buf.memset_u8(0, len, 0)?;
        Ok(buf)
    }

    /// Allocates `len` bytes of page-locked host memory (zero-filled), usable for truly
    /// asynchronous copies.
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            self.bind()?;
            // SAFETY: context bound; valid out-pointer; flags 0 = plain pinned allocation.
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut ptr, len, 0)
            })?;
            // SAFETY: the driver returned `len` writable bytes at `ptr`.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, len) };
        }
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
            ctx: self.clone(),
        })
    }
}

/// Checks that `[offset, offset + len)` lies within a buffer of `total` bytes.
pub(crate) fn check_range(what: &str, offset: usize, len: usize, total: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(CudaError::invalid(format!(
            "{what}: range {offset}..{} is outside the {total}-byte buffer",
            offset.saturating_add(len)
        ))),
    }
}

/// Runs a legacy-stream operation fully blocking: waits for all queued work, runs `op`, then
/// waits for the legacy stream (on which synchronous copies and memsets are queued).
fn blocking(ctx: &Context, call: &'static str, op: impl FnOnce() -> sys::CUresult) -> Result<()> {
    ctx.synchronize()?;
    check(call, op())?;
    // SAFETY: the null stream is the legacy default stream of the bound context.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(std::ptr::null_mut())
    })
}

impl DeviceBuffer {
    /// Device address of the first byte (0 for an empty buffer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Device address of byte `offset` (which may equal `len()`, one past the end).
    pub fn ptr_at(&self, offset: usize) -> Result<u64> {
        check_range("DeviceBuffer::ptr_at", offset, 0, self.len)?;
        Ok(self.ptr + offset as u64)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context that owns this allocation.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn addr(&self, what: &str, offset: usize, len: usize) -> Result<u64> {
        check_range(what, offset, len, self.len)?;
        Ok(self.ptr + offset as u64)
    }

    /// Copies `src` to bytes `offset..offset + src.len()` of this buffer. Blocking.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.addr("copy_from_host", offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: destination range checked against our allocation; `src` is valid for
        // `src.len()` bytes for the whole (blocking) call.
        blocking(&self.ctx, "cuMemcpyHtoD_v2", || unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies bytes `offset..offset + dst.len()` of this buffer into `dst`. Blocking.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.addr("copy_to_host", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: source range checked; `dst` is valid and exclusively borrowed for
        // `dst.len()` bytes for the whole (blocking) call.
        blocking(&self.ctx, "cuMemcpyDtoH_v2", || unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// Sets bytes `offset..offset + len` to `value`. Blocking.
    pub fn memset_u8(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.addr("memset_u8", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: destination range checked against our allocation.
        blocking(&self.ctx, "cuMemsetD8_v2", || unsafe {
            sys::cuMemsetD8_v2(dst, value, len)
        })
    }

    /// Copies `len` bytes from `src[src_offset..]` to `self[dst_offset..]`. Blocking. The
    /// two ranges must not overlap.
    pub fn copy_from_device(
        &self,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        let (dst, s) = self.dtod_addrs(dst_offset, src, src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges checked against their allocations and for overlap.
        blocking(&self.ctx, "cuMemcpyDtoD_v2", || unsafe {
            sys::cuMemcpyDtoD_v2(dst, s, len)
        })
    }

    fn dtod_addrs(
        &self,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<(u64, u64)> {
        self.ctx.ensure_same(&src.ctx, "source buffer")?;
        let dst = self.addr("copy_from_device (destination)", dst_offset, len)?;
        let s = src.addr("copy_from_device (source)", src_offset, len)?;
        let l = len as u64;
        if len > 0 && dst < s + l && s < dst + l {
            return Err(CudaError::invalid(
                "copy_from_device: source and destination ranges overlap",
            ));
        }
        Ok((dst, s))
    }

    /// Queues a memset of bytes `offset..offset + len` on `stream`.
    pub fn memset_u8_async(
        &self,
        offset: usize,
        len: usize,
        value: u8,
        stream: &Stream,
    ) -> Result<()> {
        let dst = self.addr("memset_u8_async", offset, len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: range checked; stream alive and in this context. The allocation is freed
        // only by `drop`, and cuMemFree waits for queued work using it.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(dst, value, len, stream.as_raw())
        })
    }

    /// Queues a device-to-device copy on `stream` (ranges must not overlap).
    pub fn copy_from_device_async(
        &self,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (dst, s) = self.dtod_addrs(dst_offset, src, src_offset, len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: ranges checked; stream alive and in this context.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, s, len, stream.as_raw())
        })
    }

    /// Queues a host-to-device copy on `stream` and returns immediately.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the copy has completed (synchronize the
    /// stream or an event recorded after it). For a truly asynchronous copy, `src` should be
    /// pinned memory ([`PinnedBuffer`]); pageable memory is staged by the driver.
    pub unsafe fn copy_from_host_async(
        &self,
        offset: usize,
        src: &[u8],
        stream: &Stream,
    ) -> Result<()> {
        let dst = self.addr("copy_from_host_async", offset, src.len())?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: range checked; the caller guarantees `src` outlives the queued copy.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream.as_raw())
        })
    }

    /// Queues a device-to-host copy on `stream` and returns immediately.
    ///
    /// # Safety
    /// `dst` must stay alive, and must not be read or written, until the copy has completed
    /// (synchronize the stream or an event recorded after it).
    pub unsafe fn copy_to_host_async(
        &self,
        offset: usize,
        dst: &mut [u8],
        stream: &Stream,
    ) -> Result<()> {
        let src = self.addr("copy_to_host_async", offset, dst.len())?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: range checked; the caller guarantees `dst` outlives the queued copy and is
        // not accessed meanwhile.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream.as_raw())
        })
    }
}

/// Stream-ordered copies between a device buffer and page-locked host memory, with both
/// ranges checked (the runtime's step inputs and outputs, issue 15). Unlike
/// [`PinnedBuffer::copy_to_device_async`] they take no raw device address: the only contract
/// left to the caller is the host memory's lifetime.
impl DeviceBuffer {
    /// Queues a copy of `len` bytes from `src[src_offset..]` to `self[offset..]` on `stream`
    /// and returns immediately (a truly asynchronous DMA: `src` is pinned).
    ///
    /// # Safety
    /// Bytes `src_offset..src_offset + len` of `src` must not be written, and `src` must not be
    /// freed, until the copy has completed (synchronize the stream or an event recorded on it
    /// after this call).
    pub unsafe fn copy_from_pinned_async(
        &self,
        offset: usize,
        src: &PinnedBuffer,
        src_offset: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<()> {
        let dst = self.addr("copy_from_pinned_async (device range)", offset, len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        // SAFETY: the device range lies in this live allocation (checked above) and is freed
        // only by `drop`; `src` checks its own range and context; the caller guarantees the
        // host range outlives the copy unmodified.
        unsafe { src.copy_to_device_async(src_offset, dst, len, stream) }
    }

    /// Queues a copy of `len` bytes from `self[offset..]` into `dst[dst_offset..]` on `stream`
    /// and returns immediately.
    ///
    /// # Safety
    /// Bytes `dst_offset..dst_offset + len` of `dst` must not be read or written, and `dst`
    /// must not be freed, until the copy has completed (synchronize the stream or an event
    /// recorded on it after this call).
    pub unsafe fn copy_to_pinned_async(
        &self,
        offset: usize,
        dst: &mut PinnedBuffer,
        dst_offset: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<()> {
        let src = self.addr("copy_to_pinned_async (device range)", offset, len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        // SAFETY: as in `copy_from_pinned_async`, with the caller keeping the host range
        // untouched until the copy completes.
        unsafe { dst.copy_from_device_async(dst_offset, src, len, stream) }
    }
}

/// Page-locked host memory (`cuMemHostAlloc`), zero-filled at allocation, freed on drop.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    ctx: Context,
}

// SAFETY: the buffer exclusively owns its allocation, like a `Vec<u8>`; access goes through
// `&self`/`&mut self` slices, so Rust's borrow rules apply.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access is read-only (`as_slice`).
unsafe impl Sync for PinnedBuffer {}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.len)
    }
}

impl PinnedBuffer {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` points at `len` initialized (zero-filled at allocation) bytes owned by
        // `self`; the shared borrow of `self` prevents mutation through `as_mut_slice`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues a copy of `len` bytes from device address `src` into bytes `offset..offset + len`
    /// of this buffer on `stream` (a truly asynchronous DMA: this memory is pinned).
    ///
    /// # Safety
    /// `src..src + len` must lie in a live device allocation of the stream's context, and this
    /// buffer's range must not be read, written or freed until the copy has completed
    /// (synchronize the stream or an event recorded after it).
    pub unsafe fn copy_from_device_async(&mut self, offset: usize, src: u64, len: usize, stream: &Stream) -> Result<()> {
        check_range("copy_from_device_async", offset, len, self.len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: host range checked; the caller guarantees the device range and lifetimes.
        check("cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(self.ptr.add(offset).cast(), src, len, stream.as_raw())
        })
    }

    /// Queues a copy of bytes `offset..offset + len` of this buffer to device address `dst` on
    /// `stream`.
    ///
    /// # Safety
    /// `dst..dst + len` must lie in a live device allocation of the stream's context that
    /// nothing else writes meanwhile, and this buffer's range must not be written or freed until
    /// the copy has completed.
    pub unsafe fn copy_to_device_async(&self, offset: usize, dst: u64, len: usize, stream: &Stream) -> Result<()> {
        check_range("copy_to_device_async", offset, len, self.len)?;
        self.ctx.ensure_same(stream.context(), "stream")?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: host range checked; the caller guarantees the device range and lifetimes.
        check("cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, self.ptr.add(offset).cast(), len, stream.as_raw())
        })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if !self.ptr.is_null() && self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed exactly once. Errors
            // cannot be reported from Drop and are ignored.
            unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Plain numeric types whose every bit pattern is valid and that have no padding, so a slice
/// of them can be viewed as bytes and back.
pub trait Scalar: Copy + sealed::Sealed + 'static {}
macro_rules! scalar {
    ($($t:ty),*) => {$( impl sealed::Sealed for $t {} impl Scalar for $t {} )*};
}
scalar!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Views a slice of scalars as its bytes (native endianness), e.g. to upload `&[f32]`.
pub fn as_bytes<T: Scalar>(v: &[T]) -> &[u8] {
    // SAFETY: `Scalar` types have no padding and no invalid bit patterns; the byte view
    // covers exactly the slice's memory and borrows it immutably.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Views a mutable slice of scalars as its bytes, e.g. to download into `&mut [f32]`.
pub fn as_bytes_mut<T: Scalar>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; any bytes written are a valid `T`, and the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::check_range;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range("t", 0, 16, 16).is_ok());
        assert!(check_range("t", 16, 0, 16).is_ok());
        let e = check_range("copy_to_host", 8, 9, 16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid argument: copy_to_host: range 8..17 is outside the 16-byte buffer"
        );
        assert!(check_range("t", usize::MAX, 2, 16).is_err());
        assert!(check_range("t", 17, 0, 16).is_err());
    }
}
