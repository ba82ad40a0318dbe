//! Finding and opening CUPTI, and the five CUPTI functions this library calls.
//!
//! Search order: a CUPTI the process already loaded (a PyTorch process may have loaded the one
//! from its wheel); else `$KERN_CUPTI_LIB` alone if set; else `libcupti.so.13` through the
//! dynamic linker; else next to CUDA libraries the process loaded (pip wheels keep them
//! together); else the toolkit (`$CUDA_HOME`, `/usr/local/cuda`); CUPTI 12 last.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use crate::dl::{function, loaded_object_paths, Lib};
use crate::ffi::Handle;

pub type CallbackFunc = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

type Subscribe = unsafe extern "C" fn(*mut Handle, Option<CallbackFunc>, *mut c_void) -> u32;
type EnableCallback = unsafe extern "C" fn(u32, Handle, u32, u32) -> u32;
type EnableDomain = unsafe extern "C" fn(u32, Handle, u32) -> u32;
type GetResultString = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
type GetVersion = unsafe extern "C" fn(*mut u32) -> u32;

const SONAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so", "libcupti.so.12"];

/// A CUPTI subscriber handle (opaque; valid for the life of the process).
#[derive(Clone, Copy, Debug)]
pub struct Subscriber(Handle);

pub struct Cupti {
    /// The name or path it was opened by.
    pub path: String,
    subscribe: Subscribe,
    enable_callback: EnableCallback,
    enable_domain: EnableDomain,
    get_result_string: Option<GetResultString>,
    get_version: Option<GetVersion>,
}

/// Where CUPTI was looked for, for the error message.
#[derive(Debug)]
pub struct NotFound {
    pub tried: Vec<String>,
    /// Why the first candidate (normally the soname, searched by the dynamic linker) failed.
    pub first_error: String,
}

impl Cupti {
    /// Opens CUPTI (see the module docs for the order).
    pub fn load() -> Result<Cupti, NotFound> {
        // A CUPTI the process already has comes first, even over KERN_CUPTI_LIB: a second copy
        // loaded by path would fight the first over the driver's callback table.
        for name in SONAMES {
            if let Some(lib) = Lib::already_loaded(name) {
                if let Some(c) = Self::from_lib(lib, name) {
                    return Ok(c);
                }
            }
        }
        let explicit = std::env::var(kern_dump::run::ENV_CUPTI_LIB)
            .ok()
            .filter(|s| !s.is_empty());
        match explicit {
            Some(p) => Self::open_first(&[p]),
            None => Self::open_first(&candidates()),
        }
    }

    fn open_first(candidates: &[String]) -> Result<Cupti, NotFound> {
        let mut first_error = None;
        for c in candidates {
            let error = match Lib::open(c, libc::RTLD_LOCAL) {
                Ok(lib) => match Self::from_lib(lib, c) {
                    Some(cupti) => return Ok(cupti),
                    None => format!("{c}: lacks cuptiSubscribe"),
                },
                Err(e) => e,
            };
            first_error.get_or_insert(error);
        }
        Err(NotFound {
            tried: candidates.to_vec(),
            first_error: first_error.unwrap_or_default(),
        })
    }

    fn from_lib(lib: Lib, path: &str) -> Option<Cupti> {
        // SAFETY: the types are the C signatures from cupti_callbacks.h / cupti_result.h.
        unsafe {
            Some(Cupti {
                path: path.to_owned(),
                subscribe: function(lib, c"cuptiSubscribe")?,
                enable_callback: function(lib, c"cuptiEnableCallback")?,
                enable_domain: function(lib, c"cuptiEnableDomain")?,
                get_result_string: function(lib, c"cuptiGetResultString"),
                get_version: function(lib, c"cuptiGetVersion"),
            })
        }
    }

    pub fn version(&self) -> Option<u32> {
        let f = self.get_version?;
        let mut v = 0;
        // SAFETY: writes one u32.
        (unsafe { f(&mut v) } == 0).then_some(v)
    }

