//! A model's routes (distribution.md §2, §4) and repo documents (§1, §8).
//!
//! - `GET v1/models`: the names of the models the caller may read, `{"models": [{"name"}]}`
//!   (this server's addition, so a lazy mount can list what an endpoint serves; the protocol
//!   itself lists nothing).
//! - `GET v1/models/<org>/<name>/resolve`: `release` (none: the newest) and `lane` name a
//!   commit. Without a lane, a release with several is chosen from by this server's simple rule,
//!   not the Hub's `selection.json` table: with `plain=true` only plain lanes (no encoded
//!   tensor); with `free_vram`, only lanes whose stored bytes fit; of those, the most stored
//!   bytes. A model without releases answers members its newest commit (in `lane`, if given).
//! - `POST v1/models/<org>/<name>/commits`: a tree whose closure is here and which has a lane is
//!   recorded in the store's repo document (`201`; `200` when the repo names it already).
//! - `GET refs/<org>/<name>.json`: the document as stored for members, its releases only for
//!   anonymous callers.

use std::collections::BTreeSet;
use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{empty, json_response, ApiError, Body, Caller, Server};
use crate::format::{Body as TensorBody, Header, ObjectRef, Repo};
use crate::remote::{decode_segment, CommitRequest, ModelList, Resolved, WireRef, LOCAL_ORG};
use crate::store::{Store, StoreError};

/// The most bytes a commit request's body may have.
const COMMIT_REQUEST_BYTES: usize = 64 << 10;

/// The most missing digests a `409 closure_incomplete` lists (§4).
const MISSING_LISTED: usize = 1000;

/// What a resolve asks for.
#[derive(Debug, Default)]
struct Query {
    release: Option<String>,
    lane: Option<String>,
    free_vram: Option<u64>,
    plain: bool,
}

impl Query {
    fn parse(query: Option<&str>) -> Result<Query, ApiError> {
        let mut out = Query::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode_segment(&value.replace('+', " "))
                .ok_or_else(|| ApiError::invalid(format!("query {key}: bad percent-encoding")))?;
            let value = Some(value).filter(|v| !v.is_empty());
            match key {
                "release" => out.release = value,
                "lane" => out.lane = value,
                "free_vram" => {
                    out.free_vram = value
                        .map(|v| v.parse::<u64>())
                        .transpose()
                        .map_err(|_| ApiError::invalid("free_vram is a number of bytes"))?
                }
                "plain" => out.plain = value.as_deref() == Some("true"),
                // `gpus` and what a later minor adds: this server picks without them.
                _ => {}
            }
        }
        Ok(out)
    }
}

/// `GET v1/models`: every repo but `local/` ones; anonymous callers only those with releases.
pub(super) async fn list(server: &Arc<Server>, caller: Caller) -> Result<Response<Body>, ApiError> {
    let store = server.store.clone();
    let repos = tokio::task::spawn_blocking(move || store.repos())
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    let names = repos
        .into_iter()
        .filter(|repo| !crate::remote::is_local(&repo.name))
        .filter(|repo| caller == Caller::Member || !repo.releases.is_empty())
        .map(|repo| repo.name);
    let body = serde_json::to_vec(&ModelList::of(names)).expect("JSON values serialize");
    Ok(json_response(StatusCode::OK, body))
}

/// `GET …/resolve`.
pub(super) async fn resolve(
    server: &Arc<Server>,
    caller: Caller,
    name: &str,
    request: &Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let query = Query::parse(request.uri().query())?;
    let (store, name) = (server.store.clone(), name.to_owned());
    let resolved = tokio::task::spawn_blocking(move || pick(&store, caller, &name, &query))
        .await
        .map_err(ApiError::internal)??;
    let body = serde_json::to_vec(&resolved).expect("JSON values serialize");
    Ok(json_response(StatusCode::OK, body))
}

