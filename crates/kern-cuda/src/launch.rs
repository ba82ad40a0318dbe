//! Kernel launch: [`LaunchConfig`] (validated before the driver sees it), [`PackedArgs`]
//! (a parameter buffer laid out like the kernel's parameter space, producing the
//! `void*[]` array the driver wants) and [`Function::launch`].
//!
//! A launch hands the driver one pointer per parameter; the driver copies `size` bytes from
//! each (sizes and offsets come from the kernel image itself). So the launcher only needs to
//! place each value's bytes: it never needs to know how the kernel was written.

use crate::driver::too_old;
use crate::error::{status_message, status_name, CudaError, Result};
use crate::memory::Scalar;
use crate::module::{Function, ParamSlot};
use crate::stream::Stream;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Largest kernel parameter space (Volta+, CUDA 12.1+), in bytes.
pub const MAX_PARAM_BYTES: usize = 32_764;
/// Hardware limits on block and grid dimensions (all current architectures).
const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
const MAX_BLOCK_THREADS: u64 = 1024;
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
const AXES: [&str; 3] = ["x", "y", "z"];

/// Grid, block, dynamic shared memory and launch options of one kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Number of blocks along x, y, z.
    pub grid: [u32; 3],
    /// Threads per block along x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes (above 48 KiB needs
    /// [`Function::set_max_dynamic_shared`]).
    pub shared_bytes: u32,
    /// Programmatic Dependent Launch: lets this kernel start before the previous kernel in
    /// the stream has finished (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`), so
    /// its prologue overlaps the predecessor's tail. The kernel must call
    /// `cudaGridDependencySynchronize()` (PTX `griddepcontrol.wait`) before reading the
    /// predecessor's output. Takes effect on sm_90+; uses `cuLaunchKernelEx`.
    pub pdl: bool,
}

impl LaunchConfig {
    /// A launch of `grid` blocks of `block` threads with `shared_bytes` of dynamic shared
    /// memory and no PDL.
    pub fn new(grid: [u32; 3], block: [u32; 3], shared_bytes: u32) -> Self {
        LaunchConfig {
            grid,
            block,
            shared_bytes,
            pdl: false,
        }
    }

    /// A 1-D launch covering `n` elements with `block_x` threads per block (grid rounded up;
    /// at least one block).
    pub fn for_elements(n: u32, block_x: u32) -> Self {
        let grid = if block_x == 0 {
            0
        } else {
            n.div_ceil(block_x).max(1)
        };
        Self::new([grid, 1, 1], [block_x, 1, 1], 0)
    }

    /// The same configuration with Programmatic Dependent Launch switched on or off.
    pub fn with_pdl(mut self, pdl: bool) -> Self {
        self.pdl = pdl;
        self
    }

    /// Threads in one block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&d| u64::from(d)).product()
    }

    /// Checks the configuration against the hardware limits, without the driver: every
    /// dimension at least 1, at most 1024 threads per block, grid y/z at most 65,535.
    pub fn validate(&self) -> Result<()> {
        for (i, axis) in AXES.iter().enumerate() {
            if self.grid[i] == 0 || self.block[i] == 0 {
                let which = if self.grid[i] == 0 { "grid" } else { "block" };
                return Err(CudaError::invalid(format!(
                    "launch configuration {}: {which}.{axis} is 0; every grid and block dimension must be at least 1",
                    self.describe()
                )));
            }
            if self.block[i] > MAX_BLOCK[i] {
                return Err(CudaError::invalid(format!(
                    "launch configuration {}: block.{axis} = {} exceeds the limit of {}",
                    self.describe(),
                    self.block[i],
                    MAX_BLOCK[i]
                )));
            }
            if self.grid[i] > MAX_GRID[i] {
                return Err(CudaError::invalid(format!(
                    "launch configuration {}: grid.{axis} = {} exceeds the limit of {}",
                    self.describe(),
                    self.grid[i],
                    MAX_GRID[i]
                )));
            }
        }
        let threads = self.threads_per_block();
        if threads > MAX_BLOCK_THREADS {
            return Err(CudaError::invalid(format!(
                "launch configuration {}: a block of {threads} threads exceeds the limit of {MAX_BLOCK_THREADS} threads per block",
                self.describe()
            )));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        format!("grid ({gx}, {gy}, {gz}) × block ({bx}, {by}, {bz})")
    }
}

