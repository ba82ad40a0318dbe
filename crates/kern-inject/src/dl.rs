//! Thin wrappers over `dlopen`/`dlsym`: the driver and CUPTI are opened at run time, never
//! linked, so that the library loads (and reports clearly) on a machine that lacks either.

use std::ffi::{c_void, CStr, CString};

/// An open shared library. Never closed: its functions may be called until the process ends.
#[derive(Clone, Copy, Debug)]
pub struct Lib(*mut c_void);

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

impl Lib {
    /// `dlopen(name, RTLD_NOW | flags)`; the `dlerror` text on failure.
    pub fn open(name: &str, flags: i32) -> Result<Lib, String> {
        let c = CString::new(name).map_err(|_| format!("{name}: bad name"))?;
        // SAFETY: `c` is a valid C string; dlopen has no other preconditions.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | flags) };
        if h.is_null() {
            Err(last_dl_error())
        } else {
            Ok(Lib(h))
        }
    }

    /// The library only if the process already has it loaded.
    pub fn already_loaded(name: &str) -> Option<Lib> {
        Lib::open(name, libc::RTLD_NOLOAD).ok()
    }

    /// Symbols of everything loaded globally (`RTLD_DEFAULT`).
    pub fn global() -> Lib {
        Lib(libc::RTLD_DEFAULT)
    }

    /// The address of `name`, or null.
    pub fn symbol(&self, name: &CStr) -> *mut c_void {
        // SAFETY: the handle is open (or RTLD_DEFAULT) and `name` a valid C string.
        unsafe { libc::dlsym(self.0, name.as_ptr()) }
    }
}

/// Looks up `name` in `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of the symbol.
pub unsafe fn function<F: Copy>(lib: Lib, name: &CStr) -> Option<F> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let p = lib.symbol(name);
    if p.is_null() {
        None
    } else {
        // SAFETY: a non-null symbol address reinterpreted as the caller-promised fn type.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a valid C string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_owned()
    } else {
        // SAFETY: non-null C string from dlerror.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Directories of the shared objects loaded in this process (for finding a library next to
/// the CUDA libraries a Python wheel brought along).
pub fn loaded_object_paths() -> Vec<String> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info, and `data` is the Vec below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a C string.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            if !name.is_empty() {
                out.push(name.into_owned());
            }
        }
        0
    }
    let mut out: Vec<String> = Vec::new();
    // SAFETY: the callback only reads `info` and appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut Vec<String> as *mut c_void) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_is_loaded_and_has_getpid() {
        let objects = loaded_object_paths();
        assert!(objects.iter().any(|o| o.contains("libc.so")), "{objects:?}");
        let getpid: Option<unsafe extern "C" fn() -> i32> =
            unsafe { function(Lib::global(), c"getpid") };
        assert_eq!(unsafe { getpid.unwrap()() } as u32, std::process::id());
        assert!(Lib::open("libkern-no-such-lib.so.7", 0)
            .unwrap_err()
            .contains("libkern-no-such-lib.so.7"));
        assert!(Lib::already_loaded("libkern-no-such-lib.so.7").is_none());
    }
}
