//! The trace format: one JSON object per line in `DIR/trace.<pid>.jsonl`, tagged by `"type"`.
//!
//! These types are the single definition of the format: the injection library (kern-inject)
//! serializes them in the traced process and [`crate::reader`] deserializes them. `TRACE.md`
//! next to this crate's `Cargo.toml` documents every field for readers in other languages.
//!
//! Handles (`ctx`, `stream`, `graph`, `graph_exec`, `node`) are the raw pointer values the
//! program passed to the driver, written as JSON integers: they identify objects within one
//! process at one time, and the driver may reuse a value after the object is destroyed.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Version of the trace format, written in every `process` record. Bump it on any change a
/// reader of the previous version would misread; adding an optional field is not such a change.
pub const TRACE_VERSION: u32 = 1;

/// Sub-directory of a dump holding the module images, named `<sha256>.<ext>`.
pub const MODULES_DIR: &str = "modules";

/// Largest parameter buffer recorded for one launch. The driver's own limit is 32,764 bytes;
/// anything larger in an `extra` buffer is truncated to this and flagged by `params_from`.
pub const MAX_PARAM_BYTES: usize = 32 * 1024;

/// File name of the trace of process `pid` (the first one; see [`trace_file_name_n`]).
pub fn trace_file_name(pid: u32) -> String {
    format!("trace.{pid}.jsonl")
}

/// File name used when `trace.<pid>.jsonl` already exists (the pid was reused by the OS
/// during one dump): `trace.<pid>.<n>.jsonl` with `n` = 1, 2, ...
pub fn trace_file_name_n(pid: u32, n: u32) -> String {
    if n == 0 {
        trace_file_name(pid)
    } else {
        format!("trace.{pid}.{n}.jsonl")
    }
}

/// Whether `name` is the name of a trace file (`trace.*.jsonl`).
pub fn is_trace_file_name(name: &str) -> bool {
    name.starts_with("trace.") && name.ends_with(".jsonl") && name.len() > "trace..jsonl".len()
}

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// First line of every trace: who the process is.
    Process(ProcessRecord),
    /// The driver installed a module on the GPU (CUPTI `MODULE_LOADED`).
    Module(ModuleRecord),
    /// The driver is about to unload a module (CUPTI `MODULE_UNLOAD_STARTING`).
    ModuleUnload(ModuleUnloadRecord),
    /// A kernel launch that executed (was not captured into a graph).
    Launch(LaunchRecord),
    /// A kernel launch recorded into a CUDA graph: by stream capture (`graph.capture_id` set)
    /// or by `cuGraphAddKernelNode`. It runs when a `graph_launch` replays the graph.
    GraphNode(LaunchRecord),
    /// A graph was instantiated into an executable graph.
    GraphExec(GraphExecRecord),
    /// An executable graph was launched (replayed).
    GraphLaunch(GraphLaunchRecord),
    /// A message from the injection library (a warning, an error that disabled tracing).
    Note(NoteRecord),
    /// Last line when the process ended through `exit()` (atexit ran).
    Exit(ExitRecord),
    /// A record type this version of the reader does not know (written by a newer one).
    #[serde(other)]
    Unknown,
}

impl Record {
    /// Sequence number: per process, increasing in the order the events completed
    /// (`process` and unknown records have none).
    pub fn seq(&self) -> Option<u64> {
        match self {
            Record::Process(_) | Record::Unknown => None,
            Record::Module(r) => Some(r.seq),
            Record::ModuleUnload(r) => Some(r.seq),
            Record::Launch(r) | Record::GraphNode(r) => Some(r.seq),
            Record::GraphExec(r) => Some(r.seq),
            Record::GraphLaunch(r) => Some(r.seq),
            Record::Note(r) => Some(r.seq),
            Record::Exit(r) => Some(r.seq),
        }
    }
}

/// `type: "process"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// [`TRACE_VERSION`] of the writer.
    pub version: u32,
    pub pid: u32,
    pub ppid: u32,
    /// Set when this process is a `fork()` child of a traced process that did not `exec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<u32>,
    /// From `/proc/self/cmdline`.
    pub argv: Vec<String>,
    /// Wall clock when the trace file was opened, milliseconds since the Unix epoch.
    pub start_unix_ms: u64,
    /// `cuDriverGetVersion`, e.g. 13000; absent when it could not be queried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<i32>,
    /// Path (or soname) of the CUPTI library in use; absent when none was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_lib: Option<String>,
    /// `cuptiGetVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_version: Option<u32>,
    /// Name and version of the injection library, e.g. `kern-inject 0.1.0`.
    pub injection: String,
}

/// What kind of image a module file holds, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleKind {
    /// ELF device code for one SM.
    Cubin,
    /// A fatbin container.
    Fatbin,
    /// PTX text.
    Ptx,
    /// Anything else (kept byte for byte).
    Other,
}

