//! `tensorfs import SRC... --name local/NAME`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::{count, human, Cli};
use crate::import::{import, ImportConfig, Progress};
use crate::store::hub::HubId;
use crate::store::Store;

/// Arguments of `import`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Diffusers folder (with model_index.json), a Transformers folder, or .safetensors,
    /// .sft and .gguf files.
    #[arg(required_unless_present = "hf_cache", value_name = "SRC")]
    pub sources: Vec<PathBuf>,
    /// The repo to add the commits to: local/<name>.
    #[arg(long, value_name = "local/NAME", required_unless_present = "hf_cache")]
    pub name: Option<String>,
    /// Import every model snapshot of a Hugging Face hub cache instead: each repo ORG/NAME
    /// into local/ORG--NAME (or the local repo its hub id was recorded for), every file checked
    /// against its etag first. DIR defaults to huggingface_hub's: $HF_HUB_CACHE,
    /// $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub,
    /// ~/.cache/huggingface/hub. The cache is only read.
    #[arg(
        long,
        value_name = "DIR",
        num_args = 0..=1,
        conflicts_with_all = ["sources", "name", "hf_id"]
    )]
    pub hf_cache: Option<Option<PathBuf>>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Chunk-writing threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Read quantized arrays by this producer convention (fs-layout/conventions.json), for a
    /// source that does not declare its own (no quantization_config, hf_quant_config.json or
    /// ComfyUI marker), e.g. modelopt.nvfp4, comfy.nvfp4, gptq; or convert a single file
    /// imported alone by this converter (fs-layout/single_file.json), e.g. sd1.single_file,
    /// sdxl_unet.single_file.
    #[arg(long, value_name = "NAME")]
    pub converter: Option<String>,
    /// What a single-file diffusion checkpoint predicts, for files that do not say (SD 2.x:
    /// 512-base models predict noise, `epsilon`; 768-v ones velocity, `v_prediction`); it
    /// overrides the file's own markers.
    #[arg(
        long,
        value_name = "TYPE",
        conflicts_with = "hf_cache",
        value_parser = clap::builder::PossibleValuesParser::new(crate::import::PREDICTION_TYPES)
    )]
    pub prediction_type: Option<String>,
    /// The Hugging Face repo the source is, and its revision (a 40-hex commit), recorded so the
    /// hub cache view can show it under that id. A hub cache snapshot folder
    /// (…/models--ORG--NAME/snapshots/COMMIT) names its own.
    #[arg(long, value_name = "ORG/NAME[@REV]", value_parser = parse_hub_id)]
    pub hf_id: Option<HubId>,
    /// Join a single file of a model alone (a fine-tuned UNet or transformer) to this stored
    /// pipeline, `org/name[@revision]`: the lane's `<lane>@diffusers` face is that pipeline
    /// with the file's model in place of its own, its other components (VAE, text encoders,
    /// tokenizers, scheduler) stored once, in the pipeline's commit.
    #[arg(long, value_name = "REF", conflicts_with = "hf_cache")]
    pub pipeline: Option<String>,
    /// The lane of --pipeline's revision, when it has several.
    #[arg(long, value_name = "LANE", requires = "pipeline")]
    pub pipeline_lane: Option<String>,
    /// A stored model's component in place of --pipeline's component NAME:
    /// `NAME=org/name[@revision][:LANE]` (a VAE repo as `vae`, a text encoder's folder as
    /// `text_encoder_2`), of the same class and widths. Repeatable.
    #[arg(long, value_name = "NAME=REF", requires = "pipeline")]
    pub component: Vec<String>,
}

fn parse_hub_id(text: &str) -> Result<HubId, String> {
    HubId::parse(text).map_err(|e| e.to_string())
}

