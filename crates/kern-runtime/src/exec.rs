//! The executor: loads a checked manifest's modules, prepares every launch of a program once
//! (function handle, parameter bytes with every pointer and constant in place) and runs it —
//! eagerly, or captured into a CUDA graph per var bucket and replayed.
//!
//! **Buckets.** A graph bakes in grid sizes and scalar arguments, so it is captured at fixed
//! var values. kern rounds each var up to its bucket — the next power of two, capped at the
//! var's max — captures one graph per distinct bucket tuple, and replays it for every value in
//! the bucket. Running at `v` below its bucket `b`: kernels see `b`, buffers are sized at the
//! max so rows `v..b` stay in bounds, and before each replay the runtime zeroes rows `v..b` of
//! every `input` buffer whose size depends on the var, so padded rows compute on zeros. Rows
//! `v..b` of activations and outputs are padding: they hold whatever padded inputs produce and
//! are never reported (`kern run` writes outputs at the real values). Kernels whose rows
//! interact (attention over a batch) must read real counts from device memory (the step ABI's
//! `query_start` / `seq_lens`), not from the padded var.

use crate::plan::{MemoryPlan, StatePool};
use crate::staging::Staging;
use crate::{Result, RuntimeError};
use kern_cuda::{Context, DeviceBuffer, Event, Function, GraphExec, LaunchConfig, PackedArgs, ParamSlot, Stream};
use kern_manifest::expr::Expr;
use kern_manifest::manifest::{Binding, Manifest, StateSize};
use kern_manifest::pack::ArgValue;
use kern_manifest::raw::Role;
use kern_manifest::types::{OpParam, Scalar, Value};
use std::cell::RefCell;
use std::collections::HashMap;

/// How a program is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Launch by launch; with `sync_each`, synchronize after every launch so a failing
    /// kernel is reported with its call label.
    Eager { sync_each: bool },
    /// Capture once per var bucket, then replay the graph.
    Graph,
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub launches: usize,
    /// GPU time of the run (CUDA events), milliseconds.
    pub gpu_ms: f32,
    /// The var values the kernels saw (the bucket, for a graph run).
    pub vars_used: Vec<i64>,
    /// Whether a graph was captured for this run (false: replayed a cached one).
    pub captured: bool,
}

/// One kernel launch, ready to go: only var-dependent bytes and dimensions change per run.
struct Prepared {
    call: String,
    op: String,
    launch: usize,
    func: Function,
    args: RefCell<PackedArgs>,
    /// The op's argument values; entries named in `var_args` change per run.
    op_args: Vec<ArgValue>,
    /// (op parameter index, var index, the parameter's scalar type)
    var_args: Vec<(usize, usize, Scalar)>,
    launch_decl: kern_manifest::manifest::Launch,
    grid: [Expr; 3],
    block: [Expr; 3],
    shared: Expr,
}

/// A collective call, ready to go (tensor parallelism, issue 17): issued through the rank's
/// NCCL communicator on the runtime's stream.
struct PreparedCollective {
    call: String,
    kind: kern_manifest::Collective,
    /// The bound buffers' addresses, in op parameter order.
    ptrs: Vec<u64>,
    /// The shape of the buffer whose elements count (all-reduce: the buffer; all-gather:
    /// `in`), evaluated per run.
    shape: Vec<Expr>,
    ty: kern_cuda::nccl::NcclType,
}

/// A program prepared for running.
struct Program {
    launches: Vec<Prepared>,
    /// For each call of the program, its launches (a range of `launches`; empty for a
    /// collective).
    call_launches: Vec<std::ops::Range<usize>>,
    /// For each call, its collective when it is one.
    collectives: Vec<Option<PreparedCollective>>,
}

/// A manifest loaded onto a GPU.
pub struct Runtime {
    pub manifest: Manifest,
    pub plan: MemoryPlan,
    ctx: Context,
    stream: Stream,
    // The staging buffers come before the arena: fields drop in order, and each waits for its
    // copies before the memory on either side is freed.
    /// Pinned staging of [`Runtime::upload`].
    upload_staging: Staging,
    /// Pinned staging of [`Runtime::read_into`] (which takes `&self`).
    read_staging: RefCell<Staging>,
    /// CUDA events around the last run queued (start, end), reused from run to run; `None`
    /// until the first run.
    timer: Option<(Event, Event)>,
    /// `timer` holds a complete recording of the last run queued.
    timed: bool,
    arena: DeviceBuffer,
    pools: Vec<Option<DeviceBuffer>>,
    /// Snapshot pools, indexed like the states: `plan.snapshot_slots` copies of a per-sequence
    /// state's slot (None for other states, or without snapshots).
    snapshot_pools: Vec<Option<DeviceBuffer>>,
    programs: Vec<Program>,
    graphs: HashMap<(usize, Vec<i64>), GraphExec>,
    // Modules are referenced by graphs without being held by them: keep them for the
    // runtime's life (functions also hold them).
    _modules: Vec<kern_cuda::Module>,
    /// This rank's NCCL communicator, for a tensor-parallel manifest (`crate::parallel`).
    comm: Option<kern_cuda::nccl::Comm>,
}

impl Runtime {
    /// Allocates the plan's memory, loads every module once, resolves and cross-checks every
    /// entry against the driver's view of its parameters, and prepares every program.
    pub fn new(ctx: &Context, manifest: Manifest, plan: MemoryPlan) -> Result<Runtime> {
        // One GPU runs one rank and no collectives: a tensor-parallel manifest (issue 17) run
        // here would skip its all-reduces and compute garbage silently.
        if manifest.tp() > 1 || manifest.has_collectives() {
            return Err(RuntimeError::Mismatch(format!(
                "{}: the manifest declares tensor parallelism (tp = {}{}); this runtime drives one GPU without NCCL: run it on the tensor-parallel runtime (docs/tensor-parallel.md)",
                manifest.file.display(),
                manifest.tp(),
                if manifest.has_collectives() { ", collective ops" } else { "" }
            )));
        }
        Self::with_comm(ctx, manifest, plan, None)
    }

