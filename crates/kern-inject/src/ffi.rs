//! The C structures and constants of CUPTI and the CUDA driver that this library reads.
//!
//! Written by hand, mirroring the bindgen output of cudarc 0.19 (`cuda-13000`) for CUPTI 13.0's
//! `cupti_callbacks.h`, `generated_cuda_meta.h` and `cuda.h`; the `layout` tests compare every
//! size, offset and id below with cudarc's. Enums the driver passes in are plain integers here,
//! so that a value this library does not know can never be undefined behaviour.

use std::ffi::{c_char, c_void};

pub type CUresult = i32;
pub type Handle = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;

// CUpti_CallbackDomain
pub const DOMAIN_DRIVER_API: u32 = 1;
pub const DOMAIN_RESOURCE: u32 = 3;

// CUpti_ApiCallbackSite
pub const API_ENTER: u32 = 0;
pub const API_EXIT: u32 = 1;

// CUpti_CallbackIdResource
pub const CBID_RESOURCE_CONTEXT_CREATED: u32 = 1;
pub const CBID_RESOURCE_CONTEXT_DESTROY_STARTING: u32 = 2;
pub const CBID_RESOURCE_CU_INIT_FINISHED: u32 = 5;
pub const CBID_RESOURCE_MODULE_LOADED: u32 = 6;
pub const CBID_RESOURCE_MODULE_UNLOAD_STARTING: u32 = 7;
pub const CBID_RESOURCE_MODULE_PROFILED: u32 = 8;
pub const CBID_RESOURCE_GRAPHNODE_CREATED: u32 = 13;
pub const CBID_RESOURCE_GRAPHEXEC_CREATED: u32 = 18;

/// Name of a resource callback id, for the verbose log.
pub fn resource_cbid_name(cbid: u32) -> &'static str {
    match cbid {
        1 => "CONTEXT_CREATED",
        2 => "CONTEXT_DESTROY_STARTING",
        3 => "STREAM_CREATED",
        4 => "STREAM_DESTROY_STARTING",
        5 => "CU_INIT_FINISHED",
        6 => "MODULE_LOADED",
        7 => "MODULE_UNLOAD_STARTING",
        8 => "MODULE_PROFILED",
        9 => "GRAPH_CREATED",
        10 => "GRAPH_DESTROY_STARTING",
        11 => "GRAPH_CLONED",
        12 => "GRAPHNODE_CREATE_STARTING",
        13 => "GRAPHNODE_CREATED",
        14 => "GRAPHNODE_DESTROY_STARTING",
        15 => "GRAPHNODE_DEPENDENCY_CREATED",
        16 => "GRAPHNODE_DEPENDENCY_DESTROY_STARTING",
        17 => "GRAPHEXEC_CREATE_STARTING",
        18 => "GRAPHEXEC_CREATED",
        19 => "GRAPHEXEC_DESTROY_STARTING",
        20 => "GRAPHNODE_CLONED",
        21 => "STREAM_ATTRIBUTE_CHANGED",
        22 => "GRAPH_NODE_UPDATED",
        23 => "GRAPH_NODE_SET_PARAMS",
        _ => "?",
    }
}

