//! Object identity (spec §1): an immutable byte string named by `{sha256, length}`.

use std::fmt;
use std::str::FromStr;

use sha2::Digest as _;

use super::FormatError;

/// A SHA-256 digest: 32 bytes, shown as 64 lowercase hex digits.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Sha256 {
        Sha256(sha2::Sha256::digest(bytes).into())
    }

    /// The 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl FromStr for Sha256 {
    type Err = FormatError;

    /// Parses exactly 64 lowercase hex digits (spec §1); uppercase is refused so one digest has
    /// one spelling.
    fn from_str(text: &str) -> Result<Sha256, FormatError> {
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if text.len() != 64 || !text.bytes().all(lower_hex) {
            return Err(FormatError::Invalid(format!(
                "{text:?} is not a sha256 digest (64 lowercase hex digits)"
            )));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).expect("checked hex");
        Ok(Sha256(out))
    }
}

/// An object reference `{sha256, length}` (spec §1). An object satisfies it only when both its
/// length in bytes and its SHA-256 match.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct ObjectRef {
    /// SHA-256 of the object's bytes.
    pub sha256: Sha256,
    /// The object's length in bytes.
    pub length: u64,
}

impl ObjectRef {
    /// The reference of `bytes`.
    pub fn of(bytes: &[u8]) -> ObjectRef {
        ObjectRef {
            sha256: Sha256::of(bytes),
            length: bytes.len() as u64,
        }
    }

    /// Where the object lives under a store or static origin: `blobs/<aa>/<bb>/<sha256>`
    /// (spec §1).
    pub fn blob_path(&self) -> String {
        let hex = self.sha256.hex();
        format!("blobs/{}/{}/{}", &hex[0..2], &hex[2..4], hex)
    }

    /// The id of a commit or header, `sha256:<hex>` (spec §7).
    pub fn id(&self) -> String {
        format!("sha256:{}", self.sha256)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{} ({} bytes)", self.sha256, self.length)
    }
}

/// Streaming SHA-256 that also counts bytes, giving an [`ObjectRef`] at the end.
#[derive(Clone, Default)]
pub struct Hasher {
    inner: sha2::Sha256,
    length: u64,
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hasher({} bytes)", self.length)
    }
}

impl Hasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> Hasher {
        Hasher::default()
    }

    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
        self.length += bytes.len() as u64;
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether nothing was fed yet.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The reference of everything fed.
    pub fn finish(self) -> ObjectRef {
        ObjectRef {
            sha256: Sha256(self.inner.finalize().into()),
            length: self.length,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_has_the_well_known_digest() {
        let empty = ObjectRef::of(b"");
        assert_eq!(
            empty.sha256.hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(empty.length, 0);
        assert_eq!(
            empty.blob_path(),
            "blobs/e3/b0/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn digest_parsing_refuses_uppercase_and_wrong_lengths() {
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(hex.parse::<Sha256>().is_ok());
        assert!(hex.to_uppercase().parse::<Sha256>().is_err());
        assert!(hex[1..].parse::<Sha256>().is_err());
        assert!(format!("{hex}0").parse::<Sha256>().is_err());
    }

    #[test]
    fn streaming_hash_equals_one_shot() {
        let mut h = Hasher::new();
        h.update(b"hello ");
        h.update(b"world");
        assert_eq!(h.finish(), ObjectRef::of(b"hello world"));
    }
}