    /// [`Runtime::new`] for one rank of a tensor-parallel manifest: collectives run through
    /// `comm` (`crate::parallel::ParallelRuntime` makes one per local GPU).
    pub(crate) fn with_comm(ctx: &Context, manifest: Manifest, plan: MemoryPlan, comm: Option<kern_cuda::nccl::Comm>) -> Result<Runtime> {
        let stream = ctx.stream()?;
        let arena = ctx
            .alloc_zeroed(plan.arena_bytes.max(256) as usize)
            .map_err(RuntimeError::cuda(format!("allocating the {} buffer arena", crate::plan::human(plan.arena_bytes))))?;
        let mut pools = Vec::new();
        for (s, p) in manifest.states.iter().zip(&plan.states) {
            pools.push(if p.bytes() == 0 {
                None
            } else {
                Some(ctx.alloc_zeroed(p.bytes() as usize).map_err(RuntimeError::cuda(format!("allocating state pool `{}` ({})", s.name, crate::plan::human(p.bytes()))))?)
            });
        }
        let mut snapshot_pools = Vec::new();
        for s in &manifest.states {
            let bytes = s.snapshot_bytes().filter(|_| plan.snapshot_slots > 0).map(|b| b * plan.snapshot_slots);
            snapshot_pools.push(match bytes {
                Some(n) => Some(ctx.alloc(n as usize).map_err(RuntimeError::cuda(format!("allocating {} snapshot slots of state `{}` ({})", plan.snapshot_slots, s.name, crate::plan::human(n))))?),
                None => None,
            });
        }
        let mut modules = Vec::new();
        for m in &manifest.modules {
            let im = m.image();
            let module = ctx
                .load_module(&im.data)
                .map_err(RuntimeError::cuda(format!("loading module `{}` ({}, image {} for {})", m.name, m.path.display(), m.image, manifest.arch)))?;
            modules.push(module);
        }
        let mut rt = Runtime {
            manifest,
            plan,
            ctx: ctx.clone(),
            stream,
            upload_staging: Staging::default(),
            read_staging: RefCell::new(Staging::default()),
            timer: None,
            timed: false,
            arena,
            pools,
            snapshot_pools,
            programs: Vec::new(),
            graphs: HashMap::new(),
            _modules: modules,
            comm,
        };
        let mut funcs: HashMap<(usize, String), Function> = HashMap::new();
        for p in 0..rt.manifest.programs.len() {
            let prog = rt.prepare(p, &mut funcs)?;
            rt.programs.push(prog);
        }
        Ok(rt)
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// This rank's NCCL communicator (tensor-parallel runtimes only).
    pub(crate) fn comm(&self) -> Option<&kern_cuda::nccl::Comm> {
        self.comm.as_ref()
    }
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Device address of a buffer (an alias resolves to its target).
    pub fn buffer_ptr(&self, b: kern_manifest::manifest::BufferId) -> u64 {
        self.arena.ptr() + self.plan.buffers[b.0].offset
    }

    /// Device address of a state pool (0 when the plan gave it no memory).
    pub fn state_ptr(&self, s: kern_manifest::manifest::StateId) -> u64 {
        self.pools[s.0].as_ref().map_or(0, |b| b.ptr())
    }

    fn prepare(&self, p: usize, funcs: &mut HashMap<(usize, String), Function>) -> Result<Program> {
        let m = &self.manifest;
        let program = &m.programs[p];
        let mut launches = Vec::new();
        let mut call_launches = Vec::with_capacity(program.calls.len());
        let mut collectives = Vec::with_capacity(program.calls.len());
        let max_vars = m.vars_at_max();
        for call in &program.calls {
            let op = &m.ops[call.op.0];
            let first = launches.len();
            if let Some(kind) = op.collective {
                collectives.push(Some(self.prepare_collective(call, kind)?));
                call_launches.push(first..first);
                continue;
            }
            collectives.push(None);
            for (li, l) in op.launches.iter().enumerate() {
                let key = (l.module.0, l.entry.clone());
                let func = match funcs.get(&key) {
                    Some(f) => f.clone(),
                    None => {
                        let f = self._modules[l.module.0]
                            .function(&l.entry)
                            .map_err(RuntimeError::cuda(format!("ops.{}.impl.launches[{li}]: entry `{}` in module `{}`", op.name, l.entry, m.modules[l.module.0].name)))?;
                        self.cross_check(&f, l, &op.name, li)?;
                        funcs.insert(key, f.clone());
                        f
                    }
                };
                // Dynamic shared memory above the default 48 KiB needs the function attribute,
                // set once at the largest value any run can ask for.
                let shared_max = l.shared.eval(&max_vars).unwrap_or(0);
                if shared_max > 48 * 1024 {
                    func.set_max_dynamic_shared(shared_max as u32)
                        .map_err(RuntimeError::cuda(format!("ops.{}.impl.launches[{li}]: raising dynamic shared memory to {shared_max} bytes", op.name)))?;
                }
                let layout: Vec<ParamSlot> = l.params.iter().map(|lp| ParamSlot { offset: lp.offset as usize, size: lp.size as usize }).collect();
                let mut args = PackedArgs::new(&layout)?;
                // What the call passes for each op parameter; vars are filled in per run.
                let mut op_args = Vec::with_capacity(call.args.len());
                let mut var_args = Vec::new();
                for (j, b) in call.args.iter().enumerate() {
                    op_args.push(match b {
                        Binding::Buf(id) => ArgValue::Ptr(self.buffer_ptr(*id)),
                        Binding::State(id) => ArgValue::Ptr(self.state_ptr(*id)),
                        Binding::Null => ArgValue::Ptr(0),
                        Binding::Const(v) => ArgValue::Scalar(*v),
                        Binding::Var(v) => {
                            let OpParam::Scalar(s) = op.params[j] else {
                                return Err(RuntimeError::Mismatch(format!("call `{}`: var `{}` is bound to op parameter {j}, which is not a scalar", call.label, m.vars[v.0].name)));
                            };
                            var_args.push((j, v.0, s));
                            ArgValue::Scalar(scalar_of(s, max_vars[v.0]).unwrap_or(Value::I64(0)))
                        }
                    });
                }
                let packed = l.pack(&op_args).map_err(|e| RuntimeError::Mismatch(format!("call `{}`, launch {li}: {e}", call.label)))?;
                for (i, slot) in layout.iter().enumerate() {
                    args.set(i, &packed[slot.offset..slot.offset + slot.size])?;
                }
                launches.push(Prepared {
                    call: call.label.clone(),
                    op: op.name.clone(),
                    launch: li,
                    func,
                    args: RefCell::new(args),
                    op_args,
                    var_args,
                    launch_decl: l.clone(),
                    grid: l.grid.clone(),
                    block: l.block.clone(),
                    shared: l.shared.clone(),
                });
            }
            call_launches.push(first..launches.len());
        }
        Ok(Program { launches, call_launches, collectives })
    }

    fn prepare_collective(&self, call: &kern_manifest::manifest::Call, kind: kern_manifest::Collective) -> Result<PreparedCollective> {
        let m = &self.manifest;
        let mut ptrs = vec![];
        let mut bufs = vec![];
        for b in &call.args {
            let Binding::Buf(id) = b else {
                return Err(RuntimeError::Mismatch(format!("call `{}`: a collective binds buffers only", call.label)));
            };
            ptrs.push(self.buffer_ptr(*id));
            bufs.push(*id);
        }
        // all_reduce_sum: the one buffer; all_gather: `in` (params[1]) counts.
        let counted = match kind {
            kern_manifest::Collective::AllReduceSum => bufs.first(),
            kern_manifest::Collective::AllGather => bufs.get(1),
        }
        .copied()
        .ok_or_else(|| RuntimeError::Mismatch(format!("call `{}`: {} needs its buffers", call.label, kind.name())))?;
        let b = &m.buffers[counted.0];
        let ty = nccl_type(b.dtype).ok_or_else(|| RuntimeError::Mismatch(format!("call `{}`: NCCL has no {} type", call.label, b.dtype)))?;
        Ok(PreparedCollective { call: call.label.clone(), kind, ptrs, shape: b.shape.clone(), ty })
    }

    /// Queues one collective at `vars` on the stream (captured when the stream captures).
    fn enqueue_collective(&self, c: &PreparedCollective, vars: &[i64], sync_each: bool) -> Result<()> {
        let comm = self.comm.as_ref().ok_or_else(|| {
            RuntimeError::Mismatch(format!("call `{}` is a collective ({}): this runtime has no NCCL communicator (run the manifest on the tensor-parallel runtime)", c.call, c.kind.name()))
        })?;
        let mut count: u64 = 1;
        for e in &c.shape {
            let d = e.eval(vars).map_err(|err| RuntimeError::Var(format!("call `{}`: {err}", c.call)))?;
            count = count.saturating_mul(d.max(0) as u64);
        }
        if count == 0 {
            return Ok(());
        }
        let what = || format!("call `{}` ({} of {count} elements, rank {} of {})", c.call, c.kind.name(), comm.rank(), comm.world());
        // SAFETY: the pointers are buffers of this runtime's arena (on the communicator's GPU,
        // sized at the vars' max, so `count` elements at `vars` are in bounds; an all-gather's
        // `out` holds `tp` × `in`, checked by `kern check`); every rank runs the same program,
        // so the same collectives in the same order.
        unsafe {
            match c.kind {
                kern_manifest::Collective::AllReduceSum => comm.all_reduce_sum(c.ptrs[0], count as usize, c.ty, &self.stream),
                kern_manifest::Collective::AllGather => comm.all_gather(c.ptrs[1], c.ptrs[0], count as usize, c.ty, &self.stream),
            }
        }
        .map_err(|e| RuntimeError::CudaAt { what: what(), cause: Box::new(e) })?;
        if sync_each {
            self.stream.synchronize().map_err(|e| RuntimeError::CudaAt { what: what(), cause: Box::new(e) })?;
        }
        Ok(())
    }

    /// Queues calls `calls` of program `p`: kernel launches, and collectives where the
    /// program has them (a program without collectives is one run of launches, as before).
    fn enqueue_calls(&self, p: usize, vars: &[i64], calls: std::ops::Range<usize>, sync_each: bool) -> Result<()> {
        let r = self.call_range(p, &calls)?;
        let prog = &self.programs[p];
        if prog.collectives.iter().all(Option::is_none) {
            return self.enqueue_launches(p, vars, r, sync_each);
        }
        for c in calls {
            match &prog.collectives[c] {
                Some(coll) => self.enqueue_collective(coll, vars, sync_each)?,
                None => self.enqueue_launches(p, vars, prog.call_launches[c].clone(), sync_each)?,
            }
        }
        Ok(())
    }

    /// The driver's layout of `f` must be the manifest's (which `kern check` matched with the
    /// image's KPARAM_INFO): a disagreement means the image was not what we read.
    fn cross_check(&self, f: &Function, l: &kern_manifest::manifest::Launch, op: &str, li: usize) -> Result<()> {
        let drv = match f.param_layout() {
            Ok(d) => d,
            // Drivers before 12.4 cannot report layouts; KPARAM_INFO was checked already.
            Err(kern_cuda::CudaError::DriverTooOld { .. }) => return Ok(()),
            Err(e) => return Err(RuntimeError::CudaAt { what: format!("ops.{op}.impl.launches[{li}]: reading the parameter layout of `{}`", l.entry), cause: Box::new(e) }),
        };
        let ours: Vec<(usize, usize)> = l.params.iter().map(|p| (p.offset as usize, p.size as usize)).collect();
        let theirs: Vec<(usize, usize)> = drv.iter().map(|s| (s.offset, s.size)).collect();
        if ours != theirs {
            return Err(RuntimeError::Mismatch(format!(
                "ops.{op}.impl.launches[{li}]: the driver lays out `{}` as {theirs:?} (offset, size), the manifest as {ours:?}",
                l.entry
            )));
        }
        Ok(())
    }

    /// Checks var values: one per var, each in 1..=max.
    pub fn check_vars(&self, vars: &[i64]) -> Result<()> {
        if vars.len() != self.manifest.vars.len() {
            return Err(RuntimeError::Var(format!("expected {} var values, got {}", self.manifest.vars.len(), vars.len())));
        }
        for (v, &x) in self.manifest.vars.iter().zip(vars) {
            if x < 1 || x > v.max {
                return Err(RuntimeError::Var(format!("var `{}` = {x} is outside 1..={} (its declared max)", v.name, v.max)));
            }
        }
        Ok(())
    }

    /// The bucket each var value runs in under [`Mode::Graph`].
    pub fn bucket(&self, vars: &[i64]) -> Vec<i64> {
        self.manifest.vars.iter().zip(vars).map(|(v, &x)| bucket(x, v.max)).collect()
    }

    /// Runs program `p` once at `vars` and waits for it: a failing kernel is reported here, and
    /// `gpu_ms` is measured.
    pub fn run(&mut self, p: usize, vars: &[i64], mode: Mode) -> Result<RunStats> {
        let mut stats = self.enqueue_run(p, vars, mode)?;
        self.stream.synchronize().map_err(|e| self.fault_unknown(e))?;
        stats.gpu_ms = self.last_gpu_ms()?.unwrap_or(0.0);
        Ok(stats)
    }

    /// Queues one run of program `p` at `vars` on the runtime's stream and returns without
    /// waiting for it (issue 15): for a caller that reads a result right after
    /// ([`Runtime::read_into`] synchronizes the stream), so the host waits once per step,
    /// not twice. The returned `gpu_ms` is 0: the run's GPU time, measured with CUDA events
    /// as in [`Runtime::run`], is [`Runtime::last_gpu_ms`] once it has finished. A kernel
    /// that fails is reported by the next call that waits for the stream (`read_into`,
    /// `last_gpu_ms`, `run`), without its call label. With `Mode::Eager { sync_each: true }`
    /// each launch is still waited for.
    ///
    /// Ordering needs no host wait: uploads, zeroed padding, the launches or the graph replay,
    /// and a later readback are all queued on the same stream.
    pub fn enqueue_run(&mut self, p: usize, vars: &[i64], mode: Mode) -> Result<RunStats> {
        self.check_vars(vars)?;
        self.timed = false;
        // The events are reused from run to run (re-recording one moves it to this run); on an
        // error they are dropped and made again next time.
        let (start, end) = match self.timer.take() {
            Some(t) => t,
            None => (self.ctx.event()?, self.ctx.event()?),
        };
        let mut stats = RunStats { launches: self.programs[p].launches.len(), ..Default::default() };
        match mode {
            Mode::Eager { sync_each } => {
                start.record(&self.stream)?;
                self.enqueue(p, vars, sync_each)?;
                end.record(&self.stream)?;
                stats.vars_used = vars.to_vec();
            }
            Mode::Graph => {
                let b = self.bucket(vars);
                let key = (p, b.clone());
                if !self.graphs.contains_key(&key) {
                    // Capture at the bucket values. Work queued during capture is recorded,
                    // not executed.
                    let graph = {
                        let this = &*self;
                        this.stream.capture(|_| this.enqueue(p, &b, false).map_err(to_cuda))
                    }
                    .map_err(|e| RuntimeError::CudaAt { what: format!("capturing program `{}` into a CUDA graph at {:?}", self.manifest.programs[p].name, b), cause: Box::new(e) })?;
                    let exec = graph.instantiate()?;
                    self.graphs.insert(key.clone(), exec);
                    stats.captured = true;
                }
                self.zero_padding(vars, &b)?;
                start.record(&self.stream)?;
                // SAFETY: the graph's kernels use the arena and pools, which live as long as
                // `self`, and the modules, which `self._modules` keeps loaded.
                unsafe { self.graphs[&key].launch(&self.stream) }.map_err(|e| self.fault_unknown(e))?;
                end.record(&self.stream)?;
                stats.vars_used = b;
            }
        }
        self.timer = Some((start, end));
        self.timed = true;
        Ok(stats)
    }

    /// GPU time in milliseconds of the last run queued by [`Runtime::enqueue_run`] or
    /// [`Runtime::run`] (CUDA events around its launches or graph replay), waiting for it to
    /// finish when it has not yet (free after [`Runtime::read_into`], which has waited).
    /// `None` before the first run and after a run that failed to queue.
    pub fn last_gpu_ms(&self) -> Result<Option<f32>> {
        let Some((start, end)) = self.timer.as_ref().filter(|_| self.timed) else { return Ok(None) };
        end.synchronize().map_err(|e| self.fault_unknown(e))?;
        Ok(Some(Event::elapsed_ms(start, end)?))
    }

    fn fault_unknown(&self, e: kern_cuda::CudaError) -> RuntimeError {
        if e.is_sticky() {
            RuntimeError::CudaAt {
                what: "a kernel of the program failed (run with --sync-each to find which call); the GPU context is unusable now".into(),
                cause: Box::new(e),
            }
        } else {
            RuntimeError::Cuda(e)
        }
    }

    /// Zeroes rows `real..bucket` of every input buffer whose size depends on the vars.
    fn zero_padding(&self, real: &[i64], bucket: &[i64]) -> Result<()> {
        if real == bucket {
            return Ok(());
        }
        let m = &self.manifest;
        for (i, b) in m.buffers.iter().enumerate() {
            if b.role != Role::Input || !b.shape.iter().any(Expr::uses_vars) {
                continue;
            }
            let id = kern_manifest::manifest::BufferId(i);
            let size = |vars: &[i64]| -> Result<u64> {
                let shape = m.shape(id, vars).map_err(|e| RuntimeError::Var(format!("buffers.{}: {e}", b.name)))?;
                Ok(shape.iter().map(|&d| d.max(0) as u64).product::<u64>() * b.dtype.size())
            };
            let (lo, hi) = (size(real)?, size(bucket)?);
            if hi > lo {
                let slot = &self.plan.buffers[i];
                self.arena.memset_u8_async((slot.offset + lo) as usize, (hi - lo) as usize, 0, &self.stream)?;
            }
        }
        Ok(())
    }

    /// Queues every launch of program `p` at `vars` on the stream.
    fn enqueue(&self, p: usize, vars: &[i64], sync_each: bool) -> Result<()> {
        self.enqueue_calls(p, vars, 0..self.programs[p].call_launches.len(), sync_each)
    }

    /// Queues launches `range` of program `p` at `vars` on the stream.
    fn enqueue_launches(&self, p: usize, vars: &[i64], range: std::ops::Range<usize>, sync_each: bool) -> Result<()> {
        let prog = &self.programs[p];
        for l in &prog.launches[range] {
            // The parameter bytes are patched in place: the driver copies them at launch, so
            // reusing one buffer across runs (and graph captures) is safe.
            let mut args = l.args.borrow_mut();
            if !l.var_args.is_empty() {
                let mut op_args = l.op_args.clone();
                for &(j, var, s) in &l.var_args {
                    op_args[j] = ArgValue::Scalar(scalar_of(s, vars[var]).ok_or_else(|| {
                        RuntimeError::Var(format!("var `{}` = {} does not fit the {} parameter of call `{}`", self.manifest.vars[var].name, vars[var], s.name(), l.call))
                    })?);
                }
                let packed = l.launch_decl.pack(&op_args).map_err(|e| RuntimeError::Mismatch(format!("call `{}`: {e}", l.call)))?;
                let n = packed.len().min(args.bytes().len());
                args.bytes_mut()[..n].copy_from_slice(&packed[..n]);
            }
            // A grid dimension of 0 or less means "nothing to do": the launch is skipped
            // (docs/manifest.md). Block dimensions must be positive.
            let dims = |e: &[Expr; 3], what: &str| -> Result<Option<[u32; 3]>> {
                let mut out = [1u32; 3];
                for (k, x) in e.iter().enumerate() {
                    let v = x.eval(vars).map_err(|err| RuntimeError::Var(format!("call `{}`: {what}[{k}] = `{x}`: {err}", l.call)))?;
                    if v <= 0 && what == "grid" {
                        return Ok(None);
                    }
                    out[k] = u32::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| RuntimeError::Var(format!("call `{}`: {what}[{k}] = `{x}` evaluates to {v}, outside 1..=2^32-1", l.call)))?;
                }
                Ok(Some(out))
            };
            let Some(grid) = dims(&l.grid, "grid")? else { continue };
            let block = dims(&l.block, "block")?.unwrap_or([1; 3]);
            let shared = l.shared.eval(vars).map_err(|e| RuntimeError::Var(format!("call `{}`: shared: {e}", l.call)))?;
            let shared = u32::try_from(shared).map_err(|_| RuntimeError::Var(format!("call `{}`: shared memory {shared} is out of range", l.call)))?;
            let cfg = LaunchConfig::new(grid, block, shared).with_pdl(l.launch_decl.pdl);
            let fault = |e| RuntimeError::KernelFault { label: l.call.clone(), op: l.op.clone(), launch: l.launch, kernel: l.func.name().to_string(), cause: Box::new(e) };
            // SAFETY: every pointer in `args` is an address inside the arena or a state pool,
            // which are sized at the vars' max (checked) and outlive the launch; the kernel's
            // parameter layout was matched with the image and the driver at preparation.
            unsafe { l.func.launch_packed(cfg, &self.stream, &mut args) }.map_err(fault)?;
            if sync_each {
                self.stream.synchronize().map_err(fault)?;
            }
        }
        Ok(())
    }

