//! The CUPTI callback: what happens on each subscribed driver call and resource event.
//!
//! A traced call pushes a frame at ENTER and pops it at EXIT; resource events that fire in
//! between on the same thread (a lazy module load inside a launch, a graph node created by a
//! captured launch) are attached to the frame. Everything about a launch is therefore decided
//! at EXIT, when the module of a lazily loaded kernel finally exists (seed §5).
//!
//! This file: dispatch, per-thread state, and what is known per function handle.
//! `launch`: launches and graphs. `resource`: module loads and other resource events.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kern_dump::format::{Attribution, ParamSlot};

use crate::ffi::{self, api_of, cbid, CallbackData, Handle, ResourceData};
use crate::modules::Resolved;
use crate::tracer::{self, contain, log_line, Tracer};

macro_rules! vlog {
    ($t:expr, $($arg:tt)*) => {
        if $t.verbose > 0 {
            log_line(format_args!($($arg)*));
        }
    };
}

// After the macro, so that the submodules can use it.
mod launch;
mod resource;

use launch::{launch_function, on_add_kernel_node, on_graph_launch, on_instantiate, on_launch};
use resource::{on_loading_call, on_resource};

/// One traced call in progress on this thread.
#[derive(Default)]
struct Frame {
    cbid: u32,
    /// Module ids loaded during the call.
    loaded: Vec<u32>,
    /// Graph nodes created during the call.
    nodes: Vec<u64>,
}

/// What this thread knows about a function handle.
#[derive(Clone)]
struct FuncEntry {
    name: Arc<str>,
    module: Option<u64>,
    layout: Option<Arc<[ParamSlot]>>,
    resolved: Option<Resolved>,
    module_gen: u64,
}

#[derive(Default)]
struct ThreadState {
    tid: u32,
    frames: Vec<Frame>,
    /// (context, function handle) → entry. Per thread, so launches take no lock to find it.
    funcs: HashMap<(u64, u64), FuncEntry>,
    unload_gen: u64,
}

