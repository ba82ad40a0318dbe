//! The CUDA context: the device's primary context, retained for as long as any kern-cuda
//! object uses it, plus the device properties read once at creation.
//!
//! Every object that owns a driver resource (module, buffer, stream, event, graph) holds a
//! clone of its [`Context`], so the context is released last. Driver calls act on the
//! calling thread's *current* context; every method here makes its context current first
//! ([`Context::bind`]), so a `Context` can be used from any thread.

use crate::driver::{driver, DriverInfo};
use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;
use std::ffi::{c_char, CStr};
use std::sync::Arc;

/// Device properties read once when the context is created.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProps {
    /// Marketing name, e.g. `"NVIDIA H200"`.
    pub name: String,
    /// Device ordinal (0-based, in `CUDA_VISIBLE_DEVICES` order).
    pub ordinal: usize,
    /// Compute capability major (9 for Hopper).
    pub cc_major: u32,
    /// Compute capability minor.
    pub cc_minor: u32,
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory in bytes.
    pub total_mem: u64,
    /// Maximum threads per block.
    pub max_threads_per_block: u32,
    /// Shared memory per block available without opting in (usually 48 KiB).
    pub max_shared_per_block: u32,
    /// Shared memory per block after opting in with
    /// [`Function::set_max_dynamic_shared`](crate::Function::set_max_dynamic_shared).
    pub max_shared_per_block_optin: u32,
    /// Shared memory per SM in bytes.
    pub max_shared_per_sm: u32,
    /// L2 cache size in bytes.
    pub l2_bytes: u32,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    /// SM clock in kHz (None when the driver no longer reports it).
    pub clock_khz: Option<u32>,
    /// Memory clock in kHz (None when the driver no longer reports it).
    pub mem_clock_khz: Option<u32>,
    /// Memory bus width in bits (None when not reported).
    pub mem_bus_bits: Option<u32>,
}

impl DeviceProps {
    /// Theoretical peak DRAM bandwidth in bytes/s (double data rate: 2 × clock × bus width),
    /// when the driver reports the memory clock and bus width.
    pub fn peak_mem_bandwidth(&self) -> Option<f64> {
        let clk = f64::from(self.mem_clock_khz?) * 1e3;
        let bytes = f64::from(self.mem_bus_bits?) / 8.0;
        Some(2.0 * clk * bytes)
    }

    /// `"sm_90"`-style name of the compute capability.
    pub fn sm_name(&self) -> String {
        format!("sm_{}{}", self.cc_major, self.cc_minor)
    }
}

/// A retained primary context on one device. Cheap to clone (an `Arc`); the context is
/// released when the last clone and the last object created from it are dropped.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    raw: sys::CUcontext,
    device: sys::CUdevice,
    props: DeviceProps,
    driver: &'static DriverInfo,
}

// SAFETY: a CUcontext is a process-wide driver handle that the driver allows to be made
// current on, and used from, any thread; `Inner` never mutates it after creation.
unsafe impl Send for Inner {}
// SAFETY: see `Send`; all methods take `&self` and only pass the handle to the driver.
unsafe impl Sync for Inner {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.inner.props.ordinal)
            .field("name", &self.inner.props.name)
            .finish()
    }
}

impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        self.inner.raw == other.inner.raw
    }
}
impl Eq for Context {}

