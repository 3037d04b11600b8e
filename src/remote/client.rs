//! One endpoint seen from a downloader (distribution.md §2, §5, §6).
//!
//! - **Where.** `https://…`, or plain `http://` on loopback only (127.0.0.0/8, `::1`,
//!   `localhost`); anything else is refused before a connection is made. Redirect targets are
//!   held to the same rule.
//! - **Credentials.** The bearer token goes only to the endpoint's own origin (scheme, host,
//!   port), and never again in a request chain once a redirect left that origin.
//! - **Redirects.** Followed by hand, at most [`MAX_REDIRECTS`] hops, each repeating the
//!   `Range`.
//! - **Retries.** Transport failures and [`is_weather`] statuses (`408`, `429`, `502`, `503`,
//!   `504`) are asked again after `Retry-After` or a doubling wait with jitter, until
//!   [`ClientConfig::deadline`] passes without a byte received; a connection that stalls that
//!   long is dropped and asked again the same way. Other statuses are final: a `500` is the
//!   server's own failure (a damaged blob), which asking again repeats.
//! - **Resumption.** An object's GET that breaks resumes at the byte it reached
//!   (`Range: bytes=<n>-`); a server that answers `200` instead has its first `n` bytes skipped.
//!   Bytes go to a [`Sink`]; whoever admits them checks length and SHA-256 (§2).

use std::hash::{BuildHasher, Hasher as _};
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_RANGE, LOCATION, RANGE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};

use bytes::Bytes;

use super::origin::{
    check_document_length, message_suffix, parse_repo_document, repo_document_key, FetchError,
    FetchResult, Head, Origin, Put, Recorded, Sink,
};
use super::{blob_key, model_key, Resolved, MAX_DOCUMENT_BYTES};
use crate::format::{ObjectRef, Repo, Sha256};

mod write;

/// The most redirect hops one request follows (§2).
pub const MAX_REDIRECTS: usize = 5;

/// Settings of a client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long a request may go without a byte received (failed attempts, waits between them
    /// and stalled connections together) before it fails (default 60 s).
    pub deadline: Duration,
    /// The first wait between attempts; it doubles up to `max_backoff` (default 250 ms).
    pub backoff: Duration,
    /// The longest wait between attempts, `Retry-After` included (default 20 s).
    pub max_backoff: Duration,
    /// Connection timeout; never longer than `deadline` (default 15 s).
    pub connect_timeout: Duration,
    /// How long a read may wait for the next byte; never longer than `deadline` (default 60 s).
    pub read_timeout: Duration,
}

/// The default of [`ClientConfig::deadline`].
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            deadline: DEFAULT_DEADLINE,
            backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// An endpoint `B` and how to talk to it.
#[derive(Debug)]
pub struct Endpoint {
    /// The base URL, its path ending in `/`.
    base: Url,
    token: Option<String>,
    http: reqwest::Client,
    config: ClientConfig,
}

/// What the `HEAD` of a blob answered.
enum BlobHead {
    /// `200`, with the blob's length in bytes (its `Content-Length`).
    Present(u64),
    /// `404` or `410`: the answer, whose `Location` an upload reads.
    Absent(reqwest::Response),
}

/// How one attempt ended, when not with an answer.
enum Attempt {
    /// Worth asking again (after `wait`, when the server said).
    Again { why: String, wait: Option<Duration> },
    /// Final.
    Fail(FetchError),
}

/// The retry budget of one request: failures in a row since the last byte received, and when
/// that byte came.
struct Patience {
    failures: u32,
    since: Instant,
}

impl Patience {
    fn new() -> Patience {
        Patience {
            failures: 0,
            since: Instant::now(),
        }
    }

    /// A byte arrived: the budget starts again.
    fn progressed(&mut self) {
        self.failures = 0;
        self.since = Instant::now();
    }

    /// After a failure: how long to wait before the next attempt, or the error that ends the
    /// request once the deadline has passed without progress. The last wait ends at the
    /// deadline, so one attempt is always made there.
    fn again(
        &mut self,
        endpoint: &Endpoint,
        server_wait: Option<Duration>,
        what: &str,
        why: String,
    ) -> FetchResult<Duration> {
        self.failures += 1;
        let waited = self.since.elapsed();
        let left = endpoint.config.deadline.saturating_sub(waited);
        if left.is_zero() {
            return Err(FetchError::GaveUp {
                what: what.to_owned(),
                attempts: self.failures,
                waited,
                last: why,
            });
        }
        tracing::debug!("{what}: {why}; asking again");
        Ok(endpoint.wait(self.failures, server_wait).min(left))
    }
}

