//! Membership tests against a set of integer keys, many values tested per set.

/// A set of integer keys to test many values against: a bitmap when the keys are close
/// together, else a hash set behind a one-bit-per-hash filter that answers most misses from
/// cache (most values tested are not in the set).
pub(crate) enum KeySet {
    Bits {
        min: i64,
        bits: Vec<u64>,
    },
    Hash {
        filter: Vec<u64>,
        keys: ahash::AHashSet<i64>,
    },
}

/// Bits of the sparse set's filter: 2^20 (128 KiB) keeps a miss on 100k keys near 10%.
const FILTER_BITS: u32 = 20;

fn filter_bit(k: i64) -> usize {
    ((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FILTER_BITS)) as usize
}

impl KeySet {
    /// The set of `keys`, sorted.
    pub(crate) fn new(keys: &[i64]) -> Self {
        match (keys.first(), keys.last()) {
            (Some(&min), Some(&max)) if max.abs_diff(min) < 1 << 26 => {
                let mut bits = vec![0u64; (max.abs_diff(min) as usize) / 64 + 1];
                for &k in keys {
                    let at = k.abs_diff(min) as usize;
                    bits[at / 64] |= 1 << (at % 64);
                }
                KeySet::Bits { min, bits }
            }
            _ => {
                let mut filter = vec![0u64; (1usize << FILTER_BITS) / 64];
                for &k in keys {
                    let b = filter_bit(k);
                    filter[b / 64] |= 1 << (b % 64);
                }
                KeySet::Hash {
                    filter,
                    keys: keys.iter().copied().collect(),
                }
            }
        }
    }

    pub(crate) fn contains(&self, k: i64) -> bool {
        match self {
            KeySet::Bits { min, bits } => {
                k >= *min && {
                    let at = k.abs_diff(*min) as usize;
                    bits.get(at / 64).is_some_and(|w| w & (1 << (at % 64)) != 0)
                }
            }
            KeySet::Hash { filter, keys } => {
                let b = filter_bit(k);
                filter[b / 64] & (1 << (b % 64)) != 0 && keys.contains(&k)
            }
        }
    }
}
