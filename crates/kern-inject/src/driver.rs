//! The few CUDA driver queries the callbacks make, resolved from the `libcuda.so.1` the process
//! already has loaded (the driver is what loaded this library). Each is optional: an older
//! driver without, say, `cuFuncGetParamInfo` (12.4+) yields launches without a parameter
//! layout instead of a failure.
//!
//! These are queries only (no allocation, no synchronization), legal inside a CUPTI callback
//! and during stream capture.

use std::ffi::{c_char, c_void, CStr};

use kern_dump::format::ParamSlot;

use crate::dl::{function, Lib};
use crate::ffi::{
    CUresult, Handle, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_ACTIVE,
};

/// More parameters than any kernel can have (the parameter space is 32,764 bytes).
const MAX_PARAMS: usize = 8192;

pub type FuncGetModule = unsafe extern "C" fn(*mut Handle, Handle) -> CUresult;
pub type FuncGetParamInfo = unsafe extern "C" fn(Handle, usize, *mut usize, *mut usize) -> CUresult;
pub type FuncGetName = unsafe extern "C" fn(*mut *const c_char, Handle) -> CUresult;
pub type KernelGetFunction = unsafe extern "C" fn(*mut Handle, Handle) -> CUresult;
pub type StreamGetCaptureInfoV2 = unsafe extern "C" fn(
    Handle,
    *mut u32,
    *mut u64,
    *mut Handle,
    *mut *const Handle,
    *mut usize,
) -> CUresult;
pub type StreamGetCaptureInfoV3 = unsafe extern "C" fn(
    Handle,
    *mut u32,
    *mut u64,
    *mut Handle,
    *mut *const Handle,
    *mut *const c_void,
    *mut usize,
) -> CUresult;
pub type StreamIsCapturing = unsafe extern "C" fn(Handle, *mut u32) -> CUresult;
pub type DriverGetVersion = unsafe extern "C" fn(*mut i32) -> CUresult;

/// A stream capture in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// The graph being built (0 when only `cuStreamIsCapturing` was available).
    pub graph: u64,
    pub id: Option<u64>,
}

/// The driver functions in use; public so that tests can substitute fakes.
#[derive(Default)]
pub struct Driver {
    pub func_get_module: Option<FuncGetModule>,
    pub func_get_param_info: Option<FuncGetParamInfo>,
    pub kernel_get_param_info: Option<FuncGetParamInfo>,
    pub func_get_name: Option<FuncGetName>,
    pub kernel_get_name: Option<FuncGetName>,
    pub kernel_get_function: Option<KernelGetFunction>,
    pub stream_get_capture_info_v3: Option<StreamGetCaptureInfoV3>,
    pub stream_get_capture_info: Option<StreamGetCaptureInfoV2>,
    pub stream_is_capturing: Option<StreamIsCapturing>,
    pub driver_get_version: Option<DriverGetVersion>,
}

impl Driver {
    /// Resolves what the loaded driver has; never fails (a process without libcuda gets a
    /// driver whose queries all answer `None`).
    pub fn load() -> Driver {
        let lib = Lib::already_loaded("libcuda.so.1")
            .or_else(|| Lib::open("libcuda.so.1", 0).ok())
            .unwrap_or_else(Lib::global);
        // SAFETY: each type is the C signature of the named driver function (cuda.h, 13.0).
        unsafe {
            Driver {
                func_get_module: function(lib, c"cuFuncGetModule"),
                func_get_param_info: function(lib, c"cuFuncGetParamInfo"),
                kernel_get_param_info: function(lib, c"cuKernelGetParamInfo"),
                func_get_name: function(lib, c"cuFuncGetName"),
                kernel_get_name: function(lib, c"cuKernelGetName"),
                kernel_get_function: function(lib, c"cuKernelGetFunction"),
                stream_get_capture_info_v3: function(lib, c"cuStreamGetCaptureInfo_v3"),
                stream_get_capture_info: function(lib, c"cuStreamGetCaptureInfo_v2"),
                stream_is_capturing: function(lib, c"cuStreamIsCapturing"),
                driver_get_version: function(lib, c"cuDriverGetVersion"),
            }
        }
    }

    pub fn version(&self) -> Option<i32> {
        let f = self.driver_get_version?;
        let mut v = 0;
        // SAFETY: cuDriverGetVersion writes one int.
        (unsafe { f(&mut v) } == CUDA_SUCCESS).then_some(v)
    }

