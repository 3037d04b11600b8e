//! Dtypes (spec §5): the 22 safetensors 0.8 names, and any other non-empty name as a newer
//! dtype whose bytes are read raw.

use std::fmt;

use super::FormatError;

/// A tensor or part dtype. Known dtypes carry their bit width; [`Dtype::Other`] is a name from a
/// later writer: its bytes are located and verified, only a typed view of them is refused.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
    /// A dtype name this build does not know (never empty).
    Other(Box<str>),
}

/// The known dtypes in the safetensors library's declaration order, which its writer sorts by
/// (descending) before tensor names.
const KNOWN: [(Dtype, &str, u32); 22] = [
    (Dtype::BOOL, "BOOL", 8),
    (Dtype::F4, "F4", 4),
    (Dtype::F6_E2M3, "F6_E2M3", 6),
    (Dtype::F6_E3M2, "F6_E3M2", 6),
    (Dtype::U8, "U8", 8),
    (Dtype::I8, "I8", 8),
    (Dtype::F8_E5M2, "F8_E5M2", 8),
    (Dtype::F8_E4M3, "F8_E4M3", 8),
    (Dtype::F8_E8M0, "F8_E8M0", 8),
    (Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8),
    (Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8),
    (Dtype::I16, "I16", 16),
    (Dtype::U16, "U16", 16),
    (Dtype::F16, "F16", 16),
    (Dtype::BF16, "BF16", 16),
    (Dtype::I32, "I32", 32),
    (Dtype::U32, "U32", 32),
    (Dtype::F32, "F32", 32),
    (Dtype::C64, "C64", 64),
    (Dtype::F64, "F64", 64),
    (Dtype::I64, "I64", 64),
    (Dtype::U64, "U64", 64),
];

impl Dtype {
    /// The dtype called `name`; an unknown non-empty name is [`Dtype::Other`].
    ///
    /// # Errors
    /// An empty name (spec §5: a dtype is any non-empty name).
    pub fn parse(name: &str) -> Result<Dtype, FormatError> {
        if name.is_empty() {
            return Err(FormatError::Invalid("a dtype is a non-empty name".into()));
        }
        Ok(Dtype::known(name).unwrap_or_else(|| Dtype::Other(name.into())))
    }

    /// The known dtype called `name`, if any.
    pub fn known(name: &str) -> Option<Dtype> {
        KNOWN
            .iter()
            .find(|(_, n, _)| *n == name)
            .map(|(d, _, _)| d.clone())
    }

    /// The safetensors name (`F32`, `F8_E4M3`, …).
    pub fn name(&self) -> &str {
        match self {
            Dtype::Other(name) => name,
            known => KNOWN[known.rank().expect("known")].1,
        }
    }

    /// Bits per element; `None` for an unknown dtype.
    pub fn bits(&self) -> Option<u32> {
        self.rank().map(|i| KNOWN[i].2)
    }

    /// Position in the safetensors library's dtype order; `None` for an unknown dtype.
    pub fn rank(&self) -> Option<usize> {
        KNOWN.iter().position(|(d, _, _)| d == self)
    }

    /// Byte length of a tensor of this dtype and `shape` (spec §5): the bit width times each
    /// extent in order, in checked `u64` arithmetic, divided by eight. `None` for an unknown
    /// dtype.
    ///
    /// # Errors
    /// A multiplication overflows (even when a later extent is zero) or the bit total is not a
    /// multiple of eight.
    pub fn byte_len(&self, shape: &[u64]) -> Result<Option<u64>, FormatError> {
        let Some(bits) = self.bits() else {
            return Ok(None);
        };
        let mut total = bits as u64;
        for &extent in shape {
            total = total.checked_mul(extent).ok_or_else(|| {
                FormatError::Invalid(format!(
                    "{} {shape:?}: the size overflows 64 bits",
                    self.name()
                ))
            })?;
        }
        if !total.is_multiple_of(8) {
            return Err(FormatError::Invalid(format!(
                "{} {shape:?}: {total} bits is not a whole number of bytes",
                self.name()
            )));
        }
        Ok(Some(total / 8))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_name_round_trips() {
        for (dtype, name, _) in KNOWN.iter() {
            assert_eq!(Dtype::parse(name).unwrap(), *dtype);
            assert_eq!(dtype.name(), *name);
        }
        assert_eq!(Dtype::parse("F12").unwrap(), Dtype::Other("F12".into()));
        assert!(Dtype::parse("").is_err());
    }

    #[test]
    fn byte_len_checks_overflow_before_a_later_zero() {
        assert_eq!(Dtype::F32.byte_len(&[2, 3]).unwrap(), Some(24));
        assert_eq!(Dtype::F32.byte_len(&[]).unwrap(), Some(4));
        assert_eq!(Dtype::F4.byte_len(&[3, 2]).unwrap(), Some(3));
        assert!(Dtype::F4.byte_len(&[3]).is_err());
        assert!(Dtype::F6_E2M3.byte_len(&[4]).unwrap() == Some(3));
        assert!(Dtype::U8.byte_len(&[u64::MAX, 2, 0]).is_err());
        assert!(Dtype::U8.byte_len(&[u64::MAX, 0]).is_err());
        assert_eq!(Dtype::U8.byte_len(&[u64::MAX / 8, 0]).unwrap(), Some(0));
        assert_eq!(Dtype::Other("X".into()).byte_len(&[4]).unwrap(), None);
    }
}
