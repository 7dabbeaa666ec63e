//! The CRDT fleet state: what this replica knows of every other replica's
//! slots and of the freshest engine snapshots. Pure data, no I/O: the live
//! path is `session::receive` → `Core::apply_update`, which turns each
//! frame entry into one call here.
//!
//! - **Slots**: per (incarnation, worker) a last-writer-wins register
//!   ([`crdts::LWWReg`]) of that incarnation's own [`LoadCounts`], whose
//!   marker is the sender's round (strictly increasing per incarnation).
//!   The fleet value is the sum over the *live* incarnations
//!   ([`FleetState::total`], kept up to date as slots merge) — a PN-counter
//!   whose actors are incarnations, read over the live set. `crdts`' own counters cannot forget an actor,
//!   so the sum is written out plainly. Every field is a per-incarnation
//!   quantity, including `dispatched_since_poll` (the work that incarnation
//!   routed since the snapshot it knows): the fleet reads the same sum on
//!   every replica whatever history each has seen, and a dead incarnation
//!   simply drops out.
//! - **Polls**: per (incarnation, worker) whether that incarnation polls the
//!   worker, so poll ownership is shared only among the replicas that do.
//! - **Snapshots**: per worker one register ordered by `(poll time,
//!   poller, claimed poll time)`, the poll time clamped on receipt to this replica's wall clock
//!   plus [`MAX_CLOCK_SKEW_MS`]: a poller whose clock runs ahead cannot
//!   freeze the register for longer than the bound. A re-sent snapshot
//!   (same poller, same claimed poll time) is recognised and ignored.
//!
//! Bounded: [`FleetState::forget`] drops a dead incarnation, and
//! [`FleetState::expire_idle`] drops entries their sender stopped
//! refreshing (full syncs refresh every live one), so memory follows the
//! live fleet, not its history.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crdts::{CvRDT, LWWReg};
use serde::Serialize;
use shoal_proto::{EngineKind, EngineLoad, LoadCounts};

use crate::identity::Incarnation;
use crate::totals::Totals;

/// How far ahead of this replica's wall clock a peer's poll time may be
/// before it is clamped. NTP keeps real clusters within milliseconds; a
/// second leaves room for a bad host without letting it freeze snapshots.
pub const MAX_CLOCK_SKEW_MS: u64 = 1_000;

/// A claimed poll time as this replica stores it: no later than its wall
/// clock `unix_ms` plus [`MAX_CLOCK_SKEW_MS`].
///
/// A poll time behind the clock is not raised: a snapshot that old (a slow
/// poll, a poller whose clock is behind, an old snapshot copied to a new
/// link) must read as old, so replicas poll the worker themselves. What a
/// clock behind could break is the rebase of the own work since the poll;
/// the dispatch history answers it exactly within its span and takes an
/// older time as its start (`Core::rebase_to_peer_snapshot`).
pub fn clamp_poll_time(claimed_ms: u64, unix_ms: u64) -> u64 {
    claimed_ms.min(unix_ms.saturating_add(MAX_CLOCK_SKEW_MS))
}

/// One incarnation's slot for one worker, as it sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotValue {
    /// Its own counts.
    pub counts: LoadCounts,
    /// Poll time (ms) of the snapshot its `dispatched_since_poll` counts from.
    pub basis_ms: u64,
}

/// The replicated part of a polled snapshot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotValue {
    /// Engine family.
    pub source: EngineKind,
    /// Validated signals.
    pub load: EngineLoad,
    /// Poll time as the poller claimed it (ms since the Unix epoch).
    pub claimed_polled_at_ms: u64,
}

/// The freshest snapshot of one worker as stored here.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSnapshot {
    /// What the poller sent.
    pub value: SnapshotValue,
    /// Who polled it (the authenticated sender, or this node).
    pub poller: Arc<str>,
    /// Its poll time after clamping (the register's order, with `poller`).
    pub polled_at_ms: u64,
    /// The poll instant on this replica's monotonic clock (see
    /// [`crate::SnapshotView::taken_at`]).
    pub taken_at: Instant,
}

