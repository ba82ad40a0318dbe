//! `kern plan model.json`: the memory plan — every buffer, the arena total, and how many
//! tokens / sequences each state pool holds in a budget. Needs no GPU.

use anyhow::Result;
use kern_runtime::plan::{self, human, StatePool};
use std::path::PathBuf;
use std::process::ExitCode;

/// Show where every buffer lives and how a GPU memory budget is split between state pools.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  kern plan model.json --gpu-mem 141GiB")]
pub struct Args {
    /// The manifest.
    manifest: PathBuf,
    /// Device memory kern may use in all (buffers + state pools + reserve).
    #[arg(long, default_value = "80GiB", value_parser = plan::parse_bytes)]
    gpu_mem: u64,
    /// Memory kept back for the CUDA context, graphs and kernel scratch.
    #[arg(long, default_value = "1GiB", value_parser = plan::parse_bytes)]
    reserve: u64,
    /// Architecture the manifest's kernels are checked for.
    #[arg(long, default_value = "sm_90", value_parser = crate::inspect::parse_arch)]
    arch: kern_binary::Arch,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let m = crate::check::load(&args.manifest, args.arch)?;
    let p = plan::plan(&m, &plan::PlanOptions { budget: Some(args.gpu_mem), reserve: args.reserve, max_pages: None })?;
    println!("{}: model `{}`, planned at every var's max ({})", args.manifest.display(), m.model, vars_text(&m));
    println!("\n  {:<40} {:<6} {:<10} {:<22} {:>14} {:>12}", "buffer", "dtype", "role", "shape", "offset", "bytes");
    for (b, slot) in m.buffers.iter().zip(&p.buffers) {
        let shape: Vec<String> = b.shape.iter().map(|e| e.to_string()).collect();
        let place = match slot.alias_of {
            Some(t) => format!("= {}", m.buffers[t.0].name),
            None => slot.offset.to_string(),
        };
        println!(
            "  {:<40} {:<6} {:<10} {:<22} {:>14} {:>12}",
            b.name,
            b.dtype.name(),
            b.role.name(),
            format!("[{}]", shape.join(", ")),
            place,
            if slot.alias_of.is_some() { "0".to_string() } else { slot.bytes.to_string() }
        );
    }
    println!(
        "\n  arena: {} (weights {}, activations {}, inputs {}, outputs {})",
        human(p.arena_bytes),
        human(p.by_role[0]),
        human(p.by_role[1]),
        human(p.by_role[2]),
        human(p.by_role[3])
    );
    if m.states.is_empty() {
        println!("  states: none");
    }
    for (s, pool) in m.states.iter().zip(&p.states) {
        match pool {
            StatePool::PerToken { bytes_per_token, page_tokens, pages, pool_bytes } => println!(
                "  state {:<12} {} per token, pages of {page_tokens} tokens: {pages} pages = {} tokens, {}",
                s.name,
                human(*bytes_per_token),
                pages * u64::from(*page_tokens),
                human(*pool_bytes)
            ),
            StatePool::PerSeq { bytes_per_seq, slots, pool_bytes } => {
                println!("  state {:<12} {} per sequence: {slots} slots, {}", s.name, human(*bytes_per_seq), human(*pool_bytes))
            }
        }
    }
    if p.snapshot_slots > 0 {
        println!(
            "  snapshots    {} per slot (every per-sequence state at a cached page boundary): {} slots, {} (docs/kv-cache.md; kern serve --snapshot-slots)",
            human(p.snapshot_slot_bytes),
            p.snapshot_slots,
            human(p.snapshot_bytes())
        );
    }
    println!(
        "  total: {} of {} (reserve {})",
        human(p.total_bytes()),
        human(args.gpu_mem),
        human(args.reserve)
    );
    if let Some(t) = p.token_capacity {
        println!("  the per-token states hold {t} tokens in all (shared block table)");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn vars_text(m: &kern_manifest::Manifest) -> String {
    if m.vars.is_empty() {
        return "no vars".into();
    }
    m.vars.iter().map(|v| format!("{}={}", v.name, v.max)).collect::<Vec<_>>().join(", ")
}