impl ModuleKind {
    /// File extension used under `modules/`.
    pub fn extension(self) -> &'static str {
        match self {
            ModuleKind::Cubin => "cubin",
            ModuleKind::Fatbin => "fatbin",
            ModuleKind::Ptx => "ptx",
            ModuleKind::Other => "bin",
        }
    }
}

impl fmt::Display for ModuleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.extension())
    }
}

/// `type: "module"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleRecord {
    pub seq: u64,
    /// CUPTI's module id, unique within the process.
    pub module_id: u32,
    /// The context the module was loaded into.
    pub ctx: u64,
    /// OS thread id of the loading thread.
    pub tid: u32,
    /// sha256 of the image, lower-case hex: the file is `modules/<sha256>.<ext>`.
    pub sha256: Arc<str>,
    pub size: u64,
    pub kind: ModuleKind,
    /// Path of the image relative to the dump directory.
    pub path: String,
    /// The traced driver call during which the load happened (with lazy loading usually a
    /// launch), or absent when it happened outside any traced call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_in: Option<Api>,
    /// Number of kernel entry points in the image (0 when it is not a cubin).
    pub kernels: u32,
    /// Whether this process wrote the file (false: an identical image was already there).
    pub new_file: bool,
}

/// `type: "module_unload"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleUnloadRecord {
    pub seq: u64,
    pub module_id: u32,
}

/// The driver API call a record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Api {
    #[serde(rename = "cuLaunchKernel")]
    LaunchKernel,
    #[serde(rename = "cuLaunchKernel_ptsz")]
    LaunchKernelPtsz,
    #[serde(rename = "cuLaunchKernelEx")]
    LaunchKernelEx,
    #[serde(rename = "cuLaunchKernelEx_ptsz")]
    LaunchKernelExPtsz,
    #[serde(rename = "cuLaunchCooperativeKernel")]
    LaunchCooperativeKernel,
    #[serde(rename = "cuLaunchCooperativeKernel_ptsz")]
    LaunchCooperativeKernelPtsz,
    #[serde(rename = "cuGraphAddKernelNode")]
    GraphAddKernelNode,
    #[serde(rename = "cuGraphAddKernelNode_v2")]
    GraphAddKernelNodeV2,
    #[serde(rename = "cuGraphLaunch")]
    GraphLaunch,
    #[serde(rename = "cuGraphLaunch_ptsz")]
    GraphLaunchPtsz,
    #[serde(rename = "cuGraphInstantiate")]
    GraphInstantiate,
    #[serde(rename = "cuGraphInstantiate_v2")]
    GraphInstantiateV2,
    #[serde(rename = "cuGraphInstantiateWithFlags")]
    GraphInstantiateWithFlags,
    #[serde(rename = "cuGraphInstantiateWithParams")]
    GraphInstantiateWithParams,
    #[serde(rename = "cuGraphInstantiateWithParams_ptsz")]
    GraphInstantiateWithParamsPtsz,
    #[serde(rename = "cuModuleLoad")]
    ModuleLoad,
    #[serde(rename = "cuModuleLoadData")]
    ModuleLoadData,
    #[serde(rename = "cuModuleLoadDataEx")]
    ModuleLoadDataEx,
    #[serde(rename = "cuModuleLoadFatBinary")]
    ModuleLoadFatBinary,
    #[serde(rename = "cuModuleGetFunction")]
    ModuleGetFunction,
    #[serde(rename = "cuLibraryLoadData")]
    LibraryLoadData,
    #[serde(rename = "cuLibraryLoadFromFile")]
    LibraryLoadFromFile,
    #[serde(rename = "cuLibraryGetKernel")]
    LibraryGetKernel,
    #[serde(rename = "cuLibraryGetModule")]
    LibraryGetModule,
    #[serde(rename = "cuKernelGetFunction")]
    KernelGetFunction,
    #[serde(rename = "cuFuncGetAttribute")]
    FuncGetAttribute,
    #[serde(rename = "cuFuncSetAttribute")]
    FuncSetAttribute,
    /// The CUPTI resource callback `GRAPHEXEC_CREATED` (an instantiation through a call
    /// that is not traced by name).
    #[serde(rename = "resource")]
    Resource,
    /// A name this reader does not know.
    #[serde(other)]
    Other,
}

