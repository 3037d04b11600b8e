//! `tensorfs ls` and `tensorfs inspect REF`.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde_json::json;

use super::Cli;
use super::{count, human};
use crate::format::{Body, Header, ObjectRef, Value};
use crate::layout::LaneView;
use crate::revisions::resolve;
use crate::revisions::revisions;
use crate::store::Store;

/// Arguments of `ls`.
#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// List what the mount's ComfyUI view (MOUNT/@comfyui) shows of each repo's latest lanes,
    /// and the weights files it leaves out, with why.
    #[arg(long)]
    pub comfyui: bool,
}

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// org/name[@revision] or sha256:<commit>.
    #[arg(value_name = "REF")]
    pub reference: String,
    /// Only this lane.
    #[arg(long)]
    pub lane: Option<String>,
    /// Print JSON: every component, tensor and file.
    #[arg(long)]
    pub json: bool,
}

/// What `ls` says where nothing is imported yet.
fn nothing_imported(root: &std::path::Path) -> String {
    format!(
        "nothing imported yet into {}: start with `tensorfs import SRC --name local/NAME`",
        root.display()
    )
}

pub fn ls(cli: &Cli, args: &LsArgs) -> anyhow::Result<ExitCode> {
    let root = cli.store_root()?;
    let empty_folder = std::fs::read_dir(&root).is_ok_and(|mut d| d.next().is_none());
    if !root.exists() || empty_folder {
        // No store yet is an empty listing, not a mistake (a mistyped path is one only for
        // verbs that name something in it).
        if args.json {
            println!("[]");
        }
        eprintln!("tensorfs: {}", nothing_imported(&root));
        return Ok(ExitCode::SUCCESS);
    }
    let store = cli.existing_store()?;
    if args.comfyui {
        return ls_comfyui(&store, args.json);
    }
    // The hub identity of each commit that has one (`store::hub`): `ORG/NAME@REV`.
    let mut hub_of = std::collections::HashMap::new();
    for record in store.hub_records()? {
        for rev in &record.revisions {
            let id = match &rev.revision {
                Some(r) => format!("{}@{r}", record.hub_id),
                None => record.hub_id.clone(),
            };
            for c in &rev.commits {
                hub_of.insert((record.repo.to_ascii_lowercase(), *c), id.clone());
            }
        }
    }
    // A lane's size: its commit's closure (what it takes with nothing shared), read once.
    let mut sizes: std::collections::HashMap<ObjectRef, Option<u64>> = Default::default();
    let mut rows = Vec::new();
    for repo in store.repos()? {
        let revs = match revisions(&store, &repo) {
            Ok(revs) => revs,
            Err(e) => {
                eprintln!("tensorfs: repo {}: {e}", repo.name);
                continue;
            }
        };
        for (revision, lanes) in revs {
            for (lane, commit) in lanes {
                let hub = hub_of.get(&(repo.name.to_ascii_lowercase(), commit));
                let bytes = *sizes.entry(commit).or_insert_with(|| {
                    let closure: std::collections::BTreeSet<ObjectRef> =
                        store.commit(&commit).ok()?.closure().into_iter().collect();
                    Some(closure.iter().map(|o| o.length).sum())
                });
                rows.push(json!({"repo": repo.name, "revision": revision, "lane": lane, "commit": commit.id(), "bytes": bytes, "hub": hub}));
            }
        }
    }
    if rows.is_empty() && !args.json {
        eprintln!("tensorfs: {}", nothing_imported(store.root()));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            let hub = r["hub"]
                .as_str()
                .map_or(String::new(), |h| format!("\thub {h}"));
            let size = r["bytes"]
                .as_u64()
                .map_or_else(|| "unreadable".to_owned(), human);
            println!(
                "{}/{}/{}\t{}\t{size}{hub}",
                r["repo"].as_str().unwrap_or(""),
                r["revision"].as_str().unwrap_or(""),
                r["lane"].as_str().unwrap_or(""),
                r["commit"].as_str().unwrap_or("")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ls --comfyui`: each shown entry (`folder/path`, its repo, lane and file) and each file
/// left out, as [`crate::layout::comfyui::entries`] sorts them.
fn ls_comfyui(store: &Store, json: bool) -> anyhow::Result<ExitCode> {
    use crate::layout::comfyui::{self, Shows};
    let lane_of = |c: &crate::format::ObjectRef| store.tree(c).map(|t| t.lane);
    // Every repo's entries by folder, in repo order (the order that claims names).
    let mut by_folder: BTreeMap<String, Vec<(String, serde_json::Value)>> = BTreeMap::new();
    let mut rows = Vec::new();
    for repo in store.repos()? {
        let lanes = crate::revisions::lanes(&repo, crate::revisions::Revision::Latest, lane_of);
        let mut lanes = match lanes {
            Ok(lanes) => lanes,
            Err(e) => {
                eprintln!("tensorfs: repo {}: {e}", repo.name);
                continue;
            }
        };
        comfyui::order_lanes(&repo, &mut lanes, lane_of);
        for (i, (lane, commit)) in lanes.iter().enumerate() {
            let commit = match store.commit(commit) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tensorfs: repo {} lane {lane}: {e}", repo.name);
                    continue;
                }
            };
            let mut shown = Vec::new();
            let mut left_out = Vec::new();
            for &face in comfyui::faces(&commit.header) {
                match LaneView::build_face(&commit.id, &commit.tree, &commit.header, face) {
                    Ok(view) => {
                        let (s, l) = comfyui::entries(&view, &repo.name, lane, i == 0);
                        shown.extend(s);
                        left_out.extend(l);
                    }
                    Err(e) => eprintln!("tensorfs: repo {} lane {lane}: {e}", repo.name),
                }
            }
            for e in shown {
                let file = match e.shows {
                    Shows::File(f) => f,
                    Shows::Lane => String::new(),
                };
                let row = json!({"shown": format!("{}/{}", e.folder, e.path), "repo": repo.name, "lane": lane, "file": file});
                by_folder.entry(e.folder).or_default().push((e.path, row));
            }
            for l in left_out {
                rows.push(json!({"shown": null, "repo": repo.name, "lane": lane, "file": l.file, "why": l.why}));
            }
        }
    }
    for entries in by_folder.into_values() {
        let paths: Vec<&str> = entries.iter().map(|(p, _)| p.as_str()).collect();
        let lost = comfyui::collisions(&paths);
        for (i, (_, row)) in entries.iter().enumerate() {
            let mut row = row.clone();
            if let Some(&(_, by)) = lost.iter().find(|(l, _)| *l == i) {
                let why = format!(
                    "its name {} is taken by {}",
                    row["shown"], entries[by].1["repo"]
                );
                row["shown"] = serde_json::Value::Null;
                row["why"] = why.into();
            }
            rows.push(row);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in &rows {
        let (repo, lane, file) = (
            r["repo"].as_str().unwrap_or(""),
            r["lane"].as_str().unwrap_or(""),
            r["file"].as_str().unwrap_or(""),
        );
        match r["shown"].as_str() {
            Some(shown) => println!("{shown}	{repo}/latest/{lane}/{file}"),
            None => println!(
                "left out	{repo}/latest/{lane}/{file}	{}",
                r["why"].as_str().unwrap_or("")
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let mut out = Vec::new();
    for target in resolve(&store, &args.reference, args.lane.as_deref())? {
        let commit = store.commit(&target.commit)?;
        let view = LaneView::build(&commit.id, &commit.tree, &commit.header)?;
        out.push((target, commit, view));
    }
    if args.json {
        let docs: Vec<_> = out
            .iter()
            .map(|(t, c, view)| {
                json!({
                    "repo": t.repo,
                    "lane": t.lane,
                    "commit": c.id.id(),
                    "header": c.header_ref.id(),
                    "header_json": header_json(&c.header),
                    "files": view.files.iter().map(|f| json!({"path": f.path, "size": f.content.size()})).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&docs)?);
        return Ok(ExitCode::SUCCESS);
    }
    for (t, c, view) in &out {
        let h = &c.header;
        match &t.repo {
            Some(repo) => println!(
                "{repo} lane {} (commit {}, header {})",
                t.lane,
                c.id.id(),
                c.header_ref.id()
            ),
            None => println!(
                "commit {} lane {} (header {})",
                c.id.id(),
                t.lane,
                c.header_ref.id()
            ),
        }
        if let Some(p) = &h.pipeline {
            println!("  pipeline {}", class_text(&p.class));
        }
        for comp in &h.components {
            let mut kinds: BTreeMap<String, (usize, u64)> = BTreeMap::new();
            for tensor in &comp.tensors {
                let (kind, bytes) = match &tensor.body {
                    Body::Plain(at) => (tensor.dtype.name().to_owned(), at.length),
                    Body::Encoded { encoding, parts } => (
                        h.encodings[*encoding].scheme.clone(),
                        parts.iter().map(|p| p.location.length).sum(),
                    ),
                };
                let e = kinds.entry(kind).or_default();
                e.0 += 1;
                e.1 += bytes;
            }
            let total: u64 = kinds.values().map(|k| k.1).sum();
            println!(
                "  {}: {} — {}, {}, {}",
                comp.name,
                class_text(&comp.class),
                count(comp.tensors.len(), "tensor"),
                human(total),
                count(comp.assets.len(), "asset")
            );
            for (kind, (n, bytes)) in kinds {
                println!("    {n} × {kind} ({})", human(bytes));
            }
        }
        let chunk_bytes: u64 = h.chunks.iter().map(|c| c.length).sum();
        println!(
            "  {}, {}",
            count(h.chunks.len(), "chunk"),
            human(chunk_bytes)
        );
        println!("  {}:", count(view.files.len(), "file"));
        for f in &view.files {
            println!("    {} ({})", f.path, human(f.content.size()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A readable JSON projection of a header (byte strings as hex).
fn header_json(h: &Header) -> serde_json::Value {
    let value = Value::to_serde;
    let components: Vec<_> = h
        .components
        .iter()
        .map(|c| {
            let tensors: Vec<_> = c
                .tensors
                .iter()
                .map(|t| match &t.body {
                    Body::Plain(at) => json!({"key": t.key, "dtype": t.dtype.name(), "shape": t.shape, "location": [at.chunk, at.offset, at.length]}),
                    Body::Encoded { encoding, parts } => json!({
                        "key": t.key, "dtype": t.dtype.name(), "shape": t.shape,
                        "scheme": h.encodings[*encoding].scheme,
                        "parts": parts.iter().map(|p| json!({"role": p.role, "dtype": p.dtype.name(), "shape": p.shape, "location": [p.location.chunk, p.location.offset, p.location.length]})).collect::<Vec<_>>(),
                    }),
                })
                .collect();
            json!({
                "name": c.name,
                "class": [c.class.library, c.class.version, c.class.name],
                "config_file": c.config_name(),
                "config": value(&Value::map(c.config.clone())),
                "assets": c.assets.iter().map(|(k, o)| (k.clone(), json!({"sha256": o.sha256.hex(), "length": o.length}))).collect::<serde_json::Map<_, _>>(),
                "tensors": tensors,
            })
        })
        .collect();
    json!({
        "format": h.format,
        "chunks": h.chunks.iter().map(|o| json!({"sha256": o.sha256.hex(), "length": o.length})).collect::<Vec<_>>(),
        "encodings": h.encodings.iter().map(|e| json!({"scheme": e.scheme, "params": value(&Value::map(e.params.clone()))})).collect::<Vec<_>>(),
        "pipeline": h.pipeline.as_ref().map(|p| json!({"class": [p.class.library, p.class.version, p.class.name], "config": value(&Value::map(p.config.clone()))})),
        "components": components,
        "metadata_keys": h.metadata.keys().collect::<Vec<_>>(),
    })
}

/// `library version Class`, or `unknown class`.
fn class_text(class: &crate::format::ClassRef) -> String {
    match (class.library.as_str(), class.version.as_str()) {
        ("", _) => "unknown class".into(),
        (library, "") => format!("{library} {}", class.name),
        (library, version) => format!("{library} {version} {}", class.name),
    }
}
