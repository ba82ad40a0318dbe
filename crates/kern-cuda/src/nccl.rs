//! NCCL, loaded at run time like the driver (issue 17: tensor parallelism).
//!
//! The types and constants are cudarc's (`nccl` feature: `ncclUniqueId`, `ncclComm_t`, the
//! data-type and result enums). The functions are resolved here, once, with `libloading`:
//! cudarc's own loader searches `libnccl.so` and `libnccl.so.<CUDA major>` but not NCCL's real
//! soname, `libnccl.so.2` — the only name the `nvidia-nccl-cu1x` wheels (torch's NCCL) ship —
//! and panics when it finds none. [`nccl`] searches `libnccl.so.2` first, checks that every
//! entry point used here is exported, and returns [`CudaError::NoNccl`] /
//! [`CudaError::NcclTooOld`] instead of panicking. Every other function needs its
//! [`NcclInfo`] or a [`Comm`], so no NCCL call can happen before the check passed.
//!
//! One process may drive several local GPUs: [`Comm::init_local`] creates one communicator
//! per local rank inside one NCCL group, and collectives on several local communicators from
//! one thread must be issued inside [`group`] (NCCL would otherwise wait for the other ranks
//! forever). Collectives are stream-ordered, so they are captured into CUDA graphs like
//! kernel launches (NCCL ≥ 2.9 supports stream capture).

use crate::error::{CudaError, Result};
use crate::{Context, Stream};
use cudarc::nccl::sys;
use std::sync::OnceLock;

/// The entry points kern calls. A library missing any of them is [`CudaError::NcclTooOld`].
pub const REQUIRED: &[&str] = &[
    "ncclGetVersion",
    "ncclGetErrorString",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclCommGetAsyncError",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclGroupStart",
    "ncclGroupEnd",
];

/// The message shown when libnccl cannot be loaded.
pub const NO_NCCL_MESSAGE: &str = "NCCL not found (libnccl.so.2 could not be loaded): tensor \
parallelism needs NCCL 2.18 or newer; install it (e.g. `pip install nvidia-nccl-cu13` and add \
its `lib` directory to LD_LIBRARY_PATH, or the distribution's libnccl2 package)";

/// What was learned about NCCL once, at first use.
pub struct NcclInfo {
    /// `ncclGetVersion`, e.g. 22703 for 2.27.3.
    pub version: i32,
    /// The library file that was loaded (its name as searched).
    pub library: String,
    api: Api,
}

impl std::fmt::Debug for NcclInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclInfo {{ version: {}, library: {:?} }}", self.version, self.library)
    }
}

type Comm_ = sys::ncclComm_t;
type Res = sys::ncclResult_t;
type Stream_ = sys::cudaStream_t;
type Buf = *const std::ffi::c_void;
type BufMut = *mut std::ffi::c_void;

/// The entry points, resolved once; the library stays loaded for the process's life.
struct Api {
    _lib: libloading::Library,
    get_version: unsafe extern "C" fn(*mut std::ffi::c_int) -> Res,
    get_error_string: unsafe extern "C" fn(Res) -> *const std::ffi::c_char,
    get_unique_id: unsafe extern "C" fn(*mut sys::ncclUniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm_, std::ffi::c_int, sys::ncclUniqueId, std::ffi::c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm_) -> Res,
    comm_get_async_error: unsafe extern "C" fn(Comm_, *mut Res) -> Res,
    all_reduce: unsafe extern "C" fn(Buf, BufMut, usize, sys::ncclDataType_t, sys::ncclRedOp_t, Comm_, Stream_) -> Res,
    all_gather: unsafe extern "C" fn(Buf, BufMut, usize, sys::ncclDataType_t, Comm_, Stream_) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
}

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

fn api() -> Result<&'static Api> {
    nccl().map(|n| &n.api)
}

impl NcclInfo {
    /// `22703` → `"2.27.3"`.
    pub fn version_string(&self) -> String {
        nccl_version_string(self.version)
    }
}

fn nccl_version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
}

static NCCL: OnceLock<Result<NcclInfo>> = OnceLock::new();

/// Loads NCCL once per process; later calls return the cached outcome.
pub fn nccl() -> Result<&'static NcclInfo> {
    NCCL.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// True when NCCL loads and has every entry point kern uses (never panics).
pub fn nccl_available() -> bool {
    nccl().is_ok()
}

