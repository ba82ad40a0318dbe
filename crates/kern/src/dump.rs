//! `kern dump --out DIR -- CMD ARGS…`: run any CUDA program unchanged under kern's CUPTI
//! injection library and record the modules it loads and the kernels it launches;
//! `kern dump summary DIR` summarises a capture.

use anyhow::Result;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Capture the cubins and kernel launches of a CUDA program, or summarise a capture.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  kern dump --out ./out -- ./vecadd\n  kern dump --out ./qwen -- python3 serve.py --model Qwen3-4B\n  kern dump summary ./out"
)]
pub struct Args {
    #[command(subcommand)]
    sub: Option<Sub>,
    /// Directory for the capture (created; must not hold another capture).
    #[arg(long, required = false)]
    out: Option<PathBuf>,
    /// The injection library (default: $KERN_INJECT_LIB, else libkern_inject.so next to kern).
    #[arg(long)]
    inject_lib: Option<PathBuf>,
    /// Log like seed §5 (-v), or every launch too (-vv).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// The program and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<OsString>,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Numbers of modules and launches, top kernels, modules never launched, graph replays.
    Summary {
        /// A directory written by `kern dump --out`.
        dir: PathBuf,
        /// How many kernels to list.
        #[arg(long, default_value_t = kern_dump::DEFAULT_TOP)]
        top: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(Sub::Summary { dir, top, json }) = args.sub {
        let s = kern_dump::summary(&dir, top)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{s}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(out) = args.out else {
        anyhow::bail!("kern dump needs --out DIR and a command after `--` (e.g. kern dump --out ./out -- ./my_program), or `kern dump summary DIR`");
    };
    if args.command.is_empty() {
        anyhow::bail!("kern dump: no command to run: put it after `--` (e.g. kern dump --out {} -- ./my_program)", out.display());
    }
    let o = kern_dump::run(&kern_dump::RunOptions { out, command: args.command, inject_lib: args.inject_lib, verbose: args.verbose })?;
    eprintln!("{o}");
    Ok(ExitCode::from(o.exit_code.clamp(0, 255) as u8))
}