    fn check(&self, what: &str, r: u32) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        let text = match self.get_result_string {
            // SAFETY: writes a pointer to a static C string.
            Some(f) if unsafe { f(r, &mut s) } == 0 && !s.is_null() => {
                // SAFETY: CUPTI's static string.
                unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
            }
            _ => format!("CUptiResult {r}"),
        };
        Err(format!("{what} failed: {text}"))
    }

    /// `cuptiSubscribe`.
    pub fn subscribe(&self, callback: CallbackFunc) -> Result<Subscriber, String> {
        let mut sub: Handle = std::ptr::null_mut();
        // SAFETY: `callback` has the CUpti_CallbackFunc signature and lives forever.
        let r = unsafe { (self.subscribe)(&mut sub, Some(callback), std::ptr::null_mut()) };
        self.check("cuptiSubscribe", r).map(|_| Subscriber(sub))
    }

    /// `cuptiEnableDomain(1, ...)`.
    pub fn enable_domain(&self, sub: Subscriber, domain: u32) -> Result<(), String> {
        // SAFETY: `sub` came from `subscribe`.
        self.check("cuptiEnableDomain", unsafe {
            (self.enable_domain)(1, sub.0, domain)
        })
    }

    /// `cuptiEnableCallback(1, ...)`.
    pub fn enable_callback(&self, sub: Subscriber, domain: u32, cbid: u32) -> Result<(), String> {
        // SAFETY: `sub` came from `subscribe`.
        self.check("cuptiEnableCallback", unsafe {
            (self.enable_callback)(1, sub.0, domain, cbid)
        })
    }
}

/// Every path tried after the already-loaded check, in order.
pub fn candidates() -> Vec<String> {
    let mut v: Vec<String> = vec![SONAMES[0].to_owned()];
    for dir in cuda_library_dirs() {
        v.push(format!("{dir}/libcupti.so.13"));
    }
    let mut roots: Vec<String> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .filter(|s| !s.is_empty())
        .collect();
    roots.extend([
        "/usr/local/cuda".to_owned(),
        "/usr/local/cuda-13.0".to_owned(),
        "/opt/cuda".to_owned(),
    ]);
    for so in ["libcupti.so.13", "libcupti.so.12"] {
        for root in &roots {
            let target = if cfg!(target_arch = "aarch64") {
                "targets/sbsa-linux/lib"
            } else {
                "targets/x86_64-linux/lib"
            };
            for sub in ["extras/CUPTI/lib64", "lib64", target] {
                v.push(format!("{root}/{sub}/{so}"));
            }
        }
        if so == "libcupti.so.13" {
            v.push(SONAMES[1].to_owned());
            v.push(SONAMES[2].to_owned());
        }
    }
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
    v
}

/// Directories worth searching because CUDA libraries were loaded from them: where a wheel
/// such as `nvidia-cuda-runtime` put `libcudart.so.13`, CUPTI's wheel puts `libcupti.so.13`
/// (`site-packages/nvidia/cu13/lib`); next to PyTorch's `torch/lib`, the wheels are at
/// `../../nvidia/cu13/lib`.
fn cuda_library_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    for object in loaded_object_paths() {
        let path = Path::new(&object);
        let (Some(dir), Some(file)) = (path.parent(), path.file_name().and_then(|f| f.to_str()))
        else {
            continue;
        };
        let cuda_lib = [
            "libcudart",
            "libcublas",
            "libnvrtc",
            "libcufft",
            "libcusparse",
            "libnvJitLink",
        ]
        .iter()
        .any(|p| file.starts_with(p));
        if cuda_lib {
            dirs.push(dir.display().to_string());
        }
        if file.starts_with("libtorch_cuda") {
            if let Some(site) = dir.parent().and_then(Path::parent) {
                dirs.push(site.join("nvidia/cu13/lib").display().to_string());
                dirs.push(site.join("nvidia/cuda_cupti/lib").display().to_string());
            }
        }
    }
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_start_with_the_soname_and_end_with_cupti_12() {
        let c = candidates();
        assert_eq!(c[0], "libcupti.so.13");
        assert!(c.contains(&"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13".to_owned()));
        assert!(
            c.iter().position(|p| p.ends_with(".so.12"))
                > c.iter()
                    .position(|p| p == "/usr/local/cuda/lib64/libcupti.so.13")
        );
        let unique: std::collections::HashSet<_> = c.iter().collect();
        assert_eq!(unique.len(), c.len());
    }
}
