//! Opening the origin a URL names: the one place that knows every implementation of
//! [`Origin`](super::origin::Origin).

use std::sync::Arc;

use super::client::{ClientConfig, Endpoint};
use super::dir::DirOrigin;
use super::origin::{Access, FetchResult, Origin};
use super::s3::S3Origin;

/// The origin `url` names: `s3://bucket/prefix` (credentials from the AWS environment
/// variables), `file:///dir` (a store directory), else an HTTP endpoint with bearer `token`
/// (`https://`, or `http://` on loopback) and `config` (retries, deadline).
///
/// # Errors
/// The URL is refused, or the origin cannot be opened.
pub fn open(
    url: &str,
    token: Option<String>,
    access: Access,
    config: ClientConfig,
) -> FetchResult<Arc<dyn Origin>> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    Ok(match scheme.map(str::to_ascii_lowercase).as_deref() {
        Some("s3") => Arc::new(S3Origin::new(url)?),
        Some("file") => Arc::new(DirOrigin::new(url, access)?),
        _ => Arc::new(Endpoint::new(url, token, config)?),
    })
}
