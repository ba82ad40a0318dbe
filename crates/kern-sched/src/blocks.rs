//! The KV page pool with a prefix cache.
//!
//! A page id indexes every per-token state pool at once. Each page is either **in use**
//! (reference count > 0: held by that many running sequences) or **free** (count 0, on the LRU
//! list). A *full* page whose tokens are known can be **cached**: it gets a hash chained from its
//! parent page's hash and its own tokens, `hash → page` goes into a table, and the page keeps its
//! contents and hash after it is freed, until the allocator reuses it. Allocation takes the least
//! recently freed page (pages that hold nothing worth keeping come first); reusing a cached page
//! evicts its hash.
//!
//! A new sequence walks its prompt page by page through the table; each hit is checked against
//! the page's stored tokens and parent page, so a hash collision can never alias two different
//! prefixes. Hit pages are shared read-only (their reference count goes up); a sequence only
//! ever writes pages past its cached prefix, which it holds alone.
//!
//! Page lifecycle: allocate → written by a step → (full) cached → in use by more sequences →
//! freed (LRU, contents kept) → hit again (back in use) or evicted by an allocation.
//!
//! **Host tier** (optional, [`BlockManager::with_host_tier`]): every page that becomes cached is
//! also written through to a host slot (a *store*, `(gpu page, host slot)`, which the engine
//! copies asynchronously after the step that computed the page); host slots have their own LRU
//! and keep their hashes. A lookup that runs out of GPU hits goes on in the host tier: each host
//! hit takes a fresh GPU page and becomes a *restore* `(host slot, gpu page)`, copied before the
//! next step, and the page is cached on the GPU again. So a prefix evicted from the GPU comes
//! back by copy instead of recompute, and a preempted sequence finds its full pages in one tier
//! or the other when it resumes (only its last, partial page is computed again).
//!
//! **Snapshots** (optional, [`BlockManager::with_snapshots`]: a model with per-sequence states
//! that declare `snapshot`): a pool of snapshot slots, each holding a copy of a sequence's
//! per-sequence state at the end of one cached page — the page whose end it describes, found
//! through the same hash chain. A slot is *free*, *reserved* (a save queued with a step, not yet
//! attached) or *attached* to exactly one cached page (on the snapshot LRU). With snapshots a
//! lookup only returns a run of pages whose last page has a snapshot (the hit is truncated to
//! the deepest such page), so the state can be restored at exactly the hit's length; the host
//! tier is not walked (snapshots stay on the GPU: a page restored from the host has none).
//! Evicting a page (reusing it) frees its snapshot; when the pool is full, reserving a slot
//! evicts the least recently used snapshot (its page stays cached, without a snapshot).

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("out of KV pages: {needed} more needed, {free} free of {total} ({page_tokens} tokens each)")]
    Exhausted { needed: usize, free: usize, total: usize, page_tokens: usize },
}

/// A prefix hash: 128 bits, chained from the parent page's.
pub type PageHash = u128;

/// The hash of a page with `tokens` after a parent page with hash `parent` (None: the first
/// page). FNV-1a in 128 bits over the parent hash and the tokens.
pub fn page_hash(parent: Option<PageHash>, tokens: &[u32]) -> PageHash {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    let mut eat = |b: u8| {
        h ^= b as u128;
        h = h.wrapping_mul(PRIME);
    };
    match parent {
        None => eat(0),
        Some(p) => {
            eat(1);
            p.to_le_bytes().into_iter().for_each(&mut eat);
        }
    }
    for t in tokens {
        t.to_le_bytes().into_iter().for_each(&mut eat);
    }
    h
}

#[derive(Debug, Clone)]
struct Cached {
    hash: PageHash,
    /// The page before this one in the prefix it was computed in (None: the first page).
    parent: Option<u32>,
    tokens: Vec<u32>,
}

const NIL: u32 = u32::MAX;

/// Counters of the prefix cache, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found cached (and not computed again).
    pub hits: u64,
    /// Cached pages whose hash was dropped because the page was reused.
    pub evictions: u64,
    /// Prompt tokens found in the host tier (a subset of `hits`).
    pub host_hits: u64,
    /// Pages copied to the host tier.
    pub stored: u64,
    /// Pages copied back from the host tier.
    pub restored: u64,
    /// Snapshots of per-sequence states attached to cached pages (saves that took).
    pub snapshots_saved: u64,
    /// Snapshots copied into a sequence's slot at a prefix hit.
    pub snapshots_restored: u64,
    /// Snapshots dropped: with their page, or as the least recently used when the pool was full.
    pub snapshots_evicted: u64,
    /// Prompt tokens of cached pages a lookup passed over because no snapshot lay at or past them.
    pub snapshot_truncated: u64,
}

