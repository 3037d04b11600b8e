//! What the downloader and the uploader need of an endpoint, whatever serves it (distribution.md
//! §2, §3, §4, §8).
//!
//! ```text
//! Origin ─┬─ Endpoint   https:// (http:// on loopback): a distribution/1 server or a static host
//!         ├─ S3Origin   s3://bucket/prefix: a bucket holding the store layout (SigV4)
//!         └─ DirOrigin  file:///dir: a store directory
//! ```
//!
//! - Reading: the resolve route (static origins have none: `None`), a repo document, a blob's
//!   length, and a blob streamed into a [`Sink`]. Whoever admits received bytes checks their
//!   length and SHA-256.
//! - Writing: a blob by `PUT` with `If-None-Match: *` and its SHA-256 (an object present is
//!   success), and a commit recorded: by the server's commits route, or, without a server, in
//!   the repo document at `refs/<org>/<name>.json` (§8).
//!
//! The errors of every origin ([`FetchError`]) and where received bytes go ([`Sink`]) are
//! defined here, beside the trait; [`super::connect::open`] picks the implementation from the
//! URL's scheme.

use std::time::Duration;

use bytes::Bytes;
use reqwest::Url;

use super::{Resolved, MAX_DOCUMENT_BYTES};
use crate::format::{ObjectRef, Repo, Sha256};

