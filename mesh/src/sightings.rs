//! Prompt-key sightings shared over the load plane.
//!
//! An affinity policy gives a prompt prefix affinity once it has been seen
//! before; behind a Service each replica sees 1/N of the prompts, so
//! without sharing a prefix is routed without affinity up to N times (once
//! per replica) instead of once. The router records the key of each prompt
//! it sees for the first time here; every round carries the keys recorded
//! since the last one to every verified peer ([`Frame::Sightings`]), and
//! the peers' keys are handed to the router's receiver.
//!
//! Sightings are evidence that may be forgotten, never state to converge:
//! they are not in the transcript, a link that connects later does not get the
//! past ones, and a full outbound queue drops new keys (counted) rather
//! than grow.
//!
//! [`Frame::Sightings`]: shoal_proto::frames::Frame::Sightings

use shoal_proto::frames::{Frame, MAX_SIGHTINGS_PER_FRAME, SightingsFrame};

use crate::hints::{Hint, HintQueue, HintSender, Receiver};

/// Keys waiting for the next round, at most: a burst of new prompts larger
/// than this within one push gap loses its newest keys (their replicas
/// still remember them locally).
pub const MAX_PENDING_SIGHTINGS: usize = 65_536;

/// Where the keys peers saw are delivered (the router's policy).
pub type SightingReceiver = Receiver<u64>;

/// The router's handle for sharing its sightings.
pub type SightingSender = HintSender<u64>;

/// This node's outbound queue of sightings and its inbound receiver.
pub(crate) type SightingExchange = HintQueue<u64>;

/// A sighting is a prompt key.
impl Hint for u64 {
    const MAX_PENDING: usize = MAX_PENDING_SIGHTINGS;
    const PER_FRAME: usize = MAX_SIGHTINGS_PER_FRAME;
    const DROPPED_METRIC: &'static str = "shoal_mesh_sightings_dropped_total";

    fn frame(keys: Vec<u64>) -> Frame {
        Frame::Sightings(SightingsFrame { keys })
    }
}

impl HintSender<u64> {
    /// Shares `key` (of a prompt this replica saw for the first time) with
    /// every peer in the next round. A key that does not fit the queue is
    /// dropped and counted (`shoal_mesh_sightings_dropped_total`).
    pub fn send(&self, key: u64) {
        self.push(key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use shoal_proto::frames::decode;

    use super::*;
    use crate::bell::ChangeBell;

    #[test]
    fn queued_keys_leave_in_frames_of_bounded_size_once() {
        let exchange = SightingExchange::default();
        let bell = ChangeBell::default();
        for key in 0..(MAX_SIGHTINGS_PER_FRAME as u64 + 3) {
            assert!(exchange.record(key, &bell));
        }
        let frames = exchange.frames().unwrap();
        assert_eq!(frames.len(), 2);
        let mut keys = Vec::new();
        for frame in &frames {
            match decode(&frame[4..]).unwrap() {
                Frame::Sightings(f) => {
                    assert!(f.keys.len() <= MAX_SIGHTINGS_PER_FRAME);
                    keys.extend(f.keys);
                }
                other => panic!("not a sightings frame: {other:?}"),
            }
        }
        assert_eq!(
            keys,
            (0..(MAX_SIGHTINGS_PER_FRAME as u64 + 3)).collect::<Vec<_>>()
        );
        assert!(exchange.frames().unwrap().is_empty(), "sent once");
    }

    #[test]
    fn a_full_queue_drops_new_keys_and_says_so() {
        let exchange = SightingExchange::default();
        let bell = ChangeBell::default();
        for key in 0..MAX_PENDING_SIGHTINGS as u64 {
            assert!(exchange.record(key, &bell));
        }
        assert!(!exchange.record(u64::MAX, &bell));
        let frames = exchange.frames().unwrap();
        let total: usize = frames
            .iter()
            .map(|f| match decode(&f[4..]).unwrap() {
                Frame::Sightings(f) => f.keys.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(total, MAX_PENDING_SIGHTINGS);
        assert!(exchange.record(u64::MAX, &bell), "room again once sent");
    }

    #[test]
    fn peers_keys_reach_the_receiver_set_first() {
        let exchange = SightingExchange::default();
        exchange.deliver(&[1]); // no receiver yet: dropped quietly
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        assert!(exchange.set_receiver(Arc::new(move |keys: &[u64]| {
            counter.fetch_add(keys.len(), Ordering::Relaxed);
        })));
        assert!(!exchange.set_receiver(Arc::new(|_: &[u64]| {})));
        exchange.deliver(&[1, 2, 3]);
        assert_eq!(seen.load(Ordering::Relaxed), 3);
    }
}
