//! Bytes a call moves, from the manifest alone: the performance diff's "what did the new format
//! buy". A decode step is bandwidth-bound, so its floor is the bytes it must move over the
//! device's bandwidth; an FP8 or 4-bit weight format lowers the bytes, and the report shows
//! both sides' bytes, achieved GB/s and floor per interval and per op.
//!
//! Counted: every buffer the call binds, at the step's var values — once if it is read
//! (`in`), once if written (`out`), twice if both (`inout`); a buffer bound to an untyped
//! `ptr` is read if it is a weight or an input, else read and written (the matching's rule).
//! Not counted: state pools (the KV cache) — which pages and how much of a pool a call
//! touches belongs to its kernels — and re-reads a kernel makes of the same buffer. So the
//! count is the traffic a perfect kernel needs for its buffers: a floor, not a measurement —
//! except for gathers, which the manifest cannot tell apart: an embedding lookup is counted as
//! reading its whole table (its row in the report shows it; compare its two sides, not its
//! GB/s).

use kern_manifest::manifest::{Binding, Manifest};
use kern_manifest::{OpParam, Role};

/// Bytes call `call` of program `program` moves at `vars`; None when a size does not evaluate.
pub fn call_bytes(m: &Manifest, program: usize, call: usize, vars: &[i64]) -> Option<u64> {
    let c = &m.programs.get(program)?.calls.get(call)?;
    let op = &m.ops[c.op.0];
    let mut total = 0u64;
    for (p, arg) in op.params.iter().zip(&c.args) {
        let Binding::Buf(b) = arg else { continue };
        let times = match p {
            OpParam::Buffer { access, .. } => u64::from(access.reads()) + u64::from(access.writes()),
            OpParam::Ptr if matches!(m.buffers[b.0].role, Role::Weight | Role::Input) => 1,
            OpParam::Ptr => 2,
            _ => 0,
        };
        total = total.checked_add(times.checked_mul(m.buffer_bytes(*b, vars).ok()?)?)?;
    }
    Some(total)
}

/// Bytes calls `calls` of program 0 move at `vars`.
pub fn range_bytes(m: &Manifest, calls: std::ops::Range<usize>, vars: &[i64]) -> Option<u64> {
    calls.map(|i| call_bytes(m, 0, i, vars)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_add_reads_two_buffers_and_writes_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vecadd/model.json");
        let m = kern_manifest::load(&path, &kern_manifest::CheckOptions::default()).unwrap();
        // vec_add(A in, B in, C out), f32[n]: 3 × 4 bytes per element.
        assert_eq!(call_bytes(&m, 0, 0, &[4]), Some(48));
        assert_eq!(call_bytes(&m, 0, 0, &[1]), Some(12));
        assert_eq!(range_bytes(&m, 0..m.programs[0].calls.len(), &[2]), Some(24 * m.programs[0].calls.len() as u64));
        assert_eq!(call_bytes(&m, 0, 99, &[4]), None);
    }
}
