//! `tensorfs serve [STORE]`: the store over HTTP, as a distribution/1 endpoint.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail};

use super::Cli;
use crate::remote::serve::{self, ServeConfig};
use crate::store::Store;

/// Arguments of `serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The store to serve (default: --store, else $TENSORFS_HOME, else ~/.cache/tensorfs).
    #[arg(value_name = "STORE")]
    pub dir: Option<PathBuf>,
    /// The address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// The environment variable holding the bearer token. With one, writes and reads of
    /// commits no release names need it; without, every caller may do everything served.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Take uploads: PUT of objects, POST of commits.
    #[arg(long)]
    pub write: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    // A server that takes uploads may start from nothing; one that only serves needs a store.
    let store = match (&args.dir, args.write) {
        (Some(dir), true) => Store::open(dir)?,
        (Some(dir), false) => Store::open_existing(dir)?,
        (None, true) => cli.open_store()?,
        (None, false) => cli.existing_store()?,
    };
    let token = match &args.token_env {
        None => None,
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| anyhow!("--token-env {var}: ${var} is unset or empty"))?
                .trim()
                .to_owned(),
        ),
    };
    if args.write && token.is_none() && !args.listen.ip().is_loopback() {
        bail!(
            "--write on {} takes uploads from anyone who can connect; give a token with \
             --token-env VAR, or listen on loopback",
            args.listen
        );
    }
    let mut config = ServeConfig::new(args.listen);
    config.token = token;
    config.write = args.write;
    let mode = match (config.write, config.token.is_some()) {
        (false, false) => "read-only, no token",
        (false, true) => "read-only; private reads need the token",
        (true, false) => "read-write, no token",
        (true, true) => "read-write; writes and private reads need the token",
    };
    let root = store.root().to_path_buf();
    serve::run(store, config, |address| {
        // The first line says where: scripts and tests read the port from it.
        println!("serving {} at http://{address} ({mode})", root.display());
        let _ = std::io::stdout().flush();
    })?;
    Ok(ExitCode::SUCCESS)
}
