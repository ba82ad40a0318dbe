//! Quantized weights (issue 25): GGUF block dtypes (`q4_k`, …), whose element is one whole
//! block, and FP8 weights with their block scales. Checked like every other buffer: sizes from
//! shapes, op signatures naming the formats, bindings compared by dtype; a block dtype is for
//! weights only.

mod common;

use common::{check_speculative_edit as check, speculative_edit_errors as errors, speculative_manifest as base};
use kern_manifest::DType;
use serde_json::{json, Value};

/// The fixture manifest with a q4_k weight `w` (N = 64 rows of K = 512 values: [64, 2]
/// blocks), an FP8 weight `w8` [300, 256] with its `w8.scale_inv` [3, 2], and an op `gemv`
/// that reads the q4_k weight through a kernel's `int const*` and is called by `main`.
fn quantized() -> Value {
    let mut v = base();
    let b = &mut v["buffers"];
    b["w"] = json!({"dtype": "q4_k", "shape": [64, "512 / 256"], "role": "weight"});
    b["w8"] = json!({"dtype": "f8e4m3", "shape": [300, 256], "role": "weight"});
    b["w8.scale_inv"] = json!({"dtype": "f32", "shape": ["cdiv(300, 128)", "cdiv(256, 128)"], "role": "weight",
                               "from": {"tensor": "w8.weight_scale_inv"}});
    v["ops"]["gemv"] = json!({
        "params": ["in buffer<q4_k>", "out buffer<f32>", "in buffer<f8e4m3>", "in buffer<f32>"],
        "impl": {"launches": [{
            "module": "mixed", "entry": "_Z12uses_helpersPfPKiffi",
            "params": ["out buffer<f32>", "in buffer<q4_k>", "f32", "f32", "i32"],
            "block": [128, 1, 1], "grid": [1, 1, 1],
            "args": [{"param": 1}, {"param": 0}, {"f32": 0.0}, {"f32": 0.0}, {"i32": 64}]
        }, {
            "module": "mixed", "entry": "_Z12uses_helpersPfPKiffi",
            "params": ["out buffer<f32>", "ptr", "f32", "f32", "i32"],
            "block": [128, 1, 1], "grid": [1, 1, 1],
            "args": [{"param": 1}, {"param": 2}, {"f32": 0.0}, {"f32": 0.0}, {"i32": 64}]
        }, {
            "module": "mixed", "entry": "_Z12uses_helpersPfPKiffi",
            "params": ["out buffer<f32>", "ptr", "f32", "f32", "i32"],
            "block": [128, 1, 1], "grid": [1, 1, 1],
            "args": [{"param": 1}, {"param": 3}, {"f32": 0.0}, {"f32": 0.0}, {"i32": 64}]
        }]}
    });
    v["program"]["calls"].as_array_mut().unwrap().insert(
        0,
        json!({"label": "gemv", "op": "gemv", "args": [{"buf": "w"}, {"buf": "hidden"}, {"buf": "w8"}, {"buf": "w8.scale_inv"}]}),
    );
    v
}

#[test]
fn block_and_fp8_weights_check_with_their_sizes() {
    let m = check(&quantized()).unwrap_or_else(|d| panic!("{d}"));
    let w = &m.buffers[m.buffer("w").unwrap().0];
    assert_eq!(w.dtype, DType::Q4K);
    assert_eq!(w.bytes_at_max, 64 * 2 * 144, "64 rows of two 144-byte blocks");
    let w8 = &m.buffers[m.buffer("w8").unwrap().0];
    assert_eq!((w8.dtype, w8.bytes_at_max), (DType::F8e4m3, 300 * 256));
    let s = &m.buffers[m.buffer("w8.scale_inv").unwrap().0];
    assert_eq!(s.bytes_at_max, 3 * 2 * 4, "[ceil(300/128), ceil(256/128)] f32 scales");
    // Every block dtype is a weight dtype an op may name.
    for d in DType::BLOCKS {
        let mut v = quantized();
        v["buffers"]["w"]["dtype"] = json!(d.name());
        v["ops"]["gemv"]["params"][0] = json!(format!("in buffer<{d}>"));
        v["ops"]["gemv"]["impl"]["launches"][0]["params"][1] = json!(format!("in buffer<{d}>"));
        let m = check(&v).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(m.buffers[m.buffer("w").unwrap().0].bytes_at_max, 128 * d.size(), "{d}");
    }
}

