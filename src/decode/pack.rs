//! Bit packing (spec §6 "Building blocks"): codes of `b` bits held in little-endian words of
//! `w` bits (8, 16 or 32) along a lane.

/// Where code `t` of a lane of `n` codes goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Word `⌊t/p⌋`, slot `σ(t mod p)`; `⌈n/p⌉` words.
    Word,
    /// Word `t mod m`, slot `σ(⌊t/m⌋)`, `m = n/p` words (`n` a multiple of `p`).
    Planar,
    /// One bit stream, word `k` holding stream bits `k·w …`; code `t` is bits `t·b …`, crossing
    /// words; always low first; `⌈n·b/w⌉` words.
    Dense,
}

/// Which slot of its word the `e`-th code of the word takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `σ(e) = e`.
    LowFirst,
    /// `σ(e) = p − 1 − e`.
    HighFirst,
    /// Slot `s` holds code `π[s]` (AWQ: `[0, 2, 4, 6, 1, 3, 5, 7]`).
    Slots(&'static [u8]),
}

/// A packing: code width, word width, fill and order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Bits per code, 1 ..= 8.
    pub bits: u32,
    /// Bits per word: 8, 16 or 32.
    pub word_bits: u32,
    /// The fill.
    pub fill: Fill,
    /// The slot order (ignored by `Dense`).
    pub order: Order,
}

impl Packing {
    /// Codes per word, `p = ⌊w/b⌋`.
    pub fn per_word(&self) -> u64 {
        (self.word_bits / self.bits) as u64
    }

    /// Words a lane of `n` codes takes.
    pub fn words(&self, n: u64) -> u64 {
        match self.fill {
            Fill::Word => n.div_ceil(self.per_word()),
            Fill::Planar => n / self.per_word(),
            Fill::Dense => (n * self.bits as u64).div_ceil(self.word_bits as u64),
        }
    }

    /// The slot of the `e`-th code of a word.
    #[inline]
    fn slot(&self, e: u64) -> u64 {
        match self.order {
            Order::LowFirst => e,
            Order::HighFirst => self.per_word() - 1 - e,
            Order::Slots(pi) => pi
                .iter()
                .position(|&c| c as u64 == e)
                .expect("a permutation") as u64,
        }
    }

    /// The raw `b`-bit value of code `t` of a lane of `n` codes whose `k`-th word is `word(k)`.
    #[inline]
    pub fn raw(&self, n: u64, t: u64, word: impl Fn(u64) -> u32) -> u32 {
        let b = self.bits as u64;
        let mask = (1u64 << b) - 1;
        match self.fill {
            Fill::Word => {
                let p = self.per_word();
                ((word(t / p) as u64 >> (self.slot(t % p) * b)) & mask) as u32
            }
            Fill::Planar => {
                let m = n / self.per_word();
                ((word(t % m) as u64 >> (self.slot(t / m) * b)) & mask) as u32
            }
            Fill::Dense => {
                let w = self.word_bits as u64;
                let start = t * b;
                let (k, shift) = (start / w, start % w);
                let mut stream = word(k) as u64 >> shift;
                if shift + b > w {
                    stream |= (word(k + 1) as u64) << (w - shift);
                }
                (stream & mask) as u32
            }
        }
    }
}

/// A `bits`-bit two's-complement value.
#[inline]
pub fn signed(raw: u32, bits: u32) -> i32 {
    let shift = 32 - bits;
    ((raw << shift) as i32) >> shift
}

/// Code `t` of a run of 4-bit codes packed two to a byte (`word` fill in `U8` words): code
/// `2k` in the low nibble of byte `k` (`low_first`, spec §5's `F4`), or in the high nibble
/// (`high_first`).
#[inline]
pub fn nibble(bytes: &[u8], t: usize, high_first: bool) -> u8 {
    let shift = ((t & 1) ^ high_first as usize) * 4;
    (bytes[t / 2] >> shift) & 15
}

