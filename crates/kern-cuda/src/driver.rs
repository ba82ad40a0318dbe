//! Finding and initializing the CUDA driver library without ever panicking.
//!
//! cudarc opens libcuda lazily and *panics* when it is absent, or when a symbol it is asked
//! for is missing from an older driver. This module is the gate in front of that: it checks
//! that the library loads ([`cudarc::driver::sys::is_culib_present`]), that every entry point
//! kern-cuda calls unconditionally is exported, then runs `cuInit`. Context creation goes
//! through [`driver`]; every other object needs a context, so no driver call can happen
//! before this check has passed.

use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// Entry points kern-cuda calls without a version check. A driver missing any of them is
/// reported as [`CudaError::DriverTooOld`] instead of letting cudarc panic on first use.
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphUpload",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuGraphGetNodes",
];

/// What was learned about the driver once, at first use.
#[derive(Debug)]
pub(crate) struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 13000.
    pub version: i32,
    /// `cuFuncGetParamInfo` exists (CUDA 12.4+).
    pub has_param_info: bool,
    /// `cuLaunchKernelEx` exists (CUDA 11.8+).
    pub has_launch_ex: bool,
    /// `cuEventElapsedTime_v2` exists (CUDA 12.8+; the CUDA 13 bindings have no other).
    pub has_elapsed_v2: bool,
}

static DRIVER: OnceLock<Result<DriverInfo>> = OnceLock::new();

/// Loads and initializes the driver once per process; later calls return the cached
/// outcome (the same error, if it failed).
pub(crate) fn driver() -> Result<&'static DriverInfo> {
    DRIVER
        .get_or_init(init_driver)
        .as_ref()
        .map_err(Clone::clone)
}

/// True when the driver library was found and initialized (never panics, never errors).
pub fn driver_available() -> bool {
    driver().is_ok()
}

fn init_driver() -> Result<DriverInfo> {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate names and drops the
    // handles; it has no preconditions (it is `unsafe` only because loading a library runs
    // its initializers, which for libcuda is the intended effect).
    let present = unsafe { sys::is_culib_present() };
    if !present {
        return Err(CudaError::NoDriver {
            searched: cudarc::get_lib_name_candidates("cuda"),
        });
    }
    // From here on `sys::culib()` cannot panic: the same candidate list just loaded.
    // cuDriverGetVersion exists in every driver and works before cuInit.
    let mut version = 0i32;
    if has_symbol("cuDriverGetVersion") {
        // SAFETY: the symbol exists; `version` is a valid out-pointer.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })?;
    }
    for &name in REQUIRED {
        if !has_symbol(name) {
            return Err(CudaError::DriverTooOld {
                call: name,
                driver_version: version,
                needed: "kern needs an NVIDIA driver supporting CUDA 12.4 or newer",
            });
        }
    }
    // SAFETY: symbol presence checked above; cuInit has no preconditions (flags must be 0).
    check("cuInit", unsafe { sys::cuInit(0) })?;
    Ok(DriverInfo {
        version,
        has_param_info: has_symbol("cuFuncGetParamInfo"),
        has_launch_ex: has_symbol("cuLaunchKernelEx"),
        has_elapsed_v2: has_symbol("cuEventElapsedTime_v2"),
    })
}

/// Whether libcuda exports `name`. Only call after `is_culib_present()` returned true.
fn has_symbol(name: &str) -> bool {
    // SAFETY: the library is known to load (checked by the caller), so `culib()` returns it
    // instead of panicking. We only look the symbol up; the pointer is never called here, so
    // the function type given to `get` does not matter.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name).is_ok() }
}

/// Error for an optional entry point missing from an older driver.
pub(crate) fn too_old(call: &'static str, needed: &'static str) -> CudaError {
    let driver_version = DRIVER
        .get()
        .and_then(|r| r.as_ref().ok())
        .map_or(0, |d| d.version);
    CudaError::DriverTooOld {
        call,
        driver_version,
        needed,
    }
}
