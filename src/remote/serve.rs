//! `tensorfs serve`: distribution/1 over a store directory, on HTTP/1.1 (hyper).
//!
//! Parts:
//! - this file: [`ServeConfig`], the listener and its shutdown, routing, authorization (§5) and
//!   the error envelope (§6);
//! - `blobs`: `GET`/`HEAD` with one range, `PUT` admitted through the store's writer;
//! - `models`: the model list, resolve, commits and repo documents;
//! - `visibility`: which objects anonymous callers may read when a token is configured.
//!
//! Who may do what:
//! - no token configured: every caller is a member of every org: it reads everything but
//!   `local/` repos and, with `--write`, writes;
//! - a token configured: a caller presenting `Authorization: Bearer <token>` is a member; one
//!   presenting none reads released commits and their objects only (anything else is `404`,
//!   never `403`) and writes nothing (`401` with `WWW-Authenticate`); a wrong token is `401`.
//!
//! Blocking store work (reads, hashing, admission, refs) runs on tokio's blocking pool, never
//! on the threads that drive connections.

mod blobs;
mod models;
mod visibility;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::io::{BlobReader, BlobReaderConfig};
use crate::store::Store;
use visibility::Visibility;

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// The bearer token that makes a caller a member; `None`: every caller is one.
    pub token: Option<String>,
    /// Whether uploads (`PUT` blobs, `POST` commits) are taken; else they are `405`.
    pub write: bool,
    /// The largest object an upload may send, in bytes (default 5 GiB, §7).
    pub max_object_bytes: u64,
}

impl ServeConfig {
    /// A read-only server without a token on `listen`.
    pub fn new(listen: SocketAddr) -> ServeConfig {
        ServeConfig {
            listen,
            token: None,
            write: false,
            max_object_bytes: super::MAX_OBJECT_BYTES,
        }
    }
}

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The runtime, the listener or the signal handlers could not be set up.
    #[error("{what}: {source}")]
    Setup {
        /// What was being set up.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// How long a connection may take to send a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long in-flight work may take to finish once a signal stops the server.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A response body: bytes in memory, or a blob streamed from the store.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// Serves `store` until SIGINT or SIGTERM; `ready` is called with the bound address once
/// connections are taken.
///
/// # Errors
/// The runtime cannot start, the address cannot be bound, or signals cannot be watched.
pub fn run(
    store: Store,
    config: ServeConfig,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tensorfs-serve")
        .build()
        .map_err(|source| ServeError::Setup {
            what: "starting the runtime".into(),
            source,
        })?;
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Setup {
                what: format!("listening on {}", config.listen),
                source,
            })?;
        let address = listener.local_addr().map_err(|source| ServeError::Setup {
            what: "reading the bound address".into(),
            source,
        })?;
        let signal = |kind| {
            tokio::signal::unix::signal(kind).map_err(|source| ServeError::Setup {
                what: "watching signals".into(),
                source,
            })
        };
        let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
        let server = Arc::new(Server::new(store, config));
        ready(address);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors and the like: wait a little rather than spin.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
            };
            let server = server.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(server.handle(request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = connection.await {
                    tracing::debug!("connection from {peer}: {e}");
                }
            });
        }
        tracing::info!("stopping: signal received");
        Ok(())
    });
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    served
}

/// Who is asking (§5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Reads everything served, writes when the server takes writes.
    Member,
    /// Reads released commits and their objects.
    Anonymous,
}

/// The state every request shares.
pub(crate) struct Server {
    store: Store,
    reader: Arc<BlobReader>,
    config: ServeConfig,
    visibility: Visibility,
}

impl Server {
    fn new(store: Store, config: ServeConfig) -> Server {
        Server {
            reader: Arc::new(BlobReader::new(store.clone(), BlobReaderConfig::default())),
            visibility: Visibility::default(),
            store,
            config,
        }
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let response = match self.route(request).await {
            Ok(response) => response,
            Err(error) => error.response(),
        };
        tracing::debug!("{method} {path}: {}", response.status());
        response
    }

