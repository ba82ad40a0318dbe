//! `cargo run -p kern-manifest --example check -- MODEL.json [ARCH]`: what `kern check` does,
//! for trying the crate before the CLI is wired to it.

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: check MODEL.json [sm_90]");
        std::process::exit(2);
    };
    let mut opts = kern_manifest::CheckOptions::default();
    if let Some(a) = args.next() {
        opts.arch = a.parse().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
    }
    match kern_manifest::load(std::path::Path::new(&path), &opts) {
        Ok(m) => print!("{}", m.report()),
        Err(d) => {
            eprint!("{d}");
            eprintln!("{} error(s)", d.error_count());
            std::process::exit(1);
        }
    }
}