/// A host slot's prefix.
#[derive(Debug, Clone)]
struct HostEntry {
    hash: PageHash,
    parent: Option<PageHash>,
    tokens: Vec<u32>,
}

/// The host tier: slots of pinned host memory (owned by the model), with their own LRU.
#[derive(Debug, Clone)]
struct HostTier {
    entries: Vec<Option<HostEntry>>,
    by_hash: HashMap<PageHash, u32>,
    lru: Lru,
}

/// A doubly linked list of ids (`head` first out), with O(1) unlink.
#[derive(Debug, Clone)]
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    on: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    fn new(n: usize) -> Lru {
        Lru { prev: vec![NIL; n], next: vec![NIL; n], on: vec![false; n], head: NIL, tail: NIL, len: 0 }
    }
    fn unlink(&mut self, p: u32) {
        debug_assert!(self.on[p as usize]);
        let (pr, nx) = (self.prev[p as usize], self.next[p as usize]);
        if pr == NIL { self.head = nx } else { self.next[pr as usize] = nx }
        if nx == NIL { self.tail = pr } else { self.prev[nx as usize] = pr }
        self.prev[p as usize] = NIL;
        self.next[p as usize] = NIL;
        self.on[p as usize] = false;
        self.len -= 1;
    }
    fn push_back(&mut self, p: u32) {
        self.prev[p as usize] = self.tail;
        self.next[p as usize] = NIL;
        if self.tail == NIL { self.head = p } else { self.next[self.tail as usize] = p }
        self.tail = p;
        self.on[p as usize] = true;
        self.len += 1;
    }
    fn push_front(&mut self, p: u32) {
        self.next[p as usize] = self.head;
        self.prev[p as usize] = NIL;
        if self.head == NIL { self.tail = p } else { self.prev[self.head as usize] = p }
        self.head = p;
        self.on[p as usize] = true;
        self.len += 1;
    }
    fn pop_front(&mut self) -> Option<u32> {
        let p = self.head;
        if p == NIL {
            return None;
        }
        self.unlink(p);
        Some(p)
    }
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut p = self.head;
        std::iter::from_fn(move || {
            if p == NIL {
                return None;
            }
            let q = p;
            p = self.next[p as usize];
            Some(q)
        })
    }
    /// Checks the links; returns the members in order.
    fn check(&self, what: &str) -> Vec<u32> {
        let mut out = vec![];
        let mut last = NIL;
        let mut p = self.head;
        while p != NIL {
            assert!(self.on[p as usize], "{what}: {p} linked but not marked");
            assert_eq!(self.prev[p as usize], last, "{what}: links broken at {p}");
            assert!(out.len() < self.on.len(), "{what}: a cycle");
            out.push(p);
            last = p;
            p = self.next[p as usize];
        }
        assert_eq!(self.tail, last, "{what}: tail");
        assert_eq!(out.len(), self.len, "{what}: length");
        assert_eq!(self.on.iter().filter(|&&o| o).count(), self.len, "{what}: marks");
        out
    }
}

/// The snapshot slots of the per-sequence states.
#[derive(Debug, Clone)]
struct SnapshotPool {
    /// The cached page each slot is attached to (NIL: free or reserved).
    page: Vec<u32>,
    /// The prefix hash of that page when the snapshot was attached.
    hash: Vec<PageHash>,
    reserved: Vec<bool>,
    /// Free slots (the lowest id last, so it is taken first).
    free: Vec<u32>,
    /// Attached slots, least recently used first.
    lru: Lru,
}

#[derive(Debug, Clone)]
pub struct BlockManager {
    page_tokens: usize,
    total: usize,
    refs: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_hash: HashMap<PageHash, u32>,
    /// The free pages (`head` is allocated first).
    free: Lru,
    caching: bool,
    stats: CacheStats,
    host: Option<HostTier>,
    stores: Vec<(u32, u32)>,
    restores: Vec<(u32, u32)>,
    snaps: Option<SnapshotPool>,
    /// The snapshot slot attached to each page (NIL: none).
    snap_of: Vec<u32>,
    /// Pages between forced snapshot points of a prompt (0: none; see
    /// [`BlockManager::with_snapshot_interval`]).
    snapshot_interval: usize,
    /// Cached pages the last lookup matched before it was truncated to a snapshot.
    last_match: usize,
}

