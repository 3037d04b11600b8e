//! Uploads through an HTTP endpoint (distribution.md §3, §4): the `HEAD` of an object, its
//! `PUT` and confirming `HEAD`, and the `POST` that records a commit.
//!
//! - A `PUT` carries `Content-Length`, `x-amz-checksum-sha256` (base64 of the digest) and
//!   `If-None-Match: *`, so a presigned URL that signed them takes the same request. It goes to
//!   the `Location` of the first `HEAD`'s `404`, else the blob URL; the token only when that is
//!   the endpoint's origin (§5). `200`/`201` are taken, `412` means present, which is success.
//!   A redirect is not followed: the body would go somewhere nobody named.
//! - The confirming `HEAD`: the object at its length is done; a `404` whose `Location` was not
//!   sent to yet asks for the bytes there too; one already sent to fails the upload.
//! - Transport failures and passing statuses are asked again, as reads are; a `PUT` repeated
//!   after an answer that was lost is a `412`, and a repeated `POST` a `200`.

use std::future::Future;

use base64::Engine as _;
use bytes::Bytes;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, IF_NONE_MATCH, LOCATION};
use reqwest::{RequestBuilder, Url};

use super::{
    check_scheme, envelope, read_limited, transport_error, Attempt, BlobHead, Endpoint, FetchError,
    FetchResult, Patience,
};
use crate::format::{ObjectRef, Sha256};
use crate::remote::origin::{Head, Put, Recorded};
use crate::remote::{blob_key, model_key, CommitRequest, WireRef};

/// What an endpoint without upload routes is told to be.
const NO_UPLOADS: &str =
    "this endpoint takes no uploads: a static host, or `tensorfs serve` without --write";

