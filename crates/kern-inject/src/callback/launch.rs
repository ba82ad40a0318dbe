//! Launches and graphs: decoding the launch calls' parameters into `launch` / `graph_node`
//! records, instantiations into `graph_exec`, replays into `graph_launch`.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use kern_dump::format::{
    Api, Attribution, GraphExecRecord, GraphLaunchRecord, GraphRef, Hex, LaunchAttr, LaunchRecord,
    Record,
};

use super::{cstr, function_entry, tid, Frame, FuncEntry};
use crate::ffi::{self, api_of, cbid, CallbackData, Handle};
use crate::modules::Resolved;
use crate::params;
use crate::tracer::{log_line, Tracer};

/// Launch attributes recorded per `cuLaunchKernelEx` at most.
const MAX_ATTRS: usize = 32;

/// The function handle of a launch call, for the verbose log at ENTER.
///
/// # Safety
/// `params` is the parameter struct of launch call `id`.
pub(super) unsafe fn launch_function(id: u32, params: *const c_void) -> Handle {
    if params.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: per the caller.
    unsafe {
        match id {
            cbid::CU_LAUNCH_KERNEL_EX | cbid::CU_LAUNCH_KERNEL_EX_PTSZ => {
                (*(params as *const ffi::LaunchKernelExParams)).f
            }
            _ => (*(params as *const ffi::LaunchKernelParams)).f,
        }
    }
}

/// A launch's arguments, whichever call made it.
struct LaunchArgs {
    f: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: Handle,
    kernel_params: *const *const c_void,
    extra: *const *const c_void,
    attrs: Vec<LaunchAttr>,
}

/// # Safety
/// `params` is the parameter struct of launch call `id`.
unsafe fn decode_launch(id: u32, params: *const c_void) -> Option<LaunchArgs> {
    if params.is_null() {
        return None;
    }
    // SAFETY: per the caller; `config` and `attrs` are valid per the driver API.
    unsafe {
        Some(match id {
            cbid::CU_LAUNCH_KERNEL_EX | cbid::CU_LAUNCH_KERNEL_EX_PTSZ => {
                let p = &*(params as *const ffi::LaunchKernelExParams);
                let c = p.config.as_ref()?;
                let n = (c.num_attrs as usize).min(MAX_ATTRS);
                let attrs = if c.attrs.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(c.attrs, n)
                        .iter()
                        .map(|a| LaunchAttr {
                            id: a.id,
                            value: Hex(a.value.to_vec()),
                        })
                        .collect()
                };
                LaunchArgs {
                    f: p.f,
                    grid: c.grid,
                    block: c.block,
                    shared: c.shared_mem_bytes,
                    stream: c.stream,
                    kernel_params: p.kernel_params as _,
                    extra: p.extra as _,
                    attrs,
                }
            }
            cbid::CU_LAUNCH_COOPERATIVE_KERNEL | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => {
                let p = &*(params as *const ffi::LaunchCooperativeKernelParams);
                LaunchArgs {
                    f: p.f,
                    grid: p.grid,
                    block: p.block,
                    shared: p.shared_mem_bytes,
                    stream: p.stream,
                    kernel_params: p.kernel_params as _,
                    extra: std::ptr::null(),
                    attrs: Vec::new(),
                }
            }
            _ => {
                let p = &*(params as *const ffi::LaunchKernelParams);
                LaunchArgs {
                    f: p.f,
                    grid: p.grid,
                    block: p.block,
                    shared: p.shared_mem_bytes,
                    stream: p.stream,
                    kernel_params: p.kernel_params as _,
                    extra: p.extra as _,
                    attrs: Vec::new(),
                }
            }
        })
    }
}

fn resolved_or_unknown(entry: &FuncEntry) -> Resolved {
    entry.resolved.clone().unwrap_or(Resolved {
        attribution: Attribution::Unknown,
        module_id: None,
        sha256: None,
        candidates: vec![],
    })
}

