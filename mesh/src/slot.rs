//! The per-worker handle the router holds: its own slot as atomics, and the
//! rest of the fleet as an immutable view swapped in by the mesh.
//!
//! Booking and releasing touch only this replica's atomics (the same cost
//! as a local ledger). Reading the fleet load loads one `ArcSwap` pointer
//! (no lock, no allocation) and adds the own atomics to the remote sums the
//! mesh recomputed when the last frame arrived. The sync task reads the own
//! atomics every sync interval and pushes what changed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use shoal_proto::{EngineKind, EngineLoad};

/// This replica's counters for one worker.
#[derive(Debug, Default)]
pub(crate) struct OwnCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) tokens: AtomicU64,
    pub(crate) pending_prefill: AtomicU64,
    pub(crate) dispatched: AtomicU64,
}

/// The own slot values at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotValues {
    /// Requests in flight.
    pub requests: u64,
    /// Token-work in flight.
    pub tokens: u64,
    /// Prompt tokens waiting for their first response byte.
    pub pending_prefill: u64,
    /// Token-work ever dispatched (grow-only).
    pub dispatched: u64,
}

impl OwnCounters {
    pub(crate) fn read(&self) -> SlotValues {
        SlotValues {
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            pending_prefill: self.pending_prefill.load(Ordering::Relaxed),
            dispatched: self.dispatched.load(Ordering::Relaxed),
        }
    }
}

/// The freshest polled snapshot of a worker, by (poll time, poller).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotView {
    /// Engine family the numbers came from.
    pub source: EngineKind,
    /// The validated signals.
    pub load: EngineLoad,
    /// Poll time on the poller's wall clock, ms since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Fleet dispatched token-work when the poll started.
    pub dispatched_mark: u64,
    /// When this replica first stored it (for local staleness checks).
    pub learned_at: Instant,
}

/// What the other live replicas contribute to one worker, recomputed by the
/// mesh when frames or membership change.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RemoteView {
    pub(crate) requests: u64,
    pub(crate) tokens: u64,
    pub(crate) pending_prefill: u64,
    /// Dispatched by every other incarnation ever seen (live, dead, retired).
    pub(crate) dispatched: u64,
    pub(crate) snapshot: Option<SnapshotView>,
}

/// Fleet-wide load of one worker, as this replica sees it now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FleetLoad {
    /// Requests in flight, summed over live verified replicas and self.
    pub inflight_requests: u64,
    /// Token-work in flight, same sum.
    pub inflight_tokens: u64,
    /// Prompt tokens awaiting a first byte, same sum.
    pub pending_prefill_tokens: u64,
    /// Fleet dispatched token-work (grow-only; includes departed replicas).
    pub dispatched_total: u64,
    /// The freshest snapshot any replica polled, however old.
    pub snapshot: Option<SnapshotView>,
}

impl FleetLoad {
    /// Token-work dispatched since the snapshot's poll (all of it without
    /// a snapshot), clamped at zero.
    pub fn dispatched_since_poll(&self) -> u64 {
        match &self.snapshot {
            Some(s) => self.dispatched_total.saturating_sub(s.dispatched_mark),
            None => self.dispatched_total,
        }
    }
}

/// A snapshot this replica polled, waiting to be pushed to peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OwnSnapshot {
    /// Grows by one per publish, so links know what they already sent.
    pub(crate) seq: u64,
    pub(crate) source: EngineKind,
    pub(crate) load: EngineLoad,
    pub(crate) polled_at_unix_ms: u64,
    pub(crate) dispatched_mark: u64,
}

/// Shared state of one worker key.
#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) key: Arc<str>,
    /// This node's id for the key on the wire (dense, from 0).
    pub(crate) id: u32,
    pub(crate) own: OwnCounters,
    /// Set on the first booking: the slot is sent in every full sync from
    /// then on (so a peer holding old values always gets corrected).
    pub(crate) touched: AtomicBool,
    pub(crate) remote: ArcSwap<RemoteView>,
    pub(crate) own_snapshot: ArcSwap<Option<OwnSnapshot>>,
}

impl WorkerEntry {
    pub(crate) fn new(key: Arc<str>, id: u32) -> Self {
        Self {
            key,
            id,
            own: OwnCounters::default(),
            touched: AtomicBool::new(false),
            remote: ArcSwap::from_pointee(RemoteView::default()),
            own_snapshot: ArcSwap::from_pointee(None),
        }
    }
}

