//! kern-cuda: the one crate in kern that talks to the CUDA driver.
//!
//! **Invariant: only kern-cuda calls the driver.** Every other crate (binary parsing,
//! manifests, planning, the runtime, the CLI) works with the safe types here and never
//! touches `cudarc` or a raw `CU*` handle. That keeps every `unsafe` driver call, with its
//! `// SAFETY:` justification, in one reviewable place.
//!
//! The driver library (libcuda) is opened at run time, never at build time: building needs
//! no CUDA toolkit, and on a machine without a driver [`Context::new`] returns
//! [`CudaError::NoDriver`] instead of panicking. Everything else needs a [`Context`], so no
//! other entry point can reach the driver first.
//!
//! What is here:
//! - [`Context`] (a device's primary context) and [`DeviceProps`];
//! - [`Module`] / [`Function`]: load cubin, fatbin or PTX images, find kernels, read their
//!   parameter layout ([`ParamSlot`]) and attributes ([`FuncAttributes`]);
//! - [`DeviceBuffer`] and [`PinnedBuffer`] with blocking and stream-ordered copies;
//! - [`Stream`] and [`Event`];
//! - [`LaunchConfig`], [`PackedArgs`] and [`Function::launch`] (with optional
//!   Programmatic Dependent Launch);
//! - [`Graph`] / [`GraphExec`] by stream capture;
//! - [`nccl`]: NCCL loaded at run time (a typed error when libnccl is missing), communicators
//!   and collectives for tensor parallelism; [`bootstrap`]: the unique id exchanged over TCP
//!   between nodes (no GPU, no NCCL needed).
//!
//! # Example: VecAdd end to end
//! ```no_run
//! use kern_cuda::{as_bytes, as_bytes_mut, Context, LaunchConfig, PackedArgs};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cubin = std::fs::read("vecadd.sm90.cubin")?; // nvcc -cubin -arch=sm_90
//! let ctx = Context::new(0)?;
//! let module = ctx.load_module(&cubin)?;
//! let vec_add = module.function("_Z6VecAddPfS_S_")?; // VecAdd(float*, float*, float*)
//!
//! let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [10.0f32, 20.0, 30.0, 40.0]);
//! let bytes = std::mem::size_of_val(&a);
//! let (da, db, dc) = (ctx.alloc(bytes)?, ctx.alloc(bytes)?, ctx.alloc_zeroed(bytes)?);
//! da.copy_from_host(0, as_bytes(&a))?;
//! db.copy_from_host(0, as_bytes(&b))?;
//!
//! let mut args = PackedArgs::for_function(&vec_add)?; // 3 slots: (0,8) (8,8) (16,8)
//! args.set_scalar(0, da.ptr())?;
//! args.set_scalar(1, db.ptr())?;
//! args.set_scalar(2, dc.ptr())?;
//! let stream = ctx.stream()?;
//! // SAFETY: the three buffers hold 4 floats each, as VecAdd with 4 threads reads/writes.
//! unsafe { vec_add.launch_packed(LaunchConfig::new([1, 1, 1], [4, 1, 1], 0), &stream, &mut args)? };
//! stream.synchronize()?;
//!
//! let mut c = [0f32; 4];
//! dc.copy_to_host(0, as_bytes_mut(&mut c))?;
//! assert_eq!(c, [11.0, 22.0, 33.0, 44.0]);
//! # Ok(())
//! # }
//! ```

mod context;
mod driver;
mod error;
mod graph;
mod launch;
mod memory;
mod module;
pub mod bootstrap;
pub mod nccl;
mod stream;

pub use context::{Context, DeviceProps};
pub use driver::driver_available;
pub use error::{CudaError, Result, NO_DRIVER_MESSAGE};
pub use graph::{CaptureMode, CaptureStatus, Graph, GraphExec};
pub use launch::{LaunchConfig, PackedArgs, MAX_PARAM_BYTES};
pub use memory::{as_bytes, as_bytes_mut, DeviceBuffer, PinnedBuffer, Scalar};
pub use module::{FuncAttributes, Function, Module, ParamSlot};
pub use stream::{Event, Stream};
