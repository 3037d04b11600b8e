//! An S3 bucket as an origin (distribution.md §8): `s3://bucket/prefix` holds the store layout
//! under its prefix, `blobs/<aa>/<bb>/<sha256>` and `refs/<org>/<name>.json`, so it serves
//! downloads as a static origin and takes uploads. Other S3-compatible servers work alike.
//!
//! - **Client.** `object_store`'s S3 client (SigV4), configured from the standard AWS
//!   environment variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_REGION` or `AWS_DEFAULT_REGION` (default `us-east-1`), and `AWS_ENDPOINT_URL` for a
//!   server other than AWS. Requests are path-style (`AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`
//!   changes that). As for HTTP endpoints, plain `http://` is taken on loopback only. Without
//!   credentials in the environment requests go unsigned, which a public bucket's reads take.
//! - **Writes.** A blob goes with `If-None-Match: *` and `x-amz-checksum-sha256`: the bucket
//!   checks the bytes against the digest and never replaces an object; `412` is present. A
//!   commit is added to the repo document by a conditional write (`If-Match` its ETag, or
//!   `If-None-Match: *` for a new one), read and written again when another writer came first.
//! - **Reads.** The client retries failed requests and resumes a body that breaks off by range.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as Key;
use object_store::{
    ClientOptions, ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload,
    UpdateVersion,
};
use reqwest::Url;

use super::client::is_loopback;
use super::origin::{
    parse_repo_document, repo_document_key, FetchError, FetchResult, Head, Origin, Put, Recorded,
    Sink,
};
use super::{blob_key, MAX_DOCUMENT_BYTES};
use crate::format::{ObjectRef, Repo, Sha256};

/// Attempts at the read-modify-write of a repo document before giving up.
const RECORD_ATTEMPTS: u32 = 8;

/// A bucket and a prefix (see the module doc).
#[derive(Debug)]
pub struct S3Origin {
    /// `s3://bucket/prefix`; the prefix is its path.
    url: Url,
    bucket: AmazonS3,
}

