//! Tensor parallelism (issue 17): one process drives every local GPU of a tensor-parallel
//! manifest (`parallel.tp`), one [`Runtime`] per rank — each with its own context, stream,
//! arena, state pools and NCCL communicator — and runs the ranks' programs side by side.
//!
//! * **Setup.** [`ParallelRuntime::new`] takes one checked manifest per local rank (the same
//!   file, loaded once per GPU: a `Manifest` owns its module images), makes the communicators
//!   of all local ranks in one NCCL group from the unique id (node 0's, handed to the other
//!   nodes by `kern_cuda::bootstrap`), and loads each rank's modules.
//! * **Weights.** [`ParallelRuntime::load_weights`]: rank `r` streams its own slices (shard
//!   sources evaluated at `rank = r`; replicated weights to every rank).
//! * **Step inputs** are broadcast: [`ParallelRuntime::write_buffer`] writes the same bytes
//!   to every rank ([`ParallelRuntime::upload`]: asynchronously, on each rank's stream). Outputs are read from the first local rank (global rank 0 on node 0).
//!   **Sampling is replicated**: every rank computes the same logits (the all-reduced hidden
//!   state goes through a replicated LM head) and samples with the same seeds, so every rank
//!   holds the same `sampled` ids; the engine reads rank 0's.
//! * **Runs.** [`ParallelRuntime::run`] runs the program on every local rank at once, one
//!   thread per rank (a thread that issued rank 0's all-reduce would otherwise wait for rank
//!   1's forever). Collective calls are NCCL calls on the rank's stream, in program order;
//!   in graph mode they are captured into each rank's CUDA graph with the kernels
//!   (thread-local capture mode, so the ranks capture concurrently). A warm-up all-reduce at
//!   setup connects the ranks before anything is captured.

use crate::exec::{Mode, RunStats, Runtime};
use crate::plan::MemoryPlan;
use crate::{Result, RuntimeError};
use kern_cuda::nccl::{Comm, UniqueId};
use kern_cuda::Context;
use kern_manifest::manifest::{BufferId, Manifest};

/// What one local rank needs: its GPU, its copy of the manifest, its memory plan.
pub struct RankSetup {
    pub ctx: Context,
    pub manifest: Manifest,
    pub plan: MemoryPlan,
}

/// Every local rank of a tensor-parallel manifest, on its own GPU.
pub struct ParallelRuntime {
    ranks: Vec<Runtime>,
    /// Global rank of `ranks[0]`.
    first_rank: u32,
    world: u32,
}

/// Why these ranks cannot form one tensor-parallel job (no GPU needed to tell).
pub fn check_setup(tps: &[u32], ordinals: &[usize], first_rank: u32) -> Result<u32> {
    let Some(&world) = tps.first() else {
        return Err(RuntimeError::Mismatch("no local rank: give at least one GPU".into()));
    };
    if let Some(t) = tps.iter().find(|&&t| t != world) {
        return Err(RuntimeError::Mismatch(format!("the ranks' manifests declare tp = {world} and tp = {t}: every rank loads the same manifest")));
    }
    let n = tps.len() as u64;
    if u64::from(first_rank) + n > u64::from(world) {
        return Err(RuntimeError::Mismatch(format!(
            "{n} local GPU(s) from global rank {first_rank} exceed the manifest's tp = {world}: give tp / nnodes GPUs per node (ranks {first_rank}..{})",
            u64::from(first_rank) + n
        )));
    }
    let mut seen = ordinals.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(RuntimeError::Mismatch(format!("GPU {} is given to two ranks: one rank per GPU", w[0])));
    }
    Ok(world)
}