impl Api {
    /// The driver function's name as CUPTI reports it.
    pub fn name(self) -> &'static str {
        match self {
            Api::LaunchKernel => "cuLaunchKernel",
            Api::LaunchKernelPtsz => "cuLaunchKernel_ptsz",
            Api::LaunchKernelEx => "cuLaunchKernelEx",
            Api::LaunchKernelExPtsz => "cuLaunchKernelEx_ptsz",
            Api::LaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            Api::LaunchCooperativeKernelPtsz => "cuLaunchCooperativeKernel_ptsz",
            Api::GraphAddKernelNode => "cuGraphAddKernelNode",
            Api::GraphAddKernelNodeV2 => "cuGraphAddKernelNode_v2",
            Api::GraphLaunch => "cuGraphLaunch",
            Api::GraphLaunchPtsz => "cuGraphLaunch_ptsz",
            Api::GraphInstantiate => "cuGraphInstantiate",
            Api::GraphInstantiateV2 => "cuGraphInstantiate_v2",
            Api::GraphInstantiateWithFlags => "cuGraphInstantiateWithFlags",
            Api::GraphInstantiateWithParams => "cuGraphInstantiateWithParams",
            Api::GraphInstantiateWithParamsPtsz => "cuGraphInstantiateWithParams_ptsz",
            Api::ModuleLoad => "cuModuleLoad",
            Api::ModuleLoadData => "cuModuleLoadData",
            Api::ModuleLoadDataEx => "cuModuleLoadDataEx",
            Api::ModuleLoadFatBinary => "cuModuleLoadFatBinary",
            Api::ModuleGetFunction => "cuModuleGetFunction",
            Api::LibraryLoadData => "cuLibraryLoadData",
            Api::LibraryLoadFromFile => "cuLibraryLoadFromFile",
            Api::LibraryGetKernel => "cuLibraryGetKernel",
            Api::LibraryGetModule => "cuLibraryGetModule",
            Api::KernelGetFunction => "cuKernelGetFunction",
            Api::FuncGetAttribute => "cuFuncGetAttribute",
            Api::FuncSetAttribute => "cuFuncSetAttribute",
            Api::Resource => "resource",
            Api::Other => "other",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a launch's module was determined. See TRACE.md, "Attribution".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attribution {
    /// The function's `CUmodule` (`cuFuncGetModule`) is bound to a dumped module: the load
    /// was observed inside a call that returned that handle, or it is the only unbound
    /// module of the context that defines the kernel. Exact.
    FunctionModule,
    /// The `CUmodule` could not be bound, but exactly one dumped image (by sha256) defines a
    /// kernel of this name. The image is right; `module_id` is one load of it.
    SymbolUnique,
    /// Several different dumped images define a kernel of this name and the handle could not
    /// decide: `candidates` lists their sha256, `module_sha256` is null.
    Ambiguous,
    /// No dumped image defines this name (a module loaded before tracing, or a non-ELF one).
    Unknown,
}

impl Attribution {
    pub fn name(self) -> &'static str {
        match self {
            Attribution::FunctionModule => "function_module",
            Attribution::SymbolUnique => "symbol_unique",
            Attribution::Ambiguous => "ambiguous",
            Attribution::Unknown => "unknown",
        }
    }
}

/// Where a launch's parameter bytes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamSource {
    /// `kernelParams[i]`, each copied to its offset from `cuFuncGetParamInfo`.
    KernelParams,
    /// The `CU_LAUNCH_PARAM_BUFFER_POINTER` buffer of `extra`, byte for byte.
    Extra,
    /// The `extra` buffer was larger than [`MAX_PARAM_BYTES`]; the bytes are its prefix.
    ExtraTruncated,
    /// The kernel takes no parameters.
    None,
    /// The bytes could not be recovered (no layout for `kernelParams`, or a malformed
    /// `extra`); `params` is empty.
    Unavailable,
}

/// One parameter's `[offset, size]` in bytes, from `cuFuncGetParamInfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamSlot(pub u32, pub u32);

impl ParamSlot {
    pub fn offset(self) -> u32 {
        self.0
    }
    pub fn size(self) -> u32 {
        self.1
    }
    pub fn end(self) -> u32 {
        self.0.saturating_add(self.1)
    }
}

/// A `cuLaunchKernelEx` launch attribute: its `CUlaunchAttributeID` and the 64 bytes of its
/// value union (e.g. id 4, cluster dimension: three u32 at the start).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchAttr {
    pub id: u32,
    pub value: Hex,
}

/// Which graph a `graph_node` belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GraphRef {
    /// The `CUgraph` being built.
    pub graph: u64,
    /// The stream capture's unique id (`cuStreamGetCaptureInfo`); absent for nodes added
    /// with `cuGraphAddKernelNode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_id: Option<u64>,
    /// The `CUgraphNode`, when known (CUPTI `GRAPHNODE_CREATED` during a captured launch, or
    /// the node returned by `cuGraphAddKernelNode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
}