impl Endpoint {
    /// The endpoint at `url`, with a bearer `token` for its origin.
    ///
    /// # Errors
    /// `url` is not `https://`, or `http://` on loopback; the HTTP client cannot be built.
    pub fn new(url: &str, token: Option<String>, config: ClientConfig) -> FetchResult<Endpoint> {
        let refused = |why: &str| FetchError::Refused {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let mut base = Url::parse(url).map_err(|e| refused(&format!("not a URL: {e}")))?;
        check_scheme(&base).map_err(|why| refused(&why))?;
        if base.query().is_some() || base.fragment().is_some() {
            return Err(refused("an endpoint URL has no query or fragment"));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        // TLS by rustls with ring; a provider installed earlier in the process is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout.min(config.deadline))
            .read_timeout(config.read_timeout.min(config.deadline))
            .user_agent(concat!("tensorfs/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| refused(&format!("the HTTP client cannot start: {e}")))?;
        Ok(Endpoint {
            base,
            token: token.filter(|t| !t.is_empty()),
            http,
            config,
        })
    }

    /// The base URL.
    pub fn url(&self) -> &Url {
        &self.base
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn at(&self, key: &str) -> Url {
        self.base.join(key).expect("keys are relative paths")
    }

    /// The commit the resolve route names, or `None` when the endpoint has no resolve route (a
    /// static host answers a bare status, without the error envelope).
    ///
    /// # Errors
    /// The server says there is no such model, release or lane (`NotFound`), or fails.
    pub async fn resolve(
        &self,
        name: &str,
        release: Option<&str>,
        lane: Option<&str>,
    ) -> FetchResult<Option<Resolved>> {
        let what = format!("resolving {name}");
        let key = model_key(name, "resolve").ok_or_else(|| FetchError::Protocol {
            what: what.clone(),
            why: "not <org>/<name>".into(),
        })?;
        let mut url = self.at(&key);
        {
            let mut query = url.query_pairs_mut();
            release.map(|r| query.append_pair("release", r));
            lane.map(|l| query.append_pair("lane", l));
        }
        let (status, body) = self.small(Method::GET, url, &what).await?;
        match status {
            StatusCode::OK => {
                serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|e| FetchError::Protocol {
                        what,
                        why: format!("the answer is not {{release, lane, commit, header}}: {e}"),
                    })
            }
            _ => match envelope(&body) {
                // A distribution server that says no.
                Some(message) if status == StatusCode::NOT_FOUND => {
                    Err(FetchError::NotFound { what, message })
                }
                Some(message) => Err(FetchError::Status {
                    what,
                    status: status.as_u16(),
                    message,
                }),
                // A static host: no resolve route.
                None if matches!(status.as_u16(), 400 | 403 | 404 | 405 | 410 | 501) => Ok(None),
                None => Err(FetchError::Status {
                    what,
                    status: status.as_u16(),
                    message: snippet(&body),
                }),
            },
        }
    }

    /// The repo document a static origin keeps at `refs/<org>/<name>.json` (§1, §8), if any.
    ///
    /// # Errors
    /// Another failure, or a document that is not a repo of that name.
    pub async fn repo_document(&self, name: &str) -> FetchResult<Option<Repo>> {
        let what = format!("reading the repo document of {name}");
        let key = repo_document_key(name, &what)?;
        let (status, body) = self.small(Method::GET, self.at(&key), &what).await?;
        match status.as_u16() {
            200 => {}
            404 | 410 => return Ok(None),
            status => {
                return Err(FetchError::Status {
                    what,
                    status,
                    message: envelope(&body).unwrap_or_else(|| snippet(&body)),
                })
            }
        }
        parse_repo_document(name, &body, &what).map(Some)
    }

    /// The models the endpoint serves to this client (`GET v1/models`, this implementation's
    /// addition), or `None` when it has no such route (another server, a static host).
    ///
    /// # Errors
    /// The server fails, or answers something that is not a model list.
    pub async fn models(&self) -> FetchResult<Option<Vec<String>>> {
        let what = "listing the models".to_owned();
        let (status, body) = self.small(Method::GET, self.at("v1/models"), &what).await?;
        match status.as_u16() {
            200 => {}
            400 | 403 | 404 | 405 | 410 | 501 => return Ok(None),
            status => {
                return Err(FetchError::Status {
                    what,
                    status,
                    message: envelope(&body).unwrap_or_else(|| snippet(&body)),
                })
            }
        }
        let list: super::ModelList =
            serde_json::from_slice(&body).map_err(|e| FetchError::Protocol {
                what,
                why: format!("the answer is not {{\"models\": [{{\"name\"}}]}}: {e}"),
            })?;
        Ok(Some(list.models.into_iter().map(|m| m.name).collect()))
    }

    /// The length of object `sha256` at the endpoint (`HEAD`), or `None` when absent. Unlike
    /// [`Endpoint::head`], a `404`'s `Location` (where an upload would go) is not read.
    ///
    /// # Errors
    /// Another failure, or an answer without a length.
    pub async fn length_of(&self, sha256: &Sha256) -> FetchResult<Option<u64>> {
        let what = format!("HEAD sha256:{sha256}");
        Ok(match self.head_blob(sha256, &what).await? {
            BlobHead::Present(length) => Some(length),
            BlobHead::Absent(_) => None,
        })
    }

    /// The `HEAD` of blob `sha256` (§3), transport failures retried like any request.
    ///
    /// # Errors
    /// About `what`: a status other than `200`, `404` or `410` ([`FetchError::Status`]), a `200`
    /// without a `Content-Length` ([`FetchError::Protocol`]), or retries ran out.
    async fn head_blob(&self, sha256: &Sha256, what: &str) -> FetchResult<BlobHead> {
        let url = self.at(&blob_key(sha256));
        let response = self
            .ask(Method::HEAD, url, None, what, &mut Patience::new())
            .await?;
        match response.status().as_u16() {
            200 => {}
            404 | 410 => return Ok(BlobHead::Absent(response)),
            status => {
                return Err(FetchError::Status {
                    what: what.to_owned(),
                    status,
                    message: String::new(),
                })
            }
        }
        let length = response
            .headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        length.map(BlobHead::Present).ok_or(FetchError::Protocol {
            what: what.to_owned(),
            why: "no Content-Length".into(),
        })
    }

    /// A document (tree, header) read whole into memory and verified against `object`; a wrong
    /// copy is asked for again until the deadline.
    ///
    /// # Errors
    /// Over the 16 MiB document limit, absent, or not the bytes `object` names.
    pub async fn document(&self, object: &ObjectRef) -> FetchResult<Vec<u8>> {
        let what = format!("object {}", object.id());
        check_document_length(object, &what)?;
        // A wrong copy (a byte changed on the way) is asked for again until the deadline.
        let mut first_wrong: Option<Instant> = None;
        let mut copies = 0;
        loop {
            let mut bytes = Vec::with_capacity(object.length as usize);
            self.fetch(object, &mut bytes, &|_| {}).await?;
            let found = ObjectRef::of(&bytes);
            if found == *object {
                return Ok(bytes);
            }
            copies += 1;
            let since = *first_wrong.get_or_insert_with(Instant::now);
            let left = self.config.deadline.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Err(FetchError::Protocol {
                    what,
                    why: format!(
                        "{copies} copies received were not its bytes (the last was {found})"
                    ),
                });
            }
            tracing::debug!("{what}: received {found}, not its bytes; asking again");
            tokio::time::sleep(self.wait(copies, None).min(left)).await;
        }
    }

    /// Streams object `object` into `sink`, resuming after failures; `progress` hears of every
    /// byte received (bytes skipped on a restart are not counted twice). Exactly
    /// `object.length` bytes reach the sink; their digest is the caller's to check.
    ///
    /// # Errors
    /// Absent, refused, more bytes than its length, or retries ran out.
    pub async fn fetch(
        &self,
        object: &ObjectRef,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
    ) -> FetchResult<()> {
        let what = format!("GET {}", object.id());
        let url = self.at(&blob_key(&object.sha256));
        let mut received = 0u64;
        let mut patience = Patience::new();
        while received < object.length {
            let attempt = self
                .fetch_once(
                    object,
                    &url,
                    &mut received,
                    &mut patience,
                    sink,
                    progress,
                    &what,
                )
                .await;
            match attempt {
                Ok(()) => continue,
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::Again { why, wait }) => {
                    let why = format!("{why} (at byte {received})");
                    let wait = patience.again(self, wait, &what, why)?;
                    tokio::time::sleep(wait).await;
                }
            }
        }
        Ok(())
    }

    /// One GET of `object` from byte `received`, advancing it by what arrives.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_once(
        &self,
        object: &ObjectRef,
        url: &Url,
        received: &mut u64,
        patience: &mut Patience,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
        what: &str,
    ) -> Result<(), Attempt> {
        let from = (*received > 0).then_some(*received);
        let mut response = self.send(Method::GET, url.clone(), from, what).await?;
        let status = response.status();
        let mut skip = match status.as_u16() {
            200 => *received,
            206 => {
                let start = response
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range_start);
                if start != Some(*received) {
                    return Err(Attempt::Fail(FetchError::Protocol {
                        what: what.to_owned(),
                        why: format!("asked for bytes from {received}, got {start:?}"),
                    }));
                }
                0
            }
            _ => return Err(self.failure(status, response, what).await),
        };
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    return Err(Attempt::Again {
                        why: format!("the body broke off: {e}"),
                        wait: None,
                    })
                }
            };
            let mut bytes = &chunk[..];
            let skipped = (skip.min(bytes.len() as u64)) as usize;
            bytes = &bytes[skipped..];
            skip -= skipped as u64;
            if bytes.is_empty() {
                continue;
            }
            if *received + bytes.len() as u64 > object.length {
                return Err(Attempt::Fail(FetchError::Protocol {
                    what: what.to_owned(),
                    why: format!("more than its {} bytes arrived", object.length),
                }));
            }
            sink.write(bytes).map_err(|source| {
                Attempt::Fail(FetchError::Sink {
                    what: what.to_owned(),
                    source,
                })
            })?;
            *received += bytes.len() as u64;
            patience.progressed();
            progress(bytes.len() as u64);
        }
        match *received == object.length {
            true => Ok(()),
            false => Err(Attempt::Again {
                why: format!("the body ended at byte {received} of {}", object.length),
                wait: None,
            }),
        }
    }

    /// A final or retryable failure for a non-success answer.
    async fn failure(
        &self,
        status: StatusCode,
        response: reqwest::Response,
        what: &str,
    ) -> Attempt {
        let wait = retry_after(&response);
        let body = read_limited(response, 64 << 10).await.unwrap_or_default();
        let message = envelope(&body).unwrap_or_else(|| snippet(&body));
        match status.as_u16() {
            404 | 410 => Attempt::Fail(FetchError::NotFound {
                what: what.to_owned(),
                message,
            }),
            status if is_weather(status) => Attempt::Again {
                why: format!("{status}{}", message_suffix(&message)),
                wait,
            },
            code => Attempt::Fail(FetchError::Status {
                what: what.to_owned(),
                status: code,
                message,
            }),
        }
    }

    /// A small answer (JSON, a repo document) read whole, retried like any request.
    async fn small(
        &self,
        method: Method,
        url: Url,
        what: &str,
    ) -> FetchResult<(StatusCode, Vec<u8>)> {
        let mut patience = Patience::new();
        loop {
            let response = self
                .ask(method.clone(), url.clone(), None, what, &mut patience)
                .await?;
            let status = response.status();
            if is_weather(status.as_u16()) {
                let wait = retry_after(&response);
                let wait = patience.again(self, wait, what, status.to_string())?;
                tokio::time::sleep(wait).await;
                continue;
            }
            match read_limited(response, MAX_DOCUMENT_BYTES as usize).await {
                Ok(body) => return Ok((status, body)),
                Err(why) => {
                    let wait = patience.again(self, None, what, why)?;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One request with transport failures retried; any status is returned.
    async fn ask(
        &self,
        method: Method,
        url: Url,
        from: Option<u64>,
        what: &str,
        patience: &mut Patience,
    ) -> FetchResult<reqwest::Response> {
        loop {
            match self.send(method.clone(), url.clone(), from, what).await {
                Ok(response) => return Ok(response),
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::Again { why, wait }) => {
                    let wait = patience.again(self, wait, what, why)?;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Sends one request, following redirects; the token only while on the endpoint's origin.
    async fn send(
        &self,
        method: Method,
        mut url: Url,
        from: Option<u64>,
        what: &str,
    ) -> Result<reqwest::Response, Attempt> {
        let mut on_origin = true;
        for _ in 0..=MAX_REDIRECTS {
            on_origin &= url.origin() == self.base.origin();
            let mut request = self.http.request(method.clone(), url.clone());
            if let Some(from) = from {
                request = request.header(RANGE, format!("bytes={from}-"));
            }
            if let (true, Some(token)) = (on_origin, &self.token) {
                request = request.bearer_auth(token);
            }
            // The read timeout covers a body; this covers a server that never answers.
            let patience = self.config.read_timeout.min(self.config.deadline);
            let response = match tokio::time::timeout(patience, request.send()).await {
                Ok(sent) => sent.map_err(|e| Attempt::Again {
                    why: transport_error(&e),
                    wait: None,
                })?,
                Err(_) => {
                    return Err(Attempt::Again {
                        why: format!("no answer within {:.1} s", patience.as_secs_f64()),
                        wait: None,
                    })
                }
            };
            let status = response.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok(response);
            }
            let fail = |why: String| {
                Attempt::Fail(FetchError::Protocol {
                    what: what.to_owned(),
                    why,
                })
            };
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| fail(format!("a {status} redirect without Location")))?;
            let next = url
                .join(location)
                .map_err(|e| fail(format!("redirect to {location:?}: {e}")))?;
            check_scheme(&next).map_err(|why| fail(format!("redirect to {next}: {why}")))?;
            url = next;
        }
        Err(Attempt::Fail(FetchError::Protocol {
            what: what.to_owned(),
            why: format!("more than {MAX_REDIRECTS} redirects"),
        }))
    }

    /// The wait before attempt `failures + 1`: the server's `Retry-After`, else a doubling
    /// backoff with full jitter in its upper half; never over `max_backoff`.
    pub(crate) fn wait(&self, failures: u32, server: Option<Duration>) -> Duration {
        if let Some(wait) = server {
            return wait.min(self.config.max_backoff);
        }
        let doubled = self
            .config
            .backoff
            .saturating_mul(1 << failures.saturating_sub(1).min(16));
        doubled
            .min(self.config.max_backoff)
            .mul_f64(0.5 + 0.5 * jitter())
    }
}

/// Statuses that pass (§6): timeouts, rate limits, and a gateway or server that is busy or
/// restarting.
pub fn is_weather(status: u16) -> bool {
    matches!(status, 408 | 429 | 502 | 503 | 504)
}

/// `https`, or `http` to a loopback host (§2).
fn check_scheme(url: &Url) -> Result<(), String> {
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(url) => Ok(()),
        "http" => Err(format!(
            "plain http is allowed only on loopback (127.0.0.0/8, ::1, localhost), not {}; use \
             https://",
            url.host_str().unwrap_or("this host")
        )),
        other => Err(format!("{other}: is not https:// (or http:// on loopback)")),
    }
}

/// Whether `url`'s host is a loopback address or `localhost`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => {
            name.eq_ignore_ascii_case("localhost")
                || name.to_ascii_lowercase().ends_with(".localhost")
        }
        None => false,
    }
}