impl Endpoint {
    /// Whether the endpoint holds object `sha256` (`HEAD`, §3), and where a `404` asks for it.
    ///
    /// # Errors
    /// Another status, an answer without a length, or retries ran out.
    pub async fn head(&self, sha256: &Sha256) -> FetchResult<Head> {
        let what = format!("HEAD sha256:{sha256}");
        let response = match self.head_blob(sha256, &what).await? {
            BlobHead::Present(length) => return Ok(Head::Present { length }),
            BlobHead::Absent(response) => response,
        };
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok());
        let put_to = match location {
            None => None,
            Some(location) => {
                let url = response
                    .url()
                    .join(location)
                    .map_err(|e| FetchError::Protocol {
                        what: what.clone(),
                        why: format!("Location {location:?}: {e}"),
                    })?;
                check_scheme(&url).map_err(|why| FetchError::Protocol {
                    what: what.clone(),
                    why: format!("Location {url}: {why}"),
                })?;
                Some(url)
            }
        };
        Ok(Head::Absent { put_to })
    }

    /// Uploads `bytes` as `object`: `PUT`, then the confirming `HEAD` (see the module doc).
    ///
    /// # Errors
    /// `bytes` are not `object.length` long, the endpoint refused them (`400 digest_mismatch`,
    /// `401`, `405` from a read-only endpoint, `413`), does not hold them afterwards, or failed.
    pub async fn put(
        &self,
        object: &ObjectRef,
        bytes: Bytes,
        put_to: Option<Url>,
    ) -> FetchResult<Put> {
        let what = format!("PUT {}", object.id());
        if bytes.len() as u64 != object.length {
            return Err(FetchError::Protocol {
                what,
                why: format!("{} bytes to send, not {}", bytes.len(), object.length),
            });
        }
        let mut target = put_to.unwrap_or_else(|| self.at(&blob_key(&object.sha256)));
        let mut sent: Vec<Url> = Vec::new();
        loop {
            if self.put_once(&target, object, &bytes, &what).await? == Put::Present {
                return Ok(Put::Present);
            }
            sent.push(target);
            target = match self.head(&object.sha256).await? {
                Head::Present { length } if length == object.length => return Ok(Put::Stored),
                Head::Present { length } => {
                    return Err(FetchError::Protocol {
                        what,
                        why: format!("after the PUT the endpoint holds {length} bytes"),
                    })
                }
                Head::Absent { put_to: Some(next) } if !sent.contains(&next) => next,
                Head::Absent { put_to } => {
                    return Err(FetchError::Protocol {
                        what,
                        why: match put_to {
                            Some(url) => format!("the endpoint asks for the bytes at {url} again"),
                            None => "the endpoint does not hold the object after the PUT".into(),
                        },
                    })
                }
            };
        }
    }

    /// One `PUT` of `bytes` to `url`, asked again while the failures pass.
    async fn put_once(
        &self,
        url: &Url,
        object: &ObjectRef,
        bytes: &Bytes,
        what: &str,
    ) -> FetchResult<Put> {
        let checksum = &base64::engine::general_purpose::STANDARD.encode(object.sha256.0);
        self.retrying(what, move || async move {
            let request = self
                .http
                .put(url.clone())
                .header(CONTENT_LENGTH, bytes.len())
                .header("x-amz-checksum-sha256", checksum)
                .header(IF_NONE_MATCH, "*")
                .body(bytes.clone());
            let response = self.send_write(request, url).await?;
            match response.status().as_u16() {
                200 | 201 | 204 => Ok(Put::Stored),
                412 => Ok(Put::Present),
                _ => Err(self.write_failure(response, what).await),
            }
        })
        .await
    }

    /// Records `commit` as a commit of repo `name` (`POST …/commits`, §4).
    ///
    /// # Errors
    /// `409 closure_incomplete` (objects of its closure are missing), `401`, another status,
    /// or retries ran out.
    pub async fn record(&self, name: &str, commit: &ObjectRef) -> FetchResult<Recorded> {
        let what = format!("recording commit {} in {name}", commit.id());
        let key = model_key(name, "commits").ok_or_else(|| FetchError::Protocol {
            what: what.clone(),
            why: "not <org>/<name>".into(),
        })?;
        let (url, what) = (&self.at(&key), &what);
        let body = &serde_json::to_vec(&CommitRequest {
            commit: WireRef(*commit),
        })
        .expect("a commit request serializes");
        self.retrying(what, move || async move {
            let request = self
                .http
                .post(url.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            let response = self.send_write(request, url).await?;
            match response.status().as_u16() {
                201 => Ok(Recorded::New),
                200 => Ok(Recorded::Held),
                _ => Err(self.write_failure(response, what).await),
            }
        })
        .await
    }

    /// The failure a write's answer is, as a read's would be, except that an endpoint without
    /// upload routes (`405`, `501`, or a `404` without an error envelope: a static host) is said
    /// to take no uploads.
    async fn write_failure(&self, response: reqwest::Response, what: &str) -> Attempt {
        let status = response.status();
        if !matches!(status.as_u16(), 404 | 405 | 501) {
            return self.failure(status, response, what).await;
        }
        let body = read_limited(response, 64 << 10).await.unwrap_or_default();
        let message = match envelope(&body) {
            Some(message) if status.as_u16() == 404 => {
                return Attempt::Fail(FetchError::NotFound {
                    what: what.to_owned(),
                    message,
                })
            }
            Some(message) => format!("{message} ({NO_UPLOADS})"),
            None => NO_UPLOADS.to_owned(),
        };
        Attempt::Fail(FetchError::Status {
            what: what.to_owned(),
            status: status.as_u16(),
            message,
        })
    }

    /// Sends `request` (a write to `url`) once, with the token only when `url` is on the
    /// endpoint's origin (§5). Redirects are not followed (see the module doc); any status is
    /// returned.
    ///
    /// # Errors
    /// [`Attempt::Again`] when the request fails in transport, which may pass.
    async fn send_write(
        &self,
        request: RequestBuilder,
        url: &Url,
    ) -> Result<reqwest::Response, Attempt> {
        let request = match (&self.token, url.origin() == self.base.origin()) {
            (Some(token), true) => request.bearer_auth(token),
            _ => request,
        };
        request.send().await.map_err(|e| Attempt::Again {
            why: transport_error(&e),
            wait: None,
        })
    }

    /// Runs `attempt` until it ends in an answer or a final failure, waiting between attempts
    /// that may pass, until [`ClientConfig::deadline`](super::ClientConfig) passes without an
    /// answer.
    async fn retrying<T, F, A>(&self, what: &str, mut attempt: F) -> FetchResult<T>
    where
        F: FnMut() -> A,
        A: Future<Output = Result<T, Attempt>>,
    {
        let mut patience = Patience::new();
        loop {
            match attempt().await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::Again { why, wait }) => {
                    let pause = patience.again(self, wait, what, why)?;
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}