impl BlockManager {
    /// A pool of `total_pages` pages with the prefix cache on.
    pub fn new(total_pages: usize, page_tokens: usize) -> Self {
        assert!(page_tokens > 0, "page_tokens must be positive");
        assert!(total_pages < NIL as usize, "too many pages");
        let mut b = BlockManager {
            page_tokens,
            total: total_pages,
            refs: vec![0; total_pages],
            cached: vec![None; total_pages],
            by_hash: HashMap::new(),
            free: Lru::new(total_pages),
            caching: true,
            stats: CacheStats::default(),
            host: None,
            stores: Vec::new(),
            restores: Vec::new(),
            snaps: None,
            snap_of: vec![NIL; total_pages],
            snapshot_interval: 0,
            last_match: 0,
        };
        // Lowest ids handed out first.
        for p in 0..total_pages as u32 {
            b.free.push_back(p);
        }
        b
    }

    /// Adds a host tier of `slots` pages (0: none). Needs the prefix cache.
    pub fn with_host_tier(mut self, slots: usize) -> Self {
        assert!(slots < NIL as usize, "too many host slots");
        self.host = (slots > 0).then(|| {
            let mut lru = Lru::new(slots);
            for h in 0..slots as u32 {
                lru.push_back(h);
            }
            HostTier { entries: vec![None; slots], by_hash: HashMap::new(), lru }
        });
        self
    }

    /// Declares that sequences carry per-sequence states, kept at page boundaries in `slots`
    /// snapshot slots: lookups then return only runs of pages that end in a snapshot. With 0
    /// slots nothing is ever hit (use the prefix cache off instead).
    pub fn with_snapshots(mut self, slots: usize) -> Self {
        assert!(slots < NIL as usize, "too many snapshot slots");
        self.snaps = Some(SnapshotPool { page: vec![NIL; slots], hash: vec![0; slots], reserved: vec![false; slots], free: (0..slots as u32).rev().collect(), lru: Lru::new(slots) });
        self
    }

    /// With snapshots, also cuts prefill chunks every `pages` pages of a prompt (0: only at the
    /// prompt's last page boundary and where the step budget ends a chunk), so that prompts
    /// sharing only a part of a cached prompt (a system prompt) find a snapshot within it —
    /// at the price of more, shorter prefill chunks.
    pub fn with_snapshot_interval(mut self, pages: usize) -> Self {
        self.snapshot_interval = pages;
        self
    }

    /// Tokens between forced snapshot points (0: none).
    pub fn snapshot_interval_tokens(&self) -> usize {
        self.snapshot_interval * self.page_tokens
    }

    /// Cached GPU pages the last [`BlockManager::lookup`] matched, before the hit was truncated
    /// to the deepest snapshot: with snapshots, where the prompt branches off a cached prefix.
    pub fn last_match_pages(&self) -> usize {
        self.last_match
    }

    /// Whether hits need snapshots ([`BlockManager::with_snapshots`]).
    pub fn snapshots(&self) -> bool {
        self.snaps.is_some()
    }

    /// Snapshot slots (0 without snapshots).
    pub fn snapshot_slots(&self) -> usize {
        self.snaps.as_ref().map_or(0, |s| s.page.len())
    }

    /// The snapshot slot attached to `page`, if any.
    pub fn snapshot_of(&self, page: u32) -> Option<u32> {
        let s = self.snap_of[page as usize];
        (s != NIL).then_some(s)
    }

    /// Whether the page cached with `hash` has a snapshot.
    pub fn has_snapshot(&self, hash: PageHash) -> bool {
        self.by_hash.get(&hash).is_some_and(|&p| self.snap_of[p as usize] != NIL)
    }

    /// A slot for a save queued with the next step: a free one, else the least recently used
    /// snapshot's (evicted: its page stays cached without it). None without snapshots or when
    /// every slot is reserved.
    pub fn reserve_snapshot(&mut self) -> Option<u32> {
        let sp = self.snaps.as_mut()?;
        let slot = match sp.free.pop() {
            Some(s) => s,
            None => {
                let s = sp.lru.pop_front()?;
                let page = std::mem::replace(&mut sp.page[s as usize], NIL);
                self.snap_of[page as usize] = NIL;
                self.stats.snapshots_evicted += 1;
                s
            }
        };
        sp.reserved[slot as usize] = true;
        Some(slot)
    }

