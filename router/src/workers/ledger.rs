//! This replica's bookings on one worker, as lock-free counters.
//!
//! A [`SlotBooking`] (the mesh crate's type: its `Drop`, which releases
//! the claim, is in `mesh/src/slot.rs`) is taken when a request is
//! dispatched and released when it is dropped, so a finished stream, an
//! error and a client that went away all release exactly once.
//!
//! There is one booking implementation, the mesh's [`WorkerSlot`]: a meshed
//! replica's slot is the one peers receive, a replica that routes alone
//! holds a [`WorkerSlot::detached`] slot of the same type. Either way a
//! booking is a handful of relaxed atomics, and the slot also counts the
//! token-work routed since the engine's last snapshot.

use shoal_mesh::{PollStamp, SlotBooking, WorkerSlot};
use shoal_proto::LoadCounts;

/// In-flight requests and token-work this replica has routed to one worker.
#[derive(Debug, Clone)]
pub struct Ledger {
    slot: WorkerSlot,
}

impl Ledger {
    /// A ledger over `slot` (a mesh slot, or a detached one).
    pub fn new(slot: WorkerSlot) -> Self {
        Self { slot }
    }

    /// The ledger of a replica that routes alone.
    pub fn detached(url: &str) -> Self {
        Self::new(WorkerSlot::detached(url))
    }

    /// The slot behind this ledger.
    #[inline]
    pub fn slot(&self) -> &WorkerSlot {
        &self.slot
    }

    /// Books one request of `prompt_tokens` prompt and `token_work` total
    /// token-work. The counts are visible to the next selection at once.
    pub fn book(&self, prompt_tokens: u64, token_work: u64) -> SlotBooking {
        self.slot.book(prompt_tokens, token_work)
    }

    /// This replica's own counts.
    #[inline]
    pub fn counts(&self) -> LoadCounts {
        self.slot.own()
    }

    /// Marks the start of a poll of this worker.
    pub fn poll_stamp(&self) -> PollStamp {
        self.slot.poll_stamp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_releases_once_and_work_since_the_poll_stays() {
        let ledger = Ledger::detached("http://w:1");
        let mut booking = ledger.book(40, 100);
        assert_eq!(ledger.counts().pending_prefill, 40);
        booking.first_byte();
        booking.first_byte();
        assert_eq!(ledger.counts().pending_prefill, 0);
        assert_eq!(ledger.counts().tokens, 100);
        drop(booking);
        assert_eq!(ledger.counts().requests, 0);
        assert_eq!(ledger.counts().tokens, 0);
        assert_eq!(ledger.counts().dispatched_since_poll, 100);
        let stamp = ledger.poll_stamp();
        ledger.slot().record_own_poll(&stamp);
        assert_eq!(ledger.counts().dispatched_since_poll, 0);
    }

    #[test]
    fn concurrent_bookings_balance() {
        let ledger = Ledger::detached("http://w:1");
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
        assert_eq!(ledger.counts().requests, 0);
        assert_eq!(ledger.counts().pending_prefill, 0);
        assert_eq!(ledger.counts().dispatched_since_poll, 28_000);
    }
}
