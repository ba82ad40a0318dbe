//! The runtime's error type: every variant says what failed, where (call label, buffer, file)
//! and, where it can, what to change.

use kern_cuda::CudaError;

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A CUDA error with the context it happened in.
    #[error("{what}: {cause}")]
    CudaAt {
        what: String,
        cause: Box<CudaError>,
    },
    /// A kernel failed while a program ran.
    #[error("call `{label}` (op `{op}`, launch {launch}: kernel `{kernel}`) failed: {cause}")]
    KernelFault {
        label: String,
        op: String,
        launch: usize,
        kernel: String,
        cause: Box<CudaError>,
    },
    /// The buffers and states do not fit in the memory budget.
    #[error("{0}")]
    DoesNotFit(String),
    /// The kernel image and the driver disagree, or the manifest cannot run as declared.
    #[error("{0}")]
    Mismatch(String),
    /// A var value is missing, unknown or out of range.
    #[error("{0}")]
    Var(String),
    /// Host data (an input file, an output request) is unusable.
    #[error("{0}")]
    Data(String),
    #[error(transparent)]
    Weights(#[from] kern_weights::WeightsError),
    #[error("{file}: {cause}")]
    Io {
        file: String,
        cause: std::io::Error,
    },
}

impl RuntimeError {
    pub(crate) fn cuda(what: impl Into<String>) -> impl FnOnce(CudaError) -> RuntimeError {
        let what = what.into();
        move |cause| RuntimeError::CudaAt { what, cause: Box::new(cause) }
    }
}
