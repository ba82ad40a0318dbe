//! The whole callback path without a GPU: this test plays CUPTI and the driver. It calls the
//! library's CUPTI callback with the same structures CUPTI passes (a lazy module load inside a
//! launch, a module loaded by cuModuleLoadData, a capture into a graph, replays, an `extra`
//! launch, an unload), with real cubins as module images and fake driver queries, then reads
//! the trace back and summarizes it.
//!
//! One test per binary: the tracer is process-global.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

use kern_dump::format::{Api, Attribution, ParamSlot, ParamSource, Record};
use kern_dump::reader::read_dump;
use kern_dump::summary::summarize;
use kern_inject::callback::cupti_callback;
use kern_inject::driver::Driver;
use kern_inject::ffi::{
    self, cbid, CallbackData, GraphData, Handle, ModuleResourceData, ResourceData,
};

const A: &str = "1cb896cd5ad9c2334a0473164fc154894a00e8ca33a7f4921baee0bf11885ad6"; // VecAdd, Scale
const B: &str = "64cbfa5786b70e29aec2ed13a594823fd20d86289a0fd16a3ff7215ea7d53213"; // VecAdd, Fill
const C: &str = "9cf9283e870f1beedf2fbcc5a3f6764396f99a90a7612d643858c803c987d1df"; // Unused

const CTX: usize = 0xc0;
const CAPTURING_STREAM: usize = 0x55;
const GRAPH: usize = 0x6000;
const GRAPH_EXEC: usize = 0x8000;

fn cubin(sha: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../kern-dump/tests/data/two-processes/modules");
    std::fs::read(dir.join(format!("{sha}.cubin"))).unwrap()
}

// ---- the fake driver -------------------------------------------------------------------

unsafe extern "C" fn fake_func_get_module(out: *mut Handle, f: Handle) -> i32 {
    let m = match f as usize {
        0xf1 | 0xf2 => 0x1000,
        0xf3 => 0x3000,
        0xf4 => 0x4000,
        0xf5 => 0x5000,
        _ => return 400, // CUDA_ERROR_INVALID_HANDLE
    };
    unsafe { *out = m as Handle };
    0
}

unsafe extern "C" fn fake_param_info(
    f: Handle,
    i: usize,
    off: *mut usize,
    size: *mut usize,
) -> i32 {
    let layout: &[(usize, usize)] = match f as usize {
        0xf2 => &[(0, 8), (8, 4), (12, 4)],
        0xf5 => &[(0, 8)],
        _ => &[(0, 8), (8, 8), (16, 8)],
    };
    match layout.get(i) {
        Some(&(o, s)) => {
            unsafe { (*off, *size) = (o, s) };
            0
        }
        None => ffi::CUDA_ERROR_INVALID_VALUE,
    }
}

unsafe extern "C" fn fake_capture_info(
    stream: Handle,
    status: *mut u32,
    id: *mut u64,
    graph: *mut Handle,
    _deps: *mut *const Handle,
    _n: *mut usize,
) -> i32 {
    unsafe {
        if stream as usize == CAPTURING_STREAM {
            (*status, *id, *graph) = (1, 9, GRAPH as Handle);
        } else {
            *status = 0;
        }
    }
    0
}

// ---- playing CUPTI ---------------------------------------------------------------------

fn driver_cb(id: u32, site: u32, params: *const c_void, ret: &mut i32, symbol: Option<&CStr>) {
    let data = CallbackData {
        callback_site: site,
        function_name: null(),
        function_params: params,
        function_return_value: ret as *mut i32 as *mut c_void,
        symbol_name: symbol.map_or(null(), |s| s.as_ptr()),
        context: CTX as Handle,
        context_uid: 1,
        correlation_data: null_mut(),
        correlation_id: 0,
    };
    unsafe {
        cupti_callback(
            null_mut(),
            ffi::DOMAIN_DRIVER_API,
            id,
            &data as *const CallbackData as *const c_void,
        )
    }
}