    /// Copies host bytes into buffer `b` (at most its size at the vars' max). Blocking: waits
    /// for all work queued in the context first (setup, tests; a step uses [`Runtime::upload`]).
    pub fn write_buffer(&self, b: kern_manifest::manifest::BufferId, bytes: &[u8]) -> Result<()> {
        let slot = check_write(&self.manifest, &self.plan, b, bytes.len())?;
        self.arena.copy_from_host(slot.offset as usize, bytes)?;
        Ok(())
    }

    /// Copies each `(buffer, bytes)` of `writes` into its buffer without blocking the host
    /// (issue 15): the bytes are packed into one page-locked staging buffer owned by the
    /// runtime (allocated on first use, grown when a step needs more), then one asynchronous
    /// copy per write is queued on the runtime's stream, so they land before the next run
    /// queued on it (eager or graph replay) and after everything queued before. Sizes are
    /// checked as [`Runtime::write_buffer`] checks them, all before anything is copied; an
    /// empty write copies nothing, and a buffer written twice gets the later bytes.
    ///
    /// **Staging reuse.** Before refilling the staging buffer this waits for an event recorded
    /// after the previous upload's copies, so bytes still in flight are never overwritten.
    /// That wait is free in a step loop (the previous step's readback has synchronized the
    /// stream), and it never waits for the run queued after the previous upload: the event
    /// precedes that run on the stream.
    pub fn upload(&mut self, writes: &[(kern_manifest::manifest::BufferId, &[u8])]) -> Result<()> {
        let mut dsts = Vec::with_capacity(writes.len());
        for &(b, bytes) in writes {
            dsts.push(check_write(&self.manifest, &self.plan, b, bytes.len())?.offset as usize);
        }
        let sizes: Vec<usize> = writes.iter().map(|w| w.1.len()).collect();
        let (offsets, total) = crate::staging::pack(&sizes).ok_or_else(|| RuntimeError::Data(format!("an upload of {} writes overflows the address space", writes.len())))?;
        if total == 0 {
            return Ok(());
        }
        let staging = self.upload_staging.acquire(&self.ctx, total)?;
        let host = staging.as_mut_slice();
        for (&(_, bytes), &at) in writes.iter().zip(&offsets) {
            host[at..at + bytes.len()].copy_from_slice(bytes);
        }
        let staging = &*staging;
        let copies = writes.iter().zip(offsets.iter().zip(&dsts)).try_for_each(|(&(_, bytes), (&at, &dst))| {
            // SAFETY: the staging buffer is written again only after `acquire` has waited for
            // the event `queued` records below, after these copies; it is freed only after
            // that wait too (`Staging`'s Drop).
            unsafe { self.arena.copy_from_pinned_async(dst, staging, at, bytes.len(), &self.stream) }.map_err(RuntimeError::from)
        });
        self.upload_staging.queued(&self.stream, copies)
    }