/// The first byte a `Content-Range: bytes a-b/n` names.
fn content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    range.split(['-', '/']).next()?.trim().parse().ok()
}

/// `Retry-After` in seconds, if the answer has one.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse().ok().map(Duration::from_secs)
}

/// The message of an error envelope `{"error": {"code", "message"}}`, as `code: message`.
fn envelope(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error")?;
    let code = error.get("code")?.as_str()?;
    let message = error.get("message").and_then(|m| m.as_str()).unwrap_or("");
    Some(format!("{code}: {message}"))
}

/// The start of a body that is not an envelope, for an error message.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A body read whole, refused past `limit` bytes.
async fn read_limited(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(&e))? {
        if body.len() + chunk.len() > limit {
            return Err(format!("an answer over {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A transport error with its causes (reqwest's own message names only the outermost).
fn transport_error(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// A number in [0, 1), different on every call (for backoff jitter, not for secrets).
fn jitter() -> f64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[async_trait::async_trait]
impl Origin for Endpoint {
    fn url(&self) -> &Url {
        Endpoint::url(self)
    }

    fn retry_deadline(&self) -> std::time::Duration {
        self.config().deadline
    }

    fn retry_wait(&self, copies: u32) -> std::time::Duration {
        self.wait(copies, None)
    }

    async fn resolve(
        &self,
        name: &str,
        release: Option<&str>,
        lane: Option<&str>,
    ) -> FetchResult<Option<Resolved>> {
        Endpoint::resolve(self, name, release, lane).await
    }

    async fn repo_document(&self, name: &str) -> FetchResult<Option<Repo>> {
        Endpoint::repo_document(self, name).await
    }

    async fn head(&self, sha256: &Sha256) -> FetchResult<Head> {
        Endpoint::head(self, sha256).await
    }

    async fn length_of(&self, sha256: &Sha256) -> FetchResult<Option<u64>> {
        Endpoint::length_of(self, sha256).await
    }

    async fn models(&self) -> FetchResult<Option<Vec<String>>> {
        Endpoint::models(self).await
    }

    // A server may hand out a wrong copy on the way (a proxy, a fault): asked for again until
    // the endpoint's deadline.
    async fn document(&self, object: &ObjectRef) -> FetchResult<Vec<u8>> {
        Endpoint::document(self, object).await
    }

    async fn fetch(
        &self,
        object: &ObjectRef,
        sink: &mut (dyn Sink + Send),
        progress: &(dyn Fn(u64) + Sync),
    ) -> FetchResult<()> {
        Endpoint::fetch(self, object, sink, progress).await
    }

    async fn put(&self, object: &ObjectRef, bytes: Bytes, put_to: Option<Url>) -> FetchResult<Put> {
        Endpoint::put(self, object, bytes, put_to).await
    }

    async fn record(&self, name: &str, commit: &ObjectRef) -> FetchResult<Recorded> {
        Endpoint::record(self, name, commit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_taken_on_loopback_only() {
        for ok in [
            "https://example.com",
            "http://127.0.0.1:8080",
            "http://127.1.2.3/x/",
            "http://[::1]:9/",
            "http://localhost:1",
        ] {
            assert!(
                Endpoint::new(ok, None, ClientConfig::default()).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "http://example.com",
            "http://10.0.0.1",
            "http://[::2]",
            "ftp://127.0.0.1",
            "file:///srv/store",
            "https://example.com/?x=1",
            "not a url",
        ] {
            let err = Endpoint::new(bad, None, ClientConfig::default()).unwrap_err();
            assert!(matches!(err, FetchError::Refused { .. }), "{bad}: {err}");
        }
        let err = Endpoint::new("http://example.com", None, ClientConfig::default()).unwrap_err();
        assert!(err.to_string().contains("only on loopback"), "{err}");
    }

    #[tokio::test]
    async fn bytes_of_another_length_are_refused_before_a_put() {
        let e = Endpoint::new("https://example.invalid", None, ClientConfig::default()).unwrap();
        let object = ObjectRef::of(b"four");
        let err = e
            .put(&object, bytes::Bytes::from_static(b"three"), None)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("PUT {}: 5 bytes to send, not 4", object.id())
        );
    }

    #[test]
    fn keys_are_joined_under_the_base_path() {
        let e = Endpoint::new("https://example.com/mirror", None, ClientConfig::default()).unwrap();
        assert_eq!(
            e.at("blobs/aa/bb/x").as_str(),
            "https://example.com/mirror/blobs/aa/bb/x"
        );
    }

    #[test]
    fn waits_double_with_jitter_and_keep_to_the_cap() {
        let e = Endpoint::new("https://example.com", None, ClientConfig::default()).unwrap();
        for failures in 1..12 {
            let wait = e.wait(failures, None);
            let full = Duration::from_millis(250)
                .saturating_mul(1 << (failures - 1))
                .min(Duration::from_secs(20));
            assert!(wait >= full / 2 && wait <= full, "{failures}: {wait:?}");
        }
        assert_eq!(
            e.wait(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            e.wait(1, Some(Duration::from_secs(999))),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn only_passing_statuses_are_asked_again() {
        for status in [408, 429, 502, 503, 504] {
            assert!(is_weather(status), "{status}");
        }
        for status in [200, 206, 400, 401, 403, 404, 416, 500, 501] {
            assert!(!is_weather(status), "{status}");
        }
    }

    #[test]
    fn envelopes_and_content_ranges_are_read() {
        assert_eq!(
            envelope(br#"{"error":{"code":"not_found","message":"no model a/b"}}"#).as_deref(),
            Some("not_found: no model a/b")
        );
        assert_eq!(envelope(b"<html>404</html>"), None);
        assert_eq!(content_range_start("bytes 10-19/100"), Some(10));
        assert_eq!(content_range_start("bytes */100"), None);
    }
}