fn pick(store: &Store, caller: Caller, name: &str, query: &Query) -> Result<Resolved, ApiError> {
    let absent = || ApiError::not_found(format!("no model {name}"));
    let repo = read_repo(store, name)?.ok_or_else(absent)?;
    let release = match &query.release {
        Some(version) => {
            let found = repo.releases.iter().find(|r| &r.version == version);
            Some(found.ok_or_else(|| {
                let versions: Vec<&str> =
                    repo.releases.iter().map(|r| r.version.as_str()).collect();
                ApiError::not_found(format!(
                    "{name} has no release {version:?} (it has: {})",
                    versions.join(", ")
                ))
            })?)
        }
        None => repo.releases.last(),
    };
    let Some(release) = release else {
        // No release: a member gets the newest commit (in the lane asked for).
        if caller == Caller::Anonymous {
            return Err(absent());
        }
        for commit in repo.commits.iter().rev() {
            let tree = store.tree(commit).map_err(ApiError::internal)?;
            let lane = tree.lane.clone().unwrap_or_default();
            if query.lane.as_ref().is_none_or(|wanted| *wanted == lane) {
                return Ok(Resolved {
                    release: String::new(),
                    lane,
                    commit: WireRef(*commit),
                    header: WireRef(*tree.header().1),
                    reasons: vec![],
                });
            }
        }
        return Err(ApiError::not_found(match &query.lane {
            Some(lane) => format!("{name} has no commit in lane {lane:?}"),
            None => format!("{name} has no commit"),
        }));
    };
    let mut reasons = Vec::new();
    let chosen = match &query.lane {
        Some(lane) => {
            let commit = release.lanes.get(lane).ok_or_else(|| {
                let lanes: Vec<&str> = release.lanes.keys().map(String::as_str).collect();
                ApiError::not_found(format!(
                    "{name}@{} has no lane {lane:?} (it has: {})",
                    release.version,
                    lanes.join(", ")
                ))
            })?;
            (lane.clone(), *commit)
        }
        None if release.lanes.len() == 1 => {
            let (lane, commit) = release.lanes.iter().next().expect("one lane");
            (lane.clone(), *commit)
        }
        None => choose_lane(store, release, query, &mut reasons)?,
    };
    let (lane, commit) = chosen;
    let tree = store.tree(&commit).map_err(ApiError::internal)?;
    Ok(Resolved {
        release: release.version.clone(),
        lane,
        commit: WireRef(commit),
        header: WireRef(*tree.header().1),
        reasons,
    })
}

/// Of a release's lanes, the one this server picks for `query` (see the module doc).
fn choose_lane(
    store: &Store,
    release: &crate::format::Release,
    query: &Query,
    reasons: &mut Vec<String>,
) -> Result<(String, ObjectRef), ApiError> {
    let mut best: Option<(u64, String, ObjectRef)> = None;
    for (lane, commit) in &release.lanes {
        let header = store.commit(commit).map_err(ApiError::internal)?.header;
        let bytes = stored_bytes(&header);
        if query.plain && !is_plain(&header) {
            reasons.push(format!("{lane}: encoded tensors, and plain=true"));
            continue;
        }
        if let Some(free) = query.free_vram.filter(|free| bytes > *free) {
            reasons.push(format!("{lane}: {bytes} bytes do not fit in {free}"));
            continue;
        }
        if let Some((most, other, _)) = &best {
            if *most >= bytes {
                reasons.push(format!("{lane}: {bytes} bytes, fewer than {other}"));
                continue;
            }
            reasons.push(format!("{other}: {most} bytes, fewer than {lane}"));
        }
        best = Some((bytes, lane.clone(), *commit));
    }
    let (_, lane, commit) = best.ok_or_else(|| {
        ApiError::not_found(format!(
            "no lane of release {} fits: {}",
            release.version,
            reasons.join("; ")
        ))
        .with_detail(serde_json::json!({ "reasons": reasons }))
    })?;
    Ok((lane, commit))
}

/// The bytes a header's tensors store.
fn stored_bytes(header: &Header) -> u64 {
    let tensors = header.components.iter().flat_map(|c| &c.tensors);
    tensors
        .map(|t| match &t.body {
            TensorBody::Plain(location) => location.length,
            TensorBody::Encoded { parts, .. } => parts.iter().map(|p| p.location.length).sum(),
        })
        .sum()
}

/// Whether no tensor of the header is encoded.
fn is_plain(header: &Header) -> bool {
    let mut tensors = header.components.iter().flat_map(|c| &c.tensors);
    tensors.all(|t| matches!(t.body, TensorBody::Plain(_)))
}

