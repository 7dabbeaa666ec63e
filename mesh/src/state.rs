//! The CRDT fleet state: what this replica knows of every other replica's
//! bookings and polls. Pure data, no I/O; the mesh feeds it frames.
//!
//! Three CRDTs, all keyed by worker:
//!
//! - **In-flight slots**: per (incarnation, worker) a last-writer-wins
//!   register ([`crdts::LWWReg`]) of `(requests, tokens, pending prefill)`
//!   whose marker is the sender's round, which grows strictly with every
//!   frame an incarnation sends. The fleet value is the sum over the *live*
//!   incarnations, i.e. a PN-counter whose actors are incarnations, read
//!   over the live set. That read is written out plainly in
//!   [`FleetState::inflight`]: `crdts`' `PNCounter` keeps an increment and
//!   a decrement `VClock` per actor and can never drop an actor, so a dead
//!   replica's requests would count forever, and its op-based increments do
//!   not fit a sender that ships absolute values. Slots of an incarnation
//!   dead for longer than a grace period are dropped ([`FleetState::forget`]).
//! - **Dispatched token-work**: per worker a [`crdts::VClock`] over
//!   incarnations (per-actor maximum = a G-counter of absolute values). The
//!   total sums every incarnation ever seen, dead or alive, so a death never
//!   makes it go backwards; since every later poll mark includes the dead
//!   replica's work too, it stops mattering to `dispatched_since_poll` from
//!   the next poll on. Entries are one `u64` per (worker, incarnation) and
//!   are kept, so an incarnation that comes back after a partition never
//!   double-counts.
//! - **Snapshots**: per worker a [`crdts::LWWReg`] ordered by
//!   `(poll time, poller)`; pollers make their poll times strictly increase
//!   per worker, so markers are unique.
//!
//! [`FleetState::merge`] joins two states; it is commutative, associative
//! and idempotent (property-tested), which is why lost, duplicated and
//! reordered frames still converge: every frame is a small state merged in.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crdts::{CmRDT, CvRDT, Dot, LWWReg, VClock};
use shoal_proto::{EngineKind, EngineLoad};

use crate::identity::Incarnation;

/// In-flight values of one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Inflight {
    /// Requests in flight.
    pub requests: u64,
    /// Token-work in flight.
    pub tokens: u64,
    /// Prompt tokens waiting for their first response byte.
    pub pending_prefill: u64,
}

impl Inflight {
    fn add(&mut self, other: &Inflight) {
        self.requests = self.requests.saturating_add(other.requests);
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.pending_prefill = self.pending_prefill.saturating_add(other.pending_prefill);
    }
}

/// The replicated part of a polled snapshot (poll time and poller are the
/// register's marker).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotValue {
    /// Engine family.
    pub source: EngineKind,
    /// Validated signals.
    pub load: EngineLoad,
    /// Fleet dispatched token-work at poll start.
    pub dispatched_mark: u64,
}

/// Marker of a snapshot register: `(poll time in ms, poller name)`.
pub type SnapshotMarker = (u64, Arc<str>);

/// The merged fleet state. See the module docs for the semantics.
#[derive(Debug, Clone, Default)]
pub struct FleetState {
    slots: HashMap<Incarnation, HashMap<Arc<str>, LWWReg<Inflight, u64>>>,
    dispatched: HashMap<Arc<str>, VClock<Incarnation>>,
    snapshots: HashMap<Arc<str>, LWWReg<SnapshotValue, SnapshotMarker>>,
    /// When each snapshot register last changed here (local, not merged).
    learned: HashMap<Arc<str>, Instant>,
}

impl PartialEq for FleetState {
    fn eq(&self, other: &Self) -> bool {
        self.slots == other.slots
            && self.dispatched == other.dispatched
            && self.snapshots == other.snapshots
    }
}

