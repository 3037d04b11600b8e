//! Test support shared by the decode tests: [`Case`], a tensor to decode that owns its params
//! and parts, helpers that prepare or decode a borrowed [`Encoded`], and small builders of
//! param values and little-endian bytes.

use super::{decode, prepare, DecodeError, DecodeResult, Encoded, Logical, Part, View};
use crate::format::{Config, Dtype, Value};

/// A stored part: role, dtype, shape and bytes.
pub(crate) type Stored = (&'static str, Dtype, Vec<u64>, Vec<u8>);

/// A tensor to decode, owning its params and parts.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    /// The scheme name.
    pub(crate) scheme: &'static str,
    /// The params.
    pub(crate) params: Config,
    /// The logical shape.
    pub(crate) shape: Vec<u64>,
    /// The parts, in the order given.
    pub(crate) parts: Vec<Stored>,
}

impl Case {
    /// `scheme` over `shape`, with no params and no parts yet.
    pub(crate) fn new(scheme: &'static str, shape: &[u64]) -> Case {
        Case {
            scheme,
            params: Config::new(),
            shape: shape.to_vec(),
            parts: Vec::new(),
        }
    }

    /// `scheme` over `shape` with copies of `params` and `parts`.
    pub(crate) fn of(
        scheme: &'static str,
        params: &Config,
        shape: &[u64],
        parts: &[Stored],
    ) -> Case {
        Case {
            scheme,
            params: params.clone(),
            shape: shape.to_vec(),
            parts: parts.to_vec(),
        }
    }

    /// Adds or replaces the param `key`.
    pub(crate) fn param(mut self, key: &str, value: Value) -> Case {
        self.params.insert(key.to_owned(), value);
        self
    }

    /// Removes the param `key`.
    pub(crate) fn no_param(mut self, key: &str) -> Case {
        self.params.remove(key);
        self
    }

    /// Adds or replaces the part of `role`.
    pub(crate) fn part(
        mut self,
        role: &'static str,
        dtype: Dtype,
        shape: &[u64],
        bytes: Vec<u8>,
    ) -> Case {
        self.parts.retain(|p| p.0 != role);
        self.parts.push((role, dtype, shape.to_vec(), bytes));
        self
    }

    /// Removes the part of `role`.
    pub(crate) fn no_part(mut self, role: &str) -> Case {
        self.parts.retain(|p| p.0 != role);
        self
    }

    /// Calls `f` on the tensor borrowed as an [`Encoded`] of logical dtype `dtype`.
    pub(crate) fn with<R>(&self, dtype: Dtype, f: impl FnOnce(&Encoded<'_>) -> R) -> R {
        let parts = self
            .parts
            .iter()
            .map(|(role, dtype, shape, bytes)| Part {
                role,
                dtype,
                shape,
                bytes,
            })
            .collect();
        f(&Encoded {
            scheme: self.scheme,
            params: &self.params,
            dtype: &dtype,
            shape: &self.shape,
            parts,
        })
    }

    /// Why `prepare` refuses the tensor as F32.
    ///
    /// # Panics
    /// If it is accepted.
    pub(crate) fn refusal(&self) -> DecodeError {
        self.with(Dtype::F32, refusal)
    }

    /// Whether `prepare` accepts the tensor as F32.
    pub(crate) fn accepted(&self) -> bool {
        self.with(Dtype::F32, |t| prepare(t).is_ok())
    }

    /// The whole tensor decoded to `dtype`, or the refusal of `prepare` or of a row.
    pub(crate) fn try_bytes(&self, dtype: Dtype) -> DecodeResult<Vec<u8>> {
        self.with(dtype, decoded)
    }

    /// The whole tensor decoded to `dtype`.
    ///
    /// # Panics
    /// If the decode is refused.
    pub(crate) fn bytes(&self, dtype: Dtype) -> Vec<u8> {
        self.try_bytes(dtype).expect("decodes")
    }

    /// The whole tensor decoded to F32, as values, or the refusal.
    pub(crate) fn try_f32s(&self) -> DecodeResult<Vec<f32>> {
        self.try_bytes(Dtype::F32).map(|b| le_f32s(&b))
    }

    /// The whole tensor decoded to F32, as values.
    ///
    /// # Panics
    /// If the decode is refused.
    pub(crate) fn f32s(&self) -> Vec<f32> {
        le_f32s(&self.bytes(Dtype::F32))
    }

    /// Every row range `[a, b)` decodes to the same bytes as the whole tensor.
    pub(crate) fn assert_ranges_agree(&self, dtype: Dtype) {
        let whole = self.bytes(dtype.clone());
        let view = View::of(&self.shape).unwrap();
        let row_bytes = whole.len() / view.rows as usize;
        self.with(dtype, |t| {
            let decoder = prepare(t).unwrap();
            for a in 0..view.rows as usize {
                for b in a + 1..=view.rows as usize {
                    let mut out = vec![0u8; (b - a) * row_bytes];
                    decoder.rows(a as u64, &mut out).unwrap();
                    assert_eq!(out, whole[a * row_bytes..b * row_bytes], "rows {a}..{b}");
                }
            }
        });
    }
}

/// Asserts that `prepare` refuses `case` with a message holding every one of `fragments`.
pub(crate) fn assert_refused(case: &Case, fragments: &[&str]) {
    let message = case.refusal().to_string();
    for f in fragments {
        assert!(message.contains(f), "{message:?} lacks {f:?}");
    }
}

/// Why `prepare` refuses `t`.
///
/// # Panics
/// If it is accepted.
pub(crate) fn refusal(t: &Encoded<'_>) -> DecodeError {
    prepare(t).err().expect("refused")
}

/// The whole of `t` decoded to its logical dtype, or the refusal.
pub(crate) fn decoded(t: &Encoded<'_>) -> DecodeResult<Vec<u8>> {
    // A shape or dtype that cannot be decoded sizes nothing: `decode` refuses it first.
    let n = View::of(t.shape).map_or(0, View::len) as usize;
    let size = Logical::of(t.dtype).map_or(0, Logical::size);
    let mut out = vec![0u8; n * size];
    decode(t, &mut out)?;
    Ok(out)
}

/// The whole of `t` (logical dtype F32) decoded, as values.
///
/// # Panics
/// If the decode is refused.
pub(crate) fn floats(t: &Encoded<'_>) -> Vec<f32> {
    le_f32s(&decoded(t).expect("decodes"))
}

/// An integer param value.
pub(crate) fn int(n: i64) -> Value {
    if n < 0 {
        Value::Nint((-1 - n) as u64)
    } else {
        Value::Uint(n as u64)
    }
}

/// A text param value.
pub(crate) fn text(t: &str) -> Value {
    Value::Text(t.into())
}

/// Params from `(name, value)` pairs.
pub(crate) fn params(pairs: &[(&str, Value)]) -> Config {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// 32-bit words as little-endian bytes.
pub(crate) fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Values as little-endian F32 bytes.
pub(crate) fn f32_bytes(vs: &[f32]) -> Vec<u8> {
    vs.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Values rounded to F16, as little-endian bytes.
pub(crate) fn f16_bytes(vs: &[f32]) -> Vec<u8> {
    vs.iter()
        .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

/// Values rounded to BF16, as little-endian bytes.
pub(crate) fn bf16_bytes(vs: &[f32]) -> Vec<u8> {
    vs.iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

/// Little-endian F32 bytes as values.
pub(crate) fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian 32-bit words.
pub(crate) fn le_u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
