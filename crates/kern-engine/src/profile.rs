//! `kern profile`: one step's GPU time per program call, summed per op and per layer, with the
//! bytes each call's buffers hold and the bandwidth that implies, as a table and as a
//! Chrome / Perfetto trace. The aggregation and the trace are pure (tested on the CPU); the
//! timings come from [`crate::gpu::GpuModel::profile_step`].

use serde_json::json;

/// One call's measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct CallTiming {
    pub label: String,
    pub op: String,
    pub ms: f64,
    /// Bytes of the buffers the call binds, at the step's var values (states not counted).
    pub bytes: u64,
}

/// A sum over calls that share a key (an op, or a layer).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub key: String,
    pub calls: usize,
    pub ms: f64,
    pub bytes: u64,
}

/// The layer of a call label: the part before the first `.` (`l7.input_norm` → `l7`); labels
/// without one are their own group.
pub fn layer_of(label: &str) -> &str {
    label.split_once('.').map_or(label, |(l, _)| l)
}

fn group_by(calls: &[CallTiming], key: impl Fn(&CallTiming) -> String) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for c in calls {
        let k = key(c);
        match out.iter_mut().find(|g| g.key == k) {
            Some(g) => {
                g.calls += 1;
                g.ms += c.ms;
                g.bytes += c.bytes;
            }
            None => out.push(Group { key: k, calls: 1, ms: c.ms, bytes: c.bytes }),
        }
    }
    out.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    out
}

/// Sums per op, most time first.
pub fn by_op(calls: &[CallTiming]) -> Vec<Group> {
    group_by(calls, |c| c.op.clone())
}

/// Sums per layer, most time first.
pub fn by_layer(calls: &[CallTiming]) -> Vec<Group> {
    group_by(calls, |c| layer_of(&c.label).to_string())
}

/// GB/s of `bytes` in `ms`.
pub fn gbs(bytes: u64, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms / 1e3) / 1e9
    } else {
        0.0
    }
}

/// A Chrome trace (`chrome://tracing`, Perfetto): one complete event per call, back to back
/// in program order (the calls were timed one by one).
pub fn chrome_trace(calls: &[CallTiming], step: &str) -> serde_json::Value {
    let mut t = 0.0f64;
    let mut events = Vec::new();
    for c in calls {
        let dur = c.ms * 1e3;
        events.push(json!({"name": c.label, "cat": c.op, "ph": "X", "ts": t, "dur": dur, "pid": 0, "tid": 0,
                           "args": {"op": c.op, "bytes": c.bytes, "GB/s": gbs(c.bytes, c.ms)}}));
        t += dur;
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"step": step, "tool": "kern profile"}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(label: &str, op: &str, ms: f64, bytes: u64) -> CallTiming {
        CallTiming { label: label.into(), op: op.into(), ms, bytes }
    }

    #[test]
    fn sums_per_op_and_layer_and_a_trace_in_program_order() {
        let calls = [c("embed", "embedding", 0.1, 100), c("l0.qkv", "gemm", 1.0, 4_000_000), c("l0.attn", "attention", 0.5, 10), c("l1.qkv", "gemm", 1.5, 4_000_000)];
        let ops = by_op(&calls);
        assert_eq!(ops[0], Group { key: "gemm".into(), calls: 2, ms: 2.5, bytes: 8_000_000 });
        assert_eq!(ops.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(), vec!["gemm", "attention", "embedding"]);
        let layers = by_layer(&calls);
        assert_eq!(layers.iter().map(|g| (g.key.as_str(), g.calls)).collect::<Vec<_>>(), vec![("l0", 2), ("l1", 1), ("embed", 1)]);
        assert!((gbs(4_000_000, 1.0) - 4.0).abs() < 1e-12);
        let t = chrome_trace(&calls, "decode");
        let ev = t["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!((ev[1]["ts"].as_f64(), ev[1]["dur"].as_f64()), (Some(100.0), Some(1000.0)));
        assert_eq!(ev[3]["ts"].as_f64(), Some(1600.0), "back to back");
        assert_eq!(ev[0]["ph"], "X");
    }
}