/// `CUpti_driver_api_trace_cbid` values of the driver calls this library subscribes to.
pub mod cbid {
    pub const CU_MODULE_LOAD: u32 = 18;
    pub const CU_MODULE_LOAD_DATA: u32 = 19;
    pub const CU_MODULE_LOAD_DATA_EX: u32 = 20;
    pub const CU_MODULE_LOAD_FAT_BINARY: u32 = 21;
    pub const CU_MODULE_GET_FUNCTION: u32 = 23;
    pub const CU_FUNC_GET_ATTRIBUTE: u32 = 85;
    pub const CU_LAUNCH_KERNEL: u32 = 307;
    pub const CU_LAUNCH_KERNEL_PTSZ: u32 = 442;
    pub const CU_LAUNCH_COOPERATIVE_KERNEL: u32 = 477;
    pub const CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ: u32 = 478;
    pub const CU_FUNC_SET_ATTRIBUTE: u32 = 481;
    pub const CU_GRAPH_ADD_KERNEL_NODE: u32 = 502;
    pub const CU_GRAPH_INSTANTIATE: u32 = 513;
    pub const CU_GRAPH_LAUNCH: u32 = 514;
    pub const CU_GRAPH_LAUNCH_PTSZ: u32 = 515;
    pub const CU_GRAPH_INSTANTIATE_V2: u32 = 578;
    pub const CU_GRAPH_INSTANTIATE_WITH_FLAGS: u32 = 643;
    pub const CU_LAUNCH_KERNEL_EX: u32 = 652;
    pub const CU_LAUNCH_KERNEL_EX_PTSZ: u32 = 653;
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS: u32 = 656;
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ: u32 = 657;
    pub const CU_LIBRARY_LOAD_DATA: u32 = 678;
    pub const CU_LIBRARY_LOAD_FROM_FILE: u32 = 679;
    pub const CU_LIBRARY_GET_KERNEL: u32 = 681;
    pub const CU_LIBRARY_GET_MODULE: u32 = 682;
    pub const CU_KERNEL_GET_FUNCTION: u32 = 683;
    pub const CU_GRAPH_ADD_KERNEL_NODE_V2: u32 = 689;

    /// Every driver callback this library enables.
    pub const ALL: &[u32] = &[
        CU_MODULE_LOAD,
        CU_MODULE_LOAD_DATA,
        CU_MODULE_LOAD_DATA_EX,
        CU_MODULE_LOAD_FAT_BINARY,
        CU_MODULE_GET_FUNCTION,
        CU_FUNC_GET_ATTRIBUTE,
        CU_LAUNCH_KERNEL,
        CU_LAUNCH_KERNEL_PTSZ,
        CU_LAUNCH_COOPERATIVE_KERNEL,
        CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
        CU_FUNC_SET_ATTRIBUTE,
        CU_GRAPH_ADD_KERNEL_NODE,
        CU_GRAPH_INSTANTIATE,
        CU_GRAPH_LAUNCH,
        CU_GRAPH_LAUNCH_PTSZ,
        CU_GRAPH_INSTANTIATE_V2,
        CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        CU_LAUNCH_KERNEL_EX,
        CU_LAUNCH_KERNEL_EX_PTSZ,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
        CU_LIBRARY_LOAD_DATA,
        CU_LIBRARY_LOAD_FROM_FILE,
        CU_LIBRARY_GET_KERNEL,
        CU_LIBRARY_GET_MODULE,
        CU_KERNEL_GET_FUNCTION,
        CU_GRAPH_ADD_KERNEL_NODE_V2,
    ];
}

