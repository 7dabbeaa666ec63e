//! Argmin with uniformly random tie-breaking, in one streaming pass.
//!
//! Each selection draws one random seed; a candidate's tie-break rank is a
//! hash of (seed, index), so equal keys are ordered by a fresh random
//! permutation per selection without an RNG call per tie. Keys that are not
//! comparable with themselves (NaN) are ignored: they never reach a
//! comparison.

use std::cmp::Ordering;

/// A fresh random seed for one selection.
pub(crate) fn seed() -> u64 {
    rand::random()
}

/// SplitMix64 finaliser of `seed + index * golden ratio`: a well-mixed,
/// per-seed pseudo-random rank for `index`.
fn rank(seed: u64, index: usize) -> u64 {
    let mut z = seed.wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The index with the smallest key; equal keys tie-break at random.
#[derive(Debug, Clone)]
pub(crate) struct MinPick<K> {
    seed: u64,
    best: Option<(K, u64, usize)>,
}

impl<K: PartialOrd + Copy> MinPick<K> {
    /// An empty pick whose ties are ordered by `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self { seed, best: None }
    }

    /// Considers candidate `index` with `key`.
    pub(crate) fn offer(&mut self, key: K, index: usize) {
        if key.partial_cmp(&key) != Some(Ordering::Equal) {
            return;
        }
        match &self.best {
            None => self.best = Some((key, rank(self.seed, index), index)),
            Some((best, best_rank, _)) => match key.partial_cmp(best) {
                Some(Ordering::Less) => self.best = Some((key, rank(self.seed, index), index)),
                Some(Ordering::Equal) => {
                    let r = rank(self.seed, index);
                    if r < *best_rank {
                        self.best = Some((key, r, index));
                    }
                }
                _ => {}
            },
        }
    }

    /// The chosen index, if any comparable key was offered.
    pub(crate) fn index(&self) -> Option<usize> {
        self.best.as_ref().map(|(_, _, i)| *i)
    }
}

/// The index of the smallest of `values` (NaN ignored), ties at random.
pub(crate) fn argmin(values: &[f64], seed: u64) -> Option<usize> {
    let mut best = MinPick::new(seed);
    for (i, value) in values.iter().enumerate() {
        best.offer(*value, i);
    }
    best.index()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_key_wins_and_nan_is_ignored() {
        let mut pick = MinPick::new(7);
        for (i, key) in [3.0, f64::NAN, 1.0, 2.0].into_iter().enumerate() {
            pick.offer(key, i);
        }
        assert_eq!(pick.index(), Some(2));
        let mut only_nan = MinPick::new(7);
        only_nan.offer(f64::NAN, 0);
        assert_eq!(only_nan.index(), None);
    }

    #[test]
    fn ties_are_broken_uniformly() {
        let mut counts = [0u32; 4];
        for seed in 0..4000u64 {
            let mut pick = MinPick::new(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93));
            for i in 0..4 {
                pick.offer((1u64, 0u64), i);
            }
            pick.offer((2, 0), 4);
            counts[pick.index().unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }
}
