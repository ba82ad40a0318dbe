//! What one traced launch costs inside this library, without a GPU: the CUPTI callback is
//! called for ENTER and EXIT of `cuLaunchKernel` as CUPTI would, with a fake driver whose
//! queries return at once, and the trace written to a temporary directory.
//!
//!     cargo run --release -p kern-inject --example callback_cost [launches]
//!
//! CUPTI's own dispatch and the real driver queries (cuStreamGetCaptureInfo per launch,
//! cuFuncGetParamInfo once per function) come on top; the GPU run measures the whole.

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;

use kern_inject::callback::cupti_callback;
use kern_inject::driver::Driver;
use kern_inject::ffi::{self, cbid, CallbackData, Handle};

unsafe extern "C" fn module(out: *mut Handle, _f: Handle) -> i32 {
    unsafe { *out = 0x1000 as Handle };
    0
}

unsafe extern "C" fn params(_f: Handle, i: usize, off: *mut usize, size: *mut usize) -> i32 {
    if i >= 6 {
        return ffi::CUDA_ERROR_INVALID_VALUE;
    }
    unsafe { (*off, *size) = (8 * i, 8) };
    0
}

unsafe extern "C" fn capture(
    _s: Handle,
    status: *mut u32,
    _id: *mut u64,
    _g: *mut Handle,
    _d: *mut *const Handle,
    _e: *mut *const c_void,
    _n: *mut usize,
) -> i32 {
    unsafe { *status = 0 };
    0
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let dir = std::env::temp_dir().join(format!("kern-inject-cost-{}", std::process::id()));
    let driver = Driver {
        func_get_module: Some(module),
        func_get_param_info: Some(params),
        stream_get_capture_info_v3: Some(capture),
        ..Driver::default()
    };
    let t = kern_inject::testing::install_tracer(dir.clone(), driver, 0);
    let mut values = [0u64; 6];
    let mut args: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    let names = [c"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_", c"_Z6VecAddPfS_S_"];
    let start = Instant::now();
    for i in 0..n {
        let p = ffi::LaunchKernelParams {
            f: (0xf0 + (i % 16)) as Handle,
            grid: [1024, 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
            stream: 0x10 as Handle,
            kernel_params: args.as_mut_ptr(),
            extra: null_mut(),
        };
        let mut ret = 0;
        for site in [ffi::API_ENTER, ffi::API_EXIT] {
            let data = CallbackData {
                callback_site: site,
                function_name: null(),
                function_params: &p as *const _ as *const c_void,
                function_return_value: &mut ret as *mut i32 as *mut c_void,
                symbol_name: names[i % 2].as_ptr(),
                context: 0xc0 as Handle,
                context_uid: 1,
                correlation_data: null_mut(),
                correlation_id: 0,
            };
            unsafe {
                cupti_callback(
                    null_mut(),
                    ffi::DOMAIN_DRIVER_API,
                    cbid::CU_LAUNCH_KERNEL,
                    &data as *const _ as *const c_void,
                )
            };
        }
    }
    t.finish("atexit");
    let elapsed = start.elapsed();
    let bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    println!(
        "{n} launches: {:.0} ns per launch (ENTER + EXIT callbacks, record, write), trace {:.1} MB ({:.0} B per launch)",
        elapsed.as_nanos() as f64 / n as f64,
        bytes as f64 / 1e6,
        bytes as f64 / n as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}
