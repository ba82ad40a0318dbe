//! Every record type survives writing (as the injection library writes it: serde_json, one
//! line each) and reading back through the reader.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kern_dump::format::*;
use kern_dump::reader::{parse_trace, read_trace};

fn all_records() -> Vec<Record> {
    let sha: Arc<str> = Arc::from("ab".repeat(32));
    let launch = LaunchRecord {
        seq: 3,
        api: Api::LaunchKernelEx,
        tid: 4242,
        ctx: 0x5555_0000_1000,
        stream: 0x5555_0000_2000,
        kernel: Arc::from("_Z6VecAddPfS_S_"),
        module_id: Some(21),
        module_sha256: Some(sha.clone()),
        attribution: Attribution::FunctionModule,
        candidates: vec![],
        grid: [1, 2, 3],
        block: [128, 1, 1],
        shared: 49152,
        params: Hex(vec![
            0, 1, 2, 3, 4, 5, 6, 7, 0xff, 0xfe, 0xfd, 0xfc, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9,
        ]),
        param_layout: Some(Arc::from(vec![
            ParamSlot(0, 8),
            ParamSlot(8, 4),
            ParamSlot(16, 8),
        ])),
        params_from: ParamSource::KernelParams,
        attrs: vec![LaunchAttr {
            id: 4,
            value: Hex(vec![1; 64]),
        }],
        graph: None,
        result: 0,
    };
    let node = LaunchRecord {
        seq: 4,
        api: Api::LaunchKernelPtsz,
        attribution: Attribution::Ambiguous,
        module_id: None,
        module_sha256: None,
        candidates: vec![sha.clone(), Arc::from("cd".repeat(32))],
        param_layout: None,
        params: Hex(vec![]),
        params_from: ParamSource::Unavailable,
        attrs: vec![],
        graph: Some(GraphRef {
            graph: 77,
            capture_id: Some(5),
            node: None,
        }),
        result: 700,
        ..launch.clone()
    };
    vec![
        Record::Process(ProcessRecord {
            version: TRACE_VERSION,
            pid: 1234,
            ppid: 1,
            forked_from: Some(1200),
            argv: vec!["python3".into(), "-c".into(), "print(\"héllo\\n\")".into()],
            start_unix_ms: 1_764_460_000_000,
            cuda_driver_version: Some(13000),
            cupti_lib: Some("/usr/local/cuda/lib64/libcupti.so.13".into()),
            cupti_version: Some(28),
            injection: "kern-inject 0.1.0".into(),
        }),
        Record::Module(ModuleRecord {
            seq: 1,
            module_id: 21,
            ctx: 0x5555_0000_1000,
            tid: 4242,
            sha256: sha.clone(),
            size: 5504,
            kind: ModuleKind::Cubin,
            path: format!("modules/{sha}.cubin"),
            loaded_in: Some(Api::LaunchKernel),
            kernels: 1,
            new_file: true,
        }),
        Record::ModuleUnload(ModuleUnloadRecord {
            seq: 2,
            module_id: 21,
        }),
        Record::Launch(launch),
        Record::GraphNode(node),
        Record::GraphExec(GraphExecRecord {
            seq: 5,
            api: Api::GraphInstantiateWithFlags,
            tid: 4242,
            graph_exec: 88,
            graph: 77,
            kernel_nodes: Some(1),
        }),
        Record::GraphLaunch(GraphLaunchRecord {
            seq: 6,
            api: Api::GraphLaunch,
            tid: 4242,
            ctx: 1,
            stream: 2,
            graph_exec: 88,
            graph: Some(77),
            kernel_nodes: Some(1),
            result: 0,
        }),
        Record::Note(NoteRecord {
            seq: 7,
            level: NoteLevel::Warning,
            message: "a \"quoted\" note".into(),
        }),
        Record::Exit(ExitRecord {
            seq: 8,
            how: "atexit".into(),
            modules: 1,
            launches: 1,
            graph_nodes: 1,
            graph_launches: 1,
        }),
    ]
}

#[test]
fn every_record_round_trips_through_a_trace_file() {
    let records = all_records();
    let mut text = String::new();
    for r in &records {
        text.push_str(&serde_json::to_string(r).unwrap());
        text.push('\n');
    }
    // The tag comes first: the launcher finds notes by this prefix without parsing.
    assert!(text.lines().any(|l| l.starts_with(r#"{"type":"note","#)));

    let t = parse_trace(&text, Path::new("trace.1234.jsonl"));
    assert!(t.bad_lines.is_empty(), "{:?}", t.bad_lines);
    assert_eq!(t.pid, 1234);
    assert_eq!(
        t.header.as_ref(),
        match &records[0] {
            Record::Process(p) => Some(p),
            _ => None,
        }
    );
    assert_eq!(t.records, records[1..]);
    assert!(t.exited_cleanly());
}

#[test]
fn optional_fields_are_omitted_when_empty() {
    let records = all_records();
    let Record::Launch(l) = &records[3] else {
        unreachable!()
    };
    let line = serde_json::to_string(&Record::Launch(l.clone())).unwrap();
    assert!(!line.contains("candidates"));
    assert!(!line.contains("\"graph\""));
    assert!(!line.contains("result"));
    assert!(line.contains(r#""params":"0001020304050607fffefdfc000000000909090909090909""#));
    assert!(line.contains(r#""param_layout":[[0,8],[8,4],[16,8]]"#));
}

#[test]
fn fixture_lines_round_trip() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/two-processes");
    let t = read_trace(&dir.join("trace.1000.jsonl")).unwrap();
    assert!(t.bad_lines.is_empty());
    for r in &t.records {
        let again: Record = serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap();
        assert_eq!(&again, r);
    }
}