/// # Safety
/// See [`on_driver`].
pub(super) unsafe fn on_launch(
    t: &Tracer,
    id: u32,
    data: &CallbackData,
    frame: &Frame,
    result: i32,
) {
    // SAFETY: forwarded.
    let Some(args) = (unsafe { decode_launch(id, data.function_params) }) else {
        return;
    };
    let ctx = data.context as u64;
    // SAFETY: the launch is in progress.
    let entry = unsafe {
        function_entry(
            t,
            ctx,
            args.f,
            cstr(data.symbol_name).as_deref(),
            &frame.loaded,
        )
    };
    // SAFETY: the launch's argument pointers are valid until it returns.
    let captured =
        unsafe { params::capture(entry.layout.as_deref(), args.kernel_params, args.extra) };
    let ptsz = matches!(
        id,
        cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ
    );
    let query_stream = if ptsz && args.stream.is_null() {
        ffi::CU_STREAM_PER_THREAD as Handle
    } else {
        args.stream
    };
    // SAFETY: a stream handle of the launch in progress.
    let capture = unsafe { t.driver.capture(query_stream) };
    let resolved = resolved_or_unknown(&entry);
    let graph = capture.map(|c| GraphRef {
        graph: c.graph,
        capture_id: c.id,
        node: frame.nodes.first().copied(),
    });
    let record = LaunchRecord {
        seq: t.next_seq(),
        api: api_of(id),
        tid: tid(),
        ctx,
        stream: args.stream as u64,
        kernel: entry.name.clone(),
        module_id: resolved.module_id,
        module_sha256: resolved.sha256.clone(),
        attribution: resolved.attribution,
        candidates: resolved.candidates.clone(),
        grid: args.grid,
        block: args.block,
        shared: args.shared,
        params: Hex(captured.bytes),
        param_layout: entry.layout.clone(),
        params_from: captured.source,
        attrs: args.attrs,
        graph,
        result,
    };
    if t.verbose_launches_left.load(Ordering::Relaxed) > 0 {
        let left = t.verbose_launches_left.fetch_sub(1, Ordering::Relaxed) - 1;
        log_line(format_args!(
            "  EXIT: {}, module is live, symbol={}  seq={} module={} ({}) grid={:?} block={:?} params={} B",
            match (result, graph.is_some()) {
                (0, false) => "launch completed".to_owned(),
                (0, true) => "launch captured into a graph".to_owned(),
                (r, _) => format!("launch failed (CUresult {r})"),
            },
            record.kernel,
            record.seq,
            record.module_id.map_or("?".to_owned(), |m| m.to_string()),
            record.attribution.name(),
            record.grid,
            record.block,
            record.params.0.len()
        ));
        if left == 0 {
            log_line(format_args!(
                "(further launch callbacks are not logged; KERN_DUMP_VERBOSE=2 logs them all)"
            ));
        }
    }
    match graph {
        Some(g) => {
            t.graphs.lock().node_added(g.graph, g.capture_id);
            t.stats.graph_nodes.fetch_add(1, Ordering::Relaxed);
            t.emit_launch(true, &record);
        }
        None => {
            t.stats.launches.fetch_add(1, Ordering::Relaxed);
            t.emit_launch(false, &record);
        }
    }
}