/// Word `index` of a part of `word_bits`-bit little-endian words.
#[inline]
pub fn word_at(bytes: &[u8], word_bits: u32, index: u64) -> u32 {
    let i = index as usize;
    match word_bits {
        8 => bytes[i] as u32,
        16 => u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32,
        _ => u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(words: &[u32]) -> impl Fn(u64) -> u32 + '_ {
        move |k| words[k as usize]
    }

    #[test]
    fn word_fill_low_and_high_first() {
        let p = Packing {
            bits: 4,
            word_bits: 8,
            fill: Fill::Word,
            order: Order::LowFirst,
        };
        assert_eq!(p.raw(4, 0, lane(&[0x21, 0x43])), 1);
        assert_eq!(p.raw(4, 1, lane(&[0x21, 0x43])), 2);
        assert_eq!(p.raw(4, 3, lane(&[0x21, 0x43])), 4);
        let p = Packing {
            order: Order::HighFirst,
            ..p
        };
        assert_eq!(p.raw(4, 0, lane(&[0x21, 0x43])), 2);
        assert_eq!(p.words(5), 3);
    }

    #[test]
    fn awq_order_puts_column_order_s_in_slot_s() {
        const AWQ: [u8; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let p = Packing {
            bits: 4,
            word_bits: 32,
            fill: Fill::Word,
            order: Order::Slots(&AWQ),
        };
        // Slot s holds code AWQ[s]; put code value c at code index c.
        let word = (0..8).fold(0u32, |w, s| w | ((AWQ[s] as u32) << (4 * s)));
        for t in 0..8 {
            assert_eq!(p.raw(8, t, lane(&[word])), t as u32);
        }
    }

    #[test]
    fn planar_fill_strides_across_words() {
        let p = Packing {
            bits: 4,
            word_bits: 8,
            fill: Fill::Planar,
            order: Order::LowFirst,
        };
        // n = 4, m = 2: codes 0,1 in the low nibbles of words 0,1; codes 2,3 in the high.
        assert_eq!(p.raw(4, 0, lane(&[0x31, 0x42])), 1);
        assert_eq!(p.raw(4, 1, lane(&[0x31, 0x42])), 2);
        assert_eq!(p.raw(4, 2, lane(&[0x31, 0x42])), 3);
        assert_eq!(p.raw(4, 3, lane(&[0x31, 0x42])), 4);
    }

    #[test]
    fn dense_codes_cross_words() {
        let p = Packing {
            bits: 3,
            word_bits: 8,
            fill: Fill::Dense,
            order: Order::LowFirst,
        };
        // Codes 0..8 of 3 bits each: 0,1,2,3,4,5,6,7 in a 24-bit stream.
        let stream: u32 = (0..8).fold(0, |s, c| s | (c << (3 * c)));
        let words = [stream & 0xFF, (stream >> 8) & 0xFF, (stream >> 16) & 0xFF];
        for t in 0..8 {
            assert_eq!(p.raw(8, t, lane(&words)), t as u32);
        }
        assert_eq!(p.words(8), 3);
    }

    #[test]
    fn nibbles_follow_the_order_and_cross_bytes() {
        let bytes = [0x21, 0x43];
        let low: Vec<u8> = (0..4).map(|t| nibble(&bytes, t, false)).collect();
        let high: Vec<u8> = (0..4).map(|t| nibble(&bytes, t, true)).collect();
        assert_eq!(low, [1, 2, 3, 4]);
        assert_eq!(high, [2, 1, 4, 3]);
        let p = Packing {
            bits: 4,
            word_bits: 8,
            fill: Fill::Word,
            order: Order::HighFirst,
        };
        for t in 0..4 {
            assert_eq!(p.raw(4, t, lane(&[0x21, 0x43])), high[t as usize] as u32);
        }
    }

    #[test]
    fn signed_codes_sign_extend() {
        assert_eq!(signed(0b1111, 4), -1);
        assert_eq!(signed(0b1000, 4), -8);
        assert_eq!(signed(0b0111, 4), 7);
        assert_eq!(signed(0xFF, 8), -1);
    }
}