/// 16-byte aligned storage unit, so every parameter's bytes sit at an address aligned like
/// its offset in the kernel's parameter space.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

/// A kernel's parameter values packed at the offsets of its parameter layout.
///
/// Build it from [`Function::param_layout`] (or [`PackedArgs::for_function`]), write each
/// parameter's bytes with [`set`](Self::set) / [`set_scalar`](Self::set_scalar), then launch
/// with [`Function::launch_packed`]. The buffer is the exact image of the kernel's parameter
/// space, so it can be reused across launches, changing only what differs.
#[derive(Clone)]
pub struct PackedArgs {
    storage: Vec<Chunk>,
    size: usize,
    slots: Vec<ParamSlot>,
    set: Vec<bool>,
    ptrs: Vec<*mut c_void>,
}

impl std::fmt::Debug for PackedArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedArgs")
            .field("slots", &self.slots)
            .field("bytes", &self.bytes())
            .finish()
    }
}

// SAFETY: the only raw pointers are the cached `ptrs`, which point into `storage` owned by
// this value (a plain byte buffer); moving or sharing the value moves/shares that buffer.
unsafe impl Send for PackedArgs {}
// SAFETY: `&PackedArgs` gives read-only access; `ptrs` is only produced through `&mut self`.
unsafe impl Sync for PackedArgs {}

impl PackedArgs {
    /// An all-zero buffer for `layout` (one slot per parameter, in order). Slots must not
    /// overlap and must fit in the 32,764-byte parameter space.
    pub fn new(layout: &[ParamSlot]) -> Result<Self> {
        let mut size = 0usize;
        for (i, s) in layout.iter().enumerate() {
            let end = s
                .offset
                .checked_add(s.size)
                .filter(|&e| e <= MAX_PARAM_BYTES)
                .ok_or_else(|| {
                    CudaError::invalid(format!(
                        "parameter {i} (offset {}, size {}) does not fit in the {MAX_PARAM_BYTES}-byte parameter space",
                        s.offset, s.size
                    ))
                })?;
            for (j, t) in layout[..i].iter().enumerate() {
                if s.size > 0 && t.size > 0 && s.offset < t.offset + t.size && t.offset < end {
                    return Err(CudaError::invalid(format!(
                        "parameter {i} (offset {}, size {}) overlaps parameter {j} (offset {}, size {})",
                        s.offset, s.size, t.offset, t.size
                    )));
                }
            }
            size = size.max(end);
        }
        Ok(PackedArgs {
            storage: vec![Chunk([0; 16]); size.div_ceil(16).max(1)],
            size,
            slots: layout.to_vec(),
            set: vec![false; layout.len()],
            ptrs: Vec::with_capacity(layout.len()),
        })
    }

    /// A buffer laid out for `f`'s parameters (queries `cuFuncGetParamInfo` once).
    pub fn for_function(f: &Function) -> Result<Self> {
        Self::new(&f.param_layout()?)
    }

    /// The layout this buffer was built for.
    pub fn layout(&self) -> &[ParamSlot] {
        &self.slots
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True for a kernel without parameters.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The packed parameter bytes (the kernel's parameter-space image).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `storage` holds at least `size` initialized bytes (`Chunk` is plain bytes
        // with no padding); the borrow of `self` keeps it alive and unmodified.
        unsafe { std::slice::from_raw_parts(self.storage.as_ptr().cast::<u8>(), self.size) }
    }

    /// The packed bytes, for a caller that writes parameters at their offsets itself. Every
    /// parameter then counts as set.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.set.iter_mut().for_each(|s| *s = true);
        // SAFETY: as in `bytes`, with exclusive access; any byte value is valid.
        unsafe { std::slice::from_raw_parts_mut(self.storage.as_mut_ptr().cast::<u8>(), self.size) }
    }

