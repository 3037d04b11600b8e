//! `tensorfs upload local/NAME ORG/NAME --endpoint URL`: a repo's newest commits from the store
//! to an endpoint.

use std::process::ExitCode;
use std::sync::Arc;

use super::download::Bar;
use super::human;
use super::Cli;
use crate::remote::client::ClientConfig;
use crate::remote::connect;
use crate::remote::origin::{Access, FetchError};
use crate::remote::upload::{upload, UploadConfig, UploadError};

/// Arguments of `upload`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The repo in the store whose newest commits are sent (local/NAME).
    #[arg(value_name = "LOCAL/NAME")]
    pub from: String,
    /// The repo at the endpoint that records them (not in the org `local`).
    #[arg(value_name = "ORG/NAME")]
    pub name: String,
    /// Send this lane's newest commit only; without it, every lane's.
    #[arg(long)]
    pub lane: Option<String>,
    /// The endpoint: https://… (http:// on loopback) served by `tensorfs serve --write`,
    /// s3://bucket/prefix (AWS_* variables), or file:///dir (a store directory).
    #[arg(
        long,
        env = "TENSORFS_ENDPOINT",
        hide_env_values = true,
        value_name = "URL",
        value_parser = super::parse_endpoint
    )]
    pub endpoint: String,
    /// A bearer token, sent to the endpoint's origin only.
    #[arg(
        long,
        env = "TENSORFS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Objects sent at once.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    // The local store first: opening a file:// endpoint to write makes a store there, which a
    // failure to find the local one must not leave behind.
    let store = cli.existing_store()?;
    let endpoint = connect::open(
        &args.endpoint,
        args.token.clone(),
        Access::Write,
        ClientConfig::default(),
    )?;
    let progress = Arc::new(Bar::new("uploading"));
    let config = UploadConfig {
        jobs: args.jobs.max(1),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(upload(
        &store,
        endpoint,
        &args.from,
        &args.name,
        args.lane.as_deref(),
        &config,
        progress.clone(),
    ));
    progress.finish();
    let report = report.map_err(hint)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    for commit in &report.commits {
        let how = match commit.new {
            true => "recorded",
            false => "named already",
        };
        println!(
            "{} lane {} ({}): {how} as a commit of {}",
            report.from, commit.lane, commit.commit, report.name
        );
    }
    println!(
        "uploaded {} to {}: {} of {} objects sent ({})",
        report.from,
        report.name,
        report.sent,
        report.objects,
        human(report.sent_bytes)
    );
    Ok(ExitCode::SUCCESS)
}

/// The error, with what to do about a missing token.
fn hint(error: UploadError) -> anyhow::Error {
    match &error {
        UploadError::Fetch(FetchError::Status { status: 401, .. }) => anyhow::Error::new(error)
            .context("the endpoint needs a token: pass --token or set TENSORFS_TOKEN"),
        _ => anyhow::Error::new(error),
    }
}
