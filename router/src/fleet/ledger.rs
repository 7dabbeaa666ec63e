//! This replica's bookings on one worker, as lock-free counters.
//!
//! A [`Booking`] is taken when a request is dispatched and released when it
//! is dropped, so a finished stream, an error and a client that went away
//! all release exactly once. The dispatched counter only grows; the load
//! monitor stamps it on each snapshot as the poll mark.
//!
//! With a mesh, the counters live in the mesh's own slot for the worker
//! ([`WorkerSlot`]), which peers receive; the booking cost is the same
//! handful of relaxed atomics either way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use shoal_mesh::{SlotBooking, WorkerSlot};

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    tokens: AtomicU64,
    pending_prefill: AtomicU64,
    dispatched: AtomicU64,
}

/// A reading of one ledger's counters (or the sum of several replicas'
/// ledgers for one worker: fleet values are sums over live replicas).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerCounts {
    /// Requests in flight.
    pub requests: u64,
    /// Token-work in flight.
    pub tokens: u64,
    /// Prompt tokens still waiting for their first response byte.
    pub pending_prefill: u64,
    /// Token-work ever dispatched (grow-only).
    pub dispatched: u64,
}

impl std::ops::Add for LedgerCounts {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(other.requests),
            tokens: self.tokens.saturating_add(other.tokens),
            pending_prefill: self.pending_prefill.saturating_add(other.pending_prefill),
            dispatched: self.dispatched.saturating_add(other.dispatched),
        }
    }
}

#[derive(Debug, Clone)]
enum Store {
    Local(Arc<Counters>),
    Mesh(WorkerSlot),
}

/// In-flight requests and token-work this replica has routed to one worker.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: Store,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            store: Store::Local(Arc::default()),
        }
    }
}

impl Ledger {
    /// A ledger whose counters are this replica's mesh slot for the worker.
    pub fn meshed(slot: WorkerSlot) -> Self {
        Self {
            store: Store::Mesh(slot),
        }
    }

    /// The mesh slot behind this ledger, if the mesh is on.
    pub fn mesh_slot(&self) -> Option<&WorkerSlot> {
        match &self.store {
            Store::Mesh(slot) => Some(slot),
            Store::Local(_) => None,
        }
    }

    /// Books one request of `prompt_tokens` prompt and `token_work` total
    /// token-work. The counts are visible to the next selection at once.
    pub fn book(&self, prompt_tokens: u64, token_work: u64) -> Booking {
        match &self.store {
            Store::Mesh(slot) => Booking {
                claim: Claim::Mesh(slot.book(prompt_tokens, token_work)),
            },
            Store::Local(c) => {
                c.requests.fetch_add(1, Ordering::Relaxed);
                c.tokens.fetch_add(token_work, Ordering::Relaxed);
                c.pending_prefill
                    .fetch_add(prompt_tokens, Ordering::Relaxed);
                c.dispatched.fetch_add(token_work, Ordering::Relaxed);
                Booking {
                    claim: Claim::Local {
                        counters: c.clone(),
                        token_work,
                        pending_prefill: prompt_tokens,
                    },
                }
            }
        }
    }

    /// All four of this replica's counters at once.
    pub fn counts(&self) -> LedgerCounts {
        match &self.store {
            Store::Local(c) => LedgerCounts {
                requests: c.requests.load(Ordering::Relaxed),
                tokens: c.tokens.load(Ordering::Relaxed),
                pending_prefill: c.pending_prefill.load(Ordering::Relaxed),
                dispatched: c.dispatched.load(Ordering::Relaxed),
            },
            Store::Mesh(slot) => {
                let own = slot.own();
                LedgerCounts {
                    requests: own.requests,
                    tokens: own.tokens,
                    pending_prefill: own.pending_prefill,
                    dispatched: own.dispatched,
                }
            }
        }
    }

    /// Requests in flight.
    pub fn inflight_requests(&self) -> u64 {
        self.counts().requests
    }

    /// Token-work in flight.
    pub fn inflight_tokens(&self) -> u64 {
        self.counts().tokens
    }

    /// Prompt tokens still waiting for their first response byte.
    pub fn pending_prefill_tokens(&self) -> u64 {
        self.counts().pending_prefill
    }

    /// Token-work ever dispatched (grow-only).
    pub fn dispatched_tokens(&self) -> u64 {
        self.counts().dispatched
    }
}

#[derive(Debug)]
enum Claim {
    Local {
        counters: Arc<Counters>,
        token_work: u64,
        pending_prefill: u64,
    },
    Mesh(SlotBooking),
}

/// One request's claim on a worker; dropping it releases the claim.
#[derive(Debug)]
pub struct Booking {
    claim: Claim,
}

impl Booking {
    /// The first response byte arrived: the prompt is no longer queued.
    pub fn first_byte(&mut self) {
        match &mut self.claim {
            Claim::Mesh(booking) => booking.first_byte(),
            Claim::Local {
                counters,
                pending_prefill,
                ..
            } => {
                let pending = std::mem::take(pending_prefill);
                if pending > 0 {
                    counters
                        .pending_prefill
                        .fetch_sub(pending, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        self.first_byte();
        // A mesh booking releases itself when the claim is dropped.
        if let Claim::Local {
            counters,
            token_work,
            ..
        } = &self.claim
        {
            counters.requests.fetch_sub(1, Ordering::Relaxed);
            counters.tokens.fetch_sub(*token_work, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_releases_once_and_dispatched_only_grows() {
        let ledger = Ledger::default();
        let mut booking = ledger.book(40, 100);
        assert_eq!(ledger.pending_prefill_tokens(), 40);
        booking.first_byte();
        booking.first_byte();
        assert_eq!(ledger.pending_prefill_tokens(), 0);
        assert_eq!(ledger.inflight_tokens(), 100);
        drop(booking);
        assert_eq!(ledger.inflight_requests(), 0);
        assert_eq!(ledger.inflight_tokens(), 0);
        assert_eq!(ledger.dispatched_tokens(), 100);
    }

    #[test]
    fn concurrent_bookings_balance() {
        let ledger = Ledger::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let ledger = ledger.clone();
                scope.spawn(move || {
                    for _ in 0..1000 {
                        let _b = ledger.book(3, 7);
                    }
                });
            }
        });
        assert_eq!(ledger.inflight_requests(), 0);
        assert_eq!(ledger.pending_prefill_tokens(), 0);
        assert_eq!(ledger.dispatched_tokens(), 28_000);
    }
}
