//! Compiling grammars: off the step loop (on the caller's thread, which a server runs on a
//! blocking pool), once per distinct grammar (a cache), within a size and a time limit. A
//! grammar that is too large, takes too long or cannot be compiled fails its own request with a
//! message naming the problem; nothing else waits for it.

use super::grammar::Grammar;
use super::vocab::KernTokEnv;
use kern_tokenizer::Tokenizer;
use llguidance::{Matcher, ParserFactory, TokenParser};
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Why a grammar was refused. Every variant is the client's to fix (HTTP 400).
#[derive(Clone, Debug, thiserror::Error)]
pub enum GrammarError {
    /// The grammar is wrong or uses what the compiler cannot enforce.
    #[error("the {kind} cannot be used: {message}")]
    Invalid { kind: &'static str, message: String },
    #[error("the {kind} is {size} bytes, above the limit of {limit} bytes")]
    TooLarge { kind: &'static str, size: usize, limit: usize },
    #[error("the {kind} did not compile within {secs:.0} s: simplify it (deeply nested or combined `oneOf`/`anyOf` schemas compile slowly)")]
    Timeout { kind: &'static str, secs: f64 },
    /// The model cannot take constraints at all (its tokenizer, or no way to apply a mask).
    #[error("{0}")]
    Unsupported(String),
}

/// Bounds on one compilation.
#[derive(Clone, Debug)]
pub struct GrammarLimits {
    /// Wall time one compilation may take before its request is refused.
    pub timeout: Duration,
    /// Largest grammar source (a schema's JSON text, a regex, a Lark grammar), bytes.
    pub max_source_bytes: usize,
    /// Compiled grammars kept for reuse.
    pub cache_entries: usize,
    /// Compilations running at once (each holds a thread; more wait their turn).
    pub max_concurrent: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        GrammarLimits { timeout: Duration::from_secs(10), max_source_bytes: 1 << 20, cache_entries: 256, max_concurrent: 4 }
    }
}

/// A grammar compiled against the model's vocabulary; each request gets its own matcher.
pub struct CompiledGrammar {
    parser: TokenParser,
    kind: &'static str,
    /// Time the compilation took (0 for a cache hit's copy is not recorded: this is the first).
    pub compile_secs: f64,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("kind", &self.kind).field("compile_secs", &self.compile_secs).finish()
    }
}

impl CompiledGrammar {
    /// A fresh matcher at the grammar's start (its own lexer cache: matchers of one grammar run
    /// on different threads without sharing a lock).
    pub(crate) fn matcher(&self) -> Matcher {
        Matcher::new(Ok(self.parser.deep_clone()))
    }

    pub fn describe(&self) -> &'static str {
        self.kind
    }
}

struct Cache {
    map: HashMap<String, (Arc<CompiledGrammar>, u64)>,
    tick: u64,
}

/// What the compilation threads share with their [`Grammars`]: the cache and the count of
/// compilations running.
struct Shared {
    cache: Mutex<Cache>,
    running: Mutex<usize>,
    freed: Condvar,
}

impl Shared {
    fn lookup(&self, key: &str) -> Option<Arc<CompiledGrammar>> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.tick += 1;
        let t = c.tick;
        c.map.get_mut(key).map(|(g, used)| {
            *used = t;
            g.clone()
        })
    }

    /// Caches `g`, evicting the least recently used entry past `entries`.
    fn insert(&self, key: String, g: Arc<CompiledGrammar>, entries: usize) {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        c.tick += 1;
        let t = c.tick;
        c.map.insert(key, (g, t));
        while c.map.len() > entries.max(1) {
            let Some(oldest) = c.map.iter().min_by_key(|(_, (_, u))| *u).map(|(k, _)| k.clone()) else { break };
            c.map.remove(&oldest);
        }
    }

    fn release(&self) {
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.freed.notify_one();
    }
}

/// The compiler of one model's grammars: llguidance's parser factory over its vocabulary (made
/// on first use: building the token trie of a 150k vocabulary takes a moment), a cache, limits.
pub struct Grammars {
    tok: Option<Arc<Tokenizer>>,
    vocab: usize,
    eos: Vec<u32>,
    /// Set when the model cannot apply a mask at all: every compile fails with it.
    refuse: Option<String>,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    shared: Arc<Shared>,
    pub limits: GrammarLimits,
}