/// A progress bar on a terminal, nothing otherwise.
pub(super) struct Bar(pub(super) Option<ProgressBar>);

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

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    stop_on_signals();
    match &args.hf_cache {
        Some(dir) => cli.with_new_store(|store| super::hf_cache::run(store, args, dir.as_deref())),
        None => cli.with_new_store(|store| run_in(store, args)),
    }
}

/// Set by the first SIGINT or SIGTERM: the import stops, removes what it staged (and a store
/// it made), and exits; a second signal ends the process at once (the handler resets itself).
pub(super) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn stop_on_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = stop as *const () as usize;
            action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

impl Bar {
    /// A bar on standard error when it is a terminal, saying `{msg}` (set later) first.
    pub(super) fn on_terminal(msg: &str) -> Bar {
        Bar(std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} {eta}",
                )
                .expect("a valid template"),
            );
            bar.set_message(msg.to_owned());
            bar
        }))
    }
}

fn run_in(store: &Store, args: &Args) -> anyhow::Result<ExitCode> {
    let mut config = ImportConfig::default();
    if let Some(threads) = args.threads {
        config.threads = threads.max(1);
    }
    config.converter = args.converter.clone();
    config.prediction_type = args.prediction_type.clone();
    config.hub = args.hf_id.clone();
    config.cancel = Some(&STOP);
    if let Some(reference) = &args.pipeline {
        let (_, commit) =
            crate::revisions::resolve_one(store, reference, args.pipeline_lane.as_deref())
                .with_context(|| format!("--pipeline {reference}"))?;
        let mut components = Vec::new();
        for declared in &args.component {
            let Some((name, from)) = declared
                .split_once('=')
                .filter(|(n, f)| !n.is_empty() && !f.is_empty())
            else {
                anyhow::bail!("--component {declared}: expected NAME=REF (vae=local/my-vae)");
            };
            let (reference, lane) = match from.rsplit_once(':') {
                Some((r, l)) => (r, Some(l)),
                None => (from, None),
            };
            let (_, commit) = crate::revisions::resolve_one(store, reference, lane)
                .with_context(|| format!("--component {declared}"))?;
            components.push(crate::import::LentComponent {
                name: name.to_owned(),
                from: from.to_owned(),
                commit,
            });
        }
        config.pipeline = Some(crate::import::PipelineBase {
            name: reference.clone(),
            commit,
            components,
        });
    }
    let progress = Bar::on_terminal("writing chunks");
    let name = args
        .name
        .as_deref()
        .expect("clap requires --name without --hf-cache");
    let report = import(store, &args.sources, name, &config, &progress);
    if let Some(bar) = &progress.0 {
        bar.finish_and_clear();
    }
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for lane in &report.lanes {
            println!(
                "imported {}@{} lane {}: {} ({} of tensor data), {}",
                report.name,
                lane.commit,
                lane.lane,
                count(lane.tensors, "tensor"),
                human(lane.tensor_bytes),
                count(lane.files, "file"),
            );
            if let Some(single) = &lane.single_file {
                let made = single.pipeline.as_deref().unwrap_or("a model folder");
                let predicts = single
                    .prediction_type
                    .as_deref()
                    .map(|p| format!(", prediction type {p}"))
                    .unwrap_or_default();
                println!(
                    "  a single-file checkpoint ({}): its Diffusers face {}@diffusers is {made}{predicts}",
                    single.converter, lane.lane
                );
            }
        }
        match report.new_objects {
            0 => println!(
                "nothing new stored: every object ({} of chunks) was in the store already",
                human(report.chunk_bytes)
            ),
            n => println!(
                "stored {} ({}, chunks and documents); the lanes' chunks total {}",
                count(n, "new object"),
                human(report.new_bytes),
                human(report.chunk_bytes)
            ),
        }
        if let Some(hub) = &report.hub {
            println!("recorded as hub repo {hub}");
        }
        for (path, why) in &report.skipped {
            eprintln!("tensorfs: skipped {path}: {why}");
        }
        for warning in &report.warnings {
            eprintln!("tensorfs: warning: {warning}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
