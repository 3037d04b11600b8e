//! `tensorfs rm REF [--lane LANE] [--dry-run] [--json]`: take a repo, a release, a release's
//! lane or a commit out of the store's refs. Only unreferences; `tensorfs gc` frees what
//! nothing else keeps.
//!
//! ```text
//! rm ORG/NAME                  the whole repo (its ref and hub record)
//! rm ORG/NAME@VERSION          one release     (--lane LANE: one lane of it)
//! rm ORG/NAME@<commit>         one commit of `commits` (64 hex digits or sha256:<hex>)
//! ```
//! A commit a release still names is refused, naming the release (remove it first); `latest`
//! is no revision of its own and is refused. A repo left naming no commit is removed whole.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use anyhow::{anyhow, bail};

use super::Cli;
use crate::format::{ObjectRef, Repo, Sha256};
use crate::revisions::{self, Revision, LATEST};

/// Arguments of `rm`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// org/name, org/name@<release version>, or org/name@<commit> (hex or sha256:<hex>).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// With a release: remove only this lane of it.
    #[arg(long)]
    pub lane: Option<String>,
    /// Say what would be removed; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `REF` asks to remove.
enum Removal {
    Repo,
    Release {
        version: String,
        lane: Option<String>,
    },
    Commit(Sha256),
}