    /// Attaches a reserved slot (its save made with the step just run) to cached `page`, the
    /// page whose end its state describes, which must hold the prefix `hash`. A page that is not
    /// cached with that hash, or has a snapshot already (the same prefix computed twice at
    /// once), frees the slot instead. Returns whether it took.
    pub fn attach_snapshot(&mut self, slot: u32, page: u32, hash: PageHash) -> bool {
        let cached = self.cached[page as usize].as_ref().is_some_and(|c| c.hash == hash);
        let Some(sp) = self.snaps.as_mut() else { return false };
        debug_assert!(sp.reserved[slot as usize], "snapshot slot {slot} attached without a reservation");
        sp.reserved[slot as usize] = false;
        if !cached || self.snap_of[page as usize] != NIL {
            sp.free.push(slot);
            return false;
        }
        sp.page[slot as usize] = page;
        sp.hash[slot as usize] = hash;
        sp.lru.push_back(slot);
        self.snap_of[page as usize] = slot;
        self.stats.snapshots_saved += 1;
        true
    }

    /// Frees a reserved slot whose save will not be attached (its row did not run as planned).
    pub fn cancel_snapshot(&mut self, slot: u32) {
        if let Some(sp) = self.snaps.as_mut() {
            debug_assert!(sp.reserved[slot as usize], "snapshot slot {slot} cancelled without a reservation");
            sp.reserved[slot as usize] = false;
            sp.free.push(slot);
        }
    }

    /// Counts a snapshot copied into a sequence's slot.
    pub fn record_snapshot_restore(&mut self) {
        self.stats.snapshots_restored += 1;
    }

    /// Host slots (0 without a host tier).
    pub fn host_slots(&self) -> usize {
        self.host.as_ref().map_or(0, |h| h.entries.len())
    }