/// The trace's name for a subscribed driver call.
pub fn api_of(id: u32) -> kern_dump::format::Api {
    use kern_dump::format::Api;
    match id {
        cbid::CU_MODULE_LOAD => Api::ModuleLoad,
        cbid::CU_MODULE_LOAD_DATA => Api::ModuleLoadData,
        cbid::CU_MODULE_LOAD_DATA_EX => Api::ModuleLoadDataEx,
        cbid::CU_MODULE_LOAD_FAT_BINARY => Api::ModuleLoadFatBinary,
        cbid::CU_MODULE_GET_FUNCTION => Api::ModuleGetFunction,
        cbid::CU_FUNC_GET_ATTRIBUTE => Api::FuncGetAttribute,
        cbid::CU_FUNC_SET_ATTRIBUTE => Api::FuncSetAttribute,
        cbid::CU_LAUNCH_KERNEL => Api::LaunchKernel,
        cbid::CU_LAUNCH_KERNEL_PTSZ => Api::LaunchKernelPtsz,
        cbid::CU_LAUNCH_KERNEL_EX => Api::LaunchKernelEx,
        cbid::CU_LAUNCH_KERNEL_EX_PTSZ => Api::LaunchKernelExPtsz,
        cbid::CU_LAUNCH_COOPERATIVE_KERNEL => Api::LaunchCooperativeKernel,
        cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => Api::LaunchCooperativeKernelPtsz,
        cbid::CU_GRAPH_ADD_KERNEL_NODE => Api::GraphAddKernelNode,
        cbid::CU_GRAPH_ADD_KERNEL_NODE_V2 => Api::GraphAddKernelNodeV2,
        cbid::CU_GRAPH_LAUNCH => Api::GraphLaunch,
        cbid::CU_GRAPH_LAUNCH_PTSZ => Api::GraphLaunchPtsz,
        cbid::CU_GRAPH_INSTANTIATE => Api::GraphInstantiate,
        cbid::CU_GRAPH_INSTANTIATE_V2 => Api::GraphInstantiateV2,
        cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS => Api::GraphInstantiateWithFlags,
        cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS => Api::GraphInstantiateWithParams,
        cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ => Api::GraphInstantiateWithParamsPtsz,
        cbid::CU_LIBRARY_LOAD_DATA => Api::LibraryLoadData,
        cbid::CU_LIBRARY_LOAD_FROM_FILE => Api::LibraryLoadFromFile,
        cbid::CU_LIBRARY_GET_KERNEL => Api::LibraryGetKernel,
        cbid::CU_LIBRARY_GET_MODULE => Api::LibraryGetModule,
        cbid::CU_KERNEL_GET_FUNCTION => Api::KernelGetFunction,
        _ => Api::Other,
    }
}

/// `CUpti_CallbackData`: what a DRIVER_API callback receives.
#[repr(C)]
pub struct CallbackData {
    pub callback_site: u32,
    pub function_name: *const c_char,
    pub function_params: *const c_void,
    pub function_return_value: *mut c_void,
    pub symbol_name: *const c_char,
    pub context: Handle,
    pub context_uid: u32,
    pub correlation_data: *mut u64,
    pub correlation_id: u32,
}

/// `CUpti_ResourceData`: what a RESOURCE callback receives.
#[repr(C)]
pub struct ResourceData {
    pub context: Handle,
    /// A union whose only documented member is the `CUstream` of stream callbacks.
    pub resource_handle: u64,
    pub resource_descriptor: *mut c_void,
}

/// `CUpti_ModuleResourceData`: `resource_descriptor` of MODULE_LOADED / MODULE_UNLOAD_STARTING.
#[repr(C)]
pub struct ModuleResourceData {
    pub module_id: u32,
    pub cubin_size: usize,
    pub p_cubin: *const c_char,
}

/// `CUpti_GraphData`: `resource_descriptor` of the GRAPH* resource callbacks.
#[repr(C)]
pub struct GraphData {
    pub graph: Handle,
    pub original_graph: Handle,
    pub node: Handle,
    pub original_node: Handle,
    pub node_type: u32,
    pub dependency: Handle,
    pub graph_exec: Handle,
}

