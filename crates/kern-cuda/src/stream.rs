//! Streams (ordered queues of device work) and events (markers in a stream, for
//! cross-stream ordering and GPU-side timing).
//!
//! kern's streams are created non-blocking: they never implicitly wait for the legacy
//! default stream, which is also what stream capture into CUDA graphs requires.

use crate::context::Context;
use crate::driver::too_old;
use crate::error::{check, CudaError, Result};
use cudarc::driver::sys;

/// A non-blocking stream, destroyed on drop (after the driver finishes its queued work).
pub struct Stream {
    raw: sys::CUstream,
    ctx: Context,
}

// SAFETY: a CUstream may be used from any thread with its context current (every method
// binds first); the driver serializes work submitted to one stream.
unsafe impl Send for Stream {}
// SAFETY: see `Send`. Concurrent submissions from several threads are allowed by the driver
// (their relative order is whatever order the calls happen in).
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:p})", self.raw)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` came from cuStreamCreate and is destroyed exactly once. The driver
            // lets queued work finish before releasing the stream. Errors are ignored (Drop).
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

impl Context {
    /// Creates a non-blocking stream.
    pub fn stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// Creates an event that can be used for timing.
    pub fn event(&self) -> Result<Event> {
        Event::new(self, true)
    }
}

impl Stream {
    /// Creates a non-blocking stream (`CU_STREAM_NON_BLOCKING`).
    pub fn new(ctx: &Context) -> Result<Stream> {
        ctx.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: context bound; `raw` is a valid out-pointer; flag value from the binding.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Blocks until all work queued on this stream has completed; returns any error raised
    /// by that work (e.g. a sticky `CUDA_ERROR_ILLEGAL_ADDRESS` from a faulting kernel).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: stream alive; context bound.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// True when all queued work has completed (does not block).
    pub fn is_idle(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: stream alive; context bound.
        let status = unsafe { sys::cuStreamQuery(self.raw) };
        if status == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuStreamQuery", status)?;
        Ok(true)
    }

    /// Makes all work queued on this stream after this call wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.ctx.ensure_same(&event.ctx, "event")?;
        self.ctx.bind()?;
        // SAFETY: stream and event alive, same context; flags 0 = default.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// The raw `CUstream`, valid while `self` lives (for the launcher inside kern-cuda).
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

/// An event, destroyed on drop.
pub struct Event {
    raw: sys::CUevent,
    ctx: Context,
    timing: bool,
}

// SAFETY: a CUevent is a driver handle usable from any thread with its context current.
unsafe impl Send for Event {}
// SAFETY: see `Send`; the driver allows concurrent query/record/synchronize.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:p})", self.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` came from cuEventCreate and is destroyed exactly once. Errors are
            // ignored (Drop).
            unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

impl Event {
    /// Creates an event; with `timing == false` it is cheaper but cannot be used with
    /// [`Event::elapsed_ms`].
    pub fn new(ctx: &Context, timing: bool) -> Result<Event> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        ctx.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context bound; `raw` is a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags as u32)
        })?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
            timing,
        })
    }

    /// Records this event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.ctx.ensure_same(stream.context(), "stream")?;
        self.ctx.bind()?;
        // SAFETY: event and stream alive, same context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.as_raw())
        })
    }

    /// Blocks until the work before the last `record` has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: event alive; context bound.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }

    /// True when the recorded work has completed (does not block).
    pub fn is_complete(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: event alive; context bound.
        let status = unsafe { sys::cuEventQuery(self.raw) };
        if status == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", status)?;
        Ok(true)
    }

    /// Milliseconds of GPU time between `start` and `end` (both recorded and completed;
    /// synchronize `end` first). Resolution is about 0.5 µs.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        if !start.timing || !end.timing {
            return Err(CudaError::invalid(
                "elapsed_ms needs two events created with timing enabled",
            ));
        }
        start.ctx.ensure_same(&end.ctx, "end event")?;
        start.ctx.bind()?;
        let drv = start.ctx.driver();
        let mut ms = 0f32;
        if !drv.has_elapsed_v2 {
            return Err(too_old(
                "cuEventElapsedTime_v2",
                "event timing needs a driver supporting CUDA 12.8 or newer",
            ));
        }
        // SAFETY: both events alive, same context; out-pointer valid; the symbol was verified
        // to exist when the driver was loaded.
        let status = unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, end.raw) };
        check("cuEventElapsedTime_v2", status)?;
        Ok(ms)
    }
}