    /// Reads the first `dst.len()` bytes of buffer `b` into `dst` once everything queued on the
    /// runtime's stream has run (issue 15): one asynchronous copy into page-locked staging, one
    /// stream synchronize, one host copy. After [`Runtime::enqueue_run`] this is the step's one
    /// wait; a kernel of the run that failed is reported here. `dst` may not be longer than the
    /// buffer's slot.
    pub fn read_into(&self, b: kern_manifest::manifest::BufferId, dst: &mut [u8]) -> Result<()> {
        let slot = check_read(&self.manifest, &self.plan, b, dst.len())?;
        let mut staging = self.read_staging.borrow_mut();
        let host = staging.acquire(&self.ctx, dst.len())?;
        // SAFETY: the staging buffer is not touched until the stream synchronize below has
        // waited for the copy (or failed: then the context is unusable and nothing runs); it
        // is freed only after `Staging::wait`.
        unsafe { self.arena.copy_to_pinned_async(slot.offset as usize, host, 0, dst.len(), &self.stream) }?;
        self.stream.synchronize().map_err(|e| self.fault_unknown(e))?;
        dst.copy_from_slice(&host.as_slice()[..dst.len()]);
        Ok(())
    }

    /// Reads the first `len` bytes of buffer `b`.
    pub fn read_buffer(&self, b: kern_manifest::manifest::BufferId, len: usize) -> Result<Vec<u8>> {
        let slot = &self.plan.buffers[b.0];
        let len = len.min(slot.bytes as usize);
        let mut out = vec![0u8; len];
        self.arena.copy_to_host(slot.offset as usize, &mut out)?;
        Ok(out)
    }