impl ParallelRuntime {
    /// `setups[i]` becomes global rank `first_rank + i` of the manifests' `tp`; `id` is the
    /// job's NCCL unique id (the same on every node).
    pub fn new(setups: Vec<RankSetup>, first_rank: u32, id: &UniqueId) -> Result<ParallelRuntime> {
        let tps: Vec<u32> = setups.iter().map(|s| s.manifest.tp()).collect();
        let ordinals: Vec<usize> = setups.iter().map(|s| s.ctx.ordinal()).collect();
        let world = check_setup(&tps, &ordinals, first_rank)?;
        let ctxs: Vec<Context> = setups.iter().map(|s| s.ctx.clone()).collect();
        let comms = Comm::init_local(&ctxs, world, first_rank, id)
            .map_err(|e| RuntimeError::CudaAt { what: format!("creating the NCCL communicators of ranks {first_rank}..{} of {world}", first_rank as usize + ctxs.len()), cause: Box::new(e) })?;
        let mut ranks = Vec::with_capacity(setups.len());
        for (s, comm) in setups.into_iter().zip(comms) {
            ranks.push(Runtime::with_comm(&s.ctx, s.manifest, s.plan, Some(comm))?);
        }
        let pr = ParallelRuntime { ranks, first_rank, world };
        pr.warm_up()?;
        Ok(pr)
    }

    /// One small all-reduce on every local rank, eagerly, so NCCL connects the ranks (and
    /// fails, if it must) before any program runs or any CUDA graph captures a collective.
    fn warm_up(&self) -> Result<()> {
        const N: usize = 64;
        let scratch: Vec<kern_cuda::DeviceBuffer> = self.ranks.iter().map(|rt| rt.context().alloc_zeroed(N * 4)).collect::<std::result::Result<_, _>>()?;
        let what = |e| RuntimeError::CudaAt { what: format!("the first all-reduce of ranks {}..{} of {} (NCCL connecting the GPUs)", self.first_rank, self.first_rank as usize + self.ranks.len(), self.world), cause: Box::new(e) };
        kern_cuda::nccl::group(|| {
            for (rt, buf) in self.ranks.iter().zip(&scratch) {
                let comm = rt.comm().expect("every rank of a ParallelRuntime has a communicator");
                // SAFETY: `buf` holds N f32 on this rank's GPU and outlives the synchronize
                // below; every local rank issues the same single collective.
                unsafe { comm.all_reduce_sum(buf.ptr(), N, kern_cuda::nccl::NcclType::F32, rt.stream())? };
            }
            Ok(())
        })
        .map_err(what)?;
        for rt in &self.ranks {
            rt.stream().synchronize().map_err(what)?;
            rt.comm().expect("communicator").async_error().map_err(what)?;
        }
        Ok(())
    }

    /// The local ranks' runtimes, in rank order.
    pub fn ranks(&self) -> &[Runtime] {
        &self.ranks
    }

    /// The tensor-parallel size (all nodes).
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The global rank of the first local runtime.
    pub fn first_rank(&self) -> u32 {
        self.first_rank
    }

    /// Streams every rank's weights (its own slices) from `ckpt`; returns the bytes loaded on
    /// all local GPUs together.
    pub fn load_weights(&self, ckpt: &kern_weights::Checkpoint, mut progress: impl FnMut(u32, u64, u64)) -> Result<u64> {
        let mut total = 0;
        for (i, rt) in self.ranks.iter().enumerate() {
            let rank = self.first_rank + i as u32;
            total += rt.load_weights_for_rank(ckpt, rank, |d, t| progress(rank, d, t))?;
        }
        Ok(total)
    }

    /// Writes the same bytes into buffer `b` of every rank (step inputs are broadcast).
    pub fn write_buffer(&self, b: BufferId, bytes: &[u8]) -> Result<()> {
        self.ranks.iter().try_for_each(|rt| rt.write_buffer(b, bytes))
    }

    /// [`Runtime::upload`] on every local rank: the same bytes into the same buffers, copied
    /// asynchronously on each rank's stream from that rank's own pinned staging (the host does
    /// not wait, except for a rank's previous upload still in flight).
    pub fn upload(&mut self, writes: &[(BufferId, &[u8])]) -> Result<()> {
        let first = self.first_rank;
        self.ranks.iter_mut().enumerate().try_for_each(|(i, rt)| rt.upload(writes).map_err(|e| RuntimeError::Mismatch(format!("rank {}: {e}", first + i as u32))))
    }

