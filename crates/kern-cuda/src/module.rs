//! Loaded device code: [`Module`] (one cubin, fatbin or PTX image, unloaded on drop) and
//! [`Function`] (one kernel entry in it, with its parameter layout and attributes).
//!
//! Loading uses `cuModuleLoadDataEx` with JIT info and error log buffers, so a PTX image the
//! driver cannot compile yields [`CudaError::Jit`] with the compiler's log. Choosing which
//! image of a fatbin or host binary to load happens elsewhere (kern-binary).

use crate::context::Context;
use crate::error::{check, status_name, CudaError, Result};
use cudarc::driver::sys;
use std::ffi::{c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

/// Size of each JIT log buffer.
const LOG_BYTES: usize = 64 * 1024;
const ELF_MAGIC: &[u8] = b"\x7fELF";
/// Fatbin container magic 0xBA55ED50, little-endian.
const FATBIN_MAGIC: &[u8] = &[0x50, 0xed, 0x55, 0xba];

/// One parameter of a kernel as the driver lays it out in the parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamSlot {
    /// Byte offset in the parameter buffer.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Static properties of a kernel (`cuFuncGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuncAttributes {
    /// Registers per thread.
    pub num_regs: u32,
    /// Largest block this kernel can be launched with (registers and `.maxntid` permitting).
    pub max_threads_per_block: u32,
    /// Statically declared shared memory per block, in bytes.
    pub static_shared_bytes: u32,
    /// Local memory (stack/spills) per thread, in bytes.
    pub local_bytes: u32,
    /// User constant memory, in bytes.
    pub const_bytes: u32,
    /// Virtual architecture the kernel's PTX targeted, major×10 + minor (e.g. 90 for compute_90).
    pub ptx_version: u32,
    /// Architecture of the SASS binary, major×10 + minor (e.g. 90 for sm_90).
    pub binary_version: u32,
    /// Current limit for dynamic shared memory per block, in bytes.
    pub max_dynamic_shared_bytes: u32,
}

/// A loaded module. Cheap to clone; unloaded when the last clone and the last [`Function`]
/// from it are dropped.
///
/// CUDA graphs and queued launches reference the module's code without holding it: keep the
/// module alive as long as any graph containing its kernels may still run.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

struct ModuleInner {
    raw: sys::CUmodule,
    ctx: Context,
    info_log: String,
}

// SAFETY: a CUmodule is a driver handle usable from any thread with its context current
// (every use binds the context first); it is never mutated after loading.
unsafe impl Send for ModuleInner {}
// SAFETY: see `Send`; shared use only passes the handle to thread-safe driver calls.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` came from cuModuleLoadDataEx and is unloaded exactly once, here;
            // no Function outlives us (each holds an Arc of this module). Errors are ignored:
            // Drop cannot report them.
            unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("raw", &self.inner.raw)
            .finish()
    }
}

/// What kind of image the bytes look like (only used to decide NUL termination).
fn looks_binary(bytes: &[u8]) -> bool {
    bytes.starts_with(ELF_MAGIC) || bytes.starts_with(FATBIN_MAGIC) || bytes.contains(&0)
}

/// Copies `bytes` into 8-byte-aligned storage, appending a NUL to text (PTX) images that
/// lack one. Binary images (ELF, fatbin, anything containing a NUL) are copied unchanged.
pub(crate) fn prepare_image(bytes: &[u8]) -> Vec<u64> {
    let add_nul = !looks_binary(bytes);
    let len = bytes.len() + usize::from(add_nul);
    let mut words = vec![0u64; len.div_ceil(8).max(1)];
    // SAFETY: `words` holds at least `len >= bytes.len()` bytes; u64 storage has no invalid
    // byte patterns; the regions do not overlap (fresh allocation). Trailing bytes stay 0,
    // which provides the NUL terminator when `add_nul` is set.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len());
    }
    words
}

