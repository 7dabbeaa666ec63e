//! A policy's knobs, replaceable while it runs: a configuration reload
//! changes thresholds in place, so the policy keeps what it learned (the
//! prefix tree, the recent keys, the mean prompt).
//!
//! Reading costs one `ArcSwap` load and a copy of a small `Copy` struct per
//! selection, with no shared write (no reference count is touched).

use arc_swap::ArcSwap;

/// The knobs of one policy.
#[derive(Debug)]
pub struct Knobs<T>(ArcSwap<T>);

impl<T: Copy> Knobs<T> {
    /// Knobs starting at `value`.
    pub fn new(value: T) -> Self {
        Self(ArcSwap::from_pointee(value))
    }

    /// The current values.
    #[inline]
    pub fn get(&self) -> T {
        **self.0.load()
    }

    /// Replaces them (selections already running finish with the old ones).
    pub fn set(&self, value: T) {
        self.0.store(std::sync::Arc::new(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_seen_by_the_next_get() {
        let knobs = Knobs::new((1u32, 0.5f64));
        assert_eq!(knobs.get(), (1, 0.5));
        knobs.set((2, 0.25));
        assert_eq!(knobs.get(), (2, 0.25));
    }
}