/// # Safety
/// See [`on_driver`].
pub(super) unsafe fn on_add_kernel_node(t: &Tracer, id: u32, data: &CallbackData, result: i32) {
    if data.function_params.is_null() || result != ffi::CUDA_SUCCESS {
        return;
    }
    // SAFETY: the parameter struct of cuGraphAddKernelNode(_v2); nodeParams per the driver API.
    let (p, np) = unsafe {
        let p = &*(data.function_params as *const ffi::GraphAddKernelNodeParams);
        let Some(np) = p.node_params.as_ref() else {
            return;
        };
        (p, np)
    };
    let mut func = np.func;
    if func.is_null() && id == cbid::CU_GRAPH_ADD_KERNEL_NODE_V2 {
        // SAFETY: _v2 takes CUDA_KERNEL_NODE_PARAMS_v2, which extends the v1 prefix.
        func = unsafe { (*(p.node_params as *const ffi::KernelNodeParamsV2)).kern };
    }
    let ctx = data.context as u64;
    // SAFETY: the call is in progress; its node parameters are valid.
    let entry = unsafe { function_entry(t, ctx, func, cstr(data.symbol_name).as_deref(), &[]) };
    // SAFETY: as above.
    let captured = unsafe {
        params::capture(
            entry.layout.as_deref(),
            np.kernel_params as _,
            np.extra as _,
        )
    };
    // SAFETY: the call succeeded, so it wrote the node handle.
    let node = unsafe { p.ph_graph_node.as_ref() }.map(|n| *n as u64);
    let resolved = resolved_or_unknown(&entry);
    let graph = GraphRef {
        graph: p.graph as u64,
        capture_id: None,
        node,
    };
    t.graphs.lock().node_added(graph.graph, None);
    t.stats.graph_nodes.fetch_add(1, Ordering::Relaxed);
    t.emit_launch(
        true,
        &LaunchRecord {
            seq: t.next_seq(),
            api: api_of(id),
            tid: tid(),
            ctx,
            stream: 0,
            kernel: entry.name.clone(),
            module_id: resolved.module_id,
            module_sha256: resolved.sha256,
            attribution: resolved.attribution,
            candidates: resolved.candidates,
            grid: np.grid,
            block: np.block,
            shared: np.shared_mem_bytes,
            params: Hex(captured.bytes),
            param_layout: entry.layout.clone(),
            params_from: captured.source,
            attrs: Vec::new(),
            graph: Some(graph),
            result,
        },
    );
}

/// # Safety
/// See [`on_driver`].
pub(super) unsafe fn on_instantiate(t: &Tracer, id: u32, data: &CallbackData, result: i32) {
    if data.function_params.is_null() || result != ffi::CUDA_SUCCESS {
        return;
    }
    // SAFETY: every cuGraphInstantiate* params struct starts with (CUgraphExec*, CUgraph).
    let p = unsafe { &*(data.function_params as *const ffi::GraphInstantiateParams) };
    // SAFETY: the call succeeded, so it wrote the executable graph.
    let Some(exec) = (unsafe { p.ph_graph_exec.as_ref() }).map(|e| *e as u64) else {
        return;
    };
    record_graph_exec(t, api_of(id), exec, p.graph as u64);
}

pub(super) fn record_graph_exec(t: &Tracer, api: Api, exec: u64, graph: u64) {
    let (new, nodes) = {
        let mut g = t.graphs.lock();
        (g.instantiated(exec, graph), g.nodes(graph))
    };
    if new {
        vlog!(
            t,
            "graph {graph:#x} instantiated as {exec:#x} ({} kernel nodes seen)",
            nodes.unwrap_or(0)
        );
        t.emit(&Record::GraphExec(GraphExecRecord {
            seq: t.next_seq(),
            api,
            tid: tid(),
            graph_exec: exec,
            graph,
            kernel_nodes: nodes,
        }));
    }
}

/// # Safety
/// See [`on_driver`].
pub(super) unsafe fn on_graph_launch(t: &Tracer, id: u32, data: &CallbackData, result: i32) {
    if data.function_params.is_null() {
        return;
    }
    // SAFETY: cuGraphLaunch(_ptsz) params.
    let p = unsafe { &*(data.function_params as *const ffi::GraphLaunchParams) };
    let exec = p.graph_exec as u64;
    let linked = t.graphs.lock().exec(exec);
    t.stats.graph_launches.fetch_add(1, Ordering::Relaxed);
    t.emit(&Record::GraphLaunch(GraphLaunchRecord {
        seq: t.next_seq(),
        api: api_of(id),
        tid: tid(),
        ctx: data.context as u64,
        stream: p.stream as u64,
        graph_exec: exec,
        graph: linked.map(|l| l.0),
        kernel_nodes: linked.map(|l| l.1),
        result,
    }));
}