    /// Streams every weight of the manifest from a checkpoint into the arena (aliases share
    /// their target's memory and are not loaded). `progress(done, total)` in bytes.
    pub fn load_weights(&self, ckpt: &kern_weights::Checkpoint, progress: impl FnMut(u64, u64)) -> Result<u64> {
        self.load_weights_for_rank(ckpt, 0, progress)
    }

    /// [`Runtime::load_weights`] for tensor-parallel rank `rank`: shard sources take that
    /// rank's slice (`load_weights` is rank 0).
    pub fn load_weights_for_rank(&self, ckpt: &kern_weights::Checkpoint, rank: u32, mut progress: impl FnMut(u64, u64)) -> Result<u64> {
        let plan = kern_weights::LoadPlan::for_rank(ckpt, &self.manifest.buffers, rank).map_err(|e| RuntimeError::Data(e.to_string()))?;
        let total = plan.total_bytes();
        plan.stream(
            |c: kern_weights::Chunk<'_>| -> Result<()> {
                let slot = &self.plan.buffers[c.buffer.0];
                self.arena.copy_from_host((slot.offset + c.offset) as usize, c.bytes)?;
                Ok(())
            },
            |p| progress(p.done, p.total),
        )?;
        Ok(total)
    }

    /// Number of launches in one run of program `p`.
    pub fn launches(&self, p: usize) -> usize {
        self.programs[p].launches.len()
    }

    /// Describes the state pools as allocated (for reports).
    pub fn pools(&self) -> impl Iterator<Item = (&str, &StatePool, &StateSize)> {
        self.manifest.states.iter().zip(&self.plan.states).map(|(s, p)| (s.name.as_str(), p, &s.size))
    }
}

