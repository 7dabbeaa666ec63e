//! Which prompt keys the fleet has seen recently: the evidence an affinity
//! policy needs before it gives a prompt affinity.
//!
//! A replica behind a Service sees 1/N of the prompts. If it kept only
//! what it saw itself, a prompt prefix would be routed without affinity
//! once per replica (up to N times) instead of once, and a conversation
//! whose turns land on different replicas would get affinity only from the
//! turn that first repeats on one replica. So each key seen here for the
//! first time is also shared with the peers (over the mesh's mTLS link:
//! 64-bit hashes, never text), and the peers' keys are recorded here as
//! seen. One router and a meshed fleet then agree on "seen before" up to
//! the mesh's lag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the table (a power of two): 128 KiB, enough that a prefix seen
/// once in every few thousand requests is still remembered.
const SLOTS: usize = 1 << 14;

/// Where this replica's new sightings go (the mesh's sender).
pub type ShareSighting = Box<dyn Fn(u64) + Send + Sync>;

/// Keys of recently seen prompts, one per slot, overwritten on collision:
/// "seen before" may be forgotten, never invented (a slot holds a full key).
pub struct Sightings {
    slots: Box<[AtomicU64]>,
    share: OnceLock<ShareSighting>,
}

impl std::fmt::Debug for Sightings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sightings")
            .field("slots", &self.slots.len())
            .field("shared", &self.share.get().is_some())
            .finish()
    }
}

impl Default for Sightings {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            share: OnceLock::new(),
        }
    }
}

impl Sightings {
    fn slot(&self, key: u64) -> &AtomicU64 {
        &self.slots[(key >> 32) as usize & (SLOTS - 1)]
    }

    /// Records `key` and says whether it was already known (seen here or
    /// reported by a peer). A key new here is shared with the peers.
    pub fn seen_before(&self, key: u64) -> bool {
        // 0 marks an empty slot, so no stored key may be 0.
        let stored = key | 1;
        let slot = self.slot(key);
        if slot.load(Ordering::Relaxed) == stored {
            return true;
        }
        let known = slot.swap(stored, Ordering::Relaxed) == stored;
        if !known && let Some(share) = self.share.get() {
            share(key);
        }
        known
    }

    /// Records keys a peer saw, without sharing them again.
    pub fn absorb(&self, keys: &[u64]) {
        for &key in keys {
            self.slot(key).store(key | 1, Ordering::Relaxed);
        }
    }

    /// Sends every key new here to `share` from now on; false if a sink
    /// was set already (the first wins).
    pub fn share_with(&self, share: ShareSighting) -> bool {
        self.share.set(share).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn sink(into: &Arc<Mutex<Vec<u64>>>) -> ShareSighting {
        let into = into.clone();
        Box::new(move |key| into.lock().unwrap().push(key))
    }

    #[test]
    fn a_key_is_new_once_and_shared_once() {
        let sightings = Sightings::default();
        let shared = Arc::new(Mutex::new(Vec::new()));
        assert!(sightings.share_with(sink(&shared)));
        assert!(!sightings.share_with(sink(&shared)), "the first sink wins");
        assert!(!sightings.seen_before(42));
        assert!(sightings.seen_before(42));
        assert!(sightings.seen_before(42));
        assert_eq!(*shared.lock().unwrap(), [42]);
    }

    #[test]
    fn a_peers_key_counts_as_seen_and_is_not_shared_back() {
        let sightings = Sightings::default();
        let shared = Arc::new(Mutex::new(Vec::new()));
        sightings.share_with(sink(&shared));
        let (a, b) = (7u64 << 32, 9u64 << 32); // different slots
        sightings.absorb(&[a, b]);
        assert!(sightings.seen_before(a));
        assert!(sightings.seen_before(b));
        assert!(shared.lock().unwrap().is_empty());
    }

    #[test]
    fn a_colliding_key_forgets_but_never_invents() {
        let sightings = Sightings::default();
        let a = 5u64 << 32 | 2;
        let b = (5u64 + SLOTS as u64) << 32 | 2; // same slot, another key
        assert!(!sightings.seen_before(a));
        assert!(!sightings.seen_before(b), "b was never seen");
        assert!(!sightings.seen_before(a), "a was overwritten: forgotten");
    }
}
