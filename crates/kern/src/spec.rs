//! The speculative-decoding flags `serve`, `generate` and `bench` share.

use anyhow::{bail, Result};
use kern_sched::{Drafter, SpecConfig};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding with prompt-lookup drafts: up to K draft tokens per step, taken from
    /// the earlier continuation of the sequence's last 2–4 tokens (0: off). Output is unchanged.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub spec_ngram: usize,
    /// Speculative decoding with the model's draft program (the manifest's `speculative`
    /// section: `kern pack --draft ...`): it proposes tokens greedily on its own state, the
    /// model verifies them in one step. Output is unchanged.
    #[arg(long, conflicts_with = "spec_ngram")]
    pub spec_draft: bool,
    /// Draft tokens per verify step with --spec-draft (default: the manifest's `speculative.k`).
    #[arg(long, value_name = "K", requires = "spec_draft")]
    pub spec_k: Option<usize>,
}

impl SpecArgs {
    /// The engine's speculative-decoding setting (None: off).
    pub fn config(&self) -> Result<Option<SpecConfig>> {
        if let Some(k) = self.spec_k {
            if !(1..=16).contains(&k) {
                bail!("--spec-k {k}: give 1 to 16 draft tokens per step");
            }
        }
        Ok(if self.spec_draft {
            Some(SpecConfig::program(self.spec_k.unwrap_or(0)))
        } else {
            (self.spec_ngram > 0).then(|| SpecConfig::ngram(self.spec_ngram))
        })
    }

    /// How the drafts are made, for reports: "n-gram, k = 4", "draft program, k = 3".
    pub fn describe(cfg: &SpecConfig) -> String {
        match cfg.drafter {
            Drafter::Ngram => format!("n-gram, k = {}", cfg.k),
            Drafter::Program if cfg.k == 0 => "draft program, the manifest's k".to_string(),
            Drafter::Program => format!("draft program, k = {}", cfg.k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<SpecConfig>, String> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        cli.spec.config().map_err(|e| e.to_string())
    }

    #[test]
    fn flags_choose_the_drafter() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--spec-ngram", "4"]).unwrap(), Some(SpecConfig::ngram(4)));
        assert_eq!(parse(&["--spec-draft"]).unwrap(), Some(SpecConfig::program(0)));
        assert_eq!(parse(&["--spec-draft", "--spec-k", "3"]).unwrap(), Some(SpecConfig::program(3)));
        assert!(parse(&["--spec-draft", "--spec-ngram", "4"]).unwrap_err().contains("cannot be used with"));
        assert!(parse(&["--spec-k", "3"]).unwrap_err().contains("--spec-draft"));
        assert!(parse(&["--spec-draft", "--spec-k", "17"]).unwrap_err().contains("1 to 16"));
    }
}