#[test]
fn a_block_dtype_is_for_weights_only() {
    for role in ["activation", "input", "output"] {
        let mut v = quantized();
        v["buffers"]["act"] = json!({"dtype": "q8_0", "shape": ["tokens", 2], "role": role});
        let e = errors(&v);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("buffers.act.dtype") && e[0].contains(&format!("`q8_0` is a block dtype (one element is a block of 32 values, as the GGUF file stores it), for weights only, and this buffer's role is `{role}`")), "{e:?}");
    }
    // No role is an activation.
    let mut v = quantized();
    v["buffers"]["act"] = json!({"dtype": "q6_k", "shape": [1]});
    assert!(errors(&v)[0].contains("role is `activation`"));
    // Weights are never written: an op cannot take a block buffer to write.
    let mut v = quantized();
    v["ops"]["gemv"]["params"][0] = json!("inout buffer<q4_k>");
    let e = errors(&v);
    assert!(e.iter().any(|e| e.contains("ops.gemv.params[0]") && e.contains("write \"in buffer<q4_k>\"")), "{e:?}");
    // Values are written by hand; blocks come from a file.
    let mut v = quantized();
    v["buffers"]["w"]["from"] = json!({"values": [1, 2]});
    v["buffers"]["w"]["shape"] = json!([1, 2]);
    let e = errors(&v);
    assert!(e.len() == 1 && e[0].contains("`values` cannot be written as q4_k"), "{e:?}");
}

#[test]
fn block_buffers_bind_by_dtype_like_every_buffer() {
    // A q6_k weight in a q4_k parameter.
    let mut v = quantized();
    v["buffers"]["w"]["dtype"] = json!("q6_k");
    let e = errors(&v);
    assert!(e.len() == 1 && e[0].contains("q6_k") && e[0].contains("q4_k"), "{e:?}");
    // A bf16 weight in a q4_k parameter.
    let mut v = quantized();
    v["buffers"]["w"] = json!({"dtype": "bf16", "shape": [64, 512], "role": "weight"});
    let e = errors(&v);
    assert!(e.len() == 1 && e[0].contains("bf16") && e[0].contains("q4_k"), "{e:?}");
    // The kernel reads `int const*`: blocks pass as words, but a `float*` is not a block.
    let mut v = quantized();
    v["ops"]["gemv"]["impl"]["launches"][0]["entry"] = json!("_Z12shared_tilesPKfPfi");
    v["ops"]["gemv"]["impl"]["launches"][0]["params"] = json!(["in buffer<q4_k>", "out buffer<f32>", "i32"]);
    v["ops"]["gemv"]["impl"]["launches"][0]["args"] = json!([{"param": 0}, {"param": 1}, {"i32": 64}]);
    let e = errors(&v);
    assert!(e.len() == 1 && e[0].contains("(buffer<f32>), the manifest says in buffer<q4_k>"), "{e:?}");
}

#[test]
fn ggml_names_say_what_to_write() {
    let mut v = quantized();
    v["buffers"]["w"]["dtype"] = json!("Q4_K");
    let e = errors(&v);
    assert!(e.iter().any(|e| e.contains("`Q4_K` is not a dtype: write `q4_k`")), "{e:?}");
    let mut v = quantized();
    v["buffers"]["w"]["dtype"] = json!("Q4_K_M");
    let e = errors(&v);
    assert!(e.iter().any(|e| e.contains("names a GGUF file's mix of tensor types")), "{e:?}");
    let mut v = quantized();
    v["ops"]["gemv"]["params"][0] = json!("in buffer<Q8_0>");
    let e = errors(&v);
    assert!(e.iter().any(|e| e.contains("ops.gemv.params[0]") && e.contains("write `q8_0`")), "{e:?}");
}