/// The receiver's clocks at the moment it merges something.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Monotonic now.
    pub now: Instant,
    /// Wall clock, ms since the Unix epoch.
    pub unix_ms: u64,
}

impl Clock {
    /// The clocks now.
    pub fn now() -> Self {
        Self {
            now: Instant::now(),
            unix_ms: crate::identity::unix_millis(),
        }
    }
}

#[derive(Debug, Clone)]
struct SlotRecord {
    counts: LWWReg<LoadCounts, u64>,
    /// Grows only: merged by maximum.
    basis_ms: u64,
    seen: Instant,
}

impl SlotRecord {
    fn new(now: Instant) -> Self {
        Self {
            // Rounds start at 1, so any real slot reading replaces this.
            counts: LWWReg {
                val: LoadCounts::default(),
                marker: 0,
            },
            basis_ms: 0,
            seen: now,
        }
    }

    fn value(&self) -> SlotValue {
        SlotValue {
            counts: self.counts.val,
            basis_ms: self.basis_ms,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct PeerRecord {
    /// Its slots are in the totals (it is a counted incarnation).
    counted: bool,
    slots: HashMap<Arc<str>, SlotRecord>,
    /// Workers it polls, with when it last said so.
    polls: HashMap<Arc<str>, Instant>,
}

/// Sizes of the state, for `/mesh/status` and the churn test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateFootprint {
    /// Incarnations with any entry.
    pub incarnations: usize,
    /// (incarnation, worker) slot entries.
    pub slot_entries: usize,
    /// (incarnation, worker) polling entries.
    pub poll_entries: usize,
    /// Snapshot registers.
    pub snapshots: usize,
}

/// The merged fleet state. See the module docs for the semantics.
#[derive(Debug, Clone, Default)]
pub struct FleetState {
    peers: HashMap<Incarnation, PeerRecord>,
    /// The incarnations whose slots count (see [`FleetState::set_counted`]).
    counted: HashSet<Incarnation>,
    /// Per worker, the sum of the counted incarnations' slots.
    totals: Totals,
    snapshots: HashMap<Arc<str>, StoredSnapshot>,
    /// Per worker, the newest poll time each poller claimed that is not
    /// older than the stored snapshot: a displaced future-stamped snapshot
    /// re-sent by anti-entropy is recognised, not clamped anew to win
    /// again.
    claims: HashMap<Arc<str>, HashMap<Arc<str>, u64>>,
}

impl FleetState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges `from`'s counts for `worker`, read in its round `round`.
    /// Returns true if the value changed.
    pub fn apply_slot(
        &mut self,
        from: &Incarnation,
        worker: &Arc<str>,
        round: u64,
        counts: LoadCounts,
        now: Instant,
    ) -> bool {
        let (record, counted) = self.record(from, worker, now);
        if record.counts.marker >= round {
            return false;
        }
        record.seen = now;
        let old = record.counts.val;
        let changed = old != counts;
        record.counts.merge(LWWReg {
            val: counts,
            marker: round,
        });
        if counted && changed {
            self.totals.replace(worker, &old, &counts);
        }
        debug_assert_eq!(
            self.totals.get(worker),
            self.sum(worker, &self.counted),
            "the running total of {worker} left the recomputed sum"
        );
        changed
    }

    /// Merges which snapshot `from`'s work since the poll on `worker`
    /// counts from (the largest poll time wins). Returns true if it moved.
    pub fn apply_basis(
        &mut self,
        from: &Incarnation,
        worker: &Arc<str>,
        basis_ms: u64,
        now: Instant,
    ) -> bool {
        let (record, _) = self.record(from, worker, now);
        record.seen = now;
        let moved = basis_ms > record.basis_ms;
        record.basis_ms = record.basis_ms.max(basis_ms);
        moved
    }

    /// The slot of `from` for `worker`, created (and, if `from` counts,
    /// added to the totals) if new; and whether `from` counts.
    fn record(
        &mut self,
        from: &Incarnation,
        worker: &Arc<str>,
        now: Instant,
    ) -> (&mut SlotRecord, bool) {
        let peer = Self::peer(&mut self.peers, &self.counted, from);
        let totals = &mut self.totals;
        let counts = peer.counted;
        let record = peer.slots.entry(worker.clone()).or_insert_with(|| {
            let record = SlotRecord::new(now);
            if counts {
                totals.insert(worker, &record.counts.val);
            }
            record
        });
        (record, counts)
    }

    /// The record of `from`, created (counting if `counted` says so) if new.
    fn peer<'a>(
        peers: &'a mut HashMap<Incarnation, PeerRecord>,
        counted: &HashSet<Incarnation>,
        from: &Incarnation,
    ) -> &'a mut PeerRecord {
        peers.entry(from.clone()).or_insert_with(|| PeerRecord {
            counted: counted.contains(from),
            ..PeerRecord::default()
        })
    }

    /// Says which incarnations count from now on: the totals take in the
    /// slots of those that start counting and drop those that stop.
    pub fn set_counted(&mut self, counted: &HashSet<Incarnation>) {
        for (inc, peer) in self.peers.iter_mut() {
            let counts = counted.contains(inc);
            if counts == peer.counted {
                continue;
            }
            peer.counted = counts;
            for (worker, record) in &peer.slots {
                if counts {
                    self.totals.insert(worker, &record.counts.val);
                } else {
                    self.totals.remove(worker, &record.counts.val);
                }
            }
        }
        self.counted.clone_from(counted);
    }

    /// The sum of the counted incarnations' slots for `worker` (kept up to
    /// date as slots merge: O(1)).
    pub fn total(&self, worker: &str) -> LoadCounts {
        self.totals.get(worker)
    }

    /// Records whether `from` polls `worker`. Returns true if that changed.
    pub fn apply_polls(
        &mut self,
        from: &Incarnation,
        worker: &Arc<str>,
        polled: bool,
        now: Instant,
    ) -> bool {
        let polls = &mut Self::peer(&mut self.peers, &self.counted, from).polls;
        if polled {
            polls.insert(worker.clone(), now).is_none()
        } else {
            polls.remove(worker).is_some()
        }
    }

    /// Merges a snapshot of `worker` polled by `poller`. Returns the
    /// clamped poll time if it became the freshest one.
    pub fn apply_snapshot(
        &mut self,
        worker: &Arc<str>,
        value: SnapshotValue,
        poller: &Arc<str>,
        clock: Clock,
    ) -> Option<u64> {
        let polled_at_ms = clamp_poll_time(value.claimed_polled_at_ms, clock.unix_ms);
        let claims = self.claims.entry(worker.clone()).or_default();
        if claims
            .get(poller)
            .is_some_and(|&seen| seen >= value.claimed_polled_at_ms)
        {
            return None;
        }
        claims.insert(poller.clone(), value.claimed_polled_at_ms);
        if let Some(stored) = self.snapshots.get(worker) {
            let resent = stored.poller == *poller
                && stored.value.claimed_polled_at_ms == value.claimed_polled_at_ms;
            // Two polls clamped to the same time still order by what the
            // poller claimed, so every delivery order picks the same one.
            let older = (
                stored.polled_at_ms,
                &stored.poller,
                stored.value.claimed_polled_at_ms,
            ) >= (polled_at_ms, poller, value.claimed_polled_at_ms);
            if resent || older {
                return None;
            }
        }
        // Claims older than the new winner would lose the order anyway.
        claims.retain(|_, claimed| *claimed >= polled_at_ms);
        let age = Duration::from_millis(clock.unix_ms.saturating_sub(polled_at_ms));
        let taken_at = clock.now.checked_sub(age).unwrap_or(clock.now);
        self.snapshots.insert(
            worker.clone(),
            StoredSnapshot {
                value,
                poller: poller.clone(),
                polled_at_ms,
                taken_at,
            },
        );
        Some(polled_at_ms)
    }

    /// The sum of the slots of the incarnations `counted` says are live,
    /// recomputed: what [`FleetState::total`] must always equal (checked
    /// on every merge in debug builds).
    pub(crate) fn sum(&self, worker: &str, counted: &HashSet<Incarnation>) -> LoadCounts {
        let mut sum = LoadCounts::default();
        for inc in counted {
            if let Some(value) = self.slot(inc, worker) {
                sum += value.counts;
            }
        }
        sum
    }

    /// Names of the counted incarnations that poll `worker`, sorted.
    pub fn pollers(&self, worker: &str, counted: &HashSet<Incarnation>) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .polling(worker, counted)
            .map(|inc| inc.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// True when [`FleetState::pollers`] would return `current` (checked
    /// without allocating: the merge runs this for every touched worker).
    pub fn pollers_are(
        &self,
        worker: &str,
        counted: &HashSet<Incarnation>,
        current: &[Arc<str>],
    ) -> bool {
        let mut n = 0;
        for inc in self.polling(worker, counted) {
            if current.binary_search(&inc.name).is_err() {
                return false;
            }
            n += 1;
        }
        // Counted incarnations have distinct names (one per name counts).
        n == current.len()
    }

    fn polling<'a>(
        &'a self,
        worker: &'a str,
        counted: &'a HashSet<Incarnation>,
    ) -> impl Iterator<Item = &'a Incarnation> + 'a {
        counted.iter().filter(move |inc| {
            self.peers
                .get(*inc)
                .is_some_and(|p| p.polls.contains_key(worker))
        })
    }

    /// One incarnation's slot, if known.
    pub fn slot(&self, inc: &Incarnation, worker: &str) -> Option<SlotValue> {
        self.peers
            .get(inc)?
            .slots
            .get(worker)
            .map(SlotRecord::value)
    }

    /// The freshest snapshot of `worker`.
    pub fn snapshot(&self, worker: &str) -> Option<&StoredSnapshot> {
        self.snapshots.get(worker)
    }

    /// Drops everything a dead incarnation sent.
    pub fn forget(&mut self, inc: &Incarnation) {
        if let Some(peer) = self.peers.remove(inc)
            && peer.counted
        {
            for (worker, record) in &peer.slots {
                self.totals.remove(worker, &record.counts.val);
            }
        }
    }

    /// Drops slot and polling entries not refreshed for `after` (their
    /// sender stopped sending them: it forgot the worker). Returns the
    /// workers whose entries went.
    pub fn expire_idle(&mut self, now: Instant, after: Duration) -> Vec<Arc<str>> {
        let mut gone = Vec::new();
        let totals = &mut self.totals;
        for peer in self.peers.values_mut() {
            let counted = peer.counted;
            peer.slots.retain(|worker, record| {
                let keep = now.saturating_duration_since(record.seen) < after;
                if !keep {
                    if counted {
                        totals.remove(worker, &record.counts.val);
                    }
                    gone.push(worker.clone());
                }
                keep
            });
            peer.polls.retain(|worker, seen| {
                let keep = now.saturating_duration_since(*seen) < after;
                if !keep {
                    gone.push(worker.clone());
                }
                keep
            });
        }
        self.peers
            .retain(|_, p| !p.slots.is_empty() || !p.polls.is_empty());
        gone
    }

    /// True when any incarnation's entry names `worker`.
    pub fn mentions(&self, worker: &str) -> bool {
        self.peers
            .values()
            .any(|p| p.slots.contains_key(worker) || p.polls.contains_key(worker))
    }

    /// Drops the snapshot of a worker this node forgot.
    pub fn remove_snapshot(&mut self, worker: &str) {
        self.snapshots.remove(worker);
        self.claims.remove(worker);
    }

    /// Incarnations with entries here.
    pub fn incarnations(&self) -> impl Iterator<Item = &Incarnation> {
        self.peers.keys()
    }

    /// How much is stored.
    pub fn footprint(&self) -> StateFootprint {
        StateFootprint {
            incarnations: self.peers.len(),
            slot_entries: self.peers.values().map(|p| p.slots.len()).sum(),
            poll_entries: self.peers.values().map(|p| p.polls.len()).sum(),
            snapshots: self.snapshots.len(),
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