impl Context {
    /// Retains the primary context of device `ordinal` and reads its properties.
    ///
    /// Returns [`CudaError::NoDriver`] (never panics) when libcuda is not installed, and
    /// [`CudaError::InvalidArgument`] when the ordinal does not name a device.
    pub fn new(ordinal: usize) -> Result<Context> {
        let drv = driver()?;
        let count = Self::device_count()?;
        if ordinal >= count {
            return Err(CudaError::invalid(format!(
                "CUDA device {ordinal} does not exist: this machine has {count} visible CUDA device(s)"
            )));
        }
        let ord = i32::try_from(ordinal)
            .map_err(|_| CudaError::invalid(format!("device ordinal {ordinal} is too large")))?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: driver initialized by `driver()`; `device` is a valid out-pointer.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ord) })?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; `raw` is a valid out-pointer. Balanced by
        // cuDevicePrimaryCtxRelease_v2 in `Inner::drop` (or right below on failure).
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, device)
        })?;
        let props = match read_props(device, ordinal, drv.version) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: releases the reference retained just above; nothing else uses it.
                unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) };
                return Err(e);
            }
        };
        let ctx = Context {
            inner: Arc::new(Inner {
                raw,
                device,
                props,
                driver: drv,
            }),
        };
        ctx.bind()?;
        Ok(ctx)
    }

    /// Number of CUDA devices visible to this process. Fails with [`CudaError::NoDriver`]
    /// when there is no driver.
    pub fn device_count() -> Result<usize> {
        driver()?;
        let mut n = 0i32;
        // SAFETY: driver initialized; `n` is a valid out-pointer.
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The properties read at creation.
    pub fn props(&self) -> &DeviceProps {
        &self.inner.props
    }

    /// Device ordinal of this context.
    pub fn ordinal(&self) -> usize {
        self.inner.props.ordinal
    }

    /// Compute capability `(major, minor)`, e.g. `(9, 0)` on H100/H200.
    pub fn device_arch(&self) -> (u32, u32) {
        (self.inner.props.cc_major, self.inner.props.cc_minor)
    }

    /// `cuDriverGetVersion`, e.g. 13000.
    pub fn driver_version(&self) -> i32 {
        self.inner.driver.version
    }

    /// `(free, total)` device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context bound; both out-pointers valid.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// Waits for all work queued in this context, on every stream. Returns any error raised
    /// asynchronously by earlier work.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: context bound; no other preconditions.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// After a kernel fault: waits for all work, and returns the (usually sticky) error the
    /// device raised, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`, so the caller can attach the label of
    /// the launch it suspects. `Ok(())` means the device is healthy. Check
    /// [`CudaError::is_sticky`] to know whether the process must stop using the GPU.
    pub fn check_device_errors(&self) -> Result<()> {
        self.synchronize()
    }

    /// The raw `CUcontext`. Only for code inside kern-cuda's contract (the driver is called
    /// only from this crate); it stays valid while this `Context` lives.
    pub fn as_raw(&self) -> sys::CUcontext {
        self.inner.raw
    }

    /// Makes this context current on the calling thread (a no-op when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `cur` is a valid out-pointer; the driver is initialized (a Context exists).
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut cur) })?;
        if cur != self.inner.raw {
            // SAFETY: `raw` is a retained primary context, alive while `self` is.
            check("cuCtxSetCurrent", unsafe {
                sys::cuCtxSetCurrent(self.inner.raw)
            })?;
        }
        Ok(())
    }

    /// The driver capabilities found at initialization.
    pub(crate) fn driver(&self) -> &'static DriverInfo {
        self.inner.driver
    }

    /// Errors unless `other` is this same context (objects from two devices cannot mix).
    pub(crate) fn ensure_same(&self, other: &Context, what: &str) -> Result<()> {
        if self == other {
            Ok(())
        } else {
            Err(CudaError::invalid(format!(
                "{what} belongs to CUDA device {} but was used with device {}",
                other.ordinal(),
                self.ordinal()
            )))
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialized; out-pointer valid. If our context is current on
        // this thread, unset it so no thread keeps a handle we are about to release.
        unsafe {
            if sys::cuCtxGetCurrent(&mut cur) == sys::CUresult::CUDA_SUCCESS && cur == self.raw {
                sys::cuCtxSetCurrent(std::ptr::null_mut());
            }
            // SAFETY: balances the cuDevicePrimaryCtxRetain done in `Context::new`. Errors
            // cannot be reported from Drop and are ignored.
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

fn attr(device: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0i32;
    // SAFETY: `device` came from cuDeviceGet; `v` is a valid out-pointer.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, device)
    })?;
    Ok(v)
}

fn attr_u32(device: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<u32> {
    Ok(u32::try_from(attr(device, a)?).unwrap_or(0))
}

/// Attributes that newer drivers may stop reporting: failure or 0 gives `None`.
fn attr_opt(device: sys::CUdevice, a: sys::CUdevice_attribute) -> Option<u32> {
    attr(device, a)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
}

fn read_props(device: sys::CUdevice, ordinal: usize, driver_version: i32) -> Result<DeviceProps> {
    use sys::CUdevice_attribute as A;
    let mut name_buf = [0 as c_char; 256];
    // SAFETY: the buffer is 256 bytes and we pass its exact length; the driver writes a
    // NUL-terminated string into it.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name_buf.as_mut_ptr(), name_buf.len() as i32, device)
    })?;
    // Force termination in case the driver filled the whole buffer.
    name_buf[255] = 0;
    // SAFETY: `name_buf` is NUL-terminated (last byte forced to 0 above).
    let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut total = 0usize;
    // SAFETY: valid device and out-pointer.
    check("cuDeviceTotalMem_v2", unsafe {
        sys::cuDeviceTotalMem_v2(&mut total, device)
    })?;
    Ok(DeviceProps {
        name,
        ordinal,
        cc_major: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        cc_minor: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        sm_count: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_mem: total as u64,
        max_threads_per_block: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_shared_per_block: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        max_shared_per_block_optin: attr_u32(
            device,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        max_shared_per_sm: attr_u32(
            device,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?,
        l2_bytes: attr_u32(device, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        driver_version,
        clock_khz: attr_opt(device, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        mem_clock_khz: attr_opt(device, A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        mem_bus_bits: attr_opt(device, A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
    })
}
