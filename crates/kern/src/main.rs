//! `kern`: the command-line front end. Each subcommand lives in its own module and is a thin
//! layer over the library crates; errors are reported here, once, with `anyhow`.

mod extract;
mod inspect;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// kern: an LLM inference engine that knows nothing about models. A model is a manifest of
/// states, buffers, kernels and a program; kern checks it against the kernel images and runs it.
#[derive(Parser)]
#[command(name = "kern", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Inspect(inspect::Args),
    Extract(extract::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Extract(a) => extract::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
