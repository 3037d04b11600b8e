//! Names (spec §2, §3, §7): segments, paths, lane labels and repo names.

use super::{FormatError, FormatResult};

/// A segment: non-empty, not `.` or `..`, no `/`, `\` or NUL (spec §2).
pub fn is_segment(text: &str) -> bool {
    !text.is_empty() && text != "." && text != ".." && !text.contains(['/', '\\', '\0'])
}

/// A path: one or more segments joined by `/` (spec §2).
pub fn is_path(text: &str) -> bool {
    text.split('/').all(is_segment)
}

/// A label (lane or release version): alphanumeric first, then at most 63 of
/// `A-Za-z0-9._+!-` (spec §3).
pub fn is_label(text: &str) -> bool {
    let mut bytes = text.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && text.len() <= 64
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"._+!-".contains(&b))
}

/// A portable name segment, as this implementation writes repo names: ASCII letters, digits,
/// `.`, `_` and `-`, not leading `.`, at most 128 bytes.
pub fn is_portable(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && !text.starts_with('.')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Splits a repo name `<org>/<name>` whose two parts are segments (spec §7).
///
/// # Errors
/// Not exactly two segments.
pub fn split_repo_name(name: &str) -> FormatResult<(&str, &str)> {
    match name.split_once('/') {
        Some((org, model)) if is_segment(org) && is_segment(model) => Ok((org, model)),
        _ => Err(FormatError::Invalid(format!(
            "repo name {name:?} is not <org>/<name>"
        ))),
    }
}

/// Text with a NUL or another control character (U+0000–U+001F, U+007F–U+009F), which no
/// name shown as a file, key or attribute may hold.
pub fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_refuse_traversal_and_separators() {
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0b"] {
            assert!(!is_segment(bad), "{bad:?}");
        }
        for good in ["a", "...", ".hidden", "unet", "a b"] {
            assert!(is_segment(good), "{good:?}");
        }
        assert!(is_path("unet/config.json"));
        assert!(!is_path("unet//config.json"));
        assert!(!is_path("/abs"));
        assert!(!is_path("a/../b"));
    }

    #[test]
    fn labels_follow_the_lane_grammar() {
        assert!(is_label("bf16"));
        assert!(is_label("int8-convrot"));
        assert!(is_label("1.0"));
        assert!(!is_label("-x"));
        assert!(is_label("non_ema"));
        assert!(!is_label("a b"));
        assert!(!is_label("_x"));
        assert!(!is_label(""));
        assert!(is_label(&"a".repeat(64)));
        assert!(!is_label(&"a".repeat(65)));
    }
}