/// Running and inspecting parts of a program (for `kern test`: interval by interval, with
/// buffers copied between two runtimes of the same context, and timed with CUDA events).
impl Runtime {
    /// The launches of calls `calls` of program `p`, checked against the program.
    fn call_range(&self, p: usize, calls: &std::ops::Range<usize>) -> Result<std::ops::Range<usize>> {
        let cl = &self.programs[p].call_launches;
        if calls.start > calls.end || calls.end > cl.len() {
            return Err(RuntimeError::Var(format!("calls {}..{} are outside program `{}` ({} calls)", calls.start, calls.end, self.manifest.programs[p].name, cl.len())));
        }
        if calls.is_empty() {
            return Ok(0..0);
        }
        Ok(cl[calls.start].start..cl[calls.end - 1].end)
    }

    /// Runs calls `calls` (indices into the program's calls) of program `p` eagerly at `vars`
    /// and waits for them. With `sync_each`, a failing kernel is reported with its call label.
    pub fn run_calls(&self, p: usize, vars: &[i64], calls: std::ops::Range<usize>, sync_each: bool) -> Result<()> {
        self.check_vars(vars)?;
        self.enqueue_calls(p, vars, calls, sync_each)?;
        self.stream.synchronize().map_err(|e| self.fault_unknown(e))
    }