/// `cuLaunchKernel_params` (also `_ptsz`).
#[repr(C)]
pub struct LaunchKernelParams {
    pub f: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `cuLaunchCooperativeKernel_params` (also `_ptsz`): like [`LaunchKernelParams`] without `extra`.
#[repr(C)]
pub struct LaunchCooperativeKernelParams {
    pub f: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub kernel_params: *mut *mut c_void,
}

/// `cuLaunchKernelEx_params` (also `_ptsz`).
#[repr(C)]
pub struct LaunchKernelExParams {
    pub config: *const LaunchConfig,
    pub f: Handle,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUlaunchConfig`.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Handle,
    pub attrs: *const LaunchAttribute,
    pub num_attrs: u32,
}

/// `CUlaunchAttribute`: an id and a 64-byte value union.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// `cuGraphLaunch_params` (also `_ptsz`).
#[repr(C)]
pub struct GraphLaunchParams {
    pub graph_exec: Handle,
    pub stream: Handle,
}

/// The first two fields every `cuGraphInstantiate*_params` shares.
#[repr(C)]
pub struct GraphInstantiateParams {
    pub ph_graph_exec: *mut Handle,
    pub graph: Handle,
}

/// `cuGraphAddKernelNode_params` and `_v2`: only the node parameter pointer's target differs
/// (`CUDA_KERNEL_NODE_PARAMS_v1` / `_v2`), and the v2 struct extends v1.
#[repr(C)]
pub struct GraphAddKernelNodeParams {
    pub ph_graph_node: *mut Handle,
    pub graph: Handle,
    pub dependencies: *const Handle,
    pub num_dependencies: usize,
    pub node_params: *const KernelNodeParams,
}

/// The `CUDA_KERNEL_NODE_PARAMS_v1` prefix of both kernel node parameter structs.
#[repr(C)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (passed to `cuGraphAddKernelNode_v2`): a function may be
/// given as a `CUkernel` in `kern` instead of `func`.
#[repr(C)]
pub struct KernelNodeParamsV2 {
    pub v1: KernelNodeParams,
    pub kern: Handle,
    pub ctx: Handle,
}

/// Params whose first field is the `CUmodule*` / `CUfunction*` the call returns:
/// `cuModuleLoad*` (module), `cuLibraryGetModule` (pMod), `cuKernelGetFunction` (pFunc).
#[repr(C)]
pub struct FirstOutParams {
    pub out: *mut Handle,
}

/// `cuModuleGetFunction_params`.
#[repr(C)]
pub struct ModuleGetFunctionParams {
    pub hfunc: *mut Handle,
    pub hmod: Handle,
    pub name: *const c_char,
}

/// `cuFuncSetAttribute_params`.
#[repr(C)]
pub struct FuncSetAttributeParams {
    pub hfunc: Handle,
    pub attrib: u32,
    pub value: i32,
}

/// `cuFuncGetAttribute_params`.
#[repr(C)]
pub struct FuncGetAttributeParams {
    pub pi: *mut i32,
    pub attrib: u32,
    pub hfunc: Handle,
}

/// `CU_STREAM_PER_THREAD`: the handle of the per-thread default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: u32 = 1;

// `extra` keys of cuLaunchKernel.
pub const CU_LAUNCH_PARAM_END: usize = 0x0;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x1;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x2;

#[cfg(test)]
mod layout {
    //! Every hand-written layout against cudarc's bindgen output for CUDA 13.0.
    use super::*;
    use cudarc::cupti::sys as cupti;
    use cudarc::driver::sys as drv;
    use std::mem::{offset_of, size_of};

    macro_rules! same_layout {
        ($ours:ty, $theirs:ty, [$($a:ident = $b:ident),* $(,)?]) => {{
            assert_eq!(size_of::<$ours>(), size_of::<$theirs>(), "size of {}", stringify!($ours));
            $(assert_eq!(offset_of!($ours, $a), offset_of!($theirs, $b),
                "{}.{}", stringify!($ours), stringify!($a));)*
        }};
    }

    #[test]
    fn cupti_structs() {
        same_layout!(
            CallbackData,
            cupti::CUpti_CallbackData,
            [
                callback_site = callbackSite,
                function_name = functionName,
                function_params = functionParams,
                function_return_value = functionReturnValue,
                symbol_name = symbolName,
                context = context,
                context_uid = contextUid,
                correlation_data = correlationData,
                correlation_id = correlationId,
            ]
        );
        same_layout!(
            ResourceData,
            cupti::CUpti_ResourceData,
            [
                context = context,
                resource_handle = resourceHandle,
                resource_descriptor = resourceDescriptor,
            ]
        );
        same_layout!(
            ModuleResourceData,
            cupti::CUpti_ModuleResourceData,
            [
                module_id = moduleId,
                cubin_size = cubinSize,
                p_cubin = pCubin,
            ]
        );
        same_layout!(
            GraphData,
            cupti::CUpti_GraphData,
            [
                graph = graph,
                original_graph = originalGraph,
                node = node,
                original_node = originalNode,
                node_type = nodeType,
                dependency = dependency,
                graph_exec = graphExec,
            ]
        );
    }

    #[test]
    fn driver_params() {
        same_layout!(
            LaunchKernelParams,
            cupti::cuLaunchKernel_params_st,
            [
                f = f,
                grid = gridDimX,
                block = blockDimX,
                shared_mem_bytes = sharedMemBytes,
                stream = hStream,
                kernel_params = kernelParams,
                extra = extra,
            ]
        );
        same_layout!(
            LaunchKernelParams,
            cupti::cuLaunchKernel_ptsz_params_st,
            [
                stream = hStream,
                kernel_params = kernelParams,
                extra = extra,
            ]
        );
        same_layout!(
            LaunchCooperativeKernelParams,
            cupti::cuLaunchCooperativeKernel_params_st,
            [
                f = f,
                grid = gridDimX,
                block = blockDimX,
                shared_mem_bytes = sharedMemBytes,
                stream = hStream,
                kernel_params = kernelParams,
            ]
        );
        same_layout!(
            LaunchCooperativeKernelParams,
            cupti::cuLaunchCooperativeKernel_ptsz_params_st,
            [kernel_params = kernelParams,]
        );
        same_layout!(
            LaunchKernelExParams,
            cupti::cuLaunchKernelEx_params_st,
            [
                config = config,
                f = f,
                kernel_params = kernelParams,
                extra = extra,
            ]
        );
        same_layout!(
            LaunchKernelExParams,
            cupti::cuLaunchKernelEx_ptsz_params_st,
            [extra = extra]
        );
        same_layout!(
            LaunchConfig,
            drv::CUlaunchConfig,
            [
                grid = gridDimX,
                block = blockDimX,
                shared_mem_bytes = sharedMemBytes,
                stream = hStream,
                attrs = attrs,
                num_attrs = numAttrs,
            ]
        );
        same_layout!(
            LaunchAttribute,
            drv::CUlaunchAttribute,
            [id = id, value = value]
        );
        same_layout!(
            GraphLaunchParams,
            cupti::cuGraphLaunch_params_st,
            [graph_exec = hGraph, stream = hStream]
        );
        same_layout!(
            GraphLaunchParams,
            cupti::cuGraphLaunch_ptsz_params_st,
            [graph_exec = hGraphExec, stream = hStream]
        );
        assert_eq!(
            offset_of!(cupti::cuGraphInstantiateWithFlags_params_st, hGraph),
            offset_of!(GraphInstantiateParams, graph)
        );
        assert_eq!(
            offset_of!(cupti::cuGraphInstantiate_v2_params_st, hGraph),
            offset_of!(GraphInstantiateParams, graph)
        );
        assert_eq!(
            offset_of!(cupti::cuGraphInstantiateWithParams_params_st, hGraph),
            offset_of!(GraphInstantiateParams, graph)
        );
        assert_eq!(
            offset_of!(cupti::cuGraphInstantiateWithParams_ptsz_params_st, hGraph),
            offset_of!(GraphInstantiateParams, graph)
        );
        same_layout!(
            GraphAddKernelNodeParams,
            cupti::cuGraphAddKernelNode_v2_params_st,
            [
                ph_graph_node = phGraphNode,
                graph = hGraph,
                dependencies = dependencies,
                num_dependencies = numDependencies,
                node_params = nodeParams,
            ]
        );
        same_layout!(
            KernelNodeParams,
            drv::CUDA_KERNEL_NODE_PARAMS_v1,
            [
                func = func,
                grid = gridDimX,
                block = blockDimX,
                shared_mem_bytes = sharedMemBytes,
                kernel_params = kernelParams,
                extra = extra,
            ]
        );
        assert_eq!(
            offset_of!(drv::CUDA_KERNEL_NODE_PARAMS_v2, extra),
            offset_of!(KernelNodeParams, extra)
        );
        same_layout!(
            KernelNodeParamsV2,
            drv::CUDA_KERNEL_NODE_PARAMS_v2,
            [kern = kern, ctx = ctx]
        );
        same_layout!(
            ModuleGetFunctionParams,
            cupti::cuModuleGetFunction_params_st,
            [hfunc = hfunc, hmod = hmod, name = name]
        );
        same_layout!(
            FuncSetAttributeParams,
            cupti::cuFuncSetAttribute_params_st,
            [hfunc = hfunc, attrib = attrib, value = value]
        );
        same_layout!(
            FuncGetAttributeParams,
            cupti::cuFuncGetAttribute_params_st,
            [pi = pi, attrib = attrib, hfunc = hfunc]
        );
        assert_eq!(offset_of!(cupti::cuModuleLoadData_params_st, module), 0);
        assert_eq!(offset_of!(cupti::cuModuleLoad_params_st, module), 0);
        assert_eq!(offset_of!(cupti::cuModuleLoadDataEx_params_st, module), 0);
        assert_eq!(
            offset_of!(cupti::cuModuleLoadFatBinary_params_st, module),
            0
        );
        assert_eq!(offset_of!(cupti::cuLibraryGetModule_params_st, pMod), 0);
        assert_eq!(offset_of!(cupti::cuKernelGetFunction_params_st, pFunc), 0);
    }

    #[test]
    fn callback_ids() {
        use cupti::CUpti_driver_api_trace_cbid_enum as D;
        let theirs = [
            (
                cbid::CU_MODULE_LOAD,
                D::CUPTI_DRIVER_TRACE_CBID_cuModuleLoad,
            ),
            (
                cbid::CU_MODULE_LOAD_DATA,
                D::CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData,
            ),
            (
                cbid::CU_MODULE_LOAD_DATA_EX,
                D::CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx,
            ),
            (
                cbid::CU_MODULE_LOAD_FAT_BINARY,
                D::CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary,
            ),
            (
                cbid::CU_MODULE_GET_FUNCTION,
                D::CUPTI_DRIVER_TRACE_CBID_cuModuleGetFunction,
            ),
            (
                cbid::CU_FUNC_GET_ATTRIBUTE,
                D::CUPTI_DRIVER_TRACE_CBID_cuFuncGetAttribute,
            ),
            (
                cbid::CU_LAUNCH_KERNEL,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
            ),
            (
                cbid::CU_LAUNCH_KERNEL_PTSZ,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
            ),
            (
                cbid::CU_LAUNCH_COOPERATIVE_KERNEL,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
            ),
            (
                cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
            ),
            (
                cbid::CU_FUNC_SET_ATTRIBUTE,
                D::CUPTI_DRIVER_TRACE_CBID_cuFuncSetAttribute,
            ),
            (
                cbid::CU_GRAPH_ADD_KERNEL_NODE,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode,
            ),
            (
                cbid::CU_GRAPH_INSTANTIATE,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate,
            ),
            (
                cbid::CU_GRAPH_LAUNCH,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
            ),
            (
                cbid::CU_GRAPH_LAUNCH_PTSZ,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
            ),
            (
                cbid::CU_GRAPH_INSTANTIATE_V2,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
            ),
            (
                cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,
            ),
            (
                cbid::CU_LAUNCH_KERNEL_EX,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
            ),
            (
                cbid::CU_LAUNCH_KERNEL_EX_PTSZ,
                D::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
            ),
            (
                cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
            ),
            (
                cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
            ),
            (
                cbid::CU_LIBRARY_LOAD_DATA,
                D::CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadData,
            ),
            (
                cbid::CU_LIBRARY_LOAD_FROM_FILE,
                D::CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadFromFile,
            ),
            (
                cbid::CU_LIBRARY_GET_KERNEL,
                D::CUPTI_DRIVER_TRACE_CBID_cuLibraryGetKernel,
            ),
            (
                cbid::CU_LIBRARY_GET_MODULE,
                D::CUPTI_DRIVER_TRACE_CBID_cuLibraryGetModule,
            ),
            (
                cbid::CU_KERNEL_GET_FUNCTION,
                D::CUPTI_DRIVER_TRACE_CBID_cuKernelGetFunction,
            ),
            (
                cbid::CU_GRAPH_ADD_KERNEL_NODE_V2,
                D::CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2,
            ),
        ];
        assert_eq!(theirs.len(), cbid::ALL.len());
        for (ours, theirs) in theirs {
            assert_eq!(ours, theirs as u32, "{theirs:?}");
            assert!(cbid::ALL.contains(&ours));
            assert_ne!(
                api_of(ours),
                kern_dump::format::Api::Other,
                "{theirs:?} has no trace name"
            );
        }
        use cupti::CUpti_CallbackIdResource as R;
        assert_eq!(
            CBID_RESOURCE_CU_INIT_FINISHED,
            R::CUPTI_CBID_RESOURCE_CU_INIT_FINISHED as u32
        );
        assert_eq!(
            CBID_RESOURCE_CONTEXT_CREATED,
            R::CUPTI_CBID_RESOURCE_CONTEXT_CREATED as u32
        );
        assert_eq!(
            CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
            R::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING as u32
        );
        assert_eq!(
            CBID_RESOURCE_MODULE_LOADED,
            R::CUPTI_CBID_RESOURCE_MODULE_LOADED as u32
        );
        assert_eq!(
            CBID_RESOURCE_MODULE_UNLOAD_STARTING,
            R::CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING as u32
        );
        assert_eq!(
            CBID_RESOURCE_MODULE_PROFILED,
            R::CUPTI_CBID_RESOURCE_MODULE_PROFILED as u32
        );
        assert_eq!(
            CBID_RESOURCE_GRAPHNODE_CREATED,
            R::CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED as u32
        );
        assert_eq!(
            CBID_RESOURCE_GRAPHEXEC_CREATED,
            R::CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED as u32
        );
        assert_eq!(
            resource_cbid_name(R::CUPTI_CBID_RESOURCE_GRAPH_NODE_SET_PARAMS as u32),
            "GRAPH_NODE_SET_PARAMS"
        );
        use cupti::CUpti_CallbackDomain as Dom;
        assert_eq!(DOMAIN_DRIVER_API, Dom::CUPTI_CB_DOMAIN_DRIVER_API as u32);
        assert_eq!(DOMAIN_RESOURCE, Dom::CUPTI_CB_DOMAIN_RESOURCE as u32);
        assert_eq!(
            API_ENTER,
            cupti::CUpti_ApiCallbackSite::CUPTI_API_ENTER as u32
        );
        assert_eq!(
            API_EXIT,
            cupti::CUpti_ApiCallbackSite::CUPTI_API_EXIT as u32
        );
        assert_eq!(
            CU_LAUNCH_PARAM_BUFFER_POINTER,
            drv::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize
        );
        assert_eq!(
            CU_LAUNCH_PARAM_BUFFER_SIZE,
            drv::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize
        );
        assert_eq!(
            CU_LAUNCH_PARAM_END,
            drv::CU_LAUNCH_PARAM_END_AS_INT as usize
        );
        assert_eq!(
            CU_STREAM_CAPTURE_STATUS_ACTIVE,
            drv::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32
        );
    }
}