    /// [`Runtime::read_into`] on the first local rank (outputs are replicated): waits for that
    /// rank's stream only. The other ranks may still be finishing their replicated tail of the
    /// run (everything up to its last collective has finished, since rank 0's collectives did);
    /// their next upload and run queue behind it on their own streams.
    pub fn read_into(&self, b: BufferId, dst: &mut [u8]) -> Result<()> {
        self.ranks[0].read_into(b, dst)
    }

    /// [`Runtime::last_gpu_ms`] of the first local rank.
    pub fn last_gpu_ms(&self) -> Result<Option<f32>> {
        self.ranks[0].last_gpu_ms()
    }

    /// Reads buffer `b` of the first local rank (outputs are replicated).
    pub fn read_buffer(&self, b: BufferId, len: usize) -> Result<Vec<u8>> {
        self.ranks[0].read_buffer(b, len)
    }

    /// Reads buffer `b` of every local rank (to check that replicated outputs agree).
    pub fn read_buffer_all(&self, b: BufferId, len: usize) -> Result<Vec<Vec<u8>>> {
        self.ranks.iter().map(|rt| rt.read_buffer(b, len)).collect()
    }

    /// Runs program `p` once at `vars` on every local rank at once (one thread each); the
    /// stats of each rank, in rank order. The first failing rank's error is returned, with
    /// its rank.
    pub fn run(&mut self, p: usize, vars: &[i64], mode: Mode) -> Result<Vec<RunStats>> {
        self.on_every_rank(|rt| rt.run(p, vars, mode))
    }

    /// [`Runtime::enqueue_run`] on every local rank at once (one thread each, as
    /// [`ParallelRuntime::run`]: capturing or queuing a collective may wait for the other
    /// ranks), without waiting for the runs; then [`ParallelRuntime::read_into`] waits for
    /// rank 0, and [`ParallelRuntime::last_gpu_ms`] gives rank 0's GPU time.
    pub fn enqueue_run(&mut self, p: usize, vars: &[i64], mode: Mode) -> Result<Vec<RunStats>> {
        self.on_every_rank(|rt| rt.enqueue_run(p, vars, mode))
    }

    /// Calls `f` on every local rank at once, one thread each; the results in rank order, or
    /// the first failing rank's error with its rank.
    fn on_every_rank(&mut self, f: impl Fn(&mut Runtime) -> Result<RunStats> + Sync) -> Result<Vec<RunStats>> {
        let first = self.first_rank;
        let f = &f;
        let results: Vec<Result<RunStats>> = std::thread::scope(|s| {
            let handles: Vec<_> = self.ranks.iter_mut().map(|rt| s.spawn(move || f(rt))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(RuntimeError::Mismatch("a rank's thread panicked".into()))))
                .collect()
        });
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.map_err(|e| RuntimeError::Mismatch(format!("rank {}: {e}", first + i as u32))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::check_setup;

    #[test]
    fn setups_that_cannot_form_a_job_say_why() {
        assert_eq!(check_setup(&[2, 2], &[0, 1], 0).unwrap(), 2);
        assert_eq!(check_setup(&[4, 4], &[0, 1], 2).unwrap(), 4, "node 1 of 2: ranks 2 and 3");
        assert_eq!(check_setup(&[1], &[0], 0).unwrap(), 1, "a world of one");
        assert!(check_setup(&[], &[], 0).unwrap_err().to_string().contains("at least one GPU"));
        assert!(check_setup(&[2, 4], &[0, 1], 0).unwrap_err().to_string().contains("tp = 2 and tp = 4"));
        assert!(check_setup(&[2, 2], &[0, 1], 1).unwrap_err().to_string().contains("exceed the manifest's tp = 2"));
        assert!(check_setup(&[2, 2], &[0, 0], 0).unwrap_err().to_string().contains("GPU 0 is given to two ranks"));
    }
}