/// The first of `names` set (and not empty) in the environment.
fn env_var(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// The prefix of `s3://bucket/prefix`: its segments joined by `/`, without leading or trailing
/// `/` (percent-encoded as in the URL); empty for none.
fn prefix_of(url: &Url) -> &str {
    url.path().trim_matches('/')
}

impl S3Origin {
    /// The bucket and prefix `url` (`s3://bucket/prefix`) names, with the client the AWS
    /// environment variables describe. Nothing is sent yet.
    ///
    /// # Errors
    /// `url` is not `s3://bucket[/prefix]`, `AWS_ENDPOINT_URL` is plain `http://` off loopback,
    /// or the client cannot be built.
    pub fn new(url: &str) -> FetchResult<S3Origin> {
        let refused = |why: String| FetchError::Refused {
            url: url.to_owned(),
            why,
        };
        let parsed = Url::parse(url).map_err(|e| refused(format!("not a URL: {e}")))?;
        let bucket = parsed.host_str().filter(|b| !b.is_empty());
        let Some(bucket) = bucket.filter(|_| parsed.scheme() == "s3") else {
            return Err(refused("not s3://bucket[/prefix]".into()));
        };
        if parsed.query().is_some() || parsed.fragment().is_some() || parsed.port().is_some() {
            return Err(refused(
                "an s3:// URL has no port, query or fragment".into(),
            ));
        }
        let prefix = prefix_of(&parsed);
        if !prefix.is_empty() {
            Key::parse(prefix).map_err(|e| refused(format!("the prefix: {e}")))?;
        }
        let mut options = ClientOptions::new()
            .with_user_agent(reqwest::header::HeaderValue::from_static(concat!(
                "tensorfs/",
                env!("CARGO_PKG_VERSION")
            )))
            // Objects are up to 5 GiB: no limit on a whole request, only on silence.
            .with_timeout_disabled()
            .with_connect_timeout(Duration::from_secs(15))
            .with_read_timeout(Duration::from_secs(60));
        let server = env_var(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]);
        if let Some(server) = &server {
            let server_url = Url::parse(server)
                .map_err(|e| refused(format!("AWS_ENDPOINT_URL {server:?}: {e}")))?;
            match server_url.scheme() {
                "https" => {}
                "http" if is_loopback(&server_url) => options = options.with_allow_http(true),
                _ => {
                    return Err(refused(format!(
                        "AWS_ENDPOINT_URL {server}: plain http is allowed only on loopback \
                         (127.0.0.0/8, ::1, localhost); use https://"
                    )))
                }
            }
        }
        let credentials = env_var(&[
            "AWS_ACCESS_KEY_ID",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ]);
        // The S3 client's TLS is rustls with ring, as the HTTP client's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_client_options(options)
            .with_checksum_algorithm(object_store::aws::Checksum::SHA256)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_skip_signature(credentials.is_none());
        if let Some(server) = server {
            builder = builder.with_endpoint(server);
        }
        let bucket = builder
            .build()
            .map_err(|e| refused(format!("the S3 client cannot start: {e}")))?;
        Ok(S3Origin {
            url: parsed,
            bucket,
        })
    }

    /// The bucket key of `relative` (a path of the store layout) under the prefix.
    fn key(&self, relative: &str) -> FetchResult<Key> {
        let full = match prefix_of(&self.url) {
            "" => relative.to_owned(),
            prefix => format!("{prefix}/{relative}"),
        };
        Key::parse(&full).map_err(|e| FetchError::Protocol {
            what: format!("{}: key {full:?}", self.url),
            why: e.to_string(),
        })
    }

    /// The client's error as a fetch error: absence as [`FetchError::NotFound`].
    fn error(what: &str, error: object_store::Error) -> FetchError {
        match error {
            object_store::Error::NotFound { .. } => FetchError::NotFound {
                what: what.to_owned(),
                message: String::new(),
            },
            other => FetchError::Backend {
                what: what.to_owned(),
                source: Box::new(other),
            },
        }
    }

    /// The repo document of `name` with its version for a conditional write, if any.
    async fn read_repo(&self, name: &str) -> FetchResult<Option<(Repo, UpdateVersion)>> {
        let what = format!("reading the repo document of {name}");
        let key = repo_document_key(name, &what)?;
        let found = match self.bucket.get(&self.key(&key)?).await {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Self::error(&what, e)),
        };
        if found.meta.size > MAX_DOCUMENT_BYTES {
            return Err(FetchError::Protocol {
                what,
                why: format!("{} bytes is over the document limit", found.meta.size),
            });
        }
        let version = UpdateVersion {
            e_tag: found.meta.e_tag.clone(),
            version: found.meta.version.clone(),
        };
        let bytes = found.bytes().await.map_err(|e| Self::error(&what, e))?;
        let repo = parse_repo_document(name, &bytes, &what)?;
        Ok(Some((repo, version)))
    }
}

#[async_trait::async_trait]
impl Origin for S3Origin {
    fn url(&self) -> &Url {
        &self.url
    }

    /// The models whose repo documents lie under `refs/` (`refs/<org>/<name>.json`).
    async fn models(&self) -> FetchResult<Option<Vec<String>>> {
        let what = "listing refs/";
        let refs = self.key("refs")?;
        let mut listing = self.bucket.list(Some(&refs));
        let mut names = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| Self::error(what, e))?;
            let path = meta.location.as_ref();
            let Some(rest) = path.split("refs/").last() else {
                continue;
            };
            if let Some(name) = rest.strip_suffix(".json") {
                if name.matches('/').count() == 1 && !super::is_local(name) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        Ok(Some(names))
    }

    async fn repo_document(&self, name: &str) -> FetchResult<Option<Repo>> {
        Ok(self.read_repo(name).await?.map(|(repo, _)| repo))
    }

    async fn head(&self, sha256: &Sha256) -> FetchResult<Head> {
        let what = format!("HEAD sha256:{sha256}");
        match self.bucket.head(&self.key(&blob_key(sha256))?).await {
            Ok(meta) => Ok(Head::Present { length: meta.size }),
            Err(object_store::Error::NotFound { .. }) => Ok(Head::Absent { put_to: None }),
            Err(e) => Err(Self::error(&what, e)),
        }
    }