    /// GPU time in milliseconds of calls `calls` of program `p` run eagerly at `vars`, measured
    /// with CUDA events around them. When `flush` is given, its bytes are overwritten on the
    /// same stream first (outside the measured range), so the calls start with a cold L2.
    pub fn time_calls(&self, p: usize, vars: &[i64], calls: std::ops::Range<usize>, flush: Option<&DeviceBuffer>) -> Result<f32> {
        self.check_vars(vars)?;
        self.call_range(p, &calls)?;
        let (start, end) = (self.ctx.event()?, self.ctx.event()?);
        if let Some(f) = flush {
            f.memset_u8_async(0, f.len(), 0x5a, &self.stream)?;
        }
        start.record(&self.stream)?;
        self.enqueue_calls(p, vars, calls, false)?;
        end.record(&self.stream)?;
        self.stream.synchronize().map_err(|e| self.fault_unknown(e))?;
        Ok(Event::elapsed_ms(&start, &end)?)
    }

    /// Copies buffer `src` of `other` (a runtime of the same context) into buffer `dst` of this
    /// one: the smaller of the two slots' bytes.
    pub fn copy_buffer_from(&self, dst: kern_manifest::manifest::BufferId, other: &Runtime, src: kern_manifest::manifest::BufferId) -> Result<()> {
        let (d, s) = (&self.plan.buffers[dst.0], &other.plan.buffers[src.0]);
        let len = d.bytes.min(s.bytes) as usize;
        self.arena.copy_from_device(d.offset as usize, &other.arena, s.offset as usize, len)?;
        Ok(())
    }

    /// Sets every byte of buffer `b` (its whole slot) to `value`.
    pub fn fill_buffer(&self, b: kern_manifest::manifest::BufferId, value: u8) -> Result<()> {
        let slot = &self.plan.buffers[b.0];
        self.arena.memset_u8(slot.offset as usize, slot.bytes as usize, value)?;
        Ok(())
    }

    /// Copies state pool `src` of `other` (same context) into pool `dst` of this runtime. The
    /// pools must have the same size.
    pub fn copy_state_from(&self, dst: kern_manifest::manifest::StateId, other: &Runtime, src: kern_manifest::manifest::StateId) -> Result<()> {
        match (&self.pools[dst.0], &other.pools[src.0]) {
            (None, None) => Ok(()),
            (Some(d), Some(s)) if d.len() == s.len() => Ok(d.copy_from_device(0, s, 0, s.len())?),
            (d, s) => Err(RuntimeError::Mismatch(format!(
                "state `{}` ({} bytes) cannot take state `{}` ({} bytes): the pools differ in size",
                self.manifest.states[dst.0].name,
                d.as_ref().map_or(0, |b| b.len()),
                other.manifest.states[src.0].name,
                s.as_ref().map_or(0, |b| b.len())
            ))),
        }
    }

    /// Snapshot slots of the per-sequence states (the memory plan's; 0: none).
    pub fn snapshot_slots(&self) -> u64 {
        self.plan.snapshot_slots
    }

    /// Queues, on the runtime's stream, copies of per-sequence slots into snapshot slots,
    /// `(sequence slot, snapshot slot)`, for every per-sequence state: queued after a step's
    /// run, they copy what the step left in the slots. Slots out of range are errors.
    pub fn save_snapshots(&self, pairs: &[(u32, u32)]) -> Result<()> {
        self.copy_snapshots(pairs, true)
    }

    /// Queues, on the runtime's stream, copies of snapshot slots into per-sequence slots,
    /// `(snapshot slot, sequence slot)`: queued before a step's run, the step starts from them.
    pub fn restore_snapshots(&self, pairs: &[(u32, u32)]) -> Result<()> {
        self.copy_snapshots(pairs, false)
    }

    fn copy_snapshots(&self, pairs: &[(u32, u32)], save: bool) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        if self.plan.snapshot_slots == 0 {
            return Err(RuntimeError::Mismatch("the memory plan has no snapshot slots (no per-sequence state declares `snapshot`, or none were asked for)".into()));
        }
        for (i, s) in self.manifest.states.iter().enumerate() {
            let (Some(bytes), Some(snaps)) = (s.snapshot_bytes(), &self.snapshot_pools[i]) else { continue };
            let Some(pool) = &self.pools[i] else { continue };
            let b = bytes as usize;
            for &(a, z) in pairs {
                // The buffers check both ranges against their allocations.
                if save {
                    snaps.copy_from_device_async(z as usize * b, pool, a as usize * b, b, &self.stream)
                } else {
                    pool.copy_from_device_async(z as usize * b, snaps, a as usize * b, b, &self.stream)
                }
                .map_err(RuntimeError::cuda(format!("{} snapshot of state `{}` ({} slot {a} → slot {z})", if save { "saving a" } else { "restoring a" }, s.name, if save { "sequence" } else { "snapshot" })))?;
            }
        }
        Ok(())
    }

    /// A device copy of state pool `s` (None when the pool has no memory).
    pub fn snapshot_state(&self, s: kern_manifest::manifest::StateId) -> Result<Option<DeviceBuffer>> {
        let Some(pool) = &self.pools[s.0] else { return Ok(None) };
        let copy = self.ctx.alloc(pool.len())?;
        copy.copy_from_device(0, pool, 0, pool.len())?;
        Ok(Some(copy))
    }

    /// Puts back a pool taken by [`Runtime::snapshot_state`].
    pub fn restore_state(&self, s: kern_manifest::manifest::StateId, snap: &DeviceBuffer) -> Result<()> {
        match &self.pools[s.0] {
            Some(pool) if pool.len() == snap.len() => Ok(pool.copy_from_device(0, snap, 0, snap.len())?),
            _ => Err(RuntimeError::Mismatch(format!("state `{}`: the snapshot does not fit the pool", self.manifest.states[s.0].name))),
        }
    }
}

