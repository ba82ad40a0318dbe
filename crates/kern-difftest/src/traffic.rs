//! Bytes a call moves, from the manifest alone: the performance diff's "what did the new format
//! buy". A decode step is bandwidth-bound, so its floor is the bytes it must move over the
//! device's bandwidth; an FP8 or 4-bit weight format lowers the bytes, and the report shows
//! both sides' bytes, achieved GB/s and floor per interval and per op.
//!
//! Counted: every buffer the call binds, at the step's var values — once if it is read
//! (`in`), once if written (`out`), twice if both (`inout`); a buffer bound to an untyped
//! `ptr` is read if it is a weight or an input, else read and written (the matching's rule).
//! Not counted: state pools (the KV cache) — which pages and how much of a pool a call
//! touches belongs to its kernels — re-reads a kernel makes of the same buffer, and the
//! buffers only launches with an empty grid at these vars would touch (a GGUF-native
//! projection's dequantization scratch is bound at every step and used only by its prefill
//! launches, whose grids are zero in a decode step). So the
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
    let live = live_params(op, vars);
    let mut total = 0u64;
    for (i, (p, arg)) in op.params.iter().zip(&c.args).enumerate() {
        let Binding::Buf(b) = arg else { continue };
        if !live[i] {
            continue;
        }
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

/// Which of `op`'s parameters a launch that runs at `vars` passes to its kernel. A launch runs
/// unless one of its grid dimensions evaluates to 0 or less; a grid that does not evaluate
/// counts as running (the conservative side: its buffers are counted). An op without launches
/// (a collective) uses every parameter.
fn live_params(op: &kern_manifest::manifest::Op, vars: &[i64]) -> Vec<bool> {
    use kern_manifest::manifest::{FieldValue, LaunchArg};
    if op.launches.is_empty() {
        return vec![true; op.params.len()];
    }
    let mut live = vec![false; op.params.len()];
    for l in &op.launches {
        if !l.runs(vars).unwrap_or(true) {
            continue;
        }
        let mut mark = |i: usize| {
            if let Some(x) = live.get_mut(i) {
                *x = true;
            }
        };
        for a in &l.args {
            match a {
                LaunchArg::Param(i) => mark(*i),
                LaunchArg::Struct(fields) => fields.iter().for_each(|f| {
                    if let FieldValue::Param(i) = f.value {
                        mark(i)
                    }
                }),
                LaunchArg::Const(_) | LaunchArg::Null => {}
            }
        }
    }
    live
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

    /// vecadd with a second launch that writes a scratch D only when n > 2 (a grid of
    /// max(0, n - 2)), as a GGUF-native projection's dequantization runs only in prefill steps.
    #[test]
    fn a_buffer_only_an_idle_launch_binds_is_not_counted() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vecadd");
        let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
        j["buffers"]["D"] = serde_json::json!({"dtype": "f32", "shape": ["n"], "role": "activation"});
        let op = &mut j["ops"]["vec_add"];
        op["params"].as_array_mut().unwrap().push("out buffer<f32>".into());
        let mut second = op["impl"]["launches"][0].clone();
        second["grid"] = serde_json::json!(["max(0, n - 2)", 1, 1]);
        second["args"] = serde_json::json!([{"param": 0}, {"param": 1}, {"param": 3}]);
        op["impl"]["launches"].as_array_mut().unwrap().push(second);
        j["program"]["calls"][0]["args"].as_array_mut().unwrap().push(serde_json::json!({"buf": "D"}));
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(dir.join("vecadd.sm_90.cubin"), tmp.path().join("vecadd.sm_90.cubin")).unwrap();
        let path = tmp.path().join("model.json");
        std::fs::write(&path, serde_json::to_string(&j).unwrap()).unwrap();
        let m = kern_manifest::load(&path, &kern_manifest::CheckOptions::default()).unwrap();
        // n = 2: only the first launch runs: A, B read, C written.
        assert_eq!(call_bytes(&m, 0, 0, &[2]), Some(3 * 8));
        // n = 4: both run: D is written too.
        assert_eq!(call_bytes(&m, 0, 0, &[4]), Some(4 * 16));
    }
}
