//! distribution/1 over HTTP (distribution.md): a server over a store, and the client that
//! downloads a model's commit from one.
//!
//! ```text
//! B/blobs/<aa>/<bb>/<sha256>            GET (Range), HEAD, PUT (--write)          serve::blobs
//! B/v1/models/<org>/<name>/resolve      GET: a release's lane, as JSON             serve::models
//! B/v1/models/<org>/<name>/commits      POST: record an uploaded tree (--write)    serve::models
//! B/refs/<org>/<name>.json              GET: the repo document (a static origin)   serve::models
//! B/v1/models                           GET: the models served (our addition)      serve::models
//! ```
//!
//! - [`serve`] answers these routes from a [`Store`](crate::store::Store): blobs are read through
//!   [`BlobReader`](crate::io::BlobReader), so a damaged blob is never sent, and uploads enter by
//!   the store's one door ([`ObjectWriter`](crate::store::ObjectWriter): hashed, flushed,
//!   renamed) only when their bytes are the digest the URL names.
//! - [`client`] is one endpoint seen from a downloader: its origin, its token (sent to that
//!   origin only), redirects, retries and resumed ranges.
//! - [`admit`] fetches one object into the store: streamed into the store's writer through a
//!   bounded buffer, published only when its length and SHA-256 are right.
//! - [`download`] walks commit → tree → header → chunks and assets, admits each object after
//!   checking its length and SHA-256, and names the commit in the local repo document last.
//! - [`upload`] sends a local repo's commits the other way: chunks, assets and repo files, then
//!   headers, then trees, each `HEAD` first so a rerun sends only what is missing; then records
//!   the commits.
//! - [`origin`] is what both need of an endpoint: the HTTP [`client`], an S3 bucket ([`s3`]) or
//!   a store directory ([`dir`]) holding the static origin layout (§8).
//!
//! The lazy mount over an endpoint is [`crate::lazy`]'s.

pub mod admit;
pub mod client;
pub mod connect;
pub mod dir;
pub mod download;
pub mod origin;
pub mod range;
pub mod s3;
pub mod serve;
pub mod upload;

use serde::{Deserialize, Serialize};

use crate::format::{ObjectRef, Sha256};

/// The most bytes one object may have (distribution.md §7).
pub const MAX_OBJECT_BYTES: u64 = 5 << 30;

/// The most bytes a document (tree, header, repo) or a JSON answer may have (§7).
pub const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// The org of a machine's own repos, which an endpoint never serves (§1).
pub const LOCAL_ORG: &str = "local";

/// An object reference as the protocol's JSON writes it: `{"sha256": hex, "length": n}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireRefText", into = "WireRefText")]
pub struct WireRef(pub ObjectRef);

#[derive(Serialize, Deserialize)]
struct WireRefText {
    sha256: String,
    length: u64,
}

impl TryFrom<WireRefText> for WireRef {
    type Error = String;

    fn try_from(text: WireRefText) -> Result<WireRef, String> {
        let sha256 = text.sha256.parse::<Sha256>().map_err(|e| e.to_string())?;
        Ok(WireRef(ObjectRef {
            sha256,
            length: text.length,
        }))
    }
}

impl From<WireRef> for WireRefText {
    fn from(wire: WireRef) -> WireRefText {
        WireRefText {
            sha256: wire.0.sha256.hex(),
            length: wire.0.length,
        }
    }
}

/// The resolve route's answer (§2): the commit a model's release names in a lane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    /// The release's version; empty for a commit no release names.
    #[serde(default)]
    pub release: String,
    /// The lane label.
    #[serde(default)]
    pub lane: String,
    /// The commit (its tree).
    pub commit: WireRef,
    /// The commit's header.
    pub header: WireRef,
    /// Why other lanes were passed over.
    #[serde(default)]
    pub reasons: Vec<String>,
}

/// The answer of `GET v1/models`, this implementation's addition to the protocol: the models
/// an endpoint serves to the caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// The models, by name.
    pub models: Vec<ModelEntry>,
}

/// One model of a [`ModelList`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// `<org>/<name>`.
    pub name: String,
}

impl ModelList {
    /// The list of `names`.
    pub fn of(names: impl IntoIterator<Item = String>) -> ModelList {
        ModelList {
            models: names.into_iter().map(|name| ModelEntry { name }).collect(),
        }
    }
}

