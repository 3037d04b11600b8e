//! (being written)

/// The schemes of this module.
pub(super) const SCHEMES: [super::Scheme; 0] = [];
