//! Sync points: which positions of program A and program B hold the same buffer values, found
//! from the read / write sets of the calls alone (no GPU). The rule is documented in the crate
//! docs (`lib.rs`); this module implements it on an abstract form of the two programs
//! ([`CallRw`]) so it can be tested on hand-written programs as well as on real manifests.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

/// A buffer as the matching sees it: one both manifests declare alike ([`Res::Common`], the
/// same index on both sides), or one of a single side ([`Res::Own`], indexed by that side's
/// buffer id; never compared across sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    Common(usize),
    Own(usize),
}

/// One call of a program: its label and op, and the buffers it reads and writes (an `inout`
/// buffer is in both lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRw {
    pub label: String,
    pub op: String,
    pub reads: Vec<Res>,
    pub writes: Vec<Res>,
}

/// One pair of intervals: calls `a` of program A compute what calls `b` of program B compute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub a: Range<usize>,
    pub b: Range<usize>,
    /// Common buffers whose values both sides hold after the interval (paired versions written
    /// inside it): compared at this sync point.
    pub outputs: Vec<usize>,
    /// Common buffers B's calls read whose value at the interval's entry pairs with A's: the
    /// golden inputs copied from A into B for the local comparison.
    pub inputs: Vec<usize>,
}

impl Interval {
    /// `1:1`, `2:1` (fusion in B), `1:2` (split in B), …
    pub fn kind(&self) -> String {
        format!("{}:{}", self.a.len(), self.b.len())
    }
}

/// The result of matching two programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matching {
    /// In program order on both sides; together they cover both programs, contiguously.
    pub intervals: Vec<Interval>,
    /// Common buffers whose writes could not be paired one by one (different numbers of
    /// observed values): only their last values were paired.
    pub unpaired: Vec<usize>,
}

/// Per side: the version every read sees and every write creates.
struct Versions {
    /// For each call, (resource, version read).
    reads: Vec<Vec<(Res, u32)>>,
    /// For each call, (resource, version written).
    writes: Vec<Vec<(Res, u32)>>,
    /// (resource, version) → writer call.
    writer: HashMap<(Res, u32), usize>,
    /// (resource, version) → reader calls.
    readers: HashMap<(Res, u32), Vec<usize>>,
    /// Last version of each resource written by the program.
    last: HashMap<Res, u32>,
}

fn versions(calls: &[CallRw]) -> Versions {
    let mut cur: HashMap<Res, u32> = HashMap::new();
    let mut v = Versions { reads: vec![], writes: vec![], writer: HashMap::new(), readers: HashMap::new(), last: HashMap::new() };
    for (i, c) in calls.iter().enumerate() {
        let mut r = Vec::new();
        for &res in dedup(&c.reads).iter() {
            let ver = *cur.get(&res).unwrap_or(&0);
            r.push((res, ver));
            v.readers.entry((res, ver)).or_default().push(i);
        }
        let mut w = Vec::new();
        for &res in dedup(&c.writes).iter() {
            let ver = cur.entry(res).or_insert(0);
            *ver += 1;
            w.push((res, *ver));
            v.writer.insert((res, *ver), i);
            v.last.insert(res, *ver);
        }
        v.reads.push(r);
        v.writes.push(w);
    }
    v
}

fn dedup(v: &[Res]) -> Vec<Res> {
    let s: BTreeSet<Res> = v.iter().copied().collect();
    s.into_iter().collect()
}

impl Versions {
    /// Versions (≥ 1) of `res` that are observable: read by a later call, or the last one.
    fn observed(&self, res: Res) -> Vec<u32> {
        let last = self.last.get(&res).copied().unwrap_or(0);
        (1..=last).filter(|&k| k == last || self.readers.contains_key(&(res, k))).collect()
    }
}

struct Dsu(Vec<usize>);
impl Dsu {
    fn find(&mut self, x: usize) -> usize {
        let mut r = x;
        while self.0[r] != r {
            r = self.0[r];
        }
        let mut y = x;
        while self.0[y] != r {
            let n = self.0[y];
            self.0[y] = r;
            y = n;
        }
        r
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0[rb] = ra;
        }
    }
}

/// Why two programs cannot be matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoSyncPoint(pub String);

