//! A store directory as an origin (distribution.md §8): `file:///dir`. Its files are the static
//! origin's layout, so a web server (nginx) or a bucket sync can serve the directory as it is.
//!
//! - Reads: blobs and repo documents straight from the files.
//! - Writes: objects enter by the store's one door (temp file, hashed against the digest,
//!   `fsync`, read-only, rename), and a commit is added to the repo document under the store's
//!   record lock. It is an origin: nothing in it expires or is evicted.

use std::fs::File;
use std::io::{self, Read, Write};

use bytes::Bytes;
use reqwest::Url;

use super::origin::{Access, FetchError, FetchResult, Head, Origin, Put, Recorded, Sink};
use crate::format::{ObjectRef, Repo, Sha256};
use crate::store::{Store, StoreError};

/// Bytes read from a blob per write to the sink.
const PIECE_BYTES: usize = 1 << 20;

/// A store directory (see the module doc).
#[derive(Debug)]
pub struct DirOrigin {
    url: Url,
    store: Store,
}

impl DirOrigin {
    /// The store at `url` (`file:///dir`): made when absent or empty if `access` writes, else
    /// it must exist.
    ///
    /// # Errors
    /// `url` is not a local `file://` path, or the directory is not (and cannot become) a store.
    pub fn new(url: &str, access: Access) -> FetchResult<DirOrigin> {
        let refused = |why: String| FetchError::Refused {
            url: url.to_owned(),
            why,
        };
        let parsed = Url::parse(url).map_err(|e| refused(format!("not a URL: {e}")))?;
        if parsed.scheme() != "file" || parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(refused("not file:///path".into()));
        }
        let path = parsed
            .to_file_path()
            .map_err(|()| refused("not a local path (file:///path)".into()))?;
        let store = match access {
            Access::Read => Store::open_existing(&path),
            Access::Write => Store::open(&path),
        }
        .map_err(|e| backend(url, e))?;
        Ok(DirOrigin { url: parsed, store })
    }
}

fn backend(what: &str, error: StoreError) -> FetchError {
    FetchError::Backend {
        what: what.to_owned(),
        source: Box::new(error),
    }
}

#[async_trait::async_trait]
impl Origin for DirOrigin {
    fn url(&self) -> &Url {
        &self.url
    }

    async fn models(&self) -> FetchResult<Option<Vec<String>>> {
        let repos = tokio::task::block_in_place(|| self.store.repos())
            .map_err(|e| backend("listing the repos", e))?;
        Ok(Some(
            repos
                .into_iter()
                .map(|r| r.name)
                .filter(|name| !crate::remote::is_local(name))
                .collect(),
        ))
    }

    async fn repo_document(&self, name: &str) -> FetchResult<Option<Repo>> {
        tokio::task::block_in_place(|| self.store.repo(name))
            .map_err(|e| backend(&format!("reading the repo document of {name}"), e))
    }

    async fn head(&self, sha256: &Sha256) -> FetchResult<Head> {
        let path = self.store.object_path(&ObjectRef {
            sha256: *sha256,
            length: 0,
        });
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(Head::Present { length: meta.len() }),
            Ok(_) => Ok(Head::Absent { put_to: None }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Head::Absent { put_to: None }),
            Err(source) => Err(backend(
                &format!("HEAD sha256:{sha256}"),
                StoreError::Io {
                    op: "stat",
                    path,
                    source,
                },
            )),
        }
    }

    async fn fetch(
        &self,
        object: &ObjectRef,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
    ) -> FetchResult<()> {
        let what = format!("GET {}", object.id());
        let mut file: File = match self.store.open_object(object) {
            Ok(file) => file,
            Err(StoreError::Absent { .. }) => {
                return Err(FetchError::NotFound {
                    what,
                    message: String::new(),
                })
            }
            Err(e) => return Err(backend(&what, e)),
        };
        let mut piece = vec![0u8; PIECE_BYTES.min(object.length as usize)];
        let mut left = object.length;
        while left > 0 {
            let take = piece.len().min(left as usize);
            tokio::task::block_in_place(|| file.read_exact(&mut piece[..take])).map_err(
                |source| {
                    backend(
                        &what,
                        StoreError::Io {
                            op: "read",
                            path: self.store.object_path(object),
                            source,
                        },
                    )
                },
            )?;
            sink.write(&piece[..take])
                .map_err(|source| FetchError::Sink {
                    what: what.clone(),
                    source,
                })?;
            left -= take as u64;
            progress(take as u64);
        }
        Ok(())
    }

    async fn put(&self, object: &ObjectRef, bytes: Bytes, _: Option<Url>) -> FetchResult<Put> {
        if self.store.contains(object) {
            return Ok(Put::Present);
        }
        let what = format!("PUT {}", object.id());
        tokio::task::block_in_place(|| {
            let mut writer = self.store.writer()?;
            writer.write_all(&bytes).map_err(|source| StoreError::Io {
                op: "write",
                path: self.store.root().join("tmp"),
                source,
            })?;
            writer.finish(Some(object))
        })
        .map_err(|e| backend(&what, e))?;
        Ok(Put::Stored)
    }

    async fn record(&self, name: &str, commit: &ObjectRef) -> FetchResult<Recorded> {
        let what = format!("recording commit {} in {name}", commit.id());
        if !self.store.contains(commit) {
            return Err(FetchError::Protocol {
                what,
                why: "the commit's tree is not in the store".into(),
            });
        }
        let mut added = false;
        tokio::task::block_in_place(|| {
            self.store.update_repo(name, |old| {
                let mut repo = old.unwrap_or_else(|| Repo {
                    name: name.to_owned(),
                    releases: vec![],
                    commits: vec![],
                });
                added = repo.add_commit(*commit);
                repo
            })
        })
        .map_err(|e| backend(&what, e))?;
        Ok(match added {
            true => Recorded::New,
            false => Recorded::Held,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_file_urls_are_taken() {
        for bad in [
            "not a url",
            "https://example.com/store",
            "file:///srv/store?x=1",
            "file:///srv/store#x",
            "file://elsewhere/srv/store",
        ] {
            let err = DirOrigin::new(bad, Access::Write).unwrap_err();
            assert!(matches!(err, FetchError::Refused { .. }), "{bad}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let absent = Url::from_directory_path(dir.path().join("absent")).unwrap();
        let err = DirOrigin::new(absent.as_str(), Access::Read).unwrap_err();
        assert!(matches!(err, FetchError::Backend { .. }), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn absent_objects_are_not_found_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let url = Url::from_directory_path(dir.path()).unwrap();
        let origin = DirOrigin::new(url.as_str(), Access::Write).unwrap();
        let object = ObjectRef::of(b"a tree nobody sent");
        let err = origin
            .fetch(&object, &mut Vec::new(), &|_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::NotFound { .. }), "{err}");
        assert_eq!(
            origin.head(&object.sha256).await.unwrap(),
            Head::Absent { put_to: None }
        );
        let err = origin.record("acme/model", &object).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "recording commit {} in acme/model: the commit's tree is not in the store",
                object.id()
            )
        );
        assert!(origin.repo_document("acme/model").await.unwrap().is_none());
    }
}
