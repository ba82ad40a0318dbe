//! Weight sources written in the manifest itself (`{"values": […]}`, kern 4.1): each value is
//! converted to the buffer's dtype once, when the manifest is checked, and a wrong count or a
//! value the dtype cannot hold is an error naming the value's JSON path.

mod common;

use common::{check_speculative_edit as check, speculative_edit_errors as errors, speculative_manifest as base};
use kern_manifest::{Manifest, WeightSource};
use serde_json::{json, Value};

/// The fixture manifest with one more weight, `table`, of `dtype` and `shape` from `from`.
fn with_table(dtype: &str, shape: Value, from: Value) -> Value {
    let mut v = base();
    v["buffers"]["table"] = json!({"dtype": dtype, "shape": shape, "role": "weight", "from": from});
    v
}

fn table_bytes(m: &Manifest) -> Vec<u8> {
    match &m.buffers[m.buffer("table").unwrap().0].source {
        Some(WeightSource::Values(b)) => b.clone(),
        other => panic!("expected values, got {other:?}"),
    }
}

#[test]
fn values_convert_to_the_buffer_dtype() {
    let m = check(&with_table("f32", json!([2, 2]), json!({"values": [1.0, -2.5, 0.1, 3e38]}))).unwrap();
    let want: Vec<u8> = [1.0f32, -2.5, 0.1, 3e38].iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(table_bytes(&m), want);
    // bf16: round to nearest even (1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1).
    let m = check(&with_table("bf16", json!([3]), json!({"values": [1.0, 1.00390625, 1.01171875]}))).unwrap();
    assert_eq!(table_bytes(&m), [0x80u8, 0x3f, 0x80, 0x3f, 0x82, 0x3f]);
    let m = check(&with_table("i32", json!([2]), json!({"values": [-7, 2147483647]}))).unwrap();
    assert_eq!(table_bytes(&m), [249u8, 255, 255, 255, 255, 255, 255, 127]);
}

#[test]
fn wrong_count_and_unrepresentable_values_name_their_path() {
    let e = errors(&with_table("f32", json!([2, 3]), json!({"values": [1, 2, 3]})));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("buffers.table.from.values") && e[0].contains("3 values for a buffer of 6 elements"), "{e:?}");
    let e = errors(&with_table("i32", json!([2]), json!({"values": [1, 2.5]})));
    assert!(e.len() == 1 && e[0].contains("buffers.table.from.values[1]") && e[0].contains("not a whole number"), "{e:?}");
    let e = errors(&with_table("f32", json!([2]), json!({"values": [1, "x"]})));
    assert!(e.len() == 1 && e[0].contains("values[1]") && e[0].contains("expected a number"), "{e:?}");
    // Only weights take a source.
    let mut v = with_table("f32", json!([1]), json!({"values": [1]}));
    v["buffers"]["table"]["role"] = json!("activation");
    let e = errors(&v);
    assert!(e.len() == 1 && e[0].contains("`from` is only for weights"), "{e:?}");
}
