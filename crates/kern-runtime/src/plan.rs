//! The memory plan (pure; no GPU needed — `kern plan` prints it).
//!
//! * **Buffers** live in one arena, in declaration order, each at a 256-byte aligned offset and
//!   sized by its shape at every var's max, so a run at any var values (and any CUDA-graph
//!   bucket) stays inside it. An alias (tied embeddings) takes no memory: it shares its
//!   target's slot.
//! * **States** are pools. A per-sequence state (`bytes_per_seq`) gets one slot per concurrent
//!   sequence: the max of the var `seqs` (the step ABI's batch var), or 1 when the manifest has
//!   none. Per-token states (`bytes_per_token`) are paged: page `p` of a pool holds
//!   `page_tokens` tokens at `base + p * page_tokens * bytes_per_token`. All per-token states
//!   share one block table — page `p` of a sequence is page `p` in every per-token pool — so
//!   they must agree on `page_tokens`, and they get the same number of pages.
//! * **The budget** (device memory, or `--gpu-mem` for `kern plan`) minus a reserve (CUDA
//!   context, graphs, kernel scratch) pays for the arena first, then the per-sequence slots;
//!   what remains becomes pages: `pages = remaining / (page_tokens * Σ bytes_per_token)`.
//! * **Snapshots** (a manifest whose per-sequence states all declare `"snapshot": true`): a pool
//!   of snapshot slots, each one copy of every per-sequence state (`Σ bytes_per_seq`), which
//!   the prefix cache keeps at page boundaries of cached prefixes (docs/kv-cache.md). Their
//!   count is [`Snapshots::Slots`], or by default ([`Snapshots::Auto`]) what
//!   [`SNAPSHOT_SHARE`] of the memory left after the per-sequence slots holds, never more than
//!   the pages (a snapshot belongs to one cached page); the pages get the rest.

use kern_manifest::manifest::{BufferId, Manifest, StateSize, WeightSource};
use kern_manifest::raw::Role;
use crate::{Result, RuntimeError};

/// Alignment of every buffer in the arena (the driver's allocation granularity for
/// well-aligned vector loads and TMA descriptors is 256 bytes at most).
pub const ALIGN: u64 = 256;

#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Device memory kern may use in all, in bytes (None: buffers only, no state pools).
    pub budget: Option<u64>,
    /// Bytes kept back for the CUDA context, graphs and scratch.
    pub reserve: u64,
    /// Most pages per per-token state pool (None: as many as the budget holds). A model with a
    /// tiny per-token state would otherwise get billions of pages no sequence can use.
    pub max_pages: Option<u64>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { budget: None, reserve: 1 << 30, max_pages: None }
    }
}

/// How many snapshot slots to plan (manifests whose per-sequence states declare `snapshot`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Snapshots {
    /// [`SNAPSHOT_SHARE`] of the memory left for states, at most one per page.
    #[default]
    Auto,
    /// Exactly this many (0: none, the prefix cache stays off for the model).
    Slots(u64),
}

/// The share of the memory left after buffers, reserve and per-sequence slots that
/// [`Snapshots::Auto`] gives to snapshots (the rest becomes pages): 1/8.
pub const SNAPSHOT_SHARE: (u64, u64) = (1, 8);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSlot {
    pub offset: u64,
    pub bytes: u64,
    /// Set when this buffer is an alias: the slot is the target's.
    pub alias_of: Option<BufferId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatePool {
    PerToken { bytes_per_token: u64, page_tokens: u32, pages: u64, pool_bytes: u64 },
    PerSeq { bytes_per_seq: u64, slots: u64, pool_bytes: u64 },
}

impl StatePool {
    pub fn bytes(&self) -> u64 {
        match self {
            StatePool::PerToken { pool_bytes, .. } | StatePool::PerSeq { pool_bytes, .. } => *pool_bytes,
        }
    }
}

#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub buffers: Vec<BufferSlot>,
    pub arena_bytes: u64,
    /// Bytes of the arena by role: weights, activations, inputs, outputs.
    pub by_role: [u64; 4],
    pub states: Vec<StatePool>,
    /// Tokens every per-token state can hold (pages × page_tokens), when there are any.
    pub token_capacity: Option<u64>,
    /// Snapshot slots of the per-sequence states (0 when the manifest declares no `snapshot`,
    /// or without a budget): slot `i` of state `s` lies at `i × bytes_per_seq_s` in its own
    /// snapshot pool.
    pub snapshot_slots: u64,
    /// Bytes of one snapshot slot over every per-sequence state (`Σ bytes_per_seq`).
    pub snapshot_slot_bytes: u64,
    pub budget: Option<u64>,
    pub reserve: u64,
}

