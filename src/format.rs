//! The `cozytensors/1` documents and the safetensors and GGUF containers, as bytes in and
//! bytes out.
//!
//! Nothing here does I/O: every parser takes a `&[u8]` and validates it completely, so fuzzers
//! and corpora call it directly.
//!
//! - [`object`]: object references (spec §1).
//! - [`dtype`]: dtypes and byte sizes (spec §5).
//! - [`cbor`]: the deterministic CBOR value domain of headers (spec §9).
//! - [`header`]: the typed `cozytensors/1` header (spec §4) with every reader refusal.
//! - [`json`]: strict JSON (duplicate keys refused) and the canonical JSON writer (spec §9).
//! - [`tree`], [`repo`]: `cozytensors.tree/1` and `cozytensors.repo/1` (spec §3, §7).
//! - [`names`]: segments, paths, lanes and repo names (spec §2, §3, §7).
//! - [`safetensors`]: the safetensors container: a strict header parser and the canonical writer.
//! - [`gguf`]: the GGUF container: a strict header parser and its exact writer.

pub mod cbor;
pub mod dtype;
pub mod gguf;
pub mod header;
pub mod json;
pub mod names;
pub mod object;
pub mod repo;
pub mod safetensors;
pub mod tree;

pub use cbor::Value;
pub use dtype::Dtype;
pub use header::{
    Body, ClassRef, Component, Config, Encoding, Header, Location, Part, Pipeline, Tensor,
};
pub use object::{Hasher, ObjectRef, Sha256};
pub use repo::{Release, Repo};
pub use tree::Tree;

/// Why a document or container was refused. Messages name the rule (spec section) and the
/// values involved; callers add the file they read.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FormatError {
    /// The bytes are not in the encoding the rule requires (CBOR, JSON, safetensors framing).
    #[error("{0}")]
    Encoding(String),
    /// A document of another kind or major version (spec §2).
    #[error("format {found:?} is not {expected}")]
    Format {
        /// The `format` tag found.
        found: String,
        /// The kind and major accepted, e.g. `cozytensors/1`.
        expected: &'static str,
    },
    /// Well-encoded, but a value breaks a rule of the spec.
    #[error("{0}")]
    Invalid(String),
}

/// Result of the format layer.
pub type FormatResult<T> = Result<T, FormatError>;