    async fn fetch(
        &self,
        object: &ObjectRef,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
    ) -> FetchResult<()> {
        let what = format!("GET {}", object.id());
        let key = self.key(&blob_key(&object.sha256))?;
        let found = self
            .bucket
            .get(&key)
            .await
            .map_err(|e| Self::error(&what, e))?;
        if found.meta.size != object.length {
            return Err(FetchError::Protocol {
                what,
                why: format!("the bucket holds {} bytes", found.meta.size),
            });
        }
        let mut stream = found.into_stream();
        let mut received = 0u64;
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| Self::error(&what, e))?;
            if received + piece.len() as u64 > object.length {
                return Err(FetchError::Protocol {
                    what,
                    why: format!("more than its {} bytes arrived", object.length),
                });
            }
            sink.write(&piece).map_err(|source| FetchError::Sink {
                what: what.clone(),
                source,
            })?;
            received += piece.len() as u64;
            progress(piece.len() as u64);
        }
        match received == object.length {
            true => Ok(()),
            false => Err(FetchError::Protocol {
                what,
                why: format!("the body ended at byte {received} of {}", object.length),
            }),
        }
    }

    async fn put(&self, object: &ObjectRef, bytes: Bytes, _: Option<Url>) -> FetchResult<Put> {
        let what = format!("PUT {}", object.id());
        let key = self.key(&blob_key(&object.sha256))?;
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .bucket
            .put_opts(&key, PutPayload::from(bytes), create)
            .await
        {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => return Ok(Put::Present),
            Err(e) => return Err(Self::error(&what, e)),
        }
        match self.head(&object.sha256).await? {
            Head::Present { length } if length == object.length => Ok(Put::Stored),
            found => Err(FetchError::Protocol {
                what,
                why: format!("after the PUT the bucket answers {found:?}"),
            }),
        }
    }

    async fn record(&self, name: &str, commit: &ObjectRef) -> FetchResult<Recorded> {
        let what = format!("recording commit {} in {name}", commit.id());
        let key = self.key(&repo_document_key(name, &what)?)?;
        for _ in 0..RECORD_ATTEMPTS {
            let (mut repo, mode) = match self.read_repo(name).await? {
                Some((repo, version)) => (repo, PutMode::Update(version)),
                None => (
                    Repo {
                        name: name.to_owned(),
                        releases: vec![],
                        commits: vec![],
                    },
                    PutMode::Create,
                ),
            };
            if !repo.add_commit(*commit) {
                return Ok(Recorded::Held);
            }
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            let document = PutPayload::from(Bytes::from(repo.to_json()));
            match self.bucket.put_opts(&key, document, options).await {
                Ok(_) => return Ok(Recorded::New),
                // Another writer changed the document since it was read: read it again.
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => continue,
                Err(e) => return Err(Self::error(&what, e)),
            }
        }
        Err(FetchError::Protocol {
            what,
            why: format!("the repo document changed under each of {RECORD_ATTEMPTS} writes"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_urls_are_read_and_bad_ones_refused() {
        let origin = S3Origin::new("s3://models/mirror/a/").unwrap();
        assert_eq!(prefix_of(&origin.url), "mirror/a");
        assert_eq!(
            origin.key("refs/acme/x.json").unwrap().as_ref(),
            "mirror/a/refs/acme/x.json"
        );
        let bare = S3Origin::new("s3://models").unwrap();
        assert_eq!(bare.key("blobs/aa/bb/c").unwrap().as_ref(), "blobs/aa/bb/c");
        for bad in [
            "s3://",
            "s3:///x",
            "s3://b/x?y=1",
            "s3://b:9/x",
            "https://b/x",
        ] {
            let err = S3Origin::new(bad).unwrap_err();
            assert!(matches!(err, FetchError::Refused { .. }), "{bad}: {err}");
        }
    }
}
