//! `kern dump summary DIR`: what a dump holds, in numbers.
//!
//! Counts are over all processes of the dump. A kernel "execution" is a direct launch or one
//! run of a graph node by a graph replay; replays are linked to the nodes of their graph
//! through the `graph_exec` records (instantiation) and the `graph_node` records (capture).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::error::Result;
use crate::format::{Attribution, ModuleKind, NoteLevel, Record};
use crate::reader::{read_dump, Dump, ProcessTrace};

/// Number of kernels [`summary`] lists when the caller has no preference.
pub const DEFAULT_TOP: usize = 20;

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub dir: PathBuf,
    pub processes: Vec<ProcessSummary>,
    /// Distinct module images (by sha256) loaded by any process.
    pub modules: usize,
    /// Module load events (one image loaded in two contexts or two processes counts twice).
    pub module_loads: usize,
    /// Files under `modules/`.
    pub module_files: usize,
    /// Kernel launches that executed directly (not captured into a graph).
    pub launches: u64,
    /// Of those, launches whose call returned an error.
    pub failed_launches: u64,
    /// Kernel launches recorded into graphs (stream capture or `cuGraphAddKernelNode`).
    pub graph_nodes: u64,
    /// Graph replays (`cuGraphLaunch`).
    pub graph_launches: u64,
    /// Kernel runs performed by graph replays (sum over replays of their graph's kernel nodes).
    pub graph_kernel_executions: u64,
    /// Replays whose graph's construction was not seen (their kernels are not counted per name).
    pub unlinked_graph_launches: u64,
    /// Distinct kernel names over launches and graph nodes.
    pub distinct_kernels: usize,
    /// How launches and graph nodes were attributed to modules.
    pub attribution: AttributionCounts,
    /// Kernels by executions (direct launches + runs by graph replays), most first.
    pub top_kernels: Vec<KernelStat>,
    /// Modules that no launch or graph node is attributed to (nor lists as a candidate).
    pub unlaunched_modules: Vec<ModuleStat>,
    /// Lines of the traces that did not parse (e.g. cut off by a killed process).
    pub bad_lines: usize,
    /// Warnings and errors the injection library wrote, as `pid N: message`.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    pub pid: u32,
    pub argv: Vec<String>,
    pub forked_from: Option<u32>,
    pub module_loads: u64,
    pub launches: u64,
    pub graph_nodes: u64,
    pub graph_launches: u64,
    /// Whether the trace ends with an `exit` record (the process went through `exit()`).
    pub clean_exit: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AttributionCounts {
    pub function_module: u64,
    pub symbol_unique: u64,
    pub ambiguous: u64,
    pub unknown: u64,
}