fn resource_cb(id: u32, descriptor: *mut c_void) {
    let data = ResourceData {
        context: CTX as Handle,
        resource_handle: 0,
        resource_descriptor: descriptor,
    };
    unsafe {
        cupti_callback(
            null_mut(),
            ffi::DOMAIN_RESOURCE,
            id,
            &data as *const ResourceData as *const c_void,
        )
    }
}

fn module_loaded(id: u32, image: &[u8]) {
    let mut m = ModuleResourceData {
        module_id: id,
        cubin_size: image.len(),
        p_cubin: image.as_ptr() as *const _,
    };
    resource_cb(
        ffi::CBID_RESOURCE_MODULE_LOADED,
        &mut m as *mut ModuleResourceData as *mut c_void,
    );
}

/// One cuLaunchKernel(_ptsz) with `args` as kernelParams; `during` runs between ENTER and EXIT.
fn launch(
    id: u32,
    f: usize,
    stream: usize,
    args: &[*mut c_void],
    symbol: &CStr,
    during: impl FnOnce(),
) {
    let mut args = args.to_vec();
    let p = ffi::LaunchKernelParams {
        f: f as Handle,
        grid: [2, 1, 1],
        block: [4, 1, 1],
        shared_mem_bytes: 0,
        stream: stream as Handle,
        kernel_params: if args.is_empty() {
            null_mut()
        } else {
            args.as_mut_ptr()
        },
        extra: null_mut(),
    };
    let mut ret = 0;
    driver_cb(
        id,
        ffi::API_ENTER,
        &p as *const _ as *const c_void,
        &mut ret,
        Some(symbol),
    );
    during();
    driver_cb(
        id,
        ffi::API_EXIT,
        &p as *const _ as *const c_void,
        &mut ret,
        Some(symbol),
    );
}