/// The slot of buffer `b` when `len` bytes fit in it (what [`Runtime::write_buffer`] and
/// [`Runtime::upload`] check).
pub(crate) fn check_write<'p>(m: &Manifest, plan: &'p MemoryPlan, b: kern_manifest::manifest::BufferId, len: usize) -> Result<&'p crate::plan::BufferSlot> {
    let slot = &plan.buffers[b.0];
    if len as u64 > slot.bytes {
        return Err(RuntimeError::Data(format!("buffers.{}: {len} bytes do not fit its {} bytes", m.buffers[b.0].name, slot.bytes)));
    }
    Ok(slot)
}

/// The slot of buffer `b` when it holds `len` bytes to read ([`Runtime::read_into`]).
pub(crate) fn check_read<'p>(m: &Manifest, plan: &'p MemoryPlan, b: kern_manifest::manifest::BufferId, len: usize) -> Result<&'p crate::plan::BufferSlot> {
    let slot = &plan.buffers[b.0];
    if len as u64 > slot.bytes {
        return Err(RuntimeError::Data(format!("buffers.{}: cannot read {len} bytes from its {} bytes", m.buffers[b.0].name, slot.bytes)));
    }
    Ok(slot)
}

fn to_cuda(e: RuntimeError) -> kern_cuda::CudaError {
    match e {
        RuntimeError::Cuda(c) => c,
        RuntimeError::CudaAt { cause: c, .. } | RuntimeError::KernelFault { cause: c, .. } => *c,
        other => kern_cuda::CudaError::InvalidArgument(other.to_string()),
    }
}

/// The next power of two ≥ `v`, capped at `max`.
/// The NCCL element type of a manifest dtype (none for i16, u16, bool and the GGUF block dtypes).
pub(crate) fn nccl_type(d: kern_manifest::DType) -> Option<kern_cuda::nccl::NcclType> {
    use kern_cuda::nccl::NcclType as N;
    use kern_manifest::DType as D;
    Some(match d {
        D::Bf16 => N::Bf16,
        D::F16 => N::F16,
        D::F32 => N::F32,
        D::F64 => N::F64,
        D::F8e4m3 => N::F8e4m3,
        D::F8e5m2 => N::F8e5m2,
        D::I8 => N::I8,
        D::U8 => N::U8,
        D::I32 => N::I32,
        D::U32 => N::U32,
        D::I64 => N::I64,
        D::U64 => N::U64,
        _ => return None,
    })
}

pub fn bucket(v: i64, max: i64) -> i64 {
    let v = v.max(1);
    let b = (v as u64).next_power_of_two() as i64;
    b.min(max).max(v)
}

/// A var's value as the scalar type of the kernel parameter it is passed to.
fn scalar_of(s: Scalar, v: i64) -> Option<Value> {
    match s {
        Scalar::F32 => Some(Value::F32(v as f32)),
        Scalar::F64 => Some(Value::F64(v as f64)),
        other => Value::int(other, i128::from(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::{bucket, check_read, check_write};

    /// Writes and reads are checked against the buffer's slot before any copy: the error
    /// names the buffer and both sizes (no GPU needed).
    #[test]
    fn upload_and_read_sizes_are_checked_against_the_slot() {
        let json = r#"{"schema_version": "4.1", "model": "sizes", "vars": {"n": {"max": 8}},
            "buffers": {"ids": {"dtype": "i32", "shape": ["n"], "role": "input"},
                        "out": {"dtype": "f32", "shape": [2, "n"], "role": "output"}},
            "program": {"calls": []}}"#;
        let m = kern_manifest::check_bytes(json.as_bytes(), std::path::Path::new("/tmp/sizes/model.json"), &Default::default()).unwrap_or_else(|d| panic!("{d}"));
        let plan = crate::plan::plan(&m, &Default::default()).unwrap();
        let (ids, out) = (m.buffer("ids").unwrap(), m.buffer("out").unwrap());
        assert_eq!(check_write(&m, &plan, ids, 32).unwrap(), &plan.buffers[ids.0], "8 i32 fit exactly");
        assert!(check_write(&m, &plan, ids, 0).is_ok());
        assert_eq!(check_write(&m, &plan, ids, 33).unwrap_err().to_string(), "buffers.ids: 33 bytes do not fit its 32 bytes");
        assert_eq!(check_read(&m, &plan, out, 64).unwrap().offset, plan.buffers[out.0].offset);
        assert_eq!(check_read(&m, &plan, out, 65).unwrap_err().to_string(), "buffers.out: cannot read 65 bytes from its 64 bytes");
    }

    #[test]
    fn buckets_are_powers_of_two_capped_at_max() {
        assert_eq!(bucket(1, 256), 1);
        assert_eq!(bucket(3, 256), 4);
        assert_eq!(bucket(5, 256), 8);
        assert_eq!(bucket(200, 256), 256);
        assert_eq!(bucket(200, 300), 256);
        assert_eq!(bucket(260, 300), 300);
        assert_eq!(bucket(300, 300), 300);
    }
}
