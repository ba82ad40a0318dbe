//! Module loads and other resource events: dumping each module image, binding `CUmodule`
//! handles to the loads observed inside a traced call, graph resource events.

use std::borrow::Cow;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kern_dump::format::{Api, ModuleRecord, ModuleUnloadRecord, NoteLevel, Record, MODULES_DIR};
use kern_dump::image::{cubin_symbols, sha256_hex, sniff_kind};

use super::launch::record_graph_exec;
use super::{cstr, is_instantiate, is_launch, tid, with_thread, Frame};
use crate::ffi::{self, api_of, cbid, CallbackData, ResourceData};
use crate::tracer::{log_line, Tracer};

/// A call other than a launch during which modules were loaded: bind the handle it returned
/// or used.
///
/// # Safety
/// See [`on_driver`]; the call succeeded.
pub(super) unsafe fn on_loading_call(t: &Tracer, id: u32, data: &CallbackData, frame: &Frame) {
    let params = data.function_params;
    if params.is_null() {
        return;
    }
    // SAFETY (all arms): the parameter struct of call `id`; output pointers were written
    // because the call succeeded.
    let (module, name): (Option<u64>, Option<String>) = unsafe {
        match id {
            cbid::CU_MODULE_LOAD
            | cbid::CU_MODULE_LOAD_DATA
            | cbid::CU_MODULE_LOAD_DATA_EX
            | cbid::CU_MODULE_LOAD_FAT_BINARY
            | cbid::CU_LIBRARY_GET_MODULE => {
                let out = (*(params as *const ffi::FirstOutParams)).out;
                (out.as_ref().map(|m| *m as u64), None)
            }
            cbid::CU_MODULE_GET_FUNCTION => {
                let p = &*(params as *const ffi::ModuleGetFunctionParams);
                (Some(p.hmod as u64), cstr(p.name).map(Cow::into_owned))
            }
            cbid::CU_KERNEL_GET_FUNCTION => {
                let out = (*(params as *const ffi::FirstOutParams)).out;
                match out.as_ref() {
                    Some(&f) => (t.driver.function_module(f), t.driver.function_name(f)),
                    None => (None, None),
                }
            }
            cbid::CU_FUNC_SET_ATTRIBUTE => {
                let f = (*(params as *const ffi::FuncSetAttributeParams)).hfunc;
                (t.driver.function_module(f), t.driver.function_name(f))
            }
            cbid::CU_FUNC_GET_ATTRIBUTE => {
                let f = (*(params as *const ffi::FuncGetAttributeParams)).hfunc;
                (t.driver.function_module(f), t.driver.function_name(f))
            }
            // cuLibraryLoad*, cuLibraryGetKernel: no CUmodule to bind; the loads stay unbound
            // until a launch binds or deduces them.
            _ => (None, None),
        }
    };
    if let Some(h) = module {
        if t.modules
            .lock()
            .bind_observed(h, &frame.loaded, name.as_deref())
        {
            t.module_gen.fetch_add(1, Ordering::Relaxed);
            vlog!(
                t,
                "  bound CUmodule {h:#x} to moduleId={:?} (loaded during {})",
                frame.loaded,
                api_of(id)
            );
        }
    }
}

/// # Safety
/// `data` is the resource data of resource event `id`, valid for this callback.
pub(super) unsafe fn on_resource(t: &Tracer, id: u32, data: &ResourceData) {
    vlog!(
        t,
        "callback  domain=RESOURCE  cbid={}",
        ffi::resource_cbid_name(id)
    );
    // SAFETY (all arms): resource_descriptor points to the struct documented for `id`.
    unsafe {
        match id {
            ffi::CBID_RESOURCE_MODULE_LOADED => on_module_loaded(t, data),
            ffi::CBID_RESOURCE_MODULE_UNLOAD_STARTING => {
                let Some(m) = (data.resource_descriptor as *const ffi::ModuleResourceData).as_ref()
                else {
                    return;
                };
                t.modules.lock().unloaded(m.module_id);
                t.unload_gen.fetch_add(1, Ordering::Relaxed);
                t.module_gen.fetch_add(1, Ordering::Relaxed);
                vlog!(t, "  moduleId={} unloading", m.module_id);
                t.emit(&Record::ModuleUnload(ModuleUnloadRecord {
                    seq: t.next_seq(),
                    module_id: m.module_id,
                }));
            }
            ffi::CBID_RESOURCE_GRAPHNODE_CREATED => {
                let Some(g) = (data.resource_descriptor as *const ffi::GraphData).as_ref() else {
                    return;
                };
                let node = g.node as u64;
                with_thread(|s| {
                    if let Some(f) = s.frames.last_mut().filter(|f| is_launch(f.cbid)) {
                        f.nodes.push(node);
                    }
                });
            }
            ffi::CBID_RESOURCE_GRAPHEXEC_CREATED => {
                // Instantiations through a traced call are recorded at its EXIT, from its
                // parameters; this catches the others.
                let traced =
                    with_thread(|s| s.frames.last().is_some_and(|f| is_instantiate(f.cbid)))
                        .unwrap_or(false);
                let Some(g) = (data.resource_descriptor as *const ffi::GraphData).as_ref() else {
                    return;
                };
                if !traced && !g.graph_exec.is_null() {
                    record_graph_exec(t, Api::Resource, g.graph_exec as u64, g.graph as u64);
                }
            }
            _ => vlog!(t, "  ignore (not a module load)"),
        }
    }
}