impl MemoryPlan {
    /// Bytes of the state pools, snapshot pools included.
    pub fn state_bytes(&self) -> u64 {
        self.states.iter().map(StatePool::bytes).sum::<u64>() + self.snapshot_bytes()
    }
    /// Bytes of the snapshot pools.
    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_slots * self.snapshot_slot_bytes
    }
    pub fn total_bytes(&self) -> u64 {
        self.arena_bytes + self.state_bytes()
    }
}

fn role_index(r: Role) -> usize {
    match r {
        Role::Weight => 0,
        Role::Activation => 1,
        Role::Input => 2,
        Role::Output => 3,
    }
}

/// Plans memory for `m` ([`Snapshots::Auto`]). Fails when the buffers alone exceed the budget.
pub fn plan(m: &Manifest, opts: &PlanOptions) -> Result<MemoryPlan> {
    plan_with(m, opts, Snapshots::Auto)
}

/// Plans memory for `m` with `snapshots` snapshot slots (used only when every per-sequence
/// state of `m` declares `snapshot`).
pub fn plan_with(m: &Manifest, opts: &PlanOptions, snapshots: Snapshots) -> Result<MemoryPlan> {
    let mut buffers = Vec::with_capacity(m.buffers.len());
    let mut offset = 0u64;
    let mut by_role = [0u64; 4];
    for b in &m.buffers {
        if let Some(WeightSource::Alias(target)) = &b.source {
            buffers.push(BufferSlot { offset: 0, bytes: b.bytes_at_max, alias_of: Some(*target) });
            continue;
        }
        offset = offset.div_ceil(ALIGN) * ALIGN;
        buffers.push(BufferSlot { offset, bytes: b.bytes_at_max, alias_of: None });
        offset = offset
            .checked_add(b.bytes_at_max)
            .ok_or_else(|| RuntimeError::DoesNotFit(format!("buffer `{}`: the arena size overflows", b.name)))?;
        by_role[role_index(b.role)] += b.bytes_at_max;
    }
    // Aliases share their target's offset (targets are never aliases themselves: checked).
    for i in 0..buffers.len() {
        if let Some(t) = buffers[i].alias_of {
            buffers[i].offset = buffers[t.0].offset;
        }
    }
    let arena_bytes = offset.div_ceil(ALIGN) * ALIGN;

    let seqs = m.var("seqs").map_or(1, |v| m.vars[v.0].max.max(1) as u64);
    let per_token: Vec<(u64, u32)> = m
        .states
        .iter()
        .filter_map(|s| match s.size {
            StateSize::PerToken { bytes, page_tokens } => Some((bytes, page_tokens)),
            StateSize::PerSeq { .. } => None,
        })
        .collect();
    if let Some(&(_, pt)) = per_token.first() {
        if let Some(s) = m.states.iter().find(|s| matches!(s.size, StateSize::PerToken { page_tokens, .. } if page_tokens != pt)) {
            return Err(RuntimeError::Mismatch(format!(
                "states.{}: page_tokens differs from the other per-token states ({pt}); per-token states share one block table, so give them the same page_tokens",
                s.name
            )));
        }
    }

    let mut states = Vec::new();
    let mut token_capacity = None;
    let per_seq_bytes: u64 = m
        .states
        .iter()
        .map(|s| match s.size {
            StateSize::PerSeq { bytes, .. } => bytes.saturating_mul(seqs),
            _ => 0,
        })
        .sum();
    // Snapshots only when every per-sequence state can be put back.
    let snapshot_slot_bytes: u64 = if m.per_seq_snapshots() { m.states.iter().filter_map(|s| s.snapshot_bytes()).sum() } else { 0 };
    let mut snapshot_slots = 0;
    let pages = match opts.budget {
        None => 0,
        Some(budget) => {
            let need = arena_bytes.saturating_add(opts.reserve).saturating_add(per_seq_bytes);
            if need > budget {
                return Err(RuntimeError::DoesNotFit(format!(
                    "the model needs {} (buffers {} + per-sequence states {} for {seqs} sequences + reserve {}), but the budget is {}",
                    human(need),
                    human(arena_bytes),
                    human(per_seq_bytes),
                    human(opts.reserve),
                    human(budget)
                )));
            }
            let mut remaining = budget - need;
            let group: u64 = per_token.iter().map(|(b, pt)| b * u64::from(*pt)).sum();
            // No per-token state: no pages.
            let max_pages = remaining.checked_div(group).unwrap_or(0).min(opts.max_pages.unwrap_or(u64::MAX));
            if snapshot_slot_bytes > 0 && max_pages > 0 {
                let wanted = match snapshots {
                    // At most one per page of what is left after them: slots · (slot + page
                    // group) bytes fit in `remaining`.
                    Snapshots::Auto => (remaining / SNAPSHOT_SHARE.1 * SNAPSHOT_SHARE.0 / snapshot_slot_bytes)
                        .min(remaining / (snapshot_slot_bytes + group))
                        .min(max_pages),
                    Snapshots::Slots(n) => n,
                };
                let bytes = wanted.checked_mul(snapshot_slot_bytes).filter(|&b| b < remaining).ok_or_else(|| {
                    RuntimeError::DoesNotFit(format!(
                        "{wanted} snapshot slots of {} need {}, above the {} left for states after the buffers and the per-sequence slots: ask for fewer",
                        human(snapshot_slot_bytes),
                        human(wanted.saturating_mul(snapshot_slot_bytes)),
                        human(remaining)
                    ))
                })?;
                snapshot_slots = wanted;
                remaining -= bytes;
            }
            remaining.checked_div(group).unwrap_or(0).min(opts.max_pages.unwrap_or(u64::MAX))
        }
    };
    for s in &m.states {
        states.push(match s.size {
            StateSize::PerToken { bytes, page_tokens } => {
                token_capacity = Some(pages * u64::from(page_tokens));
                StatePool::PerToken { bytes_per_token: bytes, page_tokens, pages, pool_bytes: pages * u64::from(page_tokens) * bytes }
            }
            StateSize::PerSeq { bytes, .. } => StatePool::PerSeq { bytes_per_seq: bytes, slots: seqs, pool_bytes: bytes * seqs },
        });
    }
    Ok(MemoryPlan { buffers, arena_bytes, by_role, states, token_capacity, snapshot_slots, snapshot_slot_bytes: if snapshot_slots > 0 { snapshot_slot_bytes } else { 0 }, budget: opts.budget, reserve: opts.reserve })
}

/// Bytes in the largest binary unit that keeps three significant digits (`1.50 GiB`).
pub fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parses `80GiB`, `80G`, `1.5 TiB`, `512MB`, `1024` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a size: write e.g. 80GiB, 512MiB or 1000000"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(format!("`{s}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let bytes = v * mult;
    if !bytes.is_finite() || !(0.0..=1e18).contains(&bytes) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_bytes("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("80 parsecs").is_err());
        assert!(parse_bytes("GiB").is_err());
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(100), "100 B");
    }
}