impl FleetState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges one slot reading of `from` for `worker`, taken at `round`.
    /// Returns true if anything changed.
    pub fn apply_slot(
        &mut self,
        from: &Incarnation,
        worker: &Arc<str>,
        round: u64,
        inflight: Inflight,
        dispatched: u64,
    ) -> bool {
        let mut changed = false;
        let slots = self.slots.entry(from.clone()).or_default();
        match slots.get_mut(worker) {
            Some(reg) => {
                if reg.marker < round {
                    changed |= reg.val != inflight;
                    reg.update(inflight, round);
                }
            }
            None => {
                slots.insert(
                    worker.clone(),
                    LWWReg {
                        val: inflight,
                        marker: round,
                    },
                );
                changed = true;
            }
        }
        let clock = self.dispatched.entry(worker.clone()).or_default();
        if clock.get(from) < dispatched {
            clock.apply(Dot::new(from.clone(), dispatched));
            changed = true;
        }
        changed
    }

    /// Merges a snapshot polled by `marker.1` at `marker.0`. Returns true if
    /// it became the freshest one for `worker`.
    pub fn apply_snapshot(
        &mut self,
        worker: &Arc<str>,
        value: SnapshotValue,
        marker: SnapshotMarker,
    ) -> bool {
        let won = match self.snapshots.get_mut(worker) {
            Some(reg) if reg.marker >= marker => false,
            Some(reg) => {
                reg.update(value, marker);
                true
            }
            None => {
                self.snapshots
                    .insert(worker.clone(), LWWReg { val: value, marker });
                true
            }
        };
        if won {
            self.learned.insert(worker.clone(), Instant::now());
        }
        won
    }

    /// Joins `other` into `self` (commutative, associative, idempotent).
    pub fn merge(&mut self, other: &FleetState) {
        for (inc, slots) in &other.slots {
            let mine = self.slots.entry(inc.clone()).or_default();
            for (worker, reg) in slots {
                match mine.get_mut(worker) {
                    Some(m) => m.merge(reg.clone()),
                    None => {
                        mine.insert(worker.clone(), reg.clone());
                    }
                }
            }
        }
        for (worker, clock) in &other.dispatched {
            self.dispatched
                .entry(worker.clone())
                .or_default()
                .merge(clock.clone());
        }
        for (worker, reg) in &other.snapshots {
            let value = reg.val;
            self.apply_snapshot(worker, value, reg.marker.clone());
        }
    }

    /// In-flight sum over the incarnations `counted` says are live.
    pub fn inflight(&self, worker: &str, counted: &HashSet<Incarnation>) -> Inflight {
        let mut sum = Inflight::default();
        for inc in counted {
            if let Some(reg) = self.slots.get(inc).and_then(|s| s.get(worker)) {
                sum.add(&reg.val);
            }
        }
        sum
    }

    /// In-flight values of one incarnation's slot, if known.
    pub fn slot(&self, inc: &Incarnation, worker: &str) -> Option<Inflight> {
        self.slots.get(inc)?.get(worker).map(|r| r.val)
    }

    /// Dispatched token-work of every incarnation ever seen for `worker`.
    pub fn dispatched(&self, worker: &str) -> u64 {
        self.dispatched
            .get(worker)
            .map(|c| c.dots.values().fold(0u64, |a, b| a.saturating_add(*b)))
            .unwrap_or(0)
    }

    /// The freshest snapshot of `worker`, its marker and when it was learned.
    pub fn snapshot(&self, worker: &str) -> Option<(SnapshotValue, &SnapshotMarker, Instant)> {
        let reg = self.snapshots.get(worker)?;
        let learned = self
            .learned
            .get(worker)
            .copied()
            .unwrap_or_else(Instant::now);
        Some((reg.val, &reg.marker, learned))
    }

    /// Drops the in-flight slots of a long-dead incarnation. Its dispatched
    /// entries stay (see the module docs).
    pub fn forget(&mut self, inc: &Incarnation) {
        self.slots.remove(inc);
    }

    /// Incarnations that have in-flight slots here.
    pub fn incarnations(&self) -> impl Iterator<Item = &Incarnation> {
        self.slots.keys()
    }

    /// Every worker key the state mentions.
    pub fn workers(&self) -> HashSet<Arc<str>> {
        let mut keys: HashSet<Arc<str>> = self.dispatched.keys().cloned().collect();
        keys.extend(self.snapshots.keys().cloned());
        for slots in self.slots.values() {
            keys.extend(slots.keys().cloned());
        }
        keys
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