/// Stamp taken when a poll starts: the time and the fleet dispatched total
/// that the resulting snapshot will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollStamp {
    /// Poll start, ms since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Fleet dispatched token-work at poll start.
    pub dispatched_mark: u64,
}

/// The router's handle on one worker: book work in this replica's own slot
/// and read the fleet-wide load. Cheap to clone; hold it for the worker's
/// lifetime.
#[derive(Debug, Clone)]
pub struct WorkerSlot {
    pub(crate) entry: Arc<WorkerEntry>,
}

impl WorkerSlot {
    /// The worker key (its base URL).
    pub fn key(&self) -> &str {
        &self.entry.key
    }

    /// Books one request of `prompt_tokens` prompt and `token_work` total
    /// token-work in the own slot; dropping the booking releases it.
    pub fn book(&self, prompt_tokens: u64, token_work: u64) -> SlotBooking {
        if !self.entry.touched.load(Ordering::Relaxed) {
            self.entry.touched.store(true, Ordering::Relaxed);
        }
        let own = &self.entry.own;
        own.requests.fetch_add(1, Ordering::Relaxed);
        own.tokens.fetch_add(token_work, Ordering::Relaxed);
        own.pending_prefill
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        own.dispatched.fetch_add(token_work, Ordering::Relaxed);
        SlotBooking {
            entry: self.entry.clone(),
            token_work,
            pending_prefill: prompt_tokens,
        }
    }

    /// This replica's own slot values now.
    pub fn own(&self) -> SlotValues {
        self.entry.own.read()
    }

    /// The fleet-wide load now: no lock, no allocation.
    pub fn fleet(&self) -> FleetLoad {
        let own = self.entry.own.read();
        let remote = self.entry.remote.load();
        FleetLoad {
            inflight_requests: own.requests.saturating_add(remote.requests),
            inflight_tokens: own.tokens.saturating_add(remote.tokens),
            pending_prefill_tokens: own.pending_prefill.saturating_add(remote.pending_prefill),
            dispatched_total: own.dispatched.saturating_add(remote.dispatched),
            snapshot: remote.snapshot,
        }
    }

    /// Call when a poll of this worker starts; pass the stamp to
    /// [`crate::Mesh::publish_snapshot`] with the poll's result.
    pub fn poll_stamp(&self) -> PollStamp {
        PollStamp {
            polled_at_unix_ms: crate::identity::unix_millis(),
            dispatched_mark: self.fleet().dispatched_total,
        }
    }
}

/// One request's claim on a worker's own slot; dropping it releases the
/// claim (requests and in-flight tokens; dispatched only grows).
#[derive(Debug)]
pub struct SlotBooking {
    entry: Arc<WorkerEntry>,
    token_work: u64,
    pending_prefill: u64,
}

impl SlotBooking {
    /// The first response byte arrived: the prompt is no longer queued.
    pub fn first_byte(&mut self) {
        let pending = std::mem::take(&mut self.pending_prefill);
        if pending > 0 {
            self.entry
                .own
                .pending_prefill
                .fetch_sub(pending, Ordering::Relaxed);
        }
    }
}

impl Drop for SlotBooking {
    fn drop(&mut self) {
        self.first_byte();
        let own = &self.entry.own;
        own.requests.fetch_sub(1, Ordering::Relaxed);
        own.tokens.fetch_sub(self.token_work, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_releases_once_and_reads_add_remote() {
        let slot = WorkerSlot {
            entry: Arc::new(WorkerEntry::new("http://w:1".into(), 0)),
        };
        let mut booking = slot.book(40, 100);
        booking.first_byte();
        booking.first_byte();
        slot.entry.remote.store(Arc::new(RemoteView {
            requests: 2,
            tokens: 50,
            pending_prefill: 7,
            dispatched: 1000,
            snapshot: None,
        }));
        let fleet = slot.fleet();
        assert_eq!(fleet.inflight_requests, 3);
        assert_eq!(fleet.inflight_tokens, 150);
        assert_eq!(fleet.pending_prefill_tokens, 7);
        assert_eq!(fleet.dispatched_total, 1100);
        assert_eq!(fleet.dispatched_since_poll(), 1100);
        drop(booking);
        assert_eq!(
            slot.own(),
            SlotValues {
                requests: 0,
                tokens: 0,
                pending_prefill: 0,
                dispatched: 100
            }
        );
    }
}