/// Matches program A with program B (see the crate docs for the rule).
pub fn match_programs(a: &[CallRw], b: &[CallRw]) -> Result<Matching, NoSyncPoint> {
    if a.is_empty() || b.is_empty() {
        return Err(NoSyncPoint("a program has no calls".into()));
    }
    let (va, vb) = (versions(a), versions(b));
    let (na, nb) = (a.len(), b.len());
    let mut dsu = Dsu((0..na + nb).collect());
    // 1. Pair the observed versions of every common buffer, in order.
    let mut commons: BTreeSet<usize> = BTreeSet::new();
    for c in a.iter().chain(b) {
        for r in c.reads.iter().chain(&c.writes) {
            if let Res::Common(i) = r {
                commons.insert(*i);
            }
        }
    }
    // (side, res, version) paired → its partner version on the other side.
    let mut pair_a: HashMap<(Res, u32), u32> = HashMap::new();
    let mut pair_b: HashMap<(Res, u32), u32> = HashMap::new();
    let mut unpaired = Vec::new();
    for &ci in &commons {
        let res = Res::Common(ci);
        let (oa, ob) = (va.observed(res), vb.observed(res));
        if oa.is_empty() || ob.is_empty() {
            if oa.len() != ob.len() {
                unpaired.push(ci);
            }
            continue;
        }
        let pairs: Vec<(u32, u32)> = if oa.len() == ob.len() {
            oa.iter().copied().zip(ob.iter().copied()).collect()
        } else {
            unpaired.push(ci);
            vec![(*oa.last().unwrap(), *ob.last().unwrap())]
        };
        for (x, y) in pairs {
            pair_a.insert((res, x), y);
            pair_b.insert((res, y), x);
            dsu.union(va.writer[&(res, x)], na + vb.writer[&(res, y)]);
        }
    }
    // 2. A value that is not paired is private to its side: its writer and readers stay together.
    for (v, pairs, off) in [(&va, &pair_a, 0usize), (&vb, &pair_b, na)] {
        for (&(res, ver), &w) in &v.writer {
            if pairs.contains_key(&(res, ver)) {
                continue;
            }
            if let Some(rs) = v.readers.get(&(res, ver)) {
                for &r in rs {
                    dsu.union(off + w, off + r);
                }
            }
        }
    }
    // 3. Components with calls on both sides, as index ranges; merged until disjoint and in
    //    the same order on both sides.
    let mut comps: HashMap<usize, (usize, usize, usize, usize, bool, bool)> = HashMap::new();
    for n in 0..na + nb {
        let root = dsu.find(n);
        let e = comps.entry(root).or_insert((usize::MAX, 0, usize::MAX, 0, false, false));
        if n < na {
            e.0 = e.0.min(n);
            e.1 = e.1.max(n);
            e.4 = true;
        } else {
            e.2 = e.2.min(n - na);
            e.3 = e.3.max(n - na);
            e.5 = true;
        }
    }
    let mut iv: Vec<[usize; 4]> = comps.values().filter(|c| c.4 && c.5).map(|c| [c.0, c.1, c.2, c.3]).collect();
    if iv.is_empty() {
        return Err(NoSyncPoint("no buffer value is computed by both programs: they share no buffer (same name, dtype, shape and role) that both write".into()));
    }
    loop {
        iv.sort();
        let mut merged = false;
        let mut out: Vec<[usize; 4]> = Vec::with_capacity(iv.len());
        for x in iv {
            if let Some(p) = out.last_mut() {
                if p[1] >= x[0] || p[3] >= x[2] {
                    *p = [p[0].min(x[0]), p[1].max(x[1]), p[2].min(x[2]), p[3].max(x[3])];
                    merged = true;
                    continue;
                }
            }
            out.push(x);
        }
        iv = out;
        if !merged {
            break;
        }
    }
    // 4. Cover both programs: calls between intervals join the next one, trailing calls the last.
    let k = iv.len();
    let mut ranges = Vec::with_capacity(k);
    for i in 0..k {
        let sa = if i == 0 { 0 } else { iv[i - 1][1] + 1 };
        let sb = if i == 0 { 0 } else { iv[i - 1][3] + 1 };
        let ea = if i + 1 == k { na } else { iv[i][1] + 1 };
        let eb = if i + 1 == k { nb } else { iv[i][3] + 1 };
        ranges.push((sa..ea, sb..eb));
    }
    // 5. Inputs and outputs of each interval.
    let mut cur_a: HashMap<Res, u32> = HashMap::new();
    let mut cur_b: HashMap<Res, u32> = HashMap::new();
    let paired = |ca: u32, cb: u32, res: Res| (ca == 0 && cb == 0) || pair_a.get(&(res, ca)) == Some(&cb);
    let mut intervals = Vec::with_capacity(k);
    for (ra, rb) in ranges {
        let mut inputs = BTreeSet::new();
        for ci in rb.clone() {
            for &(res, ver) in &vb.reads[ci] {
                if let Res::Common(i) = res {
                    // Only values that existed at the entry (not written inside before this read).
                    let entry_b = cur_b.get(&res).copied().unwrap_or(0);
                    if ver == entry_b && paired(cur_a.get(&res).copied().unwrap_or(0), entry_b, res) {
                        inputs.insert(i);
                    }
                }
            }
        }
        let mut written = BTreeSet::new();
        for ci in ra.clone() {
            for &(res, ver) in &va.writes[ci] {
                cur_a.insert(res, ver);
                written.insert(res);
            }
        }
        for ci in rb.clone() {
            for &(res, ver) in &vb.writes[ci] {
                cur_b.insert(res, ver);
                written.insert(res);
            }
        }
        let outputs = written
            .into_iter()
            .filter_map(|res| match res {
                Res::Common(i) if paired(cur_a.get(&res).copied().unwrap_or(0), cur_b.get(&res).copied().unwrap_or(0), res) => Some(i),
                _ => None,
            })
            .collect();
        intervals.push(Interval { a: ra, b: rb, outputs, inputs: inputs.into_iter().collect() });
    }
    Ok(Matching { intervals, unpaired })
}