/// # Safety
/// `data` is MODULE_LOADED resource data.
unsafe fn on_module_loaded(t: &Tracer, data: &ResourceData) {
    // SAFETY: MODULE_LOADED's descriptor is a CUpti_ModuleResourceData.
    let Some(m) =
        (unsafe { (data.resource_descriptor as *const ffi::ModuleResourceData).as_ref() })
    else {
        return;
    };
    if m.p_cubin.is_null() || m.cubin_size == 0 {
        // Said on stderr once per process; every occurrence is in the trace.
        static SAID: AtomicBool = AtomicBool::new(false);
        let level = if SAID.swap(true, Ordering::Relaxed) {
            NoteLevel::Info
        } else {
            NoteLevel::Warning
        };
        t.note(
            level,
            format!(
                "moduleId={} was loaded without an image (cubinSize=0): not dumped",
                m.module_id
            ),
        );
        return;
    }
    // SAFETY: pCubin holds cubinSize bytes during the callback.
    let bytes = unsafe { std::slice::from_raw_parts(m.p_cubin as *const u8, m.cubin_size) };
    let kind = sniff_kind(bytes);
    vlog!(t, "  the driver just installed a module for this GPU (the image it really uses, not a static dump of the host binary)");
    vlog!(
        t,
        "  moduleId={}  cubinSize={}  magic={}",
        m.module_id,
        m.cubin_size,
        match kind {
            kern_dump::format::ModuleKind::Cubin => "ELF",
            kern_dump::format::ModuleKind::Fatbin => "fatbin",
            kern_dump::format::ModuleKind::Ptx => "PTX",
            kern_dump::format::ModuleKind::Other => "other",
        }
    );
    let sha: Arc<str> = Arc::from(sha256_hex(bytes));
    let known = t.modules.lock().known_names(&sha);
    let names = known.unwrap_or_else(|| {
        cubin_symbols(bytes).map(|s| {
            s.launchable()
                .iter()
                .map(|n| Box::<str>::from(n.as_str()))
                .collect()
        })
    });
    let rel = format!("{MODULES_DIR}/{sha}.{}", kind.extension());
    let new_file = match write_module(t, &rel, &sha, bytes) {
        Ok(new) => new,
        Err(e) => {
            t.note(NoteLevel::Warning, format!("could not write {rel}: {e}"));
            false
        }
    };
    vlog!(
        t,
        "  {} pCubin → {}",
        if new_file {
            "copied"
        } else {
            "already dumped:"
        },
        t.dir.join(&rel).display()
    );
    let loaded_in = with_thread(|s| {
        let f = s.frames.last_mut()?;
        f.loaded.push(m.module_id);
        Some(api_of(f.cbid))
    })
    .flatten();
    let kernels = names.as_ref().map_or(0, |n| n.len() as u32);
    t.modules
        .lock()
        .loaded(m.module_id, data.context as u64, sha.clone(), names);
    t.module_gen.fetch_add(1, Ordering::Relaxed);
    t.stats.modules.fetch_add(1, Ordering::Relaxed);
    t.emit(&Record::Module(ModuleRecord {
        seq: t.next_seq(),
        module_id: m.module_id,
        ctx: data.context as u64,
        tid: tid(),
        sha256: sha,
        size: m.cubin_size as u64,
        kind,
        path: rel,
        loaded_in,
        kernels,
        new_file,
    }));
}

/// Writes `modules/<sha>.<ext>` unless present: to a temporary name, then renamed, so a reader
/// (or a concurrent process writing the same image) never sees a partial file.
fn write_module(t: &Tracer, rel: &str, sha: &str, bytes: &[u8]) -> std::io::Result<bool> {
    let path = t.dir.join(rel);
    if path.exists() {
        return Ok(false);
    }
    let tmp = t
        .dir
        .join(MODULES_DIR)
        .join(format!(".{sha}.{}.{}.tmp", std::process::id(), tid()));
    fs::write(&tmp, bytes)?;
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(true)
}
