//! `kern inspect FILE`: the kernels of any GPU binary, their demangled signatures and parameter
//! layouts, as a readable listing or as JSON.

use anyhow::Result;
use kern_binary::{Arch, Binary, Image, ImageKind, Kernel};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// List the kernels of a cubin, PTX file, fatbin or host binary (.so / executable).
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern inspect vecadd.cubin\n  kern inspect libops.so --arch sm_90 --json")]
pub struct Args {
    /// The GPU binary: .cubin, .ptx, .fatbin, or a host ELF with embedded device code.
    file: PathBuf,
    /// Print one JSON object instead of a listing.
    #[arg(long)]
    json: bool,
    /// Mark the image kern would load on this architecture (exact SASS, else newest PTX).
    #[arg(long, default_value = "sm_90", value_parser = parse_arch)]
    arch: Arch,
}

pub fn parse_arch(s: &str) -> std::result::Result<Arch, String> {
    s.parse()
}

pub fn run(args: Args) -> Result<ExitCode> {
    let bin = kern_binary::read_file(&args.file)?;
    let selected = bin.selected(args.arch);
    if args.json {
        let mut v = serde_json::to_value(&bin)?;
        v["arch"] = serde_json::Value::String(args.arch.to_string());
        v["selected"] = selected.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", listing(&bin, args.arch, selected));
    }
    Ok(ExitCode::SUCCESS)
}

fn listing(bin: &Binary, arch: Arch, selected: Vec<usize>) -> String {
    let mut s = String::new();
    let kind = match bin.kind {
        kern_binary::FileKind::Cubin => "cubin",
        kern_binary::FileKind::Ptx => "PTX",
        kern_binary::FileKind::Fatbin => "fatbin",
        kern_binary::FileKind::HostElf => "host ELF",
    };
    let containers = bin.images.iter().map(|im| im.container + 1).max().unwrap_or(0);
    let _ = writeln!(s, "{}: {kind}, {} image(s) in {containers} module(s)", bin.file, bin.images.len());
    if bin.images.len() > 1 || bin.kind != kern_binary::FileKind::Cubin {
        let _ = writeln!(s, "\n  #   module  kind   arch      stored        bytes  kernels");
        for (i, im) in bin.images.iter().enumerate() {
            let mark = if selected.contains(&i) { format!("  <- loaded on {arch}") } else { String::new() };
            let _ = writeln!(
                s,
                "  {i:<3} {:<7} {:<6} {:<9} {:<9} {:>9}  {:>7}{mark}",
                im.container,
                kind_name(im.kind),
                im.arch.map_or("?".into(), |a| a.to_string()),
                format!("{:?}", im.compression).to_lowercase(),
                im.size,
                im.kernels.len()
            );
        }
        if selected.is_empty() {
            let _ = writeln!(s, "  no image can be loaded on {arch}: no {arch} cubin and no PTX for an older or equal target");
        }
    }
    for (i, im) in bin.images.iter().enumerate() {
        let _ = writeln!(s, "\nimage {i}: {} {}{}", kind_name(im.kind), im.arch.map_or("?".into(), |a| a.to_string()), image_extra(im));
        for k in &im.kernels {
            kernel_block(&mut s, k);
        }
    }
    s
}

fn kind_name(k: ImageKind) -> &'static str {
    match k {
        ImageKind::Cubin => "cubin",
        ImageKind::Ptx => "ptx",
    }
}

fn image_extra(im: &Image) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &im.toolkit {
        parts.push(format!("toolkit {t}"));
    }
    if let Some(v) = &im.ptx_version {
        parts.push(format!("PTX ISA {v}"));
    }
    if let Some(n) = &im.name {
        parts.push(format!("object {n}"));
    }
    parts.push(format!("{} kernel(s)", im.kernels.len()));
    format!(" ({})", parts.join(", "))
}

fn kernel_block(s: &mut String, k: &Kernel) {
    let _ = writeln!(s, "  {}", k.name);
    if let Some(d) = &k.demangled {
        let _ = writeln!(s, "    signature   {d}");
    } else if let Some(c) = &k.cute {
        let _ = writeln!(s, "    CuTe DSL    {c}");
        for n in &c.notes {
            let _ = writeln!(s, "                note: {n}");
        }
    }
    let mut facts = Vec::new();
    if let Some(r) = k.registers {
        facts.push(format!("registers {r}"));
    }
    if let Some(sh) = k.shared_bytes {
        facts.push(format!("static shared {sh} B"));
    }
    if let Some(f) = k.frame_bytes.filter(|&f| f > 0) {
        facts.push(format!("stack {f} B"));
    }
    if let Some([x, y, z]) = k.max_threads {
        facts.push(format!("max threads {x}x{y}x{z}"));
    }
    if let Some([x, y, z]) = k.required_block {
        facts.push(format!("required block {x}x{y}x{z}"));
    }
    if let Some(m) = k.max_registers {
        facts.push(format!("max registers {m}"));
    }
    if !facts.is_empty() {
        let _ = writeln!(s, "    {}", facts.join(", "));
    }
    let _ = writeln!(s, "    params      {} in {} bytes", k.params.len(), k.param_bytes);
    for p in &k.params {
        let cpp = k.cpp_params.as_ref().and_then(|c| c.get(p.ordinal as usize));
        let ty = cpp.cloned().or_else(|| p.ptx_type.as_ref().map(|t| format!(".{t}{}", if p.pointer { " .ptr" } else { "" })));
        let _ = writeln!(
            s,
            "      #{:<3} offset {:>5}  size {:>5}{}{}",
            p.ordinal,
            p.offset,
            p.size,
            p.align.map_or(String::new(), |a| format!("  align {a:>3}")),
            ty.map_or(String::new(), |t| format!("  {t}"))
        );
    }
}