thread_local! {
    static THREAD: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

/// Runs `f` on this thread's state; `None` if it is unavailable (thread teardown, or a nested
/// callback while the state is borrowed).
fn with_thread<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    THREAD
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

fn tid() -> u32 {
    with_thread(|s| {
        if s.tid == 0 {
            // SAFETY: gettid has no preconditions.
            s.tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        }
        s.tid
    })
    .unwrap_or(0)
}

/// The function CUPTI calls. Registered with `cuptiSubscribe`.
///
/// # Safety
/// Called by CUPTI with `cbdata` pointing to the callback data of `domain`.
pub unsafe extern "C" fn cupti_callback(
    _userdata: *mut c_void,
    domain: u32,
    id: u32,
    cbdata: *const c_void,
) {
    let Some(t) = tracer::get() else { return };
    if !t.enabled() || cbdata.is_null() {
        return;
    }
    contain("the CUPTI callback", (), || match domain {
        // SAFETY: CUPTI passes CUpti_CallbackData for the driver API domain.
        ffi::DOMAIN_DRIVER_API => unsafe { on_driver(t, id, &*(cbdata as *const CallbackData)) },
        // SAFETY: and CUpti_ResourceData for the resource domain.
        ffi::DOMAIN_RESOURCE => unsafe { on_resource(t, id, &*(cbdata as *const ResourceData)) },
        _ => {}
    })
}

fn is_launch(id: u32) -> bool {
    matches!(
        id,
        cbid::CU_LAUNCH_KERNEL
            | cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ
    )
}

fn is_instantiate(id: u32) -> bool {
    matches!(
        id,
        cbid::CU_GRAPH_INSTANTIATE
            | cbid::CU_GRAPH_INSTANTIATE_V2
            | cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS
            | cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS
            | cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ
    )
}

/// A C string from CUPTI or the driver, as text.
///
/// # Safety
/// `p` is null or a valid C string that outlives `'a` (in practice: the callback).
unsafe fn cstr<'a>(p: *const std::ffi::c_char) -> Option<Cow<'a, str>> {
    // SAFETY: per the caller.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy())
}

/// # Safety
/// `data` is the callback data of driver call `id`, valid for this callback.
unsafe fn on_driver(t: &Tracer, id: u32, data: &CallbackData) {
    let verbose_launch = is_launch(id) && t.verbose_launches_left.load(Ordering::Relaxed) > 0;
    if data.callback_site == ffi::API_ENTER {
        with_thread(|s| {
            s.frames.push(Frame {
                cbid: id,
                ..Frame::default()
            })
        });
        if verbose_launch {
            log_line(format_args!(
                "callback  domain=DRIVER_API  cbid={}  site=ENTER",
                api_of(id)
            ));
            // SAFETY: forwarded.
            let f = unsafe { launch_function(id, data.function_params) };
            let known = with_thread(|s| s.funcs.contains_key(&(data.context as u64, f as u64)))
                .unwrap_or(false);
            if !known {
                log_line(format_args!(
                    "  module not resolved yet: with lazy loading (CUDA 12+) it may materialize during this launch"
                ));
            }
        }
        return;
    }
    let frame = with_thread(|s| pop_frame(s, id)).unwrap_or_default();
    let result = if data.function_return_value.is_null() {
        0
    } else {
        // SAFETY: the return value of a driver call is a CUresult.
        unsafe { *(data.function_return_value as *const i32) }
    };
    if verbose_launch {
        log_line(format_args!(
            "callback  domain=DRIVER_API  cbid={}  site=EXIT",
            api_of(id)
        ));
    }
    // SAFETY (all arms): `function_params` points to the parameter struct of call `id`.
    unsafe {
        match id {
            _ if is_launch(id) => on_launch(t, id, data, &frame, result),
            _ if is_instantiate(id) => on_instantiate(t, id, data, result),
            cbid::CU_GRAPH_LAUNCH | cbid::CU_GRAPH_LAUNCH_PTSZ => {
                on_graph_launch(t, id, data, result)
            }
            cbid::CU_GRAPH_ADD_KERNEL_NODE | cbid::CU_GRAPH_ADD_KERNEL_NODE_V2 => {
                on_add_kernel_node(t, id, data, result)
            }
            _ if !frame.loaded.is_empty() && result == ffi::CUDA_SUCCESS => {
                on_loading_call(t, id, data, &frame)
            }
            _ => {}
        }
    }
}

fn pop_frame(s: &mut ThreadState, id: u32) -> Frame {
    match s.frames.iter().rposition(|f| f.cbid == id) {
        Some(i) => {
            let frame = s.frames.swap_remove(i);
            // Anything above it lost its EXIT; drop it.
            s.frames.truncate(i);
            frame
        }
        None => Frame::default(),
    }
}

/// Looks up (or computes) what is known about function `f` of context `ctx`, binds the module
/// loads observed during this call, and attributes it.
///
/// # Safety
/// `f` is a function handle passed to a driver call that is in progress.
unsafe fn function_entry(
    t: &Tracer,
    ctx: u64,
    f: Handle,
    symbol: Option<&str>,
    loaded: &[u32],
) -> FuncEntry {
    let key = (ctx, f as u64);
    let unload_gen = t.unload_gen.load(Ordering::Relaxed);
    let cached = with_thread(|s| {
        if s.unload_gen != unload_gen {
            // A module was unloaded: function handles may have been reused.
            s.funcs.clear();
            s.unload_gen = unload_gen;
        }
        s.funcs.get(&key).cloned()
    })
    .flatten();
    let mut changed = cached.is_none();
    let mut entry = match cached {
        Some(e) => e,
        None => {
            // Driver queries with no lock held (they may fire nested callbacks).
            // SAFETY: forwarded.
            let name = symbol
                .map(str::to_owned)
                .or_else(|| unsafe { t.driver.function_name(f) });
            FuncEntry {
                name: Arc::from(name.unwrap_or_else(|| format!("<unknown function {f:p}>"))),
                // SAFETY: forwarded.
                module: unsafe { t.driver.function_module(f) },
                // SAFETY: forwarded.
                layout: unsafe { t.driver.param_layout(f) }.map(Arc::from),
                resolved: None,
                module_gen: 0,
            }
        }
    };
    if let (false, Some(h)) = (loaded.is_empty(), entry.module) {
        if t.modules.lock().bind_observed(h, loaded, Some(&entry.name)) {
            t.module_gen.fetch_add(1, Ordering::Relaxed);
            vlog!(
                t,
                "  bound CUmodule {h:#x} of {} to moduleId={:?} (loaded during this call)",
                entry.name,
                loaded
            );
        }
    }
    let gen = t.module_gen.load(Ordering::Relaxed);
    let stale = match &entry.resolved {
        None => true,
        Some(r) => r.attribution != Attribution::FunctionModule && entry.module_gen != gen,
    };
    if stale {
        let r = t.modules.lock().attribute(ctx, entry.module, &entry.name);
        entry.resolved = Some(r);
        entry.module_gen = t.module_gen.load(Ordering::Relaxed);
        changed = true;
    }
    if changed {
        let stored = entry.clone();
        with_thread(|s| s.funcs.insert(key, stored));
    }
    entry
}
