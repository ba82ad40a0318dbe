//! The one error type of kern-cuda, and the helper that turns a driver status code
//! (`CUresult`) into it.
//!
//! Every failure this crate can report is a [`CudaError`]. Its `Display` text is meant to
//! be shown to a user as is: it names the driver call that failed, the CUDA error name and
//! code, and the driver's own description.

use cudarc::driver::sys;
use std::ffi::CStr;

/// Result alias used throughout kern-cuda.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The message shown when libcuda cannot be loaded. Public so the CLI can match on it in tests.
pub const NO_DRIVER_MESSAGE: &str = "no CUDA driver found (libcuda.so could not be loaded): \
kern needs an NVIDIA GPU and driver to run programs; `kern inspect`, `kern check` and \
`kern plan` work without one";

/// Driver error codes after which the CUDA context is unusable ("sticky" errors): every later
/// call in the process fails with the same error, and only a process restart recovers.
const STICKY_CODES: &[i32] = &[
    214, // CUDA_ERROR_ECC_UNCORRECTABLE
    226, // CUDA_ERROR_CONTAINED
    700, // CUDA_ERROR_ILLEGAL_ADDRESS
    702, // CUDA_ERROR_LAUNCH_TIMEOUT
    710, // CUDA_ERROR_ASSERT
    714, // CUDA_ERROR_HARDWARE_STACK_ERROR
    715, // CUDA_ERROR_ILLEGAL_INSTRUCTION
    716, // CUDA_ERROR_MISALIGNED_ADDRESS
    717, // CUDA_ERROR_INVALID_ADDRESS_SPACE
    718, // CUDA_ERROR_INVALID_PC
    719, // CUDA_ERROR_LAUNCH_FAILED
];

/// Everything that can go wrong in kern-cuda.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded: there is no NVIDIA driver on this machine.
    #[error("{NO_DRIVER_MESSAGE}")]
    NoDriver {
        /// Library names that were searched for (as the dynamic loader would resolve them).
        searched: Vec<String>,
    },

    /// A driver call returned an error status.
    #[error("{}", driver_sentence(call, *code, name, message))]
    Driver {
        /// The driver function that failed, e.g. `"cuModuleLoadDataEx"`.
        call: &'static str,
        /// The numeric `CUresult`, e.g. 700.
        code: i32,
        /// The symbolic name, e.g. `"CUDA_ERROR_ILLEGAL_ADDRESS"`.
        name: String,
        /// The driver's description (`cuGetErrorString`).
        message: String,
    },

    /// The driver's JIT compiler rejected a module (PTX that does not compile, or an image
    /// the driver cannot use); `log` is the compiler's error log.
    #[error("the CUDA driver could not load the module ({name}, code {code}); its compiler said:\n{log}")]
    Jit {
        /// The numeric `CUresult` of `cuModuleLoadDataEx`.
        code: i32,
        /// The symbolic name, e.g. `"CUDA_ERROR_INVALID_PTX"`.
        name: String,
        /// The JIT error log (trimmed; never empty for this variant).
        log: String,
    },

    /// A kernel name was looked up in a module that does not contain it.
    #[error("the module has no kernel named `{name}` (names are the exact, usually mangled, entry symbols)")]
    KernelNotFound {
        /// The name that was looked up.
        name: String,
    },

    /// The installed driver is older than a feature kern asked for.
    #[error("the installed CUDA driver ({}) does not provide {call}; {needed}", version_string(*driver_version))]
    DriverTooOld {
        /// The missing driver entry point, e.g. `"cuFuncGetParamInfo"`.
        call: &'static str,
        /// `cuDriverGetVersion`, e.g. 12020 for CUDA 12.2 (0 when unknown).
        driver_version: i32,
        /// What to do about it, e.g. "update the NVIDIA driver to one supporting CUDA 12.4 or newer".
        needed: &'static str,
    },

    /// An argument was rejected before any driver call was made.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// libnccl could not be loaded (tensor parallelism needs it).
    #[error("{} (searched: {})", crate::nccl::NO_NCCL_MESSAGE, searched.join(", "))]
    NoNccl {
        /// Library names that were searched for.
        searched: Vec<String>,
    },

    /// The installed NCCL lacks an entry point (or is older than kern needs).
    #[error("the installed NCCL ({}) does not provide {call}: kern needs NCCL 2.18 or newer", if *version > 0 { format!("version {}.{}.{}", version / 10000, (version % 10000) / 100, version % 100) } else { "version unknown".to_string() })]
    NcclTooOld {
        call: &'static str,
        /// `ncclGetVersion` (0 when unknown).
        version: i32,
    },

    /// An NCCL call returned an error status.
    #[error("NCCL call {call} failed with {name} (code {code}): {message}")]
    Nccl {
        call: &'static str,
        code: i32,
        name: String,
        message: String,
    },
}

