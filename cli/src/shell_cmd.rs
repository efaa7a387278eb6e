//! `fleetwatch completion SHELL` and `fleetwatch man`: shell completion scripts and man
//! pages, generated from the same clap definitions as `--help`, so they never drift.

use std::path::PathBuf;

use anyhow::Context;

/// Print a shell completion script.
#[derive(clap::Args)]
#[command(after_help = "Install, e.g.:\n  \
    bash: fleetwatch completion bash > /etc/bash_completion.d/fleetwatch\n  \
    zsh:  fleetwatch completion zsh > \"${fpath[1]}/_fleetwatch\"\n  \
    fish: fleetwatch completion fish > ~/.config/fish/completions/fleetwatch.fish")]
pub struct CompletionArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Write man pages.
#[derive(clap::Args)]
pub struct ManArgs {
    /// Write `fleetwatch.1` and one page per command (`fleetwatch-hub.1`, …) into this
    /// directory (created if missing); without it, print `fleetwatch.1` to stdout
    /// (`fleetwatch man | man -l -`).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Prints the completion script of `cmd` for the shell asked.
pub fn completion(args: CompletionArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    use std::io::Write;
    // Generated into memory first: clap_complete panics on a failed write (a closed pipe,
    // `fleetwatch completion bash | head`), a write here is an error like any other.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "fleetwatch", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script).and_then(|()| out.flush()).context("cannot write the completion script to stdout")
}

/// Prints or writes the man pages of `cmd`.
pub fn man(args: ManArgs, cmd: clap::Command) -> anyhow::Result<()> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            let mut pages: Vec<String> = std::fs::read_dir(&dir)
                .with_context(|| format!("cannot list {}", dir.display()))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".1"))
                .collect();
            pages.sort();
            println!("wrote {} man pages into {}: {}", pages.len(), dir.display(), pages.join(" "));
            Ok(())
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out).context("cannot write the man page to stdout")
        }
    }
}