    /// Writes parameter `index`'s value; `value` must be exactly the parameter's size.
    pub fn set(&mut self, index: usize, value: &[u8]) -> Result<()> {
        let slot = *self.slots.get(index).ok_or_else(|| {
            CudaError::invalid(format!(
                "parameter index {index} is out of range: the kernel has {} parameter(s)",
                self.slots.len()
            ))
        })?;
        if value.len() != slot.size {
            return Err(CudaError::invalid(format!(
                "parameter {index} is {} bytes, but a {}-byte value was given",
                slot.size,
                value.len()
            )));
        }
        let off = slot.offset;
        self.bytes_mut_raw()[off..off + slot.size].copy_from_slice(value);
        self.set[index] = true;
        Ok(())
    }

    /// Writes a scalar parameter (e.g. `u64` device pointer, `i32`, `f32`) in native byte
    /// order; its size must match the parameter's.
    pub fn set_scalar<T: Scalar>(&mut self, index: usize, value: T) -> Result<()> {
        self.set(index, crate::memory::as_bytes(std::slice::from_ref(&value)))
    }

    fn bytes_mut_raw(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes_mut`.
        unsafe { std::slice::from_raw_parts_mut(self.storage.as_mut_ptr().cast::<u8>(), self.size) }
    }

    /// The `void*[]` array for `cuLaunchKernel`: entry `i` points at parameter `i`'s bytes
    /// inside this buffer. Fails if a parameter was never written. The pointers are valid
    /// until `self` is next modified, moved or dropped.
    pub fn kernel_params(&mut self) -> Result<&mut [*mut c_void]> {
        if let Some(i) = self.set.iter().position(|s| !s) {
            return Err(CudaError::invalid(format!("parameter {i} was never set")));
        }
        let base = self.storage.as_mut_ptr().cast::<u8>();
        self.ptrs.clear();
        for s in &self.slots {
            // SAFETY: `new` checked offset + size <= size <= storage bytes, so the offset
            // stays inside the allocation (offset == size only for a zero-size slot at the end).
            self.ptrs.push(unsafe { base.add(s.offset) }.cast());
        }
        Ok(&mut self.ptrs)
    }
}

impl Function {
    /// Launches this kernel on `stream` with one pointer per parameter in `params`.
    ///
    /// The configuration is validated first (zero or oversized dimensions are rejected
    /// without calling the driver). With `cfg.pdl` the launch goes through
    /// `cuLaunchKernelEx` with the programmatic-stream-serialization attribute.
    ///
    /// # Safety
    /// - `params.len()` must equal the kernel's parameter count, and `params[i]` must point
    ///   at `size_i` readable bytes holding parameter `i` exactly as the kernel's layout
    ///   ([`Function::param_layout`]) expects. The driver copies them before returning, so
    ///   they need only live for the duration of this call.
    /// - Every device address passed in a parameter must reference memory that is large
    ///   enough for everything the kernel accesses and that stays allocated until the kernel
    ///   has finished; the kernel's accesses must not race with other work on that memory.
    pub unsafe fn launch(
        &self,
        cfg: LaunchConfig,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        cfg.validate()?;
        let ctx = self.context();
        ctx.ensure_same(stream.context(), "stream")?;
        if let Some(layout) = self.cached_layout() {
            if layout.len() != params.len() {
                return Err(CudaError::invalid(format!(
                    "kernel `{}` takes {} parameter(s) but {} were given",
                    self.name(),
                    layout.len(),
                    params.len()
                )));
            }
        }
        let optin = ctx.props().max_shared_per_block_optin;
        if cfg.shared_bytes > optin {
            return Err(CudaError::invalid(format!(
                "kernel `{}`: {} bytes of dynamic shared memory requested, but the device allows at most {optin} per block",
                self.name(),
                cfg.shared_bytes
            )));
        }
        let params_ptr = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        ctx.bind()?;
        let [gx, gy, gz] = cfg.grid;
        let [bx, by, bz] = cfg.block;
        let (call, status) = if cfg.pdl {
            if !ctx.driver().has_launch_ex {
                return Err(too_old(
                    "cuLaunchKernelEx",
                    "PDL launches need CUDA 11.8 or newer",
                ));
            }
            let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: gx,
                gridDimY: gy,
                gridDimZ: gz,
                blockDimX: bx,
                blockDimY: by,
                blockDimZ: bz,
                sharedMemBytes: cfg.shared_bytes,
                hStream: stream.as_raw(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: function, stream alive and in the bound context; `config` and `attr`
            // outlive the call; the caller guarantees `params` matches the kernel's layout;
            // `extra` is null (never both).
            let st = unsafe {
                sys::cuLaunchKernelEx(&config, self.as_raw(), params_ptr, std::ptr::null_mut())
            };
            ("cuLaunchKernelEx", st)
        } else {
            // SAFETY: as above, with the plain launch entry point.
            let st = unsafe {
                sys::cuLaunchKernel(
                    self.as_raw(),
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    cfg.shared_bytes,
                    stream.as_raw(),
                    params_ptr,
                    std::ptr::null_mut(),
                )
            };
            ("cuLaunchKernel", st)
        };
        if status == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        Err(self.launch_error(call, status, &cfg))
    }

    /// Launches with a [`PackedArgs`] built for this kernel; checks that its layout is this
    /// kernel's layout (when the driver can report it) and that every parameter was set.
    ///
    /// # Safety
    /// The second point of [`Function::launch`]'s contract: every device address written
    /// into `args` must stay valid for what the kernel does with it, until it finishes.
    pub unsafe fn launch_packed(
        &self,
        cfg: LaunchConfig,
        stream: &Stream,
        args: &mut PackedArgs,
    ) -> Result<()> {
        if self.context().driver().has_param_info {
            let layout = self.param_layout()?;
            if layout.as_slice() != args.layout() {
                return Err(CudaError::invalid(format!(
                    "the packed arguments were laid out for a different kernel than `{}` (layout {:?}, kernel expects {:?})",
                    self.name(),
                    args.layout(),
                    layout
                )));
            }
        }
        let params = args.kernel_params()?;
        // SAFETY: `params` points into `args`, which holds exactly this kernel's layout (checked
        // above when possible) with every parameter written; the caller upholds the rest.
        unsafe { self.launch(cfg, stream, params) }
    }

    fn launch_error(
        &self,
        call: &'static str,
        status: sys::CUresult,
        cfg: &LaunchConfig,
    ) -> CudaError {
        let mut message = status_message(status);
        let props = self.context().props();
        if status == sys::CUresult::CUDA_ERROR_INVALID_VALUE
            && cfg.shared_bytes > props.max_shared_per_block
        {
            message.push_str(&format!(
                " (kernel `{}` asks for {} bytes of dynamic shared memory; above {} call Function::set_max_dynamic_shared first)",
                self.name(),
                cfg.shared_bytes,
                props.max_shared_per_block
            ));
        } else if status == sys::CUresult::CUDA_ERROR_INVALID_VALUE
            || status == sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        {
            message.push_str(&format!(
                " (kernel `{}`, {} threads per block: check the block size against the kernel's max_threads_per_block and registers)",
                self.name(),
                cfg.threads_per_block()
            ));
        }
        CudaError::Driver {
            call,
            code: status as i32,
            name: status_name(status),
            message,
        }
    }
}
