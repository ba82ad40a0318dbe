//! A fast writer for the one record written per kernel launch.
//!
//! The injection library writes a `launch` / `graph_node` record inside every launch call, so
//! its cost is added to every launch of the traced program. serde_json spends about a
//! microsecond on one; this writer produces the same bytes (tested byte for byte against
//! serde_json below) in a fraction of that, by writing the fixed keys as constants and the
//! numbers with `itoa`. Every other record type is rare and goes through serde.

use crate::format::{GraphRef, LaunchRecord, ParamSource};

/// Appends `r` as a JSON line (with the trailing `\n`), tagged `graph_node` if `node`, else
/// `launch`: exactly what `serde_json` writes for `Record::GraphNode(r)` / `Record::Launch(r)`.
pub fn write_launch_line(out: &mut Vec<u8>, node: bool, r: &LaunchRecord) {
    out.extend_from_slice(if node {
        br#"{"type":"graph_node","seq":"#
    } else {
        br#"{"type":"launch","seq":"#
    });
    int(out, r.seq);
    out.extend_from_slice(br#","api":"#);
    string(out, r.api.name());
    out.extend_from_slice(br#","tid":"#);
    int(out, r.tid);
    out.extend_from_slice(br#","ctx":"#);
    int(out, r.ctx);
    out.extend_from_slice(br#","stream":"#);
    int(out, r.stream);
    out.extend_from_slice(br#","kernel":"#);
    string(out, &r.kernel);
    out.extend_from_slice(br#","module_id":"#);
    match r.module_id {
        Some(id) => int(out, id),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","module_sha256":"#);
    match &r.module_sha256 {
        Some(sha) => string(out, sha),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","attribution":"#);
    string(out, r.attribution.name());
    if !r.candidates.is_empty() {
        out.extend_from_slice(br#","candidates":["#);
        for (i, c) in r.candidates.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, c);
        }
        out.push(b']');
    }
    out.extend_from_slice(br#","grid":"#);
    dims(out, r.grid);
    out.extend_from_slice(br#","block":"#);
    dims(out, r.block);
    out.extend_from_slice(br#","shared":"#);
    int(out, r.shared);
    out.extend_from_slice(br#","params":""#);
    hex(out, &r.params.0);
    out.extend_from_slice(br#"","param_layout":"#);
    match &r.param_layout {
        Some(slots) => {
            out.push(b'[');
            for (i, s) in slots.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                int(out, s.0);
                out.push(b',');
                int(out, s.1);
                out.push(b']');
            }
            out.push(b']');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","params_from":"#);
    string(out, param_source_name(r.params_from));
    if !r.attrs.is_empty() {
        out.extend_from_slice(br#","attrs":"#);
        // Rare (cuLaunchKernelEx with attributes): serde is fine.
        let _ = serde_json::to_writer(&mut *out, &r.attrs);
    }
    if let Some(g) = &r.graph {
        out.extend_from_slice(br#","graph":"#);
        graph(out, g);
    }
    if r.result != 0 {
        out.extend_from_slice(br#","result":"#);
        int(out, r.result);
    }
    out.extend_from_slice(b"}\n");
}

fn param_source_name(p: ParamSource) -> &'static str {
    match p {
        ParamSource::KernelParams => "kernel_params",
        ParamSource::Extra => "extra",
        ParamSource::ExtraTruncated => "extra_truncated",
        ParamSource::None => "none",
        ParamSource::Unavailable => "unavailable",
    }
}

fn graph(out: &mut Vec<u8>, g: &GraphRef) {
    out.extend_from_slice(br#"{"graph":"#);
    int(out, g.graph);
    if let Some(id) = g.capture_id {
        out.extend_from_slice(br#","capture_id":"#);
        int(out, id);
    }
    if let Some(n) = g.node {
        out.extend_from_slice(br#","node":"#);
        int(out, n);
    }
    out.push(b'}');
}

fn int<I: itoa::Integer>(out: &mut Vec<u8>, v: I) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn dims(out: &mut Vec<u8>, d: [u32; 3]) {
    out.push(b'[');
    int(out, d[0]);
    out.push(b',');
    int(out, d[1]);
    out.push(b',');
    int(out, d[2]);
    out.push(b']');
}

/// A JSON string: copied as is when nothing needs escaping (kernel names, hashes), else
/// through serde_json.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * bytes.len());
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize]);
        out.push(DIGITS[(b & 15) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Api, Attribution, GraphRef, Hex, LaunchAttr, ParamSlot, Record};
    use std::sync::Arc;

    fn base() -> LaunchRecord {
        LaunchRecord {
            seq: 12345678901,
            api: Api::LaunchKernelExPtsz,
            tid: 4242,
            ctx: 0x5555_0000_1000,
            stream: u64::MAX,
            kernel: Arc::from(
                "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_T1_",
            ),
            module_id: Some(u32::MAX),
            module_sha256: Some(Arc::from("ab".repeat(32))),
            attribution: Attribution::FunctionModule,
            candidates: vec![],
            grid: [65535, 1, 0],
            block: [1024, 1, 1],
            shared: 232448,
            params: Hex((0..=255).collect()),
            param_layout: Some(Arc::from(vec![
                ParamSlot(0, 8),
                ParamSlot(8, 4),
                ParamSlot(16, 256),
            ])),
            params_from: ParamSource::KernelParams,
            attrs: vec![],
            graph: None,
            result: 0,
        }
    }

    fn variants() -> Vec<LaunchRecord> {
        let mut v = vec![base()];
        v.push(LaunchRecord {
            module_id: None,
            module_sha256: None,
            attribution: Attribution::Ambiguous,
            candidates: vec![Arc::from("aa"), Arc::from("bb")],
            ..base()
        });
        v.push(LaunchRecord {
            param_layout: None,
            params: Hex(vec![]),
            params_from: ParamSource::Unavailable,
            attribution: Attribution::Unknown,
            result: -3,
            ..base()
        });
        v.push(LaunchRecord {
            attrs: vec![LaunchAttr {
                id: 4,
                value: Hex(vec![1; 64]),
            }],
            graph: Some(GraphRef {
                graph: 7,
                capture_id: Some(9),
                node: Some(11),
            }),
            params_from: ParamSource::ExtraTruncated,
            attribution: Attribution::SymbolUnique,
            ..base()
        });
        v.push(LaunchRecord {
            graph: Some(GraphRef {
                graph: 7,
                capture_id: None,
                node: None,
            }),
            ..base()
        });
        v.push(LaunchRecord {
            param_layout: Some(Arc::from(vec![])),
            params_from: ParamSource::None,
            ..base()
        });
        // Names that need escaping go through serde.
        v.push(LaunchRecord {
            kernel: Arc::from("we\"ird\\name\u{1}é"),
            ..base()
        });
        for api in [
            Api::LaunchKernel,
            Api::LaunchCooperativeKernel,
            Api::GraphAddKernelNodeV2,
        ] {
            v.push(LaunchRecord {
                api,
                params_from: ParamSource::Extra,
                ..base()
            });
        }
        v
    }

    #[test]
    fn byte_for_byte_what_serde_writes() {
        for r in variants() {
            for node in [false, true] {
                let mut fast = Vec::new();
                write_launch_line(&mut fast, node, &r);
                let record = if node {
                    Record::GraphNode(r.clone())
                } else {
                    Record::Launch(r.clone())
                };
                let mut slow = serde_json::to_vec(&record).unwrap();
                slow.push(b'\n');
                assert_eq!(
                    String::from_utf8(fast).unwrap(),
                    String::from_utf8(slow).unwrap()
                );
            }
        }
    }
}