fn log_text(buf: &[u8], written: usize) -> String {
    let end = written.min(buf.len());
    let end = buf[..end].iter().position(|&b| b == 0).unwrap_or(end);
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

impl Context {
    /// Loads a cubin, fatbin or PTX image. PTX need not be NUL-terminated (a terminator is
    /// appended). A PTX compile failure returns [`CudaError::Jit`] with the driver's log.
    pub fn load_module(&self, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(CudaError::invalid("cannot load an empty module image"));
        }
        let data = prepare_image(image);
        let mut info = vec![0u8; LOG_BYTES];
        let mut error = vec![0u8; LOG_BYTES];
        let mut options = [
            sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // Size options are passed by value in the pointer slot, and the driver writes the
        // number of bytes it used back into the same slot.
        let mut values: [*mut c_void; 4] = [
            info.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(LOG_BYTES),
            error.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(LOG_BYTES),
        ];
        self.bind()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `data` is a complete image (NUL-terminated if PTX) that outlives the call;
        // options/values are parallel arrays of length 4; the two log buffers are LOG_BYTES
        // long, as declared, and outlive the call. The context is current.
        let status = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                data.as_ptr().cast(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        let info_log = log_text(&info, values[1].addr());
        if status != sys::CUresult::CUDA_SUCCESS {
            let log = log_text(&error, values[3].addr());
            if log.is_empty() {
                return Err(CudaError::from_status("cuModuleLoadDataEx", status));
            }
            return Err(CudaError::Jit {
                code: status as i32,
                name: status_name(status),
                log,
            });
        }
        Ok(Module {
            inner: Arc::new(ModuleInner {
                raw,
                ctx: self.clone(),
                info_log,
            }),
        })
    }
}

impl Module {
    /// Looks up a kernel by its exact entry symbol (mangled for C++ kernels, e.g.
    /// `_Z6VecAddPfS_S_`).
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name)
            .map_err(|_| CudaError::invalid(format!("kernel name {name:?} contains a NUL byte")))?;
        self.inner.ctx.bind()?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module handle alive (we hold it); `cname` is NUL-terminated and outlives the
        // call; `raw` is a valid out-pointer.
        let status = unsafe { sys::cuModuleGetFunction(&mut raw, self.inner.raw, cname.as_ptr()) };
        if status == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(CudaError::KernelNotFound {
                name: name.to_string(),
            });
        }
        check("cuModuleGetFunction", status)?;
        Ok(Function {
            raw,
            name: name.to_string(),
            module: self.clone(),
            layout: Arc::new(OnceLock::new()),
        })
    }

    /// The JIT info log produced while loading (empty for cubins, usually).
    pub fn jit_info_log(&self) -> &str {
        &self.inner.info_log
    }

    /// The context this module was loaded into.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

/// A kernel entry point. Holds its [`Module`], so it can never dangle.
#[derive(Clone)]
pub struct Function {
    raw: sys::CUfunction,
    name: String,
    module: Module,
    /// Parameter layout, queried once.
    layout: Arc<OnceLock<Vec<ParamSlot>>>,
}

// SAFETY: a CUfunction is an immutable driver handle, valid while its module (held here) is
// loaded; driver calls on it are thread-safe once the context is bound.
unsafe impl Send for Function {}
// SAFETY: see `Send`.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .finish()
    }
}

impl Function {
    /// The name this function was looked up by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module that contains this function.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The context this function lives in.
    pub fn context(&self) -> &Context {
        &self.module.inner.ctx
    }

    /// The raw `CUfunction`, valid while `self` lives.
    pub fn as_raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// The parameter layout the driver will use (`cuFuncGetParamInfo`, CUDA 12.4+), one slot
    /// per parameter in declaration order. Queried once, then cached.
    pub fn param_layout(&self) -> Result<Vec<ParamSlot>> {
        if let Some(l) = self.layout.get() {
            return Ok(l.clone());
        }
        let l = self.query_param_layout()?;
        Ok(self.layout.get_or_init(|| l).clone())
    }

    /// Cached layout, if [`param_layout`](Self::param_layout) already succeeded.
    pub(crate) fn cached_layout(&self) -> Option<&[ParamSlot]> {
        self.layout.get().map(Vec::as_slice)
    }