/// Why a request to an endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL is not one this client talks to.
    #[error("{url}: {why}")]
    Refused {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The endpoint does not have it (`404`, `410`, or the resolve route's envelope).
    #[error("{what}: not found at the endpoint{}", message_suffix(.message))]
    NotFound {
        /// What was asked.
        what: String,
        /// The server's message, if any.
        message: String,
    },
    /// A final answer other than success.
    #[error("{what}: the endpoint answered {status}{}", message_suffix(.message))]
    Status {
        /// What was asked.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The server's message (its error envelope's, else the start of its body).
        message: String,
    },
    /// Attempts failed until the deadline passed without a byte received.
    #[error("{what}: gave up after {attempts} attempts and {:.1} s without progress: {last}", .waited.as_secs_f64())]
    GaveUp {
        /// What was asked.
        what: String,
        /// Attempts made in a row without progress.
        attempts: u32,
        /// How long no byte arrived.
        waited: Duration,
        /// The last failure.
        last: String,
    },
    /// The bytes broke the protocol (too many, a wrong range, a bad document).
    #[error("{what}: {why}")]
    Protocol {
        /// What was asked.
        what: String,
        /// What was wrong.
        why: String,
    },
    /// Writing received bytes failed.
    #[error("{what}: writing: {source}")]
    Sink {
        /// What was being received.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The client of an origin that is not HTTP (an S3 bucket, a store directory) failed.
    #[error("{what}: {source}")]
    Backend {
        /// What was asked.
        what: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub(crate) fn message_suffix(message: &str) -> String {
    match message.is_empty() {
        true => String::new(),
        false => format!(": {message}"),
    }
}

/// Result of the client.
pub type FetchResult<T> = Result<T, FetchError>;

/// Where received bytes go.
pub trait Sink {
    /// Takes the next bytes of the object.
    ///
    /// # Errors
    /// The bytes cannot be kept.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()>;
}

impl Sink for Vec<u8> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// What a `HEAD` of a blob found (§3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Head {
    /// The endpoint holds an object of this many bytes under the digest.
    Present {
        /// Its length.
        length: u64,
    },
    /// The endpoint does not hold it (or does not let the caller see it).
    Absent {
        /// Where to `PUT` it instead of the blob URL (a `404`'s `Location`), if the endpoint
        /// said.
        put_to: Option<Url>,
    },
}

/// How the upload of one object ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The endpoint took the bytes.
    Stored,
    /// The endpoint had the object already (`412`: objects are content-addressed, §3).
    Present,
}

/// How recording a commit ended (§4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The repo names the commit now (`201`).
    New,
    /// The repo named it already (`200`).
    Held,
}

/// An endpoint seen by the downloader and the uploader (see the module doc).
#[async_trait::async_trait]
pub trait Origin: Send + Sync + std::fmt::Debug {
    /// The endpoint's URL, for messages.
    fn url(&self) -> &Url;

    /// How long a copy with wrong bytes is asked for again before the fetch fails (an HTTP
    /// endpoint's deadline; zero for storage that hands back what it holds).
    fn retry_deadline(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The wait before asking again after `copies` wrong copies.
    fn retry_wait(&self, copies: u32) -> std::time::Duration {
        std::time::Duration::from_millis(100 * u64::from(copies.min(20)))
    }

    /// The models the endpoint lists (`org/name`), or `None` for one that lists nothing (the
    /// protocol has no listing route; a lazy mount then shows the models named to it).
    ///
    /// # Errors
    /// A failure reaching the endpoint.
    async fn models(&self) -> FetchResult<Option<Vec<String>>> {
        Ok(None)
    }

    /// The commit the resolve route names, or `None` for an endpoint without one (a static
    /// origin, which the client resolves from its repo document). Only a distribution server
    /// has the route, so `None` is the default.
    ///
    /// # Errors
    /// No such model, release or lane, or a failure.
    async fn resolve(
        &self,
        _name: &str,
        _release: Option<&str>,
        _lane: Option<&str>,
    ) -> FetchResult<Option<Resolved>> {
        Ok(None)
    }

    /// The repo document at `refs/<org>/<name>.json`, if any.
    ///
    /// # Errors
    /// A failure, or a document that is not a repo of that name.
    async fn repo_document(&self, name: &str) -> FetchResult<Option<Repo>>;

    /// Whether the endpoint holds object `sha256`, and where to put it when not.
    ///
    /// # Errors
    /// A failure other than absence.
    async fn head(&self, sha256: &Sha256) -> FetchResult<Head>;

    /// The length of object `sha256` at the endpoint, or `None` when absent.
    ///
    /// # Errors
    /// A failure other than absence.
    async fn length_of(&self, sha256: &Sha256) -> FetchResult<Option<u64>> {
        Ok(match self.head(sha256).await? {
            Head::Present { length } => Some(length),
            Head::Absent { .. } => None,
        })
    }

    /// Streams `object` into `sink`; `progress` hears of every byte. Exactly `object.length`
    /// bytes reach the sink; their digest is the caller's to check.
    ///
    /// # Errors
    /// Absent, refused, more bytes than its length, or retries ran out.
    async fn fetch(
        &self,
        object: &ObjectRef,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
    ) -> FetchResult<()>;

    /// A document (tree, header) read whole into memory and verified against `object`.
    ///
    /// # Errors
    /// Over the 16 MiB document limit (§7), absent, or not the bytes `object` names.
    async fn document(&self, object: &ObjectRef) -> FetchResult<Vec<u8>> {
        let what = format!("object {}", object.id());
        check_document_length(object, &what)?;
        let mut bytes = Vec::with_capacity(object.length as usize);
        self.fetch(object, &mut bytes, &|_| {}).await?;
        let found = ObjectRef::of(&bytes);
        if found != *object {
            return Err(FetchError::Protocol {
                what,
                why: format!("the bytes received are {found}"),
            });
        }
        Ok(bytes)
    }

    /// Uploads `bytes` as `object` (§3): a `PUT` with its length, `x-amz-checksum-sha256` and
    /// `If-None-Match: *`, to `put_to` (what a `HEAD` answered) or the blob's own place; then a
    /// confirming `HEAD` where the endpoint has one. The caller sent the first `HEAD` and
    /// vouches that `bytes` are `object`'s.
    ///
    /// # Errors
    /// The endpoint refused the bytes, does not hold them afterwards, or failed.
    async fn put(&self, object: &ObjectRef, bytes: Bytes, put_to: Option<Url>) -> FetchResult<Put>;

    /// Records `commit` (a tree whose closure was uploaded) as a commit of repo `name`, among
    /// those no release names (§4).
    ///
    /// # Errors
    /// The endpoint refused (its closure is incomplete, no write access) or failed.
    async fn record(&self, name: &str, commit: &ObjectRef) -> FetchResult<Recorded>;
}

/// Whether an origin is opened to read only or to write as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Downloads: a `file://` directory must be a store already.
    Read,
    /// Uploads: a `file://` directory is made a store when absent or empty.
    Write,
}

/// Refuses `object` as a document (tree, header) when it is over [`MAX_DOCUMENT_BYTES`]
/// (16 MiB, §7), before a byte of it is fetched.
///
/// # Errors
/// [`FetchError::Protocol`] about `what` when `object.length` is over the limit.
pub(crate) fn check_document_length(object: &ObjectRef, what: &str) -> FetchResult<()> {
    match object.length > MAX_DOCUMENT_BYTES {
        true => Err(FetchError::Protocol {
            what: what.to_owned(),
            why: format!(
                "{} bytes is over the {MAX_DOCUMENT_BYTES}-byte document limit",
                object.length
            ),
        }),
        false => Ok(()),
    }
}

/// Where repo `name`'s document lies under a static origin: `refs/<org>/<name>.json` (§8).
///
/// # Errors
/// [`FetchError::Protocol`] about `what` when `name` is not `<org>/<name>`.
pub(crate) fn repo_document_key(name: &str, what: &str) -> FetchResult<String> {
    crate::store::ref_key(name).map_err(|e| FetchError::Protocol {
        what: what.to_owned(),
        why: e.to_string(),
    })
}

/// Repo `name`'s document read from `bytes`, the body of its `refs/<org>/<name>.json`.
///
/// # Errors
/// [`FetchError::Protocol`] about `what`: the bytes are not a repo document, or it names
/// another repo (names compare case-insensitively, as the store's do).
pub(crate) fn parse_repo_document(name: &str, bytes: &[u8], what: &str) -> FetchResult<Repo> {
    let protocol = |why: String| FetchError::Protocol {
        what: what.to_owned(),
        why,
    };
    let repo = Repo::from_json(bytes).map_err(|e| protocol(e.to_string()))?;
    if !repo.name.eq_ignore_ascii_case(name) {
        return Err(protocol(format!("the document names repo {:?}", repo.name)));
    }
    Ok(repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_documents_must_name_the_repo_asked_for() {
        let json = Repo {
            name: "Acme/Model".into(),
            releases: vec![],
            commits: vec![],
        }
        .to_json();
        let what = "reading the repo document of acme/model";
        let repo = parse_repo_document("acme/model", &json, what).unwrap();
        assert_eq!(repo.name, "Acme/Model");
        let err = parse_repo_document("acme/other", &json, what).unwrap_err();
        assert!(matches!(err, FetchError::Protocol { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!("{what}: the document names repo \"Acme/Model\"")
        );
        let err = parse_repo_document("acme/model", b"<html>", what).unwrap_err();
        assert!(matches!(err, FetchError::Protocol { .. }), "{err}");
        let err = repo_document_key("no-slash", what).unwrap_err();
        assert!(matches!(err, FetchError::Protocol { .. }), "{err}");
        assert_eq!(
            repo_document_key("acme/model", what).unwrap(),
            crate::store::ref_key("acme/model").unwrap()
        );
    }

    #[test]
    fn documents_over_the_limit_are_refused_before_fetching() {
        let at_limit = ObjectRef {
            sha256: Sha256([7; 32]),
            length: MAX_DOCUMENT_BYTES,
        };
        check_document_length(&at_limit, "object x").unwrap();
        let over = ObjectRef {
            length: MAX_DOCUMENT_BYTES + 1,
            ..at_limit
        };
        let err = check_document_length(&over, "object x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "object x: 16777217 bytes is over the 16777216-byte document limit"
        );
    }
}