    /// Copies to make after the step that computed these pages: `(gpu page, host slot)`.
    pub fn take_stores(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.stores)
    }

    /// Copies to make before the next step: `(host slot, gpu page)`.
    pub fn take_restores(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.restores)
    }

    /// Turns the prefix cache on or off (off: no page is ever cached or looked up).
    pub fn with_prefix_cache(mut self, on: bool) -> Self {
        self.caching = on;
        self
    }

    pub fn prefix_cache(&self) -> bool {
        self.caching
    }

    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }
    /// Pages that can be allocated (free, cached or not).
    pub fn free_pages(&self) -> usize {
        self.free.len
    }
    pub fn total_pages(&self) -> usize {
        self.total
    }
    /// Pages that hold a cached prefix (in use or free).
    pub fn cached_pages(&self) -> usize {
        self.by_hash.len()
    }
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
    pub fn refs(&self, page: u32) -> u32 {
        self.refs[page as usize]
    }

    /// The free pages, next to be allocated first.
    pub fn free_list(&self) -> Vec<u32> {
        self.free.iter().collect()
    }

    /// Takes the least recently freed page; a cached page loses its hash (evicted).
    fn allocate(&mut self) -> Option<u32> {
        let p = self.free.pop_front()?;
        if let Some(c) = self.cached[p as usize].take() {
            self.by_hash.remove(&c.hash);
            self.stats.evictions += 1;
            // Its snapshot describes the prefix the page no longer holds: evicted with it.
            let snap = std::mem::replace(&mut self.snap_of[p as usize], NIL);
            if let (Some(sp), true) = (self.snaps.as_mut(), snap != NIL) {
                sp.lru.unlink(snap);
                sp.page[snap as usize] = NIL;
                sp.free.push(snap);
                self.stats.snapshots_evicted += 1;
            }
            // A store not made yet (the page was registered outside a commit, e.g. by a draft
            // round, and evicted before the step after it) would copy what the page's next
            // owner writes: the host slot gives the prefix up instead.
            if let Some(i) = self.stores.iter().position(|&(q, _)| q == p) {
                let (_, slot) = self.stores.remove(i);
                self.stats.stored -= 1;
                if let Some(host) = self.host.as_mut() {
                    if host.entries[slot as usize].as_ref().is_some_and(|e| e.hash == c.hash) {
                        host.entries[slot as usize] = None;
                        host.by_hash.remove(&c.hash);
                        host.lru.unlink(slot);
                        host.lru.push_front(slot);
                    }
                }
            }
        }
        self.refs[p as usize] = 1;
        Some(p)
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }

    /// Grows `pages` to cover `tokens` tokens; on failure nothing changes.
    pub fn ensure(&mut self, pages: &mut Vec<u32>, tokens: usize) -> Result<(), PageError> {
        let want = self.pages_for(tokens);
        if want <= pages.len() {
            return Ok(());
        }
        let needed = want - pages.len();
        if needed > self.free.len {
            return Err(PageError::Exhausted { needed, free: self.free.len, total: self.total, page_tokens: self.page_tokens });
        }
        for _ in 0..needed {
            pages.push(self.allocate().expect("checked free pages"));
        }
        Ok(())
    }

    /// Drops a sequence's hold on its pages. Pages nobody holds go back to the free list:
    /// cached ones at the end, the sequence's last pages first (a prefix's tail is the least
    /// likely to be shared, so it is evicted before its head); uncached ones at the front.
    pub fn release(&mut self, pages: &mut Vec<u32>) {
        for &p in pages.iter().rev() {
            let r = &mut self.refs[p as usize];
            debug_assert!(*r > 0, "page {p} released twice");
            *r = r.saturating_sub(1);
            if *r == 0 {
                if self.cached[p as usize].is_some() {
                    self.free.push_back(p);
                } else {
                    self.free.push_front(p);
                }
            }
        }
        pages.clear();
    }

    /// Releases `pages[keep..]` (pages a sequence took for draft tokens it then rejected).
    pub fn truncate(&mut self, pages: &mut Vec<u32>, keep: usize) {
        if pages.len() > keep {
            let mut tail = pages.split_off(keep);
            self.release(&mut tail);
        }
    }

    /// The longest cached run of full pages of `tokens`, at most `max_pages`: each page is
    /// taken (its reference count goes up) and returned in order with the hash chain. With
    /// snapshots, the run ends at its deepest page that has a snapshot (none: no hit), and the
    /// host tier is not walked.
    pub fn lookup(&mut self, tokens: &[u32], max_pages: usize) -> (Vec<u32>, Vec<PageHash>) {
        let pt = self.page_tokens;
        let (mut pages, mut hashes) = (Vec::new(), Vec::new());
        if !self.caching {
            return (pages, hashes);
        }
        let mut parent: Option<(u32, PageHash)> = None;
        for chunk in tokens.chunks_exact(pt).take(max_pages) {
            let h = page_hash(parent.map(|p| p.1), chunk);
            let Some(&p) = self.by_hash.get(&h) else { break };
            let c = self.cached[p as usize].as_ref().expect("a hashed page is cached");
            if c.tokens != chunk || c.parent != parent.map(|x| x.0) {
                break; // a collision: never reuse another prefix's page
            }
            pages.push(p);
            hashes.push(h);
            parent = Some((p, h));
        }
        self.last_match = pages.len();
        if let Some(sp) = self.snaps.as_mut() {
            // A sequence with per-sequence state can only continue where a snapshot was taken.
            let keep = pages.iter().rposition(|&p| self.snap_of[p as usize] != NIL).map_or(0, |i| i + 1);
            self.stats.snapshot_truncated += ((pages.len() - keep) * pt) as u64;
            pages.truncate(keep);
            hashes.truncate(keep);
            if let Some(&last) = pages.last() {
                let slot = self.snap_of[last as usize];
                sp.lru.unlink(slot);
                sp.lru.push_back(slot);
            }
        }
        for &p in &pages {
            if self.refs[p as usize] == 0 {
                self.free.unlink(p);
            }
            self.refs[p as usize] += 1;
        }
        if self.snaps.is_some() {
            return (pages, hashes);
        }
        // Then the host tier: each hit takes a fresh GPU page and is copied back into it.
        let done = pages.len();
        for chunk in tokens.chunks_exact(pt).take(max_pages).skip(done) {
            let Some(host) = self.host.as_mut() else { break };
            let h = page_hash(parent.map(|p| p.1), chunk);
            let Some(&slot) = host.by_hash.get(&h) else { break };
            let e = host.entries[slot as usize].as_ref().expect("a hashed slot is filled");
            if e.tokens != chunk || e.parent != parent.map(|x| x.1) || self.by_hash.contains_key(&h) {
                break;
            }
            host.lru.unlink(slot);
            host.lru.push_back(slot);
            let Some(p) = self.allocate() else { break };
            self.by_hash.insert(h, p);
            self.cached[p as usize] = Some(Cached { hash: h, parent: parent.map(|x| x.0), tokens: chunk.to_vec() });
            self.restores.push((slot, p));
            self.stats.restored += 1;
            self.stats.host_hits += pt as u64;
            pages.push(p);
            hashes.push(h);
            parent = Some((p, h));
        }
        (pages, hashes)
    }

    /// Counts a lookup of `queried` prompt tokens that found `hit` of them cached.
    pub fn record(&mut self, queried: usize, hit: usize) {
        self.stats.queries += queried as u64;
        self.stats.hits += hit as u64;
    }

    /// Caches a full page (computed, in use by the caller) holding `tokens` after `parent`
    /// (the parent's canonical page and hash). Returns the page's canonical page and hash: a
    /// page with the same prefix already cached (the same tokens computed twice at once) stays
    /// the cached one, and this page stays uncached; children link to the canonical page.
    pub fn register(&mut self, page: u32, parent: Option<(u32, PageHash)>, tokens: &[u32]) -> (u32, PageHash) {
        debug_assert_eq!(tokens.len(), self.page_tokens);
        let hash = page_hash(parent.map(|p| p.1), tokens);
        if !self.caching {
            return (page, hash);
        }
        if let Some(c) = &self.cached[page as usize] {
            return (page, c.hash);
        }
        if let Some(&q) = self.by_hash.get(&hash) {
            return (q, hash);
        }
        self.by_hash.insert(hash, page);
        self.cached[page as usize] = Some(Cached { hash, parent: parent.map(|p| p.0), tokens: tokens.to_vec() });
        // Write through to the host tier (the least recently used slot makes room).
        if let Some(host) = self.host.as_mut() {
            match host.by_hash.get(&hash) {
                Some(&slot) => {
                    host.lru.unlink(slot);
                    host.lru.push_back(slot);
                }
                None => {
                    let slot = host.lru.pop_front().expect("host slots exist");
                    if let Some(old) = host.entries[slot as usize].take() {
                        host.by_hash.remove(&old.hash);
                    }
                    host.entries[slot as usize] = Some(HostEntry { hash, parent: parent.map(|p| p.1), tokens: tokens.to_vec() });
                    host.by_hash.insert(hash, slot);
                    host.lru.push_back(slot);
                    self.stores.push((page, slot));
                    self.stats.stored += 1;
                }
            }
        }
        (page, hash)
    }

    /// Checks the pool's accounting: each page is free exactly once or referenced, the free
    /// count matches, and the hash table and page metadata agree. Panics naming the broken rule.
    pub fn check(&self) {
        let free = self.free.check("free list");
        let mut on_list = vec![false; self.total];
        for &p in &free {
            assert!(!on_list[p as usize], "page {p} is on the free list twice");
            on_list[p as usize] = true;
            assert_eq!(self.refs[p as usize], 0, "page {p} is free but referenced");
        }
        for (i, &r) in self.refs.iter().enumerate() {
            assert!(r > 0 || on_list[i], "page {i} is neither free nor referenced (leaked)");
        }
        for (&h, &p) in &self.by_hash {
            assert_eq!(self.cached[p as usize].as_ref().map(|c| c.hash), Some(h), "hash table and page {p} disagree");
        }
        assert_eq!(self.cached.iter().filter(|c| c.is_some()).count(), self.by_hash.len(), "cached pages without a table entry");
        if let Some(host) = &self.host {
            let order = host.lru.check("host LRU");
            assert_eq!(order.len(), host.entries.len(), "every host slot is on the host LRU");
            for (&h, &slot) in &host.by_hash {
                assert_eq!(host.entries[slot as usize].as_ref().map(|e| e.hash), Some(h), "host table and slot {slot} disagree");
            }
            assert_eq!(host.entries.iter().filter(|e| e.is_some()).count(), host.by_hash.len(), "host slots without a table entry");
        }
        match &self.snaps {
            None => assert!(self.snap_of.iter().all(|&s| s == NIL), "snapshots without a snapshot pool"),
            Some(sp) => {
                let on_lru = sp.lru.check("snapshot LRU");
                let mut free = vec![false; sp.page.len()];
                for &s in &sp.free {
                    assert!(!free[s as usize], "snapshot slot {s} is free twice");
                    free[s as usize] = true;
                }
                let mut lru = vec![false; sp.page.len()];
                on_lru.iter().for_each(|&s| lru[s as usize] = true);
                for s in 0..sp.page.len() {
                    let page = sp.page[s];
                    let states = [free[s], sp.reserved[s], page != NIL];
                    assert_eq!(states.iter().filter(|&&x| x).count(), 1, "snapshot slot {s} must be exactly one of free, reserved, attached: {states:?}");
                    assert_eq!(lru[s], page != NIL, "snapshot slot {s}: on the LRU iff attached");
                    if page != NIL {
                        assert_eq!(self.snap_of[page as usize], s as u32, "snapshot slot {s} and page {page} disagree");
                        let c = self.cached[page as usize].as_ref();
                        assert!(c.is_some(), "snapshot slot {s} belongs to page {page}, which is not cached (evicted without its snapshot)");
                        assert_eq!(c.map(|c| c.hash), Some(sp.hash[s]), "snapshot slot {s} was taken for another prefix than page {page} holds now");
                    }
                }
                for (p, &s) in self.snap_of.iter().enumerate() {
                    if s != NIL {
                        assert_eq!(sp.page[s as usize], p as u32, "page {p} names snapshot slot {s}, which belongs elsewhere");
                    }
                }
            }
        }
    }

    /// Snapshot slots reserved and not yet attached or cancelled.
    pub fn reserved_snapshots(&self) -> usize {
        self.snaps.as_ref().map_or(0, |sp| sp.reserved.iter().filter(|&&r| r).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_grow_release() {
        let mut b = BlockManager::new(4, 16);
        let mut p = Vec::new();
        b.ensure(&mut p, 17).unwrap();
        assert_eq!(p, vec![0, 1]);
        b.ensure(&mut p, 32).unwrap();
        assert_eq!(p.len(), 2);
        let mut q = Vec::new();
        let e = b.ensure(&mut q, 49).unwrap_err();
        assert_eq!(e, PageError::Exhausted { needed: 4, free: 2, total: 4, page_tokens: 16 });
        assert!(q.is_empty(), "a failed ensure takes nothing");
        b.release(&mut p);
        assert_eq!(b.free_pages(), 4);
        assert!(p.is_empty());
        b.check();
    }

    #[test]
    fn cached_pages_survive_release_and_are_evicted_lru() {
        let mut b = BlockManager::new(4, 2);
        let mut a = Vec::new();
        b.ensure(&mut a, 4).unwrap(); // pages 0, 1
        let c0 = b.register(a[0], None, &[1, 2]);
        b.register(a[1], Some(c0), &[3, 4]);
        b.release(&mut a);
        assert_eq!(b.free_list(), vec![2, 3, 1, 0], "uncached first; the prefix's tail before its head");
        let (hit, _) = b.lookup(&[1, 2, 3, 4, 5], 9);
        assert_eq!(hit, vec![0, 1]);
        assert_eq!((b.refs(0), b.free_pages()), (1, 2));
        let (hit2, _) = b.lookup(&[1, 2, 9, 9], 9);
        assert_eq!(hit2, vec![0], "the second page differs");
        assert_eq!(b.refs(0), 2, "shared");
        b.release(&mut hit2.clone());
        b.release(&mut hit.clone());
        // Allocating every page evicts the cached ones last.
        let mut all = Vec::new();
        b.ensure(&mut all, 8).unwrap();
        assert_eq!(all, vec![2, 3, 1, 0]);
        assert_eq!(b.stats().evictions, 2);
        assert_eq!(b.lookup(&[1, 2], 9).0, Vec::<u32>::new(), "evicted");
        b.check();
    }

    #[test]
    fn a_hash_collision_cannot_alias_another_prefix() {
        let mut b = BlockManager::new(4, 2);
        let mut a = Vec::new();
        b.ensure(&mut a, 2).unwrap();
        let (_, h) = b.register(a[0], None, &[1, 2]);
        // Forge the table: another prefix's hash pointing at this page.
        let forged = page_hash(None, &[7, 8]);
        b.by_hash.insert(forged, a[0]);
        b.by_hash.remove(&h);
        b.cached[a[0] as usize].as_mut().unwrap().hash = forged;
        let (hit, _) = b.lookup(&[7, 8], 9);
        assert!(hit.is_empty(), "the stored tokens differ: no hit");
    }

    #[test]
    fn turned_off_nothing_is_cached() {
        let mut b = BlockManager::new(4, 2).with_prefix_cache(false);
        let mut a = Vec::new();
        b.ensure(&mut a, 2).unwrap();
        b.register(a[0], None, &[1, 2]);
        b.release(&mut a);
        assert!(b.lookup(&[1, 2, 3], 9).0.is_empty());
        assert_eq!(b.cached_pages(), 0);
    }

    #[test]
    fn the_host_tier_takes_evicted_prefixes_back() {
        let mut b = BlockManager::new(2, 2).with_host_tier(3);
        let mut a = Vec::new();
        b.ensure(&mut a, 4).unwrap();
        let c0 = b.register(a[0], None, &[1, 2]);
        b.register(a[1], Some(c0), &[3, 4]);
        assert_eq!(b.take_stores(), vec![(0, 0), (1, 1)], "written through at registration");
        b.release(&mut a);
        // Another sequence takes both GPU pages: the prefix survives on the host only.
        let mut other = Vec::new();
        b.ensure(&mut other, 4).unwrap();
        assert_eq!(b.cached_pages(), 0);
        b.release(&mut other);
        let (hit, _) = b.lookup(&[1, 2, 3, 4, 5], 9);
        assert_eq!(hit.len(), 2, "both pages come back from the host");
        assert_eq!(b.take_restores(), vec![(0, hit[0]), (1, hit[1])]);
        assert_eq!((b.stats().host_hits, b.stats().restored), (4, 2));
        assert_eq!(b.cached_pages(), 2, "cached on the GPU again");
        assert!(b.take_stores().is_empty(), "restored pages are already on the host");
        b.check();
        // A different second page: the host walk stops at the mismatch.
        b.release(&mut hit.clone());
        let (hit, _) = b.lookup(&[1, 2, 3, 9], 9);
        assert_eq!(hit.len(), 1);
        b.check();
    }

    #[test]
    fn a_page_evicted_before_its_store_is_made_is_not_stored() {
        let mut b = BlockManager::new(2, 2).with_host_tier(3);
        let mut a = Vec::new();
        b.ensure(&mut a, 4).unwrap();
        let c0 = b.register(a[0], None, &[1, 2]);
        b.register(a[1], Some(c0), &[3, 4]);
        // Released and taken by another sequence before the engine made the stores.
        b.release(&mut a);
        let mut other = Vec::new();
        b.ensure(&mut other, 4).unwrap();
        assert!(b.take_stores().is_empty(), "the pages now hold another sequence's tokens");
        assert_eq!(b.stats().stored, 0);
        b.release(&mut other);
        let (hit, _) = b.lookup(&[1, 2, 3, 4, 5], 9);
        assert!(hit.is_empty(), "no host slot claims the prefix");
        assert!(b.take_restores().is_empty());
        b.check();
    }
    #[test]
    fn a_hit_with_snapshots_ends_at_the_deepest_snapshot() {
        let mut b = BlockManager::new(6, 2).with_snapshots(2);
        let mut a = Vec::new();
        b.ensure(&mut a, 6).unwrap();
        let c0 = b.register(a[0], None, &[1, 2]);
        let c1 = b.register(a[1], Some(c0), &[3, 4]);
        b.register(a[2], Some(c1), &[5, 6]);
        // The state after 4 tokens is saved with the step and attached to the page ending there.
        let s = b.reserve_snapshot().unwrap();
        b.check();
        assert_eq!(b.reserved_snapshots(), 1);
        assert!(!b.attach_snapshot(s, a[1], c0.1), "a page holding another prefix never takes it");
        let s = b.reserve_snapshot().unwrap();
        assert!(b.attach_snapshot(s, a[1], c1.1));
        assert_eq!(b.snapshot_of(a[1]), Some(s));
        let held = a.clone();
        b.release(&mut a);
        let (hit, _) = b.lookup(&[1, 2, 3, 4, 5, 6, 7], 9);
        assert_eq!(hit.len(), 2, "three pages cached, the snapshot is at the second");
        assert_eq!(b.stats().snapshot_truncated, 2);
        assert_eq!(b.free_pages(), 4, "only the hit pages are taken");
        b.release(&mut hit.clone());
        assert!(b.lookup(&[1, 2, 9, 9], 9).0.is_empty(), "no snapshot within the shared page");
        // A second attach to the same page frees its slot; a cancelled one too.
        let t = b.reserve_snapshot().unwrap();
        assert!(!b.attach_snapshot(t, held[1], c1.1));
        let t = b.reserve_snapshot().unwrap();
        b.cancel_snapshot(t);
        b.check();
        // Reusing the page evicts its snapshot with it.
        let mut all = Vec::new();
        b.ensure(&mut all, 12).unwrap();
        assert_eq!(b.snapshot_of(held[1]), None);
        assert_eq!(b.stats().snapshots_evicted, 1);
        b.check();
    }
}
