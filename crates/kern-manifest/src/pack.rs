//! Building a launch's parameter buffer: the bytes `cuLaunchKernel` receives (as one packed
//! buffer through `CU_LAUNCH_PARAM_BUFFER_POINTER`, or sliced per parameter).
//!
//! The layout was checked against the kernel image, so packing is only placing bytes: each
//! kernel parameter's value at its offset, zeros elsewhere.

use crate::manifest::{FieldValue, Launch, LaunchArg};
use crate::types::{KernelParam, Value};

/// What a call passes for one op parameter in a run, after the runtime has resolved its
/// binding: a device address (a buffer, a state pool, or 0 for null), or a scalar value (a
/// var's value converted to the parameter's type, or the call's constant).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    Ptr(u64),
    Scalar(Value),
}

/// The runtime passed values that do not fit the op's signature (a bug in the caller: a
/// checked manifest and correctly resolved bindings never produce this).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    #[error("the launch reads op parameter {0}, but only {1} values were given")]
    MissingArg(usize, usize),
    #[error("kernel parameter {param}: expected {expected}, got {got}")]
    Kind {
        param: usize,
        expected: String,
        got: String,
    },
}

impl Launch {
    /// The parameter buffer for one launch, given the op's argument values in this run.
    pub fn pack(&self, op_args: &[ArgValue]) -> Result<Vec<u8>, PackError> {
        let mut buf = vec![0u8; self.param_bytes as usize];
        for (i, (p, arg)) in self.params.iter().zip(&self.args).enumerate() {
            let at = p.offset as usize;
            match arg {
                LaunchArg::Null => {}
                LaunchArg::Const(v) => put(&mut buf, at, &v.to_le_bytes()),
                LaunchArg::Param(j) => {
                    let v = op_args
                        .get(*j)
                        .ok_or(PackError::MissingArg(*j, op_args.len()))?;
                    let bytes = value_bytes(v, &p.ty, i)?;
                    put(&mut buf, at, &bytes);
                }
                LaunchArg::Struct(fields) => {
                    for f in fields {
                        let bytes = match &f.value {
                            FieldValue::Null => vec![0; 8],
                            FieldValue::Const(v) => v.to_le_bytes(),
                            FieldValue::Param(j) => match op_args
                                .get(*j)
                                .ok_or(PackError::MissingArg(*j, op_args.len()))?
                            {
                                ArgValue::Ptr(a) => a.to_le_bytes().to_vec(),
                                ArgValue::Scalar(v) => v.to_le_bytes(),
                            },
                        };
                        put(&mut buf, at + f.offset as usize, &bytes);
                    }
                }
            }
        }
        Ok(buf)
    }
}

fn value_bytes(v: &ArgValue, ty: &KernelParam, param: usize) -> Result<Vec<u8>, PackError> {
    match (v, ty) {
        (ArgValue::Ptr(a), KernelParam::Buffer { .. } | KernelParam::Ptr) => {
            Ok(a.to_le_bytes().to_vec())
        }
        (ArgValue::Scalar(s), KernelParam::Scalar(t)) if s.scalar() == *t => Ok(s.to_le_bytes()),
        (got, expected) => Err(PackError::Kind {
            param,
            expected: expected.to_string(),
            got: format!("{got:?}"),
        }),
    }
}

/// Copies `bytes` to `buf[at..]`, within the buffer (offsets and sizes were checked).
fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    let end = (at + bytes.len()).min(buf.len());
    if at < end {
        buf[at..end].copy_from_slice(&bytes[..end - at]);
    }
}
