//! `B/blobs/<aa>/<bb>/<sha256>` (distribution.md §2, §3).
//!
//! - `GET` reads through the [`BlobReader`], which proves a blob (ledger or hash) before its
//!   first byte is sent: the first piece is read before the status line, so a damaged or
//!   missing blob is an error answer, not a torn body. One `bytes=` range is honoured (`206`,
//!   `416` past the end); `If-None-Match` and `If-Range` compare the ETag, `"<sha256>"`.
//! - `HEAD` answers from the blob's length alone.
//! - `PUT` needs `Content-Length`, `x-amz-checksum-sha256` (base64 of the digest the URL names)
//!   and `If-None-Match: *`; a present object is `412`. The body streams into an
//!   [`ObjectWriter`](crate::store::ObjectWriter) and becomes an object only when its length
//!   and SHA-256 are the URL's; anything else leaves no trace (`400 digest_mismatch`).

use std::io::{self, Write};
use std::sync::Arc;

use base64::Engine as _;
use http_body_util::channel::Channel;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    HeaderValue, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_NONE_MATCH,
    IF_RANGE, RANGE,
};
use hyper::{Method, Request, Response, StatusCode};

use super::{empty, full, ApiError, Body, Caller, Server};
use crate::format::{ObjectRef, Sha256};
use crate::io::BlobReader;
use crate::io::ObjectSource;
use crate::remote::range::{parse_range, RangeAnswer};
use crate::store::StoreError;

/// Bytes read from a blob per piece of a response body.
const PIECE_BYTES: u64 = 1 << 20;

/// `GET` or `HEAD` of a blob.
pub(super) async fn get(
    server: &Arc<Server>,
    caller: Caller,
    sha256: Sha256,
    request: &Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let path = server.store.object_path(&ObjectRef { sha256, length: 0 });
    let length = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return Err(ApiError::not_found("no such object")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ApiError::not_found("no such object"))
        }
        Err(e) => return Err(ApiError::internal(format!("{}: {e}", path.display()))),
    };
    if !server.may_read(caller, sha256).await {
        return Err(ApiError::not_found("no such object"));
    }
    let object = ObjectRef { sha256, length };
    let etag = format!("\"{}\"", sha256.hex());
    let header = |name| {
        request
            .headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let cache = match server.config.token {
        // Objects never change; only who may see them does.
        Some(_) => "private, max-age=31536000, immutable",
        None => "public, max-age=31536000, immutable",
    };
    let decorate = |mut response: Response<Body>| {
        let headers = response.headers_mut();
        headers.insert(
            ETAG,
            HeaderValue::from_str(&etag).expect("hex is a header value"),
        );
        headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static(cache));
        response
    };
    if request.method() == Method::HEAD {
        let mut response = empty(StatusCode::OK);
        response.headers_mut().insert(CONTENT_LENGTH, length.into());
        return Ok(decorate(response));
    }
    if header(IF_NONE_MATCH).is_some_and(|tags| matches_etag(tags, &etag)) {
        return Ok(decorate(empty(StatusCode::NOT_MODIFIED)));
    }
    let range = match header(IF_RANGE) {
        Some(tag) if tag.trim() != etag => RangeAnswer::Whole,
        _ => parse_range(header(RANGE), length),
    };
    let (status, start, end) = match range {
        RangeAnswer::Whole => (StatusCode::OK, 0, length),
        RangeAnswer::Part { start, end } => (StatusCode::PARTIAL_CONTENT, start, end + 1),
        RangeAnswer::Unsatisfiable => {
            return Err(ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the object has {length} bytes"),
            )
            .with_header(CONTENT_RANGE, &format!("bytes */{length}")));
        }
    };
    let body = stream(server.reader.clone(), object, start, end).await?;
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_LENGTH, (end - start).into());
    if status == StatusCode::PARTIAL_CONTENT {
        let value = format!("bytes {start}-{}/{length}", end - 1);
        headers.insert(
            CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("digits"),
        );
    }
    Ok(decorate(response))
}

