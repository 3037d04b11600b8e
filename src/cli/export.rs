//! `tensorfs export REF DIR`: the lane folder's files, as the mount shows them.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use super::{count, Cli};
use crate::io::{BlobReader, BlobReaderConfig};
use crate::layout::{Face, LaneFile, LaneView};
use crate::revisions::resolve_one;

/// Arguments of `export`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// org/name[@revision] or sha256:<commit>.
    #[arg(value_name = "REF")]
    pub reference: String,
    /// The folder to write; it must not exist or be empty.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The lane, when the revision has several.
    #[arg(long)]
    pub lane: Option<String>,
    /// Write the decoded view: every encoded tensor as a plain tensor of its logical dtype
    /// (what the mount shows under `<lane>@decoded`).
    #[arg(long)]
    pub decode: bool,
    /// Write a single-file checkpoint's lane as a Diffusers folder (what the mount shows under
    /// `<lane>@diffusers`): `model_index.json`, each component's config and weights.
    #[arg(long, conflicts_with = "decode")]
    pub diffusers: bool,
    /// Write a Diffusers pipeline's lane as the single file its components make (what the
    /// mount shows under `<lane>@single`: `model.safetensors`, in the CompVis/ComfyUI layout).
    #[arg(long, conflicts_with_all = ["decode", "diffusers"])]
    pub single: bool,
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let (target, commit) = resolve_one(&store, &args.reference, args.lane.as_deref())?;
    // No collection removes what is being copied.
    let _hold = store.hold(&commit.closure())?;
    if args.single {
        if let Err(why) =
            crate::layout::convert::reverse(crate::layout::convert::table(), &commit.header)
        {
            bail!(
                "{} lane {} has no single-file face: {why}",
                args.reference,
                target.lane
            );
        }
    }
    let face = match (args.decode, args.diffusers) {
        _ if args.single => Face::Single,
        (true, _) => Face::Decoded,
        (false, true) if !LaneView::is_single_file(&commit.header) => bail!(
            "{} lane {} has no Diffusers face: it is not a single-file checkpoint converted to \
             Diffusers components when it was imported (a folder is one already; a file the \
             import did not convert says why in its warning); export it without --diffusers",
            args.reference,
            target.lane
        ),
        (false, true) => Face::Diffusers,
        (false, false) => Face::AsImported,
    };
    let view = LaneView::build_face(&commit.id, &commit.tree, &commit.header, face)?;
    let existed = args.dir.exists();
    if existed {
        let entries =
            fs::read_dir(&args.dir).with_context(|| format!("reading {}", args.dir.display()))?;
        if entries.count() > 0 {
            bail!(
                "{} is not empty; export writes into a new or empty folder",
                args.dir.display()
            );
        }
    }
    fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let reader = BlobReader::new(store, BlobReaderConfig::default());
    for file in &view.files {
        if let Err(e) = write_file(&reader, file, &args.dir) {
            // Leave no partial export behind: the folder was new or empty.
            let cleanup = match existed {
                true => fs::read_dir(&args.dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .try_for_each(|entry| {
                        let path = entry.path();
                        if path.is_dir() {
                            fs::remove_dir_all(path)
                        } else {
                            fs::remove_file(path)
                        }
                    }),
                false => fs::remove_dir_all(&args.dir),
            };
            if let Err(c) = cleanup {
                eprintln!(
                    "tensorfs: could not remove the partial export in {}: {c}",
                    args.dir.display()
                );
            }
            return Err(e.context(format!("exporting {}", file.path)));
        }
    }
    println!(
        "exported {} lane {} ({}) into {}",
        target.repo.as_deref().unwrap_or(&commit.id.id()),
        target.lane,
        count(view.files.len(), "file"),
        args.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes one file under `root`. Its path was checked to be relative with no `..` when the view
/// was built; each folder is created here, so nothing lands outside `root`.
fn write_file(reader: &BlobReader, file: &LaneFile, root: &Path) -> anyhow::Result<()> {
    let dest = root.join(&file.path);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut out: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&dest)?;
    let size = file.content.size();
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < size {
        let n = file.content.read_at(reader, at, &mut buf)?;
        if n == 0 {
            bail!("{} ended at {at} of {size} bytes", file.path);
        }
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    out.sync_all()?;
    Ok(())
}
