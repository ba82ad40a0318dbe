//! The summary of a hand-written two-process dump (tests/data/two-processes, described in
//! tests/data/src/README.md), checked number by number.

use std::path::PathBuf;

use kern_dump::format::ModuleKind;
use kern_dump::summary::{summary, AttributionCounts};

const A: &str = "1cb896cd5ad9c2334a0473164fc154894a00e8ca33a7f4921baee0bf11885ad6";
const B: &str = "64cbfa5786b70e29aec2ed13a594823fd20d86289a0fd16a3ff7215ea7d53213";
const C: &str = "9cf9283e870f1beedf2fbcc5a3f6764396f99a90a7612d643858c803c987d1df";

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/two-processes")
}

#[test]
fn two_process_dump_numbers() {
    let s = summary(&fixture(), 10).unwrap();

    assert_eq!(s.processes.len(), 2);
    let (p0, p1) = (&s.processes[0], &s.processes[1]);
    assert_eq!(
        (
            p0.pid,
            p0.launches,
            p0.graph_nodes,
            p0.graph_launches,
            p0.module_loads
        ),
        (1000, 6, 3, 3, 3)
    );
    assert!(p0.clean_exit);
    assert_eq!(p0.argv, ["python3", "qwen.py"]);
    assert_eq!(
        (
            p1.pid,
            p1.launches,
            p1.graph_nodes,
            p1.graph_launches,
            p1.module_loads
        ),
        (1001, 2, 0, 1, 1)
    );
    assert!(!p1.clean_exit, "the worker was killed: no exit record");

    assert_eq!(s.modules, 3);
    assert_eq!(s.module_loads, 4);
    assert_eq!(s.module_files, 3);
    assert_eq!(s.launches, 8);
    assert_eq!(s.failed_launches, 1);
    assert_eq!(s.graph_nodes, 3);
    assert_eq!(s.graph_launches, 4);
    assert_eq!(s.graph_kernel_executions, 9, "3 replays of a 3-node graph");
    assert_eq!(s.unlinked_graph_launches, 1);
    assert_eq!(s.distinct_kernels, 4);
    assert_eq!(
        s.attribution,
        AttributionCounts {
            function_module: 8,
            symbol_unique: 1,
            ambiguous: 1,
            unknown: 1
        }
    );
    assert_eq!(s.bad_lines, 1, "the worker's last line is cut off");
    assert_eq!(s.notes.len(), 1);
    assert!(s.notes[0].starts_with("pid 1001: graph exec"));

    let top: Vec<(&str, u64, u64, u64, u64)> = s
        .top_kernels
        .iter()
        .map(|k| {
            (
                k.name.as_str(),
                k.executions,
                k.launches,
                k.graph_nodes,
                k.graph_executions,
            )
        })
        .collect();
    assert_eq!(
        top,
        [
            ("_Z6VecAddPfS_S_", 7, 4, 1, 3),
            ("_Z5ScalePffi", 5, 2, 1, 3),
            ("_Z4FillPfi", 4, 1, 1, 3),
            ("triton_poi_fused_add_0", 1, 1, 0, 0),
        ]
    );
    assert_eq!(
        s.top_kernels[0].demangled.as_deref(),
        Some("VecAdd(float*, float*, float*)")
    );
    assert_eq!(s.top_kernels[0].modules, [A]);
    assert_eq!(
        s.top_kernels[2].demangled.as_deref(),
        Some("Fill(float*, int)")
    );
    assert_eq!(s.top_kernels[2].modules, [B]);
    assert_eq!(s.top_kernels[3].demangled, None);

    assert_eq!(s.unlaunched_modules.len(), 1);
    let m = &s.unlaunched_modules[0];
    assert_eq!(
        (m.sha256.as_str(), m.kind, m.size, m.kernels, m.loads),
        (C, ModuleKind::Cubin, 3568, 1, 1)
    );
    assert_eq!(m.pids, [1000]);

    // Top-N truncates.
    assert_eq!(summary(&fixture(), 2).unwrap().top_kernels.len(), 2);
}

#[test]
fn summary_renders_and_serializes() {
    let s = summary(&fixture(), 10).unwrap();
    let text = s.to_string();
    println!("{text}");
    for needle in [
        "processes         2",
        "modules           3 distinct (4 loads, 3 files)",
        "launches          8 direct (1 failed)",
        "graph replays     4 (running 9 kernels; 3 kernel nodes captured; 1 replays of graphs whose capture was not seen)",
        "distinct kernels  4",
        "8 function_module, 1 symbol_unique, 1 ambiguous, 1 unknown",
        "VecAdd(float*, float*, float*)",
        "modules loaded but never launched: 1",
        "9cf9283e870f",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["launches"], 8);
    assert_eq!(json["top_kernels"][0]["name"], "_Z6VecAddPfS_S_");
}

#[test]
fn summary_of_a_directory_without_traces_says_so() {
    let err = summary(&fixture().join("modules"), 10)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no trace files"), "{err}");
}