/// `type: "launch"` and `type: "graph_node"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchRecord {
    pub seq: u64,
    pub api: Api,
    pub tid: u32,
    pub ctx: u64,
    /// The `CUstream` as passed (0 = the default stream of the API variant: legacy, or
    /// per-thread for `_ptsz`).
    pub stream: u64,
    /// Mangled kernel name.
    pub kernel: Arc<str>,
    /// CUPTI module id of the attributed module (one load of `module_sha256`).
    pub module_id: Option<u32>,
    pub module_sha256: Option<Arc<str>>,
    pub attribution: Attribution,
    /// For `ambiguous`: sha256 of every dumped image that defines `kernel`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Arc<str>>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared: u32,
    /// The parameter buffer as the kernel sees it: each parameter at its offset.
    pub params: Hex,
    /// `[offset, size]` of every parameter, or null when `cuFuncGetParamInfo` failed.
    pub param_layout: Option<Arc<[ParamSlot]>>,
    pub params_from: ParamSource,
    /// `cuLaunchKernelEx` launch attributes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attrs: Vec<LaunchAttr>,
    /// For `graph_node`: which graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphRef>,
    /// The call's `CUresult` when it failed (absent = 0 = success).
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub result: i32,
}

/// `type: "graph_exec"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphExecRecord {
    pub seq: u64,
    pub api: Api,
    pub tid: u32,
    pub graph_exec: u64,
    pub graph: u64,
    /// Kernel nodes of `graph` seen so far (captured or added), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_nodes: Option<u32>,
}

/// `type: "graph_launch"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphLaunchRecord {
    pub seq: u64,
    pub api: Api,
    pub tid: u32,
    pub ctx: u64,
    pub stream: u64,
    pub graph_exec: u64,
    /// The graph `graph_exec` was instantiated from, when the instantiation was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<u64>,
    /// Kernel nodes the replay runs, when the graph's construction was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub result: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteLevel {
    Info,
    Warning,
    Error,
}

/// `type: "note"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoteRecord {
    pub seq: u64,
    pub level: NoteLevel,
    pub message: String,
}

/// `type: "exit"`: totals as the injection library counted them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub seq: u64,
    /// How the trace was closed: `atexit`.
    pub how: String,
    pub modules: u64,
    pub launches: u64,
    pub graph_nodes: u64,
    pub graph_launches: u64,
}

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

/// Bytes written as a lower-case hex string.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Hex(pub Vec<u8>);

impl Hex {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Parses lower- or upper-case hex; `None` on odd length or a non-hex character.
    pub fn parse(s: &str) -> Option<Hex> {
        let s = s.as_bytes();
        if !s.len().is_multiple_of(2) {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = Vec::with_capacity(s.len() / 2);
        for pair in s.chunks_exact(2) {
            out.push(nibble(pair[0])? << 4 | nibble(pair[1])?);
        }
        Some(Hex(out))
    }
}

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        // Format through a stack buffer: one `write_str` per 64 bytes instead of per byte.
        let mut chunk = [0u8; 128];
        for bytes in self.0.chunks(64) {
            for (i, b) in bytes.iter().enumerate() {
                chunk[2 * i] = DIGITS[(b >> 4) as usize];
                chunk[2 * i + 1] = DIGITS[(b & 15) as usize];
            }
            // The buffer holds only ASCII hex digits.
            f.write_str(std::str::from_utf8(&chunk[..2 * bytes.len()]).map_err(|_| fmt::Error)?)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hex({self})")
    }
}

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Hex, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Hex::parse(&s).ok_or_else(|| serde::de::Error::custom("params: not a hex string"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let bytes: Vec<u8> = (0..=255).collect();
        let h = Hex(bytes.clone());
        let s = h.to_string();
        assert_eq!(s.len(), 512);
        assert!(s.starts_with("000102"));
        assert_eq!(Hex::parse(&s).unwrap().0, bytes);
        assert_eq!(Hex::parse("ABcd").unwrap().0, vec![0xab, 0xcd]);
        assert!(Hex::parse("abc").is_none());
        assert!(Hex::parse("zz").is_none());
    }

    #[test]
    fn trace_file_names() {
        assert_eq!(trace_file_name(42), "trace.42.jsonl");
        assert_eq!(trace_file_name_n(42, 2), "trace.42.2.jsonl");
        assert!(is_trace_file_name("trace.42.jsonl"));
        assert!(is_trace_file_name("trace.42.2.jsonl"));
        assert!(!is_trace_file_name("trace..jsonl"));
        assert!(!is_trace_file_name("modules"));
    }

    #[test]
    fn unknown_record_type_is_tolerated() {
        let r: Record = serde_json::from_str(r#"{"type":"from_the_future","x":1}"#).unwrap();
        assert_eq!(r, Record::Unknown);
    }

    #[test]
    fn api_names_match_serde() {
        for api in [
            Api::LaunchKernel,
            Api::LaunchKernelExPtsz,
            Api::GraphLaunch,
            Api::Resource,
        ] {
            let json = serde_json::to_string(&api).unwrap();
            assert_eq!(json, format!("\"{}\"", api.name()));
        }
    }
}