/// The library names searched for libnccl, in order: NCCL's soname first, then cudarc's list.
pub fn nccl_search_list() -> Vec<String> {
    let mut names = vec!["libnccl.so.2".to_string()];
    for n in cudarc::get_lib_name_candidates("nccl") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

fn init() -> Result<NcclInfo> {
    let searched = nccl_search_list();
    // SAFETY: loading a library runs its initializers, which for libnccl is the intended
    // effect; nothing else is assumed about it until its symbols are checked.
    let Some((lib, library)) = searched.iter().find_map(|n| unsafe { libloading::Library::new(n) }.ok().map(|l| (l, n.clone()))) else {
        return Err(CudaError::NoNccl { searched });
    };
    // SAFETY (every `sym!`): the symbol is looked up by its NCCL name and typed with NCCL's C
    // prototype (nccl.h, the same as cudarc's bindings); the pointer is copied out while the
    // library, owned by the returned `Api`, stays loaded for the process.
    macro_rules! sym {
        ($name:literal) => {
            match unsafe { lib.get($name.as_bytes()) } {
                Ok(f) => *f,
                Err(_) => return Err(CudaError::NcclTooOld { call: $name, version: 0 }),
            }
        };
    }
    let api = Api {
        get_version: sym!("ncclGetVersion"),
        get_error_string: sym!("ncclGetErrorString"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_get_async_error: sym!("ncclCommGetAsyncError"),
        all_reduce: sym!("ncclAllReduce"),
        all_gather: sym!("ncclAllGather"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        _lib: lib,
    };
    debug_assert!(REQUIRED.len() == 10);
    let mut version = 0;
    // SAFETY: resolved above; `version` is a valid out-pointer.
    let status = unsafe { (api.get_version)(&mut version) };
    if status != sys::ncclResult_t::ncclSuccess {
        return Err(CudaError::Nccl { call: "ncclGetVersion", code: status as i32, name: format!("{status:?}"), message: String::new() });
    }
    if version < 21800 {
        return Err(CudaError::NcclTooOld { call: "NCCL 2.18 (bf16, stream capture)", version });
    }
    Ok(NcclInfo { version, library, api })
}

fn check(call: &'static str, status: sys::ncclResult_t) -> Result<()> {
    if status == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: NCCL is loaded (a status exists only after a call went through); the returned
    // string is static inside libnccl.
    let message = unsafe {
        let p = match api() {
            Ok(a) => (a.get_error_string)(status),
            Err(_) => std::ptr::null(),
        };
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(CudaError::Nccl { call, code: status as i32, name: format!("{status:?}"), message })
}

/// An element type NCCL moves and reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclType {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
    F8e4m3,
    F8e5m2,
}

impl NcclType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NcclType::I8 | NcclType::U8 | NcclType::F8e4m3 | NcclType::F8e5m2 => 1,
            NcclType::F16 | NcclType::Bf16 => 2,
            NcclType::I32 | NcclType::U32 | NcclType::F32 => 4,
            NcclType::I64 | NcclType::U64 | NcclType::F64 => 8,
        }
    }

    fn raw(self) -> sys::ncclDataType_t {
        use sys::ncclDataType_t as T;
        match self {
            NcclType::I8 => T::ncclInt8,
            NcclType::U8 => T::ncclUint8,
            NcclType::I32 => T::ncclInt32,
            NcclType::U32 => T::ncclUint32,
            NcclType::I64 => T::ncclInt64,
            NcclType::U64 => T::ncclUint64,
            NcclType::F16 => T::ncclFloat16,
            NcclType::F32 => T::ncclFloat32,
            NcclType::F64 => T::ncclFloat64,
            NcclType::Bf16 => T::ncclBfloat16,
            NcclType::F8e4m3 => T::ncclFloat8e4m3,
            NcclType::F8e5m2 => T::ncclFloat8e5m2,
        }
    }
}

/// The 128 bytes every rank of one communicator starts from: made by one rank
/// ([`UniqueId::new`]) and handed to the others (in one process by value; across nodes by the
/// TCP bootstrap, [`crate::bootstrap`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}…)", &self.0[..8])
    }
}

impl UniqueId {
    /// `ncclGetUniqueId`: a fresh id (it names this host's bootstrap socket).
    pub fn new() -> Result<UniqueId> {
        let api = api()?;
        let mut id = sys::ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        // SAFETY: NCCL is loaded with this symbol; `id` is a valid out-pointer.
        check("ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId { internal: self.0.map(|b| b as std::ffi::c_char) }
    }
}

/// One rank's NCCL communicator, on one GPU.
pub struct Comm {
    raw: sys::ncclComm_t,
    ctx: Context,
    rank: u32,
    world: u32,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Comm(rank {} of {}, GPU {})", self.rank, self.world, self.ctx.ordinal())
    }
}

// SAFETY: an ncclComm_t may be used from any thread, one call at a time (`&self` methods
// issue stream-ordered work; NCCL serializes per communicator).
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        if let (Ok(()), Ok(api)) = (self.ctx.bind(), api()) {
            // SAFETY: `raw` came from ncclCommInitRank and is destroyed exactly once.
            unsafe { (api.comm_destroy)(self.raw) };
        }
    }
}

