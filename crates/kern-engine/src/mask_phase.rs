//! The mask phase of a step: which rows sample under an active constraint (with the drafts of
//! their verify rows), and their token masks — prefetched masks awaited on the engine thread,
//! the rest (verify rows, masks never prefetched) computed on the mask threads in parallel.

use crate::constraint::seq::SeqConstraint;
use crate::constraint::{MaskPool, TokenMask};
use crate::step_loop::Live;
use kern_sched::{SeqId, Step};
use std::collections::HashMap;
use std::time::Instant;

/// A step's masks and the sequences whose grammar failed (with the reason).
pub(crate) type Masks = (Option<TokenMask>, Vec<(SeqId, String)>);

/// One sequence's rows: its first row, and each row's mask (None: free) or why it failed.
type RowMasks = (usize, Result<Vec<Option<Vec<u32>>>, String>);

/// Rows of the step whose sequence samples under an active constraint: (first row, the
/// drafts of its verify rows after it).
pub(crate) fn constrained_rows(live: &HashMap<SeqId, Live>, step: &Step) -> Vec<(usize, Vec<u32>)> {
    let mut groups = Vec::new();
    let mut r = 0;
    while r < step.real_seqs {
        let ss = &step.seqs[r];
        let mut end = r + 1;
        while end < step.real_seqs && step.seqs[end].id == ss.id {
            end += 1;
        }
        if ss.samples && live.get(&ss.id).is_some_and(|lv| lv.constraint.as_ref().is_some_and(SeqConstraint::active)) {
            let drafts = (r + 1..end).map(|j| step.token_ids[step.query_start[j] as usize] as u32).collect();
            groups.push((r, drafts));
        }
        r = end;
    }
    groups
}

/// The masks of `groups`' rows, each sequence's on a mask thread (a verify group's rows one
/// after another); the sequences whose grammar failed, with the reason.
pub(crate) fn compute_masks(live: &mut HashMap<SeqId, Live>, pool: &MaskPool, metrics: &crate::metrics::Metrics, step: &Step, groups: Vec<(usize, Vec<u32>)>, vocab: usize) -> Masks {
    use rayon::prelude::*;
    let t0 = Instant::now();
    let mut by_seq: HashMap<SeqId, (usize, Vec<u32>)> = groups.into_iter().map(|(r, d)| (step.seqs[r].id, (r, d))).collect();
    let mut seqs: Vec<(usize, Vec<u32>, &mut SeqConstraint)> = live.iter_mut().filter_map(|(id, lv)| by_seq.remove(id).map(|(r, d)| (r, d, lv.constraint.as_mut().expect("constrained")))).collect();
    // Prefetched masks are awaited here, on the engine thread: the parallel part below only
    // computes (verify rows, masks never prefetched), it never waits for the pool's own jobs.
    for (_, _, c) in seqs.iter_mut() {
        c.wait_prefetch();
    }
    let results: Vec<RowMasks> = pool.install(|| {
        seqs.par_iter_mut()
            .map(|(r, drafts, c)| {
                let rows = c.mask().map(|m| m.map(<[u32]>::to_vec)).and_then(|first| {
                    let mut rows = vec![first];
                    rows.extend(c.draft_masks(drafts)?);
                    Ok(rows)
                });
                (*r, rows)
            })
            .collect()
    });
    metrics.mask_wait_secs.observe(t0.elapsed().as_secs_f64());
    let mut mask = TokenMask::free(step.num_seqs, vocab);
    let mut failed = Vec::new();
    for (r, res) in results {
        match res {
            Ok(rows) => {
                for (j, m) in rows.iter().enumerate() {
                    if let Some(m) = m {
                        mask.set(r + j, m);
                    }
                }
            }
            Err(e) => failed.push((step.seqs[r].id, e)),
        }
    }
    (mask.any().then_some(mask), failed)
}