/// The store's repo document of `name`, or a `500` naming a ref the server cannot read.
fn read_repo(store: &Store, name: &str) -> Result<Option<Repo>, ApiError> {
    match store.repo(name) {
        Ok(repo) => Ok(repo),
        Err(StoreError::Ref(why)) => Err(ApiError::invalid(why)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// `POST …/commits`.
pub(super) async fn commit(
    server: &Arc<Server>,
    name: &str,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let body = Limited::new(request.into_body(), COMMIT_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|e| ApiError::invalid(format!("reading the request: {e}")))?
        .to_bytes();
    let asked: CommitRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(format!(
            "the body is not {{\"commit\": {{sha256, length}}}}: {e}"
        ))
    })?;
    let (store, name) = (server.store.clone(), name.to_owned());
    let commit = asked.commit.0;
    let added = tokio::task::spawn_blocking(move || record(&store, &name, commit))
        .await
        .map_err(ApiError::internal)??;
    let status = match added {
        true => StatusCode::CREATED,
        false => StatusCode::OK,
    };
    let body = serde_json::to_vec(&CommitRequest {
        commit: WireRef(commit),
    })
    .expect("JSON values serialize");
    Ok(json_response(status, body))
}

/// Checks commit `commit` of `name` (§4) and records it: true when the repo did not name it.
fn record(store: &Store, name: &str, commit: ObjectRef) -> Result<bool, ApiError> {
    let incomplete = |missing: Vec<ObjectRef>| {
        let listed: Vec<String> = missing
            .iter()
            .take(MISSING_LISTED)
            .map(|o| o.sha256.hex())
            .collect();
        ApiError::new(
            StatusCode::CONFLICT,
            "closure_incomplete",
            format!(
                "{} objects of the commit's closure are not here",
                missing.len()
            ),
        )
        .with_detail(serde_json::json!({ "missing": listed, "count": missing.len() }))
    };
    if !store.contains(&commit) {
        return Err(incomplete(vec![commit]));
    }
    let tree = store.tree(&commit).map_err(|e| match e {
        StoreError::Format { source, .. } => {
            ApiError::invalid(format!("{} is not a tree: {source}", commit.id()))
        }
        e => ApiError::internal(e),
    })?;
    if tree.lane.is_none() {
        return Err(ApiError::invalid(
            "the tree has no lane: a commit without one is a machine's own, never published (spec §3)",
        ));
    }
    let header_ref = *tree.header().1;
    let mut missing: Vec<ObjectRef> = tree
        .repo_files()
        .map(|(_, o)| *o)
        .chain([header_ref])
        .filter(|o| !store.contains(o))
        .collect();
    if missing.contains(&header_ref) {
        return Err(incomplete(missing));
    }
    let header = store.commit(&commit).map_err(|e| match e {
        StoreError::Format { source, .. } => {
            ApiError::invalid(format!("the header {}: {source}", header_ref.id()))
        }
        e => ApiError::internal(e),
    })?;
    let cited: BTreeSet<ObjectRef> = header.header.objects().copied().collect();
    missing.extend(cited.into_iter().filter(|o| !store.contains(o)));
    if !missing.is_empty() {
        return Err(incomplete(missing));
    }
    let mut added = false;
    store
        .update_repo(name, |old| {
            let mut repo = old.unwrap_or_else(|| Repo {
                name: name.to_ascii_lowercase(),
                releases: vec![],
                commits: vec![],
            });
            added = repo.add_commit(commit);
            repo
        })
        .map_err(ApiError::internal)?;
    if added {
        tracing::info!("recorded commit {} of {name}", commit.id());
    }
    Ok(added)
}

/// `GET refs/<org>/<name>.json`: the segments are the store's own file names.
pub(super) async fn repo_document(
    server: &Arc<Server>,
    caller: Caller,
    org: &str,
    file: &str,
    head: bool,
) -> Result<Response<Body>, ApiError> {
    let absent = || ApiError::not_found("no such repo document");
    let stored_name = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-%".contains(&b))
    };
    let model = file.strip_suffix(".json").ok_or_else(absent)?;
    if !stored_name(org) || !stored_name(model) || org == LOCAL_ORG {
        return Err(absent());
    }
    let path = server.store.root().join("refs").join(org).join(file);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(absent()),
        Err(e) => return Err(ApiError::internal(format!("{}: {e}", path.display()))),
    };
    let mut repo = Repo::from_json(&bytes)
        .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
    if crate::remote::is_local(&repo.name) {
        return Err(absent());
    }
    let bytes = match caller {
        Caller::Member => bytes,
        Caller::Anonymous => {
            if repo.releases.is_empty() {
                return Err(absent());
            }
            repo.commits.clear();
            repo.to_json()
        }
    };
    if head {
        let mut response = empty(StatusCode::OK);
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, bytes.len().into());
        return Ok(response);
    }
    Ok(json_response(StatusCode::OK, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_queries_read_their_fields_and_ignore_the_rest() {
        let q = Query::parse(Some(
            "release=1.0&lane=bf16&gpus=8.9,9.0&free_vram=100&plain=true&x=1",
        ))
        .unwrap();
        assert_eq!(q.release.as_deref(), Some("1.0"));
        assert_eq!(q.lane.as_deref(), Some("bf16"));
        assert_eq!(q.free_vram, Some(100));
        assert!(q.plain);
        let q = Query::parse(Some("release=&lane=a%2Bb")).unwrap();
        assert_eq!(q.release, None);
        assert_eq!(q.lane.as_deref(), Some("a+b"));
        assert!(Query::parse(Some("free_vram=lots")).is_err());
        assert!(Query::parse(None).unwrap().release.is_none());
    }
}