/// Issues the NCCL calls `f` makes as one group (`ncclGroupStart` / `ncclGroupEnd`): needed
/// whenever one thread drives several local ranks.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let api = api()?;
    // SAFETY: NCCL is loaded with these symbols; they take no arguments.
    check("ncclGroupStart", unsafe { (api.group_start)() })?;
    let r = f();
    // SAFETY: as above; ends the group started here, also when `f` failed.
    let end = check("ncclGroupEnd", unsafe { (api.group_end)() });
    let r = r?;
    end?;
    Ok(r)
}

impl Comm {
    /// Rank `rank` of `world`, on `ctx`'s GPU (one process per rank, or one rank of several
    /// created in a [`group`]).
    pub fn init_rank(ctx: &Context, world: u32, rank: u32, id: &UniqueId) -> Result<Comm> {
        let api = api()?;
        if world == 0 || rank >= world {
            return Err(CudaError::invalid(format!("NCCL rank {rank} of a world of {world}: ranks are 0 to world-1")));
        }
        let (w, r) = (i32::try_from(world), i32::try_from(rank));
        let (Ok(w), Ok(r)) = (w, r) else {
            return Err(CudaError::invalid(format!("NCCL world {world} does not fit in an int")));
        };
        ctx.bind()?;
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: NCCL is loaded; `ctx` is current, so NCCL picks its device; `raw` is a valid
        // out-pointer; the id is passed by value as NCCL's API takes it.
        check("ncclCommInitRank", unsafe { (api.comm_init_rank)(&mut raw, w, id.raw(), r) })?;
        Ok(Comm { raw, ctx: ctx.clone(), rank, world })
    }

    /// One communicator per local GPU, `ctxs[i]` being rank `first_rank + i` of `world`, made
    /// in one group (how one process drives all its GPUs; with several nodes each node passes
    /// its own `first_rank`).
    pub fn init_local(ctxs: &[Context], world: u32, first_rank: u32, id: &UniqueId) -> Result<Vec<Comm>> {
        group(|| {
            ctxs.iter()
                .enumerate()
                .map(|(i, c)| Comm::init_rank(c, world, first_rank + i as u32, id))
                .collect()
        })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// An error a collective hit after it was issued (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Result<()> {
        let api = api()?;
        let mut status = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is live; `status` is a valid out-pointer.
        check("ncclCommGetAsyncError", unsafe { (api.comm_get_async_error)(self.raw, &mut status) })?;
        check("a collective (asynchronous error)", status)
    }

    /// The stream must be on this communicator's GPU; binds that GPU's context to the calling
    /// thread (NCCL takes the current device as the communicator's).
    fn same_context(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        if stream.context().ordinal() != self.ctx.ordinal() {
            return Err(CudaError::invalid(format!(
                "rank {}'s communicator is on GPU {}, the stream on GPU {}",
                self.rank,
                self.ctx.ordinal(),
                stream.context().ordinal()
            )));
        }
        Ok(())
    }

    /// In place: the `count` elements at `ptr` become their sum over every rank
    /// (`ncclAllReduce`, `ncclSum`), ordered on `stream` (captured when it is capturing).
    ///
    /// # Safety
    /// `ptr` is device memory of this communicator's GPU holding `count` elements of `ty`,
    /// not freed before the stream has run the collective; every rank issues the same
    /// collectives in the same order.
    pub unsafe fn all_reduce_sum(&self, ptr: u64, count: usize, ty: NcclType, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        let api = api()?;
        let p = ptr as *mut std::ffi::c_void;
        // SAFETY: the caller's contract; the stream handle is the same object NCCL's
        // cudaStream_t names.
        check("ncclAllReduce", unsafe {
            (api.all_reduce)(p, p, count, ty.raw(), sys::ncclRedOp_t::ncclSum, self.raw, stream.as_raw() as sys::cudaStream_t)
        })
    }

    /// `recv` (`send_count × world` elements) becomes every rank's `send_count` elements of
    /// `send`, in rank order (`ncclAllGather`).
    ///
    /// # Safety
    /// As [`Comm::all_reduce_sum`], for `send` (`send_count` elements) and `recv`
    /// (`send_count × world` elements), which do not overlap.
    pub unsafe fn all_gather(&self, send: u64, recv: u64, send_count: usize, ty: NcclType, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        let api = api()?;
        // SAFETY: the caller's contract.
        check("ncclAllGather", unsafe {
            (api.all_gather)(
                send as *const std::ffi::c_void,
                recv as *mut std::ffi::c_void,
                send_count,
                ty.raw(),
                self.raw,
                stream.as_raw() as sys::cudaStream_t,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_sizes() {
        assert_eq!(nccl_version_string(22703), "2.27.3");
        assert_eq!(NcclType::Bf16.size(), 2);
        assert_eq!(NcclType::F8e4m3.size(), 1);
        assert_eq!(NcclType::U64.size(), 8);
        assert_eq!(format!("{:?}", UniqueId([0xab; 128])), "UniqueId([ab, ab, ab, ab, ab, ab, ab, ab]…)");
    }
}