    /// The `CUmodule` of a function handle. A launch may pass a `CUkernel` cast to
    /// `CUfunction` (runtime launches through `cuLibrary`); when `cuFuncGetModule` refuses it,
    /// the context's function is fetched with `cuKernelGetFunction` first.
    ///
    /// # Safety
    /// `f` is a function or kernel handle passed to a driver call of this process.
    pub unsafe fn function_module(&self, f: Handle) -> Option<u64> {
        let get = self.func_get_module?;
        let mut m: Handle = std::ptr::null_mut();
        // SAFETY: cuFuncGetModule writes one handle; `f` is a driver handle.
        if unsafe { get(&mut m, f) } == CUDA_SUCCESS && !m.is_null() {
            return Some(m as u64);
        }
        let kernel_get_function = self.kernel_get_function?;
        let mut func: Handle = std::ptr::null_mut();
        // SAFETY: as above, for cuKernelGetFunction and then cuFuncGetModule.
        unsafe {
            if kernel_get_function(&mut func, f) == CUDA_SUCCESS
                && !func.is_null()
                && get(&mut m, func) == CUDA_SUCCESS
                && !m.is_null()
            {
                return Some(m as u64);
            }
        }
        None
    }

    /// `[offset, size]` of each parameter, by calling `cuFuncGetParamInfo` with increasing
    /// index until it answers `CUDA_ERROR_INVALID_VALUE` (that is how the count is found).
    ///
    /// # Safety
    /// `f` is a function or kernel handle passed to a driver call of this process.
    pub unsafe fn param_layout(&self, f: Handle) -> Option<Vec<ParamSlot>> {
        for query in [self.func_get_param_info, self.kernel_get_param_info]
            .into_iter()
            .flatten()
        {
            let mut slots = Vec::new();
            let mut ok = true;
            for i in 0..MAX_PARAMS {
                let (mut off, mut size) = (0usize, 0usize);
                // SAFETY: the query writes two size_t.
                match unsafe { query(f, i, &mut off, &mut size) } {
                    CUDA_SUCCESS => slots.push(ParamSlot(off as u32, size as u32)),
                    // Past the last parameter (at index 0: a kernel without parameters).
                    CUDA_ERROR_INVALID_VALUE => break,
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Some(slots);
            }
        }
        None
    }

    /// The mangled name of a function (`cuFuncGetName`, else `cuKernelGetName`).
    ///
    /// # Safety
    /// `f` is a function or kernel handle passed to a driver call of this process.
    pub unsafe fn function_name(&self, f: Handle) -> Option<String> {
        for get in [self.func_get_name, self.kernel_get_name]
            .into_iter()
            .flatten()
        {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the query writes one pointer to a driver-owned C string.
            if unsafe { get(&mut p, f) } == CUDA_SUCCESS && !p.is_null() {
                // SAFETY: a valid C string owned by the driver.
                return Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
            }
        }
        None
    }

    /// The capture `stream` is part of, if any.
    ///
    /// # Safety
    /// `stream` is a stream handle (or a special value such as `CU_STREAM_PER_THREAD`) passed
    /// to a driver call of this process.
    pub unsafe fn capture(&self, stream: Handle) -> Option<Capture> {
        // v3 (12.3+, the only one CUDA 13's header declares), then v2, then status only.
        if let Some(info) = self.stream_get_capture_info_v3 {
            let (mut status, mut id, mut graph) = (0u32, 0u64, std::ptr::null_mut());
            let (deps, edges, count) = (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            // SAFETY: the dependency, edge and count outputs are optional (null).
            let r = unsafe { info(stream, &mut status, &mut id, &mut graph, deps, edges, count) };
            if r == CUDA_SUCCESS {
                return (status == CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some(Capture {
                    graph: graph as u64,
                    id: Some(id),
                });
            }
        }
        if let Some(info) = self.stream_get_capture_info {
            let (mut status, mut id, mut graph) = (0u32, 0u64, std::ptr::null_mut());
            // SAFETY: dependencies_out and numDependencies_out are optional (null).
            let r = unsafe {
                info(
                    stream,
                    &mut status,
                    &mut id,
                    &mut graph,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if r == CUDA_SUCCESS {
                return (status == CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some(Capture {
                    graph: graph as u64,
                    id: Some(id),
                });
            }
        }
        let is_capturing = self.stream_is_capturing?;
        let mut status = 0u32;
        // SAFETY: writes one enum value.
        let r = unsafe { is_capturing(stream, &mut status) };
        (r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            .then_some(Capture { graph: 0, id: None })
    }
}