/// A short name for calls `r` of a program: `l7.input_norm`, `a, b`, or `a … d (4 calls)`.
pub fn labels(calls: &[CallRw], r: &Range<usize>) -> String {
    let l: Vec<&str> = calls[r.clone()].iter().map(|c| c.label.as_str()).collect();
    match l.len() {
        0 => "(none)".into(),
        1..=3 => l.join(", "),
        n => format!("{} … {} ({n} calls)", l[0], l[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: Res = Res::Common(0);
    const H: Res = Res::Common(1);
    const O: Res = Res::Common(2);
    const W: Res = Res::Common(3);
    const Y: Res = Res::Common(4);

    fn c(label: &str, reads: &[Res], writes: &[Res]) -> CallRw {
        CallRw { label: label.into(), op: label.split('.').next_back().unwrap().into(), reads: reads.to_vec(), writes: writes.to_vec() }
    }

    fn shape(m: &Matching) -> Vec<(Range<usize>, Range<usize>)> {
        m.intervals.iter().map(|i| (i.a.clone(), i.b.clone())).collect()
    }

    /// A: o = f(x); x += o, h = norm(x) (fused); y = g(h)
    fn fused() -> Vec<CallRw> {
        vec![c("f", &[X], &[O]), c("add_norm", &[X, O, W], &[X, H]), c("g", &[H], &[Y])]
    }
    /// B: the same with the add and the norm as two kernels.
    fn split() -> Vec<CallRw> {
        vec![c("f", &[X], &[O]), c("add", &[X, O], &[X]), c("norm", &[X, W], &[H]), c("g", &[H], &[Y])]
    }

    #[test]
    fn identical_programs_match_call_by_call() {
        let m = match_programs(&fused(), &fused()).unwrap();
        assert_eq!(shape(&m), vec![(0..1, 0..1), (1..2, 1..2), (2..3, 2..3)]);
        assert_eq!(m.intervals[1].outputs, vec![0, 1], "x and h after the fused norm");
        assert_eq!(m.intervals[1].inputs, vec![0, 2, 3], "x, o and w are read at the entry");
        assert!(m.unpaired.is_empty());
    }

    #[test]
    fn a_split_is_one_interval_of_two_calls() {
        let m = match_programs(&fused(), &split()).unwrap();
        assert_eq!(shape(&m), vec![(0..1, 0..1), (1..2, 1..3), (2..3, 3..4)]);
        assert_eq!(m.intervals[1].kind(), "1:2");
        assert_eq!(m.intervals[1].outputs, vec![0, 1]);
        // B's norm reads x after B's add wrote it: not an entry value. x, o, w are.
        assert_eq!(m.intervals[1].inputs, vec![0, 2, 3]);
        // The reverse (fusion) is the mirror image.
        let r = match_programs(&split(), &fused()).unwrap();
        assert_eq!(shape(&r), vec![(0..1, 0..1), (1..3, 1..2), (3..4, 2..3)]);
    }

    #[test]
    fn a_private_temporary_joins_writer_and_reader() {
        // B computes o through a temporary t that A does not have.
        let t = Res::Own(9);
        let b = vec![c("f1", &[X], &[t]), c("f2", &[t], &[O]), c("add_norm", &[X, O, W], &[X, H]), c("g", &[H], &[Y])];
        let m = match_programs(&fused(), &b).unwrap();
        assert_eq!(shape(&m), vec![(0..1, 0..2), (1..2, 2..3), (2..3, 3..4)]);
    }

    #[test]
    fn in_place_chains_of_different_length_pair_their_last_values() {
        // A: y = 2x in one kernel. B: y = x; y *= 2 (the first value of y is never read by
        // anyone else, so it is not observable and only the last is paired).
        let a = vec![c("scale", &[X], &[Y]), c("g", &[Y], &[H])];
        let b = vec![c("copy", &[X], &[Y]), c("mul", &[Y], &[Y]), c("g", &[Y], &[H])];
        let m = match_programs(&a, &b).unwrap();
        assert_eq!(shape(&m), vec![(0..1, 0..2), (1..2, 2..3)]);
        assert_eq!(m.intervals[0].outputs, vec![4]);
    }

    #[test]
    fn reordered_independent_calls_merge_into_one_interval() {
        let a = vec![c("p", &[X], &[Y]), c("q", &[X], &[H]), c("r", &[Y, H], &[O])];
        let b = vec![c("q", &[X], &[H]), c("p", &[X], &[Y]), c("r", &[Y, H], &[O])];
        let m = match_programs(&a, &b).unwrap();
        assert_eq!(shape(&m), vec![(0..2, 0..2), (2..3, 2..3)]);
        assert_eq!(m.intervals[0].outputs, vec![1, 4]);
    }

    #[test]
    fn one_sided_calls_join_the_next_interval() {
        // B has a dead call (writes its own buffer, never read) before g, and one at the end.
        let d = Res::Own(7);
        let b = vec![c("f", &[X], &[O]), c("add_norm", &[X, O, W], &[X, H]), c("dead", &[H], &[d]), c("g", &[H], &[Y]), c("dead2", &[Y], &[Res::Own(8)])];
        let m = match_programs(&fused(), &b).unwrap();
        assert_eq!(shape(&m), vec![(0..1, 0..1), (1..2, 1..2), (2..3, 2..5)]);
    }

    #[test]
    fn write_counts_that_differ_where_values_are_read_pair_only_the_last() {
        // A writes x twice with a reader in between; B writes x once. Only the final x pairs,
        // so A's first write stays with its reader and everything up to the final x is one
        // interval.
        let a = vec![c("w1", &[W], &[X]), c("use", &[X], &[H]), c("w2", &[H], &[X])];
        let b = vec![c("w", &[W], &[X, H])];
        let m = match_programs(&a, &b).unwrap();
        assert_eq!(m.unpaired, vec![0]);
        assert_eq!(shape(&m), vec![(0..3, 0..1)]);
    }

    #[test]
    fn programs_that_share_no_value_are_refused() {
        let a = vec![c("f", &[Res::Own(0)], &[Res::Own(1)])];
        let b = vec![c("f", &[Res::Own(0)], &[Res::Own(1)])];
        assert!(match_programs(&a, &b).unwrap_err().0.contains("share no buffer"));
        assert!(match_programs(&[], &b).is_err());
    }

    #[test]
    fn labels_are_short() {
        let b = split();
        assert_eq!(labels(&b, &(1..3)), "add, norm");
        assert_eq!(labels(&b, &(0..4)), "f … g (4 calls)");
    }
}
