//! `tensorfs completions SHELL` and the hidden `tensorfs manpages DIR`: shell completions and
//! man pages generated from the command line's own definition, so they never drift from it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use super::Cli;

/// Arguments of `completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// Arguments of `manpages`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// The folder to write `tensorfs.1` and `tensorfs-VERB.1` into (created when absent).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes `args.shell`'s completion script to standard output (bash: source it, or install it
/// as `/usr/share/bash-completion/completions/tensorfs`).
///
/// # Errors
/// Standard output cannot be written (a closed pipe ends the process quietly instead).
pub fn completions(args: &CompletionArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut command = without_hidden_verbs(Cli::command());
    // Into memory first: clap_complete panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "tensorfs", &mut script);
    std::io::stdout()
        .write_all(&script)
        .context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// `command` less its hidden verbs: clap_complete offers every verb, hidden or not, and
/// `manpages` is for packaging, not for a shell's user.
fn without_hidden_verbs(command: clap::Command) -> clap::Command {
    let verbs: Vec<clap::Command> = command
        .get_subcommands()
        .filter(|v| !v.is_hide_set())
        .cloned()
        .collect();
    let mut root = clap::Command::new(command.get_name().to_owned())
        .args(command.get_arguments().cloned())
        .subcommands(verbs);
    if let Some(about) = command.get_about() {
        root = root.about(about.clone());
    }
    if let Some(version) = command.get_version() {
        root = root.version(version.to_owned());
    }
    root
}

/// Writes a man page for `tensorfs` and one for each verb, `tensorfs-VERB.1`, as `man` and
/// Debian packages name them, then lists them on standard output.
///
/// # Errors
/// The folder cannot be created or a page written.
pub fn manpages(args: &ManArgs) -> anyhow::Result<ExitCode> {
    let mut command = Cli::command();
    // Built, the verbs carry the global options (`--store`) too.
    command.build();
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut written = vec![write_page(&args.dir, "tensorfs", command.clone())?];
    for verb in command.get_subcommands().filter(|v| !v.is_hide_set()) {
        let name = format!("tensorfs-{}", verb.get_name());
        // Each verb's page is titled and invoked by its full name.
        let verb = verb
            .clone()
            .name(name.clone())
            .bin_name(name.replace('-', " "));
        written.push(write_page(&args.dir, &name, verb)?);
    }
    for path in written {
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> anyhow::Result<PathBuf> {
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .title(name.to_uppercase())
        .section("1")
        .source(format!("tensorfs {}", env!("CARGO_PKG_VERSION")))
        .manual("TensorFS")
        .render(&mut page)
        .with_context(|| format!("rendering {name}(1)"))?;
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap_complete::Shell;

    #[test]
    fn completions_offer_every_verb_but_the_hidden_ones() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            let mut command = without_hidden_verbs(Cli::command());
            clap_complete::generate(shell, &mut command, "tensorfs", &mut script);
            let script = String::from_utf8(script).unwrap();
            for shown in ["doctor", "import", "completions", "store", "version"] {
                assert!(script.contains(shown), "{shell}: no {shown}");
            }
            assert!(!script.contains("manpages"), "{shell} offers manpages");
        }
    }
}
