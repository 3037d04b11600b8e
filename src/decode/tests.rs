//! Tests of the decode core.

use super::testing::{refusal, Case};
use super::*;

#[test]
fn rounding_keeps_subnormals_ties_to_even_and_canonical_nans() {
    let mut b = [0u8; 4];
    let bits = |l: Logical, v: f32, b: &mut [u8; 4]| {
        l.store(v, b);
        match l {
            Logical::F32 => u32::from_le_bytes(*b),
            _ => u16::from_le_bytes([b[0], b[1]]) as u32,
        }
    };
    assert_eq!(
        bits(Logical::F32, f32::from_bits(0x7F80_0001), &mut b),
        0x7FC0_0000
    );
    assert_eq!(bits(Logical::BF16, f32::NAN, &mut b), 0x7FC0);
    assert_eq!(bits(Logical::F16, -f32::NAN, &mut b), 0x7E00);
    // 1 + 2^-8 is a tie between bf16 1.0 and 1 + 2^-7: even is 1.0.
    assert_eq!(bits(Logical::BF16, 1.0 + 2f32.powi(-8), &mut b), 0x3F80);
    assert_eq!(
        bits(Logical::BF16, 1.0 + 3.0 * 2f32.powi(-8), &mut b),
        0x3F82
    );
    assert_eq!(
        bits(Logical::F16, 65520.0, &mut b),
        0x7C00,
        "overflows to infinity"
    );
    assert_eq!(
        bits(Logical::F16, 2f32.powi(-24), &mut b),
        0x0001,
        "the smallest subnormal"
    );
    assert_eq!(bits(Logical::BF16, f32::from_bits(1), &mut b), 0x0000);
    assert_eq!(
        bits(Logical::BF16, f32::from_bits(0x0001_8000), &mut b),
        0x0002
    );
}

#[test]
fn an_unknown_scheme_is_refused_by_name() {
    let err = Case::new("future.q9", &[2, 2]).with(Dtype::BF16, refusal);
    assert_eq!(err, DecodeError::UnknownScheme("future.q9".into()));
    assert!(err.to_string().contains("future.q9"));
}

#[test]
fn views_multiply_leading_extents() {
    assert_eq!(View::of(&[]), Some(View { rows: 1, cols: 1 }));
    assert_eq!(View::of(&[7]), Some(View { rows: 1, cols: 7 }));
    assert_eq!(View::of(&[2, 3, 4]), Some(View { rows: 6, cols: 4 }));
    assert_eq!(View::of(&[u64::MAX, 2]), None);
}

#[test]
fn bulk_stores_equal_single_stores_on_every_kind_of_value() {
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        65504.0,
        65520.0,
        2f32.powi(-24),
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        1.0 + 2f32.powi(-8),
        1.0 + 2f32.powi(-11),
    ];
    // And a spread of bit patterns.
    values.extend((0..20_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
    for logical in [Logical::F32, Logical::BF16, Logical::F16] {
        let size = logical.size();
        let mut bulk = vec![0u8; values.len() * size];
        logical.store_all(&values, &mut bulk);
        for (i, v) in values.iter().enumerate() {
            let mut one = [0u8; 4];
            logical.store(*v, &mut one);
            assert_eq!(
                &bulk[i * size..(i + 1) * size],
                &one[..size],
                "{logical:?} {v:e} ({:#x})",
                v.to_bits()
            );
        }
    }
}
