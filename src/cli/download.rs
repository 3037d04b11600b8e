//! `tensorfs download ORG/NAME[@RELEASE] --endpoint URL`: a model's commit from an endpoint
//! into the store.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};

use super::human;
use super::{parse_duration, Cli};
use crate::format::names::split_repo_name;
use crate::remote::client::ClientConfig;
use crate::remote::connect;
use crate::remote::download::{download, DownloadConfig, Progress, Revision};
use crate::remote::origin::Access;

/// Arguments of `download`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// org/name, org/name@<release>, org/name@sha256:<commit>; no release: the newest.
    #[arg(value_name = "ORG/NAME[@RELEASE]")]
    pub reference: String,
    /// The lane; without one, the endpoint picks (a static origin: the release's only lane).
    #[arg(long)]
    pub lane: Option<String>,
    /// The endpoint: https://…, http:// on loopback, s3://bucket/prefix (AWS_* variables), or
    /// file:///dir (a store directory).
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
    /// Objects fetched at once.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// How long a transfer may go without a byte received (failed attempts and waits
    /// included) before the download fails (60, 60s, 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub fetch_deadline: std::time::Duration,
    /// Keep the store's cache (what no local/ repo keeps: downloaded and fetched models)
    /// within SIZE once this model is in (20G, 512M), evicting the least recently used objects
    /// first; a model larger than SIZE is refused. Default: what the disk holds above its
    /// reserve (2 % of it, 1–10 GiB).
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size)]
    pub cache_size: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A progress bar on a terminal, nothing otherwise.
pub(super) struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar whose line starts with `verb` (`downloading`), shown when stderr is a terminal.
    pub(super) fn new(verb: &str) -> Bar {
        Bar(std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} {verb} {{bytes}}/{{total_bytes}} {{wide_bar}} {{bytes_per_sec}} \
                     {{eta}}"
                ))
                .expect("a valid template"),
            );
            bar
        }))
    }

    /// Clears the bar.
    pub(super) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Bar {
    fn start(&self, total_bytes: u64) {
        if let Some(bar) = &self.0 {
            bar.set_length(total_bytes);
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(bytes);
        }
    }
}

/// The repo and revision of `ORG/NAME[@REVISION]`.
fn parse_reference(reference: &str) -> anyhow::Result<(String, Revision)> {
    let (name, revision) = match reference.split_once('@') {
        Some((name, rev)) => (name, Some(rev)),
        None => (reference, None),
    };
    split_repo_name(name).map_err(|e| anyhow!("{e}"))?;
    let revision = match revision {
        None | Some("latest") => Revision::Newest,
        Some(rev) => match rev.strip_prefix("sha256:") {
            Some(hex) => Revision::Commit(hex.parse().map_err(|e| anyhow!("{reference}: {e}"))?),
            None if rev.is_empty() => bail!("{reference}: nothing after @"),
            None => Revision::Release(rev.to_owned()),
        },
    };
    Ok((name.to_owned(), revision))
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let (name, revision) = parse_reference(&args.reference)?;
    let config = ClientConfig {
        deadline: args.fetch_deadline,
        ..ClientConfig::default()
    };
    let endpoint = connect::open(&args.endpoint, args.token.clone(), Access::Read, config)?;
    cli.with_new_store(|store| {
        let progress = Arc::new(Bar::new("downloading"));
        let config = DownloadConfig {
            jobs: args.jobs.max(1),
            cache_size: args.cache_size,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let report = runtime.block_on(download(
            store,
            endpoint,
            &name,
            &revision,
            args.lane.as_deref(),
            &config,
            progress.clone(),
        ));
        progress.finish();
        let report = report?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            let release = match report.release.as_str() {
                "" => String::new(),
                release => format!("@{release}"),
            };
            println!(
                "downloaded {}{release} lane {} ({}): {} of {} objects fetched ({})",
                report.name,
                report.lane,
                report.commit,
                report.fetched,
                report.objects,
                human(report.fetched_bytes)
            );
            if !report.evicted.is_empty() {
                println!(
                    "evicted to stay within the cache's budget ({}): {}",
                    human(report.evicted_bytes),
                    report.evicted.join(", ")
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_a_release_a_commit_or_the_newest() {
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(parse_reference("acme/x").unwrap().1, Revision::Newest);
        assert_eq!(
            parse_reference("acme/x@latest").unwrap().1,
            Revision::Newest
        );
        assert_eq!(
            parse_reference("acme/x@1.0").unwrap().1,
            Revision::Release("1.0".into())
        );
        assert_eq!(
            parse_reference(&format!("acme/x@sha256:{hex}")).unwrap().1,
            Revision::Commit(hex.parse().unwrap())
        );
        assert!(parse_reference("acme").is_err());
        assert!(parse_reference("acme/x@").is_err());
        assert!(parse_reference("acme/x@sha256:zz").is_err());
    }

    #[test]
    fn durations_read_seconds_and_units() {
        use std::time::Duration;
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "-1", "5 days", "1x"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