    async fn route(
        self: &Arc<Self>,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, ApiError> {
        let caller = self.caller(&request)?;
        let path = request.uri().path().trim_start_matches('/').to_owned();
        let segments: Vec<&str> = path.split('/').collect();
        match segments[..] {
            ["blobs", aa, bb, hex] => {
                let Some(sha256) = super::parse_blob_key(aa, bb, hex) else {
                    return Err(ApiError::not_found("no such object"));
                };
                match *request.method() {
                    Method::GET | Method::HEAD => blobs::get(self, caller, sha256, &request).await,
                    Method::PUT => {
                        self.may_write(caller)?;
                        blobs::put(self, sha256, request).await
                    }
                    _ => Err(ApiError::method("GET, HEAD, PUT")),
                }
            }
            ["v1", "models"] => match *request.method() {
                Method::GET => models::list(self, caller).await,
                _ => Err(ApiError::method("GET")),
            },
            ["v1", "models", org, name, action @ ("resolve" | "commits")] => {
                let name = model_name(org, name)?;
                match (action, request.method()) {
                    ("resolve", &Method::GET) => {
                        models::resolve(self, caller, &name, &request).await
                    }
                    ("resolve", _) => Err(ApiError::method("GET")),
                    ("commits", &Method::POST) => {
                        self.may_write(caller)?;
                        models::commit(self, &name, request).await
                    }
                    _ => Err(ApiError::method("POST")),
                }
            }
            ["refs", org, file] => match *request.method() {
                Method::GET | Method::HEAD => {
                    let head = request.method() == Method::HEAD;
                    models::repo_document(self, caller, org, file, head).await
                }
                _ => Err(ApiError::method("GET, HEAD")),
            },
            _ => Err(ApiError::not_found(
                "no such route (distribution/1 serves blobs/, v1/models/ and refs/)",
            )),
        }
    }

    /// The caller a request's `Authorization` makes; a credential that is not the token is
    /// `401` on every route.
    fn caller(&self, request: &Request<Incoming>) -> Result<Caller, ApiError> {
        let Some(token) = &self.config.token else {
            return Ok(Caller::Member);
        };
        let Some(value) = request.headers().get(hyper::header::AUTHORIZATION) else {
            return Ok(Caller::Anonymous);
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        match presented {
            Some(presented) if same_secret(presented.as_bytes(), token.as_bytes()) => {
                Ok(Caller::Member)
            }
            _ => Err(ApiError::unauthorized(
                "the bearer token is not this server's",
            )),
        }
    }

    /// Refuses writes when the server takes none (`405`) or the caller is not a member (`401`).
    fn may_write(&self, caller: Caller) -> Result<(), ApiError> {
        if !self.config.write {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "unsupported",
                "this endpoint is read-only (start `tensorfs serve` with --write to take uploads)",
            )
            .with_header(ALLOW, "GET, HEAD"));
        }
        match caller {
            Caller::Member => Ok(()),
            Caller::Anonymous => Err(ApiError::unauthorized("uploads need the bearer token")),
        }
    }

    /// Whether `caller` may read `object` (members read everything; anonymous callers what a
    /// release reaches).
    async fn may_read(self: &Arc<Self>, caller: Caller, object: crate::format::Sha256) -> bool {
        if caller == Caller::Member {
            return true;
        }
        let server = self.clone();
        tokio::task::spawn_blocking(move || server.visibility.is_public(&server.store, &object))
            .await
            .unwrap_or(false)
    }
}

/// The repo name a model route names, its segments percent-decoded; `local/` is never served.
fn model_name(org: &str, name: &str) -> Result<String, ApiError> {
    let (Some(org), Some(name)) = (super::decode_segment(org), super::decode_segment(name)) else {
        return Err(ApiError::invalid(
            "the model name is not percent-encoded UTF-8",
        ));
    };
    let full = format!("{org}/{name}");
    if crate::format::names::split_repo_name(&full).is_err() {
        return Err(ApiError::invalid(format!("{full:?} is not <org>/<name>")));
    }
    if super::is_local(&full) {
        return Err(ApiError::not_found(format!(
            "no model {full} (the org `local` is a machine's own and never served)"
        )));
    }
    Ok(full)
}

/// Compares secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An error answer (§6): a status and `{"error": {"code", "message", "detail"?}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    detail: Option<serde_json::Value>,
    headers: Vec<(hyper::header::HeaderName, HeaderValue)>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            detail: None,
            headers: Vec::new(),
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message).with_header(
            WWW_AUTHENTICATE,
            r#"Bearer realm="tensorfs", error="invalid_token""#,
        )
    }

    pub(crate) fn method(allowed: &'static str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "unsupported",
            format!("this route takes {allowed}"),
        )
        .with_header(ALLOW, allowed)
    }

    /// A failure of the server itself (a store it cannot read), logged here.
    pub(crate) fn internal(message: impl std::fmt::Display) -> Self {
        tracing::error!("{message}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            message.to_string(),
        )
    }

    pub(crate) fn with_detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = Some(detail);
        self
    }

    pub(crate) fn with_header(mut self, name: hyper::header::HeaderName, value: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.push((name, value));
        }
        self
    }

    fn response(self) -> Response<Body> {
        let mut error = serde_json::json!({"code": self.code, "message": self.message});
        if let Some(detail) = self.detail {
            error["detail"] = detail;
        }
        let body = serde_json::to_vec(&serde_json::json!({ "error": error }))
            .expect("JSON values serialize");
        let mut response = json_response(self.status, body);
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response
    }
}

/// A response with bytes in memory.
pub(crate) fn full(status: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(bytes.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// A response without a body (HEAD, 304, 412).
pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = full(status, body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn model_routes_decode_names_and_never_serve_local() {
        assert_eq!(model_name("acme", "sd%20xl").unwrap(), "acme/sd xl");
        assert_eq!(model_name("LOCAL", "x").unwrap_err().status, 404);
        assert_eq!(model_name("acme", "%zz").unwrap_err().status, 400);
        assert_eq!(model_name("acme", "..").unwrap_err().status, 400);
    }
}