impl AttributionCounts {
    fn add(&mut self, a: Attribution) {
        match a {
            Attribution::FunctionModule => self.function_module += 1,
            Attribution::SymbolUnique => self.symbol_unique += 1,
            Attribution::Ambiguous => self.ambiguous += 1,
            Attribution::Unknown => self.unknown += 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelStat {
    /// Mangled name.
    pub name: String,
    /// Itanium-demangled name, when `name` is mangled.
    pub demangled: Option<String>,
    /// Direct launches + runs by graph replays.
    pub executions: u64,
    pub launches: u64,
    pub graph_nodes: u64,
    pub graph_executions: u64,
    /// sha256 of the modules the launches were attributed to.
    pub modules: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleStat {
    pub sha256: String,
    pub kind: ModuleKind,
    pub size: u64,
    pub path: String,
    pub kernels: u32,
    pub loads: u64,
    pub pids: Vec<u32>,
}

/// Reads the dump in `dir` and summarizes it, listing the `top` most executed kernels.
pub fn summary(dir: &Path, top: usize) -> Result<Summary> {
    Ok(summarize(&read_dump(dir)?, top))
}

/// Demangles an Itanium C++ name through the binary reader; `None` when `name` is not one
/// (e.g. a Triton kernel).
pub fn demangle(name: &str) -> Option<String> {
    kern_binary::demangle::demangle(name)
}

#[derive(Default)]
struct KernelAcc {
    launches: u64,
    graph_nodes: u64,
    graph_executions: u64,
    modules: BTreeSet<Arc<str>>,
}

/// Summarizes an already read dump.
pub fn summarize(dump: &Dump, top: usize) -> Summary {
    let mut s = Summary {
        dir: dump.dir.clone(),
        processes: Vec::new(),
        modules: 0,
        module_loads: 0,
        module_files: dump.module_files.len(),
        launches: 0,
        failed_launches: 0,
        graph_nodes: 0,
        graph_launches: 0,
        graph_kernel_executions: 0,
        unlinked_graph_launches: 0,
        distinct_kernels: 0,
        attribution: AttributionCounts::default(),
        top_kernels: Vec::new(),
        unlaunched_modules: Vec::new(),
        bad_lines: 0,
        notes: Vec::new(),
    };
    let mut kernels: HashMap<Arc<str>, KernelAcc> = HashMap::new();
    let mut modules: BTreeMap<Arc<str>, ModuleStat> = BTreeMap::new();
    let mut used_modules: BTreeSet<Arc<str>> = BTreeSet::new();

    for trace in &dump.traces {
        s.bad_lines += trace.bad_lines.len();
        let p = summarize_process(trace, &mut s, &mut kernels, &mut modules, &mut used_modules);
        s.processes.push(p);
    }

    s.modules = modules.len();
    s.distinct_kernels = kernels.len();
    s.unlaunched_modules = modules
        .into_iter()
        .filter(|(sha, _)| !used_modules.contains(sha))
        .map(|(_, m)| m)
        .collect();

    let mut stats: Vec<KernelStat> = kernels
        .into_iter()
        .map(|(name, k)| KernelStat {
            demangled: demangle(&name),
            name: name.to_string(),
            executions: k.launches + k.graph_executions,
            launches: k.launches,
            graph_nodes: k.graph_nodes,
            graph_executions: k.graph_executions,
            modules: k.modules.iter().map(|m| m.to_string()).collect(),
        })
        .collect();
    stats.sort_by(|a, b| {
        b.executions
            .cmp(&a.executions)
            .then(b.graph_nodes.cmp(&a.graph_nodes))
            .then_with(|| a.name.cmp(&b.name))
    });
    stats.truncate(top);
    s.top_kernels = stats;
    s
}

fn summarize_process(
    trace: &ProcessTrace,
    s: &mut Summary,
    kernels: &mut HashMap<Arc<str>, KernelAcc>,
    modules: &mut BTreeMap<Arc<str>, ModuleStat>,
    used_modules: &mut BTreeSet<Arc<str>>,
) -> ProcessSummary {
    let mut p = ProcessSummary {
        pid: trace.pid,
        argv: trace
            .header
            .as_ref()
            .map(|h| h.argv.clone())
            .unwrap_or_default(),
        forked_from: trace.header.as_ref().and_then(|h| h.forked_from),
        module_loads: 0,
        launches: 0,
        graph_nodes: 0,
        graph_launches: 0,
        clean_exit: trace.exited_cleanly(),
    };

    // Event order: records are written when their call returns, so sort by seq.
    let mut records: Vec<&Record> = trace.records.iter().collect();
    records.sort_by_key(|r| r.seq().unwrap_or(u64::MAX));

    // graph handle -> (capture id of the nodes, kernel names of its nodes so far)
    let mut graph_nodes: HashMap<u64, (Option<u64>, Vec<Arc<str>>)> = HashMap::new();
    // executable graph -> kernel names of its nodes, as of instantiation
    let mut exec_nodes: HashMap<u64, Vec<Arc<str>>> = HashMap::new();

    for r in records {
        match r {
            Record::Module(m) => {
                p.module_loads += 1;
                s.module_loads += 1;
                let e = modules
                    .entry(m.sha256.clone())
                    .or_insert_with(|| ModuleStat {
                        sha256: m.sha256.to_string(),
                        kind: m.kind,
                        size: m.size,
                        path: m.path.clone(),
                        kernels: m.kernels,
                        loads: 0,
                        pids: Vec::new(),
                    });
                e.loads += 1;
                if !e.pids.contains(&trace.pid) {
                    e.pids.push(trace.pid);
                }
            }
            Record::Launch(l) | Record::GraphNode(l) => {
                let is_node = matches!(r, Record::GraphNode(_));
                s.attribution.add(l.attribution);
                let k = kernels.entry(l.kernel.clone()).or_default();
                if let Some(sha) = &l.module_sha256 {
                    used_modules.insert(sha.clone());
                    k.modules.insert(sha.clone());
                }
                used_modules.extend(l.candidates.iter().cloned());
                if is_node {
                    p.graph_nodes += 1;
                    s.graph_nodes += 1;
                    k.graph_nodes += 1;
                    if let Some(g) = l.graph {
                        let entry = graph_nodes
                            .entry(g.graph)
                            .or_insert((g.capture_id, Vec::new()));
                        if entry.0 != g.capture_id {
                            // A new capture into a reused graph handle.
                            *entry = (g.capture_id, Vec::new());
                        }
                        entry.1.push(l.kernel.clone());
                    }
                } else {
                    p.launches += 1;
                    s.launches += 1;
                    k.launches += 1;
                    if l.result != 0 {
                        s.failed_launches += 1;
                    }
                }
            }
            Record::GraphExec(g) => {
                let nodes = graph_nodes
                    .get(&g.graph)
                    .map(|(_, n)| n.clone())
                    .unwrap_or_default();
                exec_nodes.insert(g.graph_exec, nodes);
            }
            Record::GraphLaunch(g) => {
                p.graph_launches += 1;
                s.graph_launches += 1;
                let nodes = exec_nodes.get(&g.graph_exec).or_else(|| {
                    g.graph
                        .and_then(|graph| graph_nodes.get(&graph).map(|(_, n)| n))
                });
                match nodes {
                    Some(nodes) if !nodes.is_empty() => {
                        s.graph_kernel_executions += nodes.len() as u64;
                        for name in nodes {
                            kernels.entry(name.clone()).or_default().graph_executions += 1;
                        }
                    }
                    _ => {
                        s.unlinked_graph_launches += 1;
                        s.graph_kernel_executions += u64::from(g.kernel_nodes.unwrap_or(0));
                    }
                }
            }
            Record::Note(n) if n.level != NoteLevel::Info => {
                s.notes.push(format!("pid {}: {}", trace.pid, n.message));
            }
            _ => {}
        }
    }
    p
}

/// Shortens `s` to at most `max` characters, marking the cut with `…`.
fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn short_sha(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "dump {}", self.dir.display())?;
        writeln!(f, "  processes         {}", self.processes.len())?;
        for p in &self.processes {
            let argv = ellipsize(&p.argv.join(" "), 80);
            let fork = p
                .forked_from
                .map(|pp| format!(", fork of {pp}"))
                .unwrap_or_default();
            let exit = if p.clean_exit { "" } else { ", no clean exit" };
            writeln!(
                f,
                "    pid {:<8} {} launches, {} graph replays, {} module loads{fork}{exit}  {argv}",
                p.pid, p.launches, p.graph_launches, p.module_loads
            )?;
        }
        writeln!(
            f,
            "  modules           {} distinct ({} loads, {} files)",
            self.modules, self.module_loads, self.module_files
        )?;
        let failed = if self.failed_launches > 0 {
            format!(" ({} failed)", self.failed_launches)
        } else {
            String::new()
        };
        writeln!(f, "  launches          {} direct{failed}", self.launches)?;
        write!(
            f,
            "  graph replays     {} (running {} kernels; {} kernel nodes captured",
            self.graph_launches, self.graph_kernel_executions, self.graph_nodes
        )?;
        if self.unlinked_graph_launches > 0 {
            write!(
                f,
                "; {} replays of graphs whose capture was not seen",
                self.unlinked_graph_launches
            )?;
        }
        writeln!(f, ")")?;
        writeln!(f, "  distinct kernels  {}", self.distinct_kernels)?;
        let a = &self.attribution;
        writeln!(
            f,
            "  attribution       {} function_module, {} symbol_unique, {} ambiguous, {} unknown",
            a.function_module, a.symbol_unique, a.ambiguous, a.unknown
        )?;
        if self.bad_lines > 0 {
            writeln!(
                f,
                "  unreadable lines  {} (a process was probably killed mid-write)",
                self.bad_lines
            )?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }

        writeln!(f)?;
        writeln!(
            f,
            "top kernels by executions (direct launches + runs by graph replays)"
        )?;
        writeln!(
            f,
            "  {:>10} {:>9} {:>10}  {:<12}  kernel",
            "executions", "direct", "via graph", "module"
        )?;
        for k in &self.top_kernels {
            let module = match k.modules.as_slice() {
                [] => "-".to_owned(),
                [one] => short_sha(one).to_owned(),
                many => format!("{} modules", many.len()),
            };
            let name = k.demangled.as_deref().unwrap_or(&k.name);
            writeln!(
                f,
                "  {:>10} {:>9} {:>10}  {:<12}  {}",
                k.executions,
                k.launches,
                k.graph_executions,
                module,
                ellipsize(name, 110)
            )?;
        }

        writeln!(f)?;
        writeln!(
            f,
            "modules loaded but never launched: {}",
            self.unlaunched_modules.len()
        )?;
        for m in &self.unlaunched_modules {
            writeln!(
                f,
                "  {}  {:<6} {:>10} B  {:>5} kernels  {}",
                short_sha(&m.sha256),
                m.kind,
                m.size,
                m.kernels,
                m.path
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_itanium_only() {
        assert_eq!(
            demangle("_Z6VecAddPfS_S_").as_deref(),
            Some("VecAdd(float*, float*, float*)")
        );
        assert_eq!(demangle("triton_poi_fused_add_0"), None);
    }

    #[test]
    fn ellipsis() {
        assert_eq!(ellipsize("abc", 5), "abc");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
    }
}
