//! `tensorfs quantize REF --scheme S --name local/NAME`.

use std::process::ExitCode;

use super::human;
use super::Cli;
use crate::quantize::quantize;
use crate::revisions::resolve_one;

/// Arguments of `quantize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The checkpoint to quantize: org/name[@revision] or sha256:<commit>.
    #[arg(value_name = "REF")]
    pub reference: String,
    /// The lane of REF, when its revision has several.
    #[arg(long = "from-lane", value_name = "LANE")]
    pub from_lane: Option<String>,
    /// The scheme: int8.rowwise, fp8.rowwise, mxfp8 or nvfp4.
    #[arg(long)]
    pub scheme: String,
    /// The repo to add the new commit to: local/<name> (it may be REF's own).
    #[arg(long, value_name = "local/NAME")]
    pub name: String,
    /// The new lane's label (default: the scheme's name).
    #[arg(long)]
    pub lane: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let (_, commit) = resolve_one(&store, &args.reference, args.from_lane.as_deref())?;
    let lane = args.lane.clone().unwrap_or_else(|| args.scheme.clone());
    let report = quantize(&store, &commit, &args.scheme, &args.name, &lane)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "quantized {} into {} lane {} (commit {}): {} tensors encoded ({}), {} kept ({}, sharing the source's chunks)",
            args.reference,
            report.name,
            report.lane,
            report.commit,
            report.quantized,
            human(report.encoded_bytes),
            report.kept,
            human(report.kept_bytes)
        );
        for (tensor, why) in &report.left_plain {
            eprintln!("tensorfs: kept {tensor} as it was: {why}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
