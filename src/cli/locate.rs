//! `tensorfs locate`: where a tensor's bytes lie in the store.
//!
//! ```text
//! tensorfs locate PATH TENSOR          PATH: a .safetensors file of a mount (asks its daemon)
//! tensorfs locate REF FILE TENSOR      FILE: a path in REF's lane folder (reads the store)
//! ```

use std::fs::File;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::json;

use super::Cli;
use crate::extents::{self, ioctl, Located};
use crate::layout::{Face, LaneView};
use crate::revisions::resolve_one;

/// Arguments of `locate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A .safetensors file in a mounted lane folder (then TENSOR), or a checkpoint:
    /// org/name[@revision] or sha256:<commit> (then FILE and TENSOR).
    #[arg(value_name = "PATH|REF")]
    pub target: String,
    /// The tensor (after PATH), or the file's path in the lane folder (after REF).
    #[arg(value_name = "TENSOR|FILE")]
    pub second: String,
    /// The tensor, after REF FILE.
    #[arg(value_name = "TENSOR")]
    pub tensor: Option<String>,
    /// With REF: the lane, when the revision has several.
    #[arg(long)]
    pub lane: Option<String>,
    /// With REF: FILE is in the decoded view (the mount's `<lane>@decoded`).
    #[arg(long)]
    pub decode: bool,
    /// With REF: FILE is in a single file's Diffusers folder (the mount's `<lane>@diffusers`).
    #[arg(long, conflicts_with = "decode")]
    pub diffusers: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let located = match &args.tensor {
        None => {
            if args.lane.is_some() || args.decode || args.diffusers {
                bail!(
                    "--lane, --decode and --diffusers go with `locate REF FILE TENSOR`, not a \
                     mounted PATH"
                );
            }
            let file =
                File::open(&args.target).with_context(|| format!("opening {}", args.target))?;
            ioctl::query(&file, &args.target, &args.second)?
        }
        Some(tensor) => {
            let store = cli.existing_store()?;
            let (target, commit) = resolve_one(&store, &args.target, args.lane.as_deref())?;
            let (face, suffix) = match (args.decode, args.diffusers) {
                (true, _) => (Face::Decoded, crate::fs::DECODED_SUFFIX),
                (false, true) => (Face::Diffusers, crate::fs::DIFFUSERS_SUFFIX),
                (false, false) => (Face::AsImported, ""),
            };
            let view = LaneView::build_face(&commit.id, &commit.tree, &commit.header, face)?;
            let lane = format!("{}{suffix}", target.lane);
            extents::locate(&store, &view, &args.second, tensor)
                .with_context(|| format!("{} lane {lane}", args.target))?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&located))?);
    } else {
        print!("{}", to_text(&located));
    }
    Ok(ExitCode::SUCCESS)
}

/// The answer as JSON: the tensor, its encoding (`null` when plain; params as a JSON object),
/// and each part with its byte range in the file and its extents.
fn to_json(l: &Located) -> serde_json::Value {
    let encoding = l.encoding.as_ref().map(|e| {
        let params = serde_json::from_str(&e.params).unwrap_or(json!(e.params));
        json!({"scheme": e.scheme, "params": params})
    });
    let parts: Vec<_> = l
        .parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let extents: Vec<_> = l
                .part_extents(i)
                .iter()
                .map(|x| {
                    json!({
                        "blob": x.blob.id(),
                        "blob_length": x.blob.length,
                        "path": x.path,
                        "offset": x.offset,
                        "length": x.length,
                        "file_offset": x.file_offset,
                    })
                })
                .collect();
            json!({
                "role": p.role,
                "dtype": p.dtype.name(),
                "shape": p.shape,
                "file_range": [p.file_range.start, p.file_range.end],
                "extents": extents,
            })
        })
        .collect();
    json!({
        "file": l.file,
        "key": l.key,
        "dtype": l.dtype.name(),
        "shape": l.shape,
        "encoding": encoding,
        "parts": parts,
    })
}

/// The answer for people: the tensor, then each part and its extents, one a line.
fn to_text(l: &Located) -> String {
    let encoding = match &l.encoding {
        None => "plain".to_owned(),
        Some(e) => format!("{} {}", e.scheme, e.params),
    };
    let mut out = format!(
        "{}: {} {} {:?} {encoding}\n",
        l.file,
        l.key,
        l.dtype.name(),
        l.shape
    );
    for (i, p) in l.parts.iter().enumerate() {
        let n = p.extents.len();
        out.push_str(&format!(
            "part {i} {} {} {:?}: file bytes {}..{}, {n} extent{}\n",
            p.role,
            p.dtype.name(),
            p.shape,
            p.file_range.start,
            p.file_range.end,
            if n == 1 { "" } else { "s" }
        ));
        for x in l.part_extents(i) {
            out.push_str(&format!(
                "  {} offset {} length {} (file offset {})\n",
                x.path.display(),
                x.offset,
                x.length,
                x.file_offset
            ));
        }
    }
    out
}