#[test]
fn a_program_as_cupti_sees_it() {
    let dir = std::env::temp_dir().join(format!("kern-inject-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let driver = Driver {
        func_get_module: Some(fake_func_get_module),
        func_get_param_info: Some(fake_param_info),
        stream_get_capture_info: Some(fake_capture_info),
        ..Driver::default()
    };
    let t = kern_inject::testing::install_tracer(dir.clone(), driver, 2);
    let (a, b, c) = (cubin(A), cubin(B), cubin(C));
    let (mut x, mut y, mut z) = (
        0x7000_0000_0000u64,
        0x7000_0000_0100u64,
        0x7000_0000_0200u64,
    );
    let ptrs = [
        &mut x as *mut u64 as *mut c_void,
        &mut y as *mut u64 as *mut c_void,
        &mut z as *mut u64 as *mut c_void,
    ];

    resource_cb(ffi::CBID_RESOURCE_CU_INIT_FINISHED, null_mut());

    // 1. VecAdd's first launch materializes module A (lazy loading): the load fires inside the
    //    launch, and binds the function's module handle 0x1000 to module 21.
    launch(
        cbid::CU_LAUNCH_KERNEL,
        0xf1,
        0,
        &ptrs,
        c"_Z6VecAddPfS_S_",
        || module_loaded(21, &a),
    );
    // 2. Scale, same module, per-thread stream variant.
    let (mut s, mut n) = (0.5f32, 4i32);
    let scale_args = [
        ptrs[0],
        &mut s as *mut f32 as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
    ];
    launch(
        cbid::CU_LAUNCH_KERNEL_PTSZ,
        0xf2,
        0,
        &scale_args,
        c"_Z5ScalePffi",
        || {},
    );

    // 3. cuModuleLoadData of image B returns CUmodule 0x3000.
    let mut out: Handle = null_mut();
    let load = ffi::FirstOutParams { out: &mut out };
    let mut ret = 0;
    driver_cb(
        cbid::CU_MODULE_LOAD_DATA,
        ffi::API_ENTER,
        &load as *const _ as *const c_void,
        &mut ret,
        None,
    );
    module_loaded(22, &b);
    unsafe { *load.out = 0x3000 as Handle }; // what the driver writes before returning
    driver_cb(
        cbid::CU_MODULE_LOAD_DATA,
        ffi::API_EXIT,
        &load as *const _ as *const c_void,
        &mut ret,
        None,
    );
    // 4. VecAdd from B: exact despite the name being in A too.
    launch(
        cbid::CU_LAUNCH_KERNEL,
        0xf3,
        0,
        &ptrs,
        c"_Z6VecAddPfS_S_",
        || {},
    );
    // 5. VecAdd from a module handle never seen loaded: A and B both define it → ambiguous.
    launch(
        cbid::CU_LAUNCH_KERNEL,
        0xf4,
        0,
        &ptrs,
        c"_Z6VecAddPfS_S_",
        || {},
    );

    // 6. Module C loaded outside any traced call; its kernel's handle is deduced.
    module_loaded(23, &c);
    launch(
        cbid::CU_LAUNCH_KERNEL,
        0xf5,
        0,
        &ptrs[..1],
        c"_Z6UnusedPf",
        || {},
    );

    // 7. cuLaunchKernelEx into a capturing stream, with a cluster attribute; CUPTI reports the
    //    graph node it created.
    let mut attr = ffi::LaunchAttribute {
        id: 4,
        pad: [0; 4],
        value: [0; 64],
    };
    attr.value[..12].copy_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
    let config = ffi::LaunchConfig {
        grid: [8, 1, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 1024,
        stream: CAPTURING_STREAM as Handle,
        attrs: &attr,
        num_attrs: 1,
    };
    let mut ex_args = ptrs;
    let ex = ffi::LaunchKernelExParams {
        config: &config,
        f: 0xf1 as Handle,
        kernel_params: ex_args.as_mut_ptr(),
        extra: null_mut(),
    };
    let mut ret = 0;
    driver_cb(
        cbid::CU_LAUNCH_KERNEL_EX,
        ffi::API_ENTER,
        &ex as *const _ as *const c_void,
        &mut ret,
        Some(c"_Z6VecAddPfS_S_"),
    );
    let mut node = GraphData {
        graph: GRAPH as Handle,
        original_graph: null_mut(),
        node: 0x7777 as Handle,
        original_node: null_mut(),
        node_type: 0,
        dependency: null_mut(),
        graph_exec: null_mut(),
    };
    resource_cb(
        ffi::CBID_RESOURCE_GRAPHNODE_CREATED,
        &mut node as *mut GraphData as *mut c_void,
    );
    driver_cb(
        cbid::CU_LAUNCH_KERNEL_EX,
        ffi::API_EXIT,
        &ex as *const _ as *const c_void,
        &mut ret,
        Some(c"_Z6VecAddPfS_S_"),
    );

    // 8. Instantiate (the resource callback inside it must not double-record) and replay twice.
    let mut exec: Handle = null_mut();
    let inst = ffi::GraphInstantiateParams {
        ph_graph_exec: &mut exec,
        graph: GRAPH as Handle,
    };
    driver_cb(
        cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        ffi::API_ENTER,
        &inst as *const _ as *const c_void,
        &mut ret,
        None,
    );
    unsafe { *inst.ph_graph_exec = GRAPH_EXEC as Handle };
    let mut created = GraphData {
        graph_exec: GRAPH_EXEC as Handle,
        ..node
    };
    resource_cb(
        ffi::CBID_RESOURCE_GRAPHEXEC_CREATED,
        &mut created as *mut GraphData as *mut c_void,
    );
    driver_cb(
        cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        ffi::API_EXIT,
        &inst as *const _ as *const c_void,
        &mut ret,
        None,
    );
    let gl = ffi::GraphLaunchParams {
        graph_exec: GRAPH_EXEC as Handle,
        stream: 0x99 as Handle,
    };
    for _ in 0..2 {
        driver_cb(
            cbid::CU_GRAPH_LAUNCH,
            ffi::API_ENTER,
            &gl as *const _ as *const c_void,
            &mut ret,
            None,
        );
        driver_cb(
            cbid::CU_GRAPH_LAUNCH,
            ffi::API_EXIT,
            &gl as *const _ as *const c_void,
            &mut ret,
            None,
        );
    }

    // 9. An `extra`-style launch of Scale, which fails (CUDA_ERROR_INVALID_VALUE).
    let mut packed = [0u8; 16];
    packed[..8].copy_from_slice(&x.to_le_bytes());
    packed[8..12].copy_from_slice(&0.5f32.to_le_bytes());
    packed[12..].copy_from_slice(&4i32.to_le_bytes());
    let size = packed.len();
    let mut extra = [
        ffi::CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        packed.as_mut_ptr() as *mut c_void,
        ffi::CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        &size as *const usize as *mut c_void,
        ffi::CU_LAUNCH_PARAM_END as *mut c_void,
    ];
    let p = ffi::LaunchKernelParams {
        f: 0xf2 as Handle,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
        stream: null_mut(),
        kernel_params: null_mut(),
        extra: extra.as_mut_ptr(),
    };
    let mut failed = ffi::CUDA_ERROR_INVALID_VALUE;
    driver_cb(
        cbid::CU_LAUNCH_KERNEL,
        ffi::API_ENTER,
        &p as *const _ as *const c_void,
        &mut failed,
        Some(c"_Z5ScalePffi"),
    );
    driver_cb(
        cbid::CU_LAUNCH_KERNEL,
        ffi::API_EXIT,
        &p as *const _ as *const c_void,
        &mut failed,
        Some(c"_Z5ScalePffi"),
    );

    // 10. Module C unloads.
    let mut m = ModuleResourceData {
        module_id: 23,
        cubin_size: 0,
        p_cubin: null(),
    };
    resource_cb(
        ffi::CBID_RESOURCE_MODULE_UNLOAD_STARTING,
        &mut m as *mut ModuleResourceData as *mut c_void,
    );

    t.finish("atexit");

    // ---- what the trace says ----------------------------------------------------------------
    let dump = read_dump(&dir).unwrap();
    assert_eq!(dump.traces.len(), 1);
    let trace = &dump.traces[0];
    assert!(trace.bad_lines.is_empty(), "{:?}", trace.bad_lines);
    assert_eq!(trace.pid, std::process::id());
    let mut modules = dump.module_files.clone();
    modules.sort();
    assert_eq!(
        modules,
        [
            format!("{A}.cubin"),
            format!("{B}.cubin"),
            format!("{C}.cubin")
        ]
    );
    for name in &modules {
        let bytes = std::fs::read(dir.join("modules").join(name)).unwrap();
        assert_eq!(
            kern_dump::image::sha256_hex(&bytes),
            name.trim_end_matches(".cubin")
        );
    }

    let seqs: Vec<u64> = trace.records.iter().filter_map(|r| r.seq()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "single-threaded: written in seq order: {seqs:?}"
    );

    let mods: Vec<_> = trace
        .records
        .iter()
        .filter_map(|r| {
            if let Record::Module(m) = r {
                Some(m)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        mods.iter()
            .map(|m| (m.module_id, &*m.sha256, m.loaded_in))
            .collect::<Vec<_>>(),
        [
            (21, A, Some(Api::LaunchKernel)),
            (22, B, Some(Api::ModuleLoadData)),
            (23, C, None),
        ]
    );
    assert_eq!(mods[0].kernels, 2);
    assert!(mods.iter().all(|m| m.new_file));

    let launches: Vec<_> = trace
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Launch(l) => Some(("launch", l)),
            Record::GraphNode(l) => Some(("graph_node", l)),
            _ => None,
        })
        .collect();
    let summary_rows: Vec<_> = launches
        .iter()
        .map(|(ty, l)| {
            (
                *ty,
                &*l.kernel,
                l.attribution,
                l.module_id,
                l.module_sha256.as_deref(),
                l.params_from,
            )
        })
        .collect();
    use Attribution::*;
    assert_eq!(
        summary_rows,
        [
            (
                "launch",
                "_Z6VecAddPfS_S_",
                FunctionModule,
                Some(21),
                Some(A),
                ParamSource::KernelParams
            ),
            (
                "launch",
                "_Z5ScalePffi",
                FunctionModule,
                Some(21),
                Some(A),
                ParamSource::KernelParams
            ),
            (
                "launch",
                "_Z6VecAddPfS_S_",
                FunctionModule,
                Some(22),
                Some(B),
                ParamSource::KernelParams
            ),
            (
                "launch",
                "_Z6VecAddPfS_S_",
                Ambiguous,
                None,
                None,
                ParamSource::KernelParams
            ),
            (
                "launch",
                "_Z6UnusedPf",
                FunctionModule,
                Some(23),
                Some(C),
                ParamSource::KernelParams
            ),
            (
                "graph_node",
                "_Z6VecAddPfS_S_",
                FunctionModule,
                Some(21),
                Some(A),
                ParamSource::KernelParams
            ),
            (
                "launch",
                "_Z5ScalePffi",
                FunctionModule,
                Some(21),
                Some(A),
                ParamSource::Extra
            ),
        ]
    );
    let vecadd = launches[0].1;
    let mut expected = Vec::new();
    for v in [x, y, z] {
        expected.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(vecadd.params.0, expected);
    assert_eq!(
        vecadd.param_layout.as_deref(),
        Some(&[ParamSlot(0, 8), ParamSlot(8, 8), ParamSlot(16, 8)][..])
    );
    assert_eq!(
        (vecadd.grid, vecadd.block, vecadd.api),
        ([2, 1, 1], [4, 1, 1], Api::LaunchKernel)
    );
    let scale = launches[1].1;
    assert_eq!(scale.api, Api::LaunchKernelPtsz);
    assert_eq!(
        scale.params.0,
        packed.to_vec(),
        "kernelParams and extra give the same bytes"
    );
    assert_eq!(
        launches[3]
            .1
            .candidates
            .iter()
            .map(|c| &**c)
            .collect::<Vec<_>>(),
        [A, B]
    );
    let node = launches[5].1;
    assert_eq!(
        node.graph.map(|g| (g.graph, g.capture_id, g.node)),
        Some((GRAPH as u64, Some(9), Some(0x7777)))
    );
    assert_eq!(
        (node.grid, node.block, node.shared, node.stream),
        ([8, 1, 1], [128, 1, 1], 1024, CAPTURING_STREAM as u64)
    );
    assert_eq!(node.attrs.len(), 1);
    assert_eq!(node.attrs[0].id, 4);
    assert_eq!(
        &node.attrs[0].value.0[..12],
        &[2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    );
    assert_eq!(launches[6].1.result, ffi::CUDA_ERROR_INVALID_VALUE);

    let execs: Vec<_> = trace
        .records
        .iter()
        .filter_map(|r| {
            if let Record::GraphExec(g) = r {
                Some(g)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        execs.len(),
        1,
        "the resource callback inside the traced instantiate is not recorded twice"
    );
    assert_eq!(
        (execs[0].graph_exec, execs[0].graph, execs[0].kernel_nodes),
        (GRAPH_EXEC as u64, GRAPH as u64, Some(1))
    );
    let replays: Vec<_> = trace
        .records
        .iter()
        .filter_map(|r| {
            if let Record::GraphLaunch(g) = r {
                Some(g)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(replays.len(), 2);
    assert!(replays
        .iter()
        .all(|g| g.graph == Some(GRAPH as u64) && g.kernel_nodes == Some(1) && g.stream == 0x99));
    assert!(trace
        .records
        .iter()
        .any(|r| matches!(r, Record::ModuleUnload(u) if u.module_id == 23)));
    let Some(Record::Exit(exit)) = trace.records.last() else {
        panic!("no exit record")
    };
    assert_eq!(
        (
            exit.modules,
            exit.launches,
            exit.graph_nodes,
            exit.graph_launches
        ),
        (3, 6, 1, 2)
    );

    let s = summarize(&dump, 10);
    assert_eq!(
        (
            s.modules,
            s.launches,
            s.graph_nodes,
            s.graph_launches,
            s.graph_kernel_executions
        ),
        (3, 6, 1, 2, 2)
    );
    assert_eq!(s.distinct_kernels, 3);
    assert_eq!(s.failed_launches, 1);
    assert_eq!(s.attribution.ambiguous, 1);
    assert!(s.unlaunched_modules.is_empty());
    assert_eq!(s.top_kernels[0].name, "_Z6VecAddPfS_S_");
    assert_eq!(s.top_kernels[0].executions, 3 + 2);
    let _ = std::fs::remove_dir_all(&dir);
}