/// Whether an `If-None-Match` list names `etag` (or is `*`).
fn matches_etag(tags: &str, etag: &str) -> bool {
    tags.split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

/// The bytes `start..end` of `object`, proven: the first piece is read before this returns.
async fn stream(
    reader: Arc<BlobReader>,
    object: ObjectRef,
    start: u64,
    end: u64,
) -> Result<Body, ApiError> {
    let read = move |reader: &BlobReader, at: u64| -> io::Result<Bytes> {
        let mut buf = vec![0u8; (end - at).min(PIECE_BYTES) as usize];
        reader.read_object(&object, at, &mut buf)?;
        Ok(Bytes::from(buf))
    };
    let first_reader = reader.clone();
    let first = tokio::task::spawn_blocking(move || read(&first_reader, start))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ApiError::not_found("no such object"),
            _ => ApiError::internal(e),
        })?;
    let after = start + first.len() as u64;
    if after >= end {
        return Ok(full(StatusCode::OK, first).into_body());
    }
    let (mut sender, body) = Channel::<Bytes, io::Error>::new(2);
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        if runtime.block_on(sender.send_data(first)).is_err() {
            return;
        }
        let mut at = after;
        while at < end {
            match read(&reader, at) {
                Ok(piece) => {
                    at += piece.len() as u64;
                    // The client went away: stop reading.
                    if runtime.block_on(sender.send_data(piece)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!("sending {object}: {e}");
                    sender.abort(e);
                    return;
                }
            }
        }
    });
    Ok(body.boxed())
}

/// `PUT` of a blob.
pub(super) async fn put(
    server: &Arc<Server>,
    sha256: Sha256,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(length) = text(CONTENT_LENGTH.as_str()).and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return Err(ApiError::new(
            StatusCode::LENGTH_REQUIRED,
            "invalid",
            "an upload carries Content-Length",
        ));
    };
    let limit = server.config.max_object_bytes;
    if length > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("{length} bytes is over this server's {limit}-byte object limit"),
        )
        .with_detail(serde_json::json!({ "limit": limit })));
    }
    let Some(checksum) = text("x-amz-checksum-sha256") else {
        return Err(ApiError::invalid(
            "an upload carries x-amz-checksum-sha256 (base64 of its SHA-256)",
        ));
    };
    let digest = base64::engine::general_purpose::STANDARD
        .decode(checksum.trim())
        .map_err(|e| ApiError::invalid(format!("x-amz-checksum-sha256 is not base64: {e}")))?;
    if digest != sha256.0 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "digest_mismatch",
            "x-amz-checksum-sha256 names another digest than the URL",
        ));
    }
    if text(IF_NONE_MATCH.as_str()).map(str::trim) != Some("*") {
        return Err(ApiError::invalid(
            "an upload carries If-None-Match: * (objects are never replaced)",
        ));
    }
    let object = ObjectRef { sha256, length };
    if server.store.contains(&object) {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed",
            "the object is already here",
        ));
    }
    let (sender, mut pieces) = tokio::sync::mpsc::channel::<Bytes>(8);
    let store = server.store.clone();
    let writing = tokio::task::spawn_blocking(move || {
        let mut writer = store.writer().map_err(ApiError::internal)?;
        while let Some(piece) = pieces.blocking_recv() {
            if writer.len() + piece.len() as u64 > length {
                return Err(ApiError::invalid(
                    "the body is longer than its Content-Length",
                ));
            }
            writer.write_all(&piece).map_err(ApiError::internal)?;
        }
        if writer.len() != length {
            return Err(ApiError::invalid(format!(
                "the body ended after {} of {length} bytes",
                writer.len()
            )));
        }
        match writer.finish(Some(&object)) {
            Ok(_) => Ok(()),
            Err(StoreError::Mismatch { found, .. }) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "digest_mismatch",
                format!("the bytes sent are {found}, not the object the URL names"),
            )),
            Err(e) => Err(ApiError::internal(e)),
        }
    });
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            // A broken body: the writer finds it short and says so.
            break;
        };
        if let Ok(data) = frame.into_data() {
            if sender.send(data).await.is_err() {
                break;
            }
        }
    }
    drop(sender);
    writing.await.map_err(ApiError::internal)??;
    tracing::info!("admitted {object}");
    Ok(empty(StatusCode::CREATED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_match_by_value_or_star() {
        let tag = "\"ab\"";
        assert!(matches_etag("\"ab\"", tag));
        assert!(matches_etag("\"x\", W/\"ab\"", tag));
        assert!(matches_etag("*", tag));
        assert!(!matches_etag("\"abc\"", tag));
    }
}
