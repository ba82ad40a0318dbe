//! CUDA graphs by stream capture: record a sequence of launches and copies once, then
//! replay it with one driver call ([`GraphExec::launch`]), which costs well under a
//! microsecond per kernel instead of several for eager launches.
//!
//! # Capture mode
//! [`Stream::begin_capture`] uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: while this thread
//! captures, "unsafe" calls *from this thread* (synchronous copies, `cuMemAlloc`, context
//! synchronization, ...) fail instead of silently escaping the graph, but other threads (an
//! HTTP front end, a loader thread) keep working. `GLOBAL` mode would make their legitimate
//! calls fail for as long as any capture is active anywhere in the process. Use
//! [`Stream::begin_capture_with`] to choose another mode.
//!
//! A graph refers to kernels and device memory without owning them: keep the modules and
//! buffers it uses alive for as long as the graph may be launched.

use crate::context::Context;
use crate::error::{check, CudaError, Result};
use crate::stream::Stream;
use cudarc::driver::sys;

/// Which driver calls a stream capture forbids (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Forbid unsafe calls from the capturing thread only (kern's default).
    #[default]
    ThreadLocal,
    /// Forbid unsafe calls from every thread while any global capture is active.
    Global,
    /// Forbid nothing (the caller takes responsibility).
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Capture state of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing.
    Active,
    /// Capturing, but an error invalidated the capture; `end_capture` will fail.
    Invalidated,
}

impl Stream {
    /// Starts capturing this stream's work into a graph (thread-local mode).
    pub fn begin_capture(&self) -> Result<()> {
        self.begin_capture_with(CaptureMode::ThreadLocal)
    }

    /// Starts capturing with an explicit [`CaptureMode`].
    pub fn begin_capture_with(&self, mode: CaptureMode) -> Result<()> {
        self.context().bind()?;
        // SAFETY: stream alive (non-blocking, so capturable); context bound.
        check("cuStreamBeginCapture_v2", unsafe {
            sys::cuStreamBeginCapture_v2(self.as_raw(), mode.raw())
        })
    }

    /// Ends the capture and returns the recorded graph. If the capture was invalidated by an
    /// earlier error, the partial graph is destroyed and the error is returned.
    pub fn end_capture(&self) -> Result<Graph> {
        self.context().bind()?;
        let mut raw: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: stream alive; `raw` is a valid out-pointer.
        let status = unsafe { sys::cuStreamEndCapture(self.as_raw(), &mut raw) };
        if status != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: a graph handed back alongside an error is ours to destroy.
                unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(CudaError::from_status("cuStreamEndCapture", status));
        }
        if raw.is_null() {
            return Err(CudaError::invalid(
                "stream capture ended without producing a graph",
            ));
        }
        Ok(Graph {
            raw,
            ctx: self.context().clone(),
        })
    }

    /// Ends a capture and throws the result away (for error paths). Never fails.
    pub fn abort_capture(&self) {
        if !matches!(
            self.capture_status(),
            Ok(CaptureStatus::Active | CaptureStatus::Invalidated)
        ) {
            return;
        }
        let mut raw: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: stream alive and capturing; the graph (if any) is destroyed right away.
        unsafe {
            sys::cuStreamEndCapture(self.as_raw(), &mut raw);
            if !raw.is_null() {
                sys::cuGraphDestroy(raw);
            }
        }
    }

    /// Whether this stream is capturing.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        self.context().bind()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: stream alive; out-pointer valid.
        check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(self.as_raw(), &mut st)
        })?;
        Ok(match st {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
                CaptureStatus::Invalidated
            }
        })
    }

    /// Captures everything `record` queues on this stream into a graph. If `record` fails
    /// (or panics), the capture is ended cleanly, the partial graph destroyed, and
    /// `record`'s error returned.
    pub fn capture<F>(&self, record: F) -> Result<Graph>
    where
        F: FnOnce(&Stream) -> Result<()>,
    {
        self.begin_capture()?;
        let guard = CaptureGuard { stream: self };
        record(self)?; // on error the guard aborts the capture
        std::mem::forget(guard);
        self.end_capture()
    }
}

/// Aborts an in-progress capture when dropped (error return or panic inside `capture`).
struct CaptureGuard<'a> {
    stream: &'a Stream,
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        self.stream.abort_capture();
    }
}

/// A captured graph (a template), destroyed on drop.
pub struct Graph {
    raw: sys::CUgraph,
    ctx: Context,
}

// SAFETY: graph handles may move between threads; they are not `Sync` because the driver
// does not allow concurrent use of one graph object.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({:p})", self.raw)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` came from cuStreamEndCapture and is destroyed exactly once;
            // instantiated executables do not depend on it. Errors are ignored (Drop).
            unsafe { sys::cuGraphDestroy(self.raw) };
        }
    }
}

impl Graph {
    /// Number of nodes (kernels, copies, memsets, ...) in the graph.
    pub fn node_count(&self) -> Result<usize> {
        self.ctx.bind()?;
        let mut n = 0usize;
        // SAFETY: graph alive; a null node array asks only for the count.
        check("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut n)
        })?;
        Ok(n)
    }

    /// Builds an executable graph that can be launched repeatedly.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.ctx.bind()?;
        let mut raw: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph alive; out-pointer valid; flags 0 = default.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)
        })?;
        Ok(GraphExec {
            raw,
            ctx: self.ctx.clone(),
        })
    }
}

/// An instantiated graph, destroyed on drop.
pub struct GraphExec {
    raw: sys::CUgraphExec,
    ctx: Context,
}

// SAFETY: may move between threads; not `Sync` (one executable graph must not be launched
// from two threads at once).
unsafe impl Send for GraphExec {}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphExec({:p})", self.raw)
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` came from cuGraphInstantiateWithFlags and is destroyed exactly once.
            // Errors are ignored (Drop).
            unsafe { sys::cuGraphExecDestroy(self.raw) };
        }
    }
}

impl GraphExec {
    /// Queues one replay of the graph on `stream`.
    ///
    /// # Safety
    /// The kernels replay with the parameters captured at record time: the same contract as
    /// [`Function::launch`](crate::Function::launch) applies again, so every module and
    /// device buffer the captured work references must still be alive.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        self.ctx.ensure_same(stream.context(), "stream")?;
        self.ctx.bind()?;
        // SAFETY: executable graph and stream alive, same context; the caller guarantees the
        // captured work's memory and modules are still alive.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.raw, stream.as_raw())
        })
    }

    /// Uploads the graph's work descriptors to the device ahead of the first launch, so the
    /// first replay is as fast as later ones.
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        self.ctx.ensure_same(stream.context(), "stream")?;
        self.ctx.bind()?;
        // SAFETY: executable graph and stream alive, same context.
        check("cuGraphUpload", unsafe {
            sys::cuGraphUpload(self.raw, stream.as_raw())
        })
    }
}