pub fn run(cli: &Cli, args: &Args) -> anyhow::Result<ExitCode> {
    let store = cli.existing_store()?;
    let (name, removal) = parse(&args.reference, args.lane.as_deref())?;
    let current = store.repo(name)?.ok_or_else(|| {
        anyhow!(
            "no repo {name:?} in the store at {}",
            store.root().display()
        )
    })?;
    let (old, new) = if args.dry_run {
        let new = apply(&current, &removal).map_err(|why| anyhow!(why))?;
        (current, new)
    } else {
        store
            .edit_repo(name, |repo| apply(repo, &removal))?
            .ok_or_else(|| anyhow!("repo {name:?} was removed meanwhile"))?
    };
    let gone: Vec<ObjectRef> = old
        .roots()
        .filter(|c| new.as_ref().is_none_or(|n| !n.roots().any(|k| k == *c)))
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Commits no other repo names either are what a collection may free.
    let repos = store.repos()?;
    let elsewhere: BTreeSet<Sha256> = repos
        .iter()
        .filter(|r| !r.name.eq_ignore_ascii_case(name))
        .flat_map(|r| r.roots().map(|c| c.sha256).collect::<Vec<_>>())
        .collect();
    let unnamed: Vec<&ObjectRef> = gone
        .iter()
        .filter(|c| !elsewhere.contains(&c.sha256))
        .collect();
    if !args.dry_run && !unnamed.is_empty() {
        // Their uses go too (a use keeps a commit a week after its last use, a cache's rule);
        // so do those of their headers, unless a commit still named has the same one.
        let mut names: Vec<Sha256> = unnamed.iter().map(|c| c.sha256).collect();
        let kept_headers: BTreeSet<Sha256> = repos
            .iter()
            .flat_map(|r| r.roots().copied().collect::<Vec<_>>())
            .filter_map(|c| store.tree(&c).ok().map(|t| t.header().1.sha256))
            .collect();
        names.extend(
            unnamed
                .iter()
                .filter_map(|c| store.tree(c).ok().map(|t| t.header().1.sha256))
                .filter(|h| !kept_headers.contains(h)),
        );
        store.drop_uses(&names)?;
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let what = match (&removal, &new) {
        (_, None) => format!("repo {}", old.name),
        (Removal::Repo, Some(_)) => unreachable!("removing a repo leaves none"),
        (
            Removal::Release {
                version,
                lane: None,
            },
            _,
        ) => format!("release {version} of {}", old.name),
        (
            Removal::Release {
                version,
                lane: Some(lane),
            },
            _,
        ) => {
            format!("lane {lane} of release {version} of {}", old.name)
        }
        (Removal::Commit(c), _) => format!("commit sha256:{c} of {}", old.name),
    };
    // What `latest` shows before and after: a lane whose newest commit goes falls back to an
    // older one (or goes), which the mount and its views then show.
    let latest_of = |repo: &Repo| -> BTreeMap<String, ObjectRef> {
        revisions::lanes(repo, Revision::Latest, |c| store.tree(c).map(|t| t.lane))
            .map(|lanes| lanes.into_iter().collect())
            .unwrap_or_default()
    };
    let (before, after) = (
        latest_of(&old),
        new.as_ref().map(latest_of).unwrap_or_default(),
    );
    let moved: Vec<(String, Option<ObjectRef>)> = before
        .iter()
        .filter(|(lane, c)| after.get(*lane) != Some(c))
        .map(|(lane, _)| (lane.clone(), after.get(lane).copied()))
        .filter(|_| new.is_some())
        .collect();
    if args.json {
        let out = serde_json::json!({
            "repo": old.name,
            "dry_run": args.dry_run,
            "removed": what,
            "repo_removed": new.is_none(),
            "latest_changed": moved
                .iter()
                .map(|(lane, c)| (lane.clone(), c.map(|c| c.id())))
                .collect::<BTreeMap<_, _>>(),
            "commits_unreferenced": gone.iter().map(ObjectRef::id).collect::<Vec<_>>(),
            "commits_no_repo_names": unnamed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let left = match (&removal, &new) {
        (Removal::Repo, _) | (_, Some(_)) => String::new(),
        (_, None) => " (it named nothing else, so the repo goes too)".to_owned(),
    };
    println!("{verb} {what}{left}");
    for c in &gone {
        let note = match elsewhere.contains(&c.sha256) {
            true => " (another repo still names it)",
            false => "",
        };
        println!(
            "  {} {}{note}",
            if args.dry_run {
                "would unname"
            } else {
                "unnamed"
            },
            c.id()
        );
    }
    for (lane, now) in &moved {
        let shows = if args.dry_run { "would show" } else { "shows" };
        match now {
            Some(c) => println!(
                "  {}/latest/{lane} now {shows} the older {}",
                old.name,
                c.id()
            ),
            None => println!(
                "  {}/latest/{lane} now {shows} nothing: the lane is gone",
                old.name
            ),
        }
    }
    if !args.dry_run && !unnamed.is_empty() {
        println!(
            "`tensorfs gc` frees what only {} kept (objects stay an hour after their last write; \
             `gc --grace 0` frees them now)",
            old.name
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `org/name[@revision]` and `--lane` as a removal.
fn parse<'a>(reference: &'a str, lane: Option<&str>) -> anyhow::Result<(&'a str, Removal)> {
    if reference.starts_with("sha256:") {
        bail!(
            "{reference}: rm takes a commit out of a repo: name it as ORG/NAME@{reference} \
             (`tensorfs ls` shows which repos name it)"
        );
    }
    let (name, revision) = match reference.split_once('@') {
        Some((name, rev)) => (name, Some(rev)),
        None => (reference, None),
    };
    crate::format::names::split_repo_name(name).map_err(|e| anyhow!("{reference}: {e}"))?;
    let removal = match revision {
        None => Removal::Repo,
        Some(LATEST) => bail!(
            "{reference}: `latest` is not a revision of its own (it shows the newest release, or \
             each lane's newest commit); name the repo, a release or a commit"
        ),
        Some(rev) => match rev.strip_prefix("sha256:").unwrap_or(rev).parse::<Sha256>() {
            Ok(digest) => Removal::Commit(digest),
            Err(_) => Removal::Release {
                version: rev.to_owned(),
                lane: lane.map(str::to_owned),
            },
        },
    };
    if lane.is_some() && !matches!(removal, Removal::Release { .. }) {
        bail!(
            "{reference}: --lane takes one lane out of a release; name the release \
             ({name}@VERSION), or, for a repo without releases (a local import), the lane's \
             commit ({name}@<commit>, which `tensorfs inspect {name}` shows for each lane)"
        );
    }
    Ok((name, removal))
}

/// The repo without what `removal` names (`None`: nothing left, or the whole repo), or why not.
fn apply(repo: &Repo, removal: &Removal) -> Result<Option<Repo>, String> {
    let mut new = repo.clone();
    match removal {
        Removal::Repo => return Ok(None),
        Removal::Release { version, lane } => {
            let Some(i) = new.releases.iter().position(|r| &r.version == version) else {
                let versions: Vec<&str> =
                    repo.releases.iter().map(|r| r.version.as_str()).collect();
                return Err(format!(
                    "{} has no release {version:?} (releases: {}; a commit is named by its 64 hex digits)",
                    repo.name,
                    if versions.is_empty() { "none".to_owned() } else { versions.join(", ") }
                ));
            };
            match lane {
                None => {
                    new.releases.remove(i);
                }
                Some(lane) => {
                    let release = &mut new.releases[i];
                    if release.lanes.remove(lane).is_none() {
                        return Err(format!(
                            "release {version} of {} has no lane {lane:?} (lanes: {})",
                            repo.name,
                            release.lanes.keys().cloned().collect::<Vec<_>>().join(", ")
                        ));
                    }
                    if release.lanes.is_empty() {
                        new.releases.remove(i);
                    }
                }
            }
        }
        Removal::Commit(digest) => {
            let naming: Vec<String> = repo
                .releases
                .iter()
                .flat_map(|r| {
                    r.lanes
                        .iter()
                        .filter(|(_, c)| c.sha256 == *digest)
                        .map(move |(lane, _)| format!("{}@{} (lane {lane})", repo.name, r.version))
                })
                .collect();
            if !naming.is_empty() {
                return Err(format!(
                    "commit sha256:{digest} is named by release {}: remove the release first \
                     (`tensorfs rm {}`, or `--lane` for one lane)",
                    naming.join(", "),
                    naming[0].split(' ').next().unwrap_or_default()
                ));
            }
            let before = new.commits.len();
            new.commits.retain(|c| c.sha256 != *digest);
            if new.commits.len() == before {
                return Err(format!("{} names no commit sha256:{digest}", repo.name));
            }
        }
    }
    let names_any = new.roots().next().is_some();
    Ok(names_any.then_some(new))
}
