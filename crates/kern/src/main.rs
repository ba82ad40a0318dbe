//! `kern`: the command-line front end. Each subcommand lives in its own module and is a thin
//! layer over the library crates; errors are reported here, once, with `anyhow`.

mod bench;
mod check;
mod dump;
mod extract;
mod generate;
mod hub;
mod inspect;
mod model_dir;
mod pack;
mod plan;
mod profile;
mod run;
mod selftest;
mod serve;
mod spec;
mod test;

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
    Check(check::Args),
    /// Print the JSON Schema of the manifest format.
    Schema,
    Plan(plan::Args),
    Run(run::Args),
    Selftest(selftest::Args),
    Dump(dump::Args),
    Pack(pack::Args),
    RandomWeights(pack::RandomArgs),
    Generate(generate::Args),
    Serve(serve::Args),
    Bench(bench::Args),
    Profile(profile::Args),
    Test(test::Args),
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`kern inspect big.so | head`) like other Unix tools,
    // instead of panicking inside println!.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Extract(a) => extract::run(a),
        Command::Check(a) => check::run(a),
        Command::Schema => {
            print!("{}", kern_manifest::json_schema());
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan(a) => plan::run(a),
        Command::Run(a) => run::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Dump(a) => dump::run(a),
        Command::Pack(a) => pack::run(a),
        Command::RandomWeights(a) => pack::random(a),
        Command::Generate(a) => generate::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Test(a) => test::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