/// The body of a `POST …/commits` (§4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitRequest {
    /// The uploaded tree.
    pub commit: WireRef,
}

/// The path of `object` under an endpoint: `blobs/<aa>/<bb>/<sha256>` (§1).
pub fn blob_key(object: &Sha256) -> String {
    let hex = object.hex();
    format!("blobs/{}/{}/{hex}", &hex[0..2], &hex[2..4])
}

/// The digest a blob path's three segments name, when `<aa>` and `<bb>` are its first two
/// pairs of hex digits.
pub fn parse_blob_key(aa: &str, bb: &str, hex: &str) -> Option<Sha256> {
    let sha256 = hex.parse::<Sha256>().ok()?;
    (hex.get(0..2) == Some(aa) && hex.get(2..4) == Some(bb)).then_some(sha256)
}

/// Percent-encodes one URL path segment: every byte but the unreserved ones (RFC 3986 §2.3),
/// so a name holding a space, `%`, `?` or `#` keeps the URL's structure (§1).
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decodes a percent-encoded path segment or query value; `None` for a bad escape or bytes that
/// are not UTF-8.
pub fn decode_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let pair = segment.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(pair, 16).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The route of a model: `v1/models/<org>/<name>/<what>`, the name ASCII-lowered and each
/// segment percent-encoded (§1).
pub fn model_key(name: &str, what: &str) -> Option<String> {
    let (org, model) = crate::format::names::split_repo_name(name).ok()?;
    Some(format!(
        "v1/models/{}/{}/{what}",
        encode_segment(&org.to_ascii_lowercase()),
        encode_segment(&model.to_ascii_lowercase())
    ))
}

/// Whether `name` is in the `local` org, which no endpoint serves (§1).
pub fn is_local(name: &str) -> bool {
    name.split('/')
        .next()
        .is_some_and(|org| org.eq_ignore_ascii_case(LOCAL_ORG))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn blob_keys_round_trip_and_wrong_prefixes_are_refused() {
        let sha: Sha256 = HEX.parse().unwrap();
        assert_eq!(blob_key(&sha), format!("blobs/e3/b0/{HEX}"));
        assert_eq!(parse_blob_key("e3", "b0", HEX), Some(sha));
        assert_eq!(parse_blob_key("e3", "b1", HEX), None);
        assert_eq!(parse_blob_key("E3", "b0", HEX), None);
        assert_eq!(parse_blob_key("e3", "b0", &HEX.to_uppercase()), None);
        assert_eq!(parse_blob_key("e3", "b0", &HEX[..63]), None);
    }

    #[test]
    fn segments_are_escaped_so_names_keep_the_url_structure() {
        assert_eq!(encode_segment("sd-xl_1.0~"), "sd-xl_1.0~");
        assert_eq!(encode_segment("a b%?#/é"), "a%20b%25%3F%23%2F%C3%A9");
        for name in ["a b%?#/é", "plain", ""] {
            assert_eq!(decode_segment(&encode_segment(name)).as_deref(), Some(name));
        }
        assert_eq!(decode_segment("%zz"), None);
        assert_eq!(decode_segment("%4"), None);
        assert_eq!(decode_segment("%FF"), None);
        assert_eq!(
            model_key("Acme/SD XL", "resolve").as_deref(),
            Some("v1/models/acme/sd%20xl/resolve")
        );
        assert_eq!(model_key("acme", "resolve"), None);
    }

    #[test]
    fn wire_refs_read_and_write_the_protocol_json() {
        let text = format!(r#"{{"sha256":"{HEX}","length":0}}"#);
        let wire: WireRef = serde_json::from_str(&text).unwrap();
        assert_eq!(wire.0, ObjectRef::of(b""));
        assert_eq!(serde_json::to_string(&wire).unwrap(), text);
        let upper = text.replace("e3b0", "E3B0");
        assert!(serde_json::from_str::<WireRef>(&upper).is_err());
    }

    #[test]
    fn the_local_org_is_recognised_in_any_case() {
        assert!(is_local("local/x"));
        assert!(is_local("LOCAL/x"));
        assert!(!is_local("locals/x"));
    }
}