    fn query_param_layout(&self) -> Result<Vec<ParamSlot>> {
        let ctx = self.context();
        if !ctx.driver().has_param_info {
            return Err(crate::driver::too_old(
                "cuFuncGetParamInfo",
                "reading a kernel's parameter layout needs a driver supporting CUDA 12.4 or newer",
            ));
        }
        ctx.bind()?;
        let mut slots = Vec::new();
        // The parameter space is at most 32,764 bytes, so there are at most that many params.
        for index in 0..32_768usize {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: `raw` is valid while the module is loaded (we hold it); out-pointers
            // valid; symbol presence checked above.
            let status =
                unsafe { sys::cuFuncGetParamInfo(self.raw, index, &mut offset, &mut size) };
            if status == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                return Ok(slots);
            }
            check("cuFuncGetParamInfo", status)?;
            slots.push(ParamSlot { offset, size });
        }
        Err(CudaError::invalid(format!(
            "kernel `{}` reports more parameters than the parameter space can hold",
            self.name
        )))
    }

    fn attr(&self, a: sys::CUfunction_attribute) -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: function handle valid (module held); out-pointer valid; context bound by
        // the caller.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut v, a, self.raw)
        })?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// Registers, shared/local/const memory and version information of this kernel.
    pub fn attributes(&self) -> Result<FuncAttributes> {
        use sys::CUfunction_attribute as A;
        self.context().bind()?;
        Ok(FuncAttributes {
            num_regs: self.attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            max_threads_per_block: self.attr(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            static_shared_bytes: self.attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes: self.attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            const_bytes: self.attr(A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            ptx_version: self.attr(A::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: self.attr(A::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
            max_dynamic_shared_bytes: self
                .attr(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
        })
    }

    /// Allows launches with up to `bytes` of dynamic shared memory (needed above 48 KiB; the
    /// device maximum is [`DeviceProps::max_shared_per_block_optin`](crate::DeviceProps)
    /// minus the kernel's static shared memory).
    pub fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        let optin = self.context().props().max_shared_per_block_optin;
        if bytes > optin {
            return Err(CudaError::invalid(format!(
                "kernel `{}`: {bytes} bytes of dynamic shared memory requested, but the device allows at most {optin} per block",
                self.name
            )));
        }
        let value = c_int::try_from(bytes)
            .map_err(|_| CudaError::invalid(format!("shared memory size {bytes} is too large")))?;
        self.context().bind()?;
        // SAFETY: function handle valid; attribute and value checked above.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
        })
    }

    /// How many blocks of `block_threads` threads using `dynamic_shared` bytes can be resident
    /// on one SM at once (for sizing persistent grids).
    pub fn max_active_blocks_per_sm(
        &self,
        block_threads: u32,
        dynamic_shared: usize,
    ) -> Result<u32> {
        let bs = c_int::try_from(block_threads)
            .map_err(|_| CudaError::invalid(format!("block size {block_threads} is too large")))?;
        self.context().bind()?;
        let mut n: c_int = 0;
        // SAFETY: function handle valid; out-pointer valid; context bound.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.raw, bs, dynamic_shared)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn ptx_text_gets_a_nul_terminator() {
        let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n";
        let img = image_bytes(&prepare_image(ptx));
        assert_eq!(&img[..ptx.len()], ptx);
        assert_eq!(img[ptx.len()], 0, "PTX must be NUL-terminated");
        // Exactly 8 bytes of text: the terminator needs a whole extra word.
        let img = image_bytes(&prepare_image(b"12345678"));
        assert_eq!(img.len(), 16);
        assert_eq!(img[8], 0);
    }

    #[test]
    fn binary_images_are_recognised_and_copied_unchanged() {
        let elf = b"\x7fELF\x02\x01\x01\x33abc";
        assert!(looks_binary(elf));
        let fatbin = [0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0];
        assert!(looks_binary(&fatbin));
        assert!(looks_binary(b".version 8.0\n\0"), "already terminated PTX");
        assert!(!looks_binary(b".version 8.0\n"));
        let img = image_bytes(&prepare_image(&fatbin));
        assert_eq!(img, fatbin.to_vec(), "no byte added to an 8-byte binary");
        // The copy is 8-byte aligned even when the input slice is not.
        let src = [b'x'; 33];
        let words = prepare_image(&src[1..]);
        assert_eq!(words.as_ptr() as usize % 8, 0);
    }

    #[test]
    fn jit_log_text_stops_at_nul_and_written_size() {
        let mut buf = b"error: bad\0garbage".to_vec();
        assert_eq!(log_text(&buf, buf.len()), "error: bad");
        assert_eq!(log_text(&buf, 5), "error");
        assert_eq!(log_text(&buf, 1000), "error: bad");
        buf.iter_mut().for_each(|b| *b = 0);
        assert_eq!(log_text(&buf, 10), "");
    }
}
