//! What `kern check` prints on success: the manifest in numbers.

use crate::diag::Diagnostic;
use crate::manifest::{Manifest, StateSize};
use crate::raw::Role;
use std::collections::BTreeSet;
use std::fmt;

/// A summary of a checked manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    pub file: String,
    pub model: String,
    pub schema_version: String,
    pub arch: String,
    /// (name, max).
    pub vars: Vec<(String, i64)>,
    pub ops: usize,
    /// Launches declared across all ops.
    pub launches_declared: usize,
    pub modules: usize,
    /// Distinct (module, entry) pairs launched.
    pub kernels: usize,
    /// Per program: (name, calls, kernel launches per run).
    pub programs: Vec<(String, usize, usize)>,
    pub buffers: usize,
    /// Buffer bytes at the vars' max, by role (weights that alias another weight count 0).
    pub weight_bytes: u64,
    pub activation_bytes: u64,
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// Sum over per-token states, and over per-sequence states.
    pub state_bytes_per_token: u64,
    pub state_bytes_per_seq: u64,
    /// (name, bytes, "token" | "seq").
    pub states: Vec<(String, u64, &'static str)>,
    /// Per-sequence states declared `snapshot` (the prefix cache may keep copies of them).
    pub snapshot_states: Vec<String>,
    pub warnings: Vec<String>,
    /// Tensor parallelism: `Some(tp)` when the manifest declares `parallel` (it is one rank).
    pub tp: Option<u32>,
    /// Collective ops declared, and collective calls in all programs.
    pub collective_ops: usize,
    pub collective_calls: usize,
    /// Speculative decoding: the draft program's name and `k`, when declared.
    pub speculative: Option<(String, u32)>,
}

impl CheckReport {
    pub fn buffer_bytes(&self) -> u64 {
        self.weight_bytes + self.activation_bytes + self.input_bytes + self.output_bytes
    }
}

impl Manifest {
    /// The summary `kern check` prints.
    pub fn report(&self) -> CheckReport {
        let mut by_role = [0u64; 4];
        for b in &self.buffers {
            if matches!(b.source, Some(crate::manifest::WeightSource::Alias(_))) {
                continue;
            }
            let slot = match b.role {
                Role::Weight => 0,
                Role::Activation => 1,
                Role::Input => 2,
                Role::Output => 3,
            };
            by_role[slot] = by_role[slot].saturating_add(b.bytes_at_max);
        }
        let kernels: BTreeSet<(usize, &str)> = self
            .ops
            .iter()
            .flat_map(|o| o.launches.iter().map(|l| (l.module.0, l.entry.as_str())))
            .collect();
        let states: Vec<(String, u64, &'static str)> = self
            .states
            .iter()
            .map(|s| match s.size {
                StateSize::PerToken { bytes, .. } => (s.name.clone(), bytes, "token"),
                StateSize::PerSeq { bytes, .. } => (s.name.clone(), bytes, "seq"),
            })
            .collect();
        let sum = |unit: &str| {
            states
                .iter()
                .filter(|s| s.2 == unit)
                .fold(0u64, |a, s| a.saturating_add(s.1))
        };
        CheckReport {
            file: self.file.display().to_string(),
            model: self.model.clone(),
            schema_version: self.schema_version.as_str().to_string(),
            arch: self.arch.to_string(),
            vars: self.vars.iter().map(|v| (v.name.clone(), v.max)).collect(),
            ops: self.ops.len(),
            launches_declared: self.ops.iter().map(|o| o.launches.len()).sum(),
            modules: self.modules.len(),
            kernels: kernels.len(),
            programs: self
                .programs
                .iter()
                .map(|p| (p.name.clone(), p.calls.len(), p.launches(self)))
                .collect(),
            buffers: self.buffers.len(),
            weight_bytes: by_role[0],
            activation_bytes: by_role[1],
            input_bytes: by_role[2],
            output_bytes: by_role[3],
            state_bytes_per_token: sum("token"),
            state_bytes_per_seq: sum("seq"),
            states,
            snapshot_states: self.states.iter().filter(|s| s.snapshot_bytes().is_some()).map(|s| s.name.clone()).collect(),
            warnings: self.warnings.iter().map(Diagnostic::to_string).collect(),
            tp: self.parallel.map(|p| p.tp),
            collective_ops: self.ops.iter().filter(|o| o.collective.is_some()).count(),
            collective_calls: self
                .programs
                .iter()
                .flat_map(|p| &p.calls)
                .filter(|c| self.ops[c.op.0].collective.is_some())
                .count(),
            speculative: self
                .speculative
                .as_ref()
                .map(|s| (self.programs[s.draft].name.clone(), s.k)),
        }
    }
}

/// `1234567` → `1.2 MiB (1234567 B)`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit} ({b} B)")
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: ok — model `{}`, schema {}, kernels checked for {}",
            self.file, self.model, self.schema_version, self.arch
        )?;
        let vars: Vec<String> = self
            .vars
            .iter()
            .map(|(n, m)| format!("{n} ≤ {m}"))
            .collect();
        writeln!(
            f,
            "  vars       {}",
            if vars.is_empty() {
                "none".into()
            } else {
                vars.join(", ")
            }
        )?;
        writeln!(
            f,
            "  ops        {} ({} declared), {} from {}",
            self.ops,
            plural(self.launches_declared, "launch", "launches"),
            plural(self.kernels, "kernel", "kernels"),
            plural(self.modules, "module", "modules")
        )?;
        if let Some(tp) = self.tp {
            writeln!(
                f,
                "  parallel   tp = {tp}: the manifest is one rank; {}, {} in the programs",
                plural(self.collective_ops, "collective op", "collective ops"),
                plural(self.collective_calls, "collective call", "collective calls")
            )?;
        }
        for (name, calls, launches) in &self.programs {
            writeln!(
                f,
                "  program    {name}: {}, {} per run",
                plural(*calls, "call", "calls"),
                plural(*launches, "launch", "launches")
            )?;
        }
        if let Some((draft, k)) = &self.speculative {
            writeln!(
                f,
                "  speculative draft program {draft}, k = {k} draft tokens per verify step"
            )?;
        }
        writeln!(
            f,
            "  buffers    {}: {} at the vars' max",
            self.buffers,
            human_bytes(self.buffer_bytes())
        )?;
        for (role, bytes) in [
            ("weight", self.weight_bytes),
            ("activation", self.activation_bytes),
            ("input", self.input_bytes),
            ("output", self.output_bytes),
        ] {
            if bytes > 0 {
                writeln!(f, "    {role:<10} {}", human_bytes(bytes))?;
            }
        }
        if self.states.is_empty() {
            writeln!(f, "  states     none")?;
        } else {
            writeln!(
                f,
                "  states     {} per token, {} per sequence",
                human_bytes(self.state_bytes_per_token),
                human_bytes(self.state_bytes_per_seq)
            )?;
            for (name, bytes, unit) in &self.states {
                let snap = if self.snapshot_states.contains(name) { " (snapshots at cached page boundaries)" } else { "" };
                writeln!(f, "    {name:<10} {bytes} B per {unit}{snap}")?;
            }
        }
        if !self.warnings.is_empty() {
            writeln!(
                f,
                "  {}:",
                plural(self.warnings.len(), "warning", "warnings")
            )?;
            for w in &self.warnings {
                writeln!(f, "    {w}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(10_485_760), "10.0 MiB (10485760 B)");
        assert_eq!(human_bytes(1536), "1.5 KiB (1536 B)");
    }
}