impl CudaError {
    /// The numeric CUDA error code, when this error came from the driver.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } | CudaError::Jit { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the error poisons the CUDA context (e.g. `CUDA_ERROR_ILLEGAL_ADDRESS` after a
    /// kernel fault): nothing more can run in this process.
    pub fn is_sticky(&self) -> bool {
        matches!(self, CudaError::Driver { code, .. } if STICKY_CODES.contains(code))
    }

    /// Builds an [`CudaError::InvalidArgument`].
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        CudaError::InvalidArgument(msg.into())
    }

    /// Builds a [`CudaError::Driver`] from a failing status. Only the description needs the
    /// driver (which is loaded whenever a status exists); the name comes from the binding.
    pub(crate) fn from_status(call: &'static str, status: sys::CUresult) -> Self {
        CudaError::Driver {
            call,
            code: status as i32,
            name: status_name(status),
            message: status_message(status),
        }
    }
}

/// `CUDA_ERROR_…` name of a status, without calling the driver.
pub(crate) fn status_name(status: sys::CUresult) -> String {
    format!("{status:?}")
}

/// The driver's description of a status (`cuGetErrorString`), or a fallback.
pub(crate) fn status_message(status: sys::CUresult) -> String {
    let mut ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only reached after the driver library was found (a status exists only if a
    // driver call ran); `ptr` is a valid out-pointer. On success the driver stores a pointer
    // to a static NUL-terminated string, which we copy immediately.
    let rc = unsafe { sys::cuGetErrorString(status, &mut ptr) };
    if rc == sys::CUresult::CUDA_SUCCESS && !ptr.is_null() {
        // SAFETY: checked non-null; the driver guarantees a NUL-terminated static string.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    } else {
        "the driver gave no description for this error".to_string()
    }
}

/// Turns a driver status into `Ok(())` or a [`CudaError::Driver`] naming `call`.
#[inline]
pub(crate) fn check(call: &'static str, status: sys::CUresult) -> Result<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::from_status(call, status))
    }
}

/// `13000` → `"CUDA 13.0"`; 0 → `"version unknown"`.
pub(crate) fn version_string(v: i32) -> String {
    if v <= 0 {
        "version unknown".to_string()
    } else {
        format!("CUDA {}.{}", v / 1000, (v % 1000) / 10)
    }
}

fn driver_sentence(call: &str, code: i32, name: &str, message: &str) -> String {
    let mut s = format!("CUDA driver call {call} failed with {name} (code {code}): {message}");
    if STICKY_CODES.contains(&code) {
        s.push_str(
            "; this error is sticky: the GPU context can no longer be used and the process must be restarted",
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_status_names() {
        assert_eq!(version_string(13000), "CUDA 13.0");
        assert_eq!(version_string(12040), "CUDA 12.4");
        assert_eq!(version_string(0), "version unknown");
        assert_eq!(
            status_name(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS as i32, 700);
        assert!(check("cuInit", sys::CUresult::CUDA_SUCCESS).is_ok());
    }
}
