//! One `Range: bytes=…` over an object of known length (RFC 9110 §14), as a blob GET honours it
//! (distribution.md §2: a server SHOULD honour one range).

/// What a GET with a `Range` header gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// The whole object, `200`: no range, several ranges, or a header this server does not read
    /// (RFC 9110 lets a server ignore it).
    Whole,
    /// Bytes `start..=end`, `206`.
    Part {
        /// The first byte.
        start: u64,
        /// The last byte (inclusive).
        end: u64,
    },
    /// `416`: the range starts at or past the end.
    Unsatisfiable,
}

/// Reads `header` (the `Range` value, if any) for an object of `length` bytes.
pub fn parse_range(header: Option<&str>, length: u64) -> RangeAnswer {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return RangeAnswer::Whole;
    };
    if spec.contains(',') {
        return RangeAnswer::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeAnswer::Whole;
    };
    let number = |text: &str| -> Option<u64> {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // `bytes=-n`: the last n bytes.
        return match number(last) {
            None => RangeAnswer::Whole,
            Some(0) => RangeAnswer::Unsatisfiable,
            Some(_) if length == 0 => RangeAnswer::Unsatisfiable,
            Some(suffix) => RangeAnswer::Part {
                start: length - suffix.min(length),
                end: length - 1,
            },
        };
    }
    let Some(start) = number(first) else {
        return RangeAnswer::Whole;
    };
    let last = match last.is_empty() {
        true => None,
        false => match number(last) {
            Some(last) if last >= start => Some(last),
            _ => return RangeAnswer::Whole,
        },
    };
    if start >= length {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Part {
        start,
        end: last.map_or(length - 1, |last| last.min(length - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::RangeAnswer::*;
    use super::*;

    #[test]
    fn one_range_is_honoured_and_clamped_to_the_object() {
        assert_eq!(
            parse_range(Some("bytes=0-9"), 100),
            Part { start: 0, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=90-200"), 100),
            Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=99-"), 100),
            Part { start: 99, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-5"), 100),
            Part { start: 95, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-500"), 100),
            Part { start: 0, end: 99 }
        );
        assert_eq!(
            parse_range(Some(" bytes= 3 - 4 "), 100),
            Part { start: 3, end: 4 }
        );
    }

    #[test]
    fn ranges_past_the_end_are_unsatisfiable() {
        assert_eq!(parse_range(Some("bytes=100-"), 100), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=100-100"), 100), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 100), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-1"), 0), Unsatisfiable);
    }

    #[test]
    fn what_is_not_one_byte_range_gets_the_whole_object() {
        for header in [
            None,
            Some("bytes=0-1,5-6"),
            Some("items=0-1"),
            Some("bytes=5-1"),
            Some("bytes=a-b"),
            Some("bytes=-"),
            Some("bytes=1"),
            Some("bytes=+1-2"),
        ] {
            assert_eq!(parse_range(header, 100), Whole, "{header:?}");
        }
    }
}