impl Grammars {
    pub fn new(tok: Option<Arc<Tokenizer>>, vocab: usize, eos: Vec<u32>, refuse: Option<String>, limits: GrammarLimits) -> Grammars {
        let shared = Arc::new(Shared { cache: Mutex::new(Cache { map: HashMap::new(), tick: 0 }), running: Mutex::new(0), freed: Condvar::new() });
        Grammars { tok, vocab, eos, refuse, factory: OnceLock::new(), shared, limits }
    }

    fn factory(&self) -> Result<Arc<ParserFactory>, GrammarError> {
        if let Some(r) = &self.refuse {
            return Err(GrammarError::Unsupported(r.clone()));
        }
        self.factory
            .get_or_init(|| {
                let tok = self.tok.clone().ok_or("constrained decoding needs the model's tokenizer (tokenizer.json), and this model has none")?;
                let env = KernTokEnv::new(tok, self.vocab, &self.eos)?.into_env();
                let mut f = ParserFactory::new_simple(&env).map_err(|e| format!("building the grammar compiler: {e}"))?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .clone()
            .map_err(GrammarError::Unsupported)
    }

    /// Whether `g` is compiled and cached (so a request with it starts at once).
    pub fn is_cached(&self, g: &Grammar) -> bool {
        self.shared.cache.lock().unwrap_or_else(|p| p.into_inner()).map.contains_key(&g.key())
    }

    /// The compiled grammar, from the cache or compiled now (blocking, at most the time limit).
    pub fn compile(&self, g: &Grammar) -> Result<Arc<CompiledGrammar>, GrammarError> {
        let key = g.key();
        if let Some(c) = self.shared.lookup(&key) {
            return Ok(c);
        }
        let kind = g.kind();
        let size = g.source_len();
        if size > self.limits.max_source_bytes {
            return Err(GrammarError::TooLarge { kind, size, limit: self.limits.max_source_bytes });
        }
        let factory = self.factory()?;
        let llg = g.to_llg().map_err(|message| GrammarError::Invalid { kind, message })?;
        let deadline = Instant::now() + self.limits.timeout;
        let timeout = || GrammarError::Timeout { kind, secs: self.limits.timeout.as_secs_f64() };
        // A compilation slot, within the same deadline.
        {
            let mut n = self.shared.running.lock().unwrap_or_else(|p| p.into_inner());
            while *n >= self.limits.max_concurrent.max(1) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(timeout());
                }
                n = self.shared.freed.wait_timeout(n, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            *n += 1;
        }
        // The compilation runs on a thread of its own so that this call can give up at the
        // deadline; the thread finishes anyway and caches its result for the next request.
        let (tx, rx) = mpsc::channel();
        let shared = self.shared.clone();
        let entries = self.limits.cache_entries;
        let spawned = std::thread::Builder::new().name("kern-grammar".into()).spawn(move || {
            let t0 = Instant::now();
            let r = compile_now(&factory, llg, kind).map(|parser| Arc::new(CompiledGrammar { parser, kind, compile_secs: t0.elapsed().as_secs_f64() }));
            if let Ok(c) = &r {
                shared.insert(key, c.clone(), entries);
            }
            shared.release();
            let _ = tx.send(r);
        });
        if let Err(e) = spawned {
            self.shared.release();
            return Err(GrammarError::Unsupported(format!("starting a grammar compilation thread: {e}")));
        }
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(_) => Err(timeout()),
        }
    }
}

/// Compiles `g` and checks that it can start: its first mask is computed (which also warms
/// the lexer cache every matcher copies) and must allow something.
fn compile_now(f: &ParserFactory, g: llguidance::api::TopLevelGrammar, kind: &'static str) -> Result<TokenParser, GrammarError> {
    let invalid = |message: String| GrammarError::Invalid { kind, message };
    let parser = f.create_parser(g).map_err(|e| invalid(first_line(&e.to_string())))?;
    // A plain clone shares the lexer cache with `parser`: the warm-up stays in it.
    let mut m = Matcher::new(Ok(parser.clone()));
    let mask = m.compute_mask().map_err(|e| invalid(first_line(&e.to_string())))?;
    if mask.is_zero() {
        return Err(invalid("no output can satisfy it (the first token already has no allowed choice)".into()));
    }
    Ok(parser)
}

/// llguidance's errors may append the whole grammar; the first lines say what is wrong.
fn first_line(e: &str) -> String {
    let lines: Vec<&str> = e.lines().take(3).collect();
    let s = lines.join("; ");
    if s.len() > 600 {
        let mut cut = 600;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}
